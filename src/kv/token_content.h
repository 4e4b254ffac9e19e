// Token ids of a sequence as runs of deterministic token streams: a 100k-request trace needs no
// per-token storage, and prefix matching and block hashing work on runs instead of tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace memsim {

// Token id at position `pos` of stream `stream`: a 32-bit mix of both. Two sequences hold the
// same token at a position exactly when they draw it from the same stream (up to the mix's
// collisions, which are as rare as a real hash's).
uint32_t stream_token(uint64_t stream, uint32_t pos);

// Positions [begin(), size()) of a sequence. Runs are canonical: consecutive runs come from
// different streams (append() merges), so equal contents have equal runs and hashing or
// comparing runs is equivalent to hashing or comparing the token ids they stand for.
class TokenContent {
 public:
  struct Run {
    uint64_t stream;
    uint32_t end;  // the run covers [previous run's end (or begin()), end)
    friend bool operator==(const Run&, const Run&) = default;
  };

  static constexpr uint32_t kShared = UINT32_MAX;  // private_from() of a fully shared content

  TokenContent() = default;
  TokenContent(uint64_t stream, uint32_t count) { append(stream, count); }

  void append(uint64_t stream, uint32_t count);
  uint32_t begin() const { return begin_; }
  uint32_t size() const { return runs_.empty() ? begin_ : runs_.back().end; }  // end position
  bool empty() const { return size() == begin_; }
  const std::vector<Run>& runs() const { return runs_; }

  uint32_t token(uint32_t pos) const;  // O(log runs); pos in [begin(), size())
  // Positions [begin, end) of this content (begin() <= begin <= end <= size()).
  TokenContent slice(uint32_t begin, uint32_t end) const;
  // Drops positions >= end (a preempted sequence forgets nothing it will regenerate the same).
  void truncate(uint32_t end);

  // A hint for prefix caches, not part of the tokens (equality ignores it; slice and truncate
  // keep it): positions >= private_from() come from streams that no other sequence's lookup
  // will ever be matched against, unless the owner marks the content shared again (a preempted
  // request is looked up once more when it is readmitted). A paged pool defers hashing blocks
  // that reach past it (KvCacheManager::publish). kShared: no private part (the default).
  uint32_t private_from() const { return private_from_; }
  void set_private_from(uint32_t pos) { private_from_ = pos; }

  // Hash of tokens [begin, end) chained on `parent` (vLLM's hash_block_tokens(parent, tokens)).
  uint64_t chained_hash(uint64_t parent, uint32_t begin, uint32_t end) const;
  // Number of positions p in [begin, end) from `begin` on where both contents hold the same
  // token, stopping at the first difference. Both must cover [begin, end). O(runs).
  uint32_t match_length(const TokenContent& other, uint32_t begin, uint32_t end) const;

  friend bool operator==(const TokenContent& a, const TokenContent& b) {
    return a.begin_ == b.begin_ && a.runs_ == b.runs_;
  }

 private:
  size_t run_at(uint32_t pos) const;  // index of the run holding pos
  uint32_t run_begin(size_t i) const { return i == 0 ? begin_ : runs_[i - 1].end; }

  uint32_t begin_ = 0;
  uint32_t private_from_ = kShared;
  std::vector<Run> runs_;
};

}  // namespace memsim
