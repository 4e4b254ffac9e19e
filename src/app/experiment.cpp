// Experiment kinds: detection by top-level keys, and validation with each kind's typed loader.
#include "src/app/experiment.h"

#include "src/app/allocators_experiment.h"
#include "src/app/rl_experiment.h"
#include "src/app/shapes_experiment.h"
#include "src/serve/serving_experiment.h"

namespace memsim {

ExperimentKind experiment_kind(const ConfigNode& root) {
  if (is_allocators_config(root)) return ExperimentKind::kAllocators;
  if (is_rl_config(root)) return ExperimentKind::kRl;
  if (is_serving_config(root)) return ExperimentKind::kServing;
  return ExperimentKind::kShapes;
}

ConfigNode load_experiment_root(const std::string& path, const std::vector<std::string>& overrides,
                                const std::string& base_dir) {
  ConfigNode root = ConfigNode::load_file(path, base_dir);
  for (const std::string& o : overrides) root.apply_override(o);
  return root;
}

std::string validate_experiment(const ConfigNode& root) {
  switch (experiment_kind(root)) {
    case ExperimentKind::kAllocators:
      return load_allocators_config(root).experiment;
    case ExperimentKind::kRl:
      return load_rl_config(root).experiment;
    case ExperimentKind::kServing:
      return load_serving_config(root).experiment;
    case ExperimentKind::kShapes:
      break;
  }
  return load_shapes_config(root).experiment;
}

}  // namespace memsim
