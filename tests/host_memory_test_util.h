// Test helper: runs code in a child process under an address-space limit (ulimit -v) and
// reports the HostMemoryError it threw.
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <exception>
#include <fstream>
#include <functional>
#include <string>

#include "core/host_memory.h"

namespace memsim::test {

// Whether this build runs under AddressSanitizer, whose shadow memory leaves no room under an
// address-space limit: the tests that set one are skipped there (they run in every other build).
constexpr bool kUnderAddressSanitizer =
#if defined(__SANITIZE_ADDRESS__)
    true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    true;
#else
    false;
#endif
#else
    false;
#endif

// What a child process whose address space may grow by only `headroom` bytes (ulimit -v) said:
// a HostMemoryError's what(), "other: ..." for another exception, "none" when body returned.
inline std::string host_memory_error_in_child(uint64_t headroom,
                                              const std::function<void()>& body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    std::string said = "none";
    {
      std::ifstream status("/proc/self/status");
      std::string key;
      uint64_t vm_kib = 0;
      while (status >> key && key != "VmSize:") {
      }
      status >> vm_kib;
      const rlimit limit{vm_kib * 1024 + headroom, vm_kib * 1024 + headroom};
      ::setrlimit(RLIMIT_AS, &limit);
      try {
        body();
      } catch (const HostMemoryError& e) {
        said = e.what();
      } catch (const std::exception& e) {
        said = std::string("other: ") + e.what();
      }
    }
    const ssize_t n = ::write(fds[1], said.data(), said.size());
    ::_exit(n == static_cast<ssize_t>(said.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string said;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    said.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  return said;
}

}  // namespace memsim::test
