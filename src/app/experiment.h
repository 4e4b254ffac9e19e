// The experiment kinds and their loading: the one place the app tells shapes, serving,
// allocators and RL configs apart.
#pragma once

#include <string>
#include <vector>

#include "src/config/config_node.h"

namespace memsim {

enum class ExperimentKind { kShapes, kServing, kAllocators, kRl };

// By the config's top-level keys: workloads (allocators), train + rollout (RL), requests or
// runs (serving), else shapes.
ExperimentKind experiment_kind(const ConfigNode& root);

// The YAML at `path` with `overrides` (--set key=value) applied; relative paths in it resolve
// from `base_dir` (empty: the file's folder). Throws ConfigError.
ConfigNode load_experiment_root(const std::string& path, const std::vector<std::string>& overrides,
                                const std::string& base_dir = "");

// Loads `root` with its kind's typed loader (every check a run makes before it starts) and
// returns the experiment's name, its results folder. Throws ConfigError.
std::string validate_experiment(const ConfigNode& root);

}  // namespace memsim
