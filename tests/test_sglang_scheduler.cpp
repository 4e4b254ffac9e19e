// The sglang scheduler against SGLang's own rules, step by step on hand-derived cases
// (python/sglang/srt/managers/schedule_policy.py PrefillAdder, scheduler.py
// get_next_batch_to_run, schedule_batch.py retract_decode, new_token_ratio_tracker.py): prefill
// before decode, admission against the running requests' reservations scaled by
// new_token_ratio and its decay, the batch marked full until a request leaves, retraction
// (fewest outputs, then longest input) with the new ratio, and the waiting queue's policies.
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

// What each step ran: (request, tokens) in plan order.
using Step = std::vector<std::pair<uint64_t, uint32_t>>;

class RecordingExecutor final : public StepExecutor {
 public:
  explicit RecordingExecutor(std::vector<Step>* out) : out_(out) {}
  Status begin(KvCacheManager&, Backend&, DevPtr, uint64_t) override { return {}; }
  Status run_step(const StepWork& w) override {
    Step s;
    for (const StepSeq& q : w.seqs) s.emplace_back(q.request, q.new_tokens);
    out_->push_back(std::move(s));
    return {};
  }
  Status swap_out(SeqId, SeqId, const TokenContent&, uint32_t) override { return {}; }
  Status swap_in(SeqId, const TokenContent&, uint32_t) override { return {}; }
  Status swap_drop(SeqId) override { return {}; }
  void end() override {}
  ExecutorReport report() const override { return {}; }

 private:
  std::vector<Step>* out_;
};

// Llama-3.1-8B on the H200, SGLang's radix pool (page 1) of `tokens` token slots, every step
// 1 ms (a flat profile), the sglang scheduler with `ratio` as its initial new_token_ratio
// (conservativeness 1), minimum 0.2 x that, reached over `decay_steps` decode steps.
EngineConfig engine(uint32_t tokens, double ratio, uint32_t decay_steps, std::vector<Step>* log) {
  EngineConfig e;
  e.model = model_from_configs("llama-3.1-8b");
  e.gpu = gpu_from_configs("h200");
  e.kv_impl = "radix_token_pool";
  e.kv_factory = kv_strategies().find(e.kv_impl)->parse(
      ConfigNode::parse("{impl: radix_token_pool, page_size: 1}", "t"));
  // (tokens + 1) slots: slot 0 is SGLang's padding slot.
  e.kv_budget_bytes = uint64_t{tokens + 1} * e.model.kv_bytes_per_token();
  e.scheduler = "sglang";
  e.serve.max_model_len = 4096;
  e.serve.max_num_batched_tokens = 8192;
  e.serve.preemption = Preemption::kRecompute;
  e.serve.victim = Victim::kFewestDecoded;
  e.serve.sglang.init_new_token_ratio = ratio;
  e.serve.sglang.min_new_token_ratio_factor = 0.2;
  e.serve.sglang.new_token_ratio_decay_steps = decay_steps;
  e.step_profile = flat_step_profile(1.0);
  if (log) e.executor = [log] { return std::make_unique<RecordingExecutor>(log); };
  return e;
}

// A request of 72 prompt tokens whose first 64 are prompt family `group`'s.
RequestSpec family_request(uint64_t id, int32_t group, uint32_t output, SimTime arrival) {
  RequestSpec q = serve_request(id, 72, output, arrival);
  q.prefix_group = group;
  q.prefix_tokens = 64;
  return q;
}

// The requests in the order of their prefills under `policy`, one running at a time.
std::vector<uint64_t> prefill_order(const std::vector<RequestSpec>& reqs,
                                    SglangOptions::Policy policy) {
  std::vector<Step> steps;
  EngineConfig e = engine(4000, 0.7, 600, &steps);
  e.serve.sglang.policy = policy;
  e.serve.sglang.max_running_requests = 1;
  const ServingResult r = run_serving(e, reqs);
  INFO(r.error);
  REQUIRE(r.error.empty());
  std::vector<uint64_t> first;
  for (const Step& s : steps)
    for (const auto& [req, tokens] : s)
      if (tokens > 1) first.push_back(req);
  return first;
}

}  // namespace

