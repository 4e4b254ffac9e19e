// vmm_contiguous implementation: VA reservation per K/V tensor, page groups mapped on demand,
// eager or deferred reclamation, fork by copy.
#include "src/kv/vmm_contiguous.h"

#include <fmt/format.h>
#include <algorithm>

namespace memsim {
namespace {

std::string mib(uint64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / 1048576.0);
}

}  // namespace

// ---- geometry -------------------------------------------------------------------------------

uint32_t VmmContiguous::groups_for(uint32_t tokens) const {
  return static_cast<uint32_t>((uint64_t{tokens} * k_bytes_ + page_ - 1) / page_);
}

uint64_t VmmContiguous::tokens_in(uint64_t groups) const {
  return std::min<uint64_t>(init_.max_model_len, groups * page_ / k_bytes_);
}

DevPtr VmmContiguous::page_va(uint32_t b, uint32_t slot, uint32_t group) const {
  return bases_[b] + uint64_t{slot} * stride_ + uint64_t{group} * page_;
}

Status VmmContiguous::init(Backend& backend, const KvInit& init) {
  if (backend_ != nullptr)
    return make_error(ErrorCode::kInvalidState, "vmm_contiguous: init called twice");
  if (init.layers == 0 || init.max_num_seqs == 0 || init.max_model_len == 0 ||
      init.kv_bytes_per_token == 0 || init.kv_bytes_per_token % (2ull * init.layers) != 0)
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("vmm_contiguous: bad KV geometry (layers {}, "
                    "kv_bytes_per_token {}, max_num_seqs {}, max_model_len {})",
                    init.layers, init.kv_bytes_per_token, init.max_num_seqs, init.max_model_len));
  const uint64_t g = backend.granularity();
  const uint64_t page = config_.page_size ? config_.page_size : g;
  if (g == 0 || page % g != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("vmm_contiguous: page_size {} bytes is not a multiple of the "
                                  "backend's VMM granularity ({} bytes); vAttention's 64/128/256 "
                                  "KiB pages need its modified NVIDIA driver",
                                  page, g));
  const uint64_t k = init.kv_bytes_per_token / (2ull * init.layers);
  if (k > page)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("vmm_contiguous: one token's K of one layer ({} bytes) exceeds "
                                  "the page size ({} bytes)",
                                  k, page));
  const uint64_t stride = (uint64_t{init.max_model_len} * k + page - 1) / page * page;
  const uint64_t per_slot = stride / page;
  const uint64_t group_bytes = 2ull * init.layers * page;
  const uint64_t total =
      std::min<uint64_t>(init.budget_bytes / group_bytes, uint64_t{init.max_num_seqs} * per_slot);
  if (total == 0)
    return make_error(ErrorCode::kOutOfMemory,
                      fmt::format("vmm_contiguous: budget {} holds no page group ({} = 2 x {} "
                                  "layers x {} pages)",
                                  mib(init.budget_bytes), mib(group_bytes), init.layers, mib(page)),
                      group_bytes - init.budget_bytes);

  std::vector<DevPtr> bases;
  bases.reserve(2ull * init.layers);
  // Aligned to the largest power of two dividing the page (the page itself for the usual 2 MiB
  // or 64-256 KiB pages): every page then starts on a granularity boundary, as cuMemMap needs.
  const uint64_t align = page & (~page + 1);
  for (uint32_t b = 0; b < 2 * init.layers; ++b) {
    auto va = backend.reserve_virtual(uint64_t{init.max_num_seqs} * stride, align);
    if (!va.ok()) {
      for (DevPtr p : bases) (void)backend.free_virtual(p);
      return va.error();
    }
    bases.push_back(*va);
  }
  std::vector<PhysHandle> pages;
  if (config_.reserved_physical) {  // vAttention's reserve_physical_pages: the whole budget now
    pages.reserve(total * 2ull * init.layers);
    for (uint64_t i = 0; i < total * 2ull * init.layers; ++i) {
      auto h = backend.create_physical(page, "kv_cache");
      if (!h.ok()) {
        for (PhysHandle p : pages) (void)backend.release_physical(p);
        for (DevPtr p : bases) (void)backend.free_virtual(p);
        return h.error();
      }
      pages.push_back(*h);
    }
  }
  backend_ = &backend;
  init_ = init;
  free_pages_ = std::move(pages);
  k_bytes_ = k;
  page_ = page;
  stride_ = stride;
  groups_per_slot_ = static_cast<uint32_t>(per_slot);
  total_groups_ = total;
  bases_ = std::move(bases);
  slots_.assign(init.max_num_seqs, Slot{});
  empty_free_.resize(init.max_num_seqs);
  for (uint32_t i = 0; i < init.max_num_seqs; ++i) empty_free_[i] = init.max_num_seqs - 1 - i;
  deferred_ = List{};
  excess_ = List{};
  seqs_.clear();
  free_groups_ = total;
  used_groups_ = cached_groups_ = slots_allocated_ = tokens_stored_ = 0;
  return {};
}

