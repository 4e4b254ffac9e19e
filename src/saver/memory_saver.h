// Role interface of the memory-saver family (tagged_regions, sleep_mode): tagged device
// allocations whose physical memory can be given back and taken again at the same addresses.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"

namespace memsim {

struct SaverTagStats {
  uint64_t allocations = 0;
  uint64_t bytes = 0;         // virtual bytes of the tag's live allocations
  uint64_t active_bytes = 0;  // of those, backed by physical memory now
  uint64_t paused_bytes = 0;  // of those, paused (physical memory given back)
  uint64_t backup_bytes = 0;  // pinned host bytes holding the tag's contents
};

struct SaverStats {
  std::map<std::string, SaverTagStats, std::less<>> tags;
  uint64_t physical_bytes = 0;       // device memory held (all tags)
  uint64_t backup_bytes = 0;         // pinned host memory held
  uint64_t pauses = 0, resumes = 0;  // allocations paused / resumed, ever
};

// What one pause or resume did.
struct SaverReport {
  uint64_t allocations = 0;   // allocations whose state changed
  uint64_t bytes = 0;         // their bytes
  uint64_t skipped = 0;       // allocations of the tags already in the wanted state
  uint64_t copied_bytes = 0;  // bytes copied to or from pinned host memory
};

// Contract: a memory saver in the manner of torch_memory_saver / vLLM's CuMemAllocator.
// - malloc(bytes, tag) returns a device pointer backed by its own VMM reservation and physical
//   handle (bytes rounded up to the granularity); 0 bytes or an empty tag is kInvalidArgument.
// - pause(tags) gives back the physical memory of every active allocation of the tags (all
//   tags when empty), keeping the virtual range; with a CPU backup the contents go to pinned
//   host memory first. resume(tags) creates physical memory again, maps it at the same address,
//   sets access and restores a backup when there is one. Both are idempotent per allocation: an
//   allocation already in the wanted state is skipped and counted in the report (the real
//   torch_memory_saver exits the process there).
// - On a failed backend call the call returns the error; every allocation is then either fully
//   active or fully paused (never half-mapped), nothing leaks, and a later call may retry.
// - free(p) takes a live pointer (active or paused) and releases everything it holds.
// - release_all() frees every allocation (teardown); afterwards physical_bytes and
//   backup_bytes are 0. check_invariants() verifies the bookkeeping against its counters.
class MemorySaver {
 public:
  virtual ~MemorySaver() = default;
  virtual Result<DevPtr> malloc(uint64_t bytes, std::string_view tag) = 0;
  virtual Status free(DevPtr p) = 0;
  virtual Result<SaverReport> pause(const std::vector<std::string>& tags) = 0;
  virtual Result<SaverReport> resume(const std::vector<std::string>& tags) = 0;
  virtual Status release_all() = 0;
  virtual SaverStats stats() const = 0;
  virtual bool is_paused(DevPtr p) const = 0;
  virtual bool check_invariants(std::string* why) const = 0;
};

}  // namespace memsim
