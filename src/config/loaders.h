// Loaders from YAML into the engine's typed structs: GPU specs and model shapes.
#pragma once

#include <string>

#include "backends/sim/cost_model.h"
#include "sim/workload/model_shape.h"
#include "src/config/config_node.h"

namespace memsim {

GpuSpec load_gpu_spec(const ConfigNode& node);
ModelShape load_model_shape(const ConfigNode& node);

// Resolves a config reference: a path relative to `base_file`'s folder, to the current folder,
// or a bare name looked up as configs/<kind>/<name>.yaml under the source tree (MEMSIM_ROOT env
// or the folder holding `base_file`'s experiments/ parent). Fails at `at` when nothing exists.
std::string resolve_config_path(const ConfigNode& at, const std::string& ref,
                                const std::string& kind);

}  // namespace memsim