Status VmmContiguous::shutdown() {
  if (backend_ == nullptr) return {};
  Status first;
  for (uint32_t s = 0; s < slots_.size(); ++s) {
    const Status st = unmap_groups(s, slots_[s].mapped);
    if (!st.ok() && first.ok()) first = st;
  }
  for (PhysHandle h : free_pages_) {
    const Status st = backend_->release_physical(h);
    if (!st.ok() && first.ok()) first = st;
  }
  free_pages_.clear();
  for (DevPtr p : bases_) {
    const Status st = backend_->free_virtual(p);
    if (!st.ok() && first.ok()) first = st;
  }
  backend_ = nullptr;
  bases_.clear();
  slots_.clear();
  empty_free_.clear();
  deferred_ = List{};
  excess_ = List{};
  seqs_.clear();
  total_groups_ = free_groups_ = used_groups_ = cached_groups_ = 0;
  slots_allocated_ = tokens_stored_ = 0;
  return first;
}

// ---- slot lists -----------------------------------------------------------------------------

void VmmContiguous::list_push(List& l, uint32_t slot) {
  Slot& s = slots_[slot];
  s.prev = l.tail;
  s.next = kNil;
  if (l.tail != kNil)
    slots_[l.tail].next = slot;
  else
    l.head = slot;
  l.tail = slot;
  s.listed = true;
  ++l.size;
}

void VmmContiguous::list_remove(List& l, uint32_t slot) {
  Slot& s = slots_[slot];
  if (s.prev != kNil)
    slots_[s.prev].next = s.next;
  else
    l.head = s.next;
  if (s.next != kNil)
    slots_[s.next].prev = s.prev;
  else
    l.tail = s.prev;
  s.prev = s.next = kNil;
  s.listed = false;
  --l.size;
}

uint32_t VmmContiguous::peek_free_slot() const {
  if (deferred_.tail != kNil) return deferred_.tail;
  return empty_free_.empty() ? kNil : empty_free_.back();
}

void VmmContiguous::acquire(uint32_t slot) {
  Slot& s = slots_[slot];
  if (s.where == Where::kDeferredFree) {
    list_remove(deferred_, slot);
  } else {  // peek_free_slot hands out the top of the stack
    empty_free_.pop_back();
  }
  s.where = Where::kLive;
  s.needed = 0;
  if (s.mapped > 0) list_push(excess_, slot);
}

void VmmContiguous::make_free(uint32_t slot) {
  Slot& s = slots_[slot];
  if (s.listed) list_remove(excess_, slot);
  s.needed = 0;
  if (s.mapped > 0) {
    s.where = Where::kDeferredFree;
    list_push(deferred_, slot);
  } else {
    s.where = Where::kEmptyFree;
    empty_free_.push_back(slot);
  }
}

void VmmContiguous::detach(uint32_t slot) {
  Slot& s = slots_[slot];
  if (s.listed) list_remove(excess_, slot);
  cached_groups_ -= s.mapped - s.needed;
  used_groups_ -= s.needed;
  slots_allocated_ -= tokens_in(s.needed);
}

