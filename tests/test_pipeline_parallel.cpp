// Pipeline parallelism in the simulator: vLLM's layer split, each stage's weights, the stage's
// decode program (intermediate tensors in, no head before the last stage), each stage's KV budget
// and the engine's blocks (the least over ranks), and the config errors that name the key.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/serve/kv_budget.h"
#include "tests/kv_test_util.h"
#include "workload/alloc_program.h"
#include "workload/collectives.h"
#include "workload/pipeline_parallel.h"
#include "workload/tensor_parallel.h"

using namespace memsim;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

ModelShape model(const std::string& name) {
  return test::model_from_configs(name);
}

GpuSpec gpu(const std::string& name) {
  return test::gpu_from_configs(name);
}

std::vector<uint32_t> layer_counts(uint32_t layers, uint32_t pp) {
  std::vector<uint32_t> out;
  const std::vector<PipelineStage> stages = *split_pipeline(layers, pp);
  for (const PipelineStage& s : stages) out.push_back(s.layers);
  return out;
}

bool has_tensor(const ShapeProgram& p, const std::string& name) {
  for (const TensorSpec& t : p.inputs)
    if (t.name == name) return true;
  for (const GraphProgram& g : p.graphs)
    for (const TensorSpec& t : g.tensors)
      if (t.name == name) return true;
  return false;
}

