// Tests of the training-side memory model (ZeRO state bytes, saved activations, programs that
// free what they allocate) and of the RL co-location timeline (exact differences between
// resume orders and sleep levels, bytes each pause frees and each resume takes back, OOM
// outcomes, graph validity, accounting, determinism) and of its outputs' agreement.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "src/app/output.h"
#include "src/app/rl_experiment.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/rl/rl_rollout.h"
#include "src/serve/serving_experiment.h"
#include "tests/rl_test_util.h"
#include "tests/temp_dir.h"
#include "workload/train_program.h"

using namespace memsim;
using namespace memsim::test;

namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) {
  return (a + b - 1) / b;
}

// Replays a program's allocations: live bytes per tag, their peaks, and the ids left live.
struct Replay {
  std::unordered_map<uint64_t, std::pair<uint64_t, TrainTag>> live;
  std::map<TrainTag, uint64_t> bytes, peak;
  uint64_t total = 0, peak_total = 0, delivered = 0;

  void run(const std::vector<TrainOp>& ops) {
    for (const TrainOp& op : ops) {
      if (op.kind == TrainOp::Kind::kAlloc) {
        REQUIRE(op.bytes > 0);
        REQUIRE(live.emplace(op.id, std::make_pair(op.bytes, op.tag)).second);
        bytes[op.tag] += op.bytes;
        total += op.bytes;
        peak[op.tag] = std::max(peak[op.tag], bytes[op.tag]);
        peak_total = std::max(peak_total, total);
      } else if (op.kind == TrainOp::Kind::kFree) {
        auto it = live.find(op.id);
        REQUIRE(it != live.end());
        bytes[it->second.second] -= it->second.first;
        total -= it->second.first;
        live.erase(it);
      } else if (op.kind == TrainOp::Kind::kDeliver) {
        REQUIRE(live.count(op.id) == 1);
        delivered += op.bytes;
      } else if (op.kind == TrainOp::Kind::kToHost || op.kind == TrainOp::Kind::kFromHost) {
        REQUIRE(live.count(op.id) == 1);
      }
    }
  }
};

std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The number after `"key": ` in the summary.json run object labelled `label` (-1: absent).
int64_t summary_field(const std::string& json, const std::string& label, const std::string& key) {
  const size_t run = json.find("{\"label\": \"" + label + "\"");
  REQUIRE(run != std::string::npos);
  const size_t end = json.find("\n", run);
  const size_t at = json.find("\"" + key + "\": ", run);
  if (at == std::string::npos || at > end) return -1;
  return std::stoll(json.substr(at + key.size() + 4));
}

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string cell;
  while (std::getline(ss, cell, sep)) out.push_back(cell);
  return out;
}

// The whitespace-separated cells of the table row of run `label`.
std::vector<std::string> table_row(const std::string& table, const std::string& label) {
  std::stringstream ss(table);
  std::string line;
  while (std::getline(ss, line)) {
    std::stringstream cells(line);
    std::vector<std::string> row;
    for (std::string c; cells >> c;) row.push_back(c);
    if (!row.empty() && row[0] == label) return row;
  }
  FAIL("no table row for " << label);
  return {};
}

}  // namespace

TEST_CASE("ZeRO state bytes follow 2 + 2 + 12 bytes per parameter, sharded by stage") {
  const ModelShape m = model("llama-3.1-8b");
  uint64_t params = 0;
  for (const TrainUnit& u : train_units(m, 1)) params += u.numel;
  CHECK(params == 8030261248ull);  // Llama-3.1-8B
  CHECK(params * dtype_bytes(m.dtype) == m.weight_bytes());

  TrainSpec s;
  s.param_dtype = DType::kBF16;
  s.dp = 8;
  s.sharding = Sharding::kNone;
  TrainStateBytes b = train_state_bytes(m, s);
  CHECK(b.params == 2 * params);
  CHECK(b.grads == 2 * params);
  CHECK(b.optimizer == 12 * params);

  uint64_t sharded = 0;  // per-unit ceil(n / 8)
  for (const TrainUnit& u : train_units(m, 1)) sharded += ceil_div(u.numel, 8);
  s.sharding = Sharding::kZero1;
  b = train_state_bytes(m, s);
  CHECK(b.params == 2 * params);
  CHECK(b.grads == 2 * params);
  CHECK(b.optimizer == 12 * sharded);
  s.sharding = Sharding::kZero2;
  b = train_state_bytes(m, s);
  CHECK(b.grads == 2 * sharded);
  s.sharding = Sharding::kZero3;
  b = train_state_bytes(m, s);
  CHECK(b.params == 2 * sharded);
  CHECK(b.total() == 16 * sharded);

  // FSDP with fp32 parameters: they are the master weights (4 + 4 + 8).
  s.param_dtype = DType::kFP32;
  b = train_state_bytes(m, s);
  CHECK(b.params == 4 * sharded);
  CHECK(b.grads == 4 * sharded);
  CHECK(b.optimizer == 8 * sharded);

  // TP splits every layer's matmuls, and the vocabulary.
  uint64_t tp2 = 0;
  for (const TrainUnit& u : train_units(m, 2)) tp2 += u.numel;
  CHECK(tp2 < params / 2 + params / 50);
  CHECK(tp2 > params / 2);
}

