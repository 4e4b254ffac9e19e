// `--backend cuda` serving runs: the CudaBackend factory and CUDA executor each run gets, and the
// simulated-against-measured report with validation.csv.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "backends/cuda/cuda_backend.h"
#include "src/app/cuda_serving.h"

namespace memsim {

Result<ServingRunHooks> cuda_serving_hooks(const ServingConfig& config) {
  const ModelShape& m = config.model;
  if (m.dtype != DType::kBF16 && m.dtype != DType::kFP16)
    return make_error(
        ErrorCode::kNotSupported,
        fmt::format("model {}: KV dtype must be bf16 or fp16 for the GPU kernels", m.name));
  CudaExecutorConfig base;
  base.shape = {m.heads, m.kv_heads, static_cast<uint32_t>(m.head_dim),
                m.dtype == DType::kFP16 ? kernels::KvDtype::kFp16 : kernels::KvDtype::kBf16};
  if (std::string why = kernels::check_shape(base.shape); !why.empty())
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("model {}: attention kernels: {}", m.name, why));
  base.layers = m.layers;
  ServingRunHooks hooks;
  hooks.serial = true;  // one GPU
  hooks.customize = [base](const ServingRunSpec& spec, EngineConfig& e) {
    CudaExecutorConfig c = base;
    c.layers_run = spec.gpu_layers;
    c.max_tokens = spec.serve.max_num_batched_tokens;
    c.max_seqs = spec.serve.max_num_seqs;
    c.free_before_pool = std::make_shared<uint64_t>(0);
    auto free_before = c.free_before_pool;
    e.backend = [free_before](const GpuSpec& gpu,
                              SimClock& clock) -> Result<std::unique_ptr<Backend>> {
      // Copies synchronize, so the executor's kernels see the strategy's copy-on-write.
      MEMSIM_ASSIGN_OR_RETURN(auto b, CudaBackend::create(gpu, clock, nullptr, 0, true));
      size_t free = 0, total = 0;
      if (cudaMemGetInfo(&free, &total) == cudaSuccess) *free_before = free;
      return std::unique_ptr<Backend>(std::move(b));
    };
    e.executor = [c] { return make_cuda_executor(c); };
  };
  return hooks;
}

int report_cuda_serving(const ServingConfig& config, const ServingResults& results,
                        const std::string& dir, std::ostream& out) {
  int status = 0;
  out << fmt::format("\n--backend cuda: {} on the GPU ({} model layers)\n", config.experiment,
                     config.model.layers);
  out << "strategy = peak bytes the strategy held (identical to the simulation by construction);\n"
         "GPU = peak cudaMemGetInfo drop less the executor's own buffers; checked = steps whose\n"
         "attention output was compared bit for bit with a reference over regenerated K/V;\n"
         "attn = KV write + attention of the layers run, measured against the step-time model;\n"
         "maps = the strategy's map, set_access and unmap calls, measured against the cost model\n";
  out << fmt::format(
      "{:<30} {:>11} {:>11} {:>7} {:>8} {:>7} {:>8} {:>6} {:>11} {:>11} {:>6} {:>7} {:>10} "
      "{:>10}  {}\n",
      "run", "strategy", "GPU", "layers", "steps", "checked", "seq ok", "swaps", "attn meas.",
      "attn sim.", "m/s", "maps", "map meas.", "map sim.", "outcome");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::ofstream csv(std::filesystem::path(dir) / "validation.csv");
  csv << "run,kv,peak_strategy_bytes,peak_device_bytes,pool_device_bytes_at_init,layers_run,steps,"
         "checked_steps,checked_seqs,swaps,measured_attention_s,simulated_attention_s,map_calls,"
         "measured_map_s,simulated_map_s,outcome,failure\n";
  for (const ServingRunResult& r : results.runs) {
    const ServingResult& x = r.result;
    const ExecutorReport& v = x.validation;
    const bool ok = r.budget_error.empty() && x.error.empty() && x.executed;
    if (!ok) status = 1;
    const std::string outcome = !r.budget_error.empty() ? "no KV memory" : ok ? "ok" : "FAILED";
    const double ratio =
        v.simulated_attention_s > 0 ? v.measured_attention_s / v.simulated_attention_s : 0;
    out << fmt::format(
        "{:<30} {:>8.2f}GiB {:>8.2f}GiB {:>7} {:>8} {:>7} {:>8} {:>6} {:>9.3f}s {:>9.3f}s {:>6.2f} "
        "{:>7} {:>8.1f}ms {:>8.1f}ms  {}\n",
        r.spec.label, double(v.peak_strategy_bytes) / (1ull << 30),
        double(v.peak_device_bytes) / (1ull << 30), v.layers_run, v.steps, v.checked_steps,
        v.checked_seqs, v.swaps, v.measured_attention_s, v.simulated_attention_s, ratio,
        v.map_calls, v.measured_map_s * 1e3, v.simulated_map_s * 1e3, outcome);
    if (!x.error.empty()) out << "    error: " << x.error << "\n";
    csv << fmt::format(
        "\"{}\",{},{},{},{},{},{},{},{},{},{:.6f},{:.6f},{},{:.6f},{:.6f},{},\"{}\"\n",
        r.spec.label, r.spec.kv_impl, v.peak_strategy_bytes, v.peak_device_bytes, v.device_kv_bytes,
        v.layers_run, v.steps, v.checked_steps, v.checked_seqs, v.swaps, v.measured_attention_s,
        v.simulated_attention_s, v.map_calls, v.measured_map_s, v.simulated_map_s, outcome,
        x.error);
  }
  out << fmt::format("wrote {}/validation.csv\n", dir);
  if (!csv) return 1;
  return status;
}

}  // namespace memsim
