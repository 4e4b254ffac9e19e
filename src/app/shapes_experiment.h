// The shapes experiment (experiments/shapes.yaml): typed config, loading with validation, the
// sweep over strategies x variants, and its results.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/sim/cost_model.h"
#include "kernels/attention_types.h"
#include "src/config/config_keys.h"
#include "src/config/config_node.h"
#include "src/drivers/capture_runner.h"
#include "src/graph/registry.h"

namespace memsim {

struct StrategySpec {
  std::string label;  // unique in the experiment, e.g. "shared_pool/large_first"
  std::string impl;
  CaptureOrder order = CaptureOrder::kArrival;
  std::vector<uint32_t> order_list;
  GraphStrategyFactory factory;
  GraphTraits traits;  // the registry entry's
};

// One point of the sweep: the options every strategy is run with.
struct Variant {
  OutputLifetime outputs = OutputLifetime::kStrong;
  Arrival arrival = Arrival::kFixed;
  GraphRunners graphs = GraphRunners::kFull;
  InputBuffers inputs = InputBuffers::kPersistent;
  std::string name() const;  // "weak/fixed/full/persistent"
  bool operator==(const Variant&) const = default;
};

struct ShapesConfig {
  std::string source;  // the YAML file
  std::string experiment = "shapes";
  GpuSpec gpu;
  ModelShape model;
  std::vector<uint32_t> capture_sizes;
  uint32_t max_num_seqs = 0;
  uint64_t gemm_workspace_bytes = 0;
  uint32_t max_model_len = 8192;
  uint32_t kv_block_size = 16;
  uint64_t seed = 1;
  // graph_body: what each graph's body is. fill: the generated program of the model
  // (make_decode_program: vLLM's forward), one fill kernel per tensor. executor: memsim's model
  // executor's decode step (make_executor_decode_program); with --backend cuda the GPU captures
  // the real step (src/exec/model_step.h) into each strategy. Full graphs only; the executor's
  // GEMM workspace is its own, so gemm_workspace does not apply.
  bool executor_body = false;
  // input_set: the input buffers the runner keeps (CaptureRunConfig::input_set): the program's
  // (vLLM's runner for the generated program), or xLLM's CudaGraphPersistentParam.
  InputSet input_set = InputSet::kProgram;
  // program: {source: snapshot, files: {BATCH: FILE, ...} | pattern: "dir/b{batch}.pickle"}:
  // each capture size's graph body is a PyTorch snapshot recorded around that capture
  // (shape_program_from_trace) instead of the generated decode program. Resolved paths.
  std::map<uint32_t, std::string> snapshot_files;
  std::shared_ptr<const std::map<uint32_t, ShapeProgram>> snapshot_programs;
  bool export_snapshots = false;  // write OUT/shapes/snapshots/<strategy>.pickle (table slice)
  uint32_t executor_context = 0;  // contexts the executor's graphs serve (graph_context_for)
  DynamicArrival dynamic;
  std::vector<Variant> variants;     // the sweep (cartesian product of the listed axes)
  Variant table;                     // the slice printed as the default table
  uint32_t validation_rounds = 200;  // --backend cuda: replay rounds per strategy
  bool timeseries_all = false;       // timeseries.csv: every variant (all) or the table slice
  std::vector<StrategySpec> strategies;
};

// The maps of a shapes config and the keys each accepts (docs/config.md lists them).
const ConfigKeys& shapes_config_keys();

// Loads and validates; throws ConfigError naming file, line and key. `overrides` are --set
// assignments applied before validation.
ShapesConfig load_shapes_config(const std::string& path, const std::vector<std::string>& overrides);
// The same from a loaded tree whose overrides are applied (paths resolve from its base_dir()).
ShapesConfig load_shapes_config(const ConfigNode& root);

struct RunRecord {
  const StrategySpec* strategy = nullptr;
  Variant variant;
  CaptureRunResult result;
  uint64_t reference_max = 0;  // max(shape) of this variant (standalone, fresh private pool)
  uint64_t reference_sum = 0;
  uint64_t own_max = 0;  // max(shape) captured alone with this strategy
};

struct StandaloneRef {
  std::vector<std::pair<uint32_t, uint64_t>> per_shape;  // batch -> footprint
  uint64_t max = 0;
  uint64_t sum = 0;
};

struct TimeseriesRow {
  SimTime time;
  uint32_t run;  // index into ShapesResults::runs
  std::string metric;
  double value;
};

struct ShapesResults {
  std::vector<RunRecord> runs;
  std::vector<std::pair<Variant, StandaloneRef>> references;
  std::vector<TimeseriesRow> timeseries;
  double wall_seconds = 0;
  // export_snapshots: each strategy's allocator timeline in the table slice, as a PyTorch
  // snapshot pickle (label, bytes); strategies without a caching allocator are left out.
  std::vector<std::pair<std::string, std::string>> snapshots;
  // What the exports cannot show: a strategy with no allocator timeline, or one whose segments
  // share physical pages (memory_viz's reserved then overstates the device's memory).
  std::vector<std::string> snapshot_notes;
};

ShapesResults run_shapes(const ShapesConfig& config);

// The attention shape of the model's layers (the executor's kernels).
kernels::AttentionShape executor_attention_shape(const ModelShape& m);

// The capture-runner settings of one variant of the experiment (fixed order; the strategy's
// order is set by the caller). `cache` may be null.
CaptureRunConfig run_config(const ShapesConfig& config, const Variant& variant,
                            ProgramCache* cache);

}  // namespace memsim
