// The serving engine with a step executor (the content executor of engine.validate_content):
// every strategy reads its own tokens through its tables while serving prefix sharing, parallel
// samples, beams, preemption by recompute and by swap; validation leaves the simulation as it
// was; a wrong table fails the run naming the request, sample and step.
#include <catch2/catch.hpp>
#include <cstdlib>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/serve/content_executor.h"
#include "src/serve/engine.h"
#include "src/serve/serve_state.h"
#include "tests/kv_test_util.h"

namespace memsim::test {
namespace {

GpuSpec h200() {
  return gpu_from_configs("h200");
}

struct Load {
  const char* name;
  uint32_t prefix_groups = 0, n = 1, beam = 1;
  uint64_t budget = 6 * kGiB;
  Preemption preemption = Preemption::kRecompute;
};

// Requests per load: 120, or MEMSIM_STEP_EXECUTOR_REQUESTS (fewer under the sanitizers in CI:
// the same loads and strategies, shorter runs).
uint64_t request_count() {
  const char* v = std::getenv("MEMSIM_STEP_EXECUTOR_REQUESTS");
  return v != nullptr ? std::strtoull(v, nullptr, 10) : 120;
}

std::vector<RequestSpec> requests(const Load& l) {
  SyntheticRequestsConfig s;
  s.count = request_count();
  s.seed = 11;
  s.arrival.rate = 40;
  s.prompt = {LengthDist::kLognormal, 0, 16, 2048, 500, 0.8};
  s.output = {LengthDist::kUniform, 0, 4, 200, 0, 0};
  if (l.prefix_groups) s.prefix = {l.prefix_groups, 256, 1.0};
  s.n = l.n;
  s.beam_width = l.beam;
  return generate_requests(s);
}

EngineConfig engine(const std::string& kv_yaml, const Load& l) {
  EngineConfig e;
  e.model = model_from_configs("llama-3.1-8b");
  e.gpu = h200();
  const ConfigNode node = ConfigNode::parse(kv_yaml, "test.yaml");
  e.kv_impl = node["impl"].as_string();
  e.kv_factory = kv_strategies().find(e.kv_impl)->parse(node);
  e.kv_budget_bytes = l.budget;
  e.serve.max_model_len = 4096;
  e.serve.preemption = l.preemption;
  e.serve.swap_space = 16 * kGiB;
  e.executor = [] { return std::make_unique<ContentExecutor>(); };
  e.validate_sample = 0.2;
  return e;
}

const std::vector<Load>& loads() {
  static const std::vector<Load> all = {
      {"prefix groups", 4},
      {"n = 4 samples", 0, 4},
      {"beam 4", 0, 1, 4},
      {"overload, recompute", 2, 1, 1, 1 * kGiB, Preemption::kRecompute},
      {"overload, swap", 0, 1, 1, 1 * kGiB, Preemption::kSwap},
      {"n = 4 overload, swap", 0, 4, 1, 2 * kGiB, Preemption::kSwap},
      // Beams are swapped whatever the mode (vLLM V0): the swap space must exist under recompute.
      {"beam 4 overload, recompute", 0, 1, 4, 1 * kGiB, Preemption::kRecompute},
  };
  return all;
}

TEST_CASE("every strategy's sequences read their own tokens while serving") {
  for (const char* kv :
       {"{impl: paged_block_pool}", "{impl: paged_block_pool, block_size: 1}",
        "{impl: paged_block_pool, layout: per_layer}",
        "{impl: paged_block_pool, copy_on_write: false}", "{impl: radix_token_pool}",
        "{impl: radix_token_pool, page_size: 16}", "{impl: static_contiguous}",
        "{impl: vmm_contiguous}", "{impl: vmm_contiguous, reclaim: eager}",
        "{impl: vmm_contiguous, physical: on_demand, reclaim: eager, allocation: sync}"}) {
    for (const Load& l : loads()) {
      const auto reqs = requests(l);
      const ServingResult r = run_serving(engine(kv, l), reqs);
      INFO(kv << ", " << l.name << ": " << r.error);
      REQUIRE(r.error.empty());
      CHECK(r.finished + r.rejected == reqs.size());  // a beam group may never fit: rejected
      REQUIRE(r.executed);
      CHECK(r.validation.kind == "content");
      CHECK(r.validation.failure.empty());
      CHECK(r.validation.steps == r.steps);
      CHECK(r.validation.checked_steps > 0);
      CHECK(r.validation.checked_seqs > 0);
      if (r.counters.swap_ins > 0) CHECK(r.validation.swaps > 0);
    }
  }
}

TEST_CASE("swap preemption happens in the swap loads (the checks above cover swap-ins)") {
  for (const Load& l : loads()) {
    // Swap mode, or several samples / beams under pressure (swapped whatever the mode).
    const bool swaps =
        l.preemption == Preemption::kSwap || ((l.n > 1 || l.beam > 1) && l.budget < 2 * kGiB);
    if (!swaps) continue;
    const ServingResult r = run_serving(engine("{impl: paged_block_pool}", l), requests(l));
    INFO(l.name);
    REQUIRE(r.error.empty());
    CHECK(r.counters.swap_ins > 0);
    CHECK(r.validation.swaps >= r.counters.swap_ins);  // every sequence of a swapped group
  }
}

// Found by this validation (2026-11-22): radix_token_pool with beams swapped out and back in
// under overload. A swap-in that did not fit released the sequences it had already regrown, and
// the release inserted their pages into the tree although nothing had been written to them; a
// later fork of those beams (cache_unfinished_req) found them there and put them in place of a
// beam's own pages in its table ("request 80 sample 1, step 741 ... position 0 ... written by
// seq 340"). The engine now releases only the KV it computed (release's content ends there) and
// the pool inserts only those tokens, as SGLang inserts kv_committed_len tokens.
TEST_CASE("radix_token_pool keeps its tables right when beams are swapped") {
  for (const char* kv : {"{impl: radix_token_pool}", "{impl: radix_token_pool, page_size: 16}"}) {
    const Load l{"beam 4 overload, recompute", 0, 1, 4, 1 * kGiB, Preemption::kRecompute};
    const ServingResult r = run_serving(engine(kv, l), requests(l));
    INFO(kv << ": " << r.error);
    CHECK(r.error.empty());
    CHECK(r.counters.swap_ins > 0);
    CHECK(r.validation.failure.empty());
  }
}

TEST_CASE("a swap-in that does not fit releases what it regrew without caching it") {
  // A pool of 90 one-token pages; two beams of 50 tokens (49 computed) come back from the swap
  // space: the first regrows, the second does not fit, and the first is released again.
  KvInit init;
  init.layers = 1;
  init.kv_bytes_per_token = 1024;
  init.budget_bytes = 91 * 1024;  // SGLang's padding page plus 90 pages
  init.max_num_seqs = 8;
  init.max_model_len = 4096;
  KvRig rig("{impl: radix_token_pool}", init);
  GroupWindow groups;
  Group& G = groups.add();
  G.spec.prompt_tokens = 40;
  G.spec.output_tokens = 20;
  G.spec.beam_width = G.width = 2;
  G.outputs = 10;
  G.computed = 49;
  G.status = GroupStatus::kSwapped;
  for (SeqId id : {0u, 1u}) {
    Sequence s;
    s.id = id;
    s.content = TokenContent(7, 40);
    s.content.append(100 + id, 20);
    G.seqs.push_back(std::move(s));
  }
  ServeState state(*rig.kv, ServeOptions{}, groups);
  state.swapped.push_back(0);
  CHECK_FALSE(state.swap_in(0, 1));  // its 49 tokens back plus the step's one
  rig.check();
  const KvStats s = rig.kv->stats();
  CHECK(s.used_blocks == 0);
  CHECK(s.cached_blocks == 0);  // it held no KV: nothing may enter the tree
  CHECK(s.free_blocks == 90);
  CHECK(rig.kv->lookup_prefix(G.seqs[0].content.slice(0, 50)) == 0);
  CHECK(G.seqs[0].kv_tokens == 0);
  CHECK(state.counters().swap_ins == 0);
}

TEST_CASE("validation leaves the simulated figures as the step-by-step path gives them") {
  for (const Load& l : loads()) {
    const auto reqs = requests(l);
    EngineConfig e = engine("{impl: radix_token_pool, page_size: 4}", l);
    const ServingResult checked = run_serving(e, reqs);
    e.executor = nullptr;
    e.fast_decode = false;
    const ServingResult plain = run_serving(e, reqs);
    INFO(l.name);
    REQUIRE(checked.error.empty());
    REQUIRE(plain.error.empty());
    CHECK(checked.sim_time == plain.sim_time);
    CHECK(checked.steps == plain.steps);
    CHECK(checked.output_tokens == plain.output_tokens);
    CHECK(checked.ttft_ms.p99 == plain.ttft_ms.p99);
    CHECK(checked.counters.preemptions == plain.counters.preemptions);
    CHECK(checked.kv.cow_copies == plain.kv.cow_copies);
    CHECK(checked.peak_used_blocks == plain.peak_used_blocks);
  }
}

TEST_CASE("a wrong block table fails the run naming the request, sample and step") {
  const Load l{"plain", 0};
  EngineConfig e = engine("{impl: paged_block_pool}", l);
  const KvFactory real = e.kv_factory;
  e.kv_factory = [real] {
    auto lying = std::make_unique<LyingTable>(real());
    // Once a sequence's table grew past its first size (a decode crossed into a new block), it
    // reports blocks 0 and 1 swapped: rows written at prefill are then read from the wrong block.
    auto first = std::make_shared<std::map<SeqId, size_t>>();
    lying->lie = [first](SeqId s, std::vector<int32_t>* t) {
      const size_t at_first = first->emplace(s, t->size()).first->second;
      if (t->size() > at_first && t->size() >= 2) std::swap((*t)[0], (*t)[1]);
    };
    return lying;
  };
  e.validate_sample = 1.0;  // check every step
  const ServingResult r = run_serving(e, requests(l));
  INFO(r.error);
  CHECK(r.error.rfind("request ", 0) == 0);
  CHECK(r.error.find(" sample 0, step ") != std::string::npos);
  CHECK(r.error.find(" position 0 layer 0 K: row ") != std::string::npos);
  CHECK(r.error.find("of position 16") != std::string::npos);
  CHECK(r.validation.failure == r.error);
}

// The content executor, timed: each step "takes" 1 ms plus 1 us per computed token.
class TimedExecutor final : public StepExecutor {
 public:
  Status begin(KvCacheManager& kv, Backend& b, DevPtr swap, uint64_t bytes) override {
    return inner_.begin(kv, b, swap, bytes);
  }
  Status run_step(const StepWork& w) override {
    uint64_t tokens = 0;
    for (const StepSeq& s : w.seqs) tokens += s.new_tokens;
    last_ = 1'000'000 + 1'000 * static_cast<SimTime>(tokens);
    return inner_.run_step(w);
  }
  Status swap_out(SeqId s, SeqId src, const TokenContent& c, uint32_t t) override {
    return inner_.swap_out(s, src, c, t);
  }
  Status swap_in(SeqId s, const TokenContent& c, uint32_t t) override {
    return inner_.swap_in(s, c, t);
  }
  Status swap_drop(SeqId s) override { return inner_.swap_drop(s); }
  void end() override { inner_.end(); }
  ExecutorReport report() const override { return inner_.report(); }
  SimTime measured_step_ns() const override { return last_; }
  double measured_step_gpu_ms() const override { return 0.9 * double(last_) / 1e6; }

