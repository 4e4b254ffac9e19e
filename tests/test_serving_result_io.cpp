// A serving run's outcome written as JSON and read back (src/app/serving_result_io.h): every
// field of every struct comes back (each leaf given a value of its own first), doubles bit for
// bit (NaN, infinities, -0.0 and fractions included), packed samples exactly; bad input names
// the key. A run's process that fails or hands back nothing is the run's error (RunProcesses).
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "src/app/serving_processes.h"
#include "src/app/serving_result_io.h"

using namespace memsim;
using json = nlohmann::json;

namespace {

// Gives every leaf of `j` a value of its own: whole numbers k (signed ones -k), fractions
// k + 1/7, strings "s<k>", booleans true. Lists keep their length.
void fill_leaves(json& j, uint64_t& k) {
  if (j.is_object() || j.is_array()) {
    for (auto& e : j) fill_leaves(e, k);
  } else if (j.is_number_unsigned()) {
    j = ++k;
  } else if (j.is_number_integer()) {
    j = -static_cast<int64_t>(++k);
  } else if (j.is_number_float()) {
    j = static_cast<double>(++k) + 1.0 / 7;
  } else if (j.is_string()) {
    j = "s" + std::to_string(++k);
  } else if (j.is_boolean()) {
    j = true;
  }
}

// A run with one element in each list (a sample, a measured step, a replica, ...), so that the
// elements' fields are filled too.
ServingRunResult with_lists() {
  ServingRunResult r;
  r.result.rejections = {"too long"};
  r.result.measured_steps.resize(2);
  r.result.series = {"kv_used"};
  r.result.samples.push_back({0, 0, 0.5});
  r.replicas.resize(1);
  r.replicas[0].measured_steps.resize(1);
  r.assigned = {0, 0};
  return r;
}

}  // namespace

TEST_CASE("serving outcome: every field of every struct comes back") {
  // The JSON of a run whose every leaf has a value of its own...
  json filled = json::parse(run_outcome_json(with_lists()));
  uint64_t k = 0;
  fill_leaves(filled, k);
  REQUIRE(k > 150);  // the structs' scalar fields (a field missing from the writer shows here)
  // ...read into a run and written again: the same JSON. A field the reader skips keeps its
  // default and differs.
  ServingRunResult back;
  REQUIRE(read_run_outcome_json(filled.dump(), back) == "");
  CHECK(json::parse(run_outcome_json(back)) == filled);
  CHECK(back.result.samples.size() == 1);
  CHECK(back.replicas.size() == 1);
  CHECK(back.assigned.size() == 2);
}

TEST_CASE("serving outcome: doubles bit for bit, samples exactly") {
  ServingRunResult r;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  r.result.label = "conv \"1x\", quoted";
  r.result.ttft_ms = {0.1 + 0.2, -0.0, inf, nan};
  r.result.tpot_ms.p50 = -inf;
  r.result.tpot_ms.p90 = std::numeric_limits<double>::denorm_min();
  r.result.tpot_ms.p99 = std::numeric_limits<double>::max();
  r.result.sim_time = std::numeric_limits<int64_t>::min();
  r.result.peak_kv_bytes = std::numeric_limits<uint64_t>::max();
  r.result.executed = true;
  const std::vector<GaugeSample> samples = {
      {5, 0, 1.0}, {5, 1, 0.1}, {3, 0, -2.5}, {1000000000000, 2, 1e300}, {1000000000001, 1, nan}};
  for (const GaugeSample& s : samples) r.result.samples.push_back(s);
  ServingRunResult back;
  REQUIRE(read_run_outcome_json(run_outcome_json(r), back) == "");
  const auto bits = [](double d) { return std::bit_cast<uint64_t>(d); };
  CHECK(back.result.label == r.result.label);
  CHECK(bits(back.result.ttft_ms.p50) == bits(0.1 + 0.2));
  CHECK(bits(back.result.ttft_ms.p90) == bits(-0.0));
  CHECK(back.result.ttft_ms.p99 == inf);
  CHECK(std::isnan(back.result.ttft_ms.mean));
  CHECK(back.result.tpot_ms.p50 == -inf);
  CHECK(bits(back.result.tpot_ms.p90) == bits(std::numeric_limits<double>::denorm_min()));
  CHECK(back.result.tpot_ms.p99 == std::numeric_limits<double>::max());
  CHECK(back.result.sim_time == std::numeric_limits<int64_t>::min());
  CHECK(back.result.peak_kv_bytes == std::numeric_limits<uint64_t>::max());
  CHECK(back.result.executed);
  const std::vector<GaugeSample> got = back.result.samples.to_vector();
  REQUIRE(got.size() == samples.size());
  for (size_t i = 0; i + 1 < samples.size(); ++i) CHECK(got[i] == samples[i]);
  CHECK(got.back().time == samples.back().time);
  CHECK(std::isnan(got.back().value));
}

TEST_CASE("serving outcome: bad input names the key") {
  ServingRunResult r;
  const auto error_of = [&](const std::string& text) {
    ServingRunResult into;
    return read_run_outcome_json(text, into);
  };
  json j = json::parse(run_outcome_json(r));
  CHECK_THAT(error_of("{\"result\": "), Catch::StartsWith("the run's outcome is not valid JSON"));
  CHECK(error_of("[1]") == "the run's outcome is not a JSON map");
  json missing = j;
  missing["result"]["counters"].erase("rejected");
  CHECK(error_of(missing.dump()) == "outcome.result.counters.rejected: missing");
  json negative = j;
  negative["result"]["requests"] = -3;
  CHECK(error_of(negative.dump()) == "outcome.result.requests: not a whole number of its kind");
  json wide = j;
  wide["result"]["max_running_seqs"] = uint64_t(1) << 32;
  CHECK(error_of(wide.dump()) == "outcome.result.max_running_seqs: out of range");
  json text = j;
  text["result"]["waste_pct"] = "lots";
  CHECK(error_of(text.dump()) == "outcome.result.waste_pct: not a number");
  json sample = j;
  sample["result"]["samples"] = json::array({json::array({1, 2})});
  CHECK(error_of(sample.dump()) == "outcome.result.samples[0]: not [time, series, value]");
  json step = j;
  step["result"]["measured_steps"] = json::array({json::object()});
  CHECK(error_of(step.dump()) == "outcome.result.measured_steps[0].shape: missing");
}

TEST_CASE("run processes: a process that fails or hands back nothing is the run's error") {
  const auto run_with = [](std::vector<std::string> argv) {
    RunProcesses processes(std::move(argv), "0123456789abcdef");
    ServingRunResult o;
    o.spec.label = "conv 1x";
    processes.run(3, o);
    CHECK(o.result.label == "conv 1x");
    return o.result.error;
  };
  CHECK(run_with({"/bin/false"}) ==
        "its process (memsim --serving-run 3) exited 1; its output is above");
  CHECK_THAT(run_with({"/bin/true"}),
             Catch::StartsWith("its process (memsim --serving-run 3) left no outcome (") &&
                 Catch::EndsWith("/run3.json)"));
  CHECK_THAT(run_with({"/no/such/program"}), Catch::StartsWith("its process could not start: "));
}
