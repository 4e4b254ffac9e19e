// Host (CPU) memory of this process: HostMemoryError, the typed error for running out of it, and
// how much more the process may allocate (address-space limit, cgroup limit, available memory).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace memsim {

// The process ran out of host memory, or would obviously run out, while building something big
// (a request trace, a synthetic workload, a snapshot). what() is the whole message for the user,
// "memsim: ..." included; the command line prints it as is and exits 1.
class HostMemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What the process may still allocate: the least of the address-space limit (ulimit -v) less
// the address space in use, the cgroup's memory.max less its memory.current, and MemAvailable
// of /proc/meminfo. bytes is UINT64_MAX (and source empty) when none of them can be read.
struct HostMemoryLimit {
  uint64_t bytes = UINT64_MAX;
  std::string source;  // which bound it is, e.g. "the address-space limit (ulimit -v)"
};
HostMemoryLimit host_memory_available();

// "1.5 GiB", "312 MiB", "12 KiB", "100 bytes": a size for messages.
std::string format_host_bytes(uint64_t bytes);

// Throws HostMemoryError when `need` bytes exceed `limit`: "memsim: <what> needs at least
// <need> of host memory, but only <limit> are available (<source>)".
void require_host_memory(uint64_t need, const std::string& what,
                         const HostMemoryLimit& limit = host_memory_available());

}  // namespace memsim
