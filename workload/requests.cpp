// Request workloads: the seeded synthetic generator with its own portable random transforms, and
// the reader for memsim and Azure request trace files (exact ns timestamps, located errors).
#include "workload/requests.h"

#include <fmt/format.h>
#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <numbers>
#include <random>
#include <span>
#include <stdexcept>

#include "core/host_memory.h"
#include "workload/input_file.h"

namespace memsim {

const char* to_string(ArrivalProcess p) {
  switch (p) {
    case ArrivalProcess::kPoisson:
      return "poisson";
    case ArrivalProcess::kGamma:
      return "gamma";
    case ArrivalProcess::kBurst:
      return "burst";
  }
  return "?";
}

const char* to_string(LengthDist d) {
  switch (d) {
    case LengthDist::kFixed:
      return "fixed";
    case LengthDist::kUniform:
      return "uniform";
    case LengthDist::kLognormal:
      return "lognormal";
  }
  return "?";
}

const char* to_string(TraceFormat f) {
  switch (f) {
    case TraceFormat::kAuto:
      return "auto";
    case TraceFormat::kMemsim:
      return "memsim";
    case TraceFormat::kAzure:
      return "azure";
  }
  return "?";
}

const char* to_string(ZeroOutput z) {
  switch (z) {
    case ZeroOutput::kError:
      return "error";
    case ZeroOutput::kSkip:
      return "skip";
    case ZeroOutput::kOne:
      return "one";
  }
  return "?";
}

std::string check_requests(const std::vector<RequestSpec>& requests) {
  return check_requests(RequestTable(requests));
}

std::string check_requests(const RequestTable& requests) {
  SimTime previous = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const RequestSpec r = requests[i];
    const auto bad = [&](const std::string& what) {
      return fmt::format("request {} (index {}): {}", r.id, i, what);
    };
    if (r.id != i) return bad("id is not its index");
    if (r.arrival < previous) return bad("arrives before the request above it");
    previous = r.arrival;
    if (r.prompt_tokens < 1) return bad("has no prompt tokens");
    if (r.output_tokens < 1) return bad("has no output tokens");
    if (r.prefix_group < -1) return bad("prefix_group below -1");
    if (r.prefix_group == -1 && r.prefix_tokens != 0) return bad("prefix tokens without a group");
    if (r.prefix_group >= 0 && (r.prefix_tokens < 1 || r.prefix_tokens >= r.prompt_tokens))
      return bad("prefix_tokens not in [1, prompt_tokens - 1]");
    if (r.n < 1 || r.beam_width < 1) return bad("n and beam_width must be >= 1");
    if (r.beam_width > 1 && r.n != 1) return bad("n > 1 together with beam_width > 1");
  }
  return {};
}

void summarize_requests(const RequestTable& r, RequestsSummary& s) {
  s.requests = r.size();
  s.grouped = 0;
  s.max_prompt_tokens = s.max_output_tokens = 0;
  double prompt_sum = 0, output_sum = 0;
  for (const RequestSpec& q : r) {
    if (q.prefix_group >= 0) ++s.grouped;
    prompt_sum += q.prompt_tokens;
    output_sum += q.output_tokens;
    s.max_prompt_tokens = std::max(s.max_prompt_tokens, q.prompt_tokens);
    s.max_output_tokens = std::max(s.max_output_tokens, q.output_tokens);
  }
  const double count = r.empty() ? 1.0 : static_cast<double>(r.size());
  s.mean_prompt_tokens = prompt_sum / count;
  s.mean_output_tokens = output_sum / count;
  s.first_arrival = r.empty() ? 0 : r.front().arrival;
  s.last_arrival = r.empty() ? 0 : r.back().arrival;
}

