// The fuzz targets' bodies, shared by the libFuzzer entry points (fuzz_main.cpp) and the regression
// test that replays the kept crashers in every build (tests/test_fuzz_regressions.cpp). Each
// returns an empty string when the input was handled as the contract says, else what went wrong;
// an exception other than the documented one escapes (a finding too).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "workload/alloc_trace.h"
#include "workload/requests.h"
#include "workload/snapshot.h"
#include "src/app/experiment.h"

namespace memsim::fuzz {

// Writes `bytes` to /dev/shm (or /tmp) under a name unique to this process; returns its path.
inline std::string scratch_file(std::string_view bytes, const char* suffix) {
  static const std::string dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  const std::string path = dir + "/memsim_fuzz_" + std::to_string(getpid()) + suffix;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// An experiment YAML (any kind), optionally followed by a line "#--set" and one override per
// line, through the typed loaders: they may only throw ConfigError, whose message names the file
// (with a line) or the --set flag.
inline std::string config_target(std::string_view input) {
  std::string text(input);
  std::vector<std::string> overrides;
  if (const size_t cut = text.find("\n#--set\n"); cut != std::string::npos) {
    const std::string rest = text.substr(cut + 8);
    text.resize(cut + 1);
    size_t start = 0;
    while (start < rest.size()) {
      size_t end = rest.find('\n', start);
      if (end == std::string::npos) end = rest.size();
      if (end > start) overrides.push_back(rest.substr(start, end - start));
      start = end + 1;
    }
  }
  const std::string path = scratch_file(text, ".yaml");
  try {
    (void)validate_experiment(load_experiment_root(path, overrides));
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    // "file:line: key: message", "file: message", "--set ...", or a referenced file's own error.
    if (m.rfind(path, 0) != 0 && m.rfind("--set ", 0) != 0 && m.find(".csv") == std::string::npos &&
        m.find(".yaml") == std::string::npos && m.find(".pickle") == std::string::npos)
      return "config error that names no file: " + m;
  }
  return {};
}

// A request trace (CSV) in the format, zero-output rule and clamps the first byte picks: it reads
// into a valid workload or returns an error value.
inline std::string trace_target(std::string_view input) {
  if (input.empty()) return {};
  TraceOptions o;
  const auto knobs = static_cast<uint8_t>(input[0]);
  o.format = static_cast<TraceFormat>(knobs % 3);
  o.zero_output = static_cast<ZeroOutput>((knobs / 3) % 3);
  if (knobs & 0x40) o.max_prompt_tokens = 4096;
  if (knobs & 0x80) o.time_scale = 0.25;
  const std::string path = scratch_file(input.substr(1), ".csv");
  Result<RequestSet> r = read_request_trace(path, o);
  if (r.ok() && !r->requests.empty()) {
    const std::string why = check_requests(r->requests);
    if (!why.empty()) return "the reader returned an invalid workload: " + why;
  }
  return {};
}

// A PyTorch memory snapshot pickle through the pickle reader, the snapshot parser and the
// conversion to an allocation trace: errors are values.
inline std::string snapshot_target(std::string_view input) {
  Result<Snapshot> s = parse_snapshot(input, "fuzz.pickle");
  if (!s.ok()) return {};
  for (int device = 0; device < 2; ++device) (void)trace_from_snapshot(*s, device, "fuzz.pickle");
  return {};
}

}  // namespace memsim::fuzz