TEST_CASE("saved activations per token and layer follow the layer's tensors") {
  const ModelShape m = model("llama-3.1-8b");
  TrainSpec s;
  // bf16: input, norm, q, k, v, attention output, residual, norm, gate, up, SiLU, product;
  // fp32: two rstd, one log-sum-exp per head.
  CHECK(saved_bytes_per_token_layer(m, s) ==
        2 * (4 * 4096 + 2 * 4096 + 2 * 1024 + 4 * 14336) + 8 + 4 * 32);
  const ModelShape q3 = model("qwen3-8b");  // q/k norms save q and k before them
  CHECK(saved_bytes_per_token_layer(q3, s) ==
        2 * (4 * 4096 + 3 * 4096 + 3 * 1024 + 4 * 12288) + 8 + 4 * 32);
}

TEST_CASE("trainer programs free what they allocate; checkpointing keeps one input per layer") {
  const ModelShape m = model("qwen2.5-7b");
  for (Sharding sh : {Sharding::kNone, Sharding::kZero1, Sharding::kZero2, Sharding::kZero3}) {
    for (bool ckpt : {false, true}) {
      CAPTURE(to_string(sh), ckpt);
      TrainSpec s;
      s.sharding = sh;
      s.activation_checkpointing = ckpt;
      s.micro_batch_tokens = 2048;
      TrainProgramBuilder b(m, s, true);
      Replay r;
      r.run(b.load_params(false));
      r.run(b.load_optimizer(false));
      const TrainStateBytes state = train_state_bytes(m, s);
      CHECK(r.bytes[TrainTag::kParams] == state.params);
      CHECK(r.bytes[TrainTag::kOptimizer] == state.optimizer);
      const size_t persistent = r.live.size();
      r.run(b.score(5000));
      CHECK(r.live.size() == persistent);
      r.run(b.train_step(5000));  // three micro-batches: 2048, 2048, 904
      CHECK(r.live.size() == persistent);
      CHECK(r.peak[TrainTag::kGrads] >= state.grads);
      // The saved set of one micro-batch at the end of its forward.
      const uint64_t T = 2048;
      const uint64_t per_layer =
          ckpt ? 2 * T * m.hidden
               : T * (saved_bytes_per_token_layer(m, s) - 8 - 4 * (m.heads * m.head_dim / 128));
      CHECK(r.peak[TrainTag::kActivations] >= m.layers * per_layer);
      r.run(b.weight_sync(512ull << 20));
      CHECK(r.live.size() == persistent);
      CHECK(r.delivered == m.weight_bytes());
      r.run(b.unload_params(true));
      r.run(b.unload_optimizer(true));
      CHECK(r.live.empty());
      CHECK(r.total == 0);
    }
  }
}

TEST_CASE("checkpointing lowers the training peak; fp32 logits raise it by 10 bytes a logit") {
  const ModelShape m = model("llama-3.1-8b");
  auto peak = [&](bool ckpt, bool fp32) {
    TrainSpec s;
    s.activation_checkpointing = ckpt;
    s.fp32_logits = fp32;
    s.micro_batch_tokens = 4096;
    TrainProgramBuilder b(m, s, false);
    Replay r;
    r.run(b.train_step(4096));
    return std::make_pair(r.peak[TrainTag::kActivations], r.peak[TrainTag::kLogits]);
  };
  CHECK(peak(true, true).first < peak(false, true).first / 5);
  // The logits' peak is at the loss backward: bf16 logits + fp32 logits + fp32 log-softmax +
  // their fp32 gradient (14 bytes a logit) against bf16 logits + a bf16 gradient (4 bytes).
  CHECK(peak(true, true).second - peak(true, false).second == 4096ull * m.vocab * 10);
}