std::string RequestsSummary::describe() const {
  std::string line = fmt::format(
      "{} requests from {} ({}), arrivals {:.3f}..{:.3f} s, prompt mean {:.1f} max {}, output "
      "mean {:.1f} max {}",
      requests, source, format, static_cast<double>(first_arrival) * 1e-9,
      static_cast<double>(last_arrival) * 1e-9, mean_prompt_tokens, max_prompt_tokens,
      mean_output_tokens, max_output_tokens);
  if (grouped > 0) line += fmt::format(", {} in prefix groups", grouped);
  std::vector<std::string> notes;
  if (zero_output_rows > 0 && skipped_rows == 0)
    notes.push_back(fmt::format("{} rows with 0 output tokens given 1", zero_output_rows));
  if (skipped_rows > 0) notes.push_back(fmt::format("{} rows with 0 output skipped", skipped_rows));
  if (prompts_clamped > 0) notes.push_back(fmt::format("{} prompts clamped", prompts_clamped));
  if (outputs_clamped > 0) notes.push_back(fmt::format("{} outputs clamped", outputs_clamped));
  if (prefixes_clamped > 0) notes.push_back(fmt::format("{} prefixes clamped", prefixes_clamped));
  if (prompts_raised > 0)
    notes.push_back(fmt::format("{} prompts raised to prefix + 1", prompts_raised));
  if (out_of_order_rows > 0)
    notes.push_back(fmt::format("{} rows out of time order (sorted)", out_of_order_rows));
  if (!notes.empty()) line += fmt::format("; {}", fmt::join(notes, ", "));
  return line;
}

// ---------------------------------------------------------------------------------------------
// Synthetic generator.

namespace {

// SplitMix64 finalizer: spreads a seed and a stream number over all 64 bits.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Draws from one std::mt19937_64 stream, transformed here (not by std distributions, whose
// algorithms differ between standard libraries).
class Draws {
 public:
  Draws(uint64_t seed, uint64_t stream) : rng_(mix64(mix64(seed) ^ stream)) {}

  // [0, 1) on a 2^-53 grid.
  double unit() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }
  // (0, 1]: safe under log.
  double unit_nonzero() { return 1.0 - unit(); }
  // Exponential with mean 1 (inverse CDF).
  double exponential() { return -std::log(unit_nonzero()); }
  // Standard normal (Box-Muller, cosine branch only: one normal per two uniforms).
  double normal() {
    const double radius = std::sqrt(-2.0 * std::log(unit_nonzero()));
    return radius * std::cos(2.0 * std::numbers::pi * unit());
  }
  // Gamma with shape k > 0 and scale 1 (Marsaglia-Tsang; k < 1 through the k + 1 boost).
  double gamma(double k) {
    if (k < 1.0) return gamma(k + 1.0) * std::pow(unit_nonzero(), 1.0 / k);
    const double d = k - 1.0 / 3.0;
    const double c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      const double z = normal();
      const double base = 1.0 + c * z;
      if (base <= 0.0) continue;
      const double v = base * base * base;
      const double u = unit_nonzero();
      if (std::log(u) < 0.5 * z * z + d - d * v + d * std::log(v)) return d * v;
    }
  }
  // Uniform on [0, range), range >= 1, without modulo bias (rejects the short top stretch).
  uint64_t below(uint64_t range) {
    const uint64_t reject_under = (0 - range) % range;  // 2^64 mod range
    for (;;) {
      const uint64_t x = rng_();
      if (x >= reject_under) return x % range;
    }
  }

 private:
  std::mt19937_64 rng_;
};

// Stream numbers: one engine per attribute.
constexpr uint64_t kArrivalStream = 1, kPromptStream = 2, kOutputStream = 3, kPrefixStream = 4;

uint32_t draw_length(const LengthConfig& c, Draws& draws) {
  switch (c.dist) {
    case LengthDist::kFixed:
      return c.value;
    case LengthDist::kUniform:
      return c.min + static_cast<uint32_t>(draws.below(uint64_t{c.max} - c.min + 1));
    case LengthDist::kLognormal: {
      const double mu = std::log(c.mean) - 0.5 * c.sigma * c.sigma;
      const double x = std::floor(std::exp(mu + c.sigma * draws.normal()) + 0.5);
      if (!(x < static_cast<double>(c.max))) return c.max;  // also +inf
      if (x < static_cast<double>(c.min)) return c.min;
      return static_cast<uint32_t>(x);
    }
  }
  return c.min;
}

