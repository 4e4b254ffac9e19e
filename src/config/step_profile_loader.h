// Step-time profile files (configs/gpus/<gpu>.profiles/<model>.yaml): reading with located
// errors, writing, and where a GPU's profile of a model lives.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "src/config/config_keys.h"
#include "src/config/config_node.h"
#include "workload/step_profile.h"

namespace memsim {

// Errors name the file, line and key (ConfigError), as every loader's do.
StepProfile load_step_profile(const ConfigNode& node);
// The maps of a step-time profile file and the keys each accepts (docs/config.md lists them).
const ConfigKeys& step_profile_keys();
// The YAML load_step_profile reads back; `header` lines become comments at the top.
std::string format_step_profile(const StepProfile& p, const std::vector<std::string>& header);
// <model>.yaml, <model>.graphs.yaml for the profile whose decode steps were replayed as CUDA
// graphs (calibrate --graphs); <model>.tp<N>[.graphs].yaml for one rank of N under tensor
// parallelism (calibrate --tensor-parallel N); <model>[.tp<N>].fp8[.graphs].yaml (or .fp8_e5m2)
// for steps over an fp8 KV cache (calibrate --kv-cache-dtype).
std::string step_profile_file(const std::string& model, bool graphs = false,
                              uint32_t tensor_parallel = 1,
                              std::optional<DType> kv_cache_dtype = std::nullopt);
// <directory of gpu_file>/<gpu_file's stem>.profiles/<step_profile_file>.
std::string step_profile_path(const std::string& gpu_file, const std::string& model,
                              bool graphs = false, uint32_t tensor_parallel = 1,
                              std::optional<DType> kv_cache_dtype = std::nullopt);

// Where the profile of `model` on the GPU named `gpu_name` (read from `gpu_file`) is: beside the
// GPU file (step_profile_path), else in <name>.profiles/ of the folders a bare `gpu:` name is
// looked up in (config_dirs of `at`, the gpu: key), so that a copy of configs/gpus/h200.yaml
// elsewhere keeps h200's profiles. `path` is empty when there is none; `note` says where it
// was found and why there, or where it looked.
struct ProfileLocation {
  std::string path;
  std::string note;
};
ProfileLocation find_step_profile(const ConfigNode& at, const std::string& gpu_file,
                                  const std::string& gpu_name, const std::string& model,
                                  bool graphs = false, uint32_t tensor_parallel = 1,
                                  std::optional<DType> kv_cache_dtype = std::nullopt);

}  // namespace memsim
