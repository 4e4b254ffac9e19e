// The tp_memory experiment (experiments/tp_memory.yaml, pp_memory.yaml): each rank's memory under
// tensor and pipeline parallelism, for every model x GPU x tensor_parallel_size x
// pipeline_parallel_size x graph strategy, sized as vLLM sizes it: weights, activation peak,
// graph memory, NCCL, custom all-reduce, KV cache, free.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <span>
#include <string>
#include <vector>

#include "backends/sim/cost_model.h"
#include "src/app/legend.h"
#include "src/app/output.h"
#include "src/config/config_keys.h"
#include "src/config/config_node.h"
#include "src/serve/kv_budget.h"
#include "workload/collectives.h"
#include "workload/model_shape.h"

namespace memsim {

struct TpMemoryConfig {
  std::string source;
  std::string experiment = "tp_memory";
  std::vector<ModelShape> models;
  std::vector<GpuSpec> gpus;
  std::vector<std::string> model_files, gpu_files;  // where each was read (for rank processes)
  std::vector<uint32_t> tensor_parallel_sizes;
  std::vector<uint32_t> pipeline_parallel_sizes = {1};
  std::vector<std::string> graph_memory;  // graph strategies; "none" = enforce_eager
  double gpu_memory_utilization = 0.9;
  uint32_t max_num_seqs = 256;
  uint32_t max_num_batched_tokens = 8192;
  uint32_t max_model_len = 8192;
  uint32_t kv_block_size = 16;
  uint32_t context_tokens = 8192;  // concurrency: sequences of this many tokens the KV holds
  CommOptions comm;
};

const ConfigKeys& tp_memory_config_keys();
bool is_tp_memory_config(const ConfigNode& root);
// Throws ConfigError naming file, line and key; a tensor_parallel_size or pipeline_parallel_size
// that a model or GPU cannot take (tp x pp beyond the node's GPUs included) is an error naming
// both.
TpMemoryConfig load_tp_memory_config(const ConfigNode& root);

// One point: a model on a GPU at one tensor_parallel_size and pipeline_parallel_size with one
// graph strategy.
struct TpMemoryPoint {
  std::string model, gpu, graph_memory;
  uint32_t tp = 1;
  uint32_t pp = 1;
  bool fits = false;
  std::string outcome;           // "ok", or why the engine would not start (vLLM's error)
  KvBudget budget;               // stage 0's rank (ranks of a stage alike under TP: simulated once)
  std::vector<KvBudget> stages;  // every stage's rank (stages.front() is `budget`)
  uint64_t kv_blocks_min = 0;    // the engine's blocks: the minimum over ranks
  uint64_t concurrency = 0;      // sequences of context_tokens the engine holds at once
};

struct TpMemoryResults {
  std::vector<TpMemoryPoint> points;
  double wall_seconds = 0;
};

TpMemoryResults run_tp_memory(const TpMemoryConfig& config);
// The inputs of every point, in TpMemoryResults::points' order.
std::vector<KvBudgetInput> tp_memory_inputs(const TpMemoryConfig& config);
// A tp_memory config of the single point `i` (files by absolute path), as YAML text: what each
// rank process of --backend cuda loads.
std::string tp_memory_point_yaml(const TpMemoryConfig& config, size_t i);
std::string format_tp_memory_table(const TpMemoryConfig& config, const TpMemoryResults& results,
                                   bool explain);
// The table's columns (docs/tables.md#tp-memory); with `pipeline` (some pipeline_parallel_size
// above 1) the PP and stage columns too.
std::span<const ColumnDoc> tp_memory_columns(bool pipeline = false);
inline constexpr std::string_view kTpMemoryAnchor = "tp-memory";
// summary.json and ranks.csv (one row per rank of every point: stage x tensor-parallel rank).
void write_tp_memory_outputs(const TpMemoryConfig& config, const TpMemoryResults& results,
                             OutputDir& dir);

}  // namespace memsim