// Seconds until the next request.
double draw_gap(const ArrivalConfig& a, Draws& draws) {
  switch (a.process) {
    case ArrivalProcess::kBurst:
      return 0.0;
    case ArrivalProcess::kPoisson:
      return draws.exponential() / a.rate;
    case ArrivalProcess::kGamma:
      if (a.cv == 1.0) return draws.exponential() / a.rate;
      if (a.cv == 0.0) return 1.0 / a.rate;
      // Shape 1/cv^2 and scale cv^2/rate give mean 1/rate and coefficient of variation cv.
      return draws.gamma(1.0 / (a.cv * a.cv)) * (a.cv * a.cv) / a.rate;
  }
  return 0.0;
}

void check_length(const LengthConfig& c, const char* what) {
  const auto fail = [&](const char* msg) {
    throw std::invalid_argument(fmt::format("synthetic requests: {} {}", what, msg));
  };
  if (c.dist == LengthDist::kFixed) {
    if (c.value < 1 || c.value > kMaxRequestTokens) fail("value out of range");
    return;
  }
  if (c.min < 1 || c.min > c.max || c.max > kMaxRequestTokens) fail("min/max out of range");
  if (c.dist == LengthDist::kLognormal && !(c.mean > 0.0 && c.sigma >= 0.0 && c.sigma < 1e3))
    fail("mean must be > 0 and sigma >= 0");
}

void check_synthetic(const SyntheticRequestsConfig& c) {
  const auto fail = [](const std::string& msg) {
    throw std::invalid_argument("synthetic requests: " + msg);
  };
  if (c.count < 1) fail("count must be >= 1");
  if (c.arrival.process != ArrivalProcess::kBurst && !(c.arrival.rate > 0.0))
    fail("rate must be > 0");
  if (c.arrival.process == ArrivalProcess::kGamma && !(c.arrival.cv >= 0.0))
    fail("cv must be >= 0");
  check_length(c.prompt, "prompt");
  check_length(c.output, "output");
  if (c.prefix.groups > 0) {
    if (c.prefix.tokens < 1 || c.prefix.tokens >= c.prompt.largest())
      fail("prefix tokens must be in [1, largest prompt - 1]");
    if (!(c.prefix.fraction >= 0.0 && c.prefix.fraction <= 1.0))
      fail("prefix fraction must be in [0, 1]");
  }
  if (c.n < 1 || c.beam_width < 1) fail("n and beam_width must be >= 1");
  if (c.n > 1 && c.beam_width > 1) fail("n > 1 together with beam_width > 1");
}

}  // namespace

RequestSet generate_request_set(const SyntheticRequestsConfig& config) {
  check_synthetic(config);
  Draws arrivals(config.seed, kArrivalStream), prompts(config.seed, kPromptStream);
  Draws outputs(config.seed, kOutputStream), prefixes(config.seed, kPrefixStream);
  RequestSet set;
  set.summary.source = set.summary.format = "synthetic";
  set.summary.rows = config.count;
  try {
    set.requests.reserve(config.count);
    SimTime t = 0;
    for (uint64_t i = 0; i < config.count; ++i) {
      if (i > 0) {
        const double gap_ns = std::round(draw_gap(config.arrival, arrivals) * 1e9);
        if (!(gap_ns < static_cast<double>(std::numeric_limits<SimTime>::max() - t)))
          throw std::invalid_argument("synthetic requests: arrivals pass the simulated time range");
        t += static_cast<SimTime>(gap_ns);
      }
      RequestSpec r;
      r.id = i;
      r.arrival = t;
      r.prompt_tokens = draw_length(config.prompt, prompts);
      r.output_tokens = draw_length(config.output, outputs);
      if (config.prefix.groups > 0 && prefixes.unit() < config.prefix.fraction) {
        r.prefix_group = static_cast<int32_t>(prefixes.below(config.prefix.groups));
        r.prefix_tokens = config.prefix.tokens;
        if (r.prompt_tokens <= r.prefix_tokens) {
          r.prompt_tokens = r.prefix_tokens + 1;
          ++set.summary.prompts_raised;
        }
      }
      r.n = config.n;
      r.beam_width = config.beam_width;
      set.requests.push_back(r);
    }
  } catch (const std::bad_alloc&) {
    throw HostMemoryError(
        fmt::format("memsim: out of host memory while generating {} synthetic requests ({} "
                    "generated, {} held)",
                    config.count, set.requests.size(), format_host_bytes(set.requests.bytes())));
  }
  summarize_requests(set.requests, set.summary);
  return set;
}

