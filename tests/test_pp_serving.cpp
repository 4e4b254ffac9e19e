// Pipeline-parallel serving: each stage's share of a step (the roofline of its layers, the
// embedding on the first stage, the LM head on the last), the sends between stages, vLLM V1's
// batch queue of pp steps with requests in flight passed over, step by step on a hand-derived
// case, and the engine's invariants over a random workload.
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "src/serve/engine.h"
#include "src/serve/serving_experiment.h"
#include "tests/config_test_util.h"
#include "tests/kv_test_util.h"
#include "tests/serve_test_util.h"
#include "workload/pipeline_parallel.h"
#include "workload/pipeline_time.h"
#include "workload/step_profile.h"

namespace memsim::test {
namespace {

StepShape step(uint32_t seqs, uint64_t tokens_each, uint64_t computed) {
  StepShape s;
  s.num_seqs = seqs;
  s.new_tokens = tokens_each * seqs;
  s.kv_read_tokens = (computed + tokens_each) * seqs;
  s.attn_pairs = seqs * (double(tokens_each) * double(computed) +
                         double(tokens_each) * double(tokens_each + 1) / 2);
  if (tokens_each == 1) {
    s.decode_seqs = seqs;
    s.decode_kv_tokens = (computed + 1) * seqs;
    s.decode_max_kv = static_cast<uint32_t>(computed + 1);
  }
  return s;
}

std::vector<StepShape> shapes() {
  return {step(1, 10, 0), step(1, 1, 100), step(64, 1, 2000), step(1, 2048, 4096), step(4, 512, 0)};
}

}  // namespace

// A single stage through the stage constructor is the whole model's roofline, with and without
// tensor-parallel collectives, tied embeddings or not.
TEST_CASE("pipeline time: one stage is the whole model's roofline") {
  const GpuSpec gpu = gpu_from_configs("h200");
  for (const char* name : {"llama-3.1-8b", "qwen2.5-32b", "qwen3-8b"}) {
    const ModelShape m = model_from_configs(name);
    const PipelineStage whole = split_pipeline(m.layers, 1)->front();
    auto tp2 = std::make_shared<const CollectiveTime>(*CollectiveTime::make(gpu, 2, true));
    for (const StepShape& s : shapes()) {
      INFO(name << " " << s.new_tokens);
      CHECK(StepTimeModel(m, gpu, whole, nullptr).breakdown(s).total_ns ==
            StepTimeModel(m, gpu).breakdown(s).total_ns);
      CHECK(StepTimeModel(m, gpu, whole, tp2).breakdown(s).total_ns ==
            StepTimeModel(m, gpu, tp2).breakdown(s).total_ns);
    }
  }
}

// Llama-3.1-70B over 4 stages of 20 layers: the stages' weights add up to the model's; the middle
// stages read the same bytes and do the same FLOPs; the first adds the embedding rows it looks
// up, the last its LM head (FLOPs per sequence) and final norm. A step's GPU time splits in
// proportion, and every stage but the last adds the send of hidden_states and residual.
TEST_CASE("pipeline time: the stages share a step as their rooflines do, plus the sends") {
  const GpuSpec gpu = gpu_from_configs("h200");
  const ModelShape m = model_from_configs("llama-3.1-70b");
  const std::vector<PipelineStage> st = *split_pipeline(m.layers, 4);
  std::vector<StepTimeModel> r;
  uint64_t bytes = 0;
  for (const PipelineStage& s : st) r.emplace_back(m, gpu, s, nullptr);
  const StepShape decode = step(32, 1, 1000);
  for (const StepTimeModel& x : r) bytes += x.breakdown(decode).bytes;
  const StepTimeModel whole(m, gpu);
  // Every weight once and every layer's KV once, as one stage would read them.
  CHECK(bytes == whole.breakdown(decode).bytes);
  CHECK(r[1].breakdown(decode).bytes == r[2].breakdown(decode).bytes);
  CHECK(r[1].breakdown(decode).flops == r[2].breakdown(decode).flops);
  const uint64_t row = m.hidden * dtype_bytes(m.dtype);
  CHECK(r[0].breakdown(decode).bytes == r[1].breakdown(decode).bytes + 32 * row);
  CHECK(r[3].breakdown(decode).bytes ==
        r[1].breakdown(decode).bytes + m.embedding_weight_bytes() + row);
  CHECK(r[3].breakdown(decode).flops ==
        r[1].breakdown(decode).flops + 2.0 * double(m.vocab * m.hidden) * 32);

  const PipelineTime t = *PipelineTime::make(m, gpu, 4, 1, nullptr);
  CHECK(t.stages() == 4);
  CHECK(t.source().find("4 stages of 20+20+20+20 layers") != std::string::npos);
  const auto link = *CollectiveTime::make(gpu, 2);
  // 32 tokens: two [32, 8192] bf16 tensors, each one 2-rank all-gather of 512 KiB parts.
  CHECK(t.send_time(32) == 2 * link.send_recv(32 * row));
  std::vector<SimTime> out;
  const SimTime gpu_ns = 40'000'000;
  t.stage_times(decode, gpu_ns, &out);
  REQUIRE(out.size() == 4);
  SimTime sum = 0;
  for (const SimTime x : out) sum += x;
  CHECK(std::abs(sum - (gpu_ns + 3 * t.send_time(32))) <= 2);
  CHECK(out[1] == out[2]);
  CHECK(out[3] > out[1]);  // its LM head (2 GiB read) outweighs stage 1's send
  // Under TP 2 a rank sends its half of each tensor, and the receiver all-gathers them.
  auto tp2 = std::make_shared<const CollectiveTime>(*CollectiveTime::make(gpu, 2, true));
  const PipelineTime t2 = *PipelineTime::make(m, gpu, 4, 2, tp2);
  CHECK(t2.send_time(32) == 2 * link.send_recv(32 * row / 2) + 2 * tp2->all_gather(32 * row / 2));
}

namespace {

// Llama-3.1-8B over 2 stages (16 + 16 layers) on the H200, every step's whole GPU time 1 ms
// (a flat profile) split by the stages' rooflines, a paged pool, a 16-token budget.
EngineConfig pp_engine(uint32_t budget) {
  EngineConfig e;
  e.model = model_from_configs("llama-3.1-8b");
  e.gpu = gpu_from_configs("h200");
  e.pipeline = std::make_shared<const PipelineTime>(*PipelineTime::make(e.model, e.gpu, 2, 1, {}));
  e.kv_model = stage_model(e.model, split_pipeline(e.model.layers, 2)->front());
  e.kv_impl = "paged_block_pool";
  e.kv_factory = kv_strategies().find(e.kv_impl)->parse(
      ConfigNode::parse("{impl: paged_block_pool, block_size: 16, prefix_caching: false}", "t"));
  e.kv_budget_bytes = 1 * kGiB;
  e.serve.max_model_len = 4096;
  e.serve.max_num_batched_tokens = budget;
  e.step_profile = flat_step_profile(1.0);
  return e;
}

}  // namespace

// A and B (16 + 3 each) arrive at once; the budget of 16 tokens holds one prompt a step.
// vLLM V1 keeps pp = 2 steps in flight: step 1 prefills A and, while it runs, step 2 prefills B
// (A, all computed and waiting for its token, is passed over). The queue is full: the engine
// waits for step 1, and A's decode is step 3, submitted when step 1's output is back; then step
// 4 (B) after step 2's, and so on: two cohorts alternate, six steps. Each step runs stage 0 then
// stage 1, each stage after its previous step; its times are the 1 ms split by the stages'
// rooflines (prefill 16 tokens, or one decode at 16 or 17 tokens of context), plus the send
// after stage 0.
TEST_CASE("pipeline-parallel serving keeps pp steps in flight, two cohorts alternating") {
  const EngineConfig e = pp_engine(16);
  const std::vector<RequestSpec> reqs = {serve_request(0, 16, 3), serve_request(1, 16, 3)};
  std::vector<SimTime> x;
  SimTime free0 = 0, free1 = 0;
  auto issue = [&](SimTime at, const StepShape& s) {
    e.pipeline->stage_times(s, 1'000'000, &x);
    free0 = std::max(at, free0) + x[0];
    free1 = std::max(free0, free1) + x[1];
    return free1;
  };
  const SimTime d1 = issue(0, step(1, 16, 0));
  const SimTime d2 = issue(0, step(1, 16, 0));
  const SimTime d3 = issue(d1, step(1, 1, 16));
  const SimTime d4 = issue(std::max(d1, d2), step(1, 1, 16));
  const SimTime d5 = issue(std::max(d2, d3), step(1, 1, 17));
  const SimTime d6 = issue(std::max(d3, d4), step(1, 1, 17));
  REQUIRE(d2 > d1);
  REQUIRE(d2 < d1 + 1'000'000);  // the pipeline overlaps the two prefills

  const ServingResult r = run_serving(e, reqs);
  INFO(r.error);
  REQUIRE(r.error.empty());
  CHECK(r.finished == 2);
  CHECK(r.output_tokens == 6);
  CHECK(r.steps == 6);
  CHECK(r.sim_time == d6);
  CHECK(r.ttft_ms.mean == Approx(double(d1 + d2) / 2e6).epsilon(1e-12));
  CHECK(r.e2e_ms.mean == Approx(double(d5 + d6) / 2e6).epsilon(1e-12));
}

// 300 Poisson requests in a small pool: every request finishes with its tokens, the KV manager's
// invariants hold and every block comes back (checked by the engine), at 2 and 4 stages, and the
// reference paths (every block hashed as it fills, no fast decode) give the same run.
TEST_CASE("pipeline-parallel serving keeps the engine's invariants over a random workload") {
  const RequestSet set = prefix_workload(300, 11, 60, 100, 400);
  uint64_t tokens = 0;
  for (size_t i = 0; i < set.requests.size(); ++i) tokens += set.requests.output_tokens(i);
  for (uint32_t pp : {2u, 4u}) {
    auto run = [&](bool reference) {
      EngineConfig e = pp_engine(1024);
      e.step_profile = nullptr;  // the roofline
      e.pipeline =
          std::make_shared<const PipelineTime>(*PipelineTime::make(e.model, e.gpu, pp, 1, {}));
      e.kv_model = stage_model(e.model, split_pipeline(e.model.layers, pp)->front());
      e.kv_factory = kv_strategies().find(e.kv_impl)->parse(ConfigNode::parse(
          "{impl: paged_block_pool, block_size: 16, num_blocks_override: 500}", "t"));
      e.defer_private_hashes = !reference;
      e.fast_decode = !reference;
      return run_serving(e, set.requests);
    };
    const ServingResult a = run(false), ref = run(true);
    for (const ServingResult* r : {&a, &ref}) {
      INFO("pp " << pp << ": " << r->error);
      REQUIRE(r->error.empty());
      CHECK(r->finished == 300);
      CHECK(r->output_tokens == tokens);
    }
    CHECK(a.counters.preemptions > 0);
    CHECK(ref.steps == a.steps);
    CHECK(ref.sim_time == a.sim_time);
    CHECK(ref.counters.preemptions == a.counters.preemptions);
  }
}

TEST_CASE("pipeline-parallel serving: async scheduling and --backend cuda are refused") {
  EngineConfig e = pp_engine(64);
  e.serve.async_scheduling = true;
  const ServingResult r = run_serving(e, std::vector<RequestSpec>{serve_request(0, 10, 2)});
  CHECK_THAT(r.error,
             Catch::Contains("async_scheduling") && Catch::Contains("pipeline parallelism"));

  // From a config: the experiment sizes every stage and serves at the least stage's blocks.
  TempDir dir;
  const std::string root = source_root();
  const std::string yaml = fmt::format(R"(experiment: pp
gpu: {0}/configs/gpus/h200.yaml
model: {0}/configs/models/llama-3.1-70b.yaml
parallel: {{tensor_parallel_size: 2, pipeline_parallel_size: 2}}
engine: {{max_model_len: 4096}}
kv: {{impl: paged_block_pool}}
requests: {{source: synthetic, count: 20, arrival: {{process: burst}}, prompt: {{dist: fixed, value: 200}}, output: {{dist: fixed, value: 20}}}}
)",
                                       root);
  const ServingConfig c = load_serving_config(dir.write("pp.yaml", yaml), {});
  REQUIRE(c.pipeline != nullptr);
  CHECK(c.pipeline->stages() == 2);
  const ServingResults out = run_serving_experiment(c);
  REQUIRE(out.runs.size() == 1);
  INFO(out.runs[0].budget_error << out.runs[0].result.error);
  CHECK(out.runs[0].result.error.empty());
  CHECK(out.runs[0].result.finished == 20);
  CHECK(out.runs[0].budget.pipeline_parallel == 2);
  CHECK(out.runs[0].result.kv.total_blocks == out.runs[0].budget.kv_blocks);
}

}  // namespace memsim::test
