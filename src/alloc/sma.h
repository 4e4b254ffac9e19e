// Sma: zbccl's Secondary Memory Allocator: a best-fit coalescing heap over one region, under a
// PyTorch-style cache of split blocks with stream-aware reuse (seeds/zbccl-sma-allocator.md).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/alloc/caching_allocator.h"
#include "src/alloc/sma_heap.h"

namespace memsim {

// Options of SMAConfig (PYTORCH_NPU_ALLOC_CONF) plus where the heap's region comes from.
struct SmaConfig {
  enum class Region : uint8_t {
    kVmm,           // reserve_virtual(heap_size) once; physical granules mapped on demand
    kDeviceMalloc,  // one device_malloc(heap_size) at the first malloc, held until release_all
  };
  Region region = Region::kVmm;
  // Bytes of the heap, rounded up to the backend granularity; 0 = the backend's capacity()
  // rounded down to the granularity.
  uint64_t heap_size = 0;
  // max_split_size_mb (in bytes): cached blocks >= this size are never split and serve only
  // requests within kLargeBuffer of their size (PyTorch's rules). UINT64_MAX = unlimited.
  uint64_t max_split_size = UINT64_MAX;
  // garbage_collection_threshold in (0, 1); 0 = off. A malloc that misses the cache while more
  // than threshold * heap_size is held (kVmm: reserved bytes; kDeviceMalloc: the heap's used end)
  // synchronizes and returns cached blocks, least recently freed first, to the heap until the
  // heap's used end is below that, then (kVmm) unmaps the free tail (Sma::collect_garbage).
  double garbage_collection_threshold = 0;
  // base_addr_aligned_kb (in bytes, a power of two >= 512): the alignment of every chunk taken
  // from the heap (the alignment argument of alignedAllocate).
  uint64_t base_addr_aligned = 512;
  // Cross-stream reuse of a cached block (seed §6.3). kEvent (the seed): any stream may reuse it
  // at once, inserting a wait on the event recorded where it was freed (event_waits() counts
  // them). kSync: only the stream it was freed on until a device-wide synchronize().
  enum class CrossStream : uint8_t { kEvent, kSync };
  CrossStream cross_stream = CrossStream::kEvent;
  // When freed blocks merge with cached neighbours. kGc (the seed, §4.3 step 2): only when
  // cached memory goes back to the heap (garbage collection, empty_cache, the out-of-memory
  // path), so the cache may hold neighbours a larger request could have used together. kEager:
  // at free, as PyTorch's free_block does.
  enum class Merge : uint8_t { kGc, kEager };
  Merge merge = Merge::kGc;
};

// Models SecondaryMemoryAllocator + DeviceBlockPool + MemoryHeap as one CachingAllocator:
// - malloc rounds to 512 B and looks in the cache (the seed's FreeList; a small pool for
//   requests <= 1 MiB and a large pool, as PyTorch) for the best-fitting free block the stream
//   may use; on a miss it takes a chunk (2 MiB small, 20 MiB for 1-10 MiB, else the size rounded
//   to 2 MiB) from the heap by best fit and splits it (PyTorch's should_split rules).
// - free caches the block on its stream (merged with free neighbours of its chunk); it returns
//   to the heap only through garbage collection, empty_cache() or the out-of-memory path.
// Stream-aware reuse: a cached block remembers the stream it was freed on, where the seed records
// an event. With cross_stream kEvent (the seed) any stream may reuse it at once: a stream other
// than that one waits on the event first (event_waits counts the waits: one per reuse by another
// stream, or by any stream of a block merged from parts freed on several). With kSync another
// stream may reuse it only after a synchronization point, synchronize(), which orders all
// streams after every free so far. empty_cache(), garbage collection and the out-of-memory path
// synchronize first, as PyTorch's release paths do (cudaFree / synchronize_and_free_events), so
// memory back in the heap is never in flight on any stream.
// Merging: with merge kGc (the seed) a freed block stays as it is in the cache, and runs of
// cached neighbours merge when cached memory goes back to the heap; with kEager it merges with
// its cached neighbours at free (those it may merge with: under kSync, ready or pending on the
// same stream; the rest at the next synchronize()).
// Out of memory: when the heap has no room, every cached block goes back to the heap (where it
// coalesces) and the chunk is retried, then a chunk of just the request; if that fails too,
// malloc returns kOutOfMemory and the stats are as before the call (but for `ooms`).
// Region: with kVmm the physical granules mapped always cover the highest heap byte in use
// (live or cached); the tail above it is unmapped by empty_cache(), and by a malloc that
// collected garbage or emptied the cache to find room, once it succeeds. reserved_bytes = physical
// bytes held (mapped granules, or heap_size for kDeviceMalloc), segments = granule handles (or 1
// for the device_malloc region). Hot paths (malloc hit, free) are O(log n); a miss adds the heap's
// O(log n) and one map per new granule. Not thread-safe. Call release_all() to give the memory
// back; the destructor only frees the bookkeeping (the backend may be gone).
class Sma final : public CachingAllocator {
 public:
  // PyTorch's constants (CUDACachingAllocator.cpp), which the seed's kSmallBuffer and
  // kLargeBuffer name too.
  static constexpr uint64_t kMinBlockSize = 512;           // sizes round to 512 B
  static constexpr uint64_t kSmallSize = 1ull << 20;       // largest small request: 1 MiB
  static constexpr uint64_t kSmallBuffer = 2ull << 20;     // small chunks: 2 MiB
  static constexpr uint64_t kLargeBuffer = 20ull << 20;    // chunks for 1..10 MiB: 20 MiB
  static constexpr uint64_t kMinLargeAlloc = 10ull << 20;  // from here chunks fit the size
  static constexpr uint64_t kRoundLarge = 2ull << 20;      // large chunks round to 2 MiB

