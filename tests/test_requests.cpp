// Request workloads: the synthetic generator's statistics and determinism, exact trace parsing
// (Azure timestamps, memsim CSV, the shipped Azure 2023 files), located errors, the loader, the
// packed request table, special files and host-memory limits.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <fmt/format.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/host_memory.h"
#include "workload/requests.h"
#include "src/config/config_node.h"
#include "src/config/requests_loader.h"
#include "tests/config_test_util.h"
#include "tests/host_memory_test_util.h"
#include "tests/temp_dir.h"

using namespace memsim;
using namespace memsim::test;  // NOLINT(google-build-using-namespace)
namespace fs = std::filesystem;

namespace {

SyntheticRequestsConfig base_config(uint64_t count) {
  SyntheticRequestsConfig c;
  c.count = count;
  c.seed = 7;
  c.arrival = {ArrivalProcess::kPoisson, 20.0, 1.0};
  c.prompt.dist = LengthDist::kFixed;
  c.prompt.value = 100;
  c.output.dist = LengthDist::kFixed;
  c.output.value = 10;
  return c;
}

LengthConfig uniform(uint32_t lo, uint32_t hi) {
  LengthConfig l;
  l.dist = LengthDist::kUniform;
  l.min = lo;
  l.max = hi;
  return l;
}

LengthConfig lognormal(double mean, double sigma, uint32_t lo, uint32_t hi) {
  LengthConfig l;
  l.dist = LengthDist::kLognormal;
  l.mean = mean;
  l.sigma = sigma;
  l.min = lo;
  l.max = hi;
  return l;
}

bool same(const RequestSpec& a, const RequestSpec& b) {
  return a.id == b.id && a.arrival == b.arrival && a.prompt_tokens == b.prompt_tokens &&
         a.output_tokens == b.output_tokens && a.prefix_group == b.prefix_group &&
         a.prefix_tokens == b.prefix_tokens && a.n == b.n && a.beam_width == b.beam_width;
}

bool same(const std::vector<RequestSpec>& a, const std::vector<RequestSpec>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same(a[i], b[i])) return false;
  return true;
}

// Mean and coefficient of variation of the gaps between arrivals, in seconds.
std::pair<double, double> gap_stats(const std::vector<RequestSpec>& r) {
  double sum = 0, sum_sq = 0;
  const double n = static_cast<double>(r.size() - 1);
  for (size_t i = 1; i < r.size(); ++i) {
    const double g = static_cast<double>(r[i].arrival - r[i - 1].arrival) * 1e-9;
    sum += g;
    sum_sq += g * g;
  }
  const double mean = sum / n;
  return {mean, std::sqrt(sum_sq / n - mean * mean) / mean};
}

std::string azure_file(const std::string& name) {
  return (fs::path(source_root()) / "data" / "azure-llm-2023" / name).string();
}

RequestSet read_ok(const std::string& path, const TraceOptions& options = {}) {
  Result<RequestSet> r = read_request_trace(path, options);
  INFO((r.ok() ? std::string() : r.error().message));
  REQUIRE(r.ok());
  CHECK(check_requests(r->requests).empty());
  return std::move(r).value();
}

std::string read_error(const std::string& path, const TraceOptions& options = {}) {
  Result<RequestSet> r = read_request_trace(path, options);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == ErrorCode::kInvalidArgument);
  return r.error().message;
}

std::string config_error(const std::string& path) {
  try {
    build_requests(load_requests_config(ConfigNode::load_file(path)["requests"]));
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("expected a ConfigError from " << path);
  return {};
}

constexpr int64_t kSecond = 1000000000;

}  // namespace

// ------------------------------------------------------------------------------------------
// Synthetic generator.

TEST_CASE("a seed gives the same requests; another seed others", "[requests]") {
  SyntheticRequestsConfig c = base_config(500);
  c.prompt = lognormal(1024, 0.8, 16, 8192);
  c.output = uniform(64, 512);
  c.prefix = {8, 12, 0.5};
  const std::vector<RequestSpec> a = generate_requests(c);
  CHECK(same(a, generate_requests(c)));
  CHECK(check_requests(a).empty());
  REQUIRE(a.size() == 500u);
  CHECK(a.front().arrival == 0);
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].id == i);
  c.seed = 8;
  CHECK_FALSE(same(a, generate_requests(c)));
  // One random stream per attribute: another prompt distribution keeps arrivals and outputs.
  c.seed = 7;
  c.prompt = uniform(2000, 3000);
  const std::vector<RequestSpec> b = generate_requests(c);
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(b[i].arrival == a[i].arrival);
    CHECK(b[i].output_tokens == a[i].output_tokens);
    CHECK(b[i].prefix_group == a[i].prefix_group);
  }
}

