// static_contiguous: one max_model_len KV slab per sequence, all slabs allocated up front in one
// device allocation (FasterTransformer / Orca reservation, OrinMLLM's contiguous KV cache).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "src/kv/kv_cache_manager.h"

namespace memsim {

struct StaticContiguousConfig {};  // no parameters: the slab is max_model_len tokens

// Slots = min(max_num_seqs, budget / slab) with slab = max_model_len x kv_bytes_per_token; one
// device_malloc (tag "kv_cache") holds them all from init to shutdown. Slab layout: 2 x layers
// segments (K and V of each layer) of max_model_len x per-layer K bytes per token each.
// A sequence takes a free slab at its first grow and holds it whole until release; fork copies
// the parent's written tokens into a new slab (one Backend::copy per segment). No prefix sharing.
// All operations are O(1) (hash map + free-slot stack); check_invariants is O(slots).
class StaticContiguous final : public KvCacheManager {
 public:
  explicit StaticContiguous(const StaticContiguousConfig& config) : config_(config) {}
  ~StaticContiguous() override = default;

  std::string_view name() const override { return "static_contiguous"; }
  Status init(Backend& backend, const KvInit& init) override;
  Status shutdown() override;

  uint32_t lookup_prefix(const TokenContent& content) const override;
  Status grow(SeqId seq, const TokenContent& content, uint32_t num_tokens,
              uint32_t prefix_tokens) override;
  Status fork(SeqId parent, SeqId child) override;
  void release(SeqId seq, const TokenContent& content) override;

  uint32_t seq_tokens(SeqId seq) const override;
  uint64_t seq_bytes(SeqId seq) const override;
  uint32_t seq_capacity(SeqId seq) const override;  // the whole slab: max_model_len
  uint64_t free_token_capacity() const override;

  KvLayout layout() const override;
  void seq_table(SeqId seq, std::vector<int32_t>* out) const override;
  KvStats stats() const override;
  bool check_invariants(std::string* why) const override;

  uint64_t slab_bytes() const { return slab_bytes_; }
  uint32_t slots() const { return slots_; }
  DevPtr slab_address(uint32_t slot) const { return base_ + uint64_t{slot} * slab_bytes_; }

 private:
  static constexpr uint64_t kNoSeq = UINT64_MAX;
  struct Seq {
    uint32_t slot;
    uint32_t tokens;
  };

  // Copies `tokens` tokens of every K/V segment of slab `from` into slab `to`.
  Status copy_tokens(uint32_t from, uint32_t to, uint32_t tokens);

  StaticContiguousConfig config_;
  Backend* backend_ = nullptr;
  KvInit init_;
  uint64_t segment_bytes_ = 0;  // max_model_len x per-layer K bytes per token
  uint64_t slab_bytes_ = 0;     // 2 x layers segments = max_model_len x kv_bytes_per_token
  uint64_t pool_bytes_ = 0;     // what the backend accounts for the allocation
  uint32_t slots_ = 0;
  DevPtr base_ = 0;
  std::vector<uint32_t> free_slots_;  // stack; top = back
  std::vector<uint64_t> owner_;       // slot -> SeqId (kNoSeq when free); for invariants
  std::unordered_map<SeqId, Seq> seqs_;
  uint64_t tokens_stored_ = 0;
  uint64_t cow_copies_ = 0;
  uint64_t cow_bytes_ = 0;
};

}  // namespace memsim
