// Loader for the `requests:` block of an experiment (synthetic generator or trace file) into
// typed structs, and the step that turns it into the request list.
#pragma once

#include <string>
#include <vector>

#include "workload/requests.h"
#include "src/config/config_keys.h"
#include "src/config/config_node.h"

namespace memsim {

enum class RequestSource : uint8_t { kSynthetic, kTrace };

struct RequestsConfig {
  RequestSource source = RequestSource::kSynthetic;
  SyntheticRequestsConfig synthetic;  // source: synthetic
  std::string trace_path;             // source: trace, resolved (see resolve_data_path)
  TraceOptions trace;                 // source: trace (n and beam_width are set for both)
  std::string trace_where;            // "file:line: requests.trace.path", for read errors
};

// Parses the value of a `requests:` key:
//   source: synthetic | trace                              (required)
//   n: 1, beam_width: 1                                    (optional, not both > 1)
// synthetic:
//   count: 2000 (required), seed: 1 (optional)
//   arrival: {process: poisson, rate: 20} | {process: gamma, rate: 20, cv: 3} | {process: burst}
//   prompt / output (required): {dist: fixed, value} | {dist: uniform, min, max} |
//                               {dist: lognormal, mean, sigma, max, min (optional, 1)}
//   prefix: {groups, tokens, fraction (optional, 1.0)}      (optional; tokens < largest prompt)
// trace:
//   trace: {path (required), format: auto|memsim|azure, limit: 0 (all), time_scale: 1.0,
//           max_prompt_tokens, max_output_tokens, zero_output: one|skip|error}
// Keys that do not apply to the chosen source, process or dist are errors naming them; the
// trace file must exist. Throws ConfigError ("file:line: key.path: message").
RequestsConfig load_requests_config(const ConfigNode& node);
// The maps of a `requests:` block and the keys each accepts (docs/config.md lists them).
const ConfigKeys& requests_keys();

// Host bytes a serving run of `requests` requests needs at the least: the packed request table
// (RequestTable::kBytesPerRequest) and one run's latency samples (TTFT, E2E, TPOT: 8 bytes each).
inline constexpr uint64_t kHostBytesPerRequest = RequestTable::kBytesPerRequest + 3 * 8;
uint64_t requests_host_bytes(uint64_t requests);

// The requests the config describes (generated, or read from the trace). A trace read error
// becomes a ConfigError carrying the trace's "path:line: column: message" and the config key.
// When requests_host_bytes() of the count (or of the trace's estimated rows) exceeds the host
// memory available (host_memory_available()), or the host runs out of memory while building
// them, throws HostMemoryError (core/host_memory.h) with the whole message.
RequestSet build_request_set(const RequestsConfig& config);
std::vector<RequestSpec> build_requests(const RequestsConfig& config);

// Resolves a data file named in a config: an absolute path as is; else the first regular file of
// reference_candidates (loaders.h: beside the config, in its project, in the installation, in
// the current folder). Fails at `at`, listing where it looked, or
// naming the type of a candidate that exists but is no regular file ("/dev/zero is not a regular
// file (a character device)").
std::string resolve_data_path(const ConfigNode& at, const std::string& ref);

}  // namespace memsim
