// First-fit VA allocator implementation.
#include "backends/sim/va_space.h"

#include <string>

namespace memsim {

VaSpace::VaSpace(uint64_t base, uint64_t size) {
  holes_.emplace(base, size);
}

Result<uint64_t> VaSpace::alloc(uint64_t bytes, uint64_t align) {
  if (bytes == 0) return make_error(ErrorCode::kInvalidArgument, "reserve of 0 bytes");
  if (align == 0 || (align & (align - 1)) != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "reserve of " + std::to_string(bytes) + " bytes: alignment " +
                          std::to_string(align) + " is not a power of two");
  for (auto it = holes_.begin(); it != holes_.end(); ++it) {
    const uint64_t start = it->first, size = it->second;
    const uint64_t aligned = (start + align - 1) & ~(align - 1);
    if (aligned - start > size || size - (aligned - start) < bytes) continue;
    holes_.erase(it);
    if (aligned > start) holes_.emplace(start, aligned - start);
    const uint64_t end = aligned + bytes, hole_end = start + size;
    if (hole_end > end) holes_.emplace(end, hole_end - end);
    live_.emplace(aligned, bytes);
    in_use_ += bytes;
    return aligned;
  }
  return make_error(ErrorCode::kOutOfMemory,
                    "virtual address space exhausted (" + std::to_string(bytes) + " bytes)", bytes);
}

Result<uint64_t> VaSpace::free(uint64_t addr) {
  auto it = live_.find(addr);
  if (it == live_.end()) return make_error(ErrorCode::kInvalidArgument, "not a reserved range");
  const uint64_t size = it->second;
  live_.erase(it);
  in_use_ -= size;
  add_hole(addr, size);
  return size;
}

Status VaSpace::shrink(uint64_t addr, uint64_t bytes) {
  auto it = live_.find(addr);
  if (it == live_.end()) return make_error(ErrorCode::kInvalidArgument, "not a reserved range");
  if (bytes == 0 || bytes > it->second)
    return make_error(ErrorCode::kInvalidArgument, "shrink to " + std::to_string(bytes) +
                                                       " bytes of a range of " +
                                                       std::to_string(it->second));
  const uint64_t tail = it->second - bytes;
  if (tail == 0) return {};
  it->second = bytes;
  in_use_ -= tail;
  add_hole(addr + bytes, tail);
  return {};
}

void VaSpace::add_hole(uint64_t start, uint64_t size) {
  auto next = holes_.lower_bound(start);
  if (next != holes_.end() && next->first == start + size) {
    size += next->second;
    next = holes_.erase(next);
  }
  if (next != holes_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      holes_.erase(prev);
    }
  }
  holes_.emplace(start, size);
}

uint64_t VaSpace::size_of(uint64_t addr) const {
  auto it = live_.find(addr);
  return it == live_.end() ? 0 : it->second;
}

}  // namespace memsim
