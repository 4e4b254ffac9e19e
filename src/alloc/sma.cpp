// Sma: MemoryHeap best fit and coalescing, the DeviceBlockPool cache, stream-aware reuse, GC.
//
// Rules cite the seed (seeds/zbccl-sma-allocator.md, "seed §n") where it has one; where it is
// silent they follow DeviceCachingAllocator in c10/cuda/CUDACachingAllocator.cpp and say so.
// Not modelled: the heap's spin lock (single-threaded), IPC / shared-memory export, changeSize
// (realloc), and real events (see the stream model in sma.h).
#include "src/alloc/sma.h"

#include <algorithm>
#include <bit>

namespace memsim {

namespace {

constexpr const char* kTag = "sma";

uint64_t round_up(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

void add_stat(uint64_t& current, uint64_t& peak, uint64_t amount) {
  current += amount;
  peak = std::max(peak, current);
}

}  // namespace

// ---- Sma: construction, rounding ------------------------------------------------------------

bool Sma::PendingLess::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  return a->offset < b->offset;
}

bool Sma::ReadyLess::operator()(const Block* a, const Block* b) const {
  if (a->size != b->size) return a->size < b->size;
  return a->offset < b->offset;
}

bool Sma::AgeLess::operator()(const Block* a, const Block* b) const {
  if (a->age != b->age) return a->age < b->age;
  return a->offset < b->offset;
}

Sma::Sma(Backend& backend, SmaConfig config) : backend_(backend), config_(config) {
  granularity_ = std::max<uint64_t>(backend.granularity(), 1);
  // Bounded so that rounding below cannot wrap; no device has an exabyte.
  const uint64_t want = std::min<uint64_t>(config.heap_size, 1ull << 60);
  heap_size_ =
      want != 0 ? round_up(want, granularity_) : backend.capacity() / granularity_ * granularity_;
  heap_ = MemoryHeap(heap_size_);
}

// Frees the bookkeeping only; memory still held is not returned (see the header).
Sma::~Sma() {
  delete_all_blocks();
}

void Sma::delete_all_blocks() {
  for (const auto& [ptr, block] : live_) delete block;
  for (Block* block : age_) delete block;
  live_.clear();
  age_.clear();
  for (Pool* pool : {&small_, &large_}) {
    pool->pending.clear();
    pool->ready.clear();
  }
  cached_bytes_ = 0;
}

// Seed §4.2 step 1 aligns the size "e.g. to 512 B"; PyTorch's round_size does the same (no
// roundup_power2_divisions: SMAConfig has no such key).
uint64_t Sma::round_size(uint64_t bytes) {
  return bytes < kMinBlockSize ? kMinBlockSize : round_up(bytes, kMinBlockSize);
}

// Seed §4.2 step 3: a miss takes more than asked, "rounded up to kSmallBuffer or kLargeBuffer to
// allow later splitting"; the seed gives no thresholds, so these are get_allocation_size's.
uint64_t Sma::chunk_size_for(uint64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return round_up(rounded, kRoundLarge);
}

uint64_t Sma::footprint() const {
  return round_up(heap_.used_end(), granularity_);
}

// ---- malloc ---------------------------------------------------------------------------------

// Seed §4.2: align, look in the cache, else take a chunk from the heap and split it.
Result<DevPtr> Sma::malloc(uint64_t bytes, StreamId stream) {
  if (bytes == 0) return make_error(ErrorCode::kInvalidArgument, "sma: malloc of 0 bytes");
  if (bytes > heap_size_) {
    ++stats_.ooms;
    return make_error(ErrorCode::kOutOfMemory,
                      "sma: " + std::to_string(bytes) + " B is larger than the heap (" +
                          std::to_string(heap_size_) + " B)",
                      bytes - heap_size_);
  }
  const uint64_t size = round_size(bytes);
  // The seed's pool_ field and its kSmallBuffer/kLargeBuffer tiers; how requests map to pools it
  // leaves open, so PyTorch's get_pool: <= 1 MiB small, else large.
  Pool& pool = size <= kSmallSize ? small_ : large_;
  Block* block = take_cached(pool, size, stream);
  bool trim_after = false;
  if (block == nullptr) {
    Result<Block*> r = serve_miss(pool, size, &trim_after);
    if (!r.ok()) {
      if (r.error().code == ErrorCode::kOutOfMemory) ++stats_.ooms;
      return r.error();
    }
    block = r.value();
  }
  block = hand_out(block, size, bytes, stream);
  // A failed trim leaves the tail mapped (and counted as reserved); the malloc itself is done.
  if (trim_after) (void)trim();
  return base_ + block->offset;
}

// Seed §4.2 step 2: the best-fitting cached block this stream may use: one it freed itself
// (pending on it) or one any stream may use (ready), whichever is smaller. The stream order of
// PendingLess puts this stream's blocks together, so each set costs one lower_bound.
Sma::Block* Sma::take_cached(Pool& pool, uint64_t size, StreamId stream) {
  Block key;
  key.stream = stream;
  key.size = size;
  Block* best = nullptr;
  auto pending = pool.pending.lower_bound(&key);
  if (pending != pool.pending.end() && (*pending)->stream == stream && reusable(**pending, size))
    best = *pending;
  auto ready = pool.ready.lower_bound(&key);
  if (ready != pool.ready.end() && reusable(**ready, size) &&
      (best == nullptr || ReadyLess{}(*ready, best)))
    best = *ready;
  if (best != nullptr) remove_cached(best);
  return best;
}

// max_split_size (seed §3.3) with get_free_block's rules: a request below it takes no block at
// or above it, and an oversize block serves a request only within kLargeBuffer of its size. The
// candidate is the smallest fitting block, so rejecting it rejects every larger one too.
bool Sma::reusable(const Block& block, uint64_t size) const {
  const uint64_t max_split = config_.max_split_size;
  if (size < max_split && block.size >= max_split) return false;
  if (size >= max_split && block.size - size >= kLargeBuffer) return false;
  return true;
}

// Seed §4.2 "split" is unconditional; when to split it leaves open, so should_split(): the small
// pool splits off any remainder >= 512 B, the large pool only below max_split_size and when the
// remainder exceeds 1 MiB (seed §6.2: max_split_size keeps big blocks whole).
bool Sma::should_split(const Block& block, uint64_t size) const {
  const uint64_t remaining = block.size - size;
  if (block.pool->is_small) return remaining >= kMinBlockSize;
  return size < config_.max_split_size && remaining > kSmallSize;
}

// A cache miss: open the region (first malloc), collect garbage when over the threshold, take a
// chunk; on out of memory return every cached block to the heap (it coalesces there) and retry,
// then retry with a chunk of just the request. On failure nothing the caller sees has changed:
// the region opened here is closed again, growth is rolled back and the tail is not trimmed
// (*trim_after asks malloc to trim once the block is handed out).
Result<Sma::Block*> Sma::serve_miss(Pool& pool, uint64_t size, bool* trim_after) {
  const bool opened_here = !region_open_;
  if (Status s = open_region(); !s.ok()) return s.error();
  const uint64_t gc_runs_before = gc_runs_;
  if (Status gc = collect_garbage(); !gc.ok()) return gc.error();
  *trim_after = gc_runs_ != gc_runs_before;
  const uint64_t chunk = chunk_size_for(size);
  Result<Block*> r = new_chunk(pool, chunk);
  auto out_of_memory = [&] { return !r.ok() && r.error().code == ErrorCode::kOutOfMemory; };
  if (out_of_memory() && !age_.empty()) {
    Status s = synchronize();
    if (s.ok()) s = release_cached(0);
    if (!s.ok()) return s.error();
    *trim_after = true;
    r = new_chunk(pool, chunk);
  }
  // Deviation: PyTorch stops here (cudaMalloc of the rounded size failed). The heap is a fixed
  // region, where a 20 MiB chunk can fail although the request fits; a chunk of exactly the
  // rounded request (never split) is the last try.
  if (out_of_memory() && chunk > size) r = new_chunk(pool, size);
  if (!r.ok()) {
    if (opened_here) abandon_region();
    Error e = r.error();
    if (e.code == ErrorCode::kOutOfMemory)
      e.message = "sma: out of memory taking a " + std::to_string(chunk) + " B chunk for a " +
                  std::to_string(size) + " B block (heap " + std::to_string(heap_size_) +
                  " B, largest idle range " + std::to_string(heap_.largest_idle()) + " B)" +
                  (e.message.empty() ? "" : ": " + e.message);
    return e;
  }
  if (opened_here) commit_region();
  return r;
}

// Seed §4.2 step 3 (alignedAllocate with base_addr_aligned) + kVmm growth. A fresh chunk is one
// unsplit ready block: heap memory is in flight on no stream (every path back to the heap
// synchronizes first).
Result<Sma::Block*> Sma::new_chunk(Pool& pool, uint64_t bytes) {
  const std::optional<uint64_t> offset = heap_.aligned_allocate(config_.base_addr_aligned, bytes);
  if (!offset) {
    const uint64_t largest = heap_.largest_idle();
    return make_error(ErrorCode::kOutOfMemory, "", bytes > largest ? bytes - largest : 0);
  }
  if (Status s = grow_to(*offset + bytes); !s.ok()) {
    (void)heap_.release(*offset);
    return s.error();
  }
  auto* block = new Block;
  block->offset = *offset;
  block->size = bytes;
  block->pool = &pool;
  block->state = State::kReady;
  block->age = ++age_clock_;
  return block;
}

// alloc_found_block(): when splitting, the caller's part keeps the lower address and the rest
// (the same Block, moved up) stays cached in its state and age.
Sma::Block* Sma::hand_out(Block* block, uint64_t size, uint64_t requested, StreamId stream) {
  // kEvent: another stream's reuse waits on the event(s) recorded where the block was freed.
  if (block->events == Block::Events::kSeveral ||
      (block->events == Block::Events::kOne && block->stream != stream))
    ++event_waits_;
  if (should_split(*block, size)) {
    Block* rest = block;
    block = new Block;
    block->offset = rest->offset;
    block->size = size;
    block->pool = rest->pool;
    block->prev = rest->prev;
    if (block->prev != nullptr) block->prev->next = block;
    block->next = rest;
    rest->prev = block;
    rest->offset += size;
    rest->size -= size;
    insert_cached(rest);
  }
  block->events = Block::Events::kNone;
  block->state = State::kLive;
  block->stream = stream;
  block->requested = requested;
  live_.emplace(base_ + block->offset, block);
  add_stat(stats_.allocated_bytes, stats_.peak_allocated_bytes, block->size);
  stats_.requested_bytes += requested;
  ++stats_.live_blocks;
  return block;
}

// ---- free and the cache ---------------------------------------------------------------------

// Seed §4.3 step 1: the block goes to the FreeList, not the heap, with an event recorded on its
// stream: under kEvent it is ready for any stream (a reuse elsewhere waits on the event), under
// kSync pending on its stream. Under merge kGc it stays as it is (the seed merges at GC, §4.3
// step 2); under kEager it merges now like PyTorch's free_block(), with each neighbour whose
// result is still reusable by this stream (ready, or pending on the same stream); one pending on
// another stream merges at the next synchronize().
Status Sma::free(DevPtr p) {
  auto it = live_.find(p);
  if (it == live_.end())
    return make_error(ErrorCode::kInvalidArgument,
                      "sma: free of a pointer that is not live (unknown, or freed already)");
  Block* block = it->second;
  live_.erase(it);
  stats_.allocated_bytes -= block->size;
  stats_.requested_bytes -= block->requested;
  --stats_.live_blocks;
  block->requested = 0;
  const bool events = config_.cross_stream == SmaConfig::CrossStream::kEvent;
  block->state = events ? State::kReady : State::kPending;
  block->events = events ? Block::Events::kOne : Block::Events::kNone;
  block->age = ++age_clock_;
  if (config_.merge == SmaConfig::Merge::kEager) {
    if (mergeable(block->prev, block->stream)) absorb(block, block->prev);
    if (mergeable(block->next, block->stream)) absorb(block, block->next);
  }
  insert_cached(block);
  return {};
}

bool Sma::mergeable(const Block* neighbour, StreamId stream) const {
  if (neighbour == nullptr || neighbour->state == State::kLive) return false;
  return neighbour->state == State::kReady || neighbour->stream == stream;
}

// try_merge_blocks(): `dst` (out of the sets) absorbs its cached neighbour `src`; the merged
// block is as recent as its most recent part.
void Sma::absorb(Block* dst, Block* src) {
  remove_cached(src);
  if (dst->prev == src) {
    dst->offset = src->offset;
    dst->prev = src->prev;
    if (dst->prev != nullptr) dst->prev->next = dst;
  } else {
    dst->next = src->next;
    if (dst->next != nullptr) dst->next->prev = dst;
  }
  dst->size += src->size;
  dst->age = std::max(dst->age, src->age);
  if (src->events != Block::Events::kNone) {  // a wait on every stream either was freed on
    const bool same = dst->events == Block::Events::kOne && src->events == Block::Events::kOne &&
                      dst->stream == src->stream;
    if (dst->events == Block::Events::kNone) {
      dst->events = src->events;
      dst->stream = src->stream;
    } else if (!same) {
      dst->events = Block::Events::kSeveral;
    }
  }
  delete src;
}

void Sma::insert_cached(Block* block) {
  if (block->state == State::kPending) {
    block->pool->pending.insert(block);
  } else {
    block->pool->ready.insert(block);
  }
  age_.insert(block);
  cached_bytes_ += block->size;
}

// Erases before any keyed field changes (the sets order on them).
void Sma::remove_cached(Block* block) {
  if (block->state == State::kPending) {
    block->pool->pending.erase(block);
  } else {
    block->pool->ready.erase(block);
  }
  age_.erase(block);
  cached_bytes_ -= block->size;
}

// A device-wide sync: every pending block becomes ready and no cached block carries an event
// any more; under merge kEager, runs of cached neighbours left apart by different streams merge.
// O(n log n).
Status Sma::synchronize() {
  ++synchronizations_;
  for (Pool* pool : {&small_, &large_}) {
    for (Block* block : pool->pending) {
      block->state = State::kReady;
      pool->ready.insert(block);
    }
    pool->pending.clear();
  }
  for (Block* block : age_) block->events = Block::Events::kNone;
  if (config_.merge == SmaConfig::Merge::kEager) merge_cached_runs();
  return {};
}

void Sma::merge_cached_runs() {
  // The first block of each run of cached neighbours absorbs the rest (it is never absorbed).
  std::vector<Block*> heads;
  for (Block* block : age_)
    if (block->prev == nullptr || block->prev->state == State::kLive) heads.push_back(block);
  for (Block* head : heads) {
    if (head->next == nullptr || head->next->state == State::kLive) continue;
    remove_cached(head);
    while (head->next != nullptr && head->next->state != State::kLive) absorb(head, head->next);
    insert_cached(head);
  }
}

// Seed §4.3 step 2: MemoryHeap::release of a cached block. Its chunk falls apart there: the
// blocks before and after it become separate heap used ranges.
Status Sma::release_to_heap(Block* block) {
  remove_cached(block);
  if (block->prev != nullptr) block->prev->next = nullptr;
  if (block->next != nullptr) block->next->prev = nullptr;
  Status s = heap_.release(block->offset, block->size);
  delete block;
  if (!s.ok()) return make_error(ErrorCode::kInvalidState, "sma: " + s.error().message);
  return {};
}

// Releases cached blocks, least recently freed first, until the footprint is at most
// `footprint_goal` or the cache is empty (goal 0: every cached block). Callers synchronize. Under
// merge kGc the runs of cached neighbours merge first (seed §4.3 step 2: the GC merges blocks
// with their prev_ / next_ before MemoryHeap::release), each as recent as its newest part.
Status Sma::release_cached(uint64_t footprint_goal) {
  if (config_.merge == SmaConfig::Merge::kGc) merge_cached_runs();
  while (!age_.empty() && (footprint_goal == 0 || footprint() > footprint_goal))
    MEMSIM_TRY(release_to_heap(*age_.begin()));
  return {};
}

// garbage_collection_threshold (seed §3.3, §4.3 step 2: "when memory pressure is high or the
// threshold is reached"). On a cache miss with the GC on and the held memory above threshold *
// heap_size: synchronize (PyTorch's GC frees through cudaFree, which synchronizes), then return
// cached blocks to the heap until the footprint (the heap's used end, rounded to the granularity)
// is at most the limit or none are left; malloc then trims the tail. The seed gives no order:
// least recently freed first (LRU), as PyTorch's GC frees the oldest blocks first. "Held memory"
// is reserved_bytes with kVmm; a device_malloc region never shrinks, so there it is the
// footprint (the GC then only returns cached memory to the heap, to coalesce).
Status Sma::collect_garbage() {
  const double threshold = config_.garbage_collection_threshold;
  if (threshold <= 0) return {};
  const auto limit = static_cast<uint64_t>(threshold * static_cast<double>(heap_size_));
  const uint64_t held = vmm() ? stats_.reserved_bytes : footprint();
  if (held <= limit) return {};
  ++gc_runs_;
  if (footprint() <= limit || age_.empty()) return {};  // trimming the tail is enough
  MEMSIM_TRY(synchronize());
  return release_cached(limit);
}

// ---- the region -----------------------------------------------------------------------------

// Seed §4.1 step 2: the heap's region, made at the first malloc so an unused allocator holds
// nothing. The VA reservation is aligned to base_addr_aligned when that exceeds the granularity.
// Counters move in commit_region(), once the malloc that opened the region has succeeded.
Status Sma::open_region() {
  if (region_open_) return {};
  if (vmm()) {
    MEMSIM_ASSIGN_OR_RETURN(
        base_,
        backend_.reserve_virtual(heap_size_, std::max(granularity_, config_.base_addr_aligned)));
  } else {
    MEMSIM_ASSIGN_OR_RETURN(base_, backend_.device_malloc(heap_size_, kTag));
  }
  region_open_ = true;
  return {};
}

// The device_malloc region is one segment of heap_size bytes (kVmm counts granules instead).
void Sma::commit_region() {
  if (vmm()) return;
  add_stat(stats_.reserved_bytes, stats_.peak_reserved_bytes, heap_size_);
  ++stats_.segments;
  ++stats_.segment_allocs;
}

// Undoes open_region() after a failed first malloc (nothing is mapped: growth rolls itself back).
void Sma::abandon_region() {
  if (!region_open_) return;
  if (vmm()) {
    (void)backend_.free_virtual(base_);
  } else {
    (void)backend_.device_free(base_);
  }
  region_open_ = false;
  base_ = 0;
}

// kVmm: maps granules until heap bytes [0, end) are backed, one handle per granule (so that any
// tail can be given back), mapped one by one and made accessible with one set_access, as
// PyTorch's expandable segments map_and_set_access() does. On failure the granules made here are
// unmapped and released and the error returned; the counters move only on success.
Status Sma::grow_to(uint64_t end) {
  if (!vmm()) return {};
  const uint64_t need = round_up(end, granularity_);
  const uint64_t old = mapped_bytes();
  if (need <= old) return {};
  const size_t first = handles_.size();
  Status s;
  for (uint64_t off = old; off < need && s.ok(); off += granularity_) {
    Result<PhysHandle> h = backend_.create_physical(granularity_, kTag);
    if (!h.ok()) {
      s = h.error();
      break;
    }
    s = backend_.map(base_ + off, granularity_, *h, 0);
    if (s.ok()) {
      handles_.push_back(*h);
    } else {
      (void)backend_.release_physical(*h);
    }
  }
  if (s.ok()) s = backend_.set_access(base_ + old, need - old);
  if (!s.ok()) {
    uint64_t dropped = 0;
    (void)drop_granules(first, false, &dropped);
    return s;
  }
  const auto made = static_cast<uint64_t>(handles_.size() - first);
  add_stat(stats_.reserved_bytes, stats_.peak_reserved_bytes, made * granularity_);
  stats_.segments += made;
  stats_.segment_allocs += made;
  return {};
}

// Unmaps and releases the granules from index `keep` up, last first (PyTorch's unmapHandles
// unmaps handle by handle); *dropped counts those given back. With stop_on_error a failed unmap
// keeps that granule and the ones below it; without, every granule is tried (teardown).
Status Sma::drop_granules(size_t keep, bool stop_on_error, uint64_t* dropped) {
  Status first;
  while (handles_.size() > keep) {
    const uint64_t off = (handles_.size() - 1) * granularity_;
    Status s = backend_.unmap(base_ + off, granularity_);
    if (!s.ok()) {
      if (first.ok()) first = s;
      if (stop_on_error) break;
    }
    Status r = backend_.release_physical(handles_.back());
    if (!r.ok() && first.ok()) first = r;
    handles_.pop_back();
    ++*dropped;
  }
  return first;
}

// Counts granules given back by drop_granules().
void Sma::count_dropped(uint64_t dropped) {
  stats_.reserved_bytes -= dropped * granularity_;
  stats_.segments -= dropped;
  stats_.segment_releases += dropped;
}

// kVmm: gives back the granules above the footprint (the free tail of the heap).
Status Sma::trim() {
  if (!vmm() || !region_open_) return {};
  uint64_t dropped = 0;
  Status s = drop_granules(static_cast<size_t>(footprint() / granularity_), true, &dropped);
  count_dropped(dropped);
  return s;
}

// ---- empty_cache, release_all, observation --------------------------------------------------

// PyTorch's emptyCache(): synchronize, every cached block back to the heap (where it coalesces),
// then give back the unused tail. Live blocks high in the heap keep the granules below them.
Status Sma::empty_cache() {
  MEMSIM_TRY(synchronize());
  MEMSIM_TRY(release_cached(0));
  return trim();
}

// Teardown: every block dropped, every granule and the region given back; the allocator can be
// used again afterwards (the next malloc opens a new region).
Status Sma::release_all() {
  delete_all_blocks();
  heap_ = MemoryHeap(heap_size_);
  Status first;
  if (region_open_) {
    uint64_t dropped = 0;
    Status s = drop_granules(0, false, &dropped);
    count_dropped(dropped);
    if (!s.ok()) first = s;
    if (vmm()) {
      s = backend_.free_virtual(base_);
    } else {
      s = backend_.device_free(base_);
      ++stats_.segment_releases;
    }
    if (!s.ok() && first.ok()) first = s;
  }
  region_open_ = false;
  base_ = 0;
  clear_current(stats_);
  return first;
}

std::vector<LiveBlock> Sma::live_blocks() const {
  std::vector<LiveBlock> out;
  out.reserve(live_.size());
  for (const auto& [ptr, b] : live_) out.push_back(LiveBlock{ptr, b->size, b->requested});
  return by_address(std::move(out));
}

bool Sma::fail(std::string* why, const std::string& msg) const {
  return invariant_broken(why, msg);
}

bool Sma::check_invariants(std::string* why) const {
  std::string heap_why;
  if (!heap_.check_invariants(&heap_why)) return fail(why, "heap: " + heap_why);
  if (heap_.size() != heap_size_) return fail(why, "heap size differs from heap_size");
  // Every block, by offset; a live block in live_ under its address, a cached one in age_ and in
  // exactly the set of its state.
  std::map<uint64_t, const Block*> all;
  uint64_t allocated = 0, requested = 0, cached = 0;
  for (const auto& [ptr, b] : live_) {
    const std::string at = "live block " + std::to_string(ptr) + ": ";
    if (b->state != State::kLive || ptr != base_ + b->offset) return fail(why, at + "bad record");
    if (b->requested == 0 || b->requested > b->size) return fail(why, at + "bad requested");
    if (!all.emplace(b->offset, b).second) return fail(why, at + "listed twice");
    allocated += b->size;
    requested += b->requested;
  }
  uint64_t in_sets = 0;
  for (const Pool* pool : {&small_, &large_}) in_sets += pool->pending.size() + pool->ready.size();
  if (in_sets != age_.size()) return fail(why, "pool sets and the age list differ in size");
  for (const Block* b : age_) {
    const std::string at = "cached block " + std::to_string(b->offset) + ": ";
    if (b->state == State::kLive) return fail(why, at + "marked live");
    const Pool& pool = *b->pool;
    const bool pending = pool.pending.count(b) != 0, ready = pool.ready.count(b) != 0;
    if (pending != (b->state == State::kPending) || ready != (b->state == State::kReady))
      return fail(why, at + "not in the set of its state");
    if (!all.emplace(b->offset, b).second) return fail(why, at + "listed twice");
    cached += b->size;
  }
  // Blocks tile the heap's used ranges: each range is one chain of physical neighbours.
  size_t visited = 0;
  for (const auto& [off, len] : heap_.used_ranges()) {
    const std::string at = "used range " + std::to_string(off) + ": ";
    auto it = all.find(off);
    if (it == all.end() || it->second->prev != nullptr)
      return fail(why, at + "no chain starts here");
    const Block* last = nullptr;
    uint64_t cursor = off;
    for (const Block* b = it->second; b != nullptr; last = b, b = b->next) {
      const std::string bat = at + "block " + std::to_string(b->offset) + ": ";
      if (b->prev != last) return fail(why, bat + "broken prev link");
      if (b->offset != cursor || b->size == 0 || b->size % kMinBlockSize != 0)
        return fail(why, bat + "does not tile the range in 512 B units");
      if (b->pool != it->second->pool) return fail(why, bat + "pool differs within a chunk");
      if (config_.merge == SmaConfig::Merge::kEager && last != nullptr &&
          last->state != State::kLive && b->state != State::kLive &&
          (last->state == State::kReady || b->state == State::kReady || last->stream == b->stream))
        return fail(why, bat + "mergeable cached neighbours left apart");
      if (b->state == State::kPending && b->events != Block::Events::kNone)
        return fail(why, bat + "pending with an event (events are kEvent's)");
      if (b->size > off + len - cursor) return fail(why, bat + "runs past the range");
      cursor += b->size;
      ++visited;
    }
    if (cursor != off + len) return fail(why, at + "blocks do not cover the range");
  }
  if (visited != all.size()) return fail(why, "blocks outside every heap used range");
  if (allocated != stats_.allocated_bytes) return fail(why, "allocated_bytes counter mismatch");
  if (requested != stats_.requested_bytes) return fail(why, "requested_bytes counter mismatch");
  if (live_.size() != stats_.live_blocks) return fail(why, "live_blocks counter mismatch");
  if (cached != cached_bytes_) return fail(why, "cached bytes counter mismatch");
  if (!region_open_ && (!all.empty() || !handles_.empty() || base_ != 0))
    return fail(why, "memory held without a region");
  uint64_t reserved = 0, segments = 0;
  if (vmm()) {
    reserved = mapped_bytes();
    segments = handles_.size();
    if (mapped_bytes() < heap_.used_end()) return fail(why, "used heap bytes are not mapped");
  } else if (region_open_) {
    reserved = heap_size_;
    segments = 1;
    if (!handles_.empty()) return fail(why, "granules mapped in a device_malloc region");
  }
  if (stats_.reserved_bytes != reserved) return fail(why, "reserved_bytes counter mismatch");
  if (stats_.segments != segments) return fail(why, "segments counter mismatch");
  if (stats_.peak_reserved_bytes < reserved || stats_.peak_allocated_bytes < allocated)
    return fail(why, "peak below current");
  if (stats_.segment_allocs != stats_.segment_releases + stats_.segments)
    return fail(why, "segment_allocs != segment_releases + segments");
  return true;
}

}  // namespace memsim
