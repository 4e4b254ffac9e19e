// HashIndex: an open-addressing (linear probing, backward-shift deletion) map from a 64-bit
// content hash to a 32-bit block id, sized once for a fixed pool (rehash() grows it): the prefix
// cache's lookup structure and SlotMap's index, O(1) without a heap allocation per entry.
#pragma once

#include <cstdint>
#include <vector>

namespace memsim {

class HashIndex {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  // Room for `capacity` entries at a load factor of at most 1/2.
  void reset(uint64_t capacity) {
    uint64_t n = 16;
    while (n < 2 * capacity) n <<= 1;
    slots_.assign(n, Slot{});
    mask_ = n - 1;
    size_ = 0;
  }
  uint64_t size() const { return size_; }
  uint64_t capacity() const { return slots_.size() / 2; }  // entries within the load factor

  // Room for `capacity` entries, keeping the present ones.
  void rehash(uint64_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    reset(capacity);
    for (const Slot& s : old)
      if (s.value != kNone) insert(s.key, s.value);
  }

  uint32_t find(uint64_t key) const {
    for (uint64_t i = home(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.value == kNone) return kNone;
      if (s.key == key) return s.value;
    }
  }
  // Inserts key -> value unless key is present; returns whether it inserted.
  bool insert(uint64_t key, uint32_t value) {
    uint64_t i = home(key);
    for (; slots_[i].value != kNone; i = (i + 1) & mask_)
      if (slots_[i].key == key) return false;
    slots_[i] = {key, value};
    ++size_;
    return true;
  }
  // Removes key if it maps to `value`; returns whether it did.
  bool erase(uint64_t key, uint32_t value) {
    uint64_t i = home(key);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].value == kNone) return false;
      if (slots_[i].key == key) break;
    }
    if (slots_[i].value != value) return false;
    // Backward-shift: move later entries of the probe run into the hole.
    for (uint64_t j = (i + 1) & mask_; slots_[j].value != kNone; j = (j + 1) & mask_) {
      const uint64_t h = home(slots_[j].key);
      // Entry j may move to i if its home is not in the cyclic range (i, j].
      if (((j - h) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
    --size_;
    return true;
  }
  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_)
      if (s.value != kNone) f(s.key, s.value);
  }

 private:
  struct Slot {
    uint64_t key = 0;
    uint32_t value = kNone;
  };
  uint64_t home(uint64_t key) const { return (key * 0x9e3779b97f4a7c15ull) >> 7 & mask_; }

  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  uint64_t size_ = 0;
};

}  // namespace memsim
