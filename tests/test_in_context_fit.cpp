// The in-context cost fit: samples priced by a known spec fit back to its terms exactly (per
// call, per handle, per granule, per node), the base's structure and the measured totals are
// kept, fills keep their terms, and calls.csv errors name the file and line.
#include <catch2/catch.hpp>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "src/app/in_context_fit.h"
#include "tests/temp_dir.h"

using namespace memsim;
using memsim::test::TempDir;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

GpuSpec base_spec() {
  GpuSpec g;
  g.name = "test";
  g.granularity = 2 * kMiB;
  g.capture_per_node_us = 1;
  g.instantiate_per_node_us = 3;
  g.upload_per_node_us = 2;
  g.graph_mem_map_per_granule_us = 3;
  g.cost(Primitive::kMap) = {1, 0, 0.5, 0};
  g.cost(Primitive::kSetAccess) = {0, 20, 0.25, 0};
  g.cost(Primitive::kDeviceMalloc) = {40, 0, 0.1, 0};
  g.cost(Primitive::kEndCapture) = {10, 0, 0, 0};
  g.cost(Primitive::kLaunch) = {5, 0, 0, 0};
  g.cost(Primitive::kFill) = {2, 0, 0, 1000};
  return g;
}

// Samples of every fitted primitive over varied sizes, priced exactly by `truth`.
std::vector<CallSample> samples_of(const GpuSpec& truth, const std::string& run) {
  std::vector<CallSample> v;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; ++i) {
    const uint64_t granules = 1 + rng() % 64;
    const uint64_t handles = 1 + rng() % 8;
    const uint64_t nodes = 10 + rng() % 400;
    const uint64_t mappings = i % 2 ? rng() % 20000 : 0;  // runs without VMM have none
    const uint64_t bytes = granules * 2 * kMiB;
    for (Primitive p : {Primitive::kMap, Primitive::kSetAccess, Primitive::kDeviceMalloc,
                        Primitive::kEndCapture, Primitive::kLaunch, Primitive::kFill}) {
      CallSample s;
      s.run = run;
      s.p = p;
      s.handles = p == Primitive::kSetAccess ? handles : 1;
      s.bytes = bytes;
      s.mappings = mappings;
      s.nodes = p == Primitive::kEndCapture ? nodes : 0;
      // Every fourth call of a kind the first since a launch (end_capture: every call, as in a
      // shapes run, where the term cannot be told from the per-call one).
      s.first_after_launch = p == Primitive::kEndCapture || i % 4 == 0;
      if (p == Primitive::kLaunch) {  // a first launch uploads; some map graph memory
        s.handles = 0;
        s.nodes = i % 5 == 0 ? nodes : 0;
        s.bytes = i % 3 == 0 ? bytes : 0;
        s.first_after_launch = false;
      }
      s.measured_us = price_sample_us(truth, s);
      v.push_back(s);
    }
  }
  return v;
}

}  // namespace

