// Serving requests as typed data: a seeded synthetic generator (arrival process, length
// distributions, shared-prefix groups, n / beam width) and a reader for request trace files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "backends/result.h"
#include "workload/request_spec.h"
#include "workload/request_table.h"

namespace memsim {

// Empty when `requests` is a valid workload: ids 0..N-1 in order, arrivals non-decreasing and
// >= 0, token counts >= 1, prefixes as documented on RequestSpec, n == 1 when beam_width > 1.
// Otherwise the first violation, naming the request id.
std::string check_requests(const RequestTable& requests);
std::string check_requests(const std::vector<RequestSpec>& requests);

// ---------------------------------------------------------------------------------------------
// Synthetic generator.

enum class ArrivalProcess : uint8_t {
  kPoisson,  // exponential gaps of mean 1/rate
  kGamma,    // gamma gaps of mean 1/rate and coefficient of variation cv (cv = 1: Poisson)
  kBurst,    // every request at t = 0
};
const char* to_string(ArrivalProcess p);

struct ArrivalConfig {
  ArrivalProcess process = ArrivalProcess::kPoisson;
  double rate = 1.0;  // requests per second (> 0); unused by kBurst
  // kGamma only, >= 0. cv == 1 draws exactly the Poisson sequence of the same seed; cv == 0
  // spaces requests evenly at 1/rate.
  double cv = 1.0;
};

enum class LengthDist : uint8_t {
  kFixed,      // always `value`
  kUniform,    // integers in [min, max], each equally likely
  kLognormal,  // round(exp(N(mu, sigma))) clamped to [min, max], mu = ln(mean) - sigma^2 / 2
};
const char* to_string(LengthDist d);

struct LengthConfig {
  LengthDist dist = LengthDist::kFixed;
  uint32_t value = 1;  // kFixed
  uint32_t min = 1;    // kUniform, kLognormal
  uint32_t max = 1;    // kUniform, kLognormal
  double mean = 1.0;   // kLognormal: mean of the unclamped distribution (> 0)
  double sigma = 0.0;  // kLognormal: sigma of the underlying normal (>= 0)

  uint32_t largest() const { return dist == LengthDist::kFixed ? value : max; }
};

// Shared-prefix groups: a `fraction` of the requests joins one of `groups` groups (chosen
// uniformly), sharing its first `tokens` prompt tokens with the group.
struct PrefixConfig {
  uint32_t groups = 0;  // 0: no groups
  uint32_t tokens = 0;
  double fraction = 0.0;  // [0, 1]
};

struct SyntheticRequestsConfig {
  uint64_t count = 0;
  uint64_t seed = 1;
  ArrivalConfig arrival;
  LengthConfig prompt;
  LengthConfig output;
  PrefixConfig prefix;
  uint32_t n = 1;
  uint32_t beam_width = 1;
};

// What a workload holds and how it was adjusted on the way in; one line of it (describe()) is
// meant for the terminal. Counts of adjustments are per request (or per trace row).
struct RequestsSummary {
  std::string source;  // "synthetic" or the trace file's path
  std::string format;  // "synthetic", "azure" or "memsim"
  uint64_t rows = 0;   // trace data rows read (synthetic: requests drawn)
  uint64_t requests = 0;
  uint64_t zero_output_rows = 0;   // trace rows with 0 output tokens (see ZeroOutput)
  uint64_t skipped_rows = 0;       // rows dropped (ZeroOutput::kSkip)
  uint64_t prompts_clamped = 0;    // trace: prompt lowered to max_prompt_tokens
  uint64_t outputs_clamped = 0;    // trace: output lowered to max_output_tokens
  uint64_t prefixes_clamped = 0;   // trace: prefix lowered to the clamped prompt - 1
  uint64_t prompts_raised = 0;     // synthetic: grouped prompt raised to prefix tokens + 1
  uint64_t out_of_order_rows = 0;  // trace rows earlier than a row above them (then sorted)
  uint64_t grouped = 0;            // requests in a prefix group
  SimTime first_arrival = 0;
  SimTime last_arrival = 0;
  double mean_prompt_tokens = 0;
  double mean_output_tokens = 0;
  uint32_t max_prompt_tokens = 0;
  uint32_t max_output_tokens = 0;