TEST_CASE("fixed lengths are exact, uniform ones stay in bounds and reach both", "[requests]") {
  SyntheticRequestsConfig c = base_config(20000);
  c.n = 4;
  for (const RequestSpec& r : generate_requests(c)) {
    CHECK(r.prompt_tokens == 100u);
    CHECK(r.output_tokens == 10u);
    CHECK(r.prefix_group == -1);
    CHECK(r.n == 4u);
    CHECK(r.beam_width == 1u);
  }
  c.prompt = uniform(5, 9);
  c.output = uniform(1, 1);
  std::set<uint32_t> seen;
  for (const RequestSpec& r : generate_requests(c)) {
    CHECK(r.prompt_tokens >= 5u);
    CHECK(r.prompt_tokens <= 9u);
    CHECK(r.output_tokens == 1u);
    seen.insert(r.prompt_tokens);
  }
  CHECK(seen == std::set<uint32_t>{5, 6, 7, 8, 9});
}

TEST_CASE("lognormal lengths have the configured mean and are clamped", "[requests]") {
  SyntheticRequestsConfig c = base_config(100000);
  c.prompt = lognormal(1024, 0.8, 1, kMaxRequestTokens);
  const RequestSet wide = generate_request_set(c);
  INFO("mean " << wide.summary.mean_prompt_tokens);
  CHECK(std::abs(wide.summary.mean_prompt_tokens / 1024.0 - 1.0) < 0.015);
  // The median of a lognormal is exp(mu) = mean * exp(-sigma^2 / 2).
  std::vector<uint32_t> sorted;
  for (const RequestSpec& r : wide.requests) sorted.push_back(r.prompt_tokens);
  std::sort(sorted.begin(), sorted.end());
  CHECK(std::abs(sorted[sorted.size() / 2] / (1024.0 * std::exp(-0.32)) - 1.0) < 0.02);

  c.prompt = lognormal(1024, 0.8, 256, 2048);
  bool hit_min = false, hit_max = false;
  for (const RequestSpec& r : generate_requests(c)) {
    CHECK(r.prompt_tokens >= 256u);
    CHECK(r.prompt_tokens <= 2048u);
    hit_min |= r.prompt_tokens == 256u;
    hit_max |= r.prompt_tokens == 2048u;
  }
  CHECK(hit_min);
  CHECK(hit_max);
  c.prompt = lognormal(300, 0.0, 1, 1000);  // sigma 0: the mean exactly
  for (const RequestSpec& r : generate_requests(c)) CHECK(r.prompt_tokens == 300u);
}

TEST_CASE("Poisson gaps average 1/rate with cv 1; gamma gaps have the configured cv",
          "[requests]") {
  SyntheticRequestsConfig c = base_config(100001);
  const auto [mean, cv] = gap_stats(generate_requests(c));
  CHECK(std::abs(mean * 20.0 - 1.0) < 0.01);
  CHECK(std::abs(cv - 1.0) < 0.02);

  for (double want : {0.5, 3.0}) {
    c.arrival = {ArrivalProcess::kGamma, 50.0, want};
    const auto [g_mean, g_cv] = gap_stats(generate_requests(c));
    INFO("cv " << want << ": mean " << g_mean << " cv " << g_cv);
    CHECK(std::abs(g_mean * 50.0 - 1.0) < 0.03);
    CHECK(std::abs(g_cv / want - 1.0) < 0.05);
  }
  // cv 1 is the Poisson sequence itself; cv 0 spaces requests evenly; burst puts all at 0.
  c.count = 1000;
  c.arrival = {ArrivalProcess::kGamma, 20.0, 1.0};
  const std::vector<RequestSpec> g1 = generate_requests(c);
  c.arrival = {ArrivalProcess::kPoisson, 20.0, 1.0};
  CHECK(same(g1, generate_requests(c)));
  c.arrival = {ArrivalProcess::kGamma, 8.0, 0.0};
  const std::vector<RequestSpec> even = generate_requests(c);
  for (size_t i = 0; i < even.size(); ++i)
    CHECK(even[i].arrival == static_cast<SimTime>(i) * 125000000);
  c.arrival = {ArrivalProcess::kBurst, 0.0, 1.0};
  for (const RequestSpec& r : generate_requests(c)) CHECK(r.arrival == 0);
}

