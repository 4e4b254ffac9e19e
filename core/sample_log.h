// SampleLog: a gauge time series packed into bytes (a few bytes a sample instead of 24), read
// back exactly, in order or by index.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <vector>

#include "core/clock.h"

namespace memsim {

// One recorded value of a series.
struct GaugeSample {
  SimTime time;
  uint32_t series;
  double value;
  friend bool operator==(const GaugeSample&, const GaugeSample&) = default;
};

// Samples in the order they were added. Each is stored as the change of time since the previous
// sample (zigzag varint: 1 byte when equal), the series id with a flag (varint), and the value:
// a varint when it is a whole number in [0, 2^53) (not -0.0), else its 8 bytes. Values come back
// bit for bit. Storage grows in chunks (no copy of what is stored); every 256th sample is indexed,
// so operator[] decodes at most 255 samples.
class SampleLog {
 public:
  SampleLog() = default;
  SampleLog(const SampleLog& other);
  SampleLog& operator=(const SampleLog& other);
  SampleLog(SampleLog&&) noexcept = default;
  SampleLog& operator=(SampleLog&&) noexcept = default;

  void push_back(const GaugeSample& s);
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  GaugeSample operator[](size_t i) const;
  GaugeSample back() const { return last_; }  // precondition: !empty()
  // Bytes held (chunks and index).
  uint64_t bytes() const;
  std::vector<GaugeSample> to_vector() const;

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = GaugeSample;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = GaugeSample;
    Iterator(const SampleLog* log, size_t index, size_t chunk, size_t pos, SimTime time);
    GaugeSample operator*() const { return current_; }
    Iterator& operator++();
    friend bool operator==(const Iterator& a, const Iterator& b) { return a.index_ == b.index_; }

   private:
    void decode();  // reads the sample at (chunk_, pos_) into current_
    const SampleLog* log_;
    size_t index_, chunk_, pos_;
    SimTime time_;  // time of the previous sample
    GaugeSample current_{};
  };
  Iterator begin() const { return {this, 0, 0, 0, 0}; }
  Iterator end() const { return {this, size_, 0, 0, 0}; }

 private:
  struct Chunk {
    std::unique_ptr<uint8_t[]> bytes;
    size_t capacity = 0;
    size_t used = 0;
  };
  struct Mark {  // where sample k * kMarkEvery starts, and the time before it
    uint32_t chunk;
    uint32_t pos;
    SimTime time;
  };
  static constexpr size_t kMarkEvery = 256;
  static constexpr size_t kMaxEncoded = 10 + 5 + 8;  // time varint, series varint, raw value
  static constexpr size_t kFirstChunk = 4096;
  static constexpr size_t kLargestChunk = 1 << 20;

  std::vector<Chunk> chunks_;
  std::vector<Mark> marks_;
  size_t size_ = 0;
  SimTime time_ = 0;  // time of the last sample (0 before the first)
  GaugeSample last_{};
};

}  // namespace memsim
