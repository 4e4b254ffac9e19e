// paged_block_pool: block pool, free queue, prefix cache and copy-on-write (vLLM V1 BlockPool +
// KVCacheManager, vLLM V0 block manager fork/CoW, OrinMLLM PagedKVCacheManager layout).
#include "src/kv/paged_block_pool.h"

#include <fmt/format.h>
#include <algorithm>

namespace memsim {
namespace {

constexpr uint64_t kRootHash = 0x6d656d73696d6b76ull;  // parent hash of a sequence's first block

}  // namespace

Status PagedBlockPool::init(Backend& backend, const KvInit& init) {
  if (backend_) return make_error(ErrorCode::kInvalidState, "paged_block_pool: init called twice");
  if (init.layers == 0 || init.kv_bytes_per_token == 0)
    return make_error(ErrorCode::kInvalidArgument, "paged_block_pool: empty model geometry");
  init_ = init;
  unit_bytes_ = uint64_t{block_size()} * init.kv_bytes_per_token;
  uint64_t units = init.budget_bytes / unit_bytes_;
  if (config_.num_blocks_override) {
    if (config_.num_blocks_override % physical_per_unit())
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("paged_block_pool: num_blocks_override {} is not a multiple of "
                                    "the {} layers of the per_layer layout",
                                    config_.num_blocks_override, init.layers));
    units = config_.num_blocks_override / physical_per_unit();
  }
  const uint64_t reserved = config_.null_block ? 1 : 0;
  if (units < reserved + 1 || units >= kNone)
    return make_error(
        ErrorCode::kOutOfMemory,
        fmt::format("paged_block_pool: a budget of {} bytes holds {} blocks of {} bytes",
                    init.budget_bytes, units, unit_bytes_),
        (reserved + 1 - std::min(units, reserved + 1)) * unit_bytes_);
  uint64_t first = units;  // units mapped at init
  if (grows()) {
    for (const uint64_t b : {config_.initial_blocks, config_.grow_blocks})
      if (b % physical_per_unit())
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("paged_block_pool: initial_blocks and grow_blocks ({}, {}) "
                                      "must be multiples of the {} layers of the per_layer layout",
                                      config_.initial_blocks, config_.grow_blocks, init.layers));
    first = config_.initial_blocks / physical_per_unit();
    if (first < reserved + 1 || first > units)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("paged_block_pool: initial_blocks {} is not between {} and the "
                                    "{} blocks the pool may grow to",
                                    config_.initial_blocks, (reserved + 1) * physical_per_unit(),
                                    units * physical_per_unit()));
  }
  // The pools: one, or the seed's key pool and value pool (per_layer), each of `units` parts.
  const uint64_t g = backend.granularity();
  const uint64_t part = units * part_bytes();
  pools_.clear();
  for (uint32_t i = 0; i < pool_count(); ++i) {
    Result<DevPtr> p = grows() ? backend.reserve_virtual((part + g - 1) / g * g, g)
                               : backend.device_malloc(part, "kv_cache");
    if (!p.ok()) {
      for (const DevPtr q : pools_)
        (void)(grows() ? backend.free_virtual(q) : backend.device_free(q));
      pools_.clear();
      return p.error();
    }
    pools_.push_back(*p);
  }
  backend_ = &backend;
  cap_units_ = units;
  blocks_.clear();
  hashes_.assign(units, 0);
  cache_.reset(units);
  head_ = tail_ = kNone;
  queued_ = cached_ = used_ = stored_ = cow_copies_ = evicted_ = growths_ = mapped_bytes_ = 0;
  if (const Status mapped = map_units(first); !mapped.ok()) {
    for (const DevPtr q : pools_) (void)backend.free_virtual(q);
    pools_.clear();
    backend_ = nullptr;
    return mapped;
  }
  if (config_.null_block) {  // vLLM: the null block is the first one popped, never freed
    config_.lifo_free_list ? queue_pop_back() : queue_pop_front();
    blocks_[0].ref = 1;
    ++used_;
  }
  return {};
}

