// `--backend cuda` serving runs: the CudaBackend factory and CUDA executor each run gets, and the
// simulated-against-measured report with validation.csv.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <set>
#include <sstream>

#include "backends/cuda/cuda_backend.h"
#include "src/app/cuda_serving.h"
#include "src/app/legend.h"
#include "src/app/rank_launch.h"
#include "src/exec/step_profiler.h"
#include "workload/measured_steps.h"

namespace memsim {

ServingPredictions predict_timed_runs(const ServingConfig& config, std::ostream& out) {
  ServingPredictions p;
  p.profile = run_serving_experiment(config);
  const auto priced = std::find_if(p.profile.runs.begin(), p.profile.runs.end(), [](const auto& r) {
    return r.result.step_time_source.rfind("profile", 0) == 0;
  });
  if (priced == p.profile.runs.end()) {  // all priced by the roofline: no band, no probe
    if (profiles_for(config, std::nullopt).eager)
      out << "\nspeed probe: not run (no run prices its steps from a profile)\n";
    return p;
  }
  p.band = prediction_band(config, p.profile, 0.01, 4);
  // The probe times the grid of the first profiled run's profile (its KV cache dtype's), with
  // that cache; its factors then scale every profile (the same machine's speed).
  const std::optional<DType> kv = priced->spec.kv_cache_dtype;
  const StepProfiles probed = profiles_for(config, kv);
  if (config.parallel.sizes.tensor > 1) {  // the probe's step would need every rank
    out << "\nspeed probe: not run under tensor parallelism (its steps would need every rank)\n";
    return p;
  }
  // This GPU's speed against the profile: a fresh backend and model step, after the serving
  // runs have released theirs.
  auto probe = [&]() -> Result<SpeedProbe> {
    SimClock clock;
    MEMSIM_ASSIGN_OR_RETURN(
        auto backend, CudaBackend::create(unpriced_gpu_spec(config.gpu.name), clock, nullptr));
    ModelStepConfig mc;  // as calibrate --model builds the step it profiles
    mc.model = with_kv_cache_dtype(config.model, kv);
    mc.max_tokens = 8192;
    mc.max_seqs = 512;
    MEMSIM_ASSIGN_OR_RETURN(auto step, ModelStep::create(mc, *backend));
    std::ostringstream log;  // the profiler's per-point lines; the table below has them
    return probe_profile_speed(*step, *backend, probed.eager->profile(), log);
  }();
  if (!probe.ok()) {
    p.probe_error = probe.error().message;
    out << "\nspeed probe failed: " << p.probe_error << "\n";
    return p;
  }
  p.probe = std::move(probe).value();
  out << fmt::format(
      "\nspeed probe: the profile's grid timed again on this GPU, eager and in calibrate "
      "--model's order (the GPU's power then builds up as it did), against {}; this GPU / the "
      "profile, by row: geometric mean over its points, and the least and greatest\n",
      probed.path);
  out << fmt::format("{:<8} {:>6} {:>7} {:>8} {:>8} {:>8}\n", "step", "size", "points", "ratio",
                     "least", "greatest");
  const std::vector<ProbePoint>& q = p.probe->points;
  for (size_t a = 0, b = 0; a < q.size(); a = b) {
    double log_sum = 0, lo = 1e300, hi = 0;
    for (b = a; b < q.size() && q[b].decode == q[a].decode && q[b].size == q[a].size; ++b) {
      const double r = q[b].measured_ms / q[b].profile_ms;
      log_sum += std::log(r);
      lo = std::min(lo, r);
      hi = std::max(hi, r);
    }
    out << fmt::format("{:<8} {:>6} {:>7} {:>8.3f} {:>8.3f} {:>8.3f}\n",
                       q[a].decode ? "decode" : "prefill", q[a].size, b - a,
                       std::exp(log_sum / double(b - a)), lo, hi);
  }
  out << fmt::format(
      "this GPU runs the profile's steps at decode x{:.3f}, prefill x{:.3f} (geometric means; "
      "`step_profile_scale: {{decode: {:.3f}, prefill: {:.3f}}}` predicts for it)\n",
      p.probe->decode, p.probe->prefill, p.probe->decode, p.probe->prefill);
  p.this_gpu =
      run_serving_experiment(with_profile_scale(config, p.probe->decode, p.probe->prefill));
  return p;
}

Result<ServingRunHooks> cuda_serving_hooks(const ServingConfig& config, int rank,
                                           const std::string& nccl_id) {
  const ModelShape& m = config.model;
  // A tensor-parallel rank: GPU `rank`, the launcher's NCCL group, the rank's attention heads.
  std::shared_ptr<TpMember> member;
  if (rank >= 0) {
    MEMSIM_ASSIGN_OR_RETURN(TpMember joined,
                            join_tp_group(config.parallel.sizes.tensor, rank, nccl_id,
                                          config.parallel.comm.custom_all_reduce));
    member = std::make_shared<TpMember>(std::move(joined));
  }
  const ModelShape& attention = config.rank_model;
  if (m.dtype != DType::kBF16 && m.dtype != DType::kFP16)
    return make_error(
        ErrorCode::kNotSupported,
        fmt::format("model {}: KV dtype must be bf16 or fp16 for the GPU kernels", m.name));
  for (const ServingRunSpec& run : config.runs) {
    // Sliding windows: the attention executor reads each group's table with each layer's
    // window; the model step packs one block table for every layer (each windowed layer reads
    // it with its window), so it takes vLLM's one-group layout only.
    if (run.gpu_step == "model" && m.sliding_window && run.hybrid_kv_cache)
      return make_error(
          ErrorCode::kNotSupported,
          fmt::format("run '{}': engine.gpu_step: model with {}'s sliding-window layers needs "
                      "engine.disable_hybrid_kv_cache_manager: true (the model step reads one "
                      "block table for every layer; gpu_step: attention runs the hybrid KV cache "
                      "groups)",
                      run.label, m.name));
  }
  CudaExecutorConfig base;
  base.shape = {attention.heads, attention.kv_heads, static_cast<uint32_t>(m.head_dim),
                m.dtype == DType::kFP16 ? kernels::KvDtype::kFp16 : kernels::KvDtype::kBf16};
  if (std::string why = kernels::check_shape(base.shape); !why.empty())
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("model {}: attention kernels: {}", m.name, why));
  base.layers = m.layers;
  base.layer_windows = m.layer_windows();
  ServingRunHooks hooks;
  hooks.serial = true;  // one GPU
  const int device = std::max(rank, 0);
  if (member)  // a failed run ends this rank at once (ServingRunHooks::failed)
    hooks.failed = [rank](const ServingRunSpec& spec, const std::string& error) {
      std::cerr << fmt::format("memsim: rank {}: run '{}' failed: {}\n", rank, spec.label, error);
      std::cerr.flush();
      std::cout.flush();
      std::_Exit(1);  // no destructors: NCCL's would wait for the peers' collectives
    };
  hooks.customize = [base, m, member, device](const ServingRunSpec& spec, EngineConfig& e) {
    CudaExecutorConfig c = base;
    c.tp = member ? member->group.get() : nullptr;
    c.layers_run = spec.gpu_layers;
    c.model_step = spec.gpu_step == "model";
    c.model = with_kv_cache_dtype(m, spec.kv_cache_dtype);
    // engine.kv_cache_dtype fp8: one byte per element in the pool (the engine sizes it from
    // the model's KV dtype), quantized by the KV write with scales of 1.0 (kv_scales).
    if (spec.kv_cache_dtype) c.shape.kv_cache = kernel_kv_cache(*spec.kv_cache_dtype);
    e.measured_clock = c.model_step;
    c.max_tokens = spec.serve.max_num_batched_tokens;
    c.max_seqs = spec.serve.max_num_seqs;
    if (c.model_step) {
      c.graph_sizes = e.graph_sizes;
      c.graph_max_context = graph_context_for(spec.serve.max_model_len);
    }
    c.free_before_pool = std::make_shared<uint64_t>(0);
    c.backend_syncs = true;  // the backend below: sync_for_timing
    auto free_before = c.free_before_pool;
    e.backend = [free_before, device](const GpuSpec& gpu,
                                      SimClock& clock) -> Result<std::unique_ptr<Backend>> {
      // Copies synchronize, so the executor's kernels see the strategy's copy-on-write.
      MEMSIM_ASSIGN_OR_RETURN(auto b, CudaBackend::create(gpu, clock, nullptr, device, true));
      size_t free = 0, total = 0;
      if (cudaMemGetInfo(&free, &total) == cudaSuccess) *free_before = free;
      return std::unique_ptr<Backend>(std::move(b));
    };
    e.executor = [c] { return make_cuda_executor(c); };
  };
  return hooks;
}

