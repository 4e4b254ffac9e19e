// Loaders from YAML into the engine's typed structs: GPU specs and model shapes.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "backends/sim/cost_model.h"
#include "src/config/config_keys.h"
#include "src/config/config_node.h"
#include "workload/collectives.h"
#include "workload/model_shape.h"
#include "workload/tensor_parallel.h"

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
// The maps of a GPU file and of a model file and the keys each accepts (docs/config.md lists
// them). A GPU file's `costs:` takes one key per Backend primitive, each a cost term.
const ConfigKeys& gpu_file_keys();
const ConfigKeys& model_file_keys();
// The compute: section of a GPU file for `c`, as load_gpu_spec reads it back (for writers of GPU
// files such as `memsim calibrate`, which measures no compute figures and carries them over).
std::string format_compute_yaml(const ComputeSpec& c);
ModelShape load_model_shape(const ConfigNode& node);

// An experiment's `parallel:` map (how the model is spread over the GPUs of one node):
//   parallel:
//     tensor_parallel_size: 2      # ranks sharding every layer (vLLM's rules, tensor_parallel.h)
//     pipeline_parallel_size: 1    # stages splitting the layers (vLLM's get_pp_indices)
//     data_parallel_size: 1        # engine replicas
//     custom_all_reduce: true      # vLLM's custom all-reduce (not disable_custom_all_reduce)
//     nccl_cumem: false            # NCCL_CUMEM_ENABLE; vLLM sets 0
struct ParallelSettings {
  ParallelConfig sizes;
  CommOptions comm;
};
const std::vector<std::string>& parallel_keys();
// Checks the sizes against `model` (heads, KV heads, MLP and vocabulary must split: an error
// names tensor_parallel_size and the field; no more stages than layers) and `gpu` (tensor x
// pipeline x data ranks within its node, the error naming the last of those keys given; an
// interconnect section when more than one GPU).
ParallelSettings load_parallel(const ConfigNode& node, const ModelShape& model, const GpuSpec& gpu);
// One tensor_parallel_size against `model` and `gpu`, failing at `at` (tp_memory's lists).
void check_tensor_parallel(const ConfigNode& at, uint32_t tp, const ModelShape& model,
                           const GpuSpec& gpu);
// One pipeline_parallel_size against `model` (a stage per layer at most) and the node of `gpu`
// (tp x pp ranks), failing at `at`.
void check_pipeline_parallel(const ConfigNode& at, uint32_t tp, uint32_t pp,
                             const ModelShape& model, const GpuSpec& gpu);

// The first of `candidates` that is a regular file, or nullopt. Never throws: a path the OS
// refuses (a name too long, no permission) counts as not found, and the first such refusal's
// reason (not "does not exist") goes to `os_reason`, for the caller's error message.
std::optional<std::filesystem::path> first_regular_file(
    const std::vector<std::filesystem::path>& candidates, std::string* os_reason);

// The folders that hold this installation's configs/, data/ and tools/, in order: $MEMSIM_ROOT
// when set, the source tree of the running binary (build/memsim -> the tree), and the installed
// <prefix>/share/memsim/ (bin/memsim -> ../share/memsim).
std::vector<std::filesystem::path> installation_roots();

// The one rule for every file a config names (gpu:, model:, request traces, snapshots). A bare
// name of `kind` (no '/', no .yaml) means configs/<kind>/<name>.yaml; any other relative path is
// taken as written. Each is looked for beside the config file (at.base_dir()), then in its
// project (the folder above: experiments/ sits beside configs/ and data/), then in the
// installation (installation_roots()), then in the current folder; an absolute path as it is.
// So a config copied anywhere runs from any folder. Fails at `at` naming where it looked, and
// for an unknown name the known ones.
std::string resolve_config_path(const ConfigNode& at, const std::string& ref,
                                const std::string& kind);
// The candidate paths of `rel` (a relative path) in the order above.
std::vector<std::filesystem::path> reference_candidates(const ConfigNode& at,
                                                        const std::filesystem::path& rel);
// The folders a bare name of `kind` is looked up in: configs/<kind>/ in the order above.
std::vector<std::filesystem::path> config_dirs(const ConfigNode& at, const std::string& kind);

}  // namespace memsim