Status PagedBlockPool::map_units(uint64_t units) {
  const uint64_t old = blocks_.size();
  if (grows()) {
    const uint64_t g = backend_->granularity();
    const uint64_t want = (units * part_bytes() + g - 1) / g * g;
    if (want > mapped_bytes_) {
      // Every pool grows by the same bytes, all or none.
      const uint64_t bytes = want - mapped_bytes_;
      std::vector<PhysHandle> made;
      Status st;
      for (const DevPtr base : pools_) {
        Result<PhysHandle> h = backend_->create_physical(bytes, "kv_cache");
        if (!h.ok()) {
          st = h.error();
          break;
        }
        st = backend_->map(base + mapped_bytes_, bytes, *h, 0);
        if (st.ok()) {
          st = backend_->set_access(base + mapped_bytes_, bytes);
          if (!st.ok()) (void)backend_->unmap(base + mapped_bytes_, bytes);
        }
        if (!st.ok()) {
          (void)backend_->release_physical(*h);
          break;
        }
        made.push_back(*h);
      }
      if (!st.ok()) {
        for (size_t i = 0; i < made.size(); ++i) {
          (void)backend_->unmap(pools_[i] + mapped_bytes_, bytes);
          (void)backend_->release_physical(made[i]);
        }
        return st;
      }
      chunks_.insert(chunks_.end(), made.begin(), made.end());
      mapped_bytes_ = want;
    }
  }
  blocks_.resize(units);
  // LIFO pops from the back: queue the blocks in reverse so that the lowest ids come first (the
  // seed's std::iota over the stack's reverse iterators: 0, 1, 2, ... on a fresh pool).
  for (uint64_t u = old; u < units; ++u)
    queue_push_back(static_cast<uint32_t>(config_.lifo_free_list ? units - 1 - (u - old) : u));
  return {};
}

Status PagedBlockPool::make_room(uint64_t need) {
  if (need <= queued_) return {};
  const uint64_t headroom = cap_units_ - blocks_.size();  // 0 unless the pool grows
  if (need > queued_ + headroom)
    return make_error(ErrorCode::kOutOfMemory, "paged_block_pool: out of free blocks",
                      (need - queued_ - headroom) * unit_bytes_);
  const uint64_t step = std::max<uint64_t>(1, config_.grow_blocks / physical_per_unit());
  while (queued_ < need) {
    MEMSIM_TRY(map_units(std::min<uint64_t>(cap_units_, blocks_.size() + step)));
    ++growths_;
  }
  return {};
}

Status PagedBlockPool::shutdown() {
  if (!backend_) return {};
  seqs_.clear();
  cache_.reset(0);
  Status s;
  auto keep = [&s](Status st) {
    if (s.ok() && !st.ok()) s = std::move(st);
  };
  if (grows()) {
    if (mapped_bytes_)
      for (const DevPtr base : pools_) keep(backend_->unmap(base, mapped_bytes_));
    for (const PhysHandle h : chunks_) keep(backend_->release_physical(h));
    for (const DevPtr base : pools_) keep(backend_->free_virtual(base));
    chunks_.clear();
    mapped_bytes_ = 0;
  } else {
    for (const DevPtr base : pools_) keep(backend_->device_free(base));
  }
  backend_ = nullptr;
  pools_.clear();
  blocks_.clear();
  hashes_.clear();
  head_ = tail_ = kNone;
  queued_ = cached_ = used_ = stored_ = 0;
  return s;
}

void PagedBlockPool::queue_push_back(uint32_t b) {
  Block& blk = blocks_[b];
  blk.prev = tail_;
  blk.next = kNone;
  if (tail_ != kNone)
    blocks_[tail_].next = b;
  else
    head_ = b;
  tail_ = b;
  blk.in_queue = true;
  ++queued_;
  if (holds_cache(blk)) ++cached_;
}