TEST_CASE("rollout weight tensors add up to the model's weights") {
  for (const char* name : {"llama-3.1-8b", "qwen2.5-7b", "qwen3-8b"}) {
    const ModelShape m = model(name);
    uint64_t sum = 0;
    for (uint64_t b : rollout_weight_tensors(m)) sum += b;
    CHECK(sum == m.weight_bytes());
  }
}

TEST_CASE("RL timeline: multi-stage resume saves exactly the KV cache and graphs at sync") {
  const RlConfig c = small_config("qwen2.5-7b");
  const RlRunResult multi =
      run_rl_one(c, c.models[0], saver_run("multi", "tagged_regions", "{}", true));
  const RlRunResult all =
      run_rl_one(c, c.models[0], saver_run("all", "tagged_regions", "{}", false));
  REQUIRE(multi.error.empty());
  REQUIRE(all.error.empty());
  REQUIRE(multi.oom.empty());
  REQUIRE(all.oom.empty());
  CHECK(multi.iterations_done == 2);
  const uint64_t g = c.gpu.granularity;
  const uint64_t kv_and_graphs =
      uint64_t{c.models[0].layers} * round_up(multi.kv_bytes / c.models[0].layers, g) +
      round_up(multi.graph_bytes, g);
  CHECK(all.phase_peak.at("sync") - multi.phase_peak.at("sync") == kv_and_graphs);
  // The rollout and training phases are the same in both.
  CHECK(all.phase_peak.at("rollout") == multi.phase_peak.at("rollout"));
  CHECK(all.phase_peak.at("train") == multi.phase_peak.at("train"));
  // Every resume keeps the captured decode graph valid (its launches succeed).
  CHECK(multi.graphs_valid);
  CHECK(multi.graph_launches == 2);
  CHECK(multi.pause_ms > 0);
  CHECK(multi.resume_weights_ms > 0);
  CHECK(multi.resume_rest_ms > 0);
  CHECK(all.resume_rest_ms == 0);
  // The saver's time is the time of its backend calls: unmap and release to pause; create, map
  // and set access to resume.
  double pause = 0, resume = 0;
  for (const auto& [k, ms] : multi.pause_split_ms) pause += ms;
  for (const auto& [k, ms] : multi.resume_split_ms) resume += ms;
  CHECK(pause == Approx(multi.pause_ms).epsilon(1e-9));
  CHECK(resume == Approx(multi.resume_weights_ms + multi.resume_rest_ms).epsilon(1e-9));
  CHECK(multi.pause_split_ms.count("unmap") == 1);
  CHECK(multi.pause_split_ms.count("release_physical") == 1);
  CHECK(multi.resume_split_ms.count("create_physical") == 1);
  CHECK(multi.resume_split_ms.count("set_access") == 1);
  CHECK(multi.pause_split_ms.count("copy") == 0);  // no CPU backup
  // While training, the engine holds nothing: the training peak is the trainer's alone.
  CHECK(multi.phase_peak.at("train") < multi.phase_peak.at("rollout"));
}

TEST_CASE("RL timeline: sleep level 1 backs the weights up in pinned memory, level 2 does not") {
  const RlConfig c = small_config("llama-3.1-8b");
  const RlRunResult l1 =
      run_rl_one(c, c.models[0], saver_run("l1", "sleep_mode", "{level: 1}", true));
  const RlRunResult l2 =
      run_rl_one(c, c.models[0], saver_run("l2", "sleep_mode", "{level: 2}", true));
  REQUIRE(l1.error.empty());
  REQUIRE(l2.error.empty());
  uint64_t weights = 0;
  for (uint64_t b : rollout_weight_tensors(c.models[0])) weights += round_up(b, c.gpu.granularity);
  CHECK(l1.peak_pinned - l2.peak_pinned == weights);
  CHECK(l1.resume_weights_ms > l2.resume_weights_ms);  // the copy back over PCIe
  // vLLM's CuMemAllocator does not hold the graph pool: it stays resident while asleep.
  CHECK(l1.phase_peak.at("train") == l2.phase_peak.at("train"));
  const RlRunResult tagged =
      run_rl_one(c, c.models[0], saver_run("t", "tagged_regions", "{}", true));
  CHECK(l2.phase_peak.at("train") - tagged.phase_peak.at("train") ==
        round_up(l2.graph_bytes, c.gpu.granularity));
}