void VmmContiguous::attach(uint32_t slot) {
  Slot& s = slots_[slot];
  cached_groups_ += s.mapped - s.needed;
  used_groups_ += s.needed;
  slots_allocated_ += tokens_in(s.needed);
  if (s.mapped > s.needed) list_push(excess_, slot);
}

// ---- mapping --------------------------------------------------------------------------------

Status VmmContiguous::map_group(uint32_t slot) {
  Slot& s = slots_[slot];
  const uint32_t group = s.mapped;
  Status failed;
  uint32_t done = 0;  // pages fully created, mapped and accessible
  for (; done < buffers(); ++done) {
    auto h = take_page();
    if (!h.ok()) {
      failed = h.error();
      break;
    }
    const DevPtr va = page_va(done, slot, group);
    Status st = backend_->map(va, page_, *h, 0);
    if (st.ok()) {
      st = backend_->set_access(va, page_);
      if (!st.ok()) (void)backend_->unmap(va, page_);
    }
    if (!st.ok()) {
      (void)give_page(*h);
      failed = st;
      break;
    }
    s.pages.push_back(*h);
  }
  if (done == buffers()) {
    ++s.mapped;
    --free_groups_;
    return {};
  }
  while (done-- > 0) {  // roll back this group's pages, last first
    (void)backend_->unmap(page_va(done, slot, group), page_);
    (void)give_page(s.pages.back());
    s.pages.pop_back();
  }
  return failed;
}

Result<PhysHandle> VmmContiguous::take_page() {
  if (!config_.reserved_physical) return backend_->create_physical(page_, "kv_cache");
  if (free_pages_.empty())  // free groups always have their pages: a broken invariant
    return make_error(ErrorCode::kInvalidState, "vmm_contiguous: reserved page list is empty");
  const PhysHandle h = free_pages_.back();
  free_pages_.pop_back();
  return h;
}

Status VmmContiguous::give_page(PhysHandle h) {
  if (!config_.reserved_physical) return backend_->release_physical(h);
  free_pages_.push_back(h);
  return {};
}

Status VmmContiguous::unmap_groups(uint32_t slot, uint32_t count) {
  // One unmap per tensor over the groups' contiguous range, then one release per page.
  Slot& s = slots_[slot];
  if (count == 0) return {};
  const uint32_t first_group = s.mapped - count;
  Status first;
  auto keep = [&first](const Status& st) {
    if (!st.ok() && first.ok()) first = st;
  };
  for (uint32_t b = 0; b < buffers(); ++b)
    keep(backend_->unmap(page_va(b, slot, first_group), uint64_t{count} * page_));
  for (size_t i = uint64_t{first_group} * buffers(); i < s.pages.size(); ++i)
    keep(give_page(s.pages[i]));
  s.pages.resize(uint64_t{first_group} * buffers());
  s.mapped = first_group;
  free_groups_ += count;
  return first;
}

Status VmmContiguous::drop_cached(uint32_t slot, uint32_t count) {
  Slot& v = slots_[slot];
  const Status st = unmap_groups(slot, count);
  cached_groups_ -= count;
  if (v.where == Where::kDeferredFree && v.mapped == 0) {
    list_remove(deferred_, slot);
    v.where = Where::kEmptyFree;
    empty_free_.push_back(slot);
  } else if (v.where == Where::kLive && v.mapped == v.needed) {
    list_remove(excess_, slot);
  }
  return st;
}

Status VmmContiguous::reclaim(uint64_t groups) {
  Status first;
  while (groups > 0) {
    const uint32_t victim = deferred_.head != kNil ? deferred_.head : excess_.head;
    if (victim == kNil) break;  // callers check availability first
    const Slot& v = slots_[victim];
    const auto take = static_cast<uint32_t>(std::min<uint64_t>(groups, v.mapped - v.needed));
    const Status st = drop_cached(victim, take);
    if (!st.ok() && first.ok()) first = st;
    groups -= take;
    evicted_groups_ += take;
  }
  return first;
}

