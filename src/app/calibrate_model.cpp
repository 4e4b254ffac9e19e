// The model calibration subcommand: CudaBackend, ModelStep, the profile grid, the profile file
// (written, read back and checked).
#include "src/app/calibrate_model.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <chrono>
#include <ctime>
#include <filesystem>

#include "backends/cuda/cuda_backend.h"
#include "src/app/output.h"
#include "src/app/rank_launch.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/config/step_profile_loader.h"
#include "src/exec/step_profiler.h"

namespace memsim {

namespace {

// The profile written beside the GPU file (or at --out), after reading it back as the serving
// engine will.
int write_profile(const CalibrateModelOptions& o, StepProfile& p, const ModelShape& model,
                  int device, std::ostream& out, std::ostream& err) {
  const std::optional<DType> kv = p.kv_cache_dtype;
  const uint32_t tp = p.tensor_parallel;
  cudaDeviceProp prop{};
  int driver = 0;
  (void)cudaGetDeviceProperties(&prop, device);
  (void)cudaDriverGetVersion(&driver);
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  p.measured =
      fmt::format("{}{}, CUDA driver {}.{}, {}{}", prop.name,
                  tp > 1 ? fmt::format(" x {} (rank 0 of TP {})", tp, tp) : "", driver / 1000,
                  (driver % 1000) / 10, date,
                  o.layers ? fmt::format(", {} of {} layers", o.layers, model.layers) : "");
  const std::string path =
      o.out_path.empty() ? step_profile_path(o.gpu_path, model.name, o.graphs, tp, kv) : o.out_path;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tp_flag =
      tp > 1 ? fmt::format(" --tensor-parallel {} --all-reduce {}", tp, p.all_reduce) : "";
  const std::string kv_flag = kv ? fmt::format(" --kv-cache-dtype {}", to_string(*kv)) : "";
  const std::string batches_flag =
      o.decode_batches.empty()
          ? ""
          : fmt::format(" --decode-batches {}", fmt::join(o.decode_batches, ","));
  const std::string chunks_flag =
      o.prefill_chunks.empty()
          ? ""
          : fmt::format(" --prefill-chunks {}", fmt::join(o.prefill_chunks, ","));
  const std::string text = format_step_profile(
      p,
      {fmt::format("Step times of {} on {}: memsim calibrate --backend cuda --model {}{}{}{}{}{}",
                   model.name, p.gpu, model.name, o.graphs ? " --graphs" : "", tp_flag, kv_flag,
                   batches_flag, chunks_flag),
       fmt::format(
           "ModelStep (src/exec/model_step.h): random bf16 weights, paged KV (block "
           "16, tables over blocks in random order{}), {}, median of 5 steps; the "
           "serving engine interpolates it (step_profile.h){}",
           kv ? fmt::format("; an {} cache the KV write quantizes with scales of 1.0",
                            to_string(*kv))
              : "",
           o.graphs ? "decode steps replayed as CUDA graphs captured for contexts up "
                      "to 32K, prefill eager"
                    : "eager launches",
           tp > 1 ? fmt::format(". One rank of {}: its shard, {} and the logits' "
                                "NCCL all-gather included",
                                tp,
                                p.all_reduce == "custom" ? "custom all-reduces (NCCL above 8 MiB)"
                                                         : "NCCL all-reduces")
                  : "")});
  // Read back exactly as the serving engine will, before it replaces anything at `path`.
  const auto loads_back = [&](std::string_view t) -> std::string {
    try {
      return check_step_profile(load_step_profile(ConfigNode::parse(std::string(t), path)));
    } catch (const ConfigError& e) {
      return fmt::format("read-back: {}", e.what());
    }
  };
  try {
    write_file_atomically(path, text, loads_back);
  } catch (const OutputError& e) {
    err << "memsim calibrate: " << e.what() << "\n";
    return 1;
  }
  out << fmt::format("wrote {} ({} decode rows, {} prefill rows)\n", path, p.decode.size(),
                     p.prefill.size());
  return 0;
}

}  // namespace

int run_calibrate_model(const CalibrateModelOptions& o, std::ostream& out, std::ostream& err) {
  GpuSpec gpu;
  ModelShape model;
  std::string model_path = o.model;
  try {
    gpu = load_gpu_spec(ConfigNode::load_file(o.gpu_path));
    if (model_path.find('/') == std::string::npos &&
        std::filesystem::path(model_path).extension() != ".yaml") {
      const std::filesystem::path gdir = std::filesystem::path(o.gpu_path).parent_path();
      model_path = (gdir / ".." / "models" / (o.model + ".yaml")).lexically_normal().string();
    }
    model = load_model_shape(ConfigNode::load_file(model_path));
  } catch (const ConfigError& e) {
    err << "memsim calibrate: " << e.what() << "\n";
    return 2;
  }
  const uint32_t tp = o.tensor_parallel;
  if (tp > 1 && o.rank < 0) {  // the launcher: one process per rank
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < static_cast<int>(tp)) {
      err << fmt::format("memsim calibrate: --tensor-parallel {} needs {} GPUs, {} here\n", tp, tp,
                         devices);
      return 2;
    }
    return run_rank_processes(own_command_line(), tp, false, 3600, out);
  }
  TpMember member;
  if (o.rank >= 0) {
    auto joined = join_tp_group(tp, o.rank, o.nccl_id, o.all_reduce == "custom");
    if (!joined.ok()) {
      err << "memsim calibrate: " << joined.error().message << "\n";
      return 2;
    }
    member = std::move(joined).value();
  }
  const int device = o.rank >= 0 ? o.rank : o.device;
  SimClock clock;
  auto backend = CudaBackend::create(unpriced_gpu_spec(gpu.name), clock, nullptr, device);
  if (!backend.ok()) {
    err << "memsim calibrate: --backend cuda: " << backend.error().message << "\n";
    return 2;
  }
  ModelStepConfig cfg;
  cfg.model = model;
  cfg.model.kv_dtype = kv_cache_dtype_from_name(o.kv_cache_dtype);
  cfg.layers_run = o.layers;
  cfg.max_tokens = kCalibrateMaxTokens;
  cfg.max_seqs = kCalibrateMaxSeqs;
  cfg.tp = member.group.get();
  auto step = ModelStep::create(cfg, **backend);
  if (!step.ok()) {
    err << "memsim calibrate: model step: " << step.error().message << "\n";
    return 1;
  }
  ProfileGrid grid;
  grid.graphs = o.graphs;
  if (!o.decode_batches.empty()) grid.batches = o.decode_batches;
  if (!o.prefill_chunks.empty()) grid.chunks = o.prefill_chunks;
  auto profile = measure_step_profile(**step, **backend, grid, out);
  if (!profile.ok()) {
    err << "memsim calibrate: " << profile.error().message << "\n";
    return 1;
  }
  if (o.rank > 0) return 0;  // rank 0 writes the profile
  StepProfile p = std::move(profile).value();
  p.gpu = gpu.name;
  p.tensor_parallel = tp;
  p.kv_cache_dtype = cfg.model.kv_dtype;
  if (member.group) p.all_reduce = member.group->all_reduce_kind();
  return write_profile(o, p, model, device, out, err);
}

}  // namespace memsim
