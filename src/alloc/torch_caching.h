// TorchCachingAllocator: PyTorch's CUDACachingAllocator (one pool) over a SegmentSource.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/alloc/caching_allocator.h"

namespace memsim {

// Options of PYTORCH_CUDA_ALLOC_CONF that this model supports (expandable segments are not
// modelled). Defaults are PyTorch's defaults.
struct TorchCachingConfig {
  // max_split_size_mb: blocks >= this size are never split and are only reused by requests
  // within kLargeBuffer of their size. UINT64_MAX means unlimited (PyTorch's default).
  uint64_t max_split_size = UINT64_MAX;
  // roundup_power2_divisions: 0 or 1 = off (round to 512 B); N > 1 rounds sizes above
  // 512 * N up to the next of N divisions between powers of two. One value for all sizes.
  uint32_t roundup_power2_divisions = 0;
};

// Models one PyTorch memory pool (the default pool, or one CUDA-graph private pool) of
// c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator, default config:
// - sizes are rounded (round_size); <= 1 MiB goes to the small pool, else the large pool;
// - free blocks are cached per pool, ordered by (stream, size, address); a request takes the
//   best fit on its own stream (get_free_block), split if the remainder is big enough;
// - otherwise a new segment (get_allocation_size) is taken from the SegmentSource; on OOM the
//   cached whole segments are returned to the source and the allocation retried.
// Hot paths (malloc/free) are O(log n). Not thread-safe. Call release_all() to return the
// segments to the source; the destructor never touches the source (it may be gone already:
// e.g. a source owned by a derived strategy), it only frees the bookkeeping.
class TorchCachingAllocator final : public CachingAllocator {
 public:
  // Constants of CUDACachingAllocator.cpp.
  static constexpr uint64_t kMinBlockSize = 512;           // all sizes rounded to >= 512 B
  static constexpr uint64_t kSmallSize = 1ull << 20;       // largest "small" request: 1 MiB
  static constexpr uint64_t kSmallBuffer = 2ull << 20;     // small segments: 2 MiB
  static constexpr uint64_t kLargeBuffer = 20ull << 20;    // 1..10 MiB requests: 20 MiB
  static constexpr uint64_t kMinLargeAlloc = 10ull << 20;  // from here segments fit the size
  static constexpr uint64_t kRoundLarge = 2ull << 20;      // large segments round to 2 MiB
  static constexpr uint64_t kMaxRequest = 1ull << 60;      // allocate(): "more than 1EB"

  explicit TorchCachingAllocator(SegmentSource& source, TorchCachingConfig config = {});
  ~TorchCachingAllocator() override;
  TorchCachingAllocator(const TorchCachingAllocator&) = delete;
  TorchCachingAllocator& operator=(const TorchCachingAllocator&) = delete;

  Result<DevPtr> malloc(uint64_t bytes, StreamId stream) override;
  Status free(DevPtr p) override;
  Status empty_cache() override;
  Status release_all() override;
  AllocatorStats stats() const override { return stats_; }
  std::vector<LiveBlock> live_blocks() const override;  // sorted by address
  bool check_invariants(std::string* why) const override;

  const TorchCachingConfig& config() const { return config_; }
  // Bytes of cached (free) blocks, and their number, over both pools.
  uint64_t cached_free_bytes() const { return stats_.reserved_bytes - stats_.allocated_bytes; }
  uint64_t free_block_count() const { return small_.blocks.size() + large_.blocks.size(); }

  // round_size(): the block size a request of `size` bytes takes.
  static uint64_t round_size(uint64_t size, uint32_t roundup_power2_divisions = 0);
  // roundup_power2_next_division(): `size` rounded up to the next of `divisions` equal steps
  // between the powers of two around it.
  static uint64_t roundup_power2_next_division(uint64_t size, uint32_t divisions);
  // get_allocation_size(): the segment size allocated for a rounded request.
  static uint64_t segment_size_for(uint64_t rounded);

 private:
  struct Segment;
  struct Block {
    DevPtr ptr = 0;
    uint64_t size = 0;
    uint64_t requested = 0;
    StreamId stream;
    bool allocated = false;
    Block* prev = nullptr;  // neighbours within the segment (split blocks)
    Block* next = nullptr;
    Segment* segment = nullptr;
    bool is_split() const { return prev != nullptr || next != nullptr; }
  };
  // BlockComparatorSize: (stream, size, address).
  struct BlockLess {
    using is_transparent = void;  // lets check_invariants() look up a const Block*
    bool operator()(const Block* a, const Block* b) const;
  };
  struct BlockPool {
    explicit BlockPool(bool small) : is_small(small) {}
    std::set<Block*, BlockLess> blocks;  // free blocks only
    const bool is_small;
  };
  struct Segment {
    DevPtr base = 0;
    uint64_t size = 0;
    StreamId stream;
    BlockPool* pool = nullptr;
    Block* head = nullptr;  // the block at `base`
  };

  BlockPool& get_pool(uint64_t rounded) { return rounded <= kSmallSize ? small_ : large_; }
  Block* get_free_block(BlockPool& pool, uint64_t size, StreamId stream);
  bool should_split(const Block& block, uint64_t size) const;
  Result<Block*> alloc_block(BlockPool& pool, uint64_t alloc_size, StreamId stream);
  Block* alloc_found_block(Block* block, uint64_t size, uint64_t requested, bool split);
  void free_block(Block* block);
  uint64_t try_merge_blocks(Block* dst, Block* src, BlockPool& pool);
  Status release_block(Block* block);
  Status release_blocks(BlockPool& pool);
  Status release_cached_blocks();
  Result<bool> release_available_cached_blocks(BlockPool& pool, uint64_t size, StreamId stream);
  bool fail(std::string* why, const std::string& msg) const;
  void delete_all_blocks();  // frees every Block object; segments_ keeps its records

  SegmentSource& source_;
  TorchCachingConfig config_;
  BlockPool small_{true};
  BlockPool large_{false};
  std::unordered_map<DevPtr, Block*> allocated_;  // live blocks by pointer
  std::map<DevPtr, Segment> segments_;            // live segments by base address
  AllocatorStats stats_;
};

}  // namespace memsim