Status VmmContiguous::extend(uint32_t slot, uint32_t target) {
  Slot& s = slots_[slot];
  const uint32_t old_needed = s.needed, old_mapped = s.mapped;
  const uint64_t new_maps = target > old_mapped ? target - old_mapped : 0;
  const uint64_t own_cached = old_mapped - old_needed;
  if (new_maps > free_groups_ + (cached_groups_ - own_cached))
    return make_error(
        ErrorCode::kOutOfMemory,
        fmt::format("vmm_contiguous: {} more page group(s) of {} needed, {} free "
                    "and {} reclaimable of {}",
                    new_maps, mib(2ull * init_.layers * page_), free_groups_,
                    cached_groups_ - own_cached, total_groups_),
        (new_maps - free_groups_ - (cached_groups_ - own_cached)) * 2ull * init_.layers * page_);
  detach(slot);  // also keeps reclaim away from this slot's own pages
  Status st;
  if (new_maps > free_groups_) st = reclaim(new_maps - free_groups_);
  for (uint64_t i = 0; st.ok() && i < new_maps; ++i) st = map_group(slot);
  if (!st.ok()) {
    (void)unmap_groups(slot, s.mapped - old_mapped);
    s.needed = old_needed;
    attach(slot);
    return st;
  }
  s.needed = target;
  attach(slot);
  return {};
}

void VmmContiguous::shrink(uint32_t slot, uint32_t mapped, uint32_t needed) {
  Slot& s = slots_[slot];
  detach(slot);
  (void)unmap_groups(slot, s.mapped - mapped);
  s.needed = needed;
  attach(slot);
}

Status VmmContiguous::map_ahead(uint32_t slot, uint32_t mapped) {
  Slot& s = slots_[slot];
  if (s.mapped >= mapped) return {};
  const uint64_t n = mapped - s.mapped;
  const uint64_t own_cached = s.mapped - s.needed;
  if (n > free_groups_ + (cached_groups_ - own_cached))
    return make_error(ErrorCode::kOutOfMemory, "vmm_contiguous: no group to map ahead");
  detach(slot);  // keeps reclaim away from this slot's own pages
  Status st;
  if (n > free_groups_) st = reclaim(n - free_groups_);
  for (uint64_t i = 0; st.ok() && i < n; ++i) st = map_group(slot);
  attach(slot);
  return st;
}

void VmmContiguous::background_step(const std::vector<SeqLength>& after_step) {
  if (backend_ == nullptr) return;
  // The live slots the step's sequences occupy, with their lengths.
  struct Live {
    uint32_t slot, tokens;
  };
  std::vector<Live> live;
  live.reserve(after_step.size());
  uint64_t required = 0;
  for (const SeqLength& q : after_step) {
    auto it = seqs_.find(q.seq);
    if (it == seqs_.end()) continue;
    const uint32_t slot = it->second.slot;
    const uint32_t mapped = slots_[slot].mapped;
    // Only a sequence within eager_steps of its mapped end can need a group in this call.
    if (tokens_in(mapped) >= init_.max_model_len ||
        uint64_t{q.tokens} + config_.eager_steps - 1 <= tokens_in(mapped))
      continue;
    live.push_back({slot, q.tokens});
    const uint32_t next = groups_for(std::min(q.tokens + 1, init_.max_model_len));
    if (next > mapped) required += next - mapped;
  }
  // The next step's groups, all or nothing (vAttention returns when they are not available).
  uint64_t reclaimable = cached_groups_;
  for (const Live& l : live) reclaimable -= slots_[l.slot].mapped - slots_[l.slot].needed;
  if (required > free_groups_ + reclaimable) return;
  uint64_t mapped_now = 0;
  for (uint32_t k = 1; k < config_.eager_steps; ++k) {
    for (const Live& l : live) {
      const uint32_t target = groups_for(std::min(l.tokens + k, init_.max_model_len));
      if (target <= slots_[l.slot].mapped) continue;
      mapped_now += target - slots_[l.slot].mapped;
      if (!map_ahead(l.slot, target).ok()) return;  // the foreground maps what is missing
      if (k > 1 && mapped_now >= config_.eager_groups) return;
    }
  }
  // Doing too much in one step delays it: reclaim only when nothing was needed (vAttention's
  // do_reclaim_pages: with eager reclamation, one group per step of a free slot other than the
  // one the next request gets, which is deferred_.tail here).
  if (required == 0 && !config_.deferred_reclaim && deferred_.head != deferred_.tail)
    (void)drop_cached(deferred_.head, 1);
}

