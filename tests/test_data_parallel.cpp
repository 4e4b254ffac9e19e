// Data parallelism in serving: vLLM's load balancer (score 4 x waiting + running, local waiting
// increments between publications), replica engines on one timeline, the merged figures, and
// one replica equal to the plain engine.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/serve/dp_serving.h"
#include "src/serve/engine.h"
#include "tests/kv_test_util.h"
#include "tests/serve_test_util.h"

namespace memsim::test {
namespace {

EngineConfig engine(uint64_t budget) {
  EngineConfig e;
  e.model = model_from_configs("llama-3.1-8b");
  e.gpu = gpu_from_configs("h200");
  const ConfigNode node = ConfigNode::parse("{impl: paged_block_pool}", "test.yaml");
  e.kv_impl = "paged_block_pool";
  e.kv_factory = kv_strategies().find(e.kv_impl)->parse(node);
  e.kv_budget_bytes = budget;
  e.serve.max_model_len = 4096;
  e.sample_interval = 50'000'000;
  return e;
}

std::vector<RequestSpec> synthetic(uint64_t count, double rate) {
  SyntheticRequestsConfig s;
  s.count = count;
  s.seed = 11;
  s.arrival.rate = rate;
  s.prompt = {LengthDist::kLognormal, 0, 16, 2048, 400, 0.8};
  s.output = {LengthDist::kUniform, 0, 4, 300, 0, 0};
  return generate_requests(s);
}

}  // namespace

TEST_CASE("dp balancer: least 4 x waiting + running, the first on a tie, then waiting + 1",
          "[dp]") {
  DpLoadBalancer lb(3);
  // Nothing published: every engine scores 0, then its own increments spread the requests.
  CHECK(lb.choose() == 0);
  CHECK(lb.choose() == 1);
  CHECK(lb.choose() == 2);
  CHECK(lb.choose() == 0);
  CHECK(lb.view()[0].waiting == 2);
  // A publication replaces the view: scores 4 x 1 + 2 = 6, 0 + 5 = 5, 4 x 1 + 1 = 5.
  lb.publish({{1, 2}, {0, 5}, {1, 1}});
  CHECK(lb.choose() == 1);  // 5, and first of the two at 5
  CHECK(lb.view()[1].waiting == 1);
  CHECK(lb.choose() == 2);  // now 6, 9, 5
  CHECK(lb.choose() == 0);  // 6, 9, 9
}

TEST_CASE("dp serving: one replica is the plain engine, exactly", "[dp]") {
  const EngineConfig e = engine(4 * kGiB);
  const RequestTable reqs(synthetic(200, 20));
  const ServingResult plain = run_serving(e, reqs);
  const DpServingResult one = run_serving_dp(e, reqs, 1);
  REQUIRE(plain.error.empty());
  REQUIRE(one.merged.error.empty());
  const ServingResult& d = one.merged;
  CHECK(one.assigned == std::vector<uint64_t>{200});
  CHECK(d.finished == plain.finished);
  CHECK(d.steps == plain.steps);
  CHECK(d.sim_time == plain.sim_time);
  CHECK(d.output_tokens == plain.output_tokens);
  CHECK(d.ttft_ms.p50 == plain.ttft_ms.p50);
  CHECK(d.ttft_ms.p99 == plain.ttft_ms.p99);
  CHECK(d.tpot_ms.p50 == plain.tpot_ms.p50);
  CHECK(d.e2e_ms.p99 == plain.e2e_ms.p99);
  CHECK(d.max_running_seqs == plain.max_running_seqs);
  CHECK(d.counters.preemptions == plain.counters.preemptions);
  CHECK(one.replicas.front().samples.size() == plain.samples.size());
}

TEST_CASE("dp serving: a small trace over two replicas", "[dp]") {
  const EngineConfig e = engine(4 * kGiB);
  // Three requests inside the first 100 ms go 0, 1, 0 (no publication yet: the front-end's own
  // increments). By 300 ms the coordinator has published (0 waiting, 2 running) and (0, 1): the
  // next goes to 1 (score 1 < 2; its view is then (1, 1): 5), the one after to 0 (2 < 5; then
  // 6), the last to 1 (5 < 6).
  std::vector<RequestSpec> specs = {
      serve_request(0, 512, 400, 0),          serve_request(1, 512, 400, 10'000'000),
      serve_request(2, 512, 400, 20'000'000), serve_request(3, 64, 8, 300'000'000),
      serve_request(4, 64, 8, 300'000'001),   serve_request(5, 64, 8, 300'000'002),
  };
  const RequestTable reqs(specs);
  const DpServingResult r = run_serving_dp(e, reqs, 2);
  REQUIRE(r.merged.error.empty());
  REQUIRE(r.replicas.size() == 2);
  CHECK(r.assigned == std::vector<uint64_t>{3, 3});
  CHECK(r.replicas[0].requests == 3);
  CHECK(r.replicas[1].requests == 3);
  CHECK(r.merged.requests == 6);
  CHECK(r.merged.finished == 6);
  CHECK(r.merged.output_tokens == 3 * 400 + 3 * 8);
  CHECK(r.replicas[0].output_tokens == 400 + 400 + 8);  // requests 0, 2, 4
  CHECK(r.replicas[1].output_tokens == 400 + 8 + 8);    // requests 1, 3, 5
  CHECK(r.merged.sim_time == std::max(r.replicas[0].sim_time, r.replicas[1].sim_time));
  CHECK(r.merged.steps == r.replicas[0].steps + r.replicas[1].steps);
  CHECK(r.merged.kv.total_blocks == 2 * r.replicas[0].kv.total_blocks);
}

TEST_CASE("dp serving: new counts are published even when they equal the last published", "[dp]") {
  // Request 0 goes to engine 0 at 0 ms, runs (engine 0 reports one running) and finishes within
  // the first 100 ms (it reports none), so at the 100 ms mark the engines' counts are back to the
  // published (0, 0), (0, 0). Engine 0 reported new counts meanwhile, so the coordinator
  // publishes (vLLM's stats_changed), which resets the front-end's own +1 for engine 0: request 1
  // at 150 ms ties and goes to engine 0. Without the publication it would see engine 0 at one
  // waiting and pick engine 1. (A request done in its first step changes no count after a step,
  // so nothing is reported, as in vLLM.)
  const EngineConfig e = engine(4 * kGiB);
  const RequestTable reqs(
      std::vector<RequestSpec>{serve_request(0, 32, 3, 0), serve_request(1, 32, 1, 150'000'000)});
  const DpServingResult r = run_serving_dp(e, reqs, 2);
  REQUIRE(r.merged.error.empty());
  CHECK(r.merged.finished == 2);
  CHECK(r.assigned == std::vector<uint64_t>{2, 0});
}

TEST_CASE("dp serving: two replicas halve a saturated engine's queue", "[dp]") {
  const EngineConfig e = engine(4 * kGiB);
  const RequestTable reqs(synthetic(400, 200));
  const ServingResult one = run_serving(e, reqs);
  const DpServingResult two = run_serving_dp(e, reqs, 2);
  REQUIRE(two.merged.error.empty());
  CHECK(two.merged.finished == 400);
  CHECK(two.assigned[0] + two.assigned[1] == 400);
  CHECK(two.merged.output_tokens == one.output_tokens);
  CHECK(two.merged.sim_time < one.sim_time);
  CHECK(two.merged.ttft_ms.p50 < one.ttft_ms.p50);
  // Waste is a share of each replica's own slots: the merged figure lies between theirs.
  const double lo = std::min(two.replicas[0].waste_pct, two.replicas[1].waste_pct);
  const double hi = std::max(two.replicas[0].waste_pct, two.replicas[1].waste_pct);
  CHECK(two.merged.waste_pct >= lo - 1e-9);
  CHECK(two.merged.waste_pct <= hi + 1e-9);
  CHECK(two.merged.waste_pct > 0);
}

// Requests rejected on arrival wait in the state's finished list until the engine records them;
// more than the group window's compaction threshold (1,024) arriving before a step used to be
// erased from the window first, and the engine then wrote through a stale index (a crash found
// by tools/mutate_cli.py: dp_serving.yaml with max_model_len 64).
TEST_CASE("dp serving: thousands of requests rejected on arrival are all recorded", "[dp]") {
  EngineConfig e = engine(4 * kGiB);
  e.serve.max_model_len = 64;
  std::vector<RequestSpec> specs;
  for (uint64_t i = 0; i < 3000; ++i) specs.push_back(serve_request(i, 128, 8, 0));  // prompt > 64
  specs.push_back(serve_request(3000, 32, 8, 1'000'000));
  const RequestTable reqs(specs);
  for (uint32_t replicas : {1u, 2u}) {
    INFO(replicas << " replicas");
    const DpServingResult r = run_serving_dp(e, reqs, replicas);
    REQUIRE(r.merged.error.empty());
    CHECK(r.merged.requests == 3001);
    CHECK(r.merged.finished == 1);  // the one that fits; the rest are rejected, not finished
    CHECK(r.merged.rejected == 3000);
    CHECK(r.merged.output_tokens == 8);
  }
}

}  // namespace memsim::test