void PagedBlockPool::queue_remove(uint32_t b) {
  Block& blk = blocks_[b];
  if (blk.prev != kNone)
    blocks_[blk.prev].next = blk.next;
  else
    head_ = blk.next;
  if (blk.next != kNone)
    blocks_[blk.next].prev = blk.prev;
  else
    tail_ = blk.prev;
  blk.prev = blk.next = kNone;
  blk.in_queue = false;
  --queued_;
  if (holds_cache(blk)) --cached_;
}

uint32_t PagedBlockPool::queue_pop_front() {
  const uint32_t b = head_;
  queue_remove(b);
  return b;
}

uint32_t PagedBlockPool::queue_pop_back() {
  const uint32_t b = tail_;
  queue_remove(b);
  return b;
}

uint32_t PagedBlockPool::allocate_unit() {
  const uint32_t u = config_.lifo_free_list ? queue_pop_back() : queue_pop_front();
  Block& blk = blocks_[u];
  if (holds_cache(blk)) {  // evict the LRU cached block (vLLM _maybe_evict_cached_block)
    if (blk.cached == Cached::kRegistered) cache_.erase(hashes_[u], u);
    blk.cached = Cached::kNo;
    ++evicted_;
  }
  blk.ref = 1;
  blk.filled = 0;
  ++used_;
  return u;
}

void PagedBlockPool::add_ref(uint32_t b) {
  Block& blk = blocks_[b];
  if (blk.ref == 0) {
    queue_remove(b);
    ++used_;
    stored_ += blk.filled;
  }
  ++blk.ref;
}

void PagedBlockPool::drop_ref(uint32_t b) {
  Block& blk = blocks_[b];
  if (--blk.ref > 0) return;
  --used_;
  stored_ -= blk.filled;
  if (!holds_cache(blk)) blk.filled = 0;  // a cached block keeps its (full) contents for reuse
  queue_push_back(b);
}

void PagedBlockPool::set_filled(uint32_t b, uint32_t filled) {
  Block& blk = blocks_[b];
  if (blk.ref > 0) stored_ = stored_ - blk.filled + filled;
  blk.filled = static_cast<uint16_t>(filled);
}

Status PagedBlockPool::copy_unit(uint32_t dst, uint32_t src) {
  ++cow_copies_;
  for (const DevPtr base : pools_)  // per_layer: the key pool's part, then the value pool's
    MEMSIM_TRY(backend_->copy(base + dst * part_bytes(), base + src * part_bytes(), part_bytes(),
                              StreamId{}));
  return {};
}

void PagedBlockPool::cache_full_blocks(Seq& s, const TokenContent& content, bool publish) {
  if (!config_.prefix_caching) return;
  const uint32_t full = s.tokens / block_size();
  // Blocks ending at or before the private part are hashed now (a shared content's all are,
  // pending ones included); the rest wait, pending, until the content is published. Only with
  // copy-on-write: a copying fork puts private content into the child's own blocks, and a
  // published child could then look up the parent's blocks after the parent's release.
  const bool defer =
      !publish && config_.copy_on_write && content.private_from() != TokenContent::kShared;
  const uint32_t shared = defer ? std::min(full, content.private_from() / block_size()) : full;
  while (s.hashed < shared) {
    const uint32_t b = s.hashed;
    const uint64_t h = content.chained_hash(s.hashed ? s.last_hash : kRootHash, b * block_size(),
                                            (b + 1) * block_size());
    // A block whose content is already cached elsewhere stays a private duplicate. A pending
    // one was deferred when it filled; its insert cannot fail, as no other block can hold
    // private content. (A block below `marked` that is neither was a duplicate then: a fork's
    // copy.) A block release_front freed is only chained through.
    if (const uint32_t u = s.blocks[b]; u != kNone) {
      Block& blk = blocks_[u];
      const bool undecided = b >= s.marked && blk.cached == Cached::kNo;
      if (undecided || blk.cached == Cached::kPending) {
        blk.cached = cache_.insert(h, u) ? Cached::kRegistered : Cached::kNo;
        if (blk.cached == Cached::kRegistered) hashes_[u] = h;
      }
    }
    s.last_hash = h;
    ++s.hashed;
  }
  for (s.marked = std::max(s.marked, s.hashed); s.marked < full; ++s.marked) {
    if (s.blocks[s.marked] == kNone) continue;
    Block& blk = blocks_[s.blocks[s.marked]];
    if (blk.cached == Cached::kNo) blk.cached = Cached::kPending;
  }
}

