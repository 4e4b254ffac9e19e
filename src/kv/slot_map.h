// SlotMap: live sequences by id in flat arrays (an open-addressing index into a dense vector
// with a free list), so the step loop's lookups, inserts and erases allocate nothing per call.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "src/kv/hash_index.h"

namespace memsim {

template <class T>
class SlotMap {
 public:
  SlotMap() { index_.reset(0); }

  T* find(uint32_t key) {
    const uint32_t i = index_.find(key);
    return i == HashIndex::kNone ? nullptr : &slots_[i].value;
  }
  const T* find(uint32_t key) const { return const_cast<SlotMap*>(this)->find(key); }
  bool contains(uint32_t key) const { return index_.find(key) != HashIndex::kNone; }
  uint64_t size() const { return index_.size(); }

  // Inserts key -> value; the key must be absent.
  T& insert(uint32_t key, T value) {
    // At most a quarter full (half the index's own bound): every grow looks its sequence up,
    // and the shorter probe runs made memsim-kv-bench 1-3% faster than half full.
    if (2 * index_.size() >= index_.capacity()) index_.rehash(2 * index_.capacity());
    uint32_t i;
    if (free_.empty()) {
      i = static_cast<uint32_t>(slots_.size());
      slots_.push_back({key, true, std::move(value)});
    } else {
      i = free_.back();
      free_.pop_back();
      slots_[i] = {key, true, std::move(value)};
    }
    index_.insert(key, i);
    return slots_[i].value;
  }
  void erase(uint32_t key) {
    const uint32_t i = index_.find(key);
    if (i == HashIndex::kNone) return;
    index_.erase(key, i);
    slots_[i].live = false;
    slots_[i].value = T{};  // frees what the value holds now
    free_.push_back(i);
  }
  void clear() {
    index_.reset(0);
    slots_.clear();
    free_.clear();
  }
  // Calls f(key, value) for each entry until f returns false; returns whether none did.
  template <class F>
  bool all(F&& f) const {
    for (const Slot& s : slots_)
      if (s.live && !f(s.key, s.value)) return false;
    return true;
  }

 private:
  struct Slot {
    uint32_t key = 0;
    bool live = false;
    T value{};
  };
  HashIndex index_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
};

}  // namespace memsim
