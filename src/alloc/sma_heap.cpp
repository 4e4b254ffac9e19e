// MemoryHeap: best fit over the size tree, coalescing over the address tree.
#include "src/alloc/sma_heap.h"

#include <algorithm>
#include <bit>
#include <string>

namespace memsim {

namespace {

uint64_t round_up(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

// Seed §4.1: the whole region starts as one free range.
MemoryHeap::MemoryHeap(uint64_t size) : size_(size) {
  if (size != 0) add_idle(0, size);
}

void MemoryHeap::add_idle(uint64_t offset, uint64_t bytes) {
  address_idle_tree_.emplace(offset, bytes);
  size_idle_tree_.emplace(bytes, offset);
}

void MemoryHeap::erase_idle(std::map<uint64_t, uint64_t>::iterator it) {
  size_idle_tree_.erase({it->second, it->first});
  address_idle_tree_.erase(it);
}

// Seed §4.2 step 3: best fit in size_idle_tree_, split, the rest stays in the idle trees.
std::optional<uint64_t> MemoryHeap::aligned_allocate(uint64_t alignment, uint64_t bytes) {
  if (bytes == 0 || !std::has_single_bit(alignment)) return std::nullopt;
  for (auto it = size_idle_tree_.lower_bound({bytes, 0}); it != size_idle_tree_.end(); ++it) {
    const auto [len, off] = *it;
    const uint64_t start = round_up(off, alignment);
    const uint64_t pad = start - off;
    if (pad > len || len - pad < bytes) continue;  // the padding leaves too little
    erase_idle(address_idle_tree_.find(off));
    // Neither piece touches another free range: `off..off+len` was a maximal free range.
    if (pad != 0) add_idle(off, pad);
    if (len - pad > bytes) add_idle(start + bytes, len - pad - bytes);
    address_used_tree_.emplace(start, bytes);
    used_bytes_ += bytes;
    return start;
  }
  return std::nullopt;
}

Status MemoryHeap::release(uint64_t offset) {
  auto it = address_used_tree_.find(offset);
  if (it == address_used_tree_.end())
    return make_error(ErrorCode::kInvalidArgument, "heap: no used range starts at this offset");
  return release(offset, it->second);
}

// Seed §4.3 step 3: find the neighbours in address_idle_tree_ and merge with the free ones,
// updating size_idle_tree_ alike.
Status MemoryHeap::release(uint64_t offset, uint64_t bytes) {
  auto it = address_used_tree_.upper_bound(offset);
  if (it == address_used_tree_.begin())
    return make_error(ErrorCode::kInvalidArgument, "heap: release outside every used range");
  --it;
  const uint64_t used_start = it->first;
  const uint64_t used_end = used_start + it->second;
  if (bytes == 0 || offset >= used_end || bytes > used_end - offset)
    return make_error(ErrorCode::kInvalidArgument, "heap: release outside one used range");
  address_used_tree_.erase(it);
  if (offset > used_start) address_used_tree_.emplace(used_start, offset - used_start);
  if (offset + bytes < used_end)
    address_used_tree_.emplace(offset + bytes, used_end - offset - bytes);
  used_bytes_ -= bytes;

  uint64_t start = offset;
  uint64_t len = bytes;
  auto next = address_idle_tree_.find(offset + bytes);
  if (next != address_idle_tree_.end()) {
    len += next->second;
    erase_idle(next);
  }
  auto prev = address_idle_tree_.lower_bound(offset);
  if (prev != address_idle_tree_.begin()) {
    --prev;
    if (prev->first + prev->second == offset) {
      start = prev->first;
      len += prev->second;
      erase_idle(prev);
    }
  }
  add_idle(start, len);
  return {};
}

uint64_t MemoryHeap::used_end() const {
  if (address_used_tree_.empty()) return 0;
  const auto& [offset, bytes] = *address_used_tree_.rbegin();
  return offset + bytes;
}

uint64_t MemoryHeap::largest_idle() const {
  return size_idle_tree_.empty() ? 0 : size_idle_tree_.rbegin()->first;
}

bool MemoryHeap::check_invariants(std::string* why) const {
  auto fail = [&](const std::string& msg) {
    if (why != nullptr) *why = msg;
    return false;
  };
  if (size_idle_tree_.size() != address_idle_tree_.size())
    return fail("the idle trees hold different numbers of ranges");
  // Walk used and idle ranges together in address order: they must tile [0, size).
  auto u = address_used_tree_.begin();
  auto i = address_idle_tree_.begin();
  uint64_t cursor = 0, used = 0;
  bool last_idle = false;
  while (u != address_used_tree_.end() || i != address_idle_tree_.end()) {
    const bool idle =
        u == address_used_tree_.end() || (i != address_idle_tree_.end() && i->first < u->first);
    const auto [off, len] = idle ? *i : *u;
    const std::string at = (idle ? "idle range " : "used range ") + std::to_string(off) + ": ";
    if (off != cursor)
      return fail(at + "leaves a gap or overlaps (expected " + std::to_string(cursor) + ")");
    if (len == 0 || len > size_ - cursor) return fail(at + "empty or past the end");
    if (idle) {
      if (last_idle) return fail(at + "touches the previous idle range (not coalesced)");
      if (size_idle_tree_.count({len, off}) == 0) return fail(at + "missing from size_idle_tree_");
      ++i;
    } else {
      used += len;
      ++u;
    }
    last_idle = idle;
    cursor += len;
  }
  if (cursor != size_) return fail("ranges do not cover the heap");
  if (used != used_bytes_) return fail("used_bytes counter mismatch");
  return true;
}

}  // namespace memsim