std::vector<RequestSpec> generate_requests(const SyntheticRequestsConfig& config) {
  return generate_request_set(config).requests.to_vector();
}

// ---------------------------------------------------------------------------------------------
// Timestamps.

namespace {

int64_t floor_div(int64_t a, int64_t b) {
  return a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
}

// Leap years in [1, y] of the proleptic Gregorian calendar (negative counts for y < 0).
int64_t leap_years_through(int64_t y) {
  return floor_div(y, 4) - floor_div(y, 100) + floor_div(y, 400);
}

bool is_leap(int64_t y) {
  return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

unsigned days_in_month(int64_t y, unsigned m) {
  static constexpr unsigned kDays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return m == 2 && is_leap(y) ? 29 : kDays[m - 1];
}

// Reads exactly `width` decimal digits at `pos`.
std::optional<unsigned> fixed_digits(std::string_view s, size_t pos, size_t width) {
  if (pos + width > s.size()) return std::nullopt;
  unsigned v = 0;
  for (size_t i = pos; i < pos + width; ++i) {
    if (s[i] < '0' || s[i] > '9') return std::nullopt;
    v = v * 10 + static_cast<unsigned>(s[i] - '0');
  }
  return v;
}

}  // namespace

int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
  static constexpr unsigned kBeforeMonth[12] = {0,   31,  59,  90,  120, 151,
                                                181, 212, 243, 273, 304, 334};
  const int64_t leap_days = leap_years_through(y - 1) - leap_years_through(1969);
  const int64_t in_year = kBeforeMonth[m - 1] + (m > 2 && is_leap(y) ? 1 : 0) + d - 1;
  return (y - 1970) * 365 + leap_days + in_year;
}

std::optional<int64_t> parse_trace_timestamp(std::string_view s) {
  // YYYY-MM-DD HH:MM:SS, then optionally '.' and one or more digits.
  if (s.size() < 19 || s[4] != '-' || s[7] != '-' || (s[10] != ' ' && s[10] != 'T') ||
      s[13] != ':' || s[16] != ':')
    return std::nullopt;
  const auto year = fixed_digits(s, 0, 4), month = fixed_digits(s, 5, 2);
  const auto day = fixed_digits(s, 8, 2), hour = fixed_digits(s, 11, 2);
  const auto minute = fixed_digits(s, 14, 2), second = fixed_digits(s, 17, 2);
  if (!year || !month || !day || !hour || !minute || !second) return std::nullopt;
  // int64 ns reach 1677..2262; keep well inside.
  if (*year < 1900 || *year > 2200 || *month < 1 || *month > 12 || *day < 1 ||
      *day > days_in_month(*year, *month) || *hour > 23 || *minute > 59 || *second > 59)
    return std::nullopt;
  int64_t frac_ns = 0;
  if (s.size() > 19) {
    if (s[19] != '.' || s.size() == 20) return std::nullopt;
    int64_t scale = 100000000;  // the first fractional digit's ns
    for (size_t i = 20; i < s.size(); ++i) {
      if (s[i] < '0' || s[i] > '9') return std::nullopt;
      frac_ns += (s[i] - '0') * scale;
      scale /= 10;  // 0 past the 9th digit: truncated
    }
  }
  const int64_t seconds =
      days_from_civil(*year, *month, *day) * 86400 + *hour * 3600 + *minute * 60 + *second;
  return seconds * 1000000000 + frac_ns;
}

// ---------------------------------------------------------------------------------------------
// Trace reading.

namespace {

constexpr SimTime kMaxTraceArrival = 1000000000ll * 1000000000ll;  // 1e9 s

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> out;
  for (;;) {
    const size_t comma = line.find(',');
    out.push_back(trim(line.substr(0, comma)));
    if (comma == std::string_view::npos) return out;
    line.remove_prefix(comma + 1);
  }
}

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

// Header names match case-insensitively.
bool fields_are(const std::vector<std::string_view>& fields,
                std::span<const std::string_view> names) {
  if (fields.size() != names.size()) return false;
  for (size_t i = 0; i < names.size(); ++i)
    if (!iequal(fields[i], names[i])) return false;
  return true;
}

