// The experiment table: each kind of experiment YAML (shapes, serving, allocators, RL) with how
// it is recognised, validated and run, in simulation and with --backend cuda. `memsim` and
// `memsim sweep` dispatch through it; nothing else tells the kinds apart.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "src/config/config_node.h"

namespace memsim {

// What a run of one experiment needs besides its config.
struct RunContext {
  std::string out_dir = "results";  // results go to OUT_DIR/<experiment>/
  bool cuda = false;                // --backend cuda: the experiment's GPU mode too
  bool explain = false;             // --explain: each table's legend after it (else a footer)
  // A rank process of a tensor-parallel --backend cuda run (set by its launcher): its rank and
  // the NCCL unique id (hex). -1: not a rank.
  int rank = -1;
  std::string nccl_id;
  // --process-per-run (serving): auto, on or off (serving_processes.h).
  std::string process_per_run = "auto";
  // A process running one serving run (set by its launcher: --serving-run, --serving-result,
  // --serving-digest): the run's index in the config, the file its outcome goes to, and the
  // digest of the inputs the launcher read. -1: not one.
  int serving_run = -1;
  std::string serving_result;
  std::string serving_digest;  // the launcher's serving_inputs_digest (serving_processes.h)
};

struct ExperimentKind {
  std::string_view name;
  // By the config's top-level keys.
  bool (*matches)(const ConfigNode& root);
  // The kind's typed loader (every check a run makes before it starts); returns the name of the
  // results folder. Throws ConfigError.
  std::string (*validate)(const ConfigNode& root);
  // Runs it (simulation, then the GPU mode when ctx.cuda), prints its tables, writes and
  // commits its outputs; returns the exit code. Throws ConfigError (2) and OutputError (1).
  int (*run)(const ConfigNode& root, const RunContext& ctx);
};

// Allocators (workloads:), RL (train: and rollout:), serving (requests: or runs:), and shapes,
// which takes every other config (its loader names what is missing).
const std::vector<ExperimentKind>& experiment_kinds();
const ExperimentKind& experiment_kind(const ConfigNode& root);

// The YAML at `path` with the `unsets` (--unset KEY) removed, then the `overrides` (--set
// key=value) applied; relative paths in it resolve from `base_dir` (empty: the file's folder).
// Throws ConfigError.
ConfigNode load_experiment_root(const std::string& path, const std::vector<std::string>& overrides,
                                const std::string& base_dir = "",
                                const std::vector<std::string>& unsets = {});

// experiment_kind(root).validate(root).
std::string validate_experiment(const ConfigNode& root);

}  // namespace memsim