// ---- requests -------------------------------------------------------------------------------

uint32_t VmmContiguous::lookup_prefix(const TokenContent& /*content*/) const {
  return 0;
}

Status VmmContiguous::validate_grow(SeqId seq, const TokenContent& content, uint32_t num_tokens,
                                    uint32_t prefix_tokens) const {
  if (backend_ == nullptr)
    return make_error(ErrorCode::kInvalidState, "vmm_contiguous: grow before init");
  if (prefix_tokens != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "vmm_contiguous: no prefix caching (lookup_prefix returns 0)");
  if (num_tokens > content.size())
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("vmm_contiguous: grow of seq {} to {} tokens exceeds its "
                                  "content ({} tokens)",
                                  seq, num_tokens, content.size()));
  if (num_tokens > init_.max_model_len)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("vmm_contiguous: grow of seq {} to {} tokens exceeds "
                                  "max_model_len {}",
                                  seq, num_tokens, init_.max_model_len));
  return {};
}

Status VmmContiguous::grow(SeqId seq, const TokenContent& content, uint32_t num_tokens,
                           uint32_t prefix_tokens) {
  MEMSIM_TRY(validate_grow(seq, content, num_tokens, prefix_tokens));
  const uint32_t target = groups_for(num_tokens);
  auto it = seqs_.find(seq);
  if (it != seqs_.end()) {
    Seq& q = it->second;
    if (num_tokens < q.tokens)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("vmm_contiguous: grow of seq {} to {} tokens below its "
                                    "length {}",
                                    seq, num_tokens, q.tokens));
    // Within its groups (seq_capacity) only the counters change: extend would re-file the slot
    // in the excess list and so change which slot a later reclaim picks.
    if (target != slots_[q.slot].needed) MEMSIM_TRY(extend(q.slot, target));
    tokens_stored_ += num_tokens - q.tokens;
    q.tokens = num_tokens;
    return {};
  }
  const uint32_t slot = peek_free_slot();
  if (slot == kNil)
    return make_error(
        ErrorCode::kOutOfMemory,
        fmt::format("vmm_contiguous: all {} request slots are taken (seq {})", slots_.size(), seq));
  acquire(slot);
  const Status st = extend(slot, target);
  if (!st.ok()) {
    make_free(slot);
    return st;
  }
  seqs_.emplace(seq, Seq{slot, num_tokens});
  tokens_stored_ += num_tokens;
  return {};
}

Status VmmContiguous::fork(SeqId parent, SeqId child) {
  if (backend_ == nullptr)
    return make_error(ErrorCode::kInvalidState, "vmm_contiguous: fork before init");
  auto pit = seqs_.find(parent);
  if (pit == seqs_.end())
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("vmm_contiguous: fork of seq {} which is not live", parent));
  if (seqs_.count(child) != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("vmm_contiguous: fork into seq {} which is live", child));
  const Seq p = pit->second;
  const uint32_t slot = peek_free_slot();
  if (slot == kNil)
    return make_error(ErrorCode::kOutOfMemory,
                      fmt::format("vmm_contiguous: all {} request slots are taken (fork {} -> {})",
                                  slots_.size(), parent, child));
  const uint32_t target = slots_[p.slot].needed;
  const uint32_t old_mapped = slots_[slot].mapped;
  acquire(slot);
  Status st = extend(slot, target);
  if (!st.ok()) {
    make_free(slot);
    return st;
  }
  // The parent's written bytes of each K/V tensor, one copy per tensor.
  const uint64_t bytes = uint64_t{p.tokens} * k_bytes_;
  for (uint32_t b = 0; st.ok() && bytes > 0 && b < buffers(); ++b)
    st = backend_->copy(page_va(b, slot, 0), page_va(b, p.slot, 0), bytes, StreamId{});
  if (!st.ok()) {
    shrink(slot, std::min(old_mapped, slots_[slot].mapped), 0);
    make_free(slot);
    return st;
  }
  seqs_.emplace(child, Seq{slot, p.tokens});
  tokens_stored_ += p.tokens;
  cow_copies_ += target;
  cow_bytes_ += uint64_t{p.tokens} * init_.kv_bytes_per_token;
  return {};
}