TEST_CASE("RL timeline: without a saver both engines stay resident and run out of memory") {
  RlConfig c = small_config("qwen2.5-7b");
  RlRunSpec none;
  none.label = "none";
  const RlRunResult r = run_rl_one(c, c.models[0], none);
  CHECK(r.error.empty());
  REQUIRE_FALSE(r.oom.empty());
  CHECK(r.oom.find("iteration 0") != std::string::npos);
  CHECK(r.oom_bytes_short > 0);
  CHECK(r.iterations_done == 0);
  // At a small KV pool it fits; the search finds the boundary between the two.
  c.rollout.gpu_memory_utilization = 0.3;
  const RlRunResult small = run_rl_one(c, c.models[0], none);
  CHECK(small.oom.empty());
  CHECK(small.error.empty());
  const double max_u = max_rollout_utilization(c, c.models[0], none);
  CHECK(max_u >= 0.3);
  CHECK(max_u < 0.85);
  RlRunSpec at = none;
  at.gpu_memory_utilization = max_u;
  CHECK(run_rl_one(c, c.models[0], at).oom.empty());
  at.gpu_memory_utilization = max_u + 0.01;
  CHECK_FALSE(run_rl_one(c, c.models[0], at).oom.empty());
}

TEST_CASE("RL timeline: separate GPUs hold each engine alone") {
  const RlConfig c = small_config("qwen2.5-7b");
  RlRunSpec sep;
  sep.label = "sep";
  sep.placement = RlPlacement::kSeparate;
  const RlRunResult r = run_rl_one(c, c.models[0], sep);
  REQUIRE(r.error.empty());
  CHECK(r.oom.empty());
  CHECK(r.gpus == 2);
  const RlRunResult multi =
      run_rl_one(c, c.models[0], saver_run("m", "tagged_regions", "{}", true));
  // The rollout GPU holds the engine only: the co-located run's rollout peak, as the trainer
  // there is offloaded while generating.
  CHECK(r.peak_rollout_gpu >= multi.phase_peak.at("rollout"));
  CHECK(r.peak_train_gpu < r.peak_rollout_gpu);
  CHECK(r.peak_pinned == 0);
}

TEST_CASE("RL timeline: reruns are identical") {
  const RlConfig c = small_config("qwen2.5-7b");
  const RlRunSpec run = saver_run("m", "tagged_regions", "{enable_cpu_backup: true}", true);
  const RlRunResult a = run_rl_one(c, c.models[0], run);
  const RlRunResult b = run_rl_one(c, c.models[0], run);
  REQUIRE(a.samples.size() == b.samples.size());
  for (size_t i = 0; i < a.samples.size(); ++i) {
    CHECK(a.samples[i].t == b.samples[i].t);
    CHECK(a.samples[i].bytes == b.samples[i].bytes);
  }
  CHECK(a.iteration_s == b.iteration_s);
}

TEST_CASE("a captured graph cannot be replayed over unmapped VMM memory") {
  SimClock clock;
  SimBackend b(h200(), clock);
  const uint64_t g = b.granularity();
  const DevPtr va = *b.reserve_virtual(4 * g, g);
  PhysHandle h = *b.create_physical(4 * g, "t");
  REQUIRE(b.map(va, 4 * g, h, 0).ok());
  REQUIRE(b.set_access(va, 4 * g).ok());
  const StreamId s = *b.create_stream();
  REQUIRE(b.begin_capture(s).ok());
  REQUIRE(b.fill(va + g, g, 7, s).ok());
  const GraphHandle graph = *b.end_capture(s);
  CHECK(b.launch(graph, s).ok());
  REQUIRE(b.unmap(va, 4 * g).ok());
  const Status broken = b.launch(graph, s);
  REQUIRE_FALSE(broken.ok());
  CHECK(broken.error().code == ErrorCode::kInvalidState);
  CHECK(broken.error().message.find("not mapped") != std::string::npos);
  // Mapped again at the same address (what a saver's resume does): valid again.
  REQUIRE(b.map(va, 4 * g, h, 0).ok());
  CHECK(b.launch(graph, s).ok());
  REQUIRE(b.destroy_graph(graph).ok());
  REQUIRE(b.unmap(va, 4 * g).ok());
  REQUIRE(b.release_physical(h).ok());
  REQUIRE(b.free_virtual(va).ok());
  std::string why;
  CHECK(b.check_invariants(&why));
}