TEST_CASE("prefix groups: fraction, uniform groups, prompts raised to prefix + 1", "[requests]") {
  SyntheticRequestsConfig c = base_config(40000);
  c.prompt = uniform(1, 200);
  const std::vector<RequestSpec> plain = generate_requests(c);
  c.prefix = {8, 50, 1.0};
  const RequestSet grouped = generate_request_set(c);
  CHECK(check_requests(grouped.requests).empty());
  CHECK(grouped.summary.grouped == 40000u);
  uint64_t raised = 0;
  std::vector<uint64_t> per_group(8, 0);
  for (size_t i = 0; i < plain.size(); ++i) {
    const RequestSpec& r = grouped.requests[i];
    REQUIRE(r.prefix_group >= 0);
    REQUIRE(r.prefix_group < 8);
    ++per_group[static_cast<size_t>(r.prefix_group)];
    CHECK(r.prefix_tokens == 50u);
    if (plain[i].prompt_tokens <= 50) {
      ++raised;
      CHECK(r.prompt_tokens == 51u);
    } else {
      CHECK(r.prompt_tokens == plain[i].prompt_tokens);
    }
  }
  CHECK(grouped.summary.prompts_raised == raised);
  CHECK(raised > 9000u);  // 50 of 200 lengths
  for (uint64_t g : per_group) CHECK(std::abs(static_cast<double>(g) / 5000.0 - 1.0) < 0.06);

  c.prefix.fraction = 0.25;
  const RequestSet quarter = generate_request_set(c);
  CHECK(std::abs(static_cast<double>(quarter.summary.grouped) / 10000.0 - 1.0) < 0.04);
  for (const RequestSpec& r : quarter.requests)
    if (r.prefix_group < 0) CHECK(r.prefix_tokens == 0u);
}

TEST_CASE("the generator rejects configs outside its preconditions", "[requests]") {
  SyntheticRequestsConfig c = base_config(0);
  CHECK_THROWS_AS(generate_requests(c), std::invalid_argument);
  c = base_config(10);
  c.prefix = {2, 100, 1.0};  // prefix as long as every prompt
  CHECK_THROWS_AS(generate_requests(c), std::invalid_argument);
  c = base_config(10);
  c.n = 2;
  c.beam_width = 2;
  CHECK_THROWS_AS(generate_requests(c), std::invalid_argument);
}

// ------------------------------------------------------------------------------------------
// Timestamps and trace files.

TEST_CASE("Azure timestamps parse to exact ns across midnight, month and year ends", "[requests]") {
  CHECK(days_from_civil(1970, 1, 1) == 0);
  CHECK(days_from_civil(1969, 12, 31) == -1);
  CHECK(days_from_civil(2000, 3, 1) == 11017);
  CHECK(days_from_civil(1900, 1, 1) == -25567);
  CHECK(days_from_civil(2023, 11, 16) == 19677);
  CHECK(parse_trace_timestamp("1970-01-01 00:00:00") == 0);
  CHECK(parse_trace_timestamp("2023-11-16 18:15:46.6805900") == 1700158546680590000);
  CHECK(parse_trace_timestamp("2023-11-16T18:15:46.68059") == 1700158546680590000);
  const auto at = [](const char* s) { return parse_trace_timestamp(s).value(); };
  CHECK(at("2023-11-16 00:00:00.000000001") - at("2023-11-15 23:59:59.999999999") == 2);
  CHECK(at("2024-01-01 00:00:00.1") - at("2023-12-31 23:59:59.9999999") == 100000100);
  CHECK(at("2024-03-01 00:00:00") - at("2024-02-28 23:59:59.5") == kSecond * 86400 + kSecond / 2);
  CHECK(at("2023-03-01 00:00:00") - at("2023-02-28 23:59:59.5") == kSecond / 2);
  CHECK(at("2023-12-01 00:00:00") - at("2023-11-30 23:59:59") == kSecond);
  CHECK(at("2023-11-16 18:15:46.5") == at("2023-11-16 18:15:46") + 500000000);
  CHECK(at("2023-11-16 18:15:46.1234567899") == at("2023-11-16 18:15:46") + 123456789);
  for (const char* bad :
       {"2023-02-29 00:00:00", "2023-11-31 00:00:00", "2023-11-16 24:00:00", "2023-11-16 18:60:00",
        "2023-11-16 18:15:46.", "2023/11/16 18:15:46", "2023-11-16 18:15:46Z", "2023-11-16",
        "23-11-16 18:15:46", "2023-11-16 18:15:46.12a", "1800-01-01 00:00:00"})
    CHECK_FALSE(parse_trace_timestamp(bad).has_value());
}