void VmmContiguous::release(SeqId seq, const TokenContent& /*content*/) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  const uint32_t slot = it->second.slot;
  tokens_stored_ -= it->second.tokens;
  seqs_.erase(it);
  // Sync eager: unmap every page now. Deferred, or async (vAttention's free_batch_idx only
  // clears the length; its background thread unmaps): the pages stay mapped (cached) in the slot.
  const bool keep = config_.deferred_reclaim || config_.async;
  shrink(slot, keep ? slots_[slot].mapped : 0, 0);
  make_free(slot);
}

uint32_t VmmContiguous::seq_tokens(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.tokens;
}

uint64_t VmmContiguous::seq_bytes(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  return uint64_t{slots_[it->second.slot].needed} * 2ull * init_.layers * page_;
}

int64_t VmmContiguous::seq_mapped_groups(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? -1 : int64_t{slots_[it->second.slot].mapped};
}

uint32_t VmmContiguous::seq_capacity(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : static_cast<uint32_t>(tokens_in(slots_[it->second.slot].needed));
}

uint64_t VmmContiguous::free_token_capacity() const {
  if (backend_ == nullptr) return 0;
  // Every free and reclaimable group, spread over the free slots (each capped at max_model_len).
  const uint64_t free_slots = empty_free_.size() + deferred_.size;
  const uint64_t avail = free_groups_ + cached_groups_;
  const uint64_t full = std::min<uint64_t>(free_slots, avail / groups_per_slot_);
  uint64_t tokens = full * init_.max_model_len;
  if (full < free_slots) tokens += tokens_in(avail - full * groups_per_slot_);
  return tokens;
}

KvStats VmmContiguous::stats() const {
  KvStats s;
  s.cow_copies = cow_copies_;
  s.cow_bytes = cow_bytes_;
  s.evicted_blocks = evicted_groups_;
  if (backend_ == nullptr) return s;
  s.block_tokens = page_ / k_bytes_;
  s.block_bytes = 2ull * init_.layers * page_;
  s.total_blocks = total_groups_;
  s.used_blocks = used_groups_;
  s.cached_blocks = cached_groups_;
  s.free_blocks = free_groups_;
  s.slots_allocated = slots_allocated_;
  s.tokens_stored = tokens_stored_;
  s.pool_bytes =
      (config_.reserved_physical ? total_groups_ : used_groups_ + cached_groups_) * s.block_bytes;
  return s;
}

