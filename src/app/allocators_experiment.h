// The allocators experiment (experiments/allocators.yaml): every caching allocator over
// generated serving-like forward programs and recorded PyTorch snapshots.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "src/config/config_keys.h"
#include "src/config/config_node.h"

#include "backends/sim/cost_model.h"
#include "src/alloc/registry.h"
#include "src/app/output.h"
#include "workload/alloc_trace.h"
#include "workload/model_shape.h"

namespace memsim {

// A serving-like sequence of forward passes: per step a decode batch (a random walk), sometimes
// a prefill chunk on top, and a context; each step runs the executor's allocation program for
// its token count. Async scheduling keeps a step's input metadata alive until the next step
// ends, so lifetimes of different sizes overlap the way they fragment caching allocators.
struct GeneratedServing {
  uint32_t steps = 300;
  uint32_t max_batch = 256;
  uint32_t prefill_chunk = 2048;  // largest prefill chunk added to a step
  double prefill_probability = 0.3;
  uint32_t max_context = 16384;
};

struct AllocWorkload {
  std::string label;
  bool snapshot = false;  // else generated
  std::string path;       // snapshot file (resolved)
  GeneratedServing serving;
};

struct AllocatorSpec {
  std::string label;
  std::string impl;
  std::string yaml;  // resolved keys
  AllocatorFactory factory;
};

struct AllocatorsConfig {
  std::string source;
  std::string experiment = "allocators";
  GpuSpec gpu;
  ModelShape model;
  std::vector<AllocWorkload> workloads;
  std::vector<AllocatorSpec> allocators;
  uint64_t seed = 1;
  bool min_capacity = true;
};

// The maps of an allocators config and the keys each accepts (docs/config.md lists them).
const ConfigKeys& allocators_config_keys();

bool is_allocators_config(const std::string& path);
bool is_allocators_config(const ConfigNode& root);
// Throws ConfigError with file, line and key.
AllocatorsConfig load_allocators_config(const std::string& path,
                                        const std::vector<std::string>& overrides);
// The same from a loaded tree whose overrides are applied (paths resolve from its base_dir()).
AllocatorsConfig load_allocators_config(const ConfigNode& root);

// The trace of a generated serving workload.
AllocTrace generate_serving_trace(const ModelShape& model, const GeneratedServing& g, uint64_t seed,
                                  const std::string& label);

// Runs, prints the table, writes DIR/{summary.json,timeseries.csv,allocators.png}.
// Returns the exit code (0; 1 when a replay failed other than by running out of memory; 2 for
// a bad snapshot).
// The outputs go to `dir`'s staging folder (the caller commits it); OutputError escapes.
int run_allocators_experiment(const AllocatorsConfig& c, OutputDir& dir, std::ostream& out,
                              std::ostream& err, bool explain = false);

}  // namespace memsim
