// static_contiguous implementation: slab reservation at init, slot stack, fork by copy.
#include "src/kv/static_contiguous.h"

#include <fmt/format.h>
#include <algorithm>

namespace memsim {
namespace {

uint64_t round_up(uint64_t v, uint64_t m) {
  return (v + m - 1) / m * m;
}

std::string mib(uint64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / 1048576.0);
}

}  // namespace

Status StaticContiguous::init(Backend& backend, const KvInit& init) {
  if (backend_ != nullptr)
    return make_error(ErrorCode::kInvalidState, "static_contiguous: init called twice");
  if (init.layers == 0 || init.max_num_seqs == 0 || init.max_model_len == 0 ||
      init.kv_bytes_per_token == 0 || init.kv_bytes_per_token % (2ull * init.layers) != 0)
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("static_contiguous: bad KV geometry (layers {}, "
                    "kv_bytes_per_token {}, max_num_seqs {}, max_model_len {})",
                    init.layers, init.kv_bytes_per_token, init.max_num_seqs, init.max_model_len));
  const uint64_t slab = uint64_t{init.max_model_len} * init.kv_bytes_per_token;
  const uint64_t g = std::max<uint64_t>(backend.granularity(), 1);
  uint64_t slots = std::min<uint64_t>(init.max_num_seqs, init.budget_bytes / slab);
  // The backend backs the allocation with whole granules: stay within the budget after rounding.
  while (slots > 0 && round_up(slots * slab, g) > init.budget_bytes) --slots;
  if (slots == 0)
    return make_error(
        ErrorCode::kOutOfMemory,
        fmt::format("static_contiguous: budget {} holds no {} slab ({} tokens x {} "
                    "bytes)",
                    mib(init.budget_bytes), mib(slab), init.max_model_len, init.kv_bytes_per_token),
        round_up(slab, g) - std::min(init.budget_bytes, round_up(slab, g)));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr base, backend.device_malloc(slots * slab, "kv_cache"));
  backend_ = &backend;
  init_ = init;
  segment_bytes_ = slab / (2ull * init.layers);
  slab_bytes_ = slab;
  pool_bytes_ = round_up(slots * slab, g);
  slots_ = static_cast<uint32_t>(slots);
  base_ = base;
  free_slots_.resize(slots_);
  for (uint32_t i = 0; i < slots_; ++i) free_slots_[i] = slots_ - 1 - i;  // slot 0 on top
  owner_.assign(slots_, kNoSeq);
  seqs_.clear();
  tokens_stored_ = 0;
  return {};
}

Status StaticContiguous::shutdown() {
  if (backend_ == nullptr) return {};
  const Status s = backend_->device_free(base_);
  backend_ = nullptr;
  base_ = 0;
  pool_bytes_ = 0;
  slots_ = 0;
  free_slots_.clear();
  owner_.clear();
  seqs_.clear();
  tokens_stored_ = 0;
  return s;
}

uint32_t StaticContiguous::lookup_prefix(const TokenContent& /*content*/) const {
  return 0;
}

Status StaticContiguous::grow(SeqId seq, const TokenContent& content, uint32_t num_tokens,
                              uint32_t prefix_tokens) {
  if (backend_ == nullptr)
    return make_error(ErrorCode::kInvalidState, "static_contiguous: grow before init");
  if (prefix_tokens != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "static_contiguous: no prefix caching (lookup_prefix returns 0)");
  if (num_tokens > content.size())
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("static_contiguous: grow of seq {} to {} tokens exceeds its "
                                  "content ({} tokens)",
                                  seq, num_tokens, content.size()));
  if (num_tokens > init_.max_model_len)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("static_contiguous: grow of seq {} to {} tokens exceeds "
                                  "max_model_len {}",
                                  seq, num_tokens, init_.max_model_len));
  auto it = seqs_.find(seq);
  if (it != seqs_.end()) {
    if (num_tokens < it->second.tokens)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("static_contiguous: grow of seq {} to {} tokens below its "
                                    "length {}",
                                    seq, num_tokens, it->second.tokens));
    tokens_stored_ += num_tokens - it->second.tokens;
    it->second.tokens = num_tokens;
    return {};
  }
  if (free_slots_.empty())
    return make_error(
        ErrorCode::kOutOfMemory,
        fmt::format("static_contiguous: all {} slabs are taken (seq {})", slots_, seq),
        slab_bytes_);
  const uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  owner_[slot] = seq;
  seqs_.emplace(seq, Seq{slot, num_tokens});
  tokens_stored_ += num_tokens;
  return {};
}

Status StaticContiguous::copy_tokens(uint32_t from, uint32_t to, uint32_t tokens) {
  const uint64_t bytes = uint64_t{tokens} * (segment_bytes_ / init_.max_model_len);
  if (bytes == 0) return {};
  for (uint64_t s = 0; s < 2ull * init_.layers; ++s)
    MEMSIM_TRY(backend_->copy(slab_address(to) + s * segment_bytes_,
                              slab_address(from) + s * segment_bytes_, bytes, StreamId{}));
  return {};
}

