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
  // KV cache groups: a unit is one block of `group_layers_` layers (vLLM's page_size x
  // group_size; every layer when the model has one group).
  groups_ = init.groups;
  if (groups_.empty()) {
    groups_.push_back({0, {}});
    for (uint32_t l = 0; l < init.layers; ++l) groups_[0].layers.push_back(l);
  }
  group_layers_ = kv_group_size(groups_);
  windows_ = any_window(groups_);
  if (group_layers_ == 0 || group_layers_ > init.layers)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("paged_block_pool: groups of {} layers for a model of {}",
                                  group_layers_, init.layers));
  if (config_.per_layer && (groups_.size() > 1 || windows_))
    return make_error(ErrorCode::kInvalidArgument,
                      "paged_block_pool: layout per_layer holds one block table for every layer; "
                      "it cannot hold the KV cache groups of sliding-window layers");
  unit_bytes_ = uint64_t{block_size()} * init.layer_kv_bytes_per_token() * group_layers_;
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

void PagedBlockPool::cache_full_blocks(Seq& s, const TokenContent& content, uint32_t group,
                                       bool publish) {
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
    // copy.) A block release_front or a sliding window freed is only chained through (vLLM's
    // cache_full_blocks skips null blocks). Each group caches under its own key.
    if (const uint32_t u = s.blocks[b]; u != kNone) {
      Block& blk = blocks_[u];
      const bool undecided = b >= s.marked && blk.cached == Cached::kNo;
      if (undecided || blk.cached == Cached::kPending) {
        const uint64_t key = group_key(h, group);
        blk.cached = cache_.insert(key, u) ? Cached::kRegistered : Cached::kNo;
        if (blk.cached == Cached::kRegistered) hashes_[u] = key;
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
  if (groups_.size() > 1 || windows_) return lookup_groups(content);
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
  SeqGroups* live = seqs_.find(seq);
  if (!live) return grow_new(seq, content, num_tokens, prefix_tokens);
  if (prefix_tokens)
    return make_error(ErrorCode::kInvalidArgument, "paged_block_pool: prefix for a live sequence");
  return grow_live(seq, *live, content, num_tokens);
}

// vLLM KVCacheManager.allocate_slots for a new request: the cache hit of every group (a
// sliding-window group's hit starts where the window of the cached tokens starts: the blocks
// before it are null, SingleTypeKVCacheManager.allocate_new_computed_blocks), then
// cdiv(num_tokens, block) - hit blocks new per group, all or nothing (get_num_blocks_to_allocate
// summed over the groups, evictable hits counted).
Status PagedBlockPool::grow_new(SeqId seq, const TokenContent& content, uint32_t num_tokens,
                                uint32_t prefix_tokens) {
  if (prefix_tokens % block_size() || prefix_tokens > num_tokens ||
      (prefix_tokens && !config_.prefix_caching))
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("paged_block_pool: prefix of {} tokens", prefix_tokens));
  const uint32_t prefix_blocks = prefix_tokens / block_size();
  std::vector<uint64_t> chain(prefix_blocks);
  uint64_t h = kRootHash;
  for (uint32_t b = 0; b < prefix_blocks; ++b)
    chain[b] = h = content.chained_hash(h, b * block_size(), (b + 1) * block_size());
  const size_t n_groups = groups_.size();
  std::vector<std::vector<uint32_t>> hits(n_groups);
  std::vector<uint32_t> skipped(n_groups);
  uint64_t evictable_hits = 0;
  for (uint32_t g = 0; g < n_groups; ++g) {
    skipped[g] = skipped_blocks(groups_[g].window, prefix_tokens, prefix_blocks);
    for (uint32_t b = skipped[g]; b < prefix_blocks; ++b) {
      const uint32_t c = cache_.find(group_key(chain[b], g));
      if (c == HashIndex::kNone)
        return make_error(
            ErrorCode::kInvalidArgument,
            "paged_block_pool: the prefix is no longer cached (lookup_prefix and grow "
            "must be called back to back)");
      hits[g].push_back(c);
      evictable_hits += blocks_[c].ref == 0;
    }
  }
  const uint64_t fresh = units_for(num_tokens) - prefix_blocks;  // per group
  MEMSIM_TRY(make_room(fresh * n_groups + evictable_hits));
  // Every group's hits are touched before any allocation, so that none is evicted (vLLM's
  // two-phase allocate_new_computed_blocks).
  for (const auto& group_hits : hits)
    for (uint32_t u : group_hits) add_ref(u);
  SeqGroups made(n_groups);
  for (uint32_t g = 0; g < n_groups; ++g) {
    Seq& s = made[g];
    s.blocks.assign(skipped[g], kNone);
    s.blocks.insert(s.blocks.end(), hits[g].begin(), hits[g].end());
    s.skipped = skipped[g];
    s.hashed = s.marked = prefix_blocks;
    s.last_hash = h;
    for (uint64_t i = 0; i < fresh; ++i) s.blocks.push_back(allocate_unit());
    for (size_t b = prefix_blocks; b < s.blocks.size(); ++b)
      set_filled(s.blocks[b], std::min<uint32_t>(block_size(), num_tokens - b * block_size()));
    s.tokens = num_tokens;
    cache_full_blocks(s, content, g);
  }
  seqs_.insert(seq, std::move(made));
  return {};
}

// A live sequence: the blocks that left a sliding window are freed first, as vLLM's
// allocate_slots does with the tokens computed so far (this grow's sequence length: the engine
// grows a sequence with windows every step), even when the allocation then fails; then each
// group gets its new blocks (after a copy-on-write of a shared partial last block).
Status PagedBlockPool::grow_live(SeqId seq, SeqGroups& live, const TokenContent& content,
                                 uint32_t num_tokens) {
  const uint32_t tokens = live[0].tokens;
  if (num_tokens < tokens)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("paged_block_pool: sequence {} holds {} tokens, grow to {}", seq,
                                  tokens, num_tokens));
  if (num_tokens == tokens && live[0].gap == 0) return {};
  if (windows_) remove_skipped(live, tokens);
  uint64_t need = 0;
  std::vector<bool> cow(live.size());
  for (size_t g = 0; g < live.size(); ++g) {
    const Seq& s = live[g];
    cow[g] = tokens % block_size() && blocks_[s.blocks.back()].ref > 1;
    need += units_for(num_tokens) - s.blocks.size() + (cow[g] ? 1 : 0) + s.gap;
  }
  MEMSIM_TRY(make_room(need));
  for (size_t g = 0; g < live.size(); ++g) {
    Seq& s = live[g];
    for (uint32_t b = 0; b < s.gap; ++b) {  // blocks release_front freed come back first, full
      s.blocks[b] = allocate_unit();
      set_filled(s.blocks[b], block_size());
    }
    s.gap = 0;
    if (cow[g]) {  // the shared partial last block is about to be written: copy it first
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
    const size_t first = tokens / block_size();  // first block that receives new tokens
    while (s.blocks.size() < units_for(num_tokens)) s.blocks.push_back(allocate_unit());
    for (size_t b = first; b < s.blocks.size(); ++b)
      set_filled(s.blocks[b], std::min<uint32_t>(block_size(), num_tokens - b * block_size()));
    s.tokens = num_tokens;
    cache_full_blocks(s, content, static_cast<uint32_t>(g));
  }
  return {};
}

Status PagedBlockPool::fork(SeqId parent, SeqId child) {
  const SeqGroups* p = seqs_.find(parent);
  if (!p || (*p)[0].gap || seqs_.contains(child))
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("paged_block_pool: fork {} -> {}", parent, child));
  SeqGroups c = *p;
  if (config_.copy_on_write) {
    for (const Seq& s : c)
      for (uint32_t u : s.blocks)
        if (u != kNone) add_ref(u);  // a sliding window's null blocks stay null
  } else {                           // no sharing: the child gets its own copy of every block now
    uint64_t held = 0;
    for (const Seq& s : c) held += s.blocks.size() - s.skipped;
    MEMSIM_TRY(make_room(held));
    for (Seq& s : c)
      for (uint32_t& u : s.blocks) {
        if (u == kNone) continue;
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
  SeqGroups* live = seqs_.find(seq);
  if (!live) return;
  // vLLM frees a request's blocks group by group, each tail first, so its last blocks are
  // evicted first.
  for (uint32_t g = 0; g < live->size(); ++g) {
    Seq& s = (*live)[g];
    cache_full_blocks(s, content, g);
    for (auto b = s.blocks.rbegin(); b != s.blocks.rend(); ++b)
      if (*b != kNone) drop_ref(*b);
  }
  seqs_.erase(seq);
}

uint32_t PagedBlockPool::release_front(SeqId seq, uint64_t bytes, uint32_t max_tokens) {
  SeqGroups* live = seqs_.find(seq);
  if (!live || windows_ || (*live)[0].blocks.empty()) return 0;
  Seq& s = (*live)[0];
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
  const SeqGroups* s = seqs_.find(seq);
  return s ? (*s)[0].gap * block_size() : 0;
}

void PagedBlockPool::publish(SeqId seq, const TokenContent& content) {
  SeqGroups* live = seqs_.find(seq);
  if (!live) return;
  for (uint32_t g = 0; g < live->size(); ++g) {
    Seq& s = (*live)[g];
    // `content` covers the sequence's tokens (the contract)
    if (s.hashed != s.marked) cache_full_blocks(s, content, g, true);
  }
}

uint32_t PagedBlockPool::seq_tokens(SeqId seq) const {
  const SeqGroups* s = seqs_.find(seq);
  return s ? (*s)[0].tokens : 0;
}

uint64_t PagedBlockPool::seq_bytes(SeqId seq) const {
  const SeqGroups* live = seqs_.find(seq);
  if (!live) return 0;
  uint64_t held = 0;
  for (const Seq& s : *live) held += s.blocks.size() - s.gap - s.skipped;
  return held * unit_bytes_;
}

uint32_t PagedBlockPool::seq_capacity(SeqId seq) const {
  const SeqGroups* live = seqs_.find(seq);
  if (!live) return 0;
  const Seq& s = (*live)[0];
  if (s.gap) return 0;  // the next grow allocates the freed front blocks again
  // No slack with sliding windows: vLLM frees the blocks that left a window at every step's
  // allocate_slots, so every step's growth reaches grow with the tokens computed so far.
  if (windows_) return s.tokens;
  // A shared partial last block must be copied before it is written.
  if (s.tokens % block_size() && blocks_[s.blocks.back()].ref > 1) return s.tokens;
  return static_cast<uint32_t>(
      std::min<uint64_t>(s.blocks.size() * block_size(), init_.max_model_len));
}

uint64_t PagedBlockPool::free_token_capacity() const {
  // A growing pool's headroom too. With several groups a token takes a slot in each: vLLM's
  // "GPU KV cache size" is num_blocks // groups x block_size (kv_cache_utils).
  return (queued_ + cap_units_ - blocks_.size()) / groups_.size() * block_size();
}

std::vector<uint32_t> PagedBlockPool::layer_table(SeqId seq, uint32_t layer) const {
  std::vector<uint32_t> out = block_table(seq);
  for (uint32_t& b : out)
    if (b != kNone) b += config_.per_layer ? layer : 0;
  return out;
}

std::vector<uint32_t> PagedBlockPool::group_table(SeqId seq, uint32_t group) const {
  const SeqGroups* s = seqs_.find(seq);
  return s && group < s->size() ? (*s)[group].blocks : std::vector<uint32_t>{};
}

std::vector<uint32_t> PagedBlockPool::block_table(SeqId seq) const {
  const SeqGroups* s = seqs_.find(seq);
  if (!s) return {};
  std::vector<uint32_t> out;
  for (uint32_t u : (*s)[0].blocks)
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
  // One table per KV cache group (vLLM's MultiGroupBlockTable).
  s.metadata_bytes =
      uint64_t{init_.max_num_seqs} * units_for(init_.max_model_len) * 4 * ppu * groups_.size();
  s.host_table_bytes = s.metadata_bytes;
  s.free_list_bytes = s.total_blocks * 4;
  s.cow_copies = cow_copies_ * ppu;
  s.cow_bytes = cow_copies_ * unit_bytes_;
  s.evicted_blocks = evicted_ * ppu;
  return s;
}

bool PagedBlockPool::check_group(SeqId id, const Seq& s, uint32_t group,
                                 std::vector<uint32_t>& refs, std::string* why) const {
  auto fail = [&](std::string msg) {
    if (why) *why = fmt::format("paged_block_pool: group {}: {}", group, msg);
    return false;
  };
  const size_t n = blocks_.size();
  if (s.blocks.size() != units_for(s.tokens))
    return fail(fmt::format("seq {} has {} blocks for {} tokens", id, s.blocks.size(), s.tokens));
  if (s.gap && s.gap >= s.blocks.size())
    return fail(fmt::format("seq {} misses {} of its {} blocks", id, s.gap, s.blocks.size()));
  // A window frees only blocks wholly before the window of the tokens it holds, never its last.
  const uint32_t window = groups_[group].window;
  if (s.skipped > skipped_blocks(window, s.tokens, s.blocks.size()) ||
      (s.skipped && s.skipped >= s.blocks.size()))
    return fail(fmt::format("seq {} skipped {} of its {} blocks at {} tokens (window {})", id,
                            s.skipped, s.blocks.size(), s.tokens, window));
  const uint32_t missing = std::max(s.gap, s.skipped);
  for (size_t b = 0; b < s.blocks.size(); ++b) {
    const uint32_t u = s.blocks[b];
    if ((b < missing) != (u == kNone))
      return fail(fmt::format("seq {} block {}: {} with a front gap of {}", id, b, u, missing));
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
}

bool PagedBlockPool::check_invariants(std::string* why) const {
  auto fail = [&](std::string msg) {
    if (why) *why = "paged_block_pool: " + std::move(msg);
    return false;
  };
  const size_t n = blocks_.size();
  std::vector<uint32_t> refs(n, 0);
  if (config_.null_block && n) refs[0] = 1;
  const bool seqs_ok = seqs_.all([&](SeqId id, const SeqGroups& live) {
    if (live.size() != groups_.size())
      return fail(
          fmt::format("seq {} has {} tables for {} groups", id, live.size(), groups_.size()));
    for (uint32_t g = 0; g < live.size(); ++g)
      if (!check_group(id, live[g], g, refs, why)) return false;
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
  if (!config_.per_layer && groups_.size() > 1) {
    // KV cache groups: a unit holds group_layers_ layers; layer i of whichever group owns the
    // block sits at slot i (vLLM: tensor i is shared by layer i of every group), read through
    // its group's table (group_table; seq_table gives group 0's).
    KvInit slots = init_;
    slots.layers = group_layers_;
    slots.kv_bytes_per_token = init_.layer_kv_bytes_per_token() * group_layers_;
    const KvLayout unit = block_major_layout(k, slots, block_size(), unit_bytes_, cap_units_);
    KvLayout l = unit;
    l.k.assign(init_.layers, 0);
    l.v.assign(init_.layers, 0);
    l.layer_group.assign(init_.layers, 0);
    for (uint32_t g = 0; g < groups_.size(); ++g)
      for (size_t i = 0; i < groups_[g].layers.size(); ++i) {
        const uint32_t layer = groups_[g].layers[i];
        l.k[layer] = unit.k[i];
        l.v[layer] = unit.v[i];
        l.layer_group[layer] = g;
      }
    for (const KvCacheGroup& g : groups_) l.group_window.push_back(g.window);
    return l;
  }
  if (!config_.per_layer) {  // one group (a sliding one: every layer of the model windowed)
    KvLayout l = block_major_layout(k, init_, block_size(), unit_bytes_, cap_units_);
    if (windows_) l.group_window = {groups_[0].window};
    return l;
  }
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
  if (const SeqGroups* s = seqs_.find(seq))
    for (uint32_t u : (*s)[0].blocks) out->push_back(u == kNone ? -1 : static_cast<int32_t>(u));
}

void PagedBlockPool::seq_group_table(SeqId seq, uint32_t group, std::vector<int32_t>* out) const {
  out->clear();
  if (const SeqGroups* s = seqs_.find(seq); s && group < s->size())
    for (uint32_t u : (*s)[group].blocks) out->push_back(u == kNone ? -1 : static_cast<int32_t>(u));
}

}  // namespace memsim
