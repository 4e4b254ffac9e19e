// The tp_memory experiment: typed config, one KV budget per point (in parallel), the per-rank
// table, summary.json and ranks.csv.
#include "src/app/tp_memory_experiment.h"

#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>

#include "core/parallel.h"
#include "src/app/legend.h"
#include "src/config/loaders.h"
#include "src/graph/registry.h"

namespace memsim {

namespace {

using json = nlohmann::ordered_json;

// Every column; the TP-only table leaves out PP and stage (kPipelineColumns).
constexpr ColumnDoc kColumns[] = {
    {"model", "the model", -14},
    {"gpu", "the GPU (its file's capacity and interconnect)", -5},
    {"TP", "tensor_parallel_size: ranks sharding every layer", 3},
    {"PP", "pipeline_parallel_size: stages splitting the layers", 3},
    {"stage", "the pipeline stage of the row's ranks, and its layers (first..last)", -9},
    {"graphs", "the graph-memory strategy whose captures are subtracted (none: enforce_eager)",
     -14},
    {"weights", "one rank's shard of the weights, GiB", 8},
    {"act", "the profile run's peak allocated bytes on a rank, GiB", 6},
    {"graph", "the rank's CUDA-graph memory, GiB", 6},
    {"NCCL", "NCCL's communicator and collective buffers on a rank (outside the budget), GiB", 6},
    {"AR", "vLLM's custom all-reduce buffers on a rank (outside the budget), GiB", 5},
    {"KV", "the rank's KV cache: utilization x capacity - weights - act - graph, GiB", 7},
    {"free", "what a rank leaves free: capacity - usable - NCCL - AR, GiB", 6},
    {"KV tok", "tokens the KV cache holds (every rank holds its heads of each token)", 9},
    {"seqs", "sequences of context_tokens the engine holds at once (min over ranks)", 6},
    {"outcome", "ok, or why vLLM would not start (the shortfall named)", 0},
};
constexpr size_t kPipelineColumns[] = {3, 4};  // PP, stage
constexpr std::string_view kAnchor = kTpMemoryAnchor;

bool any_pipeline(const TpMemoryConfig& c) {
  return std::any_of(c.pipeline_parallel_sizes.begin(), c.pipeline_parallel_sizes.end(),
                     [](uint32_t pp) { return pp > 1; });
}

std::string gib(uint64_t b) {
  return fmt::format("{:.2f}", static_cast<double>(b) / (1ull << 30));
}

std::vector<std::string> graph_choices() {
  std::vector<std::string> names = graph_strategies().names();
  names.push_back("none");
  return names;
}

std::vector<ConfigNode> non_empty_list(const ConfigNode& root, const char* key) {
  const ConfigNode n = root[key];
  if (!n.is_sequence() || n.items().empty()) n.fail("must be a non-empty list");
  return n.items();
}

}  // namespace

const ConfigKeys& tp_memory_config_keys() {
  static const ConfigKeys kKeys = {
      {"",
       {"experiment", "models", "gpus", "tensor_parallel_sizes", "pipeline_parallel_sizes",
        "graph_memory", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens",
        "max_model_len", "kv_block_size", "context_tokens", "parallel", "seed"}},
      {"parallel", {"custom_all_reduce", "nccl_cumem"}},
  };
  return kKeys;
}

bool is_tp_memory_config(const ConfigNode& root) {
  return root.is_map() && root.has("tensor_parallel_sizes");
}

TpMemoryConfig load_tp_memory_config(const ConfigNode& root) {
  root.expect_keys(keys_at(tp_memory_config_keys(), ""));
  TpMemoryConfig c;
  c.source = root.file();
  c.experiment = root["experiment"].as_plain_name();
  for (const ConfigNode& m : non_empty_list(root, "models")) {
    c.model_files.push_back(resolve_config_path(m, m.as_string(), "models"));
    c.models.push_back(load_model_shape(ConfigNode::load_file(c.model_files.back())));
  }
  for (const ConfigNode& g : non_empty_list(root, "gpus")) {
    c.gpu_files.push_back(resolve_config_path(g, g.as_string(), "gpus"));
    c.gpus.push_back(load_gpu_spec(ConfigNode::load_file(c.gpu_files.back())));
  }
  for (const ConfigNode& t : non_empty_list(root, "tensor_parallel_sizes")) {
    const auto tp = static_cast<uint32_t>(t.as_uint_in(1, 1024));
    for (const ModelShape& m : c.models)
      for (const GpuSpec& g : c.gpus) check_tensor_parallel(t, tp, m, g);
    c.tensor_parallel_sizes.push_back(tp);
  }
  if (root.has("pipeline_parallel_sizes")) {
    c.pipeline_parallel_sizes.clear();
    for (const ConfigNode& n : non_empty_list(root, "pipeline_parallel_sizes")) {
      const auto pp = static_cast<uint32_t>(n.as_uint_in(1, 1024));
      for (const ModelShape& m : c.models)
        for (const GpuSpec& g : c.gpus)
          for (uint32_t tp : c.tensor_parallel_sizes) check_pipeline_parallel(n, tp, pp, m, g);
      c.pipeline_parallel_sizes.push_back(pp);
    }
  }
  if (auto g = root.find("graph_memory")) {
    if (!g->is_sequence() || g->items().empty()) g->fail("must be a non-empty list");
    for (const ConfigNode& s : g->items()) c.graph_memory.push_back(s.as_choice(graph_choices()));
  } else {
    c.graph_memory = {"shared_pool"};
  }
  if (auto v = root.find("gpu_memory_utilization"))
    c.gpu_memory_utilization = v->as_double_in(0.01, 1.0);
  if (auto v = root.find("max_num_seqs"))
    c.max_num_seqs = static_cast<uint32_t>(v->as_uint_in(1, 1u << 20));
  if (auto v = root.find("max_num_batched_tokens"))
    c.max_num_batched_tokens = static_cast<uint32_t>(v->as_uint_in(1, 1u << 24));
  if (auto v = root.find("max_model_len"))
    c.max_model_len = static_cast<uint32_t>(v->as_uint_in(16, 1u << 24));
  if (auto v = root.find("kv_block_size"))
    c.kv_block_size = static_cast<uint32_t>(v->as_uint_in(1, 1u << 16));
  // `--seed N` sets seed for every experiment; this one draws nothing at random, so a seed is
  // accepted (a whole number) and changes nothing.
  if (auto v = root.find("seed")) (void)v->as_uint();
  if (auto v = root.find("context_tokens"))
    c.context_tokens = static_cast<uint32_t>(v->as_uint_in(1, 1u << 24));
  if (auto p = root.find("parallel")) {
    p->expect_keys(keys_at(tp_memory_config_keys(), "parallel"));
    if (auto v = p->find("custom_all_reduce")) c.comm.custom_all_reduce = v->as_bool();
    if (auto v = p->find("nccl_cumem")) c.comm.nccl_cumem = v->as_bool();
  }
  return c;
}

std::vector<KvBudgetInput> tp_memory_inputs(const TpMemoryConfig& c) {
  std::vector<KvBudgetInput> inputs;
  for (const ModelShape& m : c.models)
    for (const GpuSpec& g : c.gpus)
      for (uint32_t tp : c.tensor_parallel_sizes)
        for (uint32_t pp : c.pipeline_parallel_sizes)
          for (const std::string& graphs : c.graph_memory) {
            KvBudgetInput in;
            in.model = m;
            in.gpu = g;
            in.gpu_memory_utilization = c.gpu_memory_utilization;
            in.max_num_batched_tokens = c.max_num_batched_tokens;
            in.max_num_seqs = c.max_num_seqs;
            in.enforce_eager = graphs == "none";
            in.graph_strategy = in.enforce_eager ? "shared_pool" : graphs;
            in.max_model_len = c.max_model_len;
            in.kv_block_size = c.kv_block_size;
            in.parallel.tensor = tp;
            in.parallel.pipeline = pp;
            in.comm = c.comm;
            inputs.push_back(in);
          }
  return inputs;
}

std::string tp_memory_point_yaml(const TpMemoryConfig& c, size_t i) {
  const size_t per_pp = c.graph_memory.size();
  const size_t per_tp = per_pp * c.pipeline_parallel_sizes.size();
  const size_t per_gpu = per_tp * c.tensor_parallel_sizes.size();
  const size_t per_model = per_gpu * c.gpus.size();
  const size_t m = i / per_model, g = i % per_model / per_gpu;
  const size_t t = i % per_gpu / per_tp, pp = i % per_tp / per_pp, s = i % per_pp;
  return fmt::format(
      "experiment: {}\nmodels: [{}]\ngpus: [{}]\ntensor_parallel_sizes: [{}]\n"
      "pipeline_parallel_sizes: [{}]\n"
      "graph_memory: [{}]\ngpu_memory_utilization: {}\nmax_num_seqs: {}\n"
      "max_num_batched_tokens: {}\nmax_model_len: {}\nkv_block_size: {}\ncontext_tokens: {}\n"
      "parallel: {{custom_all_reduce: {}, nccl_cumem: {}}}\n",
      c.experiment, json(c.model_files[m]).dump(), json(c.gpu_files[g]).dump(),
      c.tensor_parallel_sizes[t], c.pipeline_parallel_sizes[pp], c.graph_memory[s],
      c.gpu_memory_utilization, c.max_num_seqs, c.max_num_batched_tokens, c.max_model_len,
      c.kv_block_size, c.context_tokens, c.comm.custom_all_reduce, c.comm.nccl_cumem);
}

TpMemoryResults run_tp_memory(const TpMemoryConfig& c) {
  TpMemoryResults out;
  const auto wall0 = std::chrono::steady_clock::now();
  const std::vector<KvBudgetInput> inputs = tp_memory_inputs(c);
  for (const KvBudgetInput& in : inputs) {
    TpMemoryPoint p;
    p.model = in.model.name;
    p.gpu = in.gpu.name;
    p.graph_memory = in.enforce_eager ? "none" : in.graph_strategy;
    p.tp = in.parallel.tensor;
    p.pp = in.parallel.pipeline;
    out.points.push_back(p);
  }
  const uint64_t blocks_per_seq =
      (uint64_t{c.context_tokens} + c.kv_block_size - 1) / c.kv_block_size;
  parallel_for(inputs.size(), 0, [&](size_t i) {
    TpMemoryPoint& p = out.points[i];
    Result<EngineKvBudget> b = compute_engine_kv_budget(inputs[i]);
    if (!b.ok()) {
      p.outcome = b.error().message;
      p.fits = false;
      return;
    }
    p.stages = std::move(b->stages);
    p.budget = p.stages.front();
    p.fits = true;
    p.outcome = "ok";
    p.kv_blocks_min = b->kv_blocks_min;  // vLLM's get_kv_cache_configs
    p.concurrency = p.kv_blocks_min / blocks_per_seq;
  });
  out.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return out;
}

std::string format_tp_memory_table(const TpMemoryConfig& c, const TpMemoryResults& r,
                                   bool explain) {
  const bool pipeline = any_pipeline(c);
  const std::span<const ColumnDoc> cols = tp_memory_columns(pipeline);
  std::string o = fmt::format(
      "Per-rank memory under tensor{} parallelism: gpu_memory_utilization {}, "
      "max_num_batched_tokens {}, max_num_seqs {}, context {} tokens, NCCL_CUMEM_ENABLE={}, "
      "custom all-reduce {} (ranks alike under TP: one simulated, standing for each{})\n",
      pipeline ? " and pipeline" : "", c.gpu_memory_utilization, c.max_num_batched_tokens,
      c.max_num_seqs, c.context_tokens, c.comm.nccl_cumem ? 1 : 0,
      c.comm.custom_all_reduce ? "on" : "off",
      pipeline ? "; one row per pipeline stage, seqs from the engine's blocks, the least over "
                 "its ranks"
               : "");
  o += header_row(cols);
  std::set<std::string> notes;  // NCCL figures extrapolated or approximated
  for (const TpMemoryPoint& p : r.points) {
    // The figures, or a dash each where the engine would not start (one row then).
    auto cell = [&](const std::string& v) { return p.fits ? v : std::string("-"); };
    const size_t rows = p.fits ? p.stages.size() : 1;
    for (size_t s = 0; s < rows; ++s) {
      const KvBudget& b = p.fits ? p.stages[s] : p.budget;
      std::vector<std::string> v = {p.model, p.gpu, std::to_string(p.tp)};
      if (pipeline) {
        v.push_back(std::to_string(p.pp));
        v.push_back(p.fits ? fmt::format("{} {}..{}", s, b.stage.first_layer,
                                         b.stage.first_layer + b.stage.layers - 1)
                           : "-");
      }
      for (std::string x :
           {p.graph_memory, cell(gib(b.weights)), cell(gib(b.activation_peak)),
            cell(gib(b.graph_memory)), cell(gib(b.comm.nccl())), cell(gib(b.comm.custom())),
            cell(gib(b.kv_bytes)), cell(gib(p.fits ? b.free_bytes() : 0)),
            cell(std::to_string(b.kv_tokens)), cell(std::to_string(p.concurrency)), p.outcome})
        v.push_back(std::move(x));
      o += data_row(cols, v);
      if (!p.fits) continue;
      if (!b.comm.nccl_note.empty()) notes.insert(b.comm.nccl_note);
      if (!b.comm.pp_note.empty()) notes.insert(b.comm.pp_note);
      if (!b.comm.nccl_by_rank.empty())
        notes.insert(fmt::format(
            "NCCL's memory at {} ranks on {} is measured rank by rank and differs: the NCCL and "
            "free columns give the rank with the most, ranks.csv each rank's",
            p.tp, p.gpu));
    }
  }
  for (const std::string& n : notes) o += "note: " + n + "\n";
  o += fmt::format("{} points in {:.2f} s wall\n", r.points.size(), r.wall_seconds);
  o += table_legend(cols, kAnchor, explain);
  return o;
}

std::span<const ColumnDoc> tp_memory_columns(bool pipeline) {
  static const std::vector<ColumnDoc> kTensorOnly = [] {
    std::vector<ColumnDoc> v;
    for (size_t k = 0; k < std::size(kColumns); ++k)
      if (std::find(std::begin(kPipelineColumns), std::end(kPipelineColumns), k) ==
          std::end(kPipelineColumns))
        v.push_back(kColumns[k]);
    return v;
  }();
  if (pipeline) return kColumns;
  return kTensorOnly;
}

namespace {

json per_rank_json(const KvBudget& b) {
  return {{"capacity", b.capacity},
          {"usable", b.usable},
          {"weights", b.weights},
          {"activation_peak", b.activation_peak},
          {"graph_memory", b.graph_memory},
          {"nccl", b.comm.nccl()},
          {"custom_all_reduce", b.comm.custom()},
          {"kv_cache", b.kv_bytes},
          {"free", b.free_bytes()},
          {"kv_bytes_per_token", b.kv_bytes_per_token},
          {"kv_tokens", b.kv_tokens},
          {"kv_blocks", b.kv_blocks}};
}

// The first stage shaped like stage s (the one simulated for it).
size_t simulated_stage(const TpMemoryPoint& p, size_t s) {
  size_t k = 0;
  while (!p.stages[k].stage.same_shape(p.stages[s].stage)) ++k;
  return k;
}

void write_ranks_csv(const TpMemoryResults& r, std::ostream& f) {
  f << "model,gpu,tensor_parallel_size,graph_memory,rank,simulated_as,weights,"
       "activation_peak,graph_memory_bytes,nccl,custom_all_reduce,kv_cache,free,kv_tokens,"
       "kv_blocks,concurrency,outcome,pipeline_parallel_size,stage,first_layer,layers,"
       "kv_allocated\n";
  for (const TpMemoryPoint& p : r.points) {
    const size_t stages = p.fits ? p.stages.size() : p.pp;
    for (size_t s = 0; s < stages; ++s) {
      const KvBudget& b = p.fits ? p.stages[s] : p.budget;
      const uint64_t allocated =
          p.fits ? p.kv_blocks_min * b.kv_block_size * b.kv_bytes_per_token : 0;
      const size_t as = p.fits ? simulated_stage(p, s) * p.tp : 0;
      for (uint32_t t = 0; t < p.tp; ++t)
        f << fmt::format(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
            csv_cell(p.model), csv_cell(p.gpu), p.tp, csv_cell(p.graph_memory), s * p.tp + t, as,
            b.weights, b.activation_peak, b.graph_memory, b.comm.nccl_of(t), b.comm.custom(),
            b.kv_bytes, p.fits ? b.free_bytes_of(t) : 0, b.kv_tokens, b.kv_blocks, p.concurrency,
            csv_cell(p.outcome), p.pp, s, b.stage.first_layer, b.stage.layers, allocated);
    }
  }
}

}  // namespace

void write_tp_memory_outputs(const TpMemoryConfig& c, const TpMemoryResults& r, OutputDir& dir) {
  dir.write("ranks.csv", [&](std::ostream& f) { write_ranks_csv(r, f); });
  json s;
  s["experiment"] = c.experiment;
  s["source"] = c.source;
  s["gpu_memory_utilization"] = c.gpu_memory_utilization;
  s["max_num_batched_tokens"] = c.max_num_batched_tokens;
  s["max_num_seqs"] = c.max_num_seqs;
  s["context_tokens"] = c.context_tokens;
  s["nccl_cumem"] = c.comm.nccl_cumem;
  s["custom_all_reduce"] = c.comm.custom_all_reduce;
  json points = json::array();
  for (const TpMemoryPoint& p : r.points) {
    const KvBudget& b = p.budget;
    json j;
    j["model"] = p.model;
    j["gpu"] = p.gpu;
    j["tensor_parallel_size"] = p.tp;
    j["pipeline_parallel_size"] = p.pp;
    j["graph_memory"] = p.graph_memory;
    j["outcome"] = p.outcome;
    // Ranks alike under TP: one per distinct stage simulated; ranks.csv repeats it for each.
    size_t simulated = 0;
    for (size_t k = 0; k < p.stages.size(); ++k) simulated += simulated_stage(p, k) == k;
    j["ranks_simulated"] = p.fits ? simulated : 1;
    if (p.fits) {
      if (p.pp == 1) {
        j["per_rank"] = per_rank_json(b);
      } else {
        json stages = json::array();
        for (const KvBudget& st : p.stages) {
          json one = {{"stage", st.stage.index},
                      {"first_layer", st.stage.first_layer},
                      {"layers", st.stage.layers},
                      {"per_rank", per_rank_json(st)},
                      {"kv_allocated", p.kv_blocks_min * st.kv_block_size * st.kv_bytes_per_token}};
          stages.push_back(one);
        }
        j["stages"] = stages;
        if (!b.comm.pp_note.empty()) j["pp_nccl_note"] = b.comm.pp_note;
      }
      j["kv_blocks_min_over_ranks"] = p.kv_blocks_min;
      if (!b.comm.nccl_note.empty()) j["nccl_note"] = b.comm.nccl_note;
      j["concurrency"] = p.concurrency;
    }
    points.push_back(j);
  }
  s["points"] = points;
  dir.write("summary.json", s.dump(2) + "\n");
}

}  // namespace memsim
