// `--backend cuda` on the GPU: each experiment's and subcommand's CUDA mode, calling the
// CUDA-only sources (cuda_serving, cuda_validation, rl_cuda, replay_cuda, calibrate).
#include "src/app/cuda_modes.h"
#include "src/app/rank_launch.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <optional>

#include "src/app/cuda_serving.h"
#include "src/app/cuda_validation.h"
#include "src/app/replay_cuda.h"
#include "src/app/rl_cuda.h"
#include "src/config/loaders.h"

namespace memsim {

bool cuda_backend_built() {
  return true;
}

std::string cuda_device_problem() {
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0)
    return fmt::format("no NVIDIA GPU was found (CUDA: {})",
                       e != cudaSuccess ? cudaGetErrorString(e) : "no device");
  const Status s = probe_cuda_device();
  return s.ok() ? std::string() : s.error().message;
}

std::string cuda_gpu_mismatch(const GpuSpec& gpu) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return {};
  const auto lower = [](std::string t) {
    for (char& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return t;
  };
  const std::string device = lower(prop.name);
  if (device.find(lower(gpu.name)) != std::string::npos) return {};
  // The GPU files whose name the device's contains: the one(s) to run with.
  std::vector<std::string> fits;
  for (const auto& dir : installation_roots()) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir / "configs" / "gpus", ec))
      if (e.path().extension() == ".yaml" &&
          device.find(lower(e.path().stem().string())) != std::string::npos)
        fits.push_back(e.path().stem().string());
    if (!fits.empty()) break;
  }
  return fmt::format(
      "this GPU is an {}, but the config's gpu: is {} (its capacity, costs and step profiles are "
      "that GPU's); {}",
      prop.name, gpu.name,
      fits.empty() ? std::string("write a GPU file for it (docs/gpus.md) and pass --set gpu=FILE")
                   : fmt::format("run with --set gpu={}", fits.front()));
}

Result<ServingRunHooks> cuda_serving_hooks_for(const ServingConfig& config, int rank,
                                               const std::string& nccl_id) {
  return cuda_serving_hooks(config, rank, nccl_id);
}

int cuda_launch_ranks(uint32_t ranks, bool nccl_cumem, std::ostream& out) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < static_cast<int>(ranks)) {
    out << fmt::format("memsim: --backend cuda: tensor_parallel_size {} needs {} GPUs, {} here\n",
                       ranks, ranks, devices);
    return 2;
  }
  cuda_release_device();  // the ranks' run needs no context here
  return run_rank_processes(own_command_line(), ranks, nccl_cumem, 3600, out);
}

void cuda_release_device() {
  (void)cudaDeviceReset();
}

int cuda_serving_report(const ServingConfig& config, const ServingResults& results, OutputDir& dir,
                        std::ostream& out) {
  // Runs that time the whole model step are compared with the sim backend's prediction.
  const bool timed = std::any_of(config.runs.begin(), config.runs.end(),
                                 [](const ServingRunSpec& r) { return r.gpu_step == "model"; });
  std::optional<ServingPredictions> predicted;
  if (timed) predicted = predict_timed_runs(config, out);
  return report_cuda_serving(config, results, predicted ? &*predicted : nullptr, dir, out);
}

int cuda_shapes_validation(const ShapesConfig& config, const ShapesResults& simulated,
                           OutputDir& dir, std::ostream& out) {
  return run_cuda_validation(config, simulated, dir, out);
}

int cuda_rl_run(const RlConfig& config, OutputDir& dir, std::ostream& out, std::ostream& err) {
  return run_rl_on_cuda(config, dir, out, err);
}

int cuda_replay(const AllocTrace& trace,
                const std::vector<std::pair<std::string, AllocatorFactory>>& allocators,
                const GpuSpec& gpu, OutputDir& dir, std::ostream& out, std::ostream& err) {
  return replay_on_cuda(trace, allocators, gpu, dir, out, err);
}

int cuda_calibrate(const CalibrateOptions& options, std::ostream& out, std::ostream& err) {
  return run_calibrate(options, out, err);
}

int cuda_calibrate_model(const CalibrateModelOptions& options, std::ostream& out,
                         std::ostream& err) {
  return run_calibrate_model(options, out, err);
}

}  // namespace memsim