TEST_CASE("in-context fit recovers the terms that priced the samples") {
  const GpuSpec base = base_spec();
  GpuSpec truth = base;
  // VA state: 50 ns per log2 step of 1 + mappings / 256; a cold first map 3 us more.
  truth.va_mappings_knee = 256;
  truth.cost(Primitive::kMap) = {1.9, 0, 0.03, 0, 0.05, 3};
  truth.cost(Primitive::kSetAccess) = {0, 30, 0.09, 0, 0, 45};
  truth.cost(Primitive::kDeviceMalloc) = {95, 0, 0.4, 0, 0, 70};
  truth.cost(Primitive::kEndCapture) = {12, 0, 0, 0};
  truth.capture_per_node_us = 0.5;
  truth.instantiate_per_node_us = 1.5;
  truth.cost(Primitive::kLaunch) = {6, 0, 0, 0};
  truth.upload_per_node_us = 1.2;
  truth.graph_mem_map_per_granule_us = 1.8;
  truth.cost(Primitive::kFill) = {14, 0, 0, 4000};
  const InContextFit f = fit_in_context(samples_of(truth, "a"), base);
  for (Primitive p : {Primitive::kMap, Primitive::kSetAccess, Primitive::kDeviceMalloc,
                      Primitive::kEndCapture, Primitive::kLaunch}) {
    INFO(to_string(p));
    // (Prices are whole nanoseconds: log2 terms round, so the terms come back to ~1e-4.)
    CHECK(f.spec.cost(p).per_call_us == Approx(truth.cost(p).per_call_us).margin(2e-3));
    CHECK(f.spec.cost(p).per_handle_us == Approx(truth.cost(p).per_handle_us).margin(1e-4));
    CHECK(f.spec.cost(p).per_granule_us == Approx(truth.cost(p).per_granule_us).margin(1e-5));
    CHECK(f.spec.cost(p).bytes_per_us == Approx(truth.cost(p).bytes_per_us).epsilon(1e-6));
    CHECK(f.spec.cost(p).per_log2_mappings_us ==
          Approx(truth.cost(p).per_log2_mappings_us).margin(2e-4));
    CHECK(f.spec.cost(p).first_after_launch_us ==
          Approx(truth.cost(p).first_after_launch_us).margin(2e-3));
  }
  // The knee: of those tried, the one that priced the samples.
  CHECK(f.spec.va_mappings_knee == 256);
  // Per node: end_capture's 2 us split as the base splits it (1 : 3); a launch's upload per
  // node and its graph-memory mapping per granule.
  CHECK(f.spec.capture_per_node_us == Approx(0.5));
  CHECK(f.spec.instantiate_per_node_us == Approx(1.5));
  CHECK(f.spec.upload_per_node_us == Approx(1.2));
  CHECK(f.spec.graph_mem_map_per_granule_us == Approx(1.8));
  // Fills keep the base's synchronized terms (in context they return once enqueued).
  CHECK(f.spec.cost(Primitive::kFill).per_call_us == base.cost(Primitive::kFill).per_call_us);
  CHECK(f.spec.cost(Primitive::kFill).bytes_per_us == base.cost(Primitive::kFill).bytes_per_us);
  // Every fitted class then agrees exactly; the base priced them differently.
  REQUIRE(f.classes.size() == 6);
  for (const InContextClass& k : f.classes) {
    CHECK(k.calls == 200);
    if (k.p != Primitive::kFill) CHECK(k.fitted_us == Approx(k.measured_us).epsilon(1e-5));
  }
  CHECK(f.classes[0].base_us != Approx(f.classes[0].measured_us));
}

TEST_CASE("in-context fit keeps the base's structure and totals, skips thin classes") {
  const GpuSpec base = base_spec();
  GpuSpec truth = base;
  truth.cost(Primitive::kMap) = {2, 0, 0, 0};  // no per-granule cost at all
  std::vector<CallSample> v = samples_of(truth, "a");
  // Two first calls (of one granule) 1000x slower: the fitted total still equals the measured
  // one. (The slow calls being small, the fit has no use for a per-granule term: per call only.)
  int slowed = 0;
  double measured = 0;
  for (CallSample& s : v)
    if (s.p == Primitive::kMap) {
      if (slowed < 2) {
        s.bytes = 2 * kMiB;
        s.measured_us *= 1000;
        ++slowed;
      }
      measured += s.measured_us;
    }
  // A primitive with few samples keeps its base terms.
  CallSample thin;
  thin.run = "a";
  thin.p = Primitive::kUnmap;
  thin.handles = 1;
  thin.bytes = 2 * kMiB;
  thin.measured_us = 99;
  v.push_back(thin);
  const InContextFit f = fit_in_context(v, base);
  double fitted = 0;
  for (const CallSample& s : v)
    if (s.p == Primitive::kMap) fitted += price_sample_us(f.spec, s);
  // (Within the whole nanoseconds prices round to: 200 calls, at most 0.1 us.)
  CHECK(fitted == Approx(measured).margin(0.1));
  for (const InContextClass& k : f.classes)
    if (k.p == Primitive::kMap) CHECK(k.fitted_us == Approx(k.measured_us).margin(0.1 / 200));
  // Without the outliers a constant cost fits as a per-call term alone.
  const InContextFit clean = fit_in_context(samples_of(truth, "a"), base);
  CHECK(clean.spec.cost(Primitive::kMap).per_call_us == Approx(2).margin(1e-6));
  CHECK(clean.spec.cost(Primitive::kMap).per_granule_us == Approx(0).margin(1e-9));
  // A per-call term is always offered; set_access has none in truth and gets none.
  CHECK(f.spec.cost(Primitive::kSetAccess).per_call_us == Approx(0).margin(1e-6));
  CHECK(f.spec.cost(Primitive::kUnmap).per_handle_us == base.cost(Primitive::kUnmap).per_handle_us);
}