namespace {

// Measured (the GPU's timed model steps) against predicted (the sim backend, same trace and
// seed) for the runs with engine.gpu_step: model; error = predicted / measured - 1.
// Step by step: the step-time model's prediction for each measured step's own shape, by class
// (decode, mixed, prefill), and steps.csv.
void report_step_classes(const ServingResults& measured, OutputDir& dir, std::ostream& out) {
  out << "\nper step class: the step-time model's prediction for each measured step's shape; "
         "ratio = predicted / measured over the class's total time; pred/gpu = predicted / the "
         "GPU's share of it (CUDA events: the rest is host work)\n";
  out << fmt::format("{:<30} {:<8} {:>7} {:>11} {:>11} {:>7} {:>9} {:>9} {:>8}\n", "run", "steps",
                     "count", "measured", "predicted", "ratio", "err p10", "err p90", "pred/gpu");
  double single_pred = 0, single_gpu = 0;  // single-sequence decode steps of every run
  std::ostringstream steps;
  steps << kStepsCsvHeader << "\n";
  for (const ServingRunResult& m : measured.runs) {
    const auto& ms = m.result.measured_steps;
    const char* kClass[] = {"decode", "mixed", "prefill"};
    std::vector<double> errs[3];
    double meas[3] = {}, pred[3] = {}, gpu[3] = {};
    for (size_t k = 0; k < ms.size(); ++k) {
      const StepShape& sh = ms[k].shape;
      const int c = sh.decode_seqs == sh.num_seqs ? 0 : sh.decode_seqs ? 1 : 2;
      meas[c] += double(ms[k].measured) / 1e6;
      pred[c] += double(ms[k].predicted) / 1e6;
      gpu[c] += ms[k].gpu_ms;
      if (c == 0 && sh.num_seqs == 1 && ms[k].gpu_ms > 0) {
        single_pred += double(ms[k].predicted) / 1e6;
        single_gpu += ms[k].gpu_ms;
      }
      if (ms[k].measured > 0) errs[c].push_back(double(ms[k].predicted) / ms[k].measured - 1);
      steps << fmt::format("{},{},{},{},{},{},{},{},{:.0f},{:.4f},{:.4f},{:.4f},{:.4f}\n",
                           csv_quoted(m.spec.label), k, sh.num_seqs, sh.new_tokens, sh.decode_seqs,
                           sh.decode_kv_tokens, sh.decode_max_kv, sh.kv_read_tokens, sh.attn_pairs,
                           double(ms[k].measured) / 1e6, double(ms[k].predicted) / 1e6,
                           ms[k].wall_s, ms[k].gpu_ms);
    }
    for (int c = 0; c < 3; ++c) {
      if (errs[c].empty()) continue;
      std::sort(errs[c].begin(), errs[c].end());
      const auto at = [&](double q) { return errs[c][size_t(q * double(errs[c].size() - 1))]; };
      out << fmt::format(
          "{:<30} {:<8} {:>7} {:>9.1f}ms {:>9.1f}ms {:>7.3f} {:>+8.1f}% {:>+8.1f}% {:>8}\n",
          m.spec.label, kClass[c], errs[c].size(), meas[c], pred[c], pred[c] / meas[c],
          at(0.1) * 100, at(0.9) * 100,
          gpu[c] > 0 ? fmt::format("{:.3f}", pred[c] / gpu[c]) : std::string("-"));
    }
  }
  if (single_gpu > 0)
    out << fmt::format(
        "single-sequence decode steps, all runs: predicted / GPU time {:.3f} (this GPU against "
        "the one profiled: the same kernels at the smallest batch)\n",
        single_pred / single_gpu);
  dir.write("steps.csv", steps.str());
}

void report_sim_vs_measured(const ServingConfig& config, const ServingResults& measured,
                            const ServingPredictions& predictions, OutputDir& dir,
                            std::ostream& out) {
  const ServingResults& predicted = predictions.profile;
  const ServingResults* here = predictions.this_gpu ? &*predictions.this_gpu : nullptr;
  // The measured runs compared: those that timed the model and finished.
  const auto compared = [](const ServingRunResult& m) {
    return m.spec.gpu_step == "model" && m.result.error.empty() && m.budget_error.empty();
  };
  // Each run's step-time model: its KV cache dtype's profile, or the roofline.
  std::set<std::string> sources;
  for (const ServingRunResult& r : predicted.runs) {
    const std::string& s = r.result.step_time_source;
    if (!s.empty())
      sources.insert(s.rfind("profile", 0) == 0 ? profiles_for(config, r.spec.kv_cache_dtype).path
                                                : s);
  }
  out << fmt::format(
      "\nmeasured (every step of the model timed on the GPU) vs predicted (sim backend, step "
      "time: {}), same requests and seed; err = predicted / measured - 1; host = share of the "
      "measured step time outside the GPU's kernels\n",
      fmt::join(sources, ", "));
  out << fmt::format("{:<30}", "run");
  for (const ServingMetric& m : kServingMetrics) out << fmt::format(" {:>21}", m.name);
  out << fmt::format(" {:>6} {:>13}\n", "host", "graph steps");
  std::ostringstream csv;
  // predicted_this_gpu, error_this_gpu: with the profile scaled by the speed probe;
  // band_low, band_high: the prediction's band (prediction_band). Empty where there is none.
  csv << "run,metric,measured,predicted,error,predicted_this_gpu,error_this_gpu,band_low,"
         "band_high\n";
  const PredictionBand* band = predictions.band ? &*predictions.band : nullptr;
  const auto band_of = [&](size_t i) -> const PredictionBand::Run* {
    return band && i < band->runs.size() && band->runs[i].ok ? &band->runs[i] : nullptr;
  };
  for (size_t i = 0; i < measured.runs.size() && i < predicted.runs.size(); ++i) {
    const ServingRunResult& m = measured.runs[i];
    const ServingRunResult& p = predicted.runs[i];
    if (!compared(m)) continue;
    out << fmt::format("{:<30}", m.spec.label);
    for (size_t j = 0; j < kServingMetricCount; ++j) {
      const ServingMetric& k = kServingMetrics[j];
      const double a = k.of(m.result), b = k.of(p.result);
      const double err = a > 0 ? b / a - 1 : 0;
      out << fmt::format(" {:>8.1f} {:>7.1f} {:>+4.0f}%", a, b, err * 100);
      csv << fmt::format("{},{},{:.6f},{:.6f},{:.6f},", csv_quoted(m.spec.label), k.name, a, b,
                         err);
      if (here && i < here->runs.size()) {
        const double c = k.of(here->runs[i].result);
        csv << fmt::format("{:.6f},{:.6f},", c, a > 0 ? c / a - 1 : 0);
      } else {
        csv << ",,";
      }
      if (const PredictionBand::Run* r = band_of(i))
        csv << fmt::format("{:.6f},{:.6f}\n", r->lo[j], r->hi[j]);
      else
        csv << ",\n";
    }
    const ExecutorReport& v = m.result.validation;
    const double host = v.measured_step_s > 0 ? 1 - v.gpu_step_s / v.measured_step_s : 0;
    out << fmt::format(" {:>5.1f}% {:>13}\n", host * 100,
                       fmt::format("{}/{}", v.graph_steps, v.steps));
  }
  if (!measured.process_per_run &&
      std::count_if(measured.runs.begin(), measured.runs.end(), compared) > 1)
    out << "note: these runs were measured one after another in one process. On the H200, "
           "once a process had made the model (weights, graphs, activations) twice, every later "
           "one ran the same kernels 3-4% slower, so runs after the first, and the speed probe "
           "after them, may measure slow (docs/results/serving-measured.md). For the closest "
           "comparison run each in its own process: --process-per-run on (the default on one "
           "GPU).\n";
  if (band && !band->runs.empty()) {
    out << fmt::format(
        "\nprediction band: each figure predicted with every step priced {:.2f}x to {:.2f}x "
        "(about the profile's own repeatability), as err = predicted / measured - 1 from its "
        "lowest to its highest; * = the measured figure lies inside the band. A wide band is "
        "a figure no step model can predict closer\n",
        1 - band->rel, 1 + band->rel);
    out << fmt::format("{:<30}", "run");
    for (const ServingMetric& k : kServingMetrics) out << fmt::format(" {:>12}", k.name);
    out << "\n";
    for (size_t i = 0; i < measured.runs.size(); ++i) {
      const ServingRunResult& m = measured.runs[i];
      const PredictionBand::Run* r = band_of(i);
      if (!compared(m) || !r) continue;
      out << fmt::format("{:<30}", m.spec.label);
      for (size_t j = 0; j < kServingMetricCount; ++j) {
        const double a = kServingMetrics[j].of(m.result);
        const double lo = a > 0 ? (r->lo[j] / a - 1) * 100 : 0;
        const double hi = a > 0 ? (r->hi[j] / a - 1) * 100 : 0;
        const bool inside = r->lo[j] <= a && a <= r->hi[j];
        out << fmt::format(" {:>12}",
                           fmt::format("{:+.0f}..{:+.0f}%{}", lo, hi, inside ? "*" : ""));
      }
      out << "\n";
    }
  }
  if (here) {
    out << fmt::format(
        "\npredicted for this GPU: the same, with the profile scaled by the speed probe "
        "(decode x{:.3f}, prefill x{:.3f}); err = predicted / measured - 1\n",
        predictions.probe->decode, predictions.probe->prefill);
    out << fmt::format("{:<30}", "run");
    for (const ServingMetric& m : kServingMetrics) out << fmt::format(" {:>9}", m.name);
    out << "\n";
    for (size_t i = 0; i < measured.runs.size() && i < here->runs.size(); ++i) {
      const ServingRunResult& m = measured.runs[i];
      if (!compared(m)) continue;
      out << fmt::format("{:<30}", m.spec.label);
      for (const ServingMetric& k : kServingMetrics) {
        const double a = k.of(m.result), c = k.of(here->runs[i].result);
        out << fmt::format(" {:>+8.0f}%", a > 0 ? (c / a - 1) * 100 : 0.0);
      }
      out << "\n";
    }
  }
  dir.write("sim_vs_measured.csv", csv.str());

  report_step_classes(measured, dir, out);
}

}  // namespace

