// First-fit virtual-address allocator with coalescing, used by the sim backend to hand out VA.
#pragma once

#include <cstdint>
#include <map>
#include <unordered_map>

#include "backends/result.h"

namespace memsim {

// Complexity: alloc O(number of free holes) worst case (first fit), free O(log n).
class VaSpace {
 public:
  VaSpace(uint64_t base, uint64_t size);
  // Returns an `align`-aligned range of `bytes` (both > 0, align a power of two), or
  // kOutOfMemory when no hole fits.
  Result<uint64_t> alloc(uint64_t bytes, uint64_t align);
  // Frees a range returned by alloc; returns its size, or kInvalidArgument.
  Result<uint64_t> free(uint64_t addr);
  // Gives back the tail of a range returned by alloc past its first `bytes` (0 < bytes <= its
  // size), or kInvalidArgument.
  Status shrink(uint64_t addr, uint64_t bytes);
  uint64_t size_of(uint64_t addr) const;  // 0 if not a live range start
  uint64_t in_use() const { return in_use_; }

 private:
  void add_hole(uint64_t start, uint64_t size);  // merges with adjacent holes
  std::map<uint64_t, uint64_t> holes_;           // start -> size
  std::unordered_map<uint64_t, uint64_t> live_;
  uint64_t in_use_ = 0;
};

}  // namespace memsim
