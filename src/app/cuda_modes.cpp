// `--backend cuda` on the GPU: each experiment's and subcommand's CUDA mode, calling the
// CUDA-only sources (cuda_serving, cuda_validation, rl_cuda, replay_cuda, calibrate).
#include "src/app/cuda_modes.h"

#include <algorithm>
#include <optional>

#include "src/app/cuda_serving.h"
#include "src/app/cuda_validation.h"
#include "src/app/replay_cuda.h"
#include "src/app/rl_cuda.h"

namespace memsim {

bool cuda_backend_built() {
  return true;
}

std::string cuda_device_problem() {
  const Status s = probe_cuda_device();
  return s.ok() ? std::string() : s.error().message;
}

Result<ServingRunHooks> cuda_serving_hooks_for(const ServingConfig& config) {
  return cuda_serving_hooks(config);
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
