// CudaAsyncAllocator: the driver's stream-ordered memory pool (cudaMallocAsync), as PyTorch's
// backend:cudaMallocAsync uses it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/alloc/caching_allocator.h"

namespace memsim {

struct CudaAsyncConfig {
  // Physical memory is added to the pool in chunks of this size: 32 MiB measured on the H200
  // (CUDA 13 driver: ReservedMemCurrent grows and trims in 32 MiB steps; tools/torch_replay.py).
  uint64_t chunk_bytes = 32ull << 20;
  // cudaMemPoolAttrReleaseThreshold: unused memory above this is returned to the device after a
  // free. PyTorch sets UINT64_MAX (never); the driver's own default is 0.
  uint64_t release_threshold = UINT64_MAX;
  // Allocation alignment inside the pool.
  uint64_t alignment = 512;
};

// The pool is one virtual range (the device capacity) over which allocations are placed best fit
// (smallest free range, lowest address on ties) and coalesced on free; a chunk of physical
// memory is created and mapped the first time an allocation touches it. empty_cache() is
// cudaMemPoolTrimTo(pool, 0): every chunk no allocation touches is unmapped and released.
// Streams: the replayed frees have completed, so the driver's opportunistic reuse
// (cudaMemPoolReuseAllowOpportunistic, which PyTorch enables) lets any stream reuse them.
// The driver's real placement is not documented: against PyTorch's cudaMallocAsync backend on
// the H200 this model's peak reserved bytes were 0.83-1.17x the measured
// (docs/results/allocators-snapshots.md).
class CudaAsyncAllocator final : public CachingAllocator {
 public:
  CudaAsyncAllocator(Backend& backend, CudaAsyncConfig config);
  ~CudaAsyncAllocator() override = default;
  CudaAsyncAllocator(const CudaAsyncAllocator&) = delete;
  CudaAsyncAllocator& operator=(const CudaAsyncAllocator&) = delete;

  Result<DevPtr> malloc(uint64_t bytes, StreamId stream) override;
  Status free(DevPtr p) override;
  Status empty_cache() override;
  Status release_all() override;
  AllocatorStats stats() const override { return stats_; }
  std::vector<LiveBlock> live_blocks() const override;
  bool check_invariants(std::string* why) const override;

 private:
  struct Live {
    uint64_t size = 0, requested = 0;
  };
  Status ensure_range();
  void take_free(uint64_t offset, uint64_t size);
  void add_free(uint64_t offset, uint64_t size);  // coalesces
  // Releases unused chunks above keep_unused, never those in [spare_first, spare_last] (the
  // chunks a malloc in progress maps: they have no users yet).
  Status trim(uint64_t keep_unused, uint64_t spare_first = 1, uint64_t spare_last = 0);

  Backend& backend_;
  CudaAsyncConfig config_;
  DevPtr base_ = 0;
  uint64_t range_ = 0;
  std::map<uint64_t, uint64_t> free_by_offset_;           // offset -> size
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;  // (size, offset)
  std::unordered_map<DevPtr, Live> live_;
  std::map<uint64_t, PhysHandle> chunks_;               // mapped chunk index -> handle
  std::unordered_map<uint64_t, uint32_t> chunk_users_;  // chunk index -> live allocations
  AllocatorStats stats_;
};

}  // namespace memsim