// Qwen2.5-7B on the H200 (2 MiB granularity), small_config: the engine's 171 weight tensors,
// 28 KV tensors of whole blocks and its graph pool, each through the saver as its own physical
// allocation rounded up to 2 MiB.
TEST_CASE("RL timeline: each pause frees the engine's memory, each resume takes its tags back") {
  const RlConfig c = small_config("qwen2.5-7b");
  const ModelShape& m = c.models[0];
  const uint64_t g = c.gpu.granularity;
  REQUIRE(g == 2ull << 20);
  const RlRunSpec tagged = saver_run("multi", "tagged_regions", "{}", true);
  const RolloutPlan plan = plan_rollout(c, m, tagged, false);
  REQUIRE(plan.error.empty());
  // Weights: 7,615,616,512 parameters in bf16 (Qwen2.5-7B); 212.4 MiB more on the device.
  uint64_t weights = 0;
  for (uint64_t b : plan.weight_tensors) weights += round_up(b, g);
  CHECK(plan.weight_tensors.size() == 171);
  CHECK(m.weight_bytes() == 2 * 7615616512ull);
  CHECK(weights == 15453913088ull);
  const uint64_t kv = m.layers * round_up(plan.kv_layer_bytes, g);
  const uint64_t graphs = round_up(plan.budget.graph_memory, g);
  // The engine's caching allocator holds the rollout's activation segment until empty_cache.
  const uint64_t cache = round_up(plan.budget.activation_peak, g);

  const RlRunResult r = run_rl_one(c, m, tagged);
  REQUIRE(r.error.empty());
  REQUIRE(r.oom.empty());
  CHECK(r.weights_bytes == 15231233024ull);
  CHECK(r.weights_reserved_bytes == weights);
  CHECK(r.kv_reserved_bytes == kv);
  CHECK(r.graph_reserved_bytes == graphs);
  CHECK(r.pauses == 2);
  CHECK(r.resumes_weights == 2);
  CHECK(r.resumes_rest == 2);
  CHECK(r.pause_freed_bytes == weights + kv + graphs + cache);
  CHECK(r.resume_weights_bytes == weights);
  CHECK(r.resume_rest_bytes == kv + graphs);
  CHECK(r.pause_freed_bytes == 127867551744ull);
  CHECK(r.resume_weights_bytes + r.resume_rest_bytes == 126833655808ull);

  // All at once: stage 1 takes everything back, there is no stage 2.
  const RlRunResult all = run_rl_one(c, m, saver_run("all", "tagged_regions", "{}", false));
  CHECK(all.pause_freed_bytes == r.pause_freed_bytes);
  CHECK(all.resume_weights_bytes == weights + kv + graphs);
  CHECK(all.resumes_rest == 0);
  CHECK(all.resume_rest_bytes == 0);
  // vLLM's level-1 sleep leaves the graph pool resident: it frees that much less.
  const RlRunResult l1 = run_rl_one(c, m, saver_run("l1", "sleep_mode", "{level: 1}", true));
  CHECK(l1.graph_reserved_bytes == plan.budget.graph_memory);  // a caching-allocator block
  CHECK(r.pause_freed_bytes - l1.pause_freed_bytes == graphs);
  CHECK(l1.resume_rest_bytes == kv);
  // Without a saver nothing is paused or resumed; the weights are the tensors' bytes.
  RlRunSpec none;
  none.label = "none";
  const RlRunResult n = run_rl_one(c, m, none);
  CHECK(n.weights_reserved_bytes == r.weights_bytes);
  CHECK(n.pauses == 0);
  CHECK(n.pause_freed_bytes == 0);
  CHECK(n.resumes_weights + n.resumes_rest == 0);
}