TEST_CASE("calls.csv: round trip and errors naming file and line") {
  TempDir dir;
  const std::string good = dir.write("calls.csv",
                                     "strategy,primitive,handles,bytes,nodes,mappings,measured_us\n"
                                     "shared_pool,launch,0,0,330,0,79.250\n"
                                     "vmm_alias,map,1,2097152,0,4711,1.880\n");
  auto r = read_call_samples(good);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 2);
  CHECK((*r)[0].run == "shared_pool");
  CHECK((*r)[0].p == Primitive::kLaunch);
  CHECK((*r)[0].nodes == 330);
  CHECK((*r)[0].measured_us == 79.25);
  CHECK((*r)[1].bytes == 2097152);
  CHECK((*r)[1].mappings == 4711);
  // first_after_launch follows each run's calls in file order: a launch never is one, and the
  // next call of each primitive after a launch of its run is.
  const std::string seq = dir.write("seq.csv",
                                    "strategy,primitive,handles,bytes,nodes,mappings,measured_us\n"
                                    "a,map,1,0,0,0,4\n"
                                    "a,map,1,0,0,0,1\n"
                                    "b,map,1,0,0,0,4\n"
                                    "a,launch,0,0,0,0,9\n"
                                    "a,set_access,1,0,0,0,70\n"
                                    "a,map,1,0,0,0,4\n"
                                    "a,map,1,0,0,0,1\n"
                                    "b,map,1,0,0,0,1\n");
  auto q = read_call_samples(seq);
  REQUIRE(q.ok());
  std::vector<bool> first;
  for (const CallSample& c : *q) first.push_back(c.first_after_launch);
  CHECK(first == std::vector<bool>{true, false, true, false, true, true, false, false});
  const std::string typo =
      dir.write("typo.csv",
                "strategy,primitive,handles,bytes,nodes,mappings,measured_us\nx,mapp,1,0,0,0,1\n");
  auto e = read_call_samples(typo);
  REQUIRE(!e.ok());
  CHECK(e.error().message.find("typo.csv:2: unknown primitive 'mapp'") != std::string::npos);
  const std::string neg = dir.write(
      "neg.csv", "strategy,primitive,handles,bytes,nodes,mappings,measured_us\nx,map,1,0,0,0,-1\n");
  CHECK(read_call_samples(neg).error().message.find("neg.csv:2:") != std::string::npos);
  const std::string shortrow = dir.write(
      "short.csv", "strategy,primitive,handles,bytes,nodes,mappings,measured_us\nx,map,1,0,0,1\n");
  CHECK(read_call_samples(shortrow).error().message.find("short.csv:2: 6 fields, expected 7") !=
        std::string::npos);
  // A file from before the launch and mapping features: named as such.
  const std::string old =
      dir.write("old.csv", "strategy,primitive,handles,bytes,nodes,measured_us\nx,map,1,0,0,1\n");
  CHECK(read_call_samples(old).error().message.find("old.csv:1: not a calls.csv header") !=
        std::string::npos);
  CHECK(read_call_samples(old).error().message.find("older memsim") != std::string::npos);
  const std::string head = dir.write("head.csv", "a,b\n");
  CHECK(read_call_samples(head).error().message.find("head.csv:1: not a calls.csv header") !=
        std::string::npos);
  CHECK(!read_call_samples(dir.path().string() + "/missing.csv").ok());
}

