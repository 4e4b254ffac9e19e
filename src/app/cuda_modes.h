// What `--backend cuda` adds to each experiment and subcommand, behind one set of functions:
// src/app/cuda_modes.cpp implements them on the GPU in a build with the CUDA backend, and
// src/app/no_cuda.cpp in one without (each then says the build has no CUDA backend).
#pragma once

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "backends/result.h"
#include "backends/sim/cost_model.h"
#include "src/alloc/registry.h"
#include "src/app/calibrate.h"
#include "src/app/calibrate_model.h"
#include "src/app/output.h"
#include "src/app/shapes_experiment.h"
#include "src/app/tp_memory_experiment.h"
#include "src/rl/rl_timeline.h"
#include "src/serve/serving_experiment.h"
#include "workload/alloc_trace.h"

namespace memsim {

// Whether this build has the CUDA backend (nvcc was found when it was configured).
bool cuda_backend_built();
// Empty when a CUDA device can be used; else why not ("no NVIDIA GPU was found (...)", ...).
std::string cuda_device_problem();
// Empty when device 0 is the GPU `gpu` describes (its name appears in the device's, e.g. h100 in
// "NVIDIA H100 80GB HBM3"); else what the device is and which GPU file to run with instead.
// Capacities, costs and step profiles are a GPU's own: the wrong file fails or mismeasures.
std::string cuda_gpu_mismatch(const GpuSpec& gpu);

// Serving: hooks that run every run's KV pool and attention on the GPU (before the runs), then
// the measured figures against the simulation (after them): validation.csv and, for runs that
// time the model step, sim_vs_measured.csv and steps.csv. The exit code: 0 when every check
// passed.
// With `rank` >= 0 (a tensor-parallel rank process, nccl_id from its launcher): every run on GPU
// `rank`, the model step sharded over NCCL, and the engines' measured clocks agreed over the
// ranks at each step (the largest rank's step time) so that every rank schedules alike.
Result<ServingRunHooks> cuda_serving_hooks_for(const ServingConfig& config, int rank = -1,
                                               const std::string& nccl_id = "");
// Tensor parallelism: this command started once per rank (memsim's own argument vector with
// --rank and --nccl-id added), NVLink multicast off; each rank's output follows. 0 when every
// rank exited 0, 2 when there are fewer than `ranks` GPUs or no NCCL, else 1.
int cuda_launch_ranks(uint32_t ranks, bool nccl_cumem, std::ostream& out);
// Ends this process's CUDA context on device 0 (cudaDeviceReset), which the device probe left:
// processes started next get the whole GPU.
void cuda_release_device();
int cuda_serving_report(const ServingConfig& config, const ServingResults& results, OutputDir& dir,
                        std::ostream& out);

// Shapes: the table slice captured again on the GPU, simulated against measured bytes and time
// (validation.csv, calls.csv).
int cuda_shapes_validation(const ShapesConfig& config, const ShapesResults& simulated,
                           OutputDir& dir, std::ostream& out);

// RL co-location: each co-located run's timeline with real memory (cuda_rl.csv).
int cuda_rl_run(const RlConfig& config, OutputDir& dir, std::ostream& out, std::ostream& err);

// tp_memory: every point that fits with 1 < tensor_parallel_size <= the GPUs here, on the GPU its
// file names: one memsim process per rank (NCCL, a custom all-reduce's buffers, the graph
// captures), each rank against the simulated one (tp_validation.csv). 0 when every check passed.
int cuda_tp_memory(const TpMemoryConfig& config, const TpMemoryResults& simulated, OutputDir& dir,
                   std::ostream& out);
// memsim tp-rank (started by cuda_tp_memory, one per rank): the single point of `config_path`
// on this process's GPU as rank `rank`, its measurements written to `result_path` as JSON.
int cuda_tp_rank(const std::string& config_path, int rank, const std::string& nccl_id_hex,
                 const std::string& result_path, std::ostream& err);

// memsim replay --backend cuda: the allocators on the GPU against cudaMemGetInfo.
int cuda_replay(const AllocTrace& trace,
                const std::vector<std::pair<std::string, AllocatorFactory>>& allocators,
                const GpuSpec& gpu, OutputDir& dir, std::ostream& out, std::ostream& err);

// memsim calibrate --backend cuda: the primitives' costs, or (--model) a model's step profile.
int cuda_calibrate(const CalibrateOptions& options, std::ostream& out, std::ostream& err);
int cuda_calibrate_model(const CalibrateModelOptions& options, std::ostream& out,
                         std::ostream& err);

}  // namespace memsim
