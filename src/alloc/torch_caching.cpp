// TorchCachingAllocator: block pools, best fit, splitting and segment policy of PyTorch.
//
// Every rule below names the function of c10/cuda/CUDACachingAllocator.cpp
// (DeviceCachingAllocator, no expandable segments) it follows.
// Not modelled (no effect in this single-device, event-free model): cross-stream uses and
// their events (recordStream / process_events: a replayed trace frees a block when PyTorch
// completed the free), free-memory callbacks, history/trace recording, and the per-StatType
// stat arrays.
//
// CUDA graph capture: PyTorch's free() puts a block with no cross-stream uses straight back into
// its pool (free_block) even while a capture is underway, so a block freed during capture is
// immediately reusable by later allocations of the same private pool. Blocks here never carry
// stream uses, so plain free semantics are the faithful model of capture too.
#include "src/alloc/torch_caching.h"

#include <algorithm>
#include <bit>
#include <utility>

namespace memsim {

namespace {

void add_stat(uint64_t& current, uint64_t& peak, uint64_t amount) {
  current += amount;
  peak = std::max(peak, current);
}

}  // namespace

bool TorchCachingAllocator::BlockLess::operator()(const Block* a, const Block* b) const {
  // Follows BlockComparatorSize(): (stream, size, address).
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

TorchCachingAllocator::TorchCachingAllocator(SegmentSource& source, TorchCachingConfig config)
    : source_(source), config_(config) {}

TorchCachingAllocator::TorchCachingAllocator(std::unique_ptr<SegmentSource> source,
                                             TorchCachingConfig config, Backend* vmm)
    : owned_source_(std::move(source)), vmm_(vmm), source_(*owned_source_), config_(config) {}

// Frees the bookkeeping only; segments still held are not returned (see the header).
TorchCachingAllocator::~TorchCachingAllocator() {
  delete_all_blocks();
}

void TorchCachingAllocator::delete_all_blocks() {
  for (auto& [base, seg] : segments_) {
    for (Block* b = seg.head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
    seg.head = nullptr;
  }
}

// Follows CUDAAllocatorConfig::roundup_power2_divisions(size): interval floor(log2(size)) - 20,
// clamped to the 16 slots.
uint32_t TorchCachingConfig::divisions_for(uint64_t size) const {
  const int log_size = size == 0 ? 0 : std::bit_width(size) - 1;
  const int index =
      std::clamp(log_size - 20, 0, static_cast<int>(roundup_power2_divisions.size()) - 1);
  return roundup_power2_divisions[static_cast<size_t>(index)];
}

// Follows roundup_power2_next_division() in CUDACachingAllocator.cpp.
uint64_t TorchCachingAllocator::roundup_power2_next_division(uint64_t size, uint32_t divisions) {
  if (size == 0 || std::has_single_bit(size)) return size;
  if (divisions < 2) return std::bit_ceil(size);
  const uint64_t power2_floor = std::bit_floor(size);
  const uint64_t power2_division = power2_floor >> (std::bit_width(divisions) - 1);
  if (power2_division == 0) return power2_floor << 1;
  const uint64_t round_size_floor = size & ~(power2_division - 1);
  return round_size_floor == size ? size : round_size_floor + power2_division;
}

// Follows round_size() in CUDACachingAllocator.cpp.
uint64_t TorchCachingAllocator::round_size(uint64_t size, uint32_t roundup_power2_divisions) {
  if (size < kMinBlockSize) return kMinBlockSize;
  const uint64_t divisions = roundup_power2_divisions;
  if (divisions > 1 && size > kMinBlockSize * divisions) {
    return roundup_power2_next_division(size, roundup_power2_divisions);
  }
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

// Follows get_allocation_size() in CUDACachingAllocator.cpp.
uint64_t TorchCachingAllocator::segment_size_for(uint64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

// Follows DeviceCachingAllocator::malloc(): round, pick the pool, search the pool, else
// allocate a segment; on OOM release_available_cached_blocks, then release_cached_blocks, and
// retry; finally split the found block if should_split says so (alloc_found_block).
Result<DevPtr> TorchCachingAllocator::malloc(uint64_t bytes, StreamId stream) {
  if (bytes == 0) return make_error(ErrorCode::kInvalidArgument, "malloc of 0 bytes");
  if (bytes >= kMaxRequest) {  // NativeCachingAllocator::allocate(): "more than 1EB"
    ++stats_.ooms;
    return make_error(ErrorCode::kOutOfMemory, "tried to allocate more than 1EB", bytes);
  }
  const uint64_t size = round_size_of(bytes);
  BlockPool& pool = get_pool(size);
  const uint64_t alloc_size = segment_size_for(size);

  Block* block = get_free_block(pool, size, stream);
  if (block == nullptr) {
    if (gc_enabled()) MEMSIM_TRY(garbage_collect_cached_blocks());
    // alloc_block(): with expandable segments, grow one instead of a new cudaMalloc.
    auto grow = [&]() {
      return config_.expandable_segments ? try_allocate_expandable_block(pool, size, stream)
                                         : alloc_block(pool, alloc_size, stream);
    };
    Result<Block*> r = grow();
    if (!r.ok() && r.error().code == ErrorCode::kOutOfMemory) {
      Result<bool> released = release_available_cached_blocks(pool, size, stream);
      if (!released.ok()) return released.error();
      if (*released) r = grow();
    }
    // PyTorch skips this step while a capture is underway (it would cudaFree under capture);
    // this allocator does not know about captures, so it always retries.
    if (!r.ok() && r.error().code == ErrorCode::kOutOfMemory) {
      MEMSIM_TRY(release_cached_blocks());
      r = grow();
    }
    if (!r.ok()) {
      Error e = r.error();
      if (e.code == ErrorCode::kOutOfMemory) {
        ++stats_.ooms;
        if (e.bytes_short == 0) e.bytes_short = alloc_size;
        e.message = "torch_caching: out of memory allocating a " + std::to_string(alloc_size) +
                    " B segment for a " + std::to_string(bytes) + " B request" +
                    (e.message.empty() ? "" : ": " + e.message);
      }
      return e;
    }
    block = r.value();
  }
  const bool split = should_split(*block, size);
  return alloc_found_block(block, size, bytes, split)->ptr;
}

// Follows get_free_block(): best fit on the same stream = lower_bound of (stream, size), with
// the max_split_size limits on oversize blocks. The chosen block leaves the pool.
TorchCachingAllocator::Block* TorchCachingAllocator::get_free_block(BlockPool& pool, uint64_t size,
                                                                    StreamId stream) {
  if (gc_enabled()) ++pool.get_free_blocks_call_count;  // the age clock of the GC
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream != stream) return nullptr;
  if (config_.expandable_segments && (*it)->segment->expandable) {
    // A free block followed by unmapped space counts as the size it could grow to, so best
    // fit takes the next larger blocks that cannot grow before it.
    auto expandable_size = [](const Block* b) {
      return b->size + (b->next != nullptr && !b->next->mapped ? b->next->size : 0);
    };
    for (auto next = std::next(it);
         (*it)->segment->expandable && next != pool.blocks.end() && (*next)->stream == stream &&
         expandable_size(*next) < expandable_size(*it);
         ++next)
      it = next;
  }
  const uint64_t max_split = config_.max_split_size;
  // Do not return an oversized block for a large request.
  if (size < max_split && (*it)->size >= max_split) return nullptr;
  // Allow an oversized block to be rounded up, but within a limit.
  if (size >= max_split && (*it)->size >= size + kLargeBuffer) return nullptr;
  Block* block = *it;
  pool.blocks.erase(it);
  return block;
}

// Follows should_split(): the small pool splits off any remainder >= 512 B; the large pool
// only when the (rounded) request is below max_split_size and the remainder exceeds 1 MiB.
bool TorchCachingAllocator::should_split(const Block& block, uint64_t size) const {
  const uint64_t remaining = block.size - size;
  if (block.segment->pool->is_small || config_.expandable_segments)
    return remaining >= kMinBlockSize;
  return size < config_.max_split_size && remaining > kSmallSize;
}

// Follows alloc_block(): one new segment from the source, as a single (unsplit) block that is
// not yet in the pool. With a memory limit (set_fraction), a segment that would take reserved
// bytes past it fails before the source is asked.
Result<TorchCachingAllocator::Block*> TorchCachingAllocator::alloc_block(BlockPool& pool,
                                                                         uint64_t alloc_size,
                                                                         StreamId stream) {
  if (config_.memory_limit != 0 && stats_.reserved_bytes + alloc_size > config_.memory_limit) {
    return make_error(
        ErrorCode::kOutOfMemory,
        "the per-process memory limit (" + std::to_string(config_.memory_limit) + " B) is reached",
        stats_.reserved_bytes + alloc_size - config_.memory_limit);
  }
  MEMSIM_ASSIGN_OR_RETURN(const DevPtr ptr, source_.allocate_segment(alloc_size, stream));
  if (ptr == 0 || segments_.count(ptr) != 0) {
    (void)source_.release_segment(ptr, alloc_size);
    return make_error(ErrorCode::kInvalidState, "segment source returned a live address");
  }
  return new_segment_block(pool, ptr, alloc_size, stream);
}

TorchCachingAllocator::Block* TorchCachingAllocator::new_segment_block(BlockPool& pool, DevPtr ptr,
                                                                       uint64_t alloc_size,
                                                                       StreamId stream) {
  Segment& seg = segments_[ptr];
  seg.base = ptr;
  seg.size = alloc_size;
  seg.stream = stream;
  seg.pool = &pool;
  auto* block = new Block;
  block->ptr = ptr;
  block->size = alloc_size;
  block->stream = stream;
  block->segment = &seg;
  seg.head = block;
  add_stat(stats_.reserved_bytes, stats_.peak_reserved_bytes, alloc_size);
  ++stats_.segments;
  ++stats_.segment_allocs;
  if (observer_ != nullptr) observer_->segment_alloc(ptr, alloc_size, stream);
  return block;
}

// Follows alloc_found_block(): when splitting, the allocated part keeps the lower address and
// the remainder (the original Block, shrunk and moved up) goes back to the pool.
TorchCachingAllocator::Block* TorchCachingAllocator::alloc_found_block(Block* block, uint64_t size,
                                                                       uint64_t requested,
                                                                       bool split) {
  if (split) {
    Block* remaining = block;
    block = new Block;
    block->ptr = remaining->ptr;
    block->size = size;
    block->stream = remaining->stream;
    block->segment = remaining->segment;
    block->prev = remaining->prev;
    if (block->prev != nullptr) {
      block->prev->next = block;
    } else {
      block->segment->head = block;
    }
    block->next = remaining;
    remaining->prev = block;
    remaining->ptr += size;
    remaining->size -= size;
    insert_into_blocks(*remaining->segment->pool, remaining);
  }
  block->allocated = true;
  block->requested = requested;
  allocated_.emplace(block->ptr, block);
  add_stat(stats_.allocated_bytes, stats_.peak_allocated_bytes, block->size);
  stats_.requested_bytes += requested;
  ++stats_.live_blocks;
  return block;
}

// Follows NativeCachingAllocator::free() (pointer lookup) + DeviceCachingAllocator::free().
Status TorchCachingAllocator::free(DevPtr p) {
  auto it = allocated_.find(p);
  if (it == allocated_.end()) {
    return make_error(ErrorCode::kInvalidArgument, "torch_caching: free of unknown pointer");
  }
  Block* block = it->second;
  allocated_.erase(it);
  block->allocated = false;
  stats_.allocated_bytes -= block->size;
  stats_.requested_bytes -= block->requested;
  --stats_.live_blocks;
  free_block(block);
  return {};
}

// Follows free_block(): merge with free neighbours of the same segment, then cache the block.
void TorchCachingAllocator::free_block(Block* block) {
  block->requested = 0;
  BlockPool& pool = *block->segment->pool;
  try_merge_blocks(block, block->prev, pool);
  try_merge_blocks(block, block->next, pool);
  insert_into_blocks(pool, block);
}

// Follows insert_into_blocks(): a cached block remembers the pool's age clock.
void TorchCachingAllocator::insert_into_blocks(BlockPool& pool, Block* block) {
  block->gc_count_base = pool.get_free_blocks_call_count;
  pool.blocks.insert(block);
}

// PyTorch collects only with a memory fraction set (allowed_memory_maximum) and a threshold.
bool TorchCachingAllocator::gc_enabled() const {
  return config_.memory_limit != 0 && config_.garbage_collection_threshold > 0;
}

// Follows garbage_collect_cached_blocks(): while reserved bytes exceed threshold * limit,
// release every unsplit cached block of the large pool at least as old (in get_free_block calls
// since it was cached) as the mean age of those left, pass after pass.
Status TorchCachingAllocator::garbage_collect_cached_blocks() {
  const auto gc_threshold = static_cast<uint64_t>(config_.garbage_collection_threshold *
                                                  static_cast<double>(config_.memory_limit));
  if (stats_.reserved_bytes <= gc_threshold) return {};
  const uint64_t target_size = stats_.reserved_bytes - gc_threshold;
  auto age = [&](const Block* b) { return large_.get_free_blocks_call_count - b->gc_count_base; };
  double total_age = 0;
  uint64_t n_freeable = 0;
  // Newer PyTorch skips expandable segments here (they are unmapped, not freed).
  auto freeable = [](const Block* b) { return !b->is_split() && !b->segment->expandable; };
  for (const Block* b : large_.blocks) {
    if (!freeable(b)) continue;
    total_age += static_cast<double>(age(b));
    ++n_freeable;
  }
  uint64_t reclaimed = 0;
  bool block_freed = true;
  while (reclaimed < target_size && block_freed && n_freeable > 0) {
    const double age_threshold = total_age / static_cast<double>(n_freeable);
    block_freed = false;
    for (auto it = large_.blocks.begin(); it != large_.blocks.end();) {
      Block* b = *it;
      ++it;  // release_block erases only b
      if (!freeable(b) || static_cast<double>(age(b)) < age_threshold) continue;
      block_freed = true;
      reclaimed += b->size;
      total_age -= static_cast<double>(age(b));
      --n_freeable;
      MEMSIM_TRY(release_block(b));
    }
  }
  return {};
}

// Follows try_merge_blocks(): `dst` (not in the pool) absorbs the free neighbour `src`.
uint64_t TorchCachingAllocator::try_merge_blocks(Block* dst, Block* src, BlockPool& pool) {
  if (src == nullptr || src->allocated || src->mapped != dst->mapped) return 0;
  // Before any field of src changes: the sets are keyed on them.
  if (src->mapped) {
    pool.blocks.erase(src);
  } else {
    pool.unmapped.erase(src);
  }
  if (dst->prev == src) {  // [src dst]
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev != nullptr) {
      dst->prev->next = dst;
    } else {
      dst->segment->head = dst;
    }
  } else {  // [dst src]
    dst->next = src->next;
    if (dst->next != nullptr) dst->next->prev = dst;
  }
  const uint64_t subsumed = src->size;
  dst->size += subsumed;
  delete src;
  return subsumed;
}

// Follows release_block(): return a whole free segment (an unsplit cached block) to the source.
Status TorchCachingAllocator::release_block(Block* block) {
  Segment* seg = block->segment;
  MEMSIM_TRY(source_.release_segment(seg->base, seg->size));
  if (observer_ != nullptr) observer_->segment_free(seg->base, seg->size, seg->stream);
  seg->pool->blocks.erase(block);
  stats_.reserved_bytes -= seg->size;
  --stats_.segments;
  ++stats_.segment_releases;
  segments_.erase(seg->base);
  delete block;
  return {};
}

// Follows release_blocks(): release every non-split cached block of the pool; free blocks of
// expandable segments are unmapped (whole pages), and a segment left wholly unmapped is freed.
Status TorchCachingAllocator::release_blocks(BlockPool& pool) {
  Status first;
  std::vector<Block*> to_unmap;
  auto it = pool.blocks.begin();
  while (it != pool.blocks.end()) {
    Block* block = *it;
    ++it;  // release_block erases only `block`
    if (block->segment->expandable) {
      to_unmap.push_back(block);
      continue;
    }
    if (block->is_split()) continue;
    Status s = release_block(block);
    if (!s.ok() && first.ok()) first = s;
  }
  for (Block* block : to_unmap) {
    Status s = unmap_block(block);
    if (s.ok() && !block->is_split()) s = release_expandable_segment(block);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

// Follows release_cached_blocks(): large pool first, then small.
Status TorchCachingAllocator::release_cached_blocks() {
  Status large = release_blocks(large_);
  Status small = release_blocks(small_);
  return large.ok() ? small : large;
}

// Follows release_available_cached_blocks(): only with a max_split_size set, free the
// smallest oversize cached block that covers the request, else the largest oversize blocks
// until their sizes cover it. Returns whether anything sufficient was released.
// Deviation: a split free block (possible when a request below max_split_size split a bigger
// fresh segment) is skipped, where PyTorch would cudaFree a pointer inside a segment.
Result<bool> TorchCachingAllocator::release_available_cached_blocks(BlockPool& pool, uint64_t size,
                                                                    StreamId stream) {
  const uint64_t max_split = config_.max_split_size;
  if (max_split == UINT64_MAX) return false;
  Block key;
  key.stream = stream;
  key.size = std::max(size, max_split);
  auto it = pool.blocks.lower_bound(&key);
  if (it != pool.blocks.end() && (*it)->stream == stream) {
    if ((*it)->is_split() || (*it)->segment->expandable) return false;
    MEMSIM_TRY(release_block(*it));
    return true;
  }
  // No single block is large enough; free oversize blocks, starting with the largest.
  if (it == pool.blocks.begin()) return false;
  --it;
  uint64_t total_released = 0;
  while (total_released < key.size && (*it)->size >= max_split && (*it)->stream == stream) {
    Block* cur = *it;
    const bool at_begin = it == pool.blocks.begin();
    if (!at_begin) --it;
    if (!cur->is_split() && !cur->segment->expandable) {
      total_released += cur->size;
      MEMSIM_TRY(release_block(cur));
    }
    if (at_begin) break;
  }
  return total_released >= key.size;
}

// Follows emptyCache() -> release_cached_blocks().
Status TorchCachingAllocator::empty_cache() {
  return release_cached_blocks();
}

// Teardown: drop every block (live or cached) and return every segment to the source.
Status TorchCachingAllocator::release_all() {
  delete_all_blocks();
  Status first;
  for (auto& [base, seg] : segments_) {
    Status s =
        seg.expandable ? release_expandable_all(seg) : source_.release_segment(seg.base, seg.size);
    if (!s.ok() && first.ok()) first = s;
    ++stats_.segment_releases;
  }
  segments_.clear();
  allocated_.clear();
  small_.blocks.clear();
  large_.blocks.clear();
  small_.unmapped.clear();
  large_.unmapped.clear();
  clear_current(stats_);
  return first;
}

// Recreates a segment as PyTorch left it: live blocks at their offsets (the recorded size, else
// the rounded request, extended over a following gap too small to have been split off, as
// should_split() would have left it), free gaps cached. Fails without changing anything when
// the image does not fit its size.
Result<std::vector<DevPtr>> TorchCachingAllocator::adopt_segment(const SegmentImage& image) {
  if (config_.expandable_segments)
    return make_error(ErrorCode::kNotSupported,
                      "adopt_segment: torch_caching with expandable segments cannot take over "
                      "segments held before the trace began");
  struct Piece {
    uint64_t offset, size, requested;
    bool live;
  };
  std::vector<Piece> pieces;
  uint64_t cursor = 0;
  const bool small = image.small;
  for (size_t k = 0; k < image.blocks.size(); ++k) {
    const auto& b = image.blocks[k];
    const uint64_t next = k + 1 < image.blocks.size() ? image.blocks[k + 1].offset : image.size;
    if (b.offset < cursor || b.requested == 0 || next < b.offset)
      return make_error(ErrorCode::kInvalidArgument, "adopt_segment: blocks overlap or are empty");
    uint64_t size = b.size != 0 ? b.size : round_size_of(b.requested);
    if (size > next - b.offset)
      return make_error(ErrorCode::kInvalidArgument, "adopt_segment: a block overruns the next");
    const uint64_t remaining = next - b.offset - size;
    const bool splits = small ? remaining >= kMinBlockSize
                              : size < config_.max_split_size && remaining > kSmallSize;
    if (b.size == 0 && !splits) size += remaining;
    if (b.offset > cursor) pieces.push_back({cursor, b.offset - cursor, 0, false});
    pieces.push_back({b.offset, size, b.requested, true});
    cursor = b.offset + size;
  }
  if (cursor > image.size)
    return make_error(ErrorCode::kInvalidArgument, "adopt_segment: blocks run past the segment");
  if (cursor < image.size) pieces.push_back({cursor, image.size - cursor, 0, false});

  BlockPool& pool = small ? small_ : large_;
  MEMSIM_ASSIGN_OR_RETURN(Block * head, alloc_block(pool, image.size, image.stream));
  Segment* seg = head->segment;
  std::vector<DevPtr> out;
  Block* prev = nullptr;
  for (size_t k = 0; k < pieces.size(); ++k) {
    Block* b = k == 0 ? head : new Block;
    b->ptr = seg->base + pieces[k].offset;
    b->size = pieces[k].size;
    b->stream = image.stream;
    b->segment = seg;
    b->prev = prev;
    b->next = nullptr;
    if (prev != nullptr) prev->next = b;
    prev = b;
    if (pieces[k].live) {
      b->allocated = true;
      b->requested = pieces[k].requested;
      allocated_.emplace(b->ptr, b);
      add_stat(stats_.allocated_bytes, stats_.peak_allocated_bytes, b->size);
      stats_.requested_bytes += b->requested;
      ++stats_.live_blocks;
      out.push_back(b->ptr);
    } else {
      insert_into_blocks(pool, b);
    }
  }
  return out;
}

std::vector<LiveBlock> TorchCachingAllocator::live_blocks() const {
  std::vector<LiveBlock> out;
  out.reserve(allocated_.size());
  for (const auto& [ptr, b] : allocated_) out.push_back(LiveBlock{ptr, b->size, b->requested});
  return by_address(std::move(out));
}

bool TorchCachingAllocator::fail(std::string* why, const std::string& msg) const {
  return invariant_broken(why, msg);
}

bool TorchCachingAllocator::check_invariants(std::string* why) const {
  uint64_t reserved = 0, allocated = 0, requested = 0, live = 0, free_blocks = 0;
  DevPtr prev_end = 0;
  for (const auto& [base, seg] : segments_) {
    const std::string at = "segment " + std::to_string(base) + ": ";
    if (seg.base != base || seg.size == 0) return fail(why, at + "bad segment record");
    if (base < prev_end) return fail(why, at + "overlaps the previous segment");
    prev_end = base + seg.size;
    if (seg.pool != &small_ && seg.pool != &large_) return fail(why, at + "bad pool");
    if (seg.head == nullptr || seg.head->prev != nullptr) return fail(why, at + "bad head");
    DevPtr cursor = base;
    const Block* last = nullptr;
    for (const Block* b = seg.head; b != nullptr; last = b, b = b->next) {
      const std::string bat = at + "block " + std::to_string(b->ptr) + ": ";
      if (b->prev != last) return fail(why, bat + "broken prev link");
      if (b->segment != &seg) return fail(why, bat + "wrong segment");
      if (b->ptr != cursor || b->size == 0) return fail(why, bat + "does not tile the segment");
      if (b->stream != seg.stream) return fail(why, bat + "stream differs from segment");
      cursor += b->size;
      if (cursor > base + seg.size) return fail(why, bat + "runs past the segment end");
      if (!b->mapped && !seg.expandable) return fail(why, bat + "unmapped in a plain segment");
      if (seg.expandable) {  // mapped blocks lie on mapped pages; unmapped ones are whole
        const uint64_t first = (b->ptr - base) / seg.page;  // unmapped pages
        const uint64_t end = (b->ptr - base + b->size + seg.page - 1) / seg.page;
        if (!b->mapped && ((b->ptr - base) % seg.page != 0 || b->size % seg.page != 0))
          return fail(why, bat + "unmapped block is not whole pages");
        for (uint64_t p = first; p < end; ++p)
          if (b->mapped != (seg.handles[p].id != 0))
            return fail(why, bat + (b->mapped ? "mapped block on an unmapped page"
                                              : "unmapped block on a mapped page"));
      }
      const bool pooled = b->mapped ? seg.pool->blocks.count(const_cast<Block*>(b)) != 0 &&
                                          *seg.pool->blocks.find(const_cast<Block*>(b)) == b
                                    : seg.pool->unmapped.count(const_cast<Block*>(b)) != 0;
      if (b->allocated) {
        auto a = allocated_.find(b->ptr);
        if (a == allocated_.end() || a->second != b) return fail(why, bat + "not in live map");
        if (pooled) return fail(why, bat + "allocated block in the free set");
        if (!b->mapped) return fail(why, bat + "allocated block is not mapped");
        if (b->requested == 0 || b->requested > b->size) return fail(why, bat + "bad requested");
        allocated += b->size;
        requested += b->requested;
        ++live;
      } else {
        if (!pooled) return fail(why, bat + "free block missing from its pool");
        if (last != nullptr && !last->allocated && last->mapped == b->mapped)
          return fail(why, bat + "unmerged free blocks");
        ++free_blocks;
      }
    }
    if (cursor != base + seg.size) return fail(why, at + "blocks do not cover the segment");
    if (seg.expandable) {
      for (const PhysHandle& h : seg.handles) reserved += h.id != 0 ? seg.page : 0;
    } else {
      reserved += seg.size;
    }
  }
  if (free_blocks != small_.blocks.size() + large_.blocks.size() + small_.unmapped.size() +
                         large_.unmapped.size()) {
    return fail(why, "free sets hold blocks outside any segment");
  }
  if (live != allocated_.size()) return fail(why, "live map holds blocks outside any segment");
  if (stats_.reserved_bytes != reserved) return fail(why, "reserved_bytes counter mismatch");
  if (stats_.allocated_bytes != allocated) return fail(why, "allocated_bytes counter mismatch");
  if (stats_.requested_bytes != requested) return fail(why, "requested_bytes counter mismatch");
  if (stats_.segments != segments_.size()) return fail(why, "segments counter mismatch");
  if (stats_.live_blocks != live) return fail(why, "live_blocks counter mismatch");
  if (stats_.peak_reserved_bytes < reserved || stats_.peak_allocated_bytes < allocated) {
    return fail(why, "peak below current");
  }
  if (stats_.segment_allocs != stats_.segment_releases + stats_.segments) {
    return fail(why, "segment_allocs != segment_releases + segments");
  }
  return true;
}

}  // namespace memsim