TEST_CASE("a per-call table's run-wide factor") {
  CHECK(common_factor_line({}).empty());
  // Every class 1.3x and one 1.6x: none within 25% as measured, all four once the run's common
  // factor (1.37) is divided out.
  CHECK(common_factor_line({1.3, 1.3, 1.3, 1.6}) ==
        "run-wide factor (geometric mean of the ratios): 1.37; with it divided out, 4 of 4 "
        "within 25%\n");
  // A class off by itself stays off: 2.0 against a factor of 1.19.
  CHECK(common_factor_line({1, 1, 1, 2}).find("3 of 4") != std::string::npos);
}

TEST_CASE("several runs' per-call tables: spread, reach and pooled calls") {
  auto cls = [](const char* run, Primitive p, uint64_t calls, double measured, double model) {
    return InContextClass{run, p, calls, measured, model, model};
  };
  // Three runs of one workload against one model (the base times), classes of the table only:
  // fill is not in it, and a class of 10 calls is not counted.
  const std::vector<std::vector<InContextClass>> runs = {
      {cls("a", Primitive::kMap, 100, 2.0, 2.0), cls("a", Primitive::kBeginCapture, 50, 1.0, 2.0),
       cls("a", Primitive::kFill, 50, 9.0, 1.0), cls("b", Primitive::kLaunch, 10, 9.0, 1.0),
       cls("b", Primitive::kEndCapture, 20, 300, 400)},
      {cls("a", Primitive::kMap, 100, 2.6, 2.0), cls("a", Primitive::kBeginCapture, 50, 2.0, 2.0),
       cls("a", Primitive::kFill, 50, 9.0, 1.0), cls("b", Primitive::kLaunch, 10, 9.0, 1.0),
       cls("b", Primitive::kEndCapture, 20, 400, 400)},
      {cls("a", Primitive::kMap, 100, 2.2, 2.0), cls("a", Primitive::kBeginCapture, 50, 3.0, 2.0),
       cls("a", Primitive::kFill, 50, 9.0, 1.0), cls("b", Primitive::kLaunch, 10, 9.0, 1.0),
       cls("b", Primitive::kEndCapture, 20, 500, 400)}};
  const PerCallRuns r = compare_runs(runs);
  CHECK(r.classes == 3);  // a map, a begin_capture, b end_capture
  // map 1.0, 1.3, 1.1; begin_capture 0.5, 1.0, 1.5; end_capture 0.75, 1.0, 1.25.
  CHECK(r.within == std::vector<size_t>{2, 2, 2});
  // Medians 2.2, 2.0 and 400: map 0.91, 1.18, 1.0; begin_capture 0.5, 1, 1.5; end_capture all.
  CHECK(r.within_median == std::vector<size_t>{2, 3, 2});
  // begin_capture's slowest run took 3x its fastest: no model puts it within 25% of all three.
  REQUIRE(r.beyond_reach.size() == 1);
  CHECK(r.beyond_reach[0] == "a begin_capture 3.00");
  // Pooled: map 6.8 / 6.0 = 1.13, begin_capture 6 / 6 = 1, end_capture 1200 / 1200.
  CHECK(r.pooled_within == 3);
  CHECK(r.pooled_out.empty());
  CHECK(in_per_call_table(Primitive::kSetAccess));
  CHECK(!in_per_call_table(Primitive::kFill));
  CHECK(!in_per_call_table(Primitive::kDestroyGraph));
  CHECK(compare_runs({}).classes == 0);
}