Status StaticContiguous::fork(SeqId parent, SeqId child) {
  if (backend_ == nullptr)
    return make_error(ErrorCode::kInvalidState, "static_contiguous: fork before init");
  auto pit = seqs_.find(parent);
  if (pit == seqs_.end())
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("static_contiguous: fork of seq {} which is not live", parent));
  if (seqs_.count(child) != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("static_contiguous: fork into seq {} which is live", child));
  if (free_slots_.empty())
    return make_error(ErrorCode::kOutOfMemory,
                      fmt::format("static_contiguous: all {} slabs are taken (fork {} -> {})",
                                  slots_, parent, child),
                      slab_bytes_);
  const Seq p = pit->second;
  const uint32_t slot = free_slots_.back();
  MEMSIM_TRY(copy_tokens(p.slot, slot, p.tokens));
  free_slots_.pop_back();
  owner_[slot] = child;
  seqs_.emplace(child, Seq{slot, p.tokens});
  tokens_stored_ += p.tokens;
  if (p.tokens > 0) {
    cow_copies_ += 1;
    cow_bytes_ += uint64_t{p.tokens} * init_.kv_bytes_per_token;
  }
  return {};
}

void StaticContiguous::release(SeqId seq, const TokenContent& /*content*/) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  tokens_stored_ -= it->second.tokens;
  owner_[it->second.slot] = kNoSeq;
  free_slots_.push_back(it->second.slot);
  seqs_.erase(it);
}

uint32_t StaticContiguous::seq_tokens(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.tokens;
}

uint64_t StaticContiguous::seq_bytes(SeqId seq) const {
  return seqs_.count(seq) != 0 ? slab_bytes_ : 0;
}

uint32_t StaticContiguous::seq_capacity(SeqId seq) const {
  return seqs_.count(seq) != 0 ? init_.max_model_len : 0;
}

uint64_t StaticContiguous::free_token_capacity() const {
  return uint64_t{free_slots_.size()} * init_.max_model_len;
}

KvStats StaticContiguous::stats() const {
  KvStats s;
  if (backend_ == nullptr) {
    s.cow_copies = cow_copies_;
    s.cow_bytes = cow_bytes_;
    return s;
  }
  s.block_tokens = init_.max_model_len;
  s.block_bytes = slab_bytes_;
  s.total_blocks = slots_;
  s.used_blocks = seqs_.size();
  s.free_blocks = free_slots_.size();
  s.slots_allocated = s.used_blocks * init_.max_model_len;
  s.tokens_stored = tokens_stored_;
  s.pool_bytes = pool_bytes_;
  s.cow_copies = cow_copies_;
  s.cow_bytes = cow_bytes_;
  return s;
}

bool StaticContiguous::check_invariants(std::string* why) const {
  auto fail = [why](std::string msg) {
    if (why) *why = "static_contiguous: " + std::move(msg);
    return false;
  };
  if (backend_ == nullptr) {
    if (!seqs_.empty() || !free_slots_.empty() || pool_bytes_ != 0)
      return fail("state left after shutdown");
    return true;
  }
  if (owner_.size() != slots_) return fail("owner table size differs from the slot count");
  if (seqs_.size() + free_slots_.size() != slots_)
    return fail(fmt::format("{} live + {} free slabs != {} slots", seqs_.size(), free_slots_.size(),
                            slots_));
  std::vector<bool> seen(slots_, false);
  for (uint32_t slot : free_slots_) {
    if (slot >= slots_ || seen[slot]) return fail(fmt::format("free slot {} bad or twice", slot));
    if (owner_[slot] != kNoSeq) return fail(fmt::format("free slot {} has an owner", slot));
    seen[slot] = true;
  }
  uint64_t tokens = 0;
  for (const auto& [id, seq] : seqs_) {
    if (seq.slot >= slots_ || seen[seq.slot])
      return fail(fmt::format("seq {} holds slot {} which is free or owned twice", id, seq.slot));
    if (owner_[seq.slot] != id)
      return fail(fmt::format("slot {} owner is not seq {}", seq.slot, id));
    if (seq.tokens > init_.max_model_len)
      return fail(fmt::format("seq {} holds {} tokens > max_model_len", id, seq.tokens));
    seen[seq.slot] = true;
    tokens += seq.tokens;
  }
  if (tokens != tokens_stored_)
    return fail(
        fmt::format("tokens_stored {} != sum of sequence lengths {}", tokens_stored_, tokens));
  return true;
}

KvLayout StaticContiguous::layout() const {
  KvLayout l;
  l.paged = false;
  l.block_tokens = init_.max_model_len;
  l.block_stride = slab_bytes_;
  l.row_bytes = init_.row_bytes();
  l.blocks = slots_;
  for (uint32_t layer = 0; layer < init_.layers; ++layer) {  // segments K0 V0 K1 V1 ...
    l.k.push_back(base_ + 2 * layer * segment_bytes_);
    l.v.push_back(base_ + (2 * layer + 1) * segment_bytes_);
  }
  return l;
}

void StaticContiguous::seq_table(SeqId seq, std::vector<int32_t>* out) const {
  out->clear();
  if (auto it = seqs_.find(seq); it != seqs_.end())
    out->push_back(static_cast<int32_t>(it->second.slot));
}

}  // namespace memsim