uint32_t PagedBlockPool::lookup_prefix(const TokenContent& content) const {
  if (!config_.prefix_caching || content.size() < 2) return 0;
  const uint32_t max_blocks = (content.size() - 1) / block_size();
  uint64_t h = kRootHash;
  uint32_t hits = 0;
  for (; hits < max_blocks; ++hits) {
    h = content.chained_hash(h, hits * block_size(), (hits + 1) * block_size());
    if (cache_.find(h) == HashIndex::kNone) break;
  }
  return hits * block_size();
}

Status PagedBlockPool::grow(SeqId seq, const TokenContent& content, uint32_t num_tokens,
                            uint32_t prefix_tokens) {
  if (!backend_) return make_error(ErrorCode::kInvalidState, "paged_block_pool: not initialized");
  if (num_tokens > content.size() || num_tokens > init_.max_model_len)
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("paged_block_pool: grow to {} tokens (content {}, max_model_len {})",
                    num_tokens, content.size(), init_.max_model_len));
  Seq* live = seqs_.find(seq);
  if (!live) {
    if (prefix_tokens % block_size() || prefix_tokens > num_tokens ||
        (prefix_tokens && !config_.prefix_caching))
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("paged_block_pool: prefix of {} tokens", prefix_tokens));
    std::vector<uint32_t> hits;
    uint64_t h = kRootHash;
    for (uint32_t b = 0; b < prefix_tokens / block_size(); ++b) {
      h = content.chained_hash(h, b * block_size(), (b + 1) * block_size());
      const uint32_t c = cache_.find(h);
      if (c == HashIndex::kNone)
        return make_error(
            ErrorCode::kInvalidArgument,
            "paged_block_pool: the prefix is no longer cached (lookup_prefix and grow "
            "must be called back to back)");
      hits.push_back(c);
    }
    uint64_t evictable_hits = 0;
    for (uint32_t u : hits) evictable_hits += blocks_[u].ref == 0;
    const uint64_t need = units_for(num_tokens) - hits.size();
    MEMSIM_TRY(make_room(need + evictable_hits));
    Seq s;
    for (uint32_t u : hits) add_ref(u);  // touch before allocating so hits are never evicted
    s.blocks = std::move(hits);
    s.hashed = s.marked = static_cast<uint32_t>(s.blocks.size());
    s.last_hash = h;
    for (uint64_t i = 0; i < need; ++i) s.blocks.push_back(allocate_unit());
    for (size_t b = s.hashed; b < s.blocks.size(); ++b)
      set_filled(s.blocks[b], std::min<uint32_t>(block_size(), num_tokens - b * block_size()));
    s.tokens = num_tokens;
    cache_full_blocks(s, content);
    seqs_.insert(seq, std::move(s));
    return {};
  }
  Seq& s = *live;
  if (prefix_tokens)
    return make_error(ErrorCode::kInvalidArgument, "paged_block_pool: prefix for a live sequence");
  if (num_tokens < s.tokens)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("paged_block_pool: sequence {} holds {} tokens, grow to {}", seq,
                                  s.tokens, num_tokens));
  if (num_tokens == s.tokens && s.gap == 0) return {};
  const bool cow = s.tokens % block_size() && blocks_[s.blocks.back()].ref > 1;
  const uint64_t need = units_for(num_tokens) - s.blocks.size() + (cow ? 1 : 0) + s.gap;
  MEMSIM_TRY(make_room(need));
  for (uint32_t b = 0; b < s.gap; ++b) {  // blocks release_front freed come back first, full
    s.blocks[b] = allocate_unit();
    set_filled(s.blocks[b], block_size());
  }
  s.gap = 0;
  if (cow) {  // the shared partial last block is about to be written: copy it first
    const uint32_t old = s.blocks.back();
    const uint32_t fresh = allocate_unit();
    set_filled(fresh, blocks_[old].filled);
    const Status copied = copy_unit(fresh, old);
    if (!copied.ok()) {
      drop_ref(fresh);
      return copied;
    }
    drop_ref(old);
    s.blocks.back() = fresh;
  }
  const size_t first = s.tokens / block_size();  // first block that receives new tokens
  while (s.blocks.size() < units_for(num_tokens)) s.blocks.push_back(allocate_unit());
  for (size_t b = first; b < s.blocks.size(); ++b)
    set_filled(s.blocks[b], std::min<uint32_t>(block_size(), num_tokens - b * block_size()));
  s.tokens = num_tokens;
  cache_full_blocks(s, content);
  return {};
}

