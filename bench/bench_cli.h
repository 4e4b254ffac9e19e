// The top of every bench executable: -h/--help prints its usage (exit 0), a bad argument or a
// config error is one message (exit 2), anything else thrown is one message (exit 1).
#pragma once

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include "src/config/config_node.h"

namespace memsim::bench {

// A command-line argument the bench cannot use; what() says which and why.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

// True when an argument asks for help.
inline bool wants_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "-h" || a == "--help") return true;
  }
  return false;
}

// Runs body() (returning the exit code) under the rules above. `usage` is the whole help text;
// empty, body handles --help itself (CLI11) and usage is not repeated after an error.
template <class Body>
int guarded_main(const char* name, const std::string& usage, int argc, char** argv, Body&& body) {
  if (!usage.empty() && wants_help(argc, argv)) {
    std::fputs(usage.c_str(), stdout);
    return 0;
  }
  try {
    return body();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n%s", name, e.what(), usage.c_str());
    return kExitBadInput;
  } catch (const ConfigError& e) {  // its message starts with the file (and line)
    std::fprintf(stderr, "%s: config error: %s\n", name, e.what());
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return kExitFailure;
  } catch (...) {
    std::fprintf(stderr, "%s: failed with an unknown exception\n", name);
    return kExitFailure;
  }
}

// A whole number in [lo, hi] from argument `what`, or UsageError.
inline uint64_t parse_count(const char* text, const char* what, uint64_t lo = 1,
                            uint64_t hi = UINT64_MAX) {
  const std::string_view s = text;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (s.empty() || s[0] == '-' || *end != '\0' || errno == ERANGE || v < lo || v > hi)
    throw UsageError(
        fmt::format("{} must be a whole number in [{}, {}], got '{}'", what, lo, hi, s));
  return v;
}

// A finite number > 0 from argument `what`, or UsageError.
inline double parse_positive(const char* text, const char* what) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(v) || v <= 0)
    throw UsageError(fmt::format("{} must be a number > 0, got '{}'", what, text));
  return v;
}

// The source tree to read `relative` (e.g. "configs/gpus/h200.yaml") from: MEMSIM_ROOT when set,
// else the first of the current folder and the tree of this binary (build/bench/NAME or
// build/NAME) that has it, else "." (the load then fails naming the file).
inline std::string source_root(const std::string& relative) {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("MEMSIM_ROOT")) return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (const fs::path& root :
       {fs::path("."), exe.parent_path() / ".." / "..", exe.parent_path() / ".."})
    if (fs::is_regular_file(root / relative, ec)) return root.lexically_normal().string();
  return ".";
}

}  // namespace memsim::bench