// A pool of 2,000 tokens; A (100 + 300) and C (10 + 2) at t = 0, B (100 + 1,650) at 0.5 ms.
// new_token_ratio starts at 0.5 and decays by (0.5 - 0.1) / 4 = 0.1 a decode step.
// Step 1 is a prefill batch of A (100 + 300 = 400 < 2,000: admitted; 1,600 left) and C (12).
// Step 2: B waits. rem_total = 2,000 - 110 held - (299 + 1) x 0.5 reserved = 1,740, and B needs
//   100 + 1,650 = 1,750: NO_TOKEN, the batch is marked full; A and C decode, the ratio falls to
//   0.4, C finishes.
// Step 3: C left the batch, so admission is tried again: 2,000 - 101 - 298 x 0.4 = 1,779.8 >
//   1,750: B's prefill, alone (prefill first; A does not decode in it).
// Without decay (the minimum at the initial ratio) step 3 finds 2,000 - 101 - 149 = 1,750, not
// more than B's 1,750: the batch is full again and B waits until A has finished (step 300).
TEST_CASE("sglang: admission against the running requests' reservations, new_token_ratio decays") {
  const std::vector<RequestSpec> reqs = {serve_request(0, 100, 300), serve_request(1, 10, 2),
                                         serve_request(2, 100, 1650, 500'000)};
  std::vector<Step> steps;
  const ServingResult r = run_serving(engine(2000, 0.5, 4, &steps), reqs);
  INFO(r.error);
  REQUIRE(r.error.empty());
  REQUIRE(steps.size() >= 3);
  CHECK(steps[0] == Step{{0, 100}, {1, 10}});
  CHECK(steps[1] == Step{{0, 1}, {1, 1}});
  CHECK(steps[2] == Step{{2, 100}});
  CHECK(steps[3] == Step{{0, 1}, {2, 1}});
  CHECK(r.finished == 3);

  std::vector<Step> flat;
  EngineConfig e = engine(2000, 0.5, 4, &flat);
  e.serve.sglang.min_new_token_ratio_factor = 1.0;  // min = init: no decay
  const ServingResult f = run_serving(e, reqs);
  REQUIRE(f.error.empty());
  REQUIRE(flat.size() >= 301);
  CHECK(flat[2] == Step{{0, 1}});                                           // A decodes alone
  CHECK(flat[299] == Step{{0, 1}});                                         // A's 300th token
  CHECK(flat[300] == Step{{2, 100}});                                       // then B
  CHECK(f.ttft_ms.mean == Approx((1.0 + 1.0 + 300.5) / 3).epsilon(1e-12));  // B: 301 - 0.5 ms
}

// A pool of 100 tokens, A (10 + 60) at 0 and B (20 + 60) at 0.5 ms; ratio 0.01 (no decay to
// speak of). Step 1 admits A (70 < 100). Step 2 admits B: 100 - 10 - 59 x 0.01 = 89.41 > 80
// (had B come with A, step 1 would have refused it, 80 >= 100 - 70, and marked the batch full
// until A left). From step 3 both decode, one slot each a step: after d decode steps A
// holds 10 + d and B 20 + d, and step 3 + d needs 2 of 70 - 2d free. At d = 35 none is free:
// both have 36 outputs, so the longer input, B, is retracted (its prompt stays cached), to the
// back of the queue. A decodes alone from step 38 and finishes at step 61 (its 60th token);
// the ratio is now min(1, (36 + 20) / (60 + 1)). B comes back in step 62: its 56 tokens with its
// 20-token prompt cached, which samples its 37th token, then 23 decodes to its 60th at step 85.
TEST_CASE("sglang: retraction takes the fewest outputs, then the longest input, to the back") {
  const std::vector<RequestSpec> reqs = {serve_request(0, 10, 60),
                                         serve_request(1, 20, 60, 500'000)};
  std::vector<Step> steps;
  const ServingResult r = run_serving(engine(100, 0.01, 600, &steps), reqs);
  INFO(r.error);
  REQUIRE(r.error.empty());
  CHECK(steps[0] == Step{{0, 10}});
  CHECK(steps[1] == Step{{1, 20}});
  CHECK(steps[2] == Step{{0, 1}, {1, 1}});
  CHECK(steps[36] == Step{{0, 1}, {1, 1}});  // d = 34
  CHECK(steps[37] == Step{{0, 1}});          // B retracted
  CHECK(steps[60] == Step{{0, 1}});          // A's last
  CHECK(steps[61] == Step{{1, 36}});         // B again: 56 tokens, 20 cached
  CHECK(steps.size() == 85);
  CHECK(steps[84] == Step{{1, 1}});  // B's last
  CHECK(r.steps == 85);
  CHECK(r.counters.preemptions == 1);
  CHECK(r.counters.prefix_hit_tokens == 20);
  CHECK(r.finished == 2);
  CHECK(r.output_tokens == 120);
}

// max_running_requests 1, so requests run one at a time in the policy's order. P (a prompt
// family X: 64 shared + 8 own tokens) runs first and leaves X cached; then four wait: Y1, X1, Y2,
// X2 (X* share X's 64 tokens; Y* share nothing cached). fcfs runs them as they came; lpm the
// X's first (64 cached), then the Y's, each group in queue order; lof the longest output first.
TEST_CASE("sglang: the waiting queue's order under fcfs, lpm and lof") {
  auto make = [](uint64_t id, int32_t group, uint32_t output) {
    return family_request(id, group, output, 0);
  };
  const std::vector<RequestSpec> reqs = {make(0, 0, 2), make(1, 1, 2), make(2, 0, 3), make(3, 1, 4),
                                         make(4, 0, 5)};
  auto order = [&](SglangOptions::Policy p) { return prefill_order(reqs, p); };
  CHECK(order(SglangOptions::Policy::kFcfs) == std::vector<uint64_t>{0, 1, 2, 3, 4});
  CHECK(order(SglangOptions::Policy::kLpm) == std::vector<uint64_t>{0, 2, 4, 1, 3});
  CHECK(order(SglangOptions::Policy::kLof) == std::vector<uint64_t>{4, 3, 2, 0, 1});
}

// Two prompt families, X and Z (64 shared tokens each), both cached by a first request each
// (at t = 0); at 50 ms X1, Z1, Z2, Z3 arrive, one running at a time. lpm: every match is 64
// tokens, so the queue's order stays (X1 first). dfs-weight: the radix tree's heavier subtree
// first: Z1 (Z has three waiting, X one), Z2 (two against one), then a tie of one each, which
// goes to the older subtree (SGLang: the root's children in insertion order), X1, then Z3.
TEST_CASE("sglang: dfs-weight walks the heaviest subtree first") {
  auto make = [](uint64_t id, int32_t group, SimTime at) {
    return family_request(id, group, 2, at);
  };
  const std::vector<RequestSpec> reqs = {make(0, 0, 0),          make(1, 1, 0),
                                         make(2, 0, 50'000'000), make(3, 1, 50'000'000),
                                         make(4, 1, 50'000'000), make(5, 1, 50'000'000)};
  auto order = [&](SglangOptions::Policy p) { return prefill_order(reqs, p); };
  CHECK(order(SglangOptions::Policy::kLpm) == std::vector<uint64_t>{0, 1, 2, 3, 4, 5});
  CHECK(order(SglangOptions::Policy::kDfsWeight) == std::vector<uint64_t>{0, 1, 3, 4, 2, 5});
}

TEST_CASE("sglang: its keys in a config, and what it refuses") {
  TempDir dir;
  const std::string root = source_root();
  const std::string base = fmt::format(R"(experiment: sg
gpu: {0}/configs/gpus/h200.yaml
model: {0}/configs/models/llama-3.1-8b.yaml
engine: {{kv_budget: 4GiB, max_model_len: 4096}}
kv: {{impl: radix_token_pool}}
requests: {{source: synthetic, count: 50, arrival: {{process: poisson, rate: 20}}, prompt: {{dist: fixed, value: 200}}, output: {{dist: fixed, value: 20}}}}
)",
                                       root);
  const ServingConfig c = load_serving_config(
      dir.write("ok.yaml", base + "scheduler: {impl: sglang, schedule_policy: lpm, "
                                  "chunked_prefill_size: 512, max_running_requests: 64}\n"),
      {});
  REQUIRE(c.runs.size() == 1);
  const ServeOptions& o = c.runs[0].serve;
  CHECK(o.sglang.policy == SglangOptions::Policy::kLpm);
  CHECK(o.max_num_batched_tokens == 512);
  CHECK(o.sglang.max_running_requests == 64);
  CHECK(o.victim == Victim::kFewestDecoded);
  const ServingResults out = run_serving_experiment(c);
  CHECK(out.runs[0].result.error.empty());
  CHECK(out.runs[0].result.finished == 50);

  // vLLM's names are not SGLang's: the closest valid key is named.
  CHECK_THROWS_WITH(load_serving_config(dir.write("bad.yaml", base + "scheduler: {impl: sglang, "
                                                                     "max_num_seqs: 64}\n"),
                                        {}),
                    Catch::Contains("bad.yaml:") && Catch::Contains("scheduler.max_num_seqs") &&
                        Catch::Contains("max_running_requests"));
  CHECK_THROWS_WITH(
      load_serving_config(
          dir.write("pol.yaml", base + "scheduler: {impl: sglang, schedule_policy: lifo}\n"), {}),
      Catch::Contains("pol.yaml:") && Catch::Contains("scheduler.schedule_policy"));
}

}  // namespace memsim::test