Status PagedBlockPool::fork(SeqId parent, SeqId child) {
  const Seq* p = seqs_.find(parent);
  if (!p || p->gap || seqs_.contains(child))
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("paged_block_pool: fork {} -> {}", parent, child));
  Seq c = *p;
  if (config_.copy_on_write) {
    for (uint32_t u : c.blocks) add_ref(u);
  } else {  // no sharing: the child gets its own copy of every block now
    MEMSIM_TRY(make_room(c.blocks.size()));
    for (uint32_t& u : c.blocks) {
      const uint32_t src = u;
      u = allocate_unit();
      set_filled(u, blocks_[src].filled);
      MEMSIM_TRY(copy_unit(u, src));
    }
  }
  seqs_.insert(child, std::move(c));
  return {};
}

void PagedBlockPool::release(SeqId seq, const TokenContent& content) {
  Seq* s = seqs_.find(seq);
  if (!s) return;
  cache_full_blocks(*s, content);
  // vLLM frees a request's blocks tail first, so its last blocks are evicted first.
  for (auto b = s->blocks.rbegin(); b != s->blocks.rend(); ++b)
    if (*b != kNone) drop_ref(*b);
  seqs_.erase(seq);
}

uint32_t PagedBlockPool::release_front(SeqId seq, uint64_t bytes, uint32_t max_tokens) {
  Seq* live = seqs_.find(seq);
  if (!live || live->blocks.empty()) return 0;
  Seq& s = *live;
  const uint64_t last = s.blocks.size() - 1;  // the block being written stays
  const uint32_t most = max_tokens / block_size();
  uint64_t freed = 0;
  while (s.gap < last && s.gap < most && freed < bytes) {
    const uint32_t u = s.blocks[s.gap];
    if (blocks_[u].ref == 1) freed += unit_bytes_;
    drop_ref(u);
    s.blocks[s.gap++] = kNone;
  }
  return s.gap * block_size();
}

uint32_t PagedBlockPool::front_gap(SeqId seq) const {
  const Seq* s = seqs_.find(seq);
  return s ? s->gap * block_size() : 0;
}

void PagedBlockPool::publish(SeqId seq, const TokenContent& content) {
  Seq* s = seqs_.find(seq);
  if (!s || s->hashed == s->marked) return;
  cache_full_blocks(*s, content, true);  // `content` covers the sequence's tokens (the contract)
}

uint32_t PagedBlockPool::seq_tokens(SeqId seq) const {
  const Seq* s = seqs_.find(seq);
  return s ? s->tokens : 0;
}

uint64_t PagedBlockPool::seq_bytes(SeqId seq) const {
  const Seq* s = seqs_.find(seq);
  return s ? (s->blocks.size() - s->gap) * unit_bytes_ : 0;
}