// summary.json, timeseries.csv and the table each state the weights and what a pause frees;
// they must agree (through the files and the text alone).
TEST_CASE("RL outputs agree on the weights and on what each pause frees") {
  RlConfig c = small_config("qwen2.5-7b");
  RlRunSpec none;
  none.label = "none";
  c.runs = {none, saver_run("multi", "tagged_regions", "{}", true),
            saver_run("l1", "sleep_mode", "{level: 1}", true)};
  const RlResults res = run_rl(c);
  const std::string table = format_rl_table(c, res);
  memsim::test::TempDir tmp;
  {
    OutputDir dir(tmp.path().string(), "rl");
    write_rl_outputs(c, res, dir);
    dir.commit();
  }
  const std::string json = read_text(tmp.path() / "rl" / "summary.json");
  std::stringstream csv(read_text(tmp.path() / "rl" / "timeseries.csv"));
  std::string line;
  std::getline(csv, line);
  const std::vector<std::string> head = split(line, ',');
  const auto col = [&](const std::string& name) {
    const size_t i = std::find(head.begin(), head.end(), name) - head.begin();
    REQUIRE(i < head.size());
    return i;
  };
  const size_t run_col = col("run"), phase_col = col("phase"), weights_col = col("rollout.weights"),
               physical_col = col("physical");
  // Per run: the weights column's largest value; per release phase, device bytes at its first
  // and last sample.
  std::map<std::string, uint64_t> weights;
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> releases;
  std::string last_run, last_phase;
  while (std::getline(csv, line)) {
    const std::vector<std::string> row = split(line, ',');
    const std::string& run = row[run_col];
    weights[run] = std::max<uint64_t>(weights[run], std::stoull(row[weights_col]));
    const uint64_t physical = std::stoull(row[physical_col]);
    if (row[phase_col] == "release") {
      if (run != last_run || last_phase != "release") releases[run].push_back({physical, 0});
      releases[run].back().second = physical;
    }
    last_run = run;
    last_phase = row[phase_col];
  }
  // The model line states the parameters' bytes: 14.19 GiB.
  CHECK(table.find("qwen2.5-7b (weights 14.19 GiB: 7.62 B parameters in bf16)") !=
        std::string::npos);
  for (const char* label : {"none", "multi", "l1"}) {
    CAPTURE(label);
    CHECK(summary_field(json, label, "weights_bytes") == 15231233024);
    const int64_t reserved = summary_field(json, label, "weights_reserved_bytes");
    CHECK(reserved == static_cast<int64_t>(weights[label]));
    const std::vector<std::string> row = table_row(table, label);
    REQUIRE(row.size() > 9);
    CHECK(row[3] == fmt::format("{:.2f}", static_cast<double>(reserved) / (1ull << 30)));
    // What each pause freed, from the device bytes before and after each release phase.
    const int64_t freed = summary_field(json, label, "pause_freed_bytes");
    if (releases[label].empty()) {
      CHECK(freed == 0);
      CHECK(row[8] == "-");
      continue;
    }
    for (const auto& [before, after] : releases[label])
      CHECK(static_cast<int64_t>(before - after) == freed);
    CHECK(row[8] == fmt::format("{:.2f}", static_cast<double>(freed) / (1ull << 30)));
  }
  CHECK(summary_field(json, "none", "weights_reserved_bytes") == 15231233024);
  CHECK(summary_field(json, "multi", "weights_reserved_bytes") == 15453913088);
  CHECK(summary_field(json, "multi", "pause_freed_bytes") == 127867551744);
  // The OOM run completed no iteration: its iteration time does not exist.
  CHECK(table_row(table, "none")[15] == "-");
}

// The rollout sized by SGLang's rule (the seed's "mem fraction" 0.6 / 0.8 / 0.9): the KV cache is
// mem_fraction_static x the GPU's memory free at start (the capacity less the CUDA context) less
// the rollout's weights, whatever its activations and graphs; a run's own fraction wins over the
// rollout's, and vLLM's rule is untouched.
TEST_CASE("RL rollout: SGLang's mem_fraction_static sizes the KV cache") {
  RlConfig c = small_config("qwen2.5-7b");
  const ModelShape& m = c.models[0];
  RlRunSpec run = saver_run("multi", "tagged_regions", "{}", true);
  const RolloutPlan vllm = plan_rollout(c, m, run, false);
  REQUIRE(vllm.error.empty());
  CHECK(vllm.budget.mem_fraction_static == 0);
  const std::string vllm_key = rollout_plan_key(c, m, run);
  c.rollout.mem_fraction_static = 0.6;
  const RolloutPlan at06 = plan_rollout(c, m, run, false);
  REQUIRE(at06.error.empty());
  const auto free_at_start = static_cast<double>(c.gpu.capacity - c.gpu.context);
  REQUIRE(c.gpu.context == 552402944);
  const auto usable = static_cast<uint64_t>(0.6 * free_at_start);
  CHECK(at06.budget.usable == usable);
  CHECK(at06.budget.kv_bytes == usable - m.weight_bytes());
  CHECK(at06.budget.mem_fraction_static == 0.6);
  CHECK(rollout_plan_key(c, m, run) != vllm_key);
  run.mem_fraction_static = 0.9;
  const RolloutPlan at09 = plan_rollout(c, m, run, false);
  REQUIRE(at09.error.empty());
  CHECK(at09.budget.kv_bytes == static_cast<uint64_t>(0.9 * free_at_start) - m.weight_bytes());
  CHECK(rollout_uses_sglang_rule(c, run));
}