constexpr std::array<std::string_view, 3> kAzureColumns = {"TIMESTAMP", "ContextTokens",
                                                           "GeneratedTokens"};
constexpr std::array<std::string_view, 5> kMemsimColumns = {
    "arrival_s", "prompt_tokens", "output_tokens", "prefix_group", "prefix_tokens"};

}  // namespace

uint64_t estimate_trace_rows(const std::string& path, uint64_t size) {
  constexpr uint64_t kWindow = 64 * 1024;
  std::ifstream in(path, std::ios::binary);
  if (!in || size == 0) return 0;
  uint64_t bytes = 0, lines = 0;
  std::string buf(kWindow, '\0');
  // Lines of three windows (start, middle, end): arrival columns grow wider down a file.
  for (const uint64_t at : {uint64_t{0}, size / 2, size > kWindow ? size - kWindow : 0}) {
    in.clear();
    in.seekg(static_cast<std::streamoff>(at));
    in.read(buf.data(), static_cast<std::streamsize>(kWindow));
    const std::string_view window(buf.data(), static_cast<size_t>(in.gcount()));
    // Whole lines only: from the first line start in the window to its last newline.
    const size_t begin = at == 0 ? 0 : window.find('\n');
    const size_t end = window.rfind('\n');
    if (begin == std::string_view::npos || end == std::string_view::npos || end < begin) continue;
    const std::string_view whole = window.substr(begin, end - begin);
    bytes += whole.size() + (at == 0 ? 1 : 0);
    lines += static_cast<uint64_t>(std::count(whole.begin(), whole.end(), '\n')) + (at == 0);
  }
  if (lines == 0 || bytes == 0) return 1;
  return static_cast<uint64_t>(static_cast<double>(size) * static_cast<double>(lines) /
                               static_cast<double>(bytes)) +
         1;
}

namespace {

// Reads one CSV file; every error is a Result carrying "path:line: ..." text.
class TraceReader {
 public:
  TraceReader(std::string path, const TraceOptions& options)
      : path_(std::move(path)), options_(options) {}

  // Refuses anything but a regular file before opening it, then reads it; running out of host
  // memory on the way throws HostMemoryError (how many rows were read).
  Result<RequestSet> read() {
    if (std::string e = special_file_error(path_); !e.empty())
      return Error{ErrorCode::kInvalidArgument, e};
    try {
      // Room for every row at once: no copies of growing columns.
      std::error_code ec;
      const uint64_t size = std::filesystem::file_size(path_, ec);
      const uint64_t rows = ec ? 0 : estimate_trace_rows(path_, size);
      set_.requests.reserve(options_.limit > 0 ? std::min(rows, options_.limit) : rows);
      Result<RequestSet> r = read_rows();
      // A file whose first lines are shorter than the rest leaves room never used.
      if (set_.requests.bytes() > set_.requests.size() * RequestTable::kBytesPerRequest * 9 / 8)
        set_.requests.shrink_to_fit();
      return r.ok() ? Result<RequestSet>(std::move(set_)) : r;
    } catch (const std::bad_alloc&) {
      throw HostMemoryError(fmt::format(
          "memsim: out of host memory while reading the trace {} ({} rows read, {} held)", path_,
          set_.summary.rows, format_host_bytes(set_.requests.bytes())));
    }
  }

 private:
  // Reads every row into set_ (returned empty on success: read() moves set_ out).
  Result<RequestSet> read_rows() {
    std::ifstream in(path_, std::ios::binary);
    if (!in) return Error{ErrorCode::kInvalidArgument, fmt::format("{}: cannot open", path_)};
    if (auto e = check_options()) return *e;
    std::string text;
    bool header_seen = false;
    while (std::getline(in, text)) {
      ++line_;
      std::string_view view = text;
      if (line_ == 1 && view.substr(0, 3) == "\xEF\xBB\xBF") view.remove_prefix(3);
      if (trim(view).empty()) continue;
      const std::vector<std::string_view> fields = split_fields(view);
      if (!header_seen) {
        header_seen = true;
        if (auto e = read_header(view, fields)) return *e;
        if (header_) continue;  // else a forced format without a header: this line is data
      }
      if (auto e = read_row(fields)) return *e;
      if (options_.limit > 0 && set_.requests.size() == options_.limit) break;
    }
    if (in.bad()) return located_error("read error");
    if (!header_seen) return Error{ErrorCode::kInvalidArgument, fmt::format("{}: empty", path_)};
    if (set_.requests.empty())
      return Error{ErrorCode::kInvalidArgument, fmt::format("{}: no requests", path_)};
    if (auto e = finish()) return *e;
    return RequestSet{};
  }

