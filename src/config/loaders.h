// Loaders from YAML into the engine's typed structs: GPU specs and model shapes.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "backends/sim/cost_model.h"
#include "sim/workload/model_shape.h"
#include "src/config/config_node.h"

namespace memsim {

// A GPU file. Its required `compute:` section (ComputeSpec) reads
//   compute:
//     dense_tflops: 989.4        # dense fp16/bf16 tensor-core peak, 10^12 FLOP/s (required)
//     hbm_gbps: 4800             # device-memory bandwidth, 10^9 B/s (required)
//     pcie_gbps: 55              # achievable pinned host<->device bandwidth, 10^9 B/s (required)
//     flops_efficiency: 0.6      # optional, default 0.6
//     bandwidth_efficiency: 0.8  # optional, default 0.8
//     step_overhead_us: 50       # optional, default 50
// Why the defaults: large bf16 GEMMs on Hopper sustain ~60-70% of the dense peak and whole
// prefill steps (attention, norms, GEMM tails) less, so 0.6; bandwidth-bound decode GEMVs and
// paged attention stream ~80% of HBM peak (STREAM-like copies reach ~85-90%), so 0.8; vLLM V1
// with CUDA graphs spends tens of microseconds per step outside the GPU's critical path
// (scheduling, input preparation, graph launch, sampling), so 50 us. They are estimates, not
// calibrations: set them per GPU when measurements exist.
GpuSpec load_gpu_spec(const ConfigNode& node);
// The compute: section of a GPU file for `c`, as load_gpu_spec reads it back (for writers of GPU
// files such as `memsim calibrate`, which measures no compute figures and carries them over).
std::string format_compute_yaml(const ComputeSpec& c);
ModelShape load_model_shape(const ConfigNode& node);

// The first of `candidates` that is a regular file, or nullopt. Never throws: a path the OS
// refuses (a name too long, no permission) counts as not found, and the first such refusal's
// reason (not "does not exist") goes to `os_reason`, for the caller's error message.
std::optional<std::filesystem::path> first_regular_file(
    const std::vector<std::filesystem::path>& candidates, std::string* os_reason);

// Resolves a config reference: a path relative to `base_file`'s folder, to the current folder,
// or a bare name looked up as configs/<kind>/<name>.yaml under the source tree (MEMSIM_ROOT env
// or the folder holding `base_file`'s experiments/ parent). Fails at `at` when nothing exists.
std::string resolve_config_path(const ConfigNode& at, const std::string& ref,
                                const std::string& kind);
// The folders a bare name of `kind` is looked up in (configs/<kind>/ under MEMSIM_ROOT, beside
// `at`'s experiments/ folder, under `at`'s folder, under the current folder), in that order.
std::vector<std::filesystem::path> config_dirs(const ConfigNode& at, const std::string& kind);

}  // namespace memsim
