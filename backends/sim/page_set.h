// PageSet: which pages of an allocation have been touched, as merged [first, last) runs, so a
// sequential memset of a large pool stays one run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>

namespace memsim {

class PageSet {
 public:
  // Marks pages [first, last) touched; returns how many of them were not touched before.
  // Complexity: O(log runs + runs merged).
  uint64_t touch(uint64_t first, uint64_t last) {
    if (first >= last) return 0;
    uint64_t fresh = last - first;
    auto it = runs_.upper_bound(first);
    if (it != runs_.begin() && std::prev(it)->second >= first) --it;
    // Absorb every run that overlaps or adjoins [first, last).
    while (it != runs_.end() && it->first <= last) {
      const uint64_t lo = std::max(first, it->first), hi = std::min(last, it->second);
      if (hi > lo) fresh -= hi - lo;
      first = std::min(first, it->first);
      last = std::max(last, it->second);
      count_ -= it->second - it->first;
      it = runs_.erase(it);
    }
    runs_.emplace(first, last);
    count_ += last - first;
    return fresh;
  }
  uint64_t pages() const { return count_; }
  size_t runs() const { return runs_.size(); }

 private:
  std::map<uint64_t, uint64_t> runs_;  // first page -> one past the last
  uint64_t count_ = 0;
};

}  // namespace memsim