int report_cuda_serving(const ServingConfig& config, const ServingResults& results,
                        const ServingPredictions* predicted, OutputDir& dir, std::ostream& out) {
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
  std::ostringstream csv;
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
    if (v.split_prefill_steps)
      out << fmt::format(
          "    split-KV prefill: {} of the steps split their prefills' KV (checked against the "
          "same split of a copy)\n",
          v.split_prefill_steps);
    if (v.warm_up_matmuls)
      out << fmt::format("    GEMM warm-up before the first step: {} matmuls, {:.0f} ms\n",
                         v.warm_up_matmuls, v.warm_up_s * 1e3);
    if (v.steps && v.measured_step_s > 0)
      out << fmt::format(
          "    host work a step: {:.3f} ms waiting for the device, {:.3f} ms gathering the "
          "inputs, {:.3f} ms packing them; {:.3f} ms of wall time over the GPU's in all\n",
          v.host_sync_s * 1e3 / double(v.steps), v.host_inputs_s * 1e3 / double(v.steps),
          v.host_pack_s * 1e3 / double(v.steps),
          (v.measured_step_s - v.rank_wait_s - v.gpu_step_s) * 1e3 / double(v.steps));
    if (v.rank_step_s > 0)
      out << fmt::format(
          "    this rank's steps: {:.3f} s of wall time, {:.3f} s of it on the GPU; the slowest "
          "rank's added {:.3f} s ({:.3f} ms a step)\n",
          v.rank_step_s, v.gpu_step_s, v.rank_wait_s, v.rank_wait_s * 1e3 / double(v.steps));
    csv << fmt::format("{},{},{},{},{},{},{},{},{},{},{:.6f},{:.6f},{},{:.6f},{:.6f},{},{}\n",
                       csv_quoted(r.spec.label), r.spec.kv_impl, v.peak_strategy_bytes,
                       v.peak_device_bytes, v.device_kv_bytes, v.layers_run, v.steps,
                       v.checked_steps, v.checked_seqs, v.swaps, v.measured_attention_s,
                       v.simulated_attention_s, v.map_calls, v.measured_map_s, v.simulated_map_s,
                       outcome, csv_quoted(x.error));
  }
  dir.write("validation.csv", csv.str());
  if (predicted) report_sim_vs_measured(config, results, *predicted, dir, out);
  out << docs_footer(kCudaTablesAnchor);
  return status;
}

}  // namespace memsim