  Error located_error(const std::string& message) const {
    return Error{ErrorCode::kInvalidArgument, fmt::format("{}:{}: {}", path_, line_, message)};
  }
  Error column_error(size_t column, const std::string& message) const {
    return located_error(fmt::format("{}: {}", columns_[column], message));
  }

  std::optional<Error> check_options() const {
    const auto bad = [&](const char* what) {
      return Error{ErrorCode::kInvalidArgument, fmt::format("{}: trace option {}", path_, what)};
    };
    if (!(options_.time_scale > 0.0 && std::isfinite(options_.time_scale)))
      return bad("time_scale must be > 0");
    if (options_.max_prompt_tokens && *options_.max_prompt_tokens < 2)
      return bad("max_prompt_tokens must be >= 2");
    if (options_.max_output_tokens && *options_.max_output_tokens < 1)
      return bad("max_output_tokens must be >= 1");
    if (options_.n < 1 || options_.beam_width < 1 || (options_.n > 1 && options_.beam_width > 1))
      return bad("n and beam_width must be >= 1, not both > 1");
    return std::nullopt;
  }

  // Sets format_, columns_ and header_ (whether this line was a header).
  std::optional<Error> read_header(std::string_view line,
                                   const std::vector<std::string_view>& fields) {
    const bool azure = fields_are(fields, kAzureColumns);
    const bool memsim5 = fields_are(fields, kMemsimColumns);
    const bool memsim3 = fields_are(fields, std::span(kMemsimColumns).first(3));
    format_ = options_.format;
    if (format_ == TraceFormat::kAuto && (azure || memsim3 || memsim5))
      format_ = azure ? TraceFormat::kAzure : TraceFormat::kMemsim;
    header_ = format_ == TraceFormat::kAzure ? azure : (memsim3 || memsim5);
    if (format_ == TraceFormat::kAuto)
      return located_error(
          fmt::format("unknown header '{}' (expected '{}' or '{}[,{}]')", trim(line),
                      fmt::join(kAzureColumns, ","),
                      fmt::join(kMemsimColumns.begin(), kMemsimColumns.begin() + 3, ","),
                      fmt::join(kMemsimColumns.begin() + 3, kMemsimColumns.end(), ",")));
    const bool five = format_ == TraceFormat::kMemsim && (header_ ? memsim5 : fields.size() == 5);
    const std::span<const std::string_view> names =
        format_ == TraceFormat::kAzure ? std::span<const std::string_view>(kAzureColumns)
                                       : std::span<const std::string_view>(kMemsimColumns);
    columns_.assign(names.begin(), names.begin() + (five ? 5 : 3));
    return std::nullopt;
  }

  // A whole number in [0, hi] (a leading '-' reads as a negative value).
  std::optional<uint64_t> parse_whole(size_t column, std::string_view s, uint64_t hi,
                                      std::optional<Error>& error) const {
    if (s.empty()) {
      error = column_error(column, "is empty");
    } else if (s[0] == '-' && s.size() > 1 && s.find_first_not_of("0123456789", 1) == s.npos) {
      error = column_error(column, fmt::format("must not be negative, got '{}'", s));
    } else if (s.find_first_not_of("0123456789") != s.npos) {
      error = column_error(column, fmt::format("expected a whole number, got '{}'", s));
    } else {
      uint64_t v = 0;
      for (char c : s) {
        v = v * 10 + static_cast<uint64_t>(c - '0');
        if (v > hi) {
          error = column_error(column, fmt::format("{} is out of range [0, {}]", s, hi));
          return std::nullopt;
        }
      }
      return v;
    }
    return std::nullopt;
  }