TEST_CASE("the shipped Azure 2023 traces load exactly", "[requests]") {
  const RequestSet conv = read_ok(azure_file("conv.csv"));
  REQUIRE(conv.requests.size() == 19366u);
  CHECK(conv.summary.rows == 19366u);
  CHECK(conv.summary.format == "azure");
  CHECK(conv.summary.zero_output_rows == 0u);
  CHECK(conv.summary.out_of_order_rows == 0u);
  const std::vector<RequestSpec> r = conv.requests.to_vector();
  CHECK(r[0].arrival == 0);
  CHECK(r[0].prompt_tokens == 374u);
  CHECK(r[0].output_tokens == 44u);
  CHECK(r[1].arrival == 4314579000);
  CHECK(r[1].prompt_tokens == 396u);
  CHECK(r[1].output_tokens == 109u);
  CHECK(r[2].arrival == 4541877000);
  CHECK(r[2].prompt_tokens == 879u);
  CHECK(r[2].output_tokens == 55u);
  CHECK(r.back().id == 19365u);
  CHECK(r.back().arrival == 3501721937000);
  CHECK(r.back().prompt_tokens == 197u);
  CHECK(r.back().output_tokens == 183u);
  CHECK(conv.summary.last_arrival == 3501721937000);
  CHECK(conv.summary.max_prompt_tokens == 14050u);
  CHECK(conv.summary.max_output_tokens == 1000u);
  CHECK(std::abs(conv.summary.mean_prompt_tokens - 1154.697) < 0.001);

  const RequestSet code = read_ok(azure_file("code.csv"));
  REQUIRE(code.requests.size() == 8819u);
  CHECK(code.requests[1].arrival == 52000000);
  CHECK(code.requests[1].prompt_tokens == 3180u);

  TraceOptions o;
  o.limit = 100;
  o.time_scale = 0.5;
  o.max_prompt_tokens = 800;
  o.n = 3;
  const RequestSet cut = read_ok(azure_file("conv.csv"), o);
  REQUIRE(cut.requests.size() == 100u);
  CHECK(cut.requests[1].arrival == 2157289500);
  CHECK(cut.requests[2].prompt_tokens == 800u);
  CHECK(cut.requests[2].n == 3u);
  CHECK(cut.summary.prompts_clamped > 0u);
}

TEST_CASE("memsim CSV traces: exact seconds, prefixes, sorting, forced format", "[requests]") {
  TempDir dir;
  const std::string path =
      dir.write("t.csv",
                "\xEF\xBB\xBF"
                "arrival_s,prompt_tokens,output_tokens,prefix_group,prefix_tokens\r\n"
                "0.5,100,10,0,64\r\n"
                "\r\n"
                "1.25e-1, 20 ,5,-1,0\r\n"
                "0.5000000004,30,0,3,29\r\n"
                "12,40,7,-1,0");
  const RequestSet s = read_ok(path);
  CHECK(s.summary.format == "memsim");
  CHECK(s.summary.out_of_order_rows == 1u);
  CHECK(s.summary.zero_output_rows == 1u);
  CHECK(s.summary.grouped == 2u);
  REQUIRE(s.requests.size() == 4u);
  CHECK(s.requests[0].arrival == 125000000);
  CHECK(s.requests[0].prompt_tokens == 20u);
  CHECK(s.requests[1].arrival == 500000000);
  CHECK(s.requests[1].prefix_group == 0);
  CHECK(s.requests[1].prefix_tokens == 64u);
  CHECK(s.requests[2].arrival == 500000000);  // rounded to the ns; kept after its equal
  CHECK(s.requests[2].output_tokens == 1u);   // zero_output: one
  CHECK(s.requests[2].prefix_group == 3);
  CHECK(s.requests[3].arrival == 12 * kSecond);
  CHECK_THAT(s.summary.describe(), Catch::Contains("4 requests from " + path));
  CHECK_THAT(s.summary.describe(), Catch::Contains("1 rows out of time order (sorted)"));

  TraceOptions skip;
  skip.zero_output = ZeroOutput::kSkip;
  skip.max_prompt_tokens = 50;
  const RequestSet skipped = read_ok(path, skip);
  CHECK(skipped.requests.size() == 3u);
  CHECK(skipped.summary.skipped_rows == 1u);
  CHECK(skipped.requests[1].prompt_tokens == 50u);  // clamped, and its prefix with it
  CHECK(skipped.requests[1].prefix_tokens == 49u);
  CHECK(skipped.summary.prefixes_clamped == 1u);

  TraceOptions forced;
  forced.format = TraceFormat::kMemsim;
  forced.time_scale = 2.0;
  const RequestSet headless = read_ok(dir.write("h.csv", "1,5,6\n1.5,7,8\n"), forced);
  REQUIRE(headless.requests.size() == 2u);
  CHECK(headless.requests[0].arrival == kSecond);  // memsim times are kept; gaps scaled
  CHECK(headless.requests[1].arrival == 2 * kSecond);
}

