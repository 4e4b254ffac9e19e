// memsim command line: runs an experiment YAML on a backend and writes its results.
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>

#include <unistd.h>

#include "memsim_config.h"
#include "sim/host_memory.h"
#include "src/app/allocators_experiment.h"
#include "src/app/calibrate.h"
#include "src/app/experiment.h"
#include "src/app/output.h"
#include "src/app/replay_command.h"
#include "src/app/rl_experiment.h"
#include "src/app/run_progress.h"
#include "src/app/serving_writers.h"
#include "src/app/shapes_experiment.h"
#include "src/app/sweep.h"
#include "src/app/writers.h"
#include "src/serve/serving_experiment.h"
// clang-format off
#if MEMSIM_HAVE_CUDA
#include "src/app/calibrate_model.h"
#include "src/app/cuda_serving.h"
#include "src/app/cuda_validation.h"
#include "src/app/rl_cuda.h"
#endif
// clang-format on

namespace {

constexpr int kExitConfigError = 2;
constexpr int kExitRunFailure = 1;

// What a run of one experiment needs besides its config.
struct RunContext {
  std::string out_dir;
  bool cuda = false;
};

// Commits the outputs (they appear whole, replacing the previous ones) and says where they went.
int finish(memsim::OutputDir& dir, int rc) {
  dir.commit();
  std::cout << dir.report();
  return rc;
}

// experiments/kv_*.yaml: requests through KV-cache strategies and schedulers; with --backend
// cuda every run's KV pool and attention run on the GPU.
int run_serving(const memsim::ConfigNode& root, const RunContext& ctx) {
  const memsim::ServingConfig config = memsim::load_serving_config(root);
  memsim::ServingRunHooks hooks;
#if MEMSIM_HAVE_CUDA
  if (ctx.cuda) {
    auto made = memsim::cuda_serving_hooks(config);
    if (!made.ok()) {
      std::cerr << "memsim: --backend cuda: " << made.error().message << "\n";
      return kExitConfigError;
    }
    hooks = std::move(made).value();
  }
#endif
  memsim::OutputDir dir(ctx.out_dir, config.experiment);  // checked before the run
  // A progress line on a terminal (stderr) for long runs; nothing otherwise.
  memsim::TerminalProgress progress(config, std::cerr, isatty(STDERR_FILENO) != 0);
  hooks.progress = progress.hook();
  const memsim::ServingResults results = memsim::run_serving_experiment(config, hooks);
  std::cout << memsim::format_serving_table(config, results);
  memsim::write_serving_outputs(config, results, dir);
  dir.add_note(memsim::plot_serving(config, dir));
  int rc = 0;
  for (const auto& r : results.runs)
    if (!r.result.error.empty()) rc = kExitRunFailure;
#if MEMSIM_HAVE_CUDA
  if (ctx.cuda) {
    // Runs that time the whole model step are compared with the sim backend's prediction.
    const bool timed = std::any_of(config.runs.begin(), config.runs.end(),
                                   [](const auto& r) { return r.gpu_step == "model"; });
    std::optional<memsim::ServingPredictions> predicted;
    if (timed) predicted = memsim::predict_timed_runs(config, std::cout);
    rc = memsim::report_cuda_serving(config, results, predicted ? &*predicted : nullptr, dir,
                                     std::cout);
  }
#endif
  return finish(dir, rc);
}

// experiments/shapes.yaml: CUDA-graph memory across batch shapes; with --backend cuda the table
// slice is captured again on the GPU.
int run_shapes(const memsim::ConfigNode& root, const RunContext& ctx) {
  const memsim::ShapesConfig config = memsim::load_shapes_config(root);
  memsim::OutputDir dir(ctx.out_dir, config.experiment);
  const memsim::ShapesResults results = memsim::run_shapes(config);
  std::cout << memsim::format_shapes_table(config, results);
  memsim::write_shapes_outputs(config, results, dir);
  if (!results.snapshots.empty())
    dir.add_note(
        fmt::format("wrote {} allocator timelines as PyTorch snapshots: {}/snapshots/ "
                    "(open them in pytorch.org/memory_viz, or memsim replay them)",
                    results.snapshots.size(), dir.path()));
  dir.add_note(memsim::plot_shapes(config, dir));
  int rc = 0;
  for (const auto& r : results.runs)
    if (!r.result.invariant_violation.empty()) rc = kExitRunFailure;
#if MEMSIM_HAVE_CUDA
  if (ctx.cuda && rc == 0) rc = memsim::run_cuda_validation(config, results, dir, std::cout);
#endif
  return finish(dir, rc);
}

int run_allocators(const memsim::ConfigNode& root, const RunContext& ctx) {
  const memsim::AllocatorsConfig config = memsim::load_allocators_config(root);
  memsim::OutputDir dir(ctx.out_dir, config.experiment);
  const int rc = memsim::run_allocators_experiment(config, dir, std::cout, std::cerr);
  return finish(dir, rc);
}

int run_rl(const memsim::ConfigNode& root, const RunContext& ctx) {
  const memsim::RlConfig config = memsim::load_rl_config(root);
  memsim::OutputDir dir(ctx.out_dir, config.experiment);
  int rc = memsim::run_rl_experiment(config, dir, std::cout, std::cerr);
#if MEMSIM_HAVE_CUDA
  if (ctx.cuda) {
    const int cuda_rc = memsim::run_rl_on_cuda(config, dir, std::cout, std::cerr);
    if (rc == 0) rc = cuda_rc;
  }
#endif
  return finish(dir, rc);
}

// --seed: a whole number the config's seed can hold, checked as the user typed it.
std::optional<std::string> parse_seed(const std::string& text) {
  const bool digits =
      !text.empty() && text.size() <= 19 &&
      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || std::stoull(text) > uint64_t(INT64_MAX)) {
    std::cerr << fmt::format("memsim: --seed: must be a whole number in [0, {}], got '{}'\n",
                             INT64_MAX, text);
    return std::nullopt;
  }
  return std::to_string(std::stoull(text));
}

}  // namespace