bool VmmContiguous::check_invariants(std::string* why) const {
  auto fail = [why](std::string msg) {
    if (why) *why = "vmm_contiguous: " + std::move(msg);
    return false;
  };
  if (backend_ == nullptr) {
    if (!slots_.empty() || !seqs_.empty() || !free_pages_.empty() || free_groups_ != 0 ||
        cached_groups_ != 0)
      return fail("state left after shutdown");
    return true;
  }
  uint64_t mapped = 0, used = 0, cached = 0, alloc = 0, live = 0, deferred = 0, excess = 0;
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.pages.size() != uint64_t{s.mapped} * buffers())
      return fail(fmt::format("slot {}: {} pages for {} groups", i, s.pages.size(), s.mapped));
    if (s.mapped > groups_per_slot_) return fail(fmt::format("slot {} overflows its range", i));
    if (s.mapped < s.needed) return fail(fmt::format("slot {} needs unmapped groups", i));
    if (s.where != Where::kLive && s.needed != 0)
      return fail(fmt::format("free slot {} needs groups", i));
    if (!config_.deferred_reclaim && !config_.async && s.mapped != s.needed)
      return fail(fmt::format("slot {}: eager reclaim left {} unneeded group(s) mapped", i,
                              s.mapped - s.needed));
    const bool should_list =
        s.where == Where::kDeferredFree || (s.where == Where::kLive && s.mapped > s.needed);
    if (s.listed != should_list) return fail(fmt::format("slot {}: list membership wrong", i));
    if ((s.where == Where::kDeferredFree) != (s.where != Where::kLive && s.mapped > 0))
      return fail(fmt::format("free slot {} filed under the wrong structure", i));
    mapped += s.mapped;
    cached += s.mapped - s.needed;
    if (s.where == Where::kLive) {
      ++live;
      used += s.needed;
      alloc += tokens_in(s.needed);
      excess += s.listed;
    } else if (s.where == Where::kDeferredFree) {
      ++deferred;
    }
  }
  if (mapped + free_groups_ != total_groups_)
    return fail(
        fmt::format("{} mapped + {} free groups != {} total", mapped, free_groups_, total_groups_));
  if (config_.reserved_physical && free_pages_.size() != free_groups_ * buffers())
    return fail(
        fmt::format("{} reserved pages free for {} free groups", free_pages_.size(), free_groups_));
  if (!config_.reserved_physical && !free_pages_.empty())
    return fail("pages listed free though pages are created on demand");
  if (used != used_groups_ || cached != cached_groups_ || alloc != slots_allocated_)
    return fail("group counters differ from the slots");
  if (deferred != deferred_.size || excess != excess_.size)
    return fail("list sizes differ from the slots");
  if (live != seqs_.size() || live + deferred + empty_free_.size() != slots_.size())
    return fail("slots not conserved (live + deferred + empty != max_num_seqs)");
  std::vector<bool> seen(slots_.size(), false);
  for (uint32_t e : empty_free_) {
    if (e >= slots_.size() || seen[e] || slots_[e].where != Where::kEmptyFree)
      return fail(fmt::format("empty-slot stack holds slot {} wrongly", e));
    seen[e] = true;
  }
  uint64_t tokens = 0;
  for (const auto& [id, q] : seqs_) {
    if (q.slot >= slots_.size() || seen[q.slot] || slots_[q.slot].where != Where::kLive)
      return fail(fmt::format("seq {} holds slot {} which is free or owned twice", id, q.slot));
    seen[q.slot] = true;
    if (q.tokens > init_.max_model_len) return fail(fmt::format("seq {} too long", id));
    if (slots_[q.slot].needed != groups_for(q.tokens))
      return fail(fmt::format("seq {}: {} groups needed for {} tokens, {} recorded", id,
                              groups_for(q.tokens), q.tokens, slots_[q.slot].needed));
    tokens += q.tokens;
  }
  if (tokens != tokens_stored_) return fail("tokens_stored differs from the sequences");
  for (const List* l : {&deferred_, &excess_}) {  // walk both lists: sizes and links agree
    uint64_t n = 0;
    uint32_t prev = kNil;
    for (uint32_t c = l->head; c != kNil; c = slots_[c].next) {
      if (c >= slots_.size() || slots_[c].prev != prev || ++n > slots_.size())
        return fail("a slot list is corrupt");
      prev = c;
    }
    if (n != l->size || prev != l->tail) return fail("a slot list's size or tail is wrong");
  }
  return true;
}

KvLayout VmmContiguous::layout() const {
  KvLayout l;
  l.paged = false;
  l.row_bytes = init_.row_bytes();
  // Tokens a slot's stride holds; 0 when the page-rounded stride is not a whole number of rows
  // (KV writes number rows per slot, so the GPU engine rejects such a geometry).
  l.block_tokens = stride_ % l.row_bytes == 0 ? static_cast<uint32_t>(stride_ / l.row_bytes) : 0;
  l.block_stride = stride_;
  l.blocks = slots_.size();
  for (uint32_t layer = 0; layer < init_.layers; ++layer) {
    l.k.push_back(bases_[2 * layer]);
    l.v.push_back(bases_[2 * layer + 1]);
  }
  return l;
}

void VmmContiguous::seq_table(SeqId seq, std::vector<int32_t>* out) const {
  out->clear();
  if (auto it = seqs_.find(seq); it != seqs_.end())
    out->push_back(static_cast<int32_t>(it->second.slot));
}

}  // namespace memsim