  explicit Sma(Backend& backend, SmaConfig config = {});
  ~Sma() override;
  Sma(const Sma&) = delete;
  Sma& operator=(const Sma&) = delete;

  Result<DevPtr> malloc(uint64_t bytes, StreamId stream) override;
  Status free(DevPtr p) override;
  Status empty_cache() override;  // synchronize, every cached block to the heap, trim the tail
  Status release_all() override;
  AllocatorStats stats() const override { return stats_; }
  std::vector<LiveBlock> live_blocks() const override;  // sorted by address
  bool check_invariants(std::string* why) const override;

  // A device-wide synchronization: every cached block becomes reusable by any stream (and
  // neighbours cached on different streams merge).
  Status synchronize();

  const SmaConfig& config() const { return config_; }
  uint64_t heap_size() const { return heap_size_; }
  DevPtr base() const { return base_; }  // the region's address; 0 before the first malloc
  const MemoryHeap& heap() const { return heap_; }
  uint64_t cached_bytes() const { return cached_bytes_; }
  uint64_t cached_blocks() const { return age_.size(); }
  uint64_t synchronizations() const { return synchronizations_; }
  uint64_t gc_runs() const { return gc_runs_; }
  uint64_t event_waits() const { return event_waits_; }

  static uint64_t round_size(uint64_t bytes);        // >= 512, a multiple of 512
  static uint64_t chunk_size_for(uint64_t rounded);  // PyTorch's get_allocation_size

 private:
  enum class State : uint8_t {
    kLive,     // handed to a caller
    kPending,  // cached; reusable only by `stream` until the next synchronize()
    kReady,    // cached; reusable by any stream
  };
  struct Pool;
  // DeviceBlock: `stream` is the seed's stream_ (the stream of the live block, or the one it was
  // freed on), `pool` its pool_, prev/next its physical neighbours (prev_/next_) within one heap
  // used range, and kPending stands for event_count_ > 0.
  struct Block {
    uint64_t offset = 0;  // in the heap; the address is base_ + offset
    uint64_t size = 0;
    uint64_t requested = 0;  // live blocks only
    StreamId stream;
    Pool* pool = nullptr;
    Block* prev = nullptr;
    Block* next = nullptr;
    State state = State::kReady;
    uint64_t age = 0;  // cached blocks: when the memory was last freed (the GC's LRU key)
    // Cached blocks: the events recorded on them since the last synchronization (kEvent):
    // none, one on `stream`, or several (parts freed on different streams, merged).
    enum class Events : uint8_t { kNone, kOne, kSeveral } events = Events::kNone;
  };
  struct PendingLess {  // (stream, size, offset)
    using is_transparent = void;
    bool operator()(const Block* a, const Block* b) const;
  };
  struct ReadyLess {  // (size, offset)
    using is_transparent = void;
    bool operator()(const Block* a, const Block* b) const;
  };
  struct AgeLess {  // (age, offset): oldest first
    using is_transparent = void;
    bool operator()(const Block* a, const Block* b) const;
  };
  struct Pool {
    explicit Pool(bool small) : is_small(small) {}
    const bool is_small;
    std::set<Block*, PendingLess> pending;
    std::set<Block*, ReadyLess> ready;
  };

  bool vmm() const { return config_.region == SmaConfig::Region::kVmm; }
  uint64_t mapped_bytes() const { return handles_.size() * granularity_; }
  uint64_t footprint() const;  // the heap's used end rounded up to the granularity
  Block* take_cached(Pool& pool, uint64_t size, StreamId stream);
  bool reusable(const Block& block, uint64_t size) const;
  bool should_split(const Block& block, uint64_t size) const;
  Result<Block*> serve_miss(Pool& pool, uint64_t size, bool* trim_after);
  Result<Block*> new_chunk(Pool& pool, uint64_t bytes);
  Block* hand_out(Block* block, uint64_t size, uint64_t requested, StreamId stream);
  void insert_cached(Block* block);
  void remove_cached(Block* block);
  bool mergeable(const Block* neighbour, StreamId stream) const;
  void merge_cached_runs();  // every run of cached neighbours becomes one block
  void absorb(Block* dst, Block* src);
  Status release_to_heap(Block* block);
  Status release_cached(uint64_t footprint_goal);
  Status collect_garbage();
  Status open_region();
  void commit_region();
  void abandon_region();
  Status grow_to(uint64_t end);
  Status drop_granules(size_t keep, bool stop_on_error, uint64_t* dropped);
  void count_dropped(uint64_t dropped);
  Status trim();
  void delete_all_blocks();
  bool fail(std::string* why, const std::string& msg) const;

  Backend& backend_;
  SmaConfig config_;
  uint64_t granularity_ = 1;
  uint64_t heap_size_ = 0;
  MemoryHeap heap_;
  bool region_open_ = false;
  DevPtr base_ = 0;
  std::vector<PhysHandle> handles_;  // kVmm: handle k backs heap bytes [k, k + 1) * granularity
  Pool small_{true};
  Pool large_{false};
  std::set<Block*, AgeLess> age_;            // every cached block, least recently freed first
  std::unordered_map<DevPtr, Block*> live_;  // live blocks by address
  uint64_t cached_bytes_ = 0;
  uint64_t age_clock_ = 0;
  uint64_t synchronizations_ = 0;
  uint64_t gc_runs_ = 0;
  uint64_t event_waits_ = 0;
  AllocatorStats stats_;
};

}  // namespace memsim
