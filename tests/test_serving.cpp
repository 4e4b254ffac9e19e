// The serving engine end to end on small workloads: every KV strategy and scheduler finishes
// cleanly, the fast decode path equals the step-by-step path exactly, preemption (recompute and
// swap), copy-on-write for parallel samples, single_sequence truncation (seed 10.4), the packed
// latency percentiles and the progress hook.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/serve/engine.h"
#include "tests/kv_test_util.h"

namespace memsim::test {
namespace {

GpuSpec h200() {
  return gpu_from_configs("h200");
}

std::vector<RequestSpec> workload(uint64_t count, double rate, uint32_t groups = 0,
                                  uint32_t n = 1) {
  SyntheticRequestsConfig s;
  s.count = count;
  s.seed = 7;
  s.arrival.rate = rate;
  s.prompt = {LengthDist::kLognormal, 0, 16, 2048, 400, 0.8};
  s.output = {LengthDist::kUniform, 0, 4, 300, 0, 0};
  if (groups) s.prefix = {groups, 128, 1.0};
  s.n = n;
  return generate_requests(s);
}

EngineConfig engine(const std::string& kv_yaml, uint64_t budget) {
  EngineConfig e;
  e.model = model_from_configs("llama-3.1-8b");
  e.gpu = h200();
  const ConfigNode node = ConfigNode::parse(kv_yaml, "test.yaml");
  e.kv_impl = node["impl"].as_string();
  e.kv_factory = kv_strategies().find(e.kv_impl)->parse(node);
  e.kv_budget_bytes = budget;
  e.serve.max_model_len = 4096;
  e.sample_interval = 50'000'000;
  return e;
}

void require_clean(const ServingResult& r, uint64_t requests) {
  INFO(r.label << " " << r.kv_impl << ": " << r.error);
  REQUIRE(r.error.empty());
  CHECK(r.finished == requests);
  CHECK(r.output_tokens > 0);
  CHECK(r.sim_time > 0);
}

TEST_CASE("every KV strategy serves the same load to completion") {
  const auto reqs = workload(300, 20);
  for (const char* kv : {"{impl: paged_block_pool}", "{impl: paged_block_pool, block_size: 1}",
                         "{impl: radix_token_pool}", "{impl: radix_token_pool, page_size: 16}",
                         "{impl: static_contiguous}", "{impl: vmm_contiguous}",
                         "{impl: vmm_contiguous, reclaim: eager}",
                         "{impl: vmm_contiguous, physical: on_demand, allocation: sync}"}) {
    const ServingResult r = run_serving(engine(kv, 8 * kGiB), reqs);
    require_clean(r, reqs.size());
    CHECK(r.rejected == 0);
  }
}

TEST_CASE("the fast decode path gives exactly the step-by-step results") {
  for (const char* kv : {"{impl: paged_block_pool}", "{impl: radix_token_pool, page_size: 4}",
                         "{impl: vmm_contiguous, allocation: sync}", "{impl: static_contiguous}"}) {
    for (uint64_t budget : {2 * kGiB, 24 * kGiB}) {  // with and without preemption
      const auto reqs = workload(400, 30, 4);
      EngineConfig e = engine(kv, budget);
      e.fast_decode = false;
      const ServingResult ref = run_serving(e, reqs);
      e.fast_decode = true;
      const ServingResult fast = run_serving(e, reqs);
      INFO(kv << " budget " << budget);
      require_clean(ref, reqs.size());
      require_clean(fast, reqs.size());
      CHECK(fast.sim_time == ref.sim_time);
      CHECK(fast.steps == ref.steps);
      CHECK(fast.output_tokens == ref.output_tokens);
      CHECK(fast.ttft_ms.p99 == ref.ttft_ms.p99);
      CHECK(fast.e2e_ms.p50 == ref.e2e_ms.p50);
      CHECK(fast.counters.preemptions == ref.counters.preemptions);
      CHECK(fast.counters.prefix_hit_tokens == ref.counters.prefix_hit_tokens);
      CHECK(fast.peak_used_blocks == ref.peak_used_blocks);
      CHECK(fast.kv.evicted_blocks == ref.kv.evicted_blocks);
      CHECK(fast.max_running_seqs == ref.max_running_seqs);
    }
  }
}

TEST_CASE("vAttention's background step hides page mapping behind compute") {
  const auto reqs = workload(300, 20);
  const ServingResult sync =
      run_serving(engine("{impl: vmm_contiguous, allocation: sync}", 8 * kGiB), reqs);
  const ServingResult async = run_serving(engine("{impl: vmm_contiguous}", 8 * kGiB), reqs);
  require_clean(sync, reqs.size());
  require_clean(async, reqs.size());
  CHECK(sync.output_tokens == async.output_tokens);
  // Synchronous: every map is on the critical path. Asynchronous: decode groups are mapped in
  // background steps, and at this load every one of them hides behind a step's compute.
  CHECK(sync.kv_background_time == 0);
  CHECK(sync.kv_critical_time > 0);
  CHECK(async.kv_background_time > 0);
  CHECK(async.kv_stall_time == 0);
  CHECK(async.kv_critical_time < sync.kv_critical_time);
  CHECK(async.tpot_ms.mean < sync.tpot_ms.mean);  // (the run's length is set by arrivals)
  CHECK(async.e2e_ms.mean < sync.e2e_ms.mean);

  // A GPU whose set_access costs 20 ms a call: background steps outlast the compute, and only
  // their excess delays the run (stall <= background time).
  EngineConfig slow = engine("{impl: vmm_contiguous}", 8 * kGiB);
  slow.gpu.cost(Primitive::kSetAccess).per_call_us = 20'000;
  const ServingResult stalled = run_serving(slow, reqs);
  require_clean(stalled, reqs.size());
  CHECK(stalled.kv_stall_time > 0);
  CHECK(stalled.kv_stall_time < stalled.kv_background_time);
  CHECK(stalled.tpot_ms.mean > 2 * async.tpot_ms.mean);
}

TEST_CASE("overload preempts: recompute and swap both finish every request") {
  const auto reqs = workload(300, 200);
  EngineConfig e = engine("{impl: paged_block_pool}", 1 * kGiB);
  const ServingResult rec = run_serving(e, reqs);
  require_clean(rec, reqs.size());
  CHECK(rec.counters.preemptions > 0);
  CHECK(rec.counters.recomputes == rec.counters.preemptions);
  CHECK(rec.counters.swapped_bytes == 0);

  e.serve.preemption = Preemption::kSwap;
  const ServingResult swap = run_serving(e, reqs);
  require_clean(swap, reqs.size());
  CHECK(swap.counters.swap_outs > 0);
  CHECK(swap.counters.swap_ins == swap.counters.swap_outs);
  CHECK(swap.counters.swapped_bytes > 0);

  e.serve.preemption = Preemption::kRecompute;
  e.serve.victim = Victim::kFewestDecoded;
  require_clean(run_serving(e, reqs), reqs.size());
}

TEST_CASE("parallel samples share the prompt: copy-on-write copies only partial blocks") {
  const auto reqs = workload(100, 10, 0, 4);
  const ServingResult cow = run_serving(engine("{impl: paged_block_pool}", 16 * kGiB), reqs);
  const ServingResult eager =
      run_serving(engine("{impl: paged_block_pool, copy_on_write: false}", 16 * kGiB), reqs);
  require_clean(cow, reqs.size());
  require_clean(eager, reqs.size());
  CHECK(cow.output_tokens == eager.output_tokens);
  CHECK(cow.kv.cow_copies > 0);
  CHECK(cow.kv.cow_copies < eager.kv.cow_copies);  // eager copies whole prompts
  CHECK(cow.peak_used_blocks < eager.peak_used_blocks);
}

TEST_CASE("single_sequence truncates a generation that exhausts the pool (seed 10.4)") {
  std::vector<RequestSpec> reqs(2);
  reqs[0] = {0, 0, 100, 500};  // fits: 600 tokens
  reqs[1] = {1, 1, 900, 500};  // 1400 tokens > the pool's 1024
  EngineConfig e = engine("{impl: paged_block_pool, layout: per_layer}", 0);
  e.kv_budget_bytes = 1024 * e.model.kv_bytes_per_token();
  e.scheduler = "single_sequence";
  e.serve.max_num_seqs = 1;
  const ServingResult r = run_serving(e, reqs);
  require_clean(r, 2);
  CHECK(r.truncated == 1);
  CHECK(r.output_tokens == 500 + (1024 - 900 + 1));  // the KV holds 1024 tokens: 125 outputs
  CHECK(r.max_running_seqs == 1);
}

TEST_CASE("static_batch runs batches to completion; an impossible request is rejected") {
  auto reqs = workload(200, 50);
  EngineConfig e = engine("{impl: paged_block_pool}", 4 * kGiB);
  e.scheduler = "static_batch";
  e.serve.max_num_seqs = 32;
  require_clean(run_serving(e, reqs), reqs.size());
  reqs[5].prompt_tokens = 4096;  // = max_model_len: no room to generate
  const ServingResult r = run_serving(e, reqs);
  REQUIRE(r.error.empty());
  CHECK(r.rejected == 1);
}

}  // namespace
// The percentiles of the old engine: every latency as a double in ms, sorted.
Percentiles reference_percentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const double pos = q * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
  };
  p.p50 = at(0.5);
  p.p90 = at(0.9);
  p.p99 = at(0.99);
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / static_cast<double>(v.size());
  return p;
}

