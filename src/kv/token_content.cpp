// Token content as stream runs: token ids, slicing, chained block hashes and prefix matching.
#include "src/kv/token_content.h"

#include <algorithm>
#include <cassert>

namespace memsim {
namespace {

// SplitMix64's finalizer: a fast bijective 64-bit mix.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t combine(uint64_t h, uint64_t v) {
  return mix64(h ^ mix64(v));
}

}  // namespace

uint32_t stream_token(uint64_t stream, uint32_t pos) {
  return static_cast<uint32_t>(mix64(mix64(stream) + pos) >> 32);
}

void TokenContent::append(uint64_t stream, uint32_t count) {
  if (count == 0) return;
  const uint32_t end = size() + count;
  if (!runs_.empty() && runs_.back().stream == stream)
    runs_.back().end = end;
  else
    runs_.push_back({stream, end});
}

size_t TokenContent::run_at(uint32_t pos) const {
  assert(pos >= begin_ && pos < size());
  auto it = std::upper_bound(runs_.begin(), runs_.end(), pos,
                             [](uint32_t p, const Run& r) { return p < r.end; });
  return static_cast<size_t>(it - runs_.begin());
}

uint32_t TokenContent::token(uint32_t pos) const {
  return stream_token(runs_[run_at(pos)].stream, pos);
}

TokenContent TokenContent::slice(uint32_t begin, uint32_t end) const {
  assert(begin >= begin_ && begin <= end && end <= size());
  TokenContent out;
  out.begin_ = begin;
  out.private_from_ = private_from_;
  if (begin == end) return out;
  for (size_t i = run_at(begin); i < runs_.size(); ++i) {
    out.runs_.push_back({runs_[i].stream, std::min(runs_[i].end, end)});
    if (runs_[i].end >= end) break;
  }
  return out;
}

void TokenContent::truncate(uint32_t end) {
  assert(end >= begin_ && end <= size());
  while (!runs_.empty() && run_begin(runs_.size() - 1) >= end) runs_.pop_back();
  if (!runs_.empty()) runs_.back().end = end;
}

uint64_t TokenContent::chained_hash(uint64_t parent, uint32_t begin, uint32_t end) const {
  assert(begin >= begin_ && begin < end && end <= size());
  // Hashes the canonical pieces (stream, piece begin, piece end) of [begin, end): the pieces
  // determine the token ids and vice versa, so equal blocks hash equal.
  uint64_t h = combine(parent, end - begin);
  for (size_t i = run_at(begin); i < runs_.size(); ++i) {
    const uint32_t b = std::max(run_begin(i), begin);
    const uint32_t e = std::min(runs_[i].end, end);
    h = combine(combine(combine(h, runs_[i].stream), b), e);
    if (runs_[i].end >= end) break;
  }
  return h;
}

uint32_t TokenContent::match_length(const TokenContent& other, uint32_t begin, uint32_t end) const {
  assert(begin >= begin_ && begin >= other.begin_ && end <= size() && end <= other.size());
  if (begin >= end) return 0;
  size_t i = run_at(begin), j = other.run_at(begin);
  uint32_t pos = begin;
  while (pos < end) {
    if (runs_[i].stream != other.runs_[j].stream) break;
    const uint32_t next = std::min({runs_[i].end, other.runs_[j].end, end});
    pos = next;
    if (pos == runs_[i].end) ++i;
    if (pos == other.runs_[j].end) ++j;
  }
  return pos - begin;
}

}  // namespace memsim