static int run_cli(int argc, char** argv) {
  CLI::App app{"memsim: GPU memory strategies for LLM serving, simulated and on hardware"};
  app.set_version_flag("--version", std::string("memsim ") + MEMSIM_VERSION);
  std::string config_path;
  std::string backend = "sim";
  std::string out_dir = "results";
  std::string seed;
  std::vector<std::string> overrides;
  // Required unless a subcommand runs (checked after parsing).
  auto* config_opt =
      app.add_option("--config", config_path, "experiment YAML (e.g. experiments/shapes.yaml)")
          ->check(CLI::ExistingFile);
  app.add_option("--backend", backend, "sim (default) or cuda")
      ->check(CLI::IsMember({"sim", "cuda"}));
  app.add_option("--out", out_dir, "results folder; output goes to DIR/<experiment>/")
      ->capture_default_str();
  auto* seed_opt = app.add_option("--seed", seed, "random seed (overrides the config's seed)")
                       ->type_name("UINT");
  std::string config_base;  // a sweep point's resolved config: where its relative paths resolve
  app.add_option("--config-base", config_base)->group("");
  app.add_option("--set", overrides, "override a config key: --set key.path=value (repeatable)");
  bool no_plots = false;
  app.add_flag("--no-plots", no_plots, "write no plots (sweeps pass it to their points)");

  CLI::App* calibrate = app.add_subcommand(
      "calibrate", "measure the backend primitives on the GPU and write a calibrated GPU YAML");
  std::string cal_backend = "cuda";
  std::string cal_gpu = "configs/gpus/h200.yaml";
  std::string cal_out;
  calibrate->add_option("--backend", cal_backend, "cuda (calibration measures hardware)")
      ->capture_default_str();
  calibrate->add_option("--gpu", cal_gpu, "GPU YAML supplying name and va_space")
      ->capture_default_str()
      ->check(CLI::ExistingFile);
  calibrate->add_option(
      "--out", cal_out,
      "calibrated GPU YAML to write (default configs/gpus/<name>.calibrated.yaml); with --model, "
      "the profile to write (default configs/gpus/<name>.profiles/<model>.yaml, "
      "<model>.graphs.yaml with --graphs)");
  std::string cal_model;
  uint32_t cal_layers = 0;
  calibrate->add_option("--model", cal_model,
                        "measure this model's step times (configs/models/NAME.yaml) and write its "
                        "step-time profile instead of the primitive costs");
  calibrate->add_option("--layers", cal_layers, "with --model: layers to run (0 = all)");
  std::vector<std::string> cal_in_context;
  calibrate
      ->add_option("--in-context", cal_in_context,
                   "fit the primitive costs to these calls.csv files (written by --backend "
                   "cuda runs) instead of measuring; no GPU needed")
      ->check(CLI::ExistingFile);
  std::vector<std::string> cal_check;
  calibrate
      ->add_option("--check", cal_check,
                   "compare the calls of these calls.csv files with --gpu's cost model, per run "
                   "and primitive (a held-out check); several files are also compared as runs of "
                   "one workload (their spread, their calls pooled); fits and writes nothing")
      ->check(CLI::ExistingFile)
      ->excludes("--in-context");
  bool cal_graphs = false;
  calibrate->add_flag("--graphs", cal_graphs,
                      "with --model: decode steps as captured CUDA graphs (as vLLM runs them)");
  CLI::App* replay = app.add_subcommand(
      "replay",
      "replay a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) under "
      "every caching allocator");
  memsim::ReplayCommandOptions rp;
  replay->add_option("snapshot", rp.snapshot, "the snapshot pickle")
      ->required()
      ->check(CLI::ExistingFile);
  replay->add_option("--allocator", rp.allocators,
                     "allocator to replay under (repeatable; default: all)");
  replay->add_option("--set", rp.overrides,
                     "allocator option: --set NAME.key=value, e.g. "
                     "torch_caching.max_split_size=64MiB (repeatable)");
  replay->add_option("--out", rp.out_dir, "results folder; output goes to DIR/replay/")
      ->capture_default_str();
  replay
      ->add_option("--gpu", rp.gpu,
                   "GPU: a name under configs/gpus/ or a YAML path (its capacity bounds the "
                   "replay: out of memory is an outcome)")
      ->capture_default_str();
  replay->add_option("--device", rp.device, "which device's trace to replay")
      ->capture_default_str();
  bool rp_no_min = false;
  replay->add_flag("--no-min-capacity", rp_no_min,
                   "skip the bisection for the smallest GPU capacity each allocator fits in");
  std::string rp_backend = "sim";
  replay
      ->add_option("--backend", rp_backend,
                   "sim (default), or cuda: also replay on the GPU and compare reserved bytes "
                   "with cudaMemGetInfo after every op")
      ->check(CLI::IsMember({"sim", "cuda"}));
  replay->add_option("--export", rp.export_path,
                     "write torch_caching's replay as a snapshot pickle (for memory_viz)");
  CLI::App* sweep = app.add_subcommand(
      "sweep", "run a grid of points over an experiment's config keys, in parallel and resumable");
  memsim::SweepOptions sw;
  sweep->add_option("--config", sw.config, "experiment YAML (its grid: section names axes)")
      ->required()
      ->check(CLI::ExistingFile);
  sweep->add_option("--sweep", sw.axes,
                    "an axis: key.path=v1,v2,... (repeatable; the grid is the product)");
  sweep->add_option("--set", sw.sets, "override a key for every point (repeatable)");
  sweep->add_option("-j,--jobs", sw.jobs, "points run at once (default: one per core)");
  sweep
      ->add_option("--out", sw.out_dir, "results folder; the sweep goes to DIR/<experiment>-sweep/")
      ->capture_default_str();
  sweep->add_option("--shard", sw.shard,
                    "run only points i with i % N == K (K/N; default from SLURM_ARRAY_TASK_ID "
                    "and SLURM_ARRAY_TASK_COUNT inside a Slurm job array)");
  sweep->add_flag("--slurm", sw.slurm, "write DIR/sweep.sbatch, a Slurm array job for the grid");
  sweep->add_flag("--submit", sw.submit, "with --slurm: submit it with sbatch");
  sweep->add_option("--tasks", sw.tasks, "with --slurm: array tasks (default min(points, 64))");
  sweep->add_flag("--dry-run", sw.dry_run, "validate and list the points; run nothing");
  bool sw_quiet = false;
  sweep->add_flag("--no-progress", sw_quiet, "no progress bar or per-point lines");
  sweep->add_flag("--plots", sw.plots, "let every point draw its plots (off: sweeps are faster)");
  CLI::App* merge = app.add_subcommand(
      "merge", "gather a sweep's points (e.g. the shards of a Slurm array) into DIR/sweep.csv");
  std::string merge_dir;
  merge->add_option("dir", merge_dir, "the sweep folder (DIR/<experiment>-sweep)")
      ->required()
      ->check(CLI::ExistingDirectory);
  try {
    app.parse(argc, argv);
    if (!calibrate->parsed() && !replay->parsed() && !sweep->parsed() && !merge->parsed() &&
        config_opt->count() == 0)
      throw CLI::RequiredError("--config");
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitConfigError;
  }

  if (no_plots) setenv("MEMSIM_NO_PLOTS", "1", 1);
  if (sweep->parsed()) {
    sw.progress = !sw_quiet;
    return memsim::run_sweep_command(sw, std::cout, std::cerr);
  }
  if (merge->parsed()) return memsim::run_merge_command(merge_dir, std::cout, std::cerr);
  if (replay->parsed()) {
    rp.min_capacity = !rp_no_min;
    rp.cuda = rp_backend == "cuda";
    return memsim::run_replay_command(rp, std::cout, std::cerr);
  }

  if (calibrate->parsed()) {
    if (cal_backend != "cuda") {
      std::cerr << "memsim calibrate: --backend " << cal_backend
                << ": calibration measures hardware; use --backend cuda\n";
      return kExitConfigError;
    }
    memsim::CalibrateOptions options;
    options.backend = cal_backend;
    options.gpu_path = cal_gpu;
    options.out_path = cal_out;
    options.in_context = cal_in_context;
    options.check = cal_check;
    // Fits to and checks against calls.csv files measure nothing: every build runs them.
    if (!cal_in_context.empty())
      return memsim::run_calibrate_in_context(options, std::cout, std::cerr);
    if (!cal_check.empty()) return memsim::run_calibrate_check(options, std::cout, std::cerr);
#if MEMSIM_HAVE_CUDA
    if (!cal_model.empty()) {
      memsim::CalibrateModelOptions m;
      m.gpu_path = cal_gpu;
      m.model = cal_model;
      m.out_path = cal_out;
      m.layers = cal_layers;
      m.graphs = cal_graphs;
      return memsim::run_calibrate_model(m, std::cout, std::cerr);
    }
    return memsim::run_calibrate(options, std::cout, std::cerr);
#else
    std::cerr << "memsim calibrate: --backend cuda: this build has no CUDA backend (nvcc was not "
                 "found when it was configured); rebuild with nvcc available\n";
    return kExitConfigError;
#endif
  }

  if (backend == "cuda" && !MEMSIM_HAVE_CUDA) {
    std::cerr << "memsim: --backend cuda: this build has no CUDA backend (nvcc was not found "
                 "when it was configured); rebuild with nvcc available, or use --backend sim\n";
    return kExitConfigError;
  }
  if (seed_opt->count() > 0) {
    const std::optional<std::string> s = parse_seed(seed);
    if (!s) return kExitConfigError;
    overrides.push_back("seed=" + *s);
  }
  // A ConfigError from here on (loading, or a typed loader) reaches main(): exit 2.
  const memsim::ConfigNode root = memsim::load_experiment_root(config_path, overrides, config_base);
#if MEMSIM_HAVE_CUDA
  if (backend == "cuda") {
    if (auto s = memsim::probe_cuda_device(); !s.ok()) {
      std::cerr << "memsim: --backend cuda: no usable CUDA device: " << s.error().message << "\n";
      return kExitConfigError;
    }
  }
#endif
  const RunContext ctx{out_dir, backend == "cuda"};
  switch (memsim::experiment_kind(root)) {
    case memsim::ExperimentKind::kAllocators:
      return run_allocators(root, ctx);
    case memsim::ExperimentKind::kRl:
      return run_rl(root, ctx);
    case memsim::ExperimentKind::kServing:
      return run_serving(root, ctx);
    case memsim::ExperimentKind::kShapes:
      break;
  }
  return run_shapes(root, ctx);
}

// Everything that escapes a command becomes one line and an exit code, never an abort: bad
// input 2, a failed write or run 1.
int main(int argc, char** argv) {
  try {
    return run_cli(argc, argv);
  } catch (const memsim::ConfigError& e) {
    std::cerr << "memsim: config error: " << e.what() << "\n";
    return kExitConfigError;
  } catch (const memsim::OutputError& e) {
    std::cerr << "memsim: " << e.what() << "\n";
  } catch (const memsim::HostMemoryError& e) {
    std::cerr << e.what() << "\n";  // "memsim: out of host memory while ..."
  } catch (const std::bad_alloc&) {
    std::cerr << "memsim: out of host memory\n";
  } catch (const std::exception& e) {
    std::cerr << "memsim: internal error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "memsim: internal error: an unknown exception\n";
  }
  return kExitRunFailure;
}