 private:
  ContentExecutor inner_;
  SimTime last_ = 0;
};

TEST_CASE("a measured clock advances each step by the executor's measured time") {
  EngineConfig e = engine("{impl: paged_block_pool}", Load{"plain", 0});
  e.executor = [] { return std::make_unique<TimedExecutor>(); };
  e.measured_clock = true;
  // One request: a 1,000-token prefill step (2 ms), then 4 decode steps (1.001 ms each).
  std::vector<RequestSpec> one(1);
  one[0].prompt_tokens = 1000;
  one[0].output_tokens = 5;
  const ServingResult r = run_serving(e, one);
  REQUIRE(r.error.empty());
  CHECK(r.step_time_source == "measured");
  CHECK(r.steps == 5);
  CHECK(r.sim_time == 2'000'000 + 4 * 1'001'000);
  CHECK(r.ttft_ms.p50 == Approx(2.0).epsilon(1e-12));
  CHECK(r.tpot_ms.p50 == Approx(1.001).epsilon(1e-12));
  CHECK(r.e2e_ms.p50 == Approx(6.004).epsilon(1e-12));
  REQUIRE(r.measured_steps.size() == 5);
  CHECK(r.measured_steps[0].measured == 2'000'000);
  CHECK(r.measured_steps[0].shape.new_tokens == 1000);
  CHECK(r.measured_steps[4].measured == 1'001'000);
  CHECK(r.measured_steps[4].shape.decode_seqs == 1);
  CHECK(r.measured_steps[4].shape.decode_kv_tokens == 1004);
  CHECK(r.measured_steps[4].predicted > 0);          // the roofline's figure for the same step
  CHECK(r.measured_steps[0].gpu_ms == Approx(1.8));  // the executor's GPU share, as it says
  // Issued in order, on the host's wall clock (seconds since the epoch: after 2020).
  CHECK(r.measured_steps[0].wall_s > 1.5e9);
  for (size_t i = 1; i < r.measured_steps.size(); ++i)
    CHECK(r.measured_steps[i].wall_s >= r.measured_steps[i - 1].wall_s);

  e.executor = nullptr;  // nothing measures the steps
  const ServingResult none = run_serving(e, one);
  CHECK(none.error == "measured_clock needs a step executor that times its steps");
}

}  // namespace
}  // namespace memsim::test