uint32_t PagedBlockPool::seq_capacity(SeqId seq) const {
  const Seq* live = seqs_.find(seq);
  if (!live) return 0;
  const Seq& s = *live;
  if (s.gap) return 0;  // the next grow allocates the freed front blocks again
  // A shared partial last block must be copied before it is written.
  if (s.tokens % block_size() && blocks_[s.blocks.back()].ref > 1) return s.tokens;
  return static_cast<uint32_t>(
      std::min<uint64_t>(s.blocks.size() * block_size(), init_.max_model_len));
}

uint64_t PagedBlockPool::free_token_capacity() const {
  return (queued_ + cap_units_ - blocks_.size()) * block_size();  // a growing pool's headroom too
}

std::vector<uint32_t> PagedBlockPool::layer_table(SeqId seq, uint32_t layer) const {
  std::vector<uint32_t> out = block_table(seq);
  for (uint32_t& b : out)
    if (b != kNone) b += config_.per_layer ? layer : 0;
  return out;
}

std::vector<uint32_t> PagedBlockPool::block_table(SeqId seq) const {
  const Seq* s = seqs_.find(seq);
  if (!s) return {};
  std::vector<uint32_t> out;
  for (uint32_t u : s->blocks)
    out.push_back(u == kNone ? kNone : static_cast<uint32_t>(u * physical_per_unit()));
  return out;
}

KvStats PagedBlockPool::stats() const {
  const uint64_t ppu = physical_per_unit();
  const uint64_t null = config_.null_block && !blocks_.empty() ? 1 : 0;
  KvStats s;
  s.block_tokens = block_size();
  s.block_bytes = unit_bytes_ / ppu;
  s.total_blocks = blocks_.size() * ppu;
  s.used_blocks = used_ * ppu;
  s.cached_blocks = cached_ * ppu;
  s.free_blocks = (queued_ - cached_) * ppu;
  s.slots_allocated = (used_ - null) * block_size();
  s.tokens_stored = stored_;
  s.pool_bytes = grows() ? mapped_bytes_ * pools_.size() : blocks_.size() * unit_bytes_;
  s.pool_growths = growths_;
  s.max_blocks = cap_units_ * ppu;
  // Tables of int32 [max_num_seqs, layers (per_layer) x max blocks per sequence]: one on the
  // device for the kernels, its copy on the host where they are built (the seed's
  // block_table_cpu_, 16.7); the free list holds one int32 per physical block (free_list_).
  s.metadata_bytes = uint64_t{init_.max_num_seqs} * units_for(init_.max_model_len) * 4 * ppu;
  s.host_table_bytes = s.metadata_bytes;
  s.free_list_bytes = s.total_blocks * 4;
  s.cow_copies = cow_copies_ * ppu;
  s.cow_bytes = cow_copies_ * unit_bytes_;
  s.evicted_blocks = evicted_ * ppu;
  return s;
}

