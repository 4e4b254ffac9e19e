// Async scheduling (vLLM V1's AsyncScheduler with EngineCore.step_with_batch_queue), step by
// step on hand-derived cases: the host's time overlapped with the GPU's, a finished request's
// blocks back one step later, a request preempted while its last token is in flight; and over a
// random workload, every invariant of the synchronous engine. Config errors name their key.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "src/serve/engine.h"
#include "src/serve/serving_experiment.h"
#include "tests/config_test_util.h"
#include "tests/kv_test_util.h"
#include "tests/serve_test_util.h"
#include "workload/step_profile.h"

namespace memsim::test {
namespace {

// Llama-3.1-8B on the H200, a paged pool of `blocks` blocks of 16 (one of them vLLM's null
// block), no prefix caching, a token budget that never binds here.
EngineConfig engine(uint32_t blocks, bool async) {
  EngineConfig e;
  e.model = model_from_configs("llama-3.1-8b");
  e.gpu = gpu_from_configs("h200");
  const ConfigNode node = ConfigNode::parse(
      fmt::format("{{impl: paged_block_pool, block_size: 16, num_blocks_override: {}, "
                  "prefix_caching: false}}",
                  blocks),
      "test.yaml");
  e.kv_impl = "paged_block_pool";
  e.kv_factory = kv_strategies().find(e.kv_impl)->parse(node);
  e.kv_budget_bytes = 1 * kGiB;
  e.serve.max_model_len = 4096;
  e.serve.max_num_seqs = 128;
  e.serve.max_num_batched_tokens = 2048;
  e.serve.async_scheduling = async;
  return e;
}

StepShape step(uint64_t tokens, uint64_t computed) {
  StepShape s;
  s.num_seqs = 1;
  s.new_tokens = tokens;
  s.kv_read_tokens = computed + tokens;
  s.attn_pairs = double(tokens) * double(computed) + double(tokens) * double(tokens + 1) / 2;
  if (tokens == 1) {
    s.decode_seqs = 1;
    s.decode_kv_tokens = s.decode_max_kv = static_cast<uint32_t>(computed + 1);
  }
  return s;
}

}  // namespace

// One request of 10 prompt tokens and 3 outputs, roofline steps (host share o = the GPU file's
// 50 µs step overhead, GPU share g = step - o; every g here is milliseconds). Synchronous: three
// steps one after the other, t1 + t2 + t3. Async: step 2 is scheduled and launched while step 1
// runs, step 3 while step 2 runs, so only the first step's host share is exposed:
// o + g1 + g2 + g3. The first token comes when step 1 ends in both (o + g1); step 3's output
// ends the request; a fourth schedule finds it holding its last token in flight and plans
// nothing (no extra step).
TEST_CASE("async scheduling overlaps the host's share of each step with the GPU's") {
  const std::vector<RequestSpec> reqs = {serve_request(0, 10, 3)};
  const EngineConfig sync_e = engine(64, false);
  const StepTimeModel model(sync_e.model, sync_e.gpu);
  const SimTime o = model.host_time();
  REQUIRE(o == 50'000);
  const SimTime t1 = model.step_time(step(10, 0)), t2 = model.step_time(step(1, 10)),
                t3 = model.step_time(step(1, 11));
  REQUIRE(t1 - o > o);
  REQUIRE(t2 - o > o);

  const ServingResult s = run_serving(sync_e, reqs);
  REQUIRE(s.error.empty());
  CHECK(s.steps == 3);
  CHECK(s.sim_time == t1 + t2 + t3);

  const ServingResult a = run_serving(engine(64, true), reqs);
  INFO(a.error);
  REQUIRE(a.error.empty());
  CHECK(a.steps == 3);
  CHECK(a.output_tokens == 3);
  CHECK(a.finished == 1);
  CHECK(a.sim_time == t1 + t2 + t3 - 2 * o);
  CHECK(a.ttft_ms.mean == double(t1) / 1e6);
  CHECK(a.e2e_ms.mean == double(t1 + t2 + t3 - 2 * o) / 1e6);
  CHECK(a.tpot_ms.mean == Approx(double(t2 + t3 - 2 * o) / 2e6).epsilon(1e-12));
}

// C (15 + 10), A (31 + 2) and B (40 + 1) arrive at once; 5 usable blocks of 16; 1 ms steps.
// Step 1 prefills C (1 block) and A (2); B needs 3 and waits.
// Synchronous: step 2 decodes both and A's last token arrives with it, so its 2 blocks are free
// when step 3 is scheduled: C takes its second block, B its three; B's first token at 3 ms.
// Async: step 2 is scheduled while step 1 runs; step 3 while step 2 runs, before A's last token
// (from step 2) is back: A, holding it in flight, is passed over, C takes a block, and B finds
// 1 free. A's blocks come back when step 2's output is applied, after step 3 was scheduled, so
// B is admitted in step 4: first token at 4 ms. C's ten tokens take ten steps either way.
TEST_CASE("async scheduling gives a finished request's blocks back one step later") {
  const std::vector<RequestSpec> reqs = {serve_request(0, 15, 10), serve_request(1, 31, 2),
                                         serve_request(2, 40, 1)};
  for (bool async : {false, true}) {
    EngineConfig e = engine(6, async);
    e.step_profile = flat_step_profile(1.0);
    const ServingResult r = run_serving(e, reqs);
    INFO((async ? "async: " : "sync: ") << r.error);
    REQUIRE(r.error.empty());
    CHECK(r.finished == 3);
    CHECK(r.output_tokens == 13);
    CHECK(r.steps == 10);
    CHECK(r.sim_time == 10'000'000);
    CHECK(r.counters.preemptions == 0);
    CHECK(r.ttft_ms.mean == Approx((1.0 + 1.0 + (async ? 4.0 : 3.0)) / 3).epsilon(1e-12));
    CHECK(r.ttft_ms.p99 == Approx(async ? 3.94 : 2.96).epsilon(1e-12));
  }
}

// A (16 + 10) and B (15 + 1) in 2 usable blocks, 1 ms steps. Step 1 prefills both: one block
// each, and B's only token is sampled there.
// Synchronous: B finishes with step 1, A grows into B's block in step 2; no preemption.
// Async: step 2 is scheduled while step 1 runs. A's decode needs a second block and none is
// free, so the last running request, B, is preempted (vLLM pops the running queue's tail), though
// its last token is in flight. When step 1's output comes, B takes it, finished, and leaves the
// waiting queue without running again (update_from_output's stopped_preempted_reqs).
TEST_CASE("a request preempted while its last token is in flight finishes from the queue") {
  const std::vector<RequestSpec> reqs = {serve_request(0, 16, 10), serve_request(1, 15, 1)};
  for (bool async : {false, true}) {
    EngineConfig e = engine(3, async);
    e.step_profile = flat_step_profile(1.0);
    const ServingResult r = run_serving(e, reqs);
    INFO((async ? "async: " : "sync: ") << r.error);
    REQUIRE(r.error.empty());
    CHECK(r.finished == 2);
    CHECK(r.output_tokens == 11);
    CHECK(r.steps == 10);
    CHECK(r.sim_time == 10'000'000);
    CHECK(r.counters.preemptions == (async ? 1 : 0));
    CHECK(r.ttft_ms.p99 == Approx(1.0).epsilon(1e-12));  // both first tokens at 1 ms
    CHECK(r.e2e_ms.mean == Approx((10.0 + 1.0) / 2).epsilon(1e-12));
  }
}

// 400 Poisson requests with lognormal lengths and shared prefixes, in a pool small enough to
// preempt, roofline steps: async finishes every request with the same tokens, its KV manager's
// invariants hold and every block comes back (the engine checks both at the end), and the
// reference paths (every block hashed as it fills) give the same run. The host's 50 µs a step
// overlap, so it takes less simulated time than the synchronous run.
TEST_CASE("async scheduling keeps the engine's invariants over a random workload") {
  const RequestSet set = prefix_workload(400, 7, 100, 120, 600);
  auto run = [&](bool async, bool reference) {
    EngineConfig e = engine(1200, async);
    e.kv_factory = kv_strategies().find(e.kv_impl)->parse(ConfigNode::parse(
        "{impl: paged_block_pool, block_size: 16, num_blocks_override: 400}", "test.yaml"));
    e.serve.max_num_batched_tokens = 1024;
    e.defer_private_hashes = !reference;
    e.fast_decode = !reference;
    return run_serving(e, set.requests);
  };
  const ServingResult s = run(false, false), a = run(true, false), ref = run(true, true);
  for (const ServingResult* r : {&s, &a, &ref}) {
    INFO(r->error);
    REQUIRE(r->error.empty());
    CHECK(r->finished == 400);
    CHECK(r->rejected == 0);
  }
  CHECK(a.output_tokens == s.output_tokens);
  CHECK(s.counters.preemptions > 0);
  CHECK(a.counters.preemptions > 0);
  CHECK(a.sim_time < s.sim_time);
  CHECK(ref.steps == a.steps);
  CHECK(ref.sim_time == a.sim_time);
  CHECK(ref.counters.preemptions == a.counters.preemptions);
  CHECK(ref.ttft_ms.mean == a.ttft_ms.mean);
  CHECK(ref.kv.evicted_blocks == a.kv.evicted_blocks);
}

TEST_CASE("async scheduling: what it does not model is a config error at its key") {
  TempDir dir;
  const std::string root = source_root();
  const std::string base = fmt::format(R"(experiment: async
gpu: {0}/configs/gpus/h200.yaml
model: {0}/configs/models/llama-3.1-8b.yaml
engine: {{kv_budget: 4GiB, max_model_len: 4096}}
kv: {{impl: paged_block_pool}}
)",
                                       root);
  const std::string reqs =
      "requests: {source: synthetic, count: 4, arrival: {process: burst}, prompt: {dist: fixed, "
      "value: 20}, output: {dist: fixed, value: 4}";
  const ServingConfig ok = load_serving_config(
      dir.write("ok.yaml", base + reqs + "}\nscheduler: {async_scheduling: true}\n"), {});
  REQUIRE(ok.runs.size() == 1);
  CHECK(ok.runs[0].serve.async_scheduling);

  // Another scheduler, under a top level that turned it on.
  CHECK_THROWS_WITH(
      load_serving_config(dir.write("static.yaml", base + reqs +
                                                       "}\nscheduler: {async_scheduling: true}\n"
                                                       "runs:\n  - scheduler: {impl: "
                                                       "static_batch}\n"),
                          {}),
      Catch::Contains("static.yaml:") && Catch::Contains("scheduler") &&
          Catch::Contains("'static_batch' has no async scheduling"));
  // Swapping.
  CHECK_THROWS_WITH(
      load_serving_config(
          dir.write("swap.yaml",
                    base + reqs + "}\nscheduler: {async_scheduling: true, preemption: swap}\n"),
          {}),
      Catch::Contains("swap.yaml:") && Catch::Contains("scheduler.preemption") &&
          Catch::Contains("no preemption by swapping"));
  // Requests of several samples.
  CHECK_THROWS_WITH(
      load_serving_config(
          dir.write("n.yaml", base + reqs + ", n: 2}\nscheduler: {async_scheduling: true}\n"), {}),
      Catch::Contains("n.yaml:") && Catch::Contains("scheduler.async_scheduling") &&
          Catch::Contains("n > 1 or beams"));
  // The engine refuses what it does not model even when built by hand.
  EngineConfig e = engine(64, true);
  e.serve.preemption = Preemption::kSwap;
  const ServingResult r = run_serving(e, std::vector<RequestSpec>{serve_request(0, 10, 2)});
  CHECK_THAT(r.error, Catch::Contains("async_scheduling") && Catch::Contains("swapping"));
}

}  // namespace memsim::test
