// The schedulers against states where a request could be neither scheduled nor preempted
// (issue 29, item 6): a request resumed after recompute that has output tokens, swap-ins,
// samples and beams larger than the budget or max_num_seqs, prefix hits, prompts larger than
// the pool; and the engine's invariant that every step schedules work, advances to the next
// arrival, ends a request that can never run, or fails naming the request and why.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "src/serve/content_executor.h"
#include "src/serve/engine.h"
#include "src/serve/scheduler_registry.h"
#include "src/serve/serving_experiment.h"
#include "tests/kv_test_util.h"
#include "tests/serve_test_util.h"
#include "workload/requests.h"

namespace memsim::test {
namespace {

using Catch::Matchers::Contains;

// Llama-3.1-8B on the H200 (roofline step time), a paged pool from `kv_yaml`, a 64-token budget.
EngineConfig engine(const std::string& kv_yaml) {
  EngineConfig e;
  e.model = model_from_configs("llama-3.1-8b");
  e.gpu = gpu_from_configs("h200");
  const ConfigNode node = ConfigNode::parse(kv_yaml, "test.yaml");
  e.kv_impl = node["impl"].as_string();
  e.kv_factory = kv_strategies().find(e.kv_impl)->parse(node);
  e.kv_budget_bytes = 1 * kGiB;  // num_blocks_override sizes the pool
  e.serve.max_model_len = 4096;
  e.serve.max_num_seqs = 128;
  e.serve.max_num_batched_tokens = 64;
  return e;
}

// 28 blocks of 16 tokens, one of them vLLM's null block: 27 usable (432 tokens).
constexpr const char* kPool27 =
    "{impl: paged_block_pool, block_size: 16, num_blocks_override: 28, prefix_caching: false}";

std::string all(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += l + "\n";
  return s;
}

// Two requests of 200 + 40 tokens (15 blocks each) in 27 blocks, 64 tokens a step. A prefills in
// steps 1-4, B from step 4 to 7; both decode until A holds 14 blocks and B needs its 14th: B (the
// last arrived) is preempted at step 16 after 9 output tokens, so its recompute covers 209
// tokens. Re-admitted with a 63-token chunk beside A's decode (step 17), it has 146 tokens left,
// over the budget: the old running phase took them for a decode step, which is never split, and
// neither scheduled nor preempted B; A finished alone (step 43) and the run failed ("scheduled
// nothing while 1 requests run"). Now B catches up 63 tokens a step; each time it reaches its
// 14th block while A holds 14 it is preempted again (vLLM V1 picks the same victim), 7 times in
// all, and it finishes at step 74. static_batch: B's recompute waits for the next batch (after
// A, step 43), then takes 64 + 64 + 64 + 17 tokens and 30 decode steps: 77.
TEST_CASE("a request resumed after recompute catches up in chunks under the token budget") {
  const std::vector<RequestSpec> reqs = {serve_request(0, 200, 40), serve_request(1, 200, 40)};
  for (const char* sched : {"continuous_batching", "static_batch"}) {
    EngineConfig e = engine(kPool27);
    e.scheduler = sched;
    for (bool fast : {true, false}) {
      e.fast_decode = fast;
      const ServingResult r = run_serving(e, reqs);
      INFO(sched << (fast ? " fast" : " step by step") << ": " << r.error);
      REQUIRE(r.error.empty());
      CHECK(r.finished == 2);
      CHECK(r.rejected == 0);
      CHECK(r.output_tokens == 80);
      const bool batching = std::string(sched) == "continuous_batching";
      CHECK(r.counters.preemptions == (batching ? 7 : 1));
      CHECK(r.counters.recomputes == r.counters.preemptions);
      CHECK(r.steps == (batching ? 74 : 77));
    }
  }
}

// The seed's strategy 3 (10.4) in the engine: A (256 + 20 tokens) and B (40 + 24) in 20 blocks
// of 16, 512 tokens a step, the longest request the victim. After step k (k >= 1) A has computed
// 255 + k tokens and B 39 + k. Step 1 prefills both (16 + 3 blocks); A's first decode (step 2)
// takes the last free block. At step 10 B needs its 4th block (for token 49) and A (265 tokens
// known) gives up its first, tokens 0-15, leaving the step with 264 computed and 9 outputs. B
// runs alone to its 24th output (step 24), A waiting for one block. Step 25 admits A again: tokens
// 0-15 recomputed and token 265, 17 tokens; its 11th to 20th outputs take steps 26-35. Computed:
// A 256 + 8 + 17 + 10 = 291, B 40 + 23 = 63, 354 in all. Preemption by recompute frees all of
// A, which needs 17 blocks back for its 265 tokens and waits for B's end as well: the same 35
// steps, but its recompute is 265 tokens: 256 + 8 + 265 + 10 + 63 = 602 tokens computed.
TEST_CASE("preemption by free_front recomputes only the freed front (seed 10.4, strategy 3)") {
  const std::vector<RequestSpec> reqs = {serve_request(0, 256, 20), serve_request(1, 40, 24)};
  EngineConfig e = engine(
      "{impl: paged_block_pool, block_size: 16, num_blocks_override: 21, prefix_caching: false}");
  e.serve.max_num_batched_tokens = 512;
  e.serve.victim = Victim::kLongest;
  struct Mode {
    Preemption preemption;
    uint64_t computed, recomputes, front_frees, front_tokens;
  };
  SimTime front_time = 0, recompute_time = 0;
  for (const Mode& m :
       {Mode{Preemption::kFreeFront, 354, 0, 1, 16}, Mode{Preemption::kRecompute, 602, 1, 0, 0}}) {
    e.serve.preemption = m.preemption;
    for (bool validate : {false, true}) {
      e.executor = validate ? ExecutorFactory([] { return std::make_unique<ContentExecutor>(); })
                            : ExecutorFactory();
      e.validate_sample = 1.0;
      const ServingResult r = run_serving(e, reqs);
      INFO((m.preemption == Preemption::kFreeFront ? "free_front" : "recompute")
           << (validate ? " validated" : "") << ": " << r.error << r.validation.failure);
      REQUIRE(r.error.empty());
      CHECK(r.finished == 2);
      CHECK(r.output_tokens == 44);
      CHECK(r.steps == 35);
      CHECK(r.computed_tokens == m.computed);
      CHECK(r.counters.preemptions == 1);
      CHECK(r.counters.recomputes == m.recomputes);
      CHECK(r.counters.front_frees == m.front_frees);
      CHECK(r.counters.front_freed_tokens == m.front_tokens);
      CHECK(r.counters.oom_events == 1);
      if (validate) CHECK(r.validation.checked_steps == 35);
      (m.preemption == Preemption::kFreeFront ? front_time : recompute_time) = r.sim_time;
    }
  }
  CHECK(front_time < recompute_time);  // 16 tokens of prefill instead of 265
}

TEST_CASE("preemption: free_front is refused where it is not modelled") {
  const ConfigNode node =
      ConfigNode::parse("{impl: static_batch, preemption: free_front}", "t.yaml");
  CHECK_THROWS_WITH(schedulers().at(node["impl"]).parse(node, ServeOptions{}),
                    Contains("t.yaml:1") && Contains("static_batch") && Contains("free_front"));
  // A KV strategy that cannot free a sequence's front blocks, and async scheduling.
  const std::string experiments = std::string(std::getenv("MEMSIM_SOURCE_ROOT")) + "/experiments/";
  CHECK_THROWS_WITH(
      load_serving_config(experiments + "kv_strategies.yaml", {"scheduler.preemption=free_front"}),
      Contains("scheduler.preemption") && Contains("'radix_token_pool' cannot"));
  CHECK_THROWS_WITH(
      load_serving_config(experiments + "kv_preemption.yaml",
                          {"scheduler.preemption=free_front", "scheduler.async_scheduling=true"}),
      Contains("scheduler.preemption") && Contains("not with async_scheduling"));
}

// The first 500 requests of the Azure conversation trace, all arriving at time 0, in 3,000
// blocks of 16 without prefix caching, 128 sequences and 2,048 tokens a step, recompute: memsim
// failed at step 2,357 with 335 requests finished ("scheduled nothing while 56 requests run");
// vLLM finishes all 500. Arrival times cannot change a schedule whose requests all arrive at
// once, so the roofline step time here gives the same steps as the CLI's measured profile.
TEST_CASE("500 conversation requests at once finish under recompute preemption (issue 29)") {
  const char* root = std::getenv("MEMSIM_SOURCE_ROOT");
  REQUIRE(root != nullptr);
  TraceOptions t;
  t.limit = 500;
  auto set = read_request_trace(std::string(root) + "/data/azure-llm-2023/conv.csv", t);
  REQUIRE(set.ok());
  std::vector<RequestSpec> reqs = set->requests.to_vector();
  REQUIRE(reqs.size() == 500);
  for (RequestSpec& q : reqs) q.arrival = 0;
  // The CLI reproduction (time_scale: 1e-15) rounds every gap to 0 ns: the same requests.
  t.time_scale = 1e-15;
  auto scaled = read_request_trace(std::string(root) + "/data/azure-llm-2023/conv.csv", t);
  REQUIRE(scaled.ok());
  for (const RequestSpec& q : scaled->requests) CHECK(q.arrival == 0);

  EngineConfig e = engine(
      "{impl: paged_block_pool, block_size: 16, num_blocks_override: 3000, prefix_caching: "
      "false}");
  e.serve.max_model_len = 8192;
  e.serve.max_num_batched_tokens = 2048;
  const ServingResult r = run_serving(e, reqs);
  INFO(r.error);
  REQUIRE(r.error.empty());
  CHECK(r.finished == 500);
  CHECK(r.rejected == 0);
  CHECK(r.steps == 3445);  // as `memsim --config` gives it with the measured step time
  CHECK(r.counters.preemptions == 294);

  // With prefix caching the old code finished this run too (a resumed request found its own
  // published blocks cached, up to all but the last token, and what was left mostly fit the
  // budget); the fix leaves its counts as they were.
  e.kv_factory =
      kv_strategies()
          .find("paged_block_pool")
          ->parse(ConfigNode::parse(
              "{impl: paged_block_pool, block_size: 16, num_blocks_override: 3000}", "test.yaml"));
  const ServingResult cached = run_serving(e, reqs);
  INFO(cached.error);
  REQUIRE(cached.error.empty());
  CHECK(cached.finished == 500);
  CHECK(cached.steps == 3441);
  CHECK(cached.counters.preemptions == 160);
}

// The invariant: a step that plans nothing while groups run, with no preemption, fails the run
// naming the request and why. Four beams step together; a budget of 2 tokens never holds them.
TEST_CASE("a step that can place nothing fails naming the request and why") {
  std::vector<RequestSpec> reqs = {serve_request(0, 40, 10)};
  reqs[0].beam_width = 4;
  EngineConfig e = engine("{impl: paged_block_pool, block_size: 16}");
  e.serve.max_num_batched_tokens = 2;  // the prompt is chunked; the beams cannot be
  const ServingResult r = run_serving(e, reqs);
  CHECK(r.error ==
        "scheduler 'continuous_batching' scheduled nothing while 1 requests run: request 0 "
        "(group 0) steps its 4 sequences together (4 x 1 tokens); the token budget is 2 "
        "(max_num_batched_tokens 2)");
  CHECK(r.finished == 0);

  // single_sequence steps the same beams under its budget too (it used to run 4 tokens).
  e.scheduler = "single_sequence";
  e.serve.max_num_seqs = 1;
  CHECK_THAT(run_serving(e, reqs).error,
             Contains("request 0 (group 0) steps its 4 sequences together (4 x 1 tokens)"));
}

// static_batch forms a batch of at most max_num_seqs sequences, counting a request's samples:
// one with more samples than that never enters a batch. It was rejected as if its KV could never
// fit; it is a configuration that can never run, and the run fails naming it.
TEST_CASE("a request with more samples than max_num_seqs fails the run, named") {
  std::vector<RequestSpec> reqs = {serve_request(0, 40, 10), serve_request(1, 40, 10)};
  reqs[1].n = 4;
  EngineConfig e = engine("{impl: paged_block_pool, block_size: 16}");
  e.scheduler = "static_batch";
  e.serve.max_num_seqs = 2;
  const ServingResult r = run_serving(e, reqs);
  CHECK(r.error ==
        "scheduler 'static_batch': request 1 (group 1) asks for 4 sequences (n / beam_width), "
        "more than max_num_seqs 2: no batch can hold it");
  CHECK(r.rejected == 0);
}

// continuous_batching admits a request's prefill sequence under max_num_seqs and its beams fork
// past it (vLLM V0 would reserve all four at admission). Swapped out under KV pressure, four
// beams can never come back under max_num_seqs 2: they were dropped (rejected) as if their KV
// did not fit once nothing ran; the run now fails naming them.
TEST_CASE("beams swapped out beyond max_num_seqs fail the run, named") {
  std::vector<RequestSpec> reqs = {serve_request(0, 100, 200), serve_request(1, 20, 100)};
  reqs[1].beam_width = 4;
  EngineConfig e = engine(kPool27);
  e.serve.max_num_seqs = 2;
  e.serve.beam_fork_prob = 0;  // four independent continuations: 4 blocks every 16 tokens
  const ServingResult r = run_serving(e, reqs);
  CHECK(r.error ==
        "scheduler 'continuous_batching': request 1 (group 1) is swapped out with 4 sequences, "
        "more than max_num_seqs 2: it can never come back");
  CHECK(r.counters.swap_outs == 1);
  CHECK(r.rejected == 0);
}

// Swap preemption of a single sequence in the middle of its prefill: B (300-token prompt) is
// swapped out at step 7 with 182 tokens computed, its own victim when its next chunk no longer
// fits beside A (13 blocks, decoding). Its remaining 118 tokens exceed the 64-token budget: the
// swap-in phase required them in one step, so B never came back, and once A finished (step 103)
// it was dropped (rejected) though it fits the pool alone. Now it comes back with 64 tokens,
// then 54, and decodes 10: step 114.
TEST_CASE("a sequence swapped out mid-prefill comes back in chunks") {
  const std::vector<RequestSpec> reqs = {serve_request(0, 200, 100), serve_request(1, 300, 10)};
  EngineConfig e = engine(kPool27);
  e.serve.preemption = Preemption::kSwap;
  const ServingResult r = run_serving(e, reqs);
  INFO(r.error << all(r.rejections));
  REQUIRE(r.error.empty());
  CHECK(r.rejected == 0);
  CHECK(r.finished == 2);
  CHECK(r.output_tokens == 110);
  CHECK(r.counters.swap_outs == 1);
  CHECK(r.counters.swap_ins == 1);
  CHECK(r.steps == 114);
}

// Swap preemption that leaves nothing running: A (400-token prompt, 100 outputs: 32 blocks in
// all) and B (20 + 50) share 27 blocks. A's decode preempts B (swapped), then A itself when it
// needs a 28th block: swapped = [B, A]. The engine used to drop the head, B, at once, though B
// fits alone and the scheduler had not tried it (a step that preempts swaps nothing in). Now B
// comes back and finishes; A, which no empty pool holds, is dropped with the reason.
TEST_CASE("a swapped group is not dropped for another group's lack of KV") {
  const std::vector<RequestSpec> reqs = {serve_request(0, 400, 100), serve_request(1, 20, 50)};
  EngineConfig e = engine(kPool27);
  e.serve.preemption = Preemption::kSwap;
  e.serve.max_num_batched_tokens = 512;
  const ServingResult r = run_serving(e, reqs);
  INFO(r.error);
  REQUIRE(r.error.empty());
  CHECK(r.rejected == 1);
  CHECK(r.finished == 1);
  CHECK(r.output_tokens == 50);
  REQUIRE(r.rejections.size() == 1);
  CHECK(r.rejections[0] ==
        "request 0 (group 0): needs KV for 433 tokens (28 blocks of 16); the pool holds 432 "
        "tokens (27 blocks)");
}

// A prompt larger than the whole pool (but under max_model_len) is prefilled in chunks until the
// pool is full, preempts itself, and is rejected with the reason once nothing else runs; the
// requests behind it finish.
TEST_CASE("a prompt larger than the pool is rejected with the reason; the others finish") {
  const std::vector<RequestSpec> reqs = {serve_request(0, 500, 10), serve_request(1, 50, 10),
                                         serve_request(2, 60, 10)};
  for (Preemption p : {Preemption::kRecompute, Preemption::kSwap}) {
    EngineConfig e = engine(
        "{impl: paged_block_pool, block_size: 16, num_blocks_override: 28}");  // prefix caching
    e.serve.preemption = p;
    const ServingResult r = run_serving(e, reqs);
    INFO(r.error);
    REQUIRE(r.error.empty());
    CHECK(r.rejected == 1);
    CHECK(r.finished == 2);  // (rejected requests are not counted finished)
    CHECK(r.output_tokens == 20);
    REQUIRE(r.rejections.size() == 1);
    // Chunks of 64 reach 384 tokens; the next needs a 28th block. Recompute: the prefix cache
    // still holds the 384 (24 blocks) at re-admission; swap: they come back from the host.
    CHECK(r.rejections[0] ==
          "request 0 (group 0): needs KV for 448 tokens (28 blocks of 16); the pool holds 432 "
          "tokens (27 blocks)");
  }
}

// Without chunked prefill a prompt over the token budget is never admitted (vLLM V0 ignores it:
// its prompt limit is min(max_model_len, max_num_batched_tokens)); once nothing runs it is
// rejected saying so, and the request behind it, held back in FCFS order, then runs.
TEST_CASE("a prompt over the budget without chunked prefill is rejected with the reason") {
  const std::vector<RequestSpec> reqs = {serve_request(0, 30, 5), serve_request(1, 100, 5),
                                         serve_request(2, 30, 5)};
  EngineConfig e = engine("{impl: paged_block_pool, block_size: 16}");
  e.serve.chunked_prefill = false;
  const ServingResult r = run_serving(e, reqs);
  INFO(r.error);
  REQUIRE(r.error.empty());
  CHECK(r.finished == 2);
  CHECK(r.rejected == 1);
  CHECK(r.output_tokens == 10);
  REQUIRE(r.rejections.size() == 1);
  CHECK(r.rejections[0] ==
        "request 1 (group 1): needs 100 tokens in one step with chunked prefill off; the token "
        "budget is 64 (max_num_batched_tokens 64)");
}

// Admission of a request whose known tokens are all cached (another request's identical prompt,
// or its own KV published at a preemption): the KV manager caches at most all but the last
// token, so admission computes at least that token and never stalls on a 0-token chunk.
TEST_CASE("admission of a fully cached prompt computes its last block or token") {
  KvInit init;
  init.layers = 1;
  init.kv_bytes_per_token = 1024;
  init.budget_bytes = 65 * 16 * 1024;  // 64 blocks of 16 (+ vLLM's null block)
  init.max_num_seqs = 8;
  init.max_model_len = 4096;
  struct Case {
    const char* kv;
    uint32_t hit;
  };
  for (const Case& c : {Case{"{impl: paged_block_pool, block_size: 16}", 16},  // whole blocks
                        Case{"{impl: radix_token_pool}", 31}}) {               // 1-token pages
    KvRig rig(c.kv, init);
    GroupWindow groups;
    for (uint32_t g = 0; g < 2; ++g) {
      groups.add();
      groups[g].spec = serve_request(g, 32, 4);
      Sequence s;
      s.id = g;
      s.content = TokenContent(7, 32);  // the same 32-token prompt (2 blocks)
      s.content.append(100 + g, 4);
      groups[g].seqs.push_back(std::move(s));
    }
    ServeState state(*rig.kv, ServeOptions{}, groups);
    uint32_t chunk = 0;
    REQUIRE(state.admit(0, 64, &chunk) == AdmitResult::kAdmitted);
    CHECK(chunk == 32);
    groups[0].computed = 32;
    state.release_group(0);  // its two blocks stay cached
    INFO(c.kv);
    REQUIRE(state.admit(1, 64, &chunk) == AdmitResult::kAdmitted);
    CHECK(groups[1].prefix_hit == c.hit);
    CHECK(chunk == 32 - c.hit);
    groups[1].computed += chunk;
    state.release_group(1);
    rig.check();
  }
}

// A prefix hit never leaves a request nothing to compute: the KV manager caches at most all but
// the last token, so the second request of a prefix group whose whole prompt but one token is
// cached is admitted with that one token.
TEST_CASE("a prefix hit of the whole prompt but one token computes that token") {
  std::vector<RequestSpec> reqs = {serve_request(0, 33, 4), serve_request(1, 33, 4)};
  for (RequestSpec& q : reqs) {
    q.prefix_group = 0;
    q.prefix_tokens = 32;
  }
  reqs[1].arrival = 1'000'000'000;  // after the first finished
  EngineConfig e = engine("{impl: paged_block_pool, block_size: 16}");
  const ServingResult r = run_serving(e, reqs);
  INFO(r.error);
  REQUIRE(r.error.empty());
  CHECK(r.finished == 2);
  CHECK(r.counters.prefix_hit_tokens == 32);
  CHECK(r.counters.prefix_query_tokens == 66);
}

// single_sequence truncates a generation that exhausts the pool and plans nothing that step;
// the engine took the empty plan for "the waiting head can never fit" and rejected the next
// request, which was never tried.
TEST_CASE("single_sequence: a truncation does not reject the next request") {
  const std::vector<RequestSpec> reqs = {serve_request(0, 100, 50), serve_request(1, 300, 200),
                                         serve_request(2, 100, 50)};
  EngineConfig e = engine(kPool27);
  e.scheduler = "single_sequence";
  e.serve.max_num_seqs = 1;
  const ServingResult r = run_serving(e, reqs);
  INFO(r.error << all(r.rejections));
  REQUIRE(r.error.empty());
  CHECK(r.rejected == 0);
  CHECK(r.truncated == 1);
  CHECK(r.finished == 3);
  CHECK(r.output_tokens == 50 + (432 - 300 + 1) + 50);
}

// The victim rules, on three running requests: A (arrived first, 100 + 5 outputs), B (300 + 1),
// C (arrived last, 50 + 20). vLLM takes the last of the running queue (C); SGLang the fewest
// outputs, then the longest prompt (B); OrinMLLM's eviction the longest sequence (B: 301 tokens)
// or the oldest (A).
TEST_CASE("preemption victims: last arrived, fewest decoded, longest, oldest") {
  KvInit init;
  init.layers = 2;
  init.kv_bytes_per_token = 1024;
  init.budget_bytes = 64ull << 20;
  init.max_num_seqs = 8;
  init.max_model_len = 4096;
  KvRig rig("{impl: paged_block_pool, block_size: 16}", init);
  GroupWindow groups;
  const uint32_t prompt[] = {100, 300, 50}, outputs[] = {5, 1, 20};
  for (uint32_t g = 0; g < 3; ++g) {
    groups.add();
    groups[g].spec = serve_request(g, prompt[g], 100);
    groups[g].outputs = outputs[g];
  }
  auto victim = [&](Victim v) {
    ServeOptions o;
    o.victim = v;
    ServeState state(*rig.kv, o, groups);
    state.running = {0, 1, 2};
    return state.running[state.pick_victim()];
  };
  CHECK(victim(Victim::kLastArrived) == 2);
  CHECK(victim(Victim::kFewestDecoded) == 1);
  CHECK(victim(Victim::kLongest) == 1);
  CHECK(victim(Victim::kOldest) == 0);
  // Equal lengths: the later arrival goes first.
  groups[0].outputs = 201;  // 301 tokens, as B
  CHECK(victim(Victim::kLongest) == 1);
  groups[2].outputs = 251;
  CHECK(victim(Victim::kLongest) == 2);
}

}  // namespace
}  // namespace memsim::test
