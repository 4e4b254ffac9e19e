// The RL co-location experiment: YAML into RlConfig, the terminal table, summary.json,
// phases.csv, timeseries.csv and the stacked memory-by-tag timeline plot.
#include "src/app/rl_experiment.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <ostream>

#include "src/app/plots.h"
#include "src/app/writers.h"
#include "src/config/loaders.h"
#include "src/config/requests_loader.h"
#include "src/serve/serving_experiment.h"
#include "workload/collectives.h"
#include "workload/tensor_parallel.h"

namespace memsim {

namespace fs = std::filesystem;

bool is_rl_config(const ConfigNode& root) {
  return root.is_map() && root.has("train") && root.has("rollout");
}

bool is_rl_config(const std::string& path) {
  try {
    const ConfigNode root = ConfigNode::load_file(path);
    return root.is_map() && root.has("train") && root.has("rollout");
  } catch (const ConfigError&) {
    return false;
  }
}

namespace {

constexpr double kGB = 1e9;

TrainSpec parse_train(const ConfigNode& n, RlConfig& c) {
  n.expect_keys({"dp", "tp", "sharding", "param_dtype", "activation_checkpointing", "fp32_logits",
                 "adam", "micro_batch_tokens", "bucket_bytes", "prefetch", "reference",
                 "old_log_prob", "optimizer_steps"});
  TrainSpec s;
  if (auto v = n.find("dp")) s.dp = static_cast<uint32_t>(v->as_uint_in(1, 1u << 16));
  if (auto v = n.find("tp")) s.tp = static_cast<uint32_t>(v->as_uint_in(1, 64));
  if (auto v = n.find("sharding")) {
    const std::string x = v->as_choice({"none", "zero1", "zero2", "zero3", "fsdp"});
    s.sharding = x == "none"    ? Sharding::kNone
                 : x == "zero1" ? Sharding::kZero1
                 : x == "zero2" ? Sharding::kZero2
                                : Sharding::kZero3;
  }
  if (auto v = n.find("param_dtype"))
    s.param_dtype = v->as_choice({"fp32", "bf16"}) == "fp32" ? DType::kFP32 : DType::kBF16;
  if (auto v = n.find("activation_checkpointing")) s.activation_checkpointing = v->as_bool();
  if (auto v = n.find("fp32_logits")) s.fp32_logits = v->as_bool();
  if (auto v = n.find("adam")) s.adam_foreach = v->as_choice({"foreach", "fused"}) == "foreach";
  if (auto v = n.find("micro_batch_tokens")) s.micro_batch_tokens = v->as_uint_in(1, 1u << 24);
  if (auto v = n.find("bucket_bytes")) {
    s.bucket_bytes = v->as_bytes();
    if (s.bucket_bytes == 0) v->fail("must be positive");
  }
  if (auto v = n.find("prefetch")) s.prefetch = static_cast<uint32_t>(v->as_uint_in(0, 8));
  if (auto v = n.find("reference")) c.reference = v->as_bool();
  if (auto v = n.find("old_log_prob")) c.old_log_prob = v->as_bool();
  if (auto v = n.find("optimizer_steps"))
    c.optimizer_steps = static_cast<uint32_t>(v->as_uint_in(1, 1024));
  return s;
}

// SGLang's budget rule in a map that may also name vLLM's: one or the other.
double parse_mem_fraction_static(const ConfigNode& n) {
  const auto v = n.find("mem_fraction_static");
  if (!v) return 0;
  if (n.has("gpu_memory_utilization"))
    v->fail(
        "give gpu_memory_utilization (vLLM's budget rule) or mem_fraction_static (SGLang's), "
        "not both");
  return v->as_double_in(0.01, 0.99);
}

void parse_rollout(const ConfigNode& n, RlRolloutSpec& r) {
  n.expect_keys({"gpu_memory_utilization", "mem_fraction_static", "max_model_len", "enforce_eager",
                 "tensor_parallel", "kv", "scheduler", "requests"});
  if (auto v = n.find("gpu_memory_utilization"))
    r.gpu_memory_utilization = v->as_double_in(0.01, 1);
  r.mem_fraction_static = parse_mem_fraction_static(n);
  if (auto v = n.find("max_model_len"))
    r.serve.max_model_len = static_cast<uint32_t>(v->as_uint_in(16, 1u << 22));
  if (auto v = n.find("enforce_eager")) r.enforce_eager = v->as_bool();
  if (auto v = n.find("tensor_parallel"))
    r.tensor_parallel = static_cast<uint32_t>(v->as_uint_in(1, 64));
  if (auto v = n.find("kv")) {
    const KvChoice k = parse_kv(*v);
    r.kv_impl = k.impl;
    r.kv_factory = k.factory;
    r.kv_block_size = k.block_size;
  } else {
    const ConfigNode d = ConfigNode::parse("{impl: paged_block_pool, block_size: 16}", "default");
    r.kv_factory = parse_kv(d).factory;
  }
  SchedulerChoice sched{schedulers().find("continuous_batching"), r.serve};
  if (auto v = n.find("scheduler")) sched = parse_scheduler(*v, sched);
  r.scheduler = sched.info->name;
  const uint32_t max_len = r.serve.max_model_len;
  r.serve = sched.options;
  r.serve.max_model_len = max_len;
  const ConfigNode req = n["requests"];
  const RequestsConfig rc = load_requests_config(req);
  if (rc.source != RequestSource::kSynthetic)
    req.fail("source: the rollout's prompts are synthetic (one GPU's share per iteration)");
  r.requests = rc.synthetic;
  const uint32_t longest = r.requests.prompt.largest() + r.requests.output.largest();
  if (longest > r.serve.max_model_len)
    req.fail(fmt::format("prompt + output can reach {} tokens, above rollout.max_model_len {}",
                         longest, r.serve.max_model_len));
}

// The seed's baseline: {weights_to: host} or {weights_to: disk, disk_gbps: G}.
RlTeardown parse_teardown(const ConfigNode& n) {
  if (!n.is_map()) n.fail("a map {weights_to: host} or {weights_to: disk, disk_gbps: G}");
  n.expect_keys({"weights_to", "disk_gbps"});
  RlTeardown t;
  if (n["weights_to"].as_choice({"host", "disk"}) == "disk")
    t.weights_to = RlTeardown::WeightsTo::kDisk;
  if (auto v = n.find("disk_gbps")) {
    if (t.weights_to != RlTeardown::WeightsTo::kDisk)
      v->fail("disk_gbps applies to weights_to: disk");
    t.disk_bytes_per_s = v->as_double_in(0.01, 1e4) * kGB;
  } else if (t.weights_to == RlTeardown::WeightsTo::kDisk) {
    n.fail("weights_to: disk needs disk_gbps (the disk's write and read bandwidth, GB/s)");
  }
  return t;
}

// The rollout's TP size must shard every model and have collective times in the GPU file.
void check_rollout_tp(const ConfigNode& rollout, const RlConfig& c) {
  const uint32_t tp = c.rollout.tensor_parallel;
  if (tp <= 1) return;
  const ConfigNode key = rollout["tensor_parallel"];
  for (const ModelShape& m : c.models)
    if (Result<TensorParallelShard> s = shard_tensor_parallel(m, tp); !s.ok())
      key.fail(s.error().message);
  if (Result<CollectiveTime> t = CollectiveTime::make(c.gpu, tp, true); !t.ok())
    key.fail(fmt::format("{}: {}", c.gpu.name, t.error().message));
}

RlRunSpec parse_run(const ConfigNode& n) {
  n.expect_keys({"label", "placement", "saver", "teardown", "tags", "multi_stage", "offload_params",
                 "offload_optimizer", "gpu_memory_utilization", "mem_fraction_static"});
  RlRunSpec r;
  r.label = n["label"].as_string();
  if (auto v = n.find("placement"))
    r.placement = v->as_choice({"colocated", "separate"}) == "separate" ? RlPlacement::kSeparate
                                                                        : RlPlacement::kColocated;
  if (auto v = n.find("saver"); v && !(v->is_scalar() && v->as_string() == "none")) {
    if (!v->is_map()) v->fail("a map {impl: tagged_regions | sleep_mode, ...} or none");
    const SaverEntry& info = memory_savers().select(*v);
    r.saver = info.name;
    r.saver_factory = info.parse(*v);
    // What each system puts in its pausable pool (see RlRunSpec::saver_tags).
    r.saver_tags = info.traits.default_tags;
    if (r.placement == RlPlacement::kSeparate)
      v->fail("placement: separate keeps each engine on its own GPUs; it needs no saver");
  }
  if (auto v = n.find("tags")) {
    if (r.saver.empty()) v->fail("tags apply to a saver; this run has none");
    r.saver_tags.clear();
    for (const ConfigNode& t : v->items())
      r.saver_tags.push_back(t.as_choice({"weights", "kv_cache", "cuda_graph"}));
    if (r.saver_tags.empty()) v->fail("needs at least one tag");
  }
  if (auto v = n.find("teardown")) {
    if (!r.saver.empty())
      v->fail("teardown is the baseline without a saver; give a saver or teardown, not both");
    if (r.placement == RlPlacement::kSeparate)
      v->fail("placement: separate keeps each engine on its own GPUs; nothing to tear down");
    r.teardown = parse_teardown(*v);
  }
  const bool saver = !r.saver.empty();
  r.multi_stage = saver;
  if (auto v = n.find("multi_stage")) {
    r.multi_stage = v->as_bool();
    if (r.multi_stage && !saver) v->fail("multi-stage resume needs a saver");
    if (r.multi_stage &&
        (r.saver_tags.size() < 2 ||
         std::find(r.saver_tags.begin(), r.saver_tags.end(), "weights") == r.saver_tags.end()))
      v->fail("multi-stage resume needs the weights and at least one other tag in the saver");
  }
  r.offload_params = r.offload_optimizer = saver || r.teardown.has_value();
  if (auto v = n.find("offload_params")) r.offload_params = v->as_bool();
  if (auto v = n.find("offload_optimizer")) r.offload_optimizer = v->as_bool();
  if (auto v = n.find("gpu_memory_utilization"))
    r.gpu_memory_utilization = v->as_double_in(0.01, 1);
  r.mem_fraction_static = parse_mem_fraction_static(n);
  return r;
}

std::string json_map(const std::map<std::string, double>& m) {
  std::string s = "{";
  for (const auto& [k, v] : m) s += fmt::format("{}\"{}\": {:.4f}", s.size() > 1 ? ", " : "", k, v);
  return s + "}";
}

std::string gib(uint64_t b) {
  return fmt::format("{:.1f}", static_cast<double>(b) / (1ull << 30));
}

}  // namespace

// What parse_train, parse_rollout, parse_run and load_rl_config accept (their expect_keys and
// select calls; tests/test_config_doc.cpp checks the two agree).
const ConfigKeys& rl_config_keys() {
  static const ConfigKeys kKeys = {
      {"",
       {"experiment", "gpu", "models", "iterations", "allocator", "train", "rollout", "weight_sync",
        "interconnect_gbps", "network_gbps", "runs", "seed", "max_utilization", "grid"}},
      {"allocator", {}, "caching_allocators()"},
      {"train",
       {"dp", "tp", "sharding", "param_dtype", "activation_checkpointing", "fp32_logits", "adam",
        "micro_batch_tokens", "bucket_bytes", "prefetch", "reference", "old_log_prob",
        "optimizer_steps"}},
      {"rollout",
       {"gpu_memory_utilization", "mem_fraction_static", "max_model_len", "enforce_eager",
        "tensor_parallel", "kv", "scheduler", "requests"}},
      {"rollout.kv", keys_at(serving_config_keys(), "kv"), "kv_strategies()"},
      {"rollout.scheduler", keys_at(serving_config_keys(), "scheduler"), "schedulers()"},
      {"weight_sync", {"bucket_bytes"}},
      {"runs[]",
       {"label", "placement", "saver", "teardown", "tags", "multi_stage", "offload_params",
        "offload_optimizer", "gpu_memory_utilization", "mem_fraction_static"}},
      {"runs[].saver", {}, "memory_savers()"},
      {"runs[].teardown", {"weights_to", "disk_gbps"}},
  };
  return kKeys;
}

RlConfig load_rl_config(const std::string& path, const std::vector<std::string>& overrides) {
  ConfigNode root = ConfigNode::load_file(path);
  for (const std::string& o : overrides) root.apply_override(o);
  return load_rl_config(root);
}

RlConfig load_rl_config(const ConfigNode& root) {
  root.expect_keys({"experiment", "gpu", "models", "iterations", "allocator", "train", "rollout",
                    "weight_sync", "interconnect_gbps", "network_gbps", "runs", "seed",
                    "max_utilization", "grid"});
  RlConfig c;
  c.source = root.file();
  if (auto v = root.find("experiment")) c.experiment = v->as_plain_name();
  c.gpu = load_gpu_spec(
      ConfigNode::load_file(resolve_config_path(root["gpu"], root["gpu"].as_string(), "gpus")));
  for (const ConfigNode& m : root["models"].items()) {
    c.models.push_back(
        load_model_shape(ConfigNode::load_file(resolve_config_path(m, m.as_string(), "models"))));
    if (c.models.back().sliding_window)
      m.fail(
          "a model with sliding-window layers: the RL rollout's KV sizing is not modelled for "
          "them (serving experiments are)");
  }
  if (c.models.empty()) root["models"].fail("needs at least one model");
  if (auto v = root.find("max_utilization")) c.max_utilization = v->as_bool();
  if (auto v = root.find("iterations"))
    c.iterations = static_cast<uint32_t>(v->as_uint_in(1, 1000));
  const ConfigNode alloc = root.find("allocator")
                               ? root["allocator"]
                               : ConfigNode::parse("{impl: torch_caching}", root.file());
  {
    const AllocatorEntry& info = caching_allocators().select(alloc);
    c.allocator = info.parse(alloc);
    c.allocator_yaml = info.name;
  }
  c.train = parse_train(root["train"], c);
  parse_rollout(root["rollout"], c.rollout);
  check_rollout_tp(root["rollout"], c);
  if (auto v = root.find("seed")) c.rollout.requests.seed = v->as_uint();
  if (auto v = root.find("weight_sync")) {
    v->expect_keys({"bucket_bytes"});
    if (auto b = v->find("bucket_bytes")) {
      c.sync_bucket_bytes = b->as_bytes();
      if (c.sync_bucket_bytes == 0) b->fail("must be positive");
    }
  }
  if (auto v = root.find("interconnect_gbps"))
    c.interconnect_bytes_per_s = v->as_double_in(1, 1e5) * kGB;
  if (auto v = root.find("network_gbps")) c.network_bytes_per_s = v->as_double_in(0.1, 1e5) * kGB;
  for (const ConfigNode& r : root["runs"].items()) {
    RlRunSpec run = parse_run(r);
    for (const RlRunSpec& other : c.runs)
      if (other.label == run.label) r["label"].fail("duplicate run label '" + run.label + "'");
    c.runs.push_back(std::move(run));
  }
  if (c.runs.empty()) root["runs"].fail("needs at least one run");
  return c;
}

namespace {

// The RL table's columns: two header lines (name, unit) and one row per run. GiB: device memory
// of one GPU, max over iterations (separate_gpus runs: either of the rank's 2 GPUs).
constexpr ColumnDoc kRlColumns[] = {
    {"run", "the run's label (in every column, - marks a figure that does not exist for it)", -22},
    {"saver",
     "none, tagged_regions, sleep_mode, or teardown:host / teardown:disk (the seed's baseline: "
     "the engine freed after each rollout and rebuilt, weights through host memory)",
     -14},
    {"KV", "the rollout engine's KV budget", 6, "GiB"},
    {"weights",
     "device memory held for the engine's weights (a saver rounds each tensor up to 2 MiB; the "
     "model line gives the parameters' bytes)",
     7, "GiB"},
    {"peak",
     "peak device memory of one GPU over every phase and iteration (separate_gpus: either of the "
     "rank's 2 GPUs)",
     6, "GiB"},
    {"rollout", "peak device memory during the rollout phase", 7, "GiB"},
    {"train", "peak device memory during the train phase", 6, "GiB"},
    {"sync", "peak device memory during the weight sync (memory, not a time)", 6, "GiB"},
    {"freed",
     "what each pause gives back: device bytes at the start of the release phase less at its end",
     7, "GiB"},
    {"resumed", "what the resume stages take back (the saver's tags only)", 7, "GiB"},
    {"pinned", "peak pinned host memory", 8, "host GiB"},
    {"pause",
     "simulated ms per iteration of the saver's pause (the release phase; teardown: freeing the "
     "engine)",
     8, "ms"},
    {"wake1",
     "resume stage 1 per iteration: the weights (all at once: everything; teardown: the weights "
     "read back over PCIe, from disk first)",
     7, "ms"},
    {"wake2",
     "resume stage 2 per iteration: the rest (teardown: KV cache allocated, graphs captured again)",
     7, "ms"},
    {"rollout", "simulated seconds of the rollout phase per iteration", 7, "s"},
    {"iter", "simulated seconds per completed iteration", 7, "s"},
    {"max util",
     "the largest rollout gpu_memory_utilization (mem_fraction_static under SGLang's rule) at "
     "which every iteration completes; - when not searched",
     8},
    {"graphs",
     "valid when every replay of the captured decode graph after a resume ran, else BROKEN", -6},
    {"outcome", "ok; OOM at iteration N, PHASE: what ran out (bytes short); or error: ..."},
};
constexpr char kRlRow[] =
    "  {:<22} {:<14} {:>6} {:>7} {:>6} {:>7} {:>6} {:>6} {:>7} {:>7} {:>8} {:>8} {:>7} {:>7} "
    "{:>7} {:>7} {:>8} {:<6}  {}\n";

std::string rl_table_header() {
  return header_row(kRlColumns, "  ") + unit_row(kRlColumns, "  ");
}

// The model's line: its weights as parameters (summary.json weights_bytes).
std::string rl_model_line(const RlConfig& c, const std::string& name) {
  for (const ModelShape& m : c.models)
    if (m.name == name)
      return fmt::format("\n{} (weights {:.2f} GiB: {:.2f} B parameters in {})\n", name,
                         static_cast<double>(m.weight_bytes()) / (1ull << 30),
                         static_cast<double>(m.weight_bytes() / dtype_bytes(m.dtype)) / 1e9,
                         to_string(m.dtype));
  return fmt::format("\n{}\n", name);
}

std::string rl_table_row(const RlRunResult& r) {
  auto phase = [&](const char* name) {
    auto it = r.phase_peak.find(name);
    return it == r.phase_peak.end() ? std::string("-") : gib(it->second);
  };
  // A figure, or "-" where none exists (no pause, no resume stage, no completed iteration).
  auto maybe = [](bool exists, std::string s) { return exists ? s : std::string("-"); };
  auto ms = [](double v) { return fmt::format("{:.1f}", v); };
  auto gib2 = [](uint64_t b) {
    return fmt::format("{:.2f}", static_cast<double>(b) / (1ull << 30));
  };
  std::string outcome = "ok";
  if (!r.error.empty())
    outcome = "error: " + r.error;
  else if (!r.oom.empty())
    outcome = "OOM at " + r.oom;
  return fmt::format(kRlRow, r.label, r.saver, gib(r.kv_bytes),
                     maybe(r.weights_reserved_bytes > 0, gib2(r.weights_reserved_bytes)),
                     gib(r.peak), phase("rollout"), phase("train"), phase("sync"),
                     maybe(r.pauses > 0, gib2(r.pause_freed_bytes)),
                     maybe(r.resumes_weights + r.resumes_rest > 0,
                           gib2(r.resume_weights_bytes + r.resume_rest_bytes)),
                     gib(r.peak_pinned), maybe(r.pauses > 0, ms(r.pause_ms)),
                     maybe(r.resumes_weights > 0, ms(r.resume_weights_ms)),
                     maybe(r.resumes_rest > 0, ms(r.resume_rest_ms)),
                     maybe(r.phase_peak.count("rollout") > 0, fmt::format("{:.2f}", r.rollout_s)),
                     maybe(r.iterations_done > 0, fmt::format("{:.2f}", r.iteration_s)),
                     maybe(r.max_utilization >= 0, fmt::format("{:.2f}", r.max_utilization)),
                     r.graph_launches == 0 ? "-" : (r.graphs_valid ? "valid" : "BROKEN"), outcome);
}

// Where the saver's time goes, by primitive.
std::string rl_primitive_table(const RlResults& res) {
  std::vector<std::string> prims;
  for (const RlRunResult& r : res.runs)
    for (const auto* split : {&r.pause_split_ms, &r.resume_split_ms})
      for (const auto& [k, ms] : *split)
        if (std::find(prims.begin(), prims.end(), k) == prims.end()) prims.push_back(k);
  if (prims.empty()) return "";
  std::string out = "\npause / resume (both stages) by primitive, simulated ms per iteration:\n";
  out += fmt::format("  {:<14} {:<22} {:<6}", "model", "run", "");
  for (const std::string& k : prims)
    out += fmt::format(" {:>{}}", k, std::max<size_t>(8, k.size()));
  out += "\n";
  for (const RlRunResult& r : res.runs) {
    if (r.pause_split_ms.empty() && r.resume_split_ms.empty()) continue;
    for (const auto& [what, split] :
         {std::pair{"pause", &r.pause_split_ms}, std::pair{"resume", &r.resume_split_ms}}) {
      out += fmt::format("  {:<14} {:<22} {:<6}", r.model, r.label, what);
      for (const std::string& k : prims) {
        auto it = split->find(k);
        const size_t w = std::max<size_t>(8, k.size());
        out += it == split->end() ? fmt::format(" {:>{}}", "-", w)
                                  : fmt::format(" {:>{}.2f}", it->second, w);
      }
      out += "\n";
    }
  }
  return out;
}

}  // namespace

std::span<const ColumnDoc> rl_columns() {
  return kRlColumns;
}

std::string format_rl_table(const RlConfig& c, const RlResults& res, bool explain) {
  std::string out = fmt::format(
      "RL co-location on {} ({:.0f} GiB), {} iterations; trainer dp={} tp={} {} ({} params), "
      "rollout {} {:.2f}{}\n",
      c.gpu.name, static_cast<double>(c.gpu.capacity) / (1ull << 30), c.iterations, c.train.dp,
      c.train.tp, to_string(c.train.sharding),
      c.train.param_dtype == DType::kFP32 ? "fp32" : "bf16",
      c.rollout.mem_fraction_static > 0 ? "mem_fraction_static" : "gpu_memory_utilization",
      c.rollout.mem_fraction_static > 0 ? c.rollout.mem_fraction_static
                                        : c.rollout.gpu_memory_utilization,
      c.rollout.tensor_parallel > 1
          ? fmt::format(", tensor_parallel {} (figures: one rank)", c.rollout.tensor_parallel)
          : "");
  std::string model;
  for (const RlRunResult& r : res.runs) {
    if (r.model != model) {
      model = r.model;
      out += rl_model_line(c, model) + rl_table_header();
    }
    out += rl_table_row(r);
  }
  out += "\n" + table_legend(kRlColumns, kRlAnchor, explain);
  out += rl_primitive_table(res);
  out += fmt::format("\n{:.1f} s wall\n", res.wall_seconds);
  return out;
}

void write_rl_outputs(const RlConfig& c, const RlResults& res, OutputDir& dir) {
  dir.write("summary.json", [&](std::ostream& f) {
    f << "{\n  \"experiment\": \"" << json_escape(c.experiment) << "\",\n  \"gpu\": \""
      << json_escape(c.gpu.name) << "\",\n  \"capacity_bytes\": " << c.gpu.capacity
      << ",\n  \"iterations\": " << c.iterations << ",\n  \"runs\": [\n";
    for (size_t i = 0; i < res.runs.size(); ++i) {
      const RlRunResult& r = res.runs[i];
      f << fmt::format(
          "    {{\"label\": \"{}\", \"model\": \"{}\", \"placement\": \"{}\", \"saver\": \"{}\", "
          "\"outcome\": \"{}\", \"oom\": \"{}\", \"oom_bytes_short\": {}, \"error\": \"{}\", "
          "\"iterations_done\": {}, \"gpus_per_rank\": {}, \"kv_bytes\": {}, \"kv_tokens\": {}, "
          "\"weights_bytes\": {}, \"graph_bytes\": {}, \"rollout_tp\": {}, "
          "\"rollout_comm_bytes\": {}, \"weights_reserved_bytes\": {}, "
          "\"kv_reserved_bytes\": {}, \"graph_reserved_bytes\": {}, \"peak_bytes\": {}, "
          "\"peak_train_gpu_bytes\": {}, \"peak_rollout_gpu_bytes\": {}, "
          "\"peak_pinned_host_bytes\": {}, \"phase_peak_bytes\": {{",
          json_escape(r.label), json_escape(r.model), r.placement, r.saver,
          !r.error.empty() ? "error" : (!r.oom.empty() ? "oom" : "ok"), json_escape(r.oom),
          r.oom_bytes_short, json_escape(r.error), r.iterations_done, r.gpus, r.kv_bytes,
          r.kv_tokens, r.weights_bytes, r.graph_bytes, r.rollout_tp, r.rollout_comm_bytes,
          r.weights_reserved_bytes, r.kv_reserved_bytes, r.graph_reserved_bytes, r.peak,
          r.peak_train_gpu, r.peak_rollout_gpu, r.peak_pinned);
      bool first = true;
      for (const auto& [name, b] : r.phase_peak) {
        f << fmt::format("{}\"{}\": {}", first ? "" : ", ", name, b);
        first = false;
      }
      f << fmt::format(
          "}}, \"rollout_s\": {:.6f}, \"train_s\": {:.6f}, \"sync_s\": {:.6f}, "
          "\"iteration_s\": {:.6f}, \"pause_ms\": {:.4f}, \"resume_weights_ms\": {:.4f}, "
          "\"resume_rest_ms\": {:.4f}, \"pause_freed_bytes\": {}, \"resume_weights_bytes\": {}, "
          "\"resume_rest_bytes\": {}, \"offload_ms\": {:.4f}, \"reload_ms\": {:.4f}, "
          "\"weights_out_ms\": {:.4f}, \"recapture_ms\": {:.4f}, \"weights_out_bytes\": {}, "
          "\"weights_in_bytes\": {}, "
          "\"preemptions\": {}, \"rollout_tokens_per_s\": {:.2f}, \"max_utilization\": {:.2f}, "
          "\"graph_launches\": {}, "
          "\"graphs_valid\": {}, \"graph_error\": \"{}\", \"pause_split_ms\": {}, "
          "\"resume_split_ms\": {}}}{}\n",
          r.rollout_s, r.train_s, r.sync_s, r.iteration_s, r.pause_ms, r.resume_weights_ms,
          r.resume_rest_ms, r.pause_freed_bytes, r.resume_weights_bytes, r.resume_rest_bytes,
          r.offload_ms, r.reload_ms, r.weights_out_ms, r.recapture_ms, r.weights_out_bytes,
          r.weights_in_bytes, r.preemptions, r.rollout_tokens_per_s, r.max_utilization,
          r.graph_launches, r.graphs_valid ? "true" : "false", json_escape(r.graph_error),
          json_map(r.pause_split_ms), json_map(r.resume_split_ms),
          i + 1 < res.runs.size() ? "," : "");
    }
    f << "  ]\n}\n";
  });
  dir.write("phases.csv", [&](std::ostream& f) {
    f << "model,run,iteration,phase,start_s,end_s,peak_bytes\n";
    for (const RlRunResult& r : res.runs)
      for (const RlPhase& p : r.phases)
        f << fmt::format("{},{},{},{},{:.6f},{:.6f},{}\n", csv_cell(r.model), csv_cell(r.label),
                         p.iteration, p.name, static_cast<double>(p.start) / 1e9,
                         static_cast<double>(p.end) / 1e9, p.peak);
  });
  // Wide rows: one per sample, one column per tag.
  dir.write("timeseries.csv", [&](std::ostream& f) {
    f << "model,run,gpu,time_s,phase";
    for (size_t t = 0; t < kRlTagCount; ++t) f << "," << to_string(static_cast<RlTag>(t));
    f << ",physical\n";
    for (const RlRunResult& r : res.runs)
      for (const RlSample& s : r.samples) {
        f << fmt::format("{},{},{},{:.6f},{}", csv_cell(r.model), csv_cell(r.label),
                         r.gpus == 1 ? "shared" : (s.gpu == 0 ? "train" : "rollout"),
                         static_cast<double>(s.t) / 1e9, r.phases[s.phase].name);
        for (uint64_t b : s.bytes) f << "," << b;
        f << "," << s.physical << "\n";
      }
  });
}

int run_rl_experiment(const RlConfig& c, OutputDir& dir, std::ostream& out, std::ostream&,
                      bool explain) {
  const RlResults res = run_rl(c);
  out << format_rl_table(c, res, explain);
  write_rl_outputs(c, res, dir);
  dir.add_note(run_plot_script("plot_rl.py", dir, {}, {"rl_timeline.png", "rl_timeline.svg"}));
  for (const RlRunResult& r : res.runs)
    if (!r.error.empty()) return 1;
  return 0;
}

}  // namespace memsim
