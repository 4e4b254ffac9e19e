// SampleLog's byte encoding: zigzag varint time deltas, varint series ids with a raw-value flag,
// varint whole values or raw doubles; chunked storage and an index of every 256th sample.
#include "core/sample_log.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

namespace memsim {
namespace {

size_t put_varint(uint8_t* out, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  out[n++] = static_cast<uint8_t>(v);
  return n;
}

uint64_t get_varint(const uint8_t* in, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const uint8_t b = in[pos++];
    v |= uint64_t{b & 0x7fu} << shift;
    if (b < 0x80) return v;
  }
}

// A value stored as a varint: a whole number in [0, 2^53), not -0.0 (its sign would be lost).
bool stored_whole(double v) {
  return v >= 0.0 && v < 0x1p53 && v == std::floor(v) && !std::signbit(v);
}

}  // namespace

SampleLog::SampleLog(const SampleLog& other)
    : marks_(other.marks_), size_(other.size_), time_(other.time_), last_(other.last_) {
  chunks_.reserve(other.chunks_.size());
  for (const Chunk& c : other.chunks_) {
    Chunk copy;
    copy.bytes = std::make_unique<uint8_t[]>(c.capacity);
    copy.capacity = c.capacity;
    copy.used = c.used;
    std::memcpy(copy.bytes.get(), c.bytes.get(), c.used);
    chunks_.push_back(std::move(copy));
  }
}

SampleLog& SampleLog::operator=(const SampleLog& other) {
  if (this != &other) *this = SampleLog(other);
  return *this;
}

void SampleLog::push_back(const GaugeSample& s) {
  if (chunks_.empty() || chunks_.back().capacity - chunks_.back().used < kMaxEncoded) {
    Chunk c;
    c.capacity =
        chunks_.empty() ? kFirstChunk : std::min(kLargestChunk, 2 * chunks_.back().capacity);
    c.bytes = std::make_unique<uint8_t[]>(c.capacity);
    chunks_.push_back(std::move(c));
  }
  Chunk& c = chunks_.back();
  if (size_ % kMarkEvery == 0)
    marks_.push_back(
        {static_cast<uint32_t>(chunks_.size() - 1), static_cast<uint32_t>(c.used), time_});
  // Wrapping arithmetic: any two times have a delta that decodes back exactly.
  const uint64_t delta = static_cast<uint64_t>(s.time) - static_cast<uint64_t>(time_);
  const uint64_t zigzag = (delta << 1) ^ static_cast<uint64_t>(static_cast<int64_t>(delta) >> 63);
  const bool whole = stored_whole(s.value);
  uint8_t* out = c.bytes.get() + c.used;
  size_t n = put_varint(out, zigzag);
  n += put_varint(out + n, (uint64_t{s.series} << 1) | (whole ? 0u : 1u));
  if (whole) {
    n += put_varint(out + n, static_cast<uint64_t>(s.value));
  } else {
    const uint64_t bits = std::bit_cast<uint64_t>(s.value);
    std::memcpy(out + n, &bits, sizeof bits);
    n += sizeof bits;
  }
  c.used += n;
  time_ = s.time;
  last_ = s;
  ++size_;
}

SampleLog::Iterator::Iterator(const SampleLog* log, size_t index, size_t chunk, size_t pos,
                              SimTime time)
    : log_(log), index_(index), chunk_(chunk), pos_(pos), time_(time) {
  if (index_ < log_->size_) decode();
}

SampleLog::Iterator& SampleLog::Iterator::operator++() {
  if (++index_ < log_->size_) decode();
  return *this;
}

void SampleLog::Iterator::decode() {
  if (pos_ == log_->chunks_[chunk_].used) {
    ++chunk_;
    pos_ = 0;
  }
  const uint8_t* in = log_->chunks_[chunk_].bytes.get();
  const uint64_t zigzag = get_varint(in, pos_);
  const uint64_t delta = (zigzag >> 1) ^ (~(zigzag & 1) + 1);
  time_ = static_cast<SimTime>(static_cast<uint64_t>(time_) + delta);
  const uint64_t head = get_varint(in, pos_);
  current_.time = time_;
  current_.series = static_cast<uint32_t>(head >> 1);
  if ((head & 1) == 0) {
    current_.value = static_cast<double>(get_varint(in, pos_));
  } else {
    uint64_t bits = 0;
    std::memcpy(&bits, in + pos_, sizeof bits);
    pos_ += sizeof bits;
    current_.value = std::bit_cast<double>(bits);
  }
}

GaugeSample SampleLog::operator[](size_t i) const {
  const Mark& m = marks_[i / kMarkEvery];
  Iterator it(this, i - i % kMarkEvery, m.chunk, m.pos, m.time);
  for (size_t k = i % kMarkEvery; k > 0; --k) ++it;
  return *it;
}

uint64_t SampleLog::bytes() const {
  uint64_t b = marks_.capacity() * sizeof(Mark) + chunks_.capacity() * sizeof(Chunk);
  for (const Chunk& c : chunks_) b += c.capacity;
  return b;
}

std::vector<GaugeSample> SampleLog::to_vector() const {
  std::vector<GaugeSample> out;
  out.reserve(size_);
  for (const GaugeSample& s : *this) out.push_back(s);
  return out;
}

}  // namespace memsim