TEST_CASE("bad trace rows are errors naming file, line and column", "[requests]") {
  TempDir dir;
  const std::string azure = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  const std::string t0 = "2023-11-16 18:15:46.6805900";
  const auto error_of = [&](const std::string& text) {
    return read_error(dir.write("bad.csv", text));
  };
  const std::string p = (dir.path() / "bad.csv").string();
  CHECK(error_of(azure + t0 + ",1,2\n" + t0 + ",1\n") ==
        p + ":3: expected 3 columns (TIMESTAMP,ContextTokens,GeneratedTokens), got 2");
  CHECK(error_of(azure + t0 + ",12x,2\n") ==
        p + ":2: ContextTokens: expected a whole number, got '12x'");
  CHECK(error_of(azure + t0 + ",-4,2\n") ==
        p + ":2: ContextTokens: must not be negative, got '-4'");
  CHECK(error_of(azure + t0 + ",0,2\n") == p + ":2: ContextTokens: must be at least 1, got 0");
  CHECK(error_of(azure + t0 + ",5,\n") == p + ":2: GeneratedTokens: is empty");
  CHECK(error_of(azure + "2023-11-16 25:00:00,5,1\n") ==
        p + ":2: TIMESTAMP: expected a time like 2023-11-16 18:15:46.6805900, got "
            "'2023-11-16 25:00:00'");
  CHECK(error_of(azure + t0 + ",5,99999999999\n") ==
        p + ":2: GeneratedTokens: 99999999999 is out of range [0, 1073741824]");
  CHECK(error_of("time,prompt,output\n1,2,3\n") ==
        p + ":1: unknown header 'time,prompt,output' (expected "
            "'TIMESTAMP,ContextTokens,GeneratedTokens' or "
            "'arrival_s,prompt_tokens,output_tokens[,prefix_group,prefix_tokens]')");
  CHECK(error_of("arrival_s,prompt_tokens,output_tokens\n-1,2,3\n") ==
        p + ":2: arrival_s: must not be negative, got '-1'");
  CHECK(error_of("arrival_s,prompt_tokens,output_tokens\n1e,2,3\n") ==
        p + ":2: arrival_s: expected a time in seconds, got '1e'");
  CHECK(error_of("arrival_s,prompt_tokens,output_tokens\nnan,2,3\n") ==
        p + ":2: arrival_s: expected a time in seconds, got 'nan'");
  CHECK(error_of("arrival_s,prompt_tokens,output_tokens,prefix_group,prefix_tokens\n1,8,3,0,8\n") ==
        p + ":2: prefix_tokens: must be in [1, prompt_tokens - 1] = [1, 7], got 8");
  CHECK(
      error_of("arrival_s,prompt_tokens,output_tokens,prefix_group,prefix_tokens\n1,8,3,-2,1\n") ==
      p + ":2: prefix_group: must be -1 (none) or >= 0, got '-2'");
  CHECK(error_of(azure) == p + ": no requests");
  CHECK(error_of("") == p + ": empty");
  TraceOptions strict;
  strict.zero_output = ZeroOutput::kError;
  CHECK(read_error(dir.write("bad.csv", azure + t0 + ",5,0\n"), strict) ==
        p + ":2: GeneratedTokens: is 0 (set the trace option zero_output to skip or one)");
  CHECK(read_error((dir.path() / "none.csv").string()) ==
        (dir.path() / "none.csv").string() + ": cannot open");
}

// ------------------------------------------------------------------------------------------
// The requests: loader.

