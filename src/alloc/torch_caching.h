// TorchCachingAllocator: PyTorch's CUDACachingAllocator (one pool) over a SegmentSource.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/alloc/caching_allocator.h"

namespace memsim {

// Options of PYTORCH_CUDA_ALLOC_CONF (and of torch.cuda.set_per_process_memory_fraction) that
// this model supports. Defaults are PyTorch's defaults.
struct TorchCachingConfig {
  // max_split_size_mb: blocks >= this size are never split and are only reused by requests
  // within max_non_split_rounding (kLargeBuffer) of their size. UINT64_MAX means unlimited.
  uint64_t max_split_size = UINT64_MAX;
  // roundup_power2_divisions per power-of-two interval, as CUDAAllocatorConfig keeps them: slot
  // k holds the divisions for sizes in [2^(20+k), 2^(21+k)) MiB; slot 0 also covers sizes below
  // 1 MiB, slot 15 everything above. 0 or 1 = off (round to 512 B).
  std::array<uint32_t, 16> roundup_power2_divisions{};
  // garbage_collection_threshold (0 = off): with a memory_limit set, a malloc that finds no
  // cached block first releases the oldest unsplit cached large blocks while reserved bytes
  // exceed threshold * memory_limit. Without a memory_limit PyTorch never collects.
  double garbage_collection_threshold = 0;
  // set_per_process_memory_fraction(f) as bytes (f * device memory); 0 = no limit. Segments
  // that would take reserved bytes above it fail as out of memory.
  uint64_t memory_limit = 0;
  // expandable_segments: one growing virtual range per (pool, stream), mapped on demand in pages
  // of 2 MiB (small pool) / 20 MiB (large pool) and unmapped by empty_cache(). Needs a Backend.
  bool expandable_segments = false;
  // Virtual bytes reserved per expandable segment; 0 = device capacity + 1/8 (PyTorch's size).
  uint64_t expandable_va_bytes = 0;

  // The legacy single-value form "roundup_power2_divisions:N": every interval gets N.
  void set_roundup_power2_divisions(uint32_t n) { roundup_power2_divisions.fill(n); }
  // The divisions that apply to a request of `size` bytes (roundup_power2_divisions(size)).
  uint32_t divisions_for(uint64_t size) const;
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
  // Owns its segment source (allocators made by the registry). `vmm` backs expandable segments
  // (required when config.expandable_segments is set).
  TorchCachingAllocator(std::unique_ptr<SegmentSource> source, TorchCachingConfig config,
                        Backend* vmm = nullptr);
  ~TorchCachingAllocator() override;
  TorchCachingAllocator(const TorchCachingAllocator&) = delete;
  TorchCachingAllocator& operator=(const TorchCachingAllocator&) = delete;

  Result<DevPtr> malloc(uint64_t bytes, StreamId stream) override;
  Status free(DevPtr p) override;
  Status empty_cache() override;
  Status release_all() override;
  Result<std::vector<DevPtr>> adopt_segment(const SegmentImage& image) override;
  AllocatorStats stats() const override { return stats_; }
  std::vector<LiveBlock> live_blocks() const override;  // sorted by address
  bool check_invariants(std::string* why) const override;

  const TorchCachingConfig& config() const { return config_; }
  // Bytes of cached (free) blocks, and their number, over both pools.
  uint64_t cached_free_bytes() const { return stats_.reserved_bytes - stats_.allocated_bytes; }
  uint64_t free_block_count() const { return small_.blocks.size() + large_.blocks.size(); }

  // round_size(): the block size a request of `size` bytes takes (divisions as
  // divisions_for(size) gives them).
  static uint64_t round_size(uint64_t size, uint32_t roundup_power2_divisions = 0);
  uint64_t round_size_of(uint64_t size) const {
    return round_size(size, config_.divisions_for(size));
  }
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
    uint64_t gc_count_base = 0;  // the pool's get_free_block count when cached
    bool mapped = true;          // false: unmapped space of an expandable segment
    bool is_split() const { return prev != nullptr || next != nullptr; }
  };
  // BlockComparatorSize: (stream, size, address).
  struct BlockLess {
    using is_transparent = void;  // lets check_invariants() look up a const Block*
    bool operator()(const Block* a, const Block* b) const;
  };
  // (stream, address): the unmapped blocks of expandable segments.
  struct UnmappedLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  struct BlockPool {
    explicit BlockPool(bool small) : is_small(small) {}
    std::set<Block*, BlockLess> blocks;       // free mapped blocks only
    std::set<Block*, UnmappedLess> unmapped;  // free unmapped blocks of expandable segments
    const bool is_small;
    uint64_t get_free_blocks_call_count = 0;  // counted only while GC is on (the age clock)
  };
  struct Segment {
    DevPtr base = 0;
    uint64_t size = 0;
    StreamId stream;
    BlockPool* pool = nullptr;
    Block* head = nullptr;  // the block at `base`
    // Expandable segments: the page size and the physical page mapped at each page index.
    bool expandable = false;
    uint64_t page = 0;
    std::vector<PhysHandle> handles;  // id 0 = not mapped
  };
  struct Range {
    DevPtr ptr = 0;
    uint64_t size = 0;
  };

  BlockPool& get_pool(uint64_t rounded) { return rounded <= kSmallSize ? small_ : large_; }
  Block* get_free_block(BlockPool& pool, uint64_t size, StreamId stream);
  bool should_split(const Block& block, uint64_t size) const;
  Result<Block*> alloc_block(BlockPool& pool, uint64_t alloc_size, StreamId stream);
  Block* new_segment_block(BlockPool& pool, DevPtr ptr, uint64_t alloc_size, StreamId stream);
  Block* alloc_found_block(Block* block, uint64_t size, uint64_t requested, bool split);
  void free_block(Block* block);
  void insert_into_blocks(BlockPool& pool, Block* block);
  bool gc_enabled() const;
  Status garbage_collect_cached_blocks();
  // Expandable segments (torch_expandable.cpp).
  Result<Block*> try_allocate_expandable_block(BlockPool& pool, uint64_t size, StreamId stream);
  Result<Block*> find_expandable_block(BlockPool& pool, uint64_t size, StreamId stream);
  Result<bool> map_block(Block* to_map, uint64_t size);
  Status unmap_block(Block* block);
  Status release_expandable_segment(Block* block);
  Result<Range> map_pages(Segment& seg, Range range);
  Result<Range> unmap_pages(Segment& seg, Range range);
  Status release_expandable_all(Segment& seg);
  uint64_t try_merge_blocks(Block* dst, Block* src, BlockPool& pool);
  Status release_block(Block* block);
  Status release_blocks(BlockPool& pool);
  Status release_cached_blocks();
  Result<bool> release_available_cached_blocks(BlockPool& pool, uint64_t size, StreamId stream);
  bool fail(std::string* why, const std::string& msg) const;
  void delete_all_blocks();  // frees every Block object; segments_ keeps its records

  std::unique_ptr<SegmentSource> owned_source_;  // before source_, which may refer to it
  Backend* vmm_ = nullptr;
  SegmentSource& source_;
  TorchCachingConfig config_;
  BlockPool small_{true};
  BlockPool large_{false};
  std::unordered_map<DevPtr, Block*> allocated_;  // live blocks by pointer
  std::map<DevPtr, Segment> segments_;            // live segments by base address
  AllocatorStats stats_;
};

}  // namespace memsim