bool PagedBlockPool::check_invariants(std::string* why) const {
  auto fail = [&](std::string msg) {
    if (why) *why = "paged_block_pool: " + std::move(msg);
    return false;
  };
  const size_t n = blocks_.size();
  std::vector<uint32_t> refs(n, 0);
  if (config_.null_block && n) refs[0] = 1;
  const bool seqs_ok = seqs_.all([&](SeqId id, const Seq& s) {
    if (s.blocks.size() != units_for(s.tokens))
      return fail(fmt::format("seq {} has {} blocks for {} tokens", id, s.blocks.size(), s.tokens));
    if (s.gap && s.gap >= s.blocks.size())
      return fail(fmt::format("seq {} misses {} of its {} blocks", id, s.gap, s.blocks.size()));
    for (size_t b = 0; b < s.blocks.size(); ++b) {
      const uint32_t u = s.blocks[b];
      if ((b < s.gap) != (u == kNone))
        return fail(fmt::format("seq {} block {}: {} with a front gap of {}", id, b, u, s.gap));
      if (u == kNone) continue;
      if (u >= n || (config_.null_block && u == 0))
        return fail(fmt::format("seq {} holds invalid block {}", id, u));
      ++refs[u];
      const uint32_t want = std::min<uint32_t>(block_size(), s.tokens - b * block_size());
      if (blocks_[u].filled != want)
        return fail(fmt::format("block {} holds {} tokens, seq {} expects {}", u, blocks_[u].filled,
                                id, want));
    }
    return true;
  });
  if (!seqs_ok) return false;
  uint64_t used = 0, cached = 0, stored = 0;
  for (uint32_t u = 0; u < n; ++u) {
    const Block& b = blocks_[u];
    if (b.ref != refs[u])
      return fail(fmt::format("block {} refcount {} but {} owners", u, b.ref, refs[u]));
    if ((b.ref == 0) != b.in_queue)
      return fail(fmt::format("block {} ref {} in_queue {}", u, b.ref, b.in_queue));
    if (b.ref) {
      ++used;
      stored += b.filled;
    } else if (holds_cache(b)) {
      ++cached;
    }
    if (holds_cache(b) && b.filled != block_size())
      return fail(fmt::format("cached block {} is not full", u));
    if (b.cached == Cached::kRegistered && cache_.find(hashes_[u]) != u)
      return fail(fmt::format("block {} hash not registered to it", u));
  }
  bool entries_ok = true;
  uint64_t entries = 0;
  cache_.for_each([&](uint64_t h, uint32_t u) {
    ++entries;
    if (u >= n || blocks_[u].cached != Cached::kRegistered || hashes_[u] != h) entries_ok = false;
  });
  if (!entries_ok || entries != cache_.size()) return fail("a prefix-cache entry is stale");
  uint64_t walked = 0;
  uint32_t prev = kNone;
  for (uint32_t u = head_; u != kNone; u = blocks_[u].next) {
    if (blocks_[u].prev != prev || !blocks_[u].in_queue || ++walked > n)
      return fail("free queue links are broken");
    prev = u;
  }
  if (prev != tail_) return fail("free queue tail is wrong");
  if (walked != queued_ || used != used_ || cached != cached_ || stored != stored_ ||
      used_ + queued_ != n)
    return fail(fmt::format("counters: queue {} / {}, used {} / {}, cached {} / {}, stored {} / {}",
                            walked, queued_, used, used_, cached, cached_, stored, stored_));
  return true;
}

KvLayout PagedBlockPool::layout() const {
  // A unit is one logical block: every layer's K and V of block_size tokens (per_layer: the
  // unit's `layers` physical blocks, one per layer, in the same order).
  // A growing pool's addresses are reserved for its cap from init on.
  const DevPtr k = pools_.empty() ? 0 : pools_[0];
  if (!config_.per_layer)
    return block_major_layout(k, init_, block_size(), unit_bytes_, cap_units_);
  // The seed's pools [physical blocks, block_size, kv_dim]: layer l of a unit is physical block
  // unit x layers + l, so layer l's rows start l physical blocks in and a table entry (the
  // unit) steps over a unit's `layers` blocks.
  KvLayout l;
  l.paged = true;
  l.block_tokens = block_size();
  l.row_bytes = init_.row_bytes();
  l.block_stride = part_bytes();
  l.blocks = cap_units_;
  const DevPtr v = pools_.size() > 1 ? pools_[1] : 0;
  const uint64_t physical = uint64_t{block_size()} * l.row_bytes;
  for (uint32_t layer = 0; layer < init_.layers; ++layer) {
    l.k.push_back(k + layer * physical);
    l.v.push_back(v + layer * physical);
  }
  return l;
}

void PagedBlockPool::seq_table(SeqId seq, std::vector<int32_t>* out) const {
  out->clear();
  if (const Seq* s = seqs_.find(seq))
    for (uint32_t u : s->blocks) out->push_back(u == kNone ? -1 : static_cast<int32_t>(u));
}

}  // namespace memsim