TEST_CASE("the requests block loads into typed configs", "[requests][config]") {
  TempDir dir;
  const std::string path = dir.write("exp.yaml", R"(requests:
  source: synthetic
  count: 2000
  seed: 3
  arrival: {process: gamma, rate: 20, cv: 3}
  prompt: {dist: lognormal, mean: 1024, sigma: 0.8, min: 16, max: 8192}
  output: {dist: uniform, min: 64, max: 512}
  prefix: {groups: 8, tokens: 1024, fraction: 0.5}
  n: 2
)");
  const RequestsConfig c = load_requests_config(ConfigNode::load_file(path)["requests"]);
  CHECK(c.source == RequestSource::kSynthetic);
  CHECK(c.synthetic.count == 2000u);
  CHECK(c.synthetic.seed == 3u);
  CHECK(c.synthetic.arrival.process == ArrivalProcess::kGamma);
  CHECK(c.synthetic.arrival.cv == 3.0);
  CHECK(c.synthetic.prompt.dist == LengthDist::kLognormal);
  CHECK(c.synthetic.prompt.min == 16u);
  CHECK(c.synthetic.output.max == 512u);
  CHECK(c.synthetic.prefix.groups == 8u);
  CHECK(c.synthetic.prefix.fraction == 0.5);
  CHECK(c.synthetic.n == 2u);
  const std::vector<RequestSpec> r = build_requests(c);
  CHECK(r.size() == 2000u);
  CHECK(check_requests(r).empty());
  CHECK(r[5].n == 2u);

  // A trace path relative to the YAML's folder, then one relative to the project root.
  fs::create_directories(dir.path() / "traces");
  dir.write("traces/t.csv", "arrival_s,prompt_tokens,output_tokens\n0,5,6\n2,7,8\n");
  const std::string tpath = dir.write("trace.yaml", R"(requests:
  source: trace
  beam_width: 4
  trace: {path: traces/t.csv, format: memsim, limit: 1, zero_output: error}
)");
  const RequestsConfig t = load_requests_config(ConfigNode::load_file(tpath)["requests"]);
  CHECK(t.trace_path == (dir.path() / "traces" / "t.csv").string());
  CHECK(t.trace.limit == 1u);
  CHECK(t.trace.zero_output == ZeroOutput::kError);
  const RequestSet ts = build_request_set(t);
  REQUIRE(ts.requests.size() == 1u);
  CHECK(ts.requests[0].beam_width == 4u);
  CHECK(ts.requests[0].prompt_tokens == 5u);

  fs::create_directories(dir.path() / "experiments");
  const std::string shipped = dir.write("experiments/azure.yaml", R"(requests:
  source: trace
  trace: {path: data/azure-llm-2023/conv.csv}
)");
  const ScopedEnv root("MEMSIM_ROOT", source_root());
  const RequestsConfig a = load_requests_config(ConfigNode::load_file(shipped)["requests"]);
  CHECK(build_requests(a).size() == 19366u);
}

TEST_CASE("requests config errors name file, line and key", "[requests][config]") {
  TempDir dir;
  const std::string good = R"(requests:
  source: synthetic
  count: 100
  arrival: {process: poisson, rate: 20}
  prompt: {dist: fixed, value: 64}
  output: {dist: uniform, min: 64, max: 512}
)";
  const auto check = [&](const std::string& from, const std::string& to, int line,
                         const std::string& key, const std::string& message) {
    const std::string path = dir.write("bad.yaml", replace_once(good, from, to));
    CHECK(config_error(path) == located(path, line, key, message));
  };
  check("count:", "cuont:", 3, "requests.cuont", "unknown key 'cuont' (did you mean 'count'?)");
  check("rate: 20", "rat: 20", 4, "requests.arrival.rat",
        "unknown key 'rat' (did you mean 'rate'?)");
  check("value: 64", "valeu: 64", 5, "requests.prompt.valeu",
        "unknown key 'valeu' (did you mean 'value'?)");
  check("process: poisson, rate: 20", "process: burst, rate: 20", 4, "requests.arrival.rate",
        "does not apply to process: burst (only to poisson and gamma)");
  check("rate: 20", "rate: 20, cv: 2", 4, "requests.arrival.cv",
        "does not apply to process: poisson (only to gamma)");
  check("value: 64", "value: 64, max: 90", 5, "requests.prompt.max",
        "does not apply to dist: fixed (only to uniform and lognormal)");
  check("min: 64, max: 512", "min: 64, max: 512, sigma: 1", 6, "requests.output.sigma",
        "does not apply to dist: uniform (only to lognormal)");
  check("min: 64, max: 512", "min: 64, max: 32", 6, "requests.output.max",
        "must be at least min (64), got 32");
  check("rate: 20", "rate: 0", 4, "requests.arrival.rate", "must be greater than 0");
  check("dist: fixed", "dist: fxed", 5, "requests.prompt.dist",
        "'fxed' is not one of: fixed, uniform, lognormal (did you mean 'fixed'?)");
  check("source: synthetic", "source: trace", 3, "requests.count",
        "does not apply to source: trace (only to source: synthetic)");
  check("count: 100", "count: 100\n  trace: {path: x.csv}", 4, "requests.trace",
        "does not apply to source: synthetic (only to source: trace)");
  check("count: 100", "count: 100\n  n: 2\n  beam_width: 2", 5, "requests.beam_width",
        "beam search forks its own beams: use n: 1 with beam_width 2");
  check("count: 100", "count: 100\n  prefix: {groups: 2, tokens: 64}", 4, "requests.prefix.tokens",
        "must be less than the longest prompt (64): a grouped request keeps 1 token of its own");

  const std::string missing = dir.write("missing.yaml", R"(requests:
  source: trace
  trace: {path: nowhere.csv}
)");
  CHECK_THAT(config_error(missing),
             Catch::StartsWith(missing +
                               ":3: requests.trace.path: cannot find file 'nowhere.csv' "
                               "(looked in " +
                               (dir.path() / "nowhere.csv").string() + ", " +
                               (dir.path().parent_path() / "nowhere.csv").string() + ", "));
  CHECK_THAT(config_error(missing), Catch::EndsWith(", nowhere.csv)"));

  const std::string csv = dir.write("b.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\n");
  const std::string bad_trace = dir.write("bad_trace.yaml", R"(requests:
  source: trace
  trace:
    path: b.csv
)");
  CHECK(
      config_error(bad_trace) ==
      csv +
          ":2: TIMESTAMP: expected a time like 2023-11-16 18:15:46.6805900, got '1' (trace from " +
          bad_trace + ":4: requests.trace.path)");
}

