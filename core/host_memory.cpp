// Host memory limits read from the kernel (getrlimit, /proc, cgroup v2 files) and the message of
// a request that cannot fit.
#include "core/host_memory.h"

#include <sys/resource.h>

#include <fmt/format.h>
#include <fstream>
#include <optional>
#include <sstream>

namespace memsim {
namespace {

// The number after `key` (e.g. "VmSize:") in a /proc file of "key value kB" lines, in bytes.
std::optional<uint64_t> proc_kib(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) != 0) continue;
    std::istringstream fields(line.substr(key.size()));
    uint64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return std::nullopt;
}

// A cgroup v2 file holding one number ("max" reads as none).
std::optional<uint64_t> cgroup_number(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return std::stoull(text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// This process's cgroup v2 folder ("/sys/fs/cgroup" + the path of its "0::" line).
std::string cgroup_dir() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("0::", 0) == 0) return "/sys/fs/cgroup" + line.substr(3);
  return "/sys/fs/cgroup";
}

void take_lower(HostMemoryLimit& limit, uint64_t bytes, const char* source) {
  if (bytes < limit.bytes) limit = {bytes, source};
}

}  // namespace

HostMemoryLimit host_memory_available() {
  HostMemoryLimit limit;
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const uint64_t used = proc_kib("/proc/self/status", "VmSize:").value_or(0);
    const uint64_t cap = static_cast<uint64_t>(as.rlim_cur);
    take_lower(limit, cap > used ? cap - used : 0, "the address-space limit, ulimit -v");
  }
  const std::string dir = cgroup_dir();
  if (const auto max = cgroup_number(dir + "/memory.max")) {
    const uint64_t current = cgroup_number(dir + "/memory.current").value_or(0);
    take_lower(limit, *max > current ? *max - current : 0, "the cgroup's memory.max");
  }
  if (const auto avail = proc_kib("/proc/meminfo", "MemAvailable:"))
    take_lower(limit, *avail, "MemAvailable of /proc/meminfo");
  return limit;
}

std::string format_host_bytes(uint64_t bytes) {
  if (bytes == UINT64_MAX) return "an unknown amount";
  constexpr double kKiB = 1024.0, kMiB = kKiB * 1024, kGiB = kMiB * 1024;
  const double b = static_cast<double>(bytes);
  if (b >= kGiB) return fmt::format("{:.1f} GiB", b / kGiB);
  if (b >= kMiB) return fmt::format("{:.0f} MiB", b / kMiB);
  if (b >= kKiB) return fmt::format("{:.0f} KiB", b / kKiB);
  return fmt::format("{} bytes", bytes);
}

void require_host_memory(uint64_t need, const std::string& what, const HostMemoryLimit& limit) {
  if (need <= limit.bytes) return;
  throw HostMemoryError(
      fmt::format("memsim: {} needs at least {} of host memory, but only {} are available ({})",
                  what, format_host_bytes(need), format_host_bytes(limit.bytes), limit.source));
}

}  // namespace memsim