  // Decimal seconds ("12", "0.25", ".5", "1.5e-3") to ns, exactly (half-up past the 9th digit).
  std::optional<SimTime> parse_seconds(std::string_view s, std::optional<Error>& error) const {
    const auto malformed = [&] {
      error = column_error(0, fmt::format("expected a time in seconds, got '{}'", s));
      return std::nullopt;
    };
    bool negative = false;
    size_t i = 0;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
    std::string digits;
    int64_t exponent = 0;  // value = digits * 10^exponent
    bool any_digit = false, point = false;
    for (; i < s.size() && ((s[i] >= '0' && s[i] <= '9') || (s[i] == '.' && !point)); ++i) {
      if (s[i] == '.') {
        point = true;
        continue;
      }
      any_digit = true;
      if (digits.empty() && s[i] == '0') {
        if (point) --exponent;
        continue;
      }
      digits.push_back(s[i]);
      if (point) --exponent;
    }
    if (!any_digit) return malformed();
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
      ++i;
      bool exp_negative = false;
      if (i < s.size() && (s[i] == '+' || s[i] == '-')) exp_negative = s[i++] == '-';
      if (i == s.size()) return malformed();
      int64_t e = 0;
      for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i)
        e = std::min<int64_t>(e * 10 + (s[i] - '0'), 100000);
      exponent += exp_negative ? -e : e;
    }
    if (i != s.size()) return malformed();
    if (digits.empty()) return SimTime{0};
    if (negative) {
      error = column_error(0, fmt::format("must not be negative, got '{}'", s));
      return std::nullopt;
    }
    // ns = digits * 10^(exponent + 9): keep the digits above 1 ns, round on the next one.
    const int64_t shift = exponent + 9;
    const int64_t kept = static_cast<int64_t>(digits.size()) + std::min<int64_t>(shift, 0);
    const auto too_late = [&] {
      error = column_error(0, fmt::format("{} is later than 1e9 s", s));
      return std::nullopt;
    };
    if (kept + std::max<int64_t>(shift, 0) > 19) return too_late();
    uint64_t ns = 0;  // below 1e19 (at most 19 digits)
    for (int64_t k = 0; k < kept; ++k)
      ns = ns * 10 + static_cast<uint64_t>(digits[static_cast<size_t>(k)] - '0');
    for (int64_t k = 0; k < shift; ++k) ns *= 10;
    if (kept >= 0 && kept < static_cast<int64_t>(digits.size()) &&
        digits[static_cast<size_t>(kept)] >= '5')
      ++ns;
    if (ns > static_cast<uint64_t>(kMaxTraceArrival)) return too_late();
    return static_cast<SimTime>(ns);
  }

  std::optional<Error> read_row(const std::vector<std::string_view>& f) {
    if (f.size() != columns_.size())
      return located_error(fmt::format("expected {} columns ({}), got {}", columns_.size(),
                                       fmt::join(columns_, ","), f.size()));
    ++set_.summary.rows;
    std::optional<Error> error;
    RequestSpec r;
    if (format_ == TraceFormat::kAzure) {
      const auto t = parse_trace_timestamp(f[0]);
      if (!t)
        return column_error(
            0, fmt::format("expected a time like 2023-11-16 18:15:46.6805900, got '{}'", f[0]));
      // Later rows are made relative to the earliest: keep every spread within 1e9 s.
      if (!azure_origin_) azure_origin_ = *t;
      if (std::abs(static_cast<double>(*t) - static_cast<double>(*azure_origin_)) > 1e18)
        return column_error(0, fmt::format("'{}' is more than 1e9 s from the first row", f[0]));
      r.arrival = *t;
    } else {
      const auto t = parse_seconds(f[0], error);
      if (!t) return error;
      r.arrival = *t;
    }
    const auto prompt = parse_whole(1, f[1], kMaxRequestTokens, error);
    if (!prompt) return error;
    if (*prompt == 0) return column_error(1, "must be at least 1, got 0");
    const auto output = parse_whole(2, f[2], kMaxRequestTokens, error);
    if (!output) return error;
    r.prompt_tokens = static_cast<uint32_t>(*prompt);
    r.output_tokens = static_cast<uint32_t>(*output);
    if (r.output_tokens == 0) {
      ++set_.summary.zero_output_rows;
      if (options_.zero_output == ZeroOutput::kError)
        return column_error(2, "is 0 (set the trace option zero_output to skip or one)");
      if (options_.zero_output == ZeroOutput::kSkip) {
        ++set_.summary.skipped_rows;
        return std::nullopt;
      }
      r.output_tokens = 1;
    }
    if (columns_.size() == 5) {
      if (auto e = read_prefix(f, r)) return e;
    }
    if (options_.max_prompt_tokens && r.prompt_tokens > *options_.max_prompt_tokens) {
      r.prompt_tokens = *options_.max_prompt_tokens;
      ++set_.summary.prompts_clamped;
      if (r.prefix_group >= 0 && r.prefix_tokens >= r.prompt_tokens) {
        r.prefix_tokens = r.prompt_tokens - 1;
        ++set_.summary.prefixes_clamped;
      }
    }
    if (options_.max_output_tokens && r.output_tokens > *options_.max_output_tokens) {
      r.output_tokens = *options_.max_output_tokens;
      ++set_.summary.outputs_clamped;
    }
    r.n = options_.n;
    r.beam_width = options_.beam_width;
    r.id = set_.requests.size();
    set_.requests.push_back(r);
    return std::nullopt;
  }

  std::optional<Error> read_prefix(const std::vector<std::string_view>& f, RequestSpec& r) const {
    std::optional<Error> error;
    int64_t group = 0;
    if (f[3] == "-1") {
      group = -1;
    } else {
      const auto g = parse_whole(3, f[3], std::numeric_limits<int32_t>::max(), error);
      if (!g) {
        if (f[3].size() > 1 && f[3][0] == '-')
          return column_error(3, fmt::format("must be -1 (none) or >= 0, got '{}'", f[3]));
        return error;
      }
      group = static_cast<int64_t>(*g);
    }
    const auto tokens = parse_whole(4, f[4], kMaxRequestTokens, error);
    if (!tokens) return error;
    if (group == -1 && *tokens != 0)
      return column_error(4, fmt::format("must be 0 when prefix_group is -1, got {}", *tokens));
    if (group >= 0 && (*tokens < 1 || *tokens >= r.prompt_tokens))
      return column_error(4, fmt::format("must be in [1, prompt_tokens - 1] = [1, {}], got {}",
                                         r.prompt_tokens - 1, *tokens));
    r.prefix_group = static_cast<int32_t>(group);
    r.prefix_tokens = static_cast<uint32_t>(*tokens);
    return std::nullopt;
  }

  // Sorts by time, makes Azure times relative, scales gaps (ids are the indices).
  std::optional<Error> finish() {
    RequestTable& r = set_.requests;
    SimTime latest = std::numeric_limits<SimTime>::min();
    for (size_t i = 0; i < r.size(); ++i) {
      if (r.arrival(i) < latest) ++set_.summary.out_of_order_rows;
      latest = std::max(latest, r.arrival(i));
    }
    r.stable_sort_by_arrival(/*renumber=*/true);
    const SimTime first = r.arrival(0);
    const SimTime origin = format_ == TraceFormat::kAzure ? 0 : first;
    for (size_t i = 0; i < r.size(); ++i) {
      SimTime gap = r.arrival(i) - first;
      if (options_.time_scale != 1.0) {
        const double scaled = std::round(static_cast<double>(gap) * options_.time_scale);
        if (scaled > static_cast<double>(kMaxTraceArrival - origin))
          return Error{ErrorCode::kInvalidArgument,
                       fmt::format("{}: time_scale {} moves arrivals past 1e9 s", path_,
                                   options_.time_scale)};
        gap = static_cast<SimTime>(scaled);
      }
      r.set_arrival(i, origin + gap);
    }
    set_.summary.source = path_;
    set_.summary.format = to_string(format_);
    summarize_requests(r, set_.summary);
    return std::nullopt;
  }

  std::string path_;
  TraceOptions options_;
  TraceFormat format_ = TraceFormat::kAuto;
  std::vector<std::string_view> columns_;
  bool header_ = false;  // the first line was a header
  std::optional<SimTime> azure_origin_;
  uint64_t line_ = 0;
  RequestSet set_;
};

}  // namespace

Result<RequestSet> read_request_trace(const std::string& path, const TraceOptions& options) {
  return TraceReader(path, options).read();
}

}  // namespace memsim