// ------------------------------------------------------------------------------------------
// The packed request table, special files, and host memory.

namespace {

// Requests whose optional fields start differing part-way (so each column turns from one
// shared value into a value per request at another index), with ids = indices unless `ids`.
std::vector<RequestSpec> varied_requests(size_t count, bool ids) {
  std::vector<RequestSpec> v(count);
  for (size_t i = 0; i < count; ++i) {
    RequestSpec& r = v[i];
    r.id = ids ? 1000 + 3 * i : i;
    r.arrival = static_cast<SimTime>((i * 7919) % 1000) * 1000003;  // out of order, with ties
    r.prompt_tokens = static_cast<uint32_t>(16 + i % 2000);
    r.output_tokens = static_cast<uint32_t>(1 + (i * 31) % 512);
    if (i >= count / 3 && i % 5 == 0) {
      r.prefix_group = static_cast<int32_t>(i % 7);
      r.prefix_tokens = 8;
    }
    if (i >= count / 2 && i % 3 == 0) r.n = 4;
    if (i >= 2 * count / 3 && i % 4 == 1) r.beam_width = 2;
  }
  return v;
}

// A sparse file of `size` bytes whose first 64 KiB are memsim trace rows (the rest reads as
// zeros): its rows look like size / 16 many, without taking the disk space.
std::string sparse_trace(const TempDir& dir, uint64_t size) {
  std::string rows = "arrival_s,prompt_tokens,output_tokens\n";
  for (int i = 0; rows.size() < 65536; ++i) rows += fmt::format("{}.5,{},{}\n", i % 10, 100, 10);
  const std::string path = dir.write("sparse.csv", rows);
  fs::resize_file(path, size);
  return path;
}

}  // namespace

TEST_CASE("the request table gives back exactly the requests it was given") {
  for (const bool ids : {false, true}) {
    const std::vector<RequestSpec> v = varied_requests(3000, ids);
    const RequestTable t(v);
    REQUIRE(t.size() == v.size());
    CHECK(same(t.to_vector(), v));
    size_t i = 0;
    for (const RequestSpec& r : t) CHECK(same(r, v[i++]));
    CHECK(i == v.size());
    CHECK(same(t.front(), v.front()));
    CHECK(same(t.back(), v.back()));
    CHECK(t.any_parallel());
    // Sorting by arrival is std::stable_sort's order, ids and all.
    std::vector<RequestSpec> sorted = v;
    std::stable_sort(sorted.begin(), sorted.end(), [](const RequestSpec& a, const RequestSpec& b) {
      return a.arrival < b.arrival;
    });
    RequestTable st(v);
    st.stable_sort_by_arrival(/*renumber=*/false);
    CHECK(same(st.to_vector(), sorted));
    CHECK(RequestTable(sorted) == st);
    // Renumbered (a trace's rows): ids are the new indices, nothing else changes.
    for (size_t k = 0; k < sorted.size(); ++k) sorted[k].id = k;
    st.stable_sort_by_arrival(/*renumber=*/true);
    CHECK(same(st.to_vector(), sorted));
  }
}

