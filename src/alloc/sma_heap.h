// MemoryHeap: SMA's best-fit, coalescing heap of offsets over one region (the seed's
// zbccl_sma_mm_heap.h), under the Sma cache (src/alloc/sma.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "backends/result.h"

namespace memsim {

// MemoryHeap (the seed's zbccl_sma_mm_heap.h): hands out ranges of offsets in [0, size()).
// - address_idle_tree_ (offset -> size): free ranges by offset, to find the neighbours to
//   coalesce with on release;
// - size_idle_tree_ ((size, offset)): the same free ranges by size, for best fit;
// - address_used_tree_ (offset -> size): ranges handed out, which validates releases.
// Free ranges are always coalesced (no two touch), and used + free ranges tile [0, size()).
// Complexity: release O(log n); aligned_allocate O(log n + k), k = free ranges of size in
// [bytes, bytes + alignment) whose alignment padding leaves too little (k = 0 when every range
// is a multiple of `alignment`, as Sma's are with its default 512 B alignment).
class MemoryHeap {
 public:
  explicit MemoryHeap(uint64_t size = 0);

  // alignedAllocate(alignment, size): best fit, the smallest free range that holds `bytes` at an
  // `alignment`-aligned offset (lowest offset among equal sizes); the range is split, the
  // alignment padding in front and the remainder behind staying free. Returns the offset, or
  // nothing when no range fits (or bytes == 0, or alignment is not a power of two).
  std::optional<uint64_t> aligned_allocate(uint64_t alignment, uint64_t bytes);
  // release(address): frees the whole used range that starts at `offset` and coalesces it with
  // free neighbours. kInvalidArgument (nothing changed) when no used range starts there.
  Status release(uint64_t offset);
  // Frees [offset, offset + bytes), which must lie inside one used range; the parts of that range
  // on either side stay used, as ranges of their own (the seed's changeSize shrinks a range the
  // same way). kInvalidArgument (nothing changed) otherwise.
  Status release(uint64_t offset, uint64_t bytes);

  uint64_t size() const { return size_; }
  uint64_t used_bytes() const { return used_bytes_; }
  uint64_t idle_bytes() const { return size_ - used_bytes_; }
  uint64_t used_end() const;  // one past the highest used byte; 0 when nothing is used
  uint64_t largest_idle() const;
  const std::map<uint64_t, uint64_t>& idle_ranges() const { return address_idle_tree_; }
  const std::map<uint64_t, uint64_t>& used_ranges() const { return address_used_tree_; }
  bool check_invariants(std::string* why) const;

 private:
  void add_idle(uint64_t offset, uint64_t bytes);  // no coalescing: the caller knows it is not due
  void erase_idle(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t size_ = 0;
  uint64_t used_bytes_ = 0;
  std::map<uint64_t, uint64_t> address_idle_tree_;
  std::set<std::pair<uint64_t, uint64_t>> size_idle_tree_;  // (size, offset)
  std::map<uint64_t, uint64_t> address_used_tree_;
};

}  // namespace memsim
