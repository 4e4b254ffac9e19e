// `--backend cuda` in a build without the CUDA backend: every entry says so (exit 2).
#include <fmt/format.h>

#include "src/app/cuda_modes.h"

namespace memsim {

namespace {

constexpr const char* kNoCuda =
    "this build has no CUDA backend (nvcc was not found when it was configured); rebuild with "
    "nvcc available";

int refuse(std::ostream& err, const char* what) {
  err << fmt::format("memsim{}: --backend cuda: {}\n", what, kNoCuda);
  return 2;
}

}  // namespace

bool cuda_backend_built() {
  return false;
}

std::string cuda_device_problem() {
  return kNoCuda;
}

std::string cuda_gpu_mismatch(const GpuSpec&) {
  return kNoCuda;
}

Result<ServingRunHooks> cuda_serving_hooks_for(const ServingConfig&, int, const std::string&) {
  return make_error(ErrorCode::kNotSupported, kNoCuda);
}

int cuda_launch_ranks(uint32_t, bool, std::ostream& out) {
  return refuse(out, "");
}

void cuda_release_device() {}

int cuda_serving_report(const ServingConfig&, const ServingResults&, OutputDir&,
                        std::ostream& out) {
  return refuse(out, "");
}

int cuda_shapes_validation(const ShapesConfig&, const ShapesResults&, OutputDir&,
                           std::ostream& out) {
  return refuse(out, "");
}

int cuda_rl_run(const RlConfig&, OutputDir&, std::ostream&, std::ostream& err) {
  return refuse(err, "");
}

int cuda_tp_memory(const TpMemoryConfig&, const TpMemoryResults&, OutputDir&, std::ostream& out) {
  return refuse(out, "");
}

int cuda_tp_rank(const std::string&, int, const std::string&, const std::string&,
                 std::ostream& err) {
  return refuse(err, " tp-rank");
}

int cuda_replay(const AllocTrace&, const std::vector<std::pair<std::string, AllocatorFactory>>&,
                const GpuSpec&, OutputDir&, std::ostream&, std::ostream& err) {
  return refuse(err, " replay");
}

int cuda_calibrate(const CalibrateOptions&, std::ostream&, std::ostream& err) {
  return refuse(err, " calibrate");
}

int cuda_calibrate_model(const CalibrateModelOptions&, std::ostream&, std::ostream& err) {
  return refuse(err, " calibrate");
}

}  // namespace memsim