TEST_CASE("a request table costs 16 bytes a request while the optional fields are shared") {
  SyntheticRequestsConfig c = base_config(10000);
  c.prompt = uniform(16, 2048);
  c.n = 2;  // one shared n for every request: still one value
  const RequestSet set = generate_request_set(c);
  CHECK(set.requests.bytes() == 10000 * RequestTable::kBytesPerRequest);
  CHECK(same(set.requests.to_vector(), generate_requests(c)));
  CHECK(set.requests.any_parallel());
  // The trace reader sizes its columns from the file: no growth by doubling.
  const RequestSet conv = read_ok(azure_file("conv.csv"));
  CHECK(conv.requests.bytes() <= conv.requests.size() * RequestTable::kBytesPerRequest * 9 / 8);
  const uint64_t size = fs::file_size(azure_file("conv.csv"));
  const uint64_t rows = estimate_trace_rows(azure_file("conv.csv"), size);
  CHECK(rows >= 19366 * 95 / 100);
  CHECK(rows <= 19366 * 105 / 100);
}

TEST_CASE("special files are refused as traces before anything is read") {
  TempDir dir;
  CHECK(read_error("/dev/zero") == "/dev/zero is not a regular file (a character device)");
  CHECK(read_error(dir.path().string()) ==
        dir.path().string() + " is not a regular file (a directory)");
  const std::string fifo = (dir.path() / "fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(read_error(fifo) == fifo + " is not a regular file (a FIFO)");  // would block if opened
  CHECK_THAT(read_error((dir.path() / "absent.csv").string()), Catch::Contains("cannot open"));
  // Named in a config: the key and the type, not "cannot find".
  const std::string config = dir.write("zero.yaml", R"(requests:
  source: trace
  trace: {path: /dev/zero}
)");
  CHECK(config_error(config) == config +
                                    ":3: requests.trace.path: /dev/zero is not a regular file (a "
                                    "character device)");
}

TEST_CASE("a workload that cannot fit in host memory is refused with a message") {
  if (kUnderAddressSanitizer) {
    WARN("skipped under AddressSanitizer: an address-space limit leaves its shadow memory no room");
    return;
  }
  constexpr uint64_t kHeadroom = 256ull << 20;
  // requests.count: refused up front, before anything is generated.
  const std::string count = host_memory_error_in_child(kHeadroom, [] {
    const ConfigNode n = ConfigNode::parse(R"(requests:
  source: synthetic
  count: 50000000
  arrival: {process: poisson, rate: 10}
  prompt: {dist: fixed, value: 100}
  output: {dist: fixed, value: 10}
)",
                                           "count.yaml");
    build_request_set(load_requests_config(n["requests"]));
  });
  CHECK_THAT(count, Catch::StartsWith("memsim: simulating 50000000 synthetic requests "
                                      "(requests.count) needs at least 1.9 GiB of host memory, "
                                      "but only "));
  CHECK_THAT(count, Catch::Contains("ulimit -v"));
  // The generator itself: out of memory is a HostMemoryError, not std::bad_alloc.
  CHECK_THAT(
      host_memory_error_in_child(kHeadroom, [] { generate_request_set(base_config(100000000)); }),
      Catch::StartsWith("memsim: out of host memory while generating 100000000 synthetic "
                        "requests (0 generated"));
  // A trace: refused up front from its size; read directly, out of memory names the rows read.
  TempDir dir;
  const std::string trace = sparse_trace(dir, 8ull << 30);
  const std::string config =
      dir.write("big.yaml", "requests:\n  source: trace\n  trace: {path: " + trace + "}\n");
  CHECK_THAT(host_memory_error_in_child(kHeadroom,
                                        [&] {
                                          build_request_set(load_requests_config(
                                              ConfigNode::load_file(config)["requests"]));
                                        }),
             Catch::StartsWith("memsim: simulating the trace " + trace + " (about "));
  CHECK_THAT(host_memory_error_in_child(kHeadroom, [&] { (void)read_request_trace(trace, {}); }),
             Catch::StartsWith("memsim: out of host memory while reading the trace " + trace +
                               " (0 rows read"));
}