  std::string describe() const;
};

struct RequestSet {
  RequestTable requests;
  RequestsSummary summary;
};

// Fills the request statistics of `s` (requests, grouped, arrivals, means, maxima) from `r`.
void summarize_requests(const RequestTable& r, RequestsSummary& s);

// Draws `count` requests. Deterministic for a seed, bit for bit across standard libraries: the
// only randomness is std::mt19937_64's output (one engine per attribute, so changing e.g. the
// prompt distribution leaves the arrivals unchanged), turned into draws by this file's own
// transforms (inverse CDF, Box-Muller, Marsaglia-Tsang, rejection for integers). The first
// request arrives at t = 0; gaps are rounded to whole ns. A grouped request whose drawn prompt
// is at most the prefix length gets prompt = prefix tokens + 1 (counted in prompts_raised).
// Preconditions (std::invalid_argument otherwise): count >= 1; rate > 0 (not burst); cv >= 0;
// 1 <= min <= max <= kMaxRequestTokens and 1 <= value <= kMaxRequestTokens; mean > 0;
// sigma >= 0; groups >= 1 implies 1 <= tokens < prompt.largest() and fraction in [0, 1];
// n >= 1, beam_width >= 1, not both > 1.
RequestSet generate_request_set(const SyntheticRequestsConfig& config);
std::vector<RequestSpec> generate_requests(const SyntheticRequestsConfig& config);

// ---------------------------------------------------------------------------------------------
// Trace files.

enum class TraceFormat : uint8_t {
  kAuto,    // from the header line (required then)
  kMemsim,  // arrival_s,prompt_tokens,output_tokens[,prefix_group,prefix_tokens]
  kAzure,   // TIMESTAMP,ContextTokens,GeneratedTokens (Azure LLM inference trace 2023)
};
const char* to_string(TraceFormat f);

// Rows with 0 output tokens (the Azure 2023 files have none; other traces may).
enum class ZeroOutput : uint8_t {
  kError,  // the row is an error
  kSkip,   // the row is dropped (counted in skipped_rows)
  kOne,    // the request is kept with 1 output token: its arrival and prompt still load the
           // server, and a prefill emits one token anyway (counted in zero_output_rows)
};
const char* to_string(ZeroOutput z);

struct TraceOptions {
  TraceFormat format = TraceFormat::kAuto;
  uint64_t limit = 0;       // keep the first `limit` requests of the file (0: all)
  double time_scale = 1.0;  // multiplies every gap between arrivals (0.5: twice as fast); > 0
  std::optional<uint32_t> max_prompt_tokens;  // clamp, >= 2 (a grouped prompt keeps 1 own token)
  std::optional<uint32_t> max_output_tokens;  // clamp (>= 1)
  ZeroOutput zero_output = ZeroOutput::kOne;
  uint32_t n = 1;
  uint32_t beam_width = 1;
};

// Parses an Azure trace timestamp "YYYY-MM-DD HH:MM:SS[.f...]" (or 'T' between date and time)
// to ns since 1970-01-01 00:00:00 of the same clock (no time zone). Any number of fractional
// digits; digits past the 9th (below 1 ns) are truncated. nullopt when malformed or out of range.
std::optional<int64_t> parse_trace_timestamp(std::string_view text);

// Days from 1970-01-01 to the proleptic Gregorian date y-m-d (negative before 1970).
int64_t days_from_civil(int64_t y, unsigned m, unsigned d);

// About how many lines a trace file of `size` bytes holds (its size over the mean line length of
// three 64 KiB windows: start, middle, end); 0 when it cannot be read.
uint64_t estimate_trace_rows(const std::string& path, uint64_t size);

// Reads a trace file into requests with ids in arrival order. The format comes from the header
// (kAuto; names match case-insensitively) or the option; with a forced format the header line is
// optional. Azure arrivals are relative to the earliest row; memsim arrivals (seconds, decimal
// or exponent notation, exact to the ns) are kept as given. time_scale scales gaps from the
// earliest arrival. `limit` stops reading once that many requests are kept. Rows out of time
// order are sorted stably (counted). Blank lines are skipped; CRLF and a UTF-8 BOM are accepted.
// Errors (kInvalidArgument) read "path:line: column: message" for a bad value, "path:line:
// message" for a bad row or header, "path: message" when the file cannot be read or is empty,
// "path is not a regular file (...)" for a device, FIFO or folder (refused before reading).
// Running out of host memory throws HostMemoryError (core/host_memory.h) naming the rows read.
Result<RequestSet> read_request_trace(const std::string& path, const TraceOptions& options);

}  // namespace memsim
