// The `requests:` loader: every key checked (typos, keys of another source or dist, ranges) with
// file:line:key errors, and the build step that generates or reads the requests.
#include "src/config/requests_loader.h"

#include <fmt/format.h>
#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string_view>

#include "core/host_memory.h"
#include "workload/input_file.h"
#include "src/config/loaders.h"

namespace memsim {
namespace fs = std::filesystem;

const ConfigKeys& requests_keys() {
  static const std::vector<std::string> kLength = {"dist", "value", "min", "max", "mean", "sigma"};
  static const ConfigKeys kKeys = {
      {"",
       {"source", "count", "seed", "arrival", "prompt", "output", "prefix", "n", "beam_width",
        "trace"}},
      {"arrival", {"process", "rate", "cv"}},
      {"prompt", kLength},
      {"output", kLength},
      {"prefix", {"groups", "tokens", "fraction"}},
      {"trace",
       {"path", "format", "limit", "time_scale", "max_prompt_tokens", "max_output_tokens",
        "zero_output"}},
  };
  return kKeys;
}

namespace {

constexpr uint64_t kMaxCount = 100000000;  // requests per workload
constexpr uint32_t kMaxParallel = 1024;    // n and beam_width

// Fails at `key` when it is present but the chosen variant (`chosen`) does not read it.
void reject_unused(const ConfigNode& n, std::string_view key, bool used, std::string_view chosen,
                   std::string_view users) {
  if (used) return;
  if (auto v = n.find(key))
    v->fail(fmt::format("does not apply to {} (only to {})", chosen, users));
}

uint32_t as_tokens(const ConfigNode& n, uint32_t lo = 1) {
  return static_cast<uint32_t>(n.as_uint_in(lo, kMaxRequestTokens));
}

double as_positive(const ConfigNode& n, double hi) {
  const double v = n.as_double_in(0, hi);
  if (v <= 0) n.fail("must be greater than 0");
  return v;
}

ArrivalConfig load_arrival(const ConfigNode& n) {
  n.expect_keys(keys_at(requests_keys(), "arrival"));
  ArrivalConfig a;
  const std::string process = n["process"].as_choice({"poisson", "gamma", "burst"});
  const std::string chosen = "process: " + process;
  a.process = process == "poisson" ? ArrivalProcess::kPoisson
              : process == "gamma" ? ArrivalProcess::kGamma
                                   : ArrivalProcess::kBurst;
  reject_unused(n, "rate", a.process != ArrivalProcess::kBurst, chosen, "poisson and gamma");
  reject_unused(n, "cv", a.process == ArrivalProcess::kGamma, chosen, "gamma");
  if (a.process != ArrivalProcess::kBurst) a.rate = as_positive(n["rate"], 1e9);
  if (a.process == ArrivalProcess::kGamma) a.cv = n["cv"].as_double_in(0, 100);
  return a;
}

// `key`: prompt or output.
LengthConfig load_length(const ConfigNode& n, std::string_view key) {
  n.expect_keys(keys_at(requests_keys(), key));
  LengthConfig c;
  const std::string dist = n["dist"].as_choice({"fixed", "uniform", "lognormal"});
  const std::string chosen = "dist: " + dist;
  c.dist = dist == "fixed"     ? LengthDist::kFixed
           : dist == "uniform" ? LengthDist::kUniform
                               : LengthDist::kLognormal;
  const bool fixed = c.dist == LengthDist::kFixed;
  const bool lognormal = c.dist == LengthDist::kLognormal;
  reject_unused(n, "value", fixed, chosen, "fixed");
  reject_unused(n, "min", !fixed, chosen, "uniform and lognormal");
  reject_unused(n, "max", !fixed, chosen, "uniform and lognormal");
  reject_unused(n, "mean", lognormal, chosen, "lognormal");
  reject_unused(n, "sigma", lognormal, chosen, "lognormal");
  if (fixed) {
    c.value = as_tokens(n["value"]);
    return c;
  }
  if (lognormal) {
    c.mean = n["mean"].as_double_in(1, kMaxRequestTokens);
    c.sigma = n["sigma"].as_double_in(0, 10);
    if (auto v = n.find("min")) c.min = as_tokens(*v);  // lognormal: min defaults to 1
  } else {
    c.min = as_tokens(n["min"]);
  }
  c.max = as_tokens(n["max"]);
  if (c.min > c.max) n["max"].fail(fmt::format("must be at least min ({}), got {}", c.min, c.max));
  return c;
}

PrefixConfig load_prefix(const ConfigNode& n, const LengthConfig& prompt) {
  n.expect_keys(keys_at(requests_keys(), "prefix"));
  PrefixConfig p;
  p.groups = static_cast<uint32_t>(n["groups"].as_uint_in(1, 1000000));
  p.tokens = as_tokens(n["tokens"]);
  if (p.tokens >= prompt.largest())
    n["tokens"].fail(fmt::format(
        "must be less than the longest prompt ({}): a grouped request keeps 1 token of its own",
        prompt.largest()));
  p.fraction = 1.0;
  if (auto v = n.find("fraction")) p.fraction = v->as_double_in(0, 1);
  return p;
}

SyntheticRequestsConfig load_synthetic(const ConfigNode& n) {
  SyntheticRequestsConfig s;
  s.count = n["count"].as_uint_in(1, kMaxCount);
  if (auto v = n.find("seed")) s.seed = v->as_uint();
  s.arrival = load_arrival(n["arrival"]);
  if (s.arrival.process != ArrivalProcess::kBurst &&
      static_cast<double>(s.count) / s.arrival.rate > 1e9)
    n["arrival"]["rate"].fail(
        fmt::format("{} requests at this rate take over 1e9 s of simulated time", s.count));
  s.prompt = load_length(n["prompt"], "prompt");
  s.output = load_length(n["output"], "output");
  if (auto v = n.find("prefix")) s.prefix = load_prefix(*v, s.prompt);
  return s;
}

TraceOptions load_trace(const ConfigNode& n, std::string& path, std::string& where) {
  n.expect_keys(keys_at(requests_keys(), "trace"));
  TraceOptions t;
  const ConfigNode p = n["path"];
  path = resolve_data_path(p, p.as_string());
  where = p.where();
  if (auto v = n.find("format")) {
    const std::string f = v->as_choice({"auto", "memsim", "azure"});
    t.format = f == "auto"     ? TraceFormat::kAuto
               : f == "memsim" ? TraceFormat::kMemsim
                               : TraceFormat::kAzure;
  }
  if (auto v = n.find("limit")) t.limit = v->as_uint_in(1, kMaxCount);
  if (auto v = n.find("time_scale")) t.time_scale = as_positive(*v, 1e6);
  if (auto v = n.find("max_prompt_tokens")) t.max_prompt_tokens = as_tokens(*v, 2);
  if (auto v = n.find("max_output_tokens")) t.max_output_tokens = as_tokens(*v);
  if (auto v = n.find("zero_output")) {
    const std::string z = v->as_choice({"one", "skip", "error"});
    t.zero_output = z == "one"    ? ZeroOutput::kOne
                    : z == "skip" ? ZeroOutput::kSkip
                                  : ZeroOutput::kError;
  }
  return t;
}

}  // namespace

RequestsConfig load_requests_config(const ConfigNode& node) {
  constexpr std::array<std::string_view, 6> kSyntheticKeys = {"count",  "seed",   "arrival",
                                                              "prompt", "output", "prefix"};
  node.expect_keys(keys_at(requests_keys(), ""));
  RequestsConfig c;
  const std::string source = node["source"].as_choice({"synthetic", "trace"});
  c.source = source == "synthetic" ? RequestSource::kSynthetic : RequestSource::kTrace;
  const bool synthetic = c.source == RequestSource::kSynthetic;
  for (std::string_view key : kSyntheticKeys)
    reject_unused(node, key, synthetic, "source: trace", "source: synthetic");
  reject_unused(node, "trace", !synthetic, "source: synthetic", "source: trace");

  uint32_t n = 1, beam_width = 1;
  if (auto v = node.find("n")) n = static_cast<uint32_t>(v->as_uint_in(1, kMaxParallel));
  if (auto v = node.find("beam_width"))
    beam_width = static_cast<uint32_t>(v->as_uint_in(1, kMaxParallel));
  if (n > 1 && beam_width > 1)
    node["beam_width"].fail(
        fmt::format("beam search forks its own beams: use n: 1 with beam_width {}", beam_width));

  if (synthetic) {
    c.synthetic = load_synthetic(node);
  } else {
    c.trace = load_trace(node["trace"], c.trace_path, c.trace_where);
  }
  c.synthetic.n = c.trace.n = n;
  c.synthetic.beam_width = c.trace.beam_width = beam_width;
  return c;
}

uint64_t requests_host_bytes(uint64_t requests) {
  return requests * kHostBytesPerRequest;
}

RequestSet build_request_set(const RequestsConfig& config) {
  if (config.source == RequestSource::kSynthetic) {
    const uint64_t count = config.synthetic.count;
    require_host_memory(requests_host_bytes(count),
                        fmt::format("simulating {} synthetic requests (requests.count)", count));
    try {
      return generate_request_set(config.synthetic);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(e.what());
    }
  }
  // A device or FIFO is refused by the reader; a regular file is sized up before it is read.
  std::error_code ec;
  if (fs::is_regular_file(config.trace_path, ec)) {
    const uint64_t size = fs::file_size(config.trace_path, ec);
    uint64_t rows = ec ? 0 : estimate_trace_rows(config.trace_path, size);
    if (config.trace.limit > 0) rows = std::min(rows, config.trace.limit);
    require_host_memory(requests_host_bytes(rows),
                        fmt::format("simulating the trace {} (about {} rows in {})",
                                    config.trace_path, rows, format_host_bytes(size)));
  }
  Result<RequestSet> r = read_request_trace(config.trace_path, config.trace);
  if (!r.ok())
    throw ConfigError(fmt::format("{} (trace from {})", r.error().message, config.trace_where));
  return std::move(r).value();
}

std::vector<RequestSpec> build_requests(const RequestsConfig& config) {
  return build_request_set(config).requests.to_vector();
}

std::string resolve_data_path(const ConfigNode& at, const std::string& ref) {
  const fs::path given(ref);
  std::vector<fs::path> candidates;
  if (given.is_absolute())
    candidates.push_back(given);
  else
    candidates = reference_candidates(at, given);  // the one rule (loaders.h)
  std::string why;
  if (auto found = first_regular_file(candidates, &why)) return found->lexically_normal().string();
  // Something that exists but cannot be read as a file (/dev/zero, a FIFO, a folder).
  for (const fs::path& p : candidates) {
    std::error_code ec;
    if (!fs::exists(p, ec)) continue;
    if (std::string e = special_file_error(p.lexically_normal().string()); !e.empty()) at.fail(e);
  }
  std::vector<std::string> looked;
  for (const fs::path& p : candidates) {
    const std::string name = p.lexically_normal().string();
    if (std::find(looked.begin(), looked.end(), name) == looked.end()) looked.push_back(name);
  }
  at.fail(fmt::format("cannot find file '{}' (looked in {}){}", ref, fmt::join(looked, ", "),
                      why.empty() ? std::string() : ": " + why));
}

}  // namespace memsim