// The ConfigError message of loading `parallel:` (YAML text) for `m` on `g`; empty if none.
std::string parallel_error(const std::string& yaml, const ModelShape& m, const GpuSpec& g) {
  try {
    (void)load_parallel(ConfigNode::parse(yaml, "p.yaml"), m, g);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("pipeline split: vLLM's get_pp_indices", "[pp]") {
  // The remainder goes to the stages before the last, from the last but one backwards.
  CHECK(layer_counts(80, 3) == std::vector<uint32_t>{27, 27, 26});
  CHECK(layer_counts(80, 2) == std::vector<uint32_t>{40, 40});
  CHECK(layer_counts(10, 4) == std::vector<uint32_t>{2, 3, 3, 2});
  CHECK(layer_counts(32, 5) == std::vector<uint32_t>{6, 6, 7, 7, 6});
  CHECK(layer_counts(28, 8) == std::vector<uint32_t>{3, 3, 3, 4, 4, 4, 4, 3});
  CHECK(layer_counts(64, 1) == std::vector<uint32_t>{64});
  const std::vector<PipelineStage> s = *split_pipeline(80, 3);
  CHECK(s[1].first_layer == 27);
  CHECK(s[2].first_layer == 54);
  CHECK((s[0].first && !s[0].last && !s[1].first && !s[1].last && s[2].last));
  CHECK(split_pipeline(4, 5).error().message.find("exceeds the model's 4 layers") !=
        std::string::npos);
  CHECK_FALSE(split_pipeline(4, 0).ok());
}

TEST_CASE("pipeline split: each stage's weights", "[pp]") {
  const ModelShape m = model("llama-3.1-70b");
  const std::vector<PipelineStage> two = *split_pipeline(m.layers, 2);
  // 40 layers of 1711308800 B; the embedding (128256 x 8192 x 2 B) on the first stage, the final
  // norm (16384 B) and the LM head (as large as the embedding) on the last.
  CHECK(m.layer_weight_bytes() == 1711308800ull);
  CHECK(stage_weight_bytes(m, two[0]) == 70553698304ull);
  CHECK(stage_weight_bytes(m, two[1]) == 70553714688ull);
  CHECK(stage_weight_bytes(m, two[0]) + stage_weight_bytes(m, two[1]) == m.weight_bytes());
  // With one stage, the model's own count; over TP 2, the shard's.
  CHECK(stage_weight_bytes(m, (*split_pipeline(m.layers, 1))[0]) == m.weight_bytes());
  const ModelShape rank = shard_tensor_parallel(m, 2)->rank;
  CHECK(stage_weight_bytes(rank, two[0]) == 35277504512ull);
  CHECK(stage_weight_bytes(rank, two[1]) == 35277520896ull);
  // Middle stages hold layers only.
  const std::vector<PipelineStage> three = *split_pipeline(m.layers, 3);
  CHECK(stage_weight_bytes(m, three[1]) == 27 * m.layer_weight_bytes());
  // A tied LM head: the last stage holds the embedding itself (vLLM builds embed_tokens there), so
  // the stages together hold it twice.
  ModelShape tied = m;
  tied.tie_embeddings = true;
  CHECK(stage_weight_bytes(tied, two[1]) == stage_weight_bytes(m, two[1]));
  CHECK(stage_weight_bytes(tied, two[0]) + stage_weight_bytes(tied, two[1]) ==
        tied.weight_bytes() + tied.embedding_weight_bytes());
}

TEST_CASE("pipeline split: a stage's decode program", "[pp]") {
  const ModelShape m = model("llama-3.1-8b");
  const std::vector<PipelineStage> s = *split_pipeline(m.layers, 2);
  const ModelShape half = stage_model(m, s[0]);
  const uint32_t b = 64;
  const uint64_t row = b * m.hidden * 2;
  ProgramOptions first, last;
  first.last_stage = false;
  last.first_stage = false;
  const ShapeProgram p0 = make_decode_program(half, b, first);
  const ShapeProgram p1 = make_decode_program(half, b, last);
  const ShapeProgram whole = make_decode_program(half, b, ProgramOptions{});
  // The first stage embeds and ends after its last layer: no head; its last down and residual are
  // the graph's outputs (sent on as intermediate tensors).
  CHECK(has_tensor(p0, "embed"));
  CHECK_FALSE(has_tensor(p0, "final.norm"));
  CHECK_FALSE(has_tensor(p0, "logits"));
  CHECK_FALSE(has_tensor(p0, "intermediate.hidden_states"));
  uint64_t outputs = 0;
  for (const TensorSpec& t : p0.graphs.front().tensors)
    if (t.role == TensorRole::kOutput) outputs += t.bytes;
  CHECK(outputs == 2 * row);
  // The last stage reads the intermediate tensors (two persistent [b, hidden] inputs), adds the
  // residual in its first layer and has the head.
  CHECK(p1.inputs.size() == whole.inputs.size() + 2);
  CHECK(p1.inputs[whole.inputs.size()].bytes == row);
  CHECK_FALSE(has_tensor(p1, "embed"));
  CHECK(has_tensor(p1, "layer0.input_residual"));
  CHECK(has_tensor(p1, "logits"));
  CHECK(has_tensor(p1, "sampled_ids"));
}

TEST_CASE("pipeline split: NCCL's memory gains the pipeline group's communicator", "[pp]") {
  const GpuSpec h200 = gpu("h200");
  ParallelConfig p;
  p.pipeline = 2;
  const CommMemory pp = *comm_memory(h200, p, CommOptions{});
  // The 2-rank measured figures, cuMem off: communicator, first all-reduce, first send/recv.
  CHECK(pp.pp_nccl == (736 + 186 + 446) * kMiB);
  CHECK(pp.nccl() == pp.pp_nccl);
  CHECK(pp.custom() == 0);
  CHECK(pp.pp_note.find("first send/recv (h200)") != std::string::npos);
  p.pipeline = 4;
  CHECK(comm_memory(h200, p, CommOptions{})->pp_note.find("taken for a group of 4") !=
        std::string::npos);
  p.pipeline = 2;
  p.tensor = 2;
  const CommMemory both = *comm_memory(h200, p, CommOptions{});
  CHECK(both.nccl() == (736 + 186 + 736 + 186 + 446) * kMiB);
  CHECK(both.custom() == 38 * kMiB);
  p.tensor = 8;  // 16 ranks on an 8-GPU node
  CHECK(comm_memory(h200, p, CommOptions{}).error().message.find("16 ranks exceed") !=
        std::string::npos);
}

TEST_CASE("kv budget: Llama-3.1-70B at TP 2 x PP 2 on an H100, each stage simulated", "[pp]") {
  KvBudgetInput in;
  in.model = model("llama-3.1-70b");
  in.gpu = gpu("h100");
  in.parallel.tensor = 2;
  in.parallel.pipeline = 2;
  const auto r = compute_engine_kv_budget(in);
  REQUIRE(r.ok());
  REQUIRE(r->stages.size() == 2);
  const KvBudget& s0 = r->stages[0];
  const KvBudget& s1 = r->stages[1];
  CHECK(s0.weights == 35277504512ull);
  CHECK(s1.weights == 35277520896ull);
  CHECK(s0.kv_bytes_per_token == 81920);  // 2 x 40 layers x 4 KV heads x 128 x 2 B
  CHECK(s0.sampler_rows == 0);            // vLLM samples on the last rank only
  CHECK(s1.sampler_rows == 256);
  CHECK(s0.comm.nccl() == s1.comm.nccl());
  for (const KvBudget& b : r->stages) {
    CHECK(b.kv_bytes == b.usable - b.weights - b.activation_peak - b.graph_memory);
    CHECK(b.kv_blocks == b.kv_bytes / (16 * b.kv_bytes_per_token));
  }
  // The last stage: the sampler's logits in the profile run, the graphs' logits, the received
  // intermediate tensors; it has fewer blocks, which every rank then gets.
  CHECK(s1.activation_peak > s0.activation_peak);
  CHECK(s1.graph_memory > s0.graph_memory);
  CHECK(s0.activation_peak == 889421824ull);
  CHECK(s1.activation_peak == 1157857280ull);
  CHECK(s0.graph_memory == 75497472ull);
  CHECK(s1.graph_memory == 935329792ull);
  CHECK(s0.kv_blocks == 30726);
  CHECK(s1.kv_blocks == 29865);
  CHECK(r->kv_blocks_min == 29865);
  CHECK(r->min_stage == 1);
  CHECK(r->kv_allocated(0) == 29865ull * 16 * 81920);
  // One stage: the single rank's budget.
  KvBudgetInput one = in;
  one.parallel.pipeline = 1;
  const auto e1 = compute_engine_kv_budget(one);
  const auto k1 = compute_kv_budget(one);
  REQUIRE((e1.ok() && k1.ok()));
  CHECK(e1->stages.size() == 1);
  CHECK(e1->kv_blocks_min == k1->kv_blocks);
  CHECK(e1->stages[0].activation_peak == k1->activation_peak);
}

TEST_CASE("kv budget: stages alike are simulated once, each reported", "[pp]") {
  KvBudgetInput in;
  in.model = model("llama-3.1-8b");
  in.gpu = gpu("h100");
  in.parallel.pipeline = 4;
  const auto r = compute_engine_kv_budget(in);
  REQUIRE(r.ok());
  REQUIRE(r->stages.size() == 4);
  CHECK(r->stages[1].stage.index == 1);
  CHECK(r->stages[2].stage.index == 2);
  CHECK(r->stages[2].stage.first_layer == 16);
  CHECK(r->stages[1].activation_peak == r->stages[2].activation_peak);
  CHECK(r->stages[1].weights == 8 * in.model.layer_weight_bytes());
}

TEST_CASE("parallel config: sizes beyond the model or the node name the key", "[pp]") {
  const ModelShape m = model("llama-3.1-8b");  // 32 layers
  const GpuSpec h100 = gpu("h100");            // 8 GPUs a node
  CHECK(parallel_error("pipeline_parallel_size: 4\n", m, h100).empty());
  const std::string deep = parallel_error("pipeline_parallel_size: 33\n", m, h100);
  CHECK(deep.find("p.yaml:1: pipeline_parallel_size") != std::string::npos);
  CHECK(deep.find("exceeds the model's 32 layers") != std::string::npos);
  const std::string wide =
      parallel_error("tensor_parallel_size: 4\npipeline_parallel_size: 4\n", m, h100);
  CHECK(wide.find("p.yaml:2: pipeline_parallel_size") != std::string::npos);
  CHECK(wide.find("16 ranks exceed the 8 GPUs") != std::string::npos);
  const std::string many = parallel_error(
      "tensor_parallel_size: 2\npipeline_parallel_size: 2\ndata_parallel_size: 4\n", m, h100);
  CHECK(many.find("p.yaml:3: data_parallel_size") != std::string::npos);
  CHECK(many.find("16 ranks exceed") != std::string::npos);
  CHECK(parallel_error("tensor_parallel_size: 2\ndata_parallel_size: 4\n", m, h100).empty());
}
