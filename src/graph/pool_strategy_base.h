// Shared machinery of the caching-allocator-pool strategies (private_pools, shared_pool,
// global_pool, vmm_alias): pools of TorchCachingAllocator, pointer ownership, stats.
#pragma once

#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/alloc/device_segment_source.h"
#include "src/alloc/torch_caching.h"
#include "src/graph/graph_memory_strategy.h"

namespace memsim {

// Each graph allocates from the pool select_pool() names for it (creating pools on demand).
// A pointer is freed into the pool it came from, as PyTorch does for private pools.
class PoolStrategyBase : public GraphMemoryStrategy {
 public:
  PoolStrategyBase(Backend& backend, TorchCachingConfig allocator_config);

  Status begin_graph(const GraphInfo& info, StreamId stream) override;
  Result<DevPtr> allocate(uint64_t bytes, StreamId stream) override;
  Status free(DevPtr p, StreamId stream) override;
  Status end_graph() override;
  Status teardown() override;
  GraphMemoryStats stats() const override;
  std::vector<LiveBlock> live_allocations() const override;
  bool check_invariants(std::string* why) const override;
  bool set_observer(AllocatorObserver* observer) override;

 protected:
  // Index of the pool graph `info` captures into; may call add_pool().
  virtual Result<size_t> select_pool(const GraphInfo& info, StreamId stream) = 0;
  size_t add_pool(SegmentSource& source);
  size_t pool_count() const { return pools_.size(); }
  Backend& backend() { return backend_; }
  SimTime switch_time_ = 0;

 private:
  Backend& backend_;
  TorchCachingConfig config_;
  DeviceSegmentSource device_source_;
  std::vector<std::unique_ptr<TorchCachingAllocator>> pools_;
  // PyTorch's allocated_blocks: live pointer -> pool index, one entry per address. An allocation
  // at an address that is still live (only vmm_alias with spaces: one hands one out twice)
  // overwrites the entry, as PyTorch's map assignment does; the pool that lost it is kept in
  // lost_ to explain the "invalid device pointer" its address's second free then meets.
  std::unordered_map<DevPtr, size_t> owner_;
  // address -> (pool whose entry was overwritten, pool that overwrote it)
  std::unordered_map<DevPtr, std::pair<size_t, size_t>> lost_;
  mutable std::vector<size_t> dirty_;  // pools changed since the last invariant check
  uint64_t allocated_ = 0;             // sum of the pools' allocated bytes
  size_t current_ = SIZE_MAX;
  uint64_t reserved_ = 0;  // sum of the pools' reserved bytes, kept incrementally
  uint64_t peak_reserved_ = 0;
  AllocatorObserver* observer_ = nullptr;

 protected:
  SegmentSource& device_source() { return device_source_; }
};

}  // namespace memsim