TEST_CASE("packed latency samples give exactly the percentiles of the doubles") {
  std::mt19937_64 rng(3);
  for (const size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{101}, size_t{50000}}) {
    LatencySamples packed;
    std::vector<double> ttft, e2e, tpot;
    for (size_t i = 0; i < n; ++i) {
      // ns from 0 to ~10^13 (hours), many ties, and values doubles cannot tell apart.
      const SimTime a = static_cast<SimTime>(rng() % 4 == 0 ? rng() % 1000 : rng() >> 21);
      const SimTime b = a + static_cast<SimTime>(rng() >> 30) + (SimTime{1} << 53);
      const double t = double(rng() >> 20) / 1e6 / double(1 + rng() % 500);
      packed.add_ttft(a);
      packed.add_e2e(b);
      packed.add_tpot_ms(t);
      ttft.push_back(double(a) / 1e6);
      e2e.push_back(double(b) / 1e6);
      tpot.push_back(t);
    }
    const auto same = [](const Percentiles& x, const Percentiles& y) {
      return x.p50 == y.p50 && x.p90 == y.p90 && x.p99 == y.p99 && x.mean == y.mean;
    };
    CHECK(same(packed.ttft_ms(), reference_percentiles(ttft)));
    CHECK(same(packed.e2e_ms(), reference_percentiles(e2e)));
    CHECK(same(packed.tpot_ms(), reference_percentiles(tpot)));
  }
}

TEST_CASE("the engine reports its progress through the hook, which changes nothing") {
  const auto reqs = workload(3000, 50);
  EngineConfig e = engine("{impl: paged_block_pool}", 8 * kGiB);
  const ServingResult plain = run_serving(e, reqs);
  std::vector<EngineProgress> seen;
  e.progress = [&](const EngineProgress& p) { seen.push_back(p); };
  const ServingResult hooked = run_serving(e, reqs);
  require_clean(hooked, reqs.size());
  CHECK(hooked.sim_time == plain.sim_time);
  CHECK(hooked.steps == plain.steps);
  CHECK(hooked.e2e_ms.p99 == plain.e2e_ms.p99);
  CHECK(hooked.samples.size() == plain.samples.size());
  REQUIRE(seen.size() >= 3);
  for (size_t i = 0; i < seen.size(); ++i) {
    CHECK(seen[i].requests == reqs.size());
    CHECK(seen[i].finished < reqs.size());
    if (i > 0) CHECK(seen[i].finished >= seen[i - 1].finished);
    if (i > 0) CHECK(seen[i].simulated >= seen[i - 1].simulated);
  }
  CHECK(seen.back().finished > 0);
}

}  // namespace memsim::test
