// memsim command line: parses the flags of the experiment run and of each subcommand, and hands
// them to the experiment table (experiment.h) or the subcommand; errors become one line and an
// exit code.
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "core/host_memory.h"
#include "memsim_config.h"
#include "src/app/calibrate.h"
#include "src/app/calibrate_model.h"
#include "src/app/cuda_modes.h"
#include "src/app/experiment.h"
#include "src/app/output.h"
#include "src/app/plots.h"
#include "src/app/replay_command.h"
#include "src/app/serving_processes.h"
#include "src/app/sweep.h"
#include "workload/model_shape.h"
#include "workload/step_profile.h"

namespace {

constexpr int kExitConfigError = 2;
constexpr int kExitRunFailure = 1;

// `memsim --config FILE ...`: one experiment.
struct RunCli {
  std::string config_path, backend = "sim", out_dir = "results", seed, config_base;
  std::vector<std::string> overrides, unsets;
  bool no_plots = false, explain = false;
  int rank = -1;  // a tensor-parallel rank process (hidden options, set by its launcher)
  std::string nccl_id;
  std::string process_per_run = "auto";
  int serving_run = -1;  // a process running one serving run (hidden, set by its launcher)
  std::string serving_result, serving_digest;
  long serving_launcher = -1;
  CLI::Option* config_opt = nullptr;
  CLI::Option* seed_opt = nullptr;
};

struct CalibrateCli {
  CLI::App* cmd = nullptr;
  memsim::CalibrateOptions options;
  memsim::CalibrateModelOptions model;
};

struct ReplayCli {
  CLI::App* cmd = nullptr;
  memsim::ReplayCommandOptions options;
  bool no_min_capacity = false, no_plots = false;
  std::string backend = "sim";
};

struct SweepCli {
  CLI::App* cmd = nullptr;
  memsim::SweepOptions options;
  bool quiet = false;
};

struct MergeCli {
  CLI::App* cmd = nullptr;
  std::string dir;
};

struct PlotCli {
  CLI::App* cmd = nullptr;
  std::string kind;
};

void add_run_options(CLI::App& app, RunCli& r) {
  // Required unless a subcommand runs (checked after parsing).
  r.config_opt =
      app.add_option("--config", r.config_path, "experiment YAML (e.g. experiments/shapes.yaml)")
          ->check(CLI::ExistingFile);
  app.add_option("--backend", r.backend, "sim (default) or cuda")
      ->check(CLI::IsMember({"sim", "cuda"}));
  app.add_option("--out", r.out_dir, "results folder; output goes to DIR/<experiment>/")
      ->capture_default_str();
  r.seed_opt = app.add_option("--seed", r.seed, "random seed (overrides the config's seed)")
                   ->type_name("UINT");
  // A sweep point's resolved config: the folder its relative paths resolve from.
  app.add_option("--config-base", r.config_base)->group("");
  app.add_option("--rank", r.rank)->group("");
  app.add_option("--nccl-id", r.nccl_id)->group("");
  app.add_option("--serving-run", r.serving_run)->group("");
  app.add_option("--serving-result", r.serving_result)->group("");
  app.add_option("--serving-launcher", r.serving_launcher)->group("");
  app.add_option("--serving-digest", r.serving_digest)->group("");
  app.add_option("--process-per-run", r.process_per_run,
                 "serving: each run in a process of its own (auto: with --backend cuda on one "
                 "GPU, where a process's later model steps ran slower)")
      ->check(CLI::IsMember(memsim::process_per_run_names()))
      ->capture_default_str();
  app.add_option("--set", r.overrides,
                 "override a config key: --set key.path=value; a list entry by its index, "
                 "--set runs.0.kv.impl=radix_token_pool (repeatable)");
  app.add_option("--unset", r.unsets,
                 "remove a config key before the --set values apply (repeatable)");
  app.add_flag("--no-plots", r.no_plots, "write no plots (sweeps pass it to their points)");
  app.add_flag("--explain", r.explain,
               "after each table, what its columns mean (docs/tables.md has them all)");
}

void add_calibrate(CLI::App& app, CalibrateCli& c) {
  c.cmd = app.add_subcommand(
      "calibrate", "measure the backend primitives on the GPU and write a calibrated GPU YAML");
  memsim::CalibrateOptions& o = c.options;
  c.cmd->add_option("--backend", o.backend, "cuda (calibration measures hardware)")
      ->capture_default_str();
  c.cmd->add_option("--gpu", o.gpu_path, "GPU YAML supplying name and va_space")
      ->capture_default_str()
      ->check(CLI::ExistingFile);
  c.cmd->add_option(
      "--out", o.out_path,
      "calibrated GPU YAML to write (default configs/gpus/<name>.calibrated.yaml); with --model, "
      "the profile to write (default configs/gpus/<name>.profiles/<model>.yaml, "
      "<model>.graphs.yaml with --graphs)");
  // The options of a model's profile need --model (without it they would go unused).
  CLI::Option* model =
      c.cmd->add_option("--model", c.model.model,
                        "measure this model's step times (configs/models/NAME.yaml) and write "
                        "its step-time profile instead of the primitive costs");
  c.cmd->add_option("--layers", c.model.layers, "with --model: layers to run (0 = all)")
      ->needs(model);
  c.cmd
      ->add_option("--in-context", o.in_context,
                   "fit the primitive costs to these calls.csv files (written by --backend "
                   "cuda runs) instead of measuring; no GPU needed")
      ->check(CLI::ExistingFile);
  c.cmd
      ->add_option("--check", o.check,
                   "compare the calls of these calls.csv files with --gpu's cost model, per run "
                   "and primitive (a held-out check); several files are also compared as runs of "
                   "one workload (their spread, their calls pooled); fits and writes nothing")
      ->check(CLI::ExistingFile)
      ->excludes("--in-context");
  c.cmd
      ->add_flag("--graphs", c.model.graphs,
                 "with --model: decode steps as captured CUDA graphs (as vLLM runs them)")
      ->needs(model);
  c.cmd
      ->add_option("--decode-batches", c.model.decode_batches,
                   fmt::format("with --model: the decode rows' batch sizes, ascending, 1..{} "
                               "(default: powers of two); with --graphs, vLLM's capture sizes "
                               "(1,2,4,8,16,24,...,512) give a row for every graph a decode step "
                               "replays",
                               memsim::kCalibrateMaxSeqs))
      ->delimiter(',')
      ->needs(model);
  c.cmd
      ->add_option("--prefill-chunks", c.model.prefill_chunks,
                   fmt::format("with --model: the prefill rows' chunk sizes, ascending, 1..{} "
                               "(default: 16,64,256,1024,2048,4096,8192); rows between them leave "
                               "less to interpolate",
                               memsim::kCalibrateMaxTokens))
      ->delimiter(',')
      ->needs(model);
  c.cmd
      ->add_option("--kv-cache-dtype", c.model.kv_cache_dtype,
                   "with --model: the KV cache's dtype, as vLLM's --kv-cache-dtype: auto (the "
                   "model's), fp8 (= fp8_e4m3) or fp8_e5m2; writes <model>.fp8.yaml (or "
                   ".fp8_e5m2.yaml)")
      ->check(CLI::IsMember(memsim::kv_cache_dtype_names()))
      ->needs(model);
  c.cmd
      ->add_option("--tensor-parallel", c.model.tensor_parallel,
                   "with --model: one rank's steps under tensor parallelism over N GPUs of this "
                   "host (one process each, NCCL); writes <model>.tp<N>.yaml")
      ->check(CLI::Range(1, 64))
      ->needs(model);
  c.cmd
      ->add_option("--all-reduce", c.model.all_reduce,
                   "with --tensor-parallel: custom (vLLM's custom all-reduce up to 8 MiB, NCCL "
                   "above; its default) or nccl")
      ->check(CLI::IsMember({"custom", "nccl"}))
      ->needs(model);
  c.cmd->add_option("--rank", c.model.rank, "(set by --tensor-parallel)")->group("");
  c.cmd->add_option("--nccl-id", c.model.nccl_id, "(set by --tensor-parallel)")->group("");
}

void add_replay(CLI::App& app, ReplayCli& r) {
  r.cmd = app.add_subcommand("replay",
                             "replay a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) "
                             "under every caching allocator");
  memsim::ReplayCommandOptions& o = r.options;
  r.cmd->add_option("snapshot", o.snapshot, "the snapshot pickle")
      ->required()
      ->check(CLI::ExistingFile);
  r.cmd->add_option("--allocator", o.allocators,
                    "allocator to replay under, with options to compare variants: "
                    "NAME[:KEY=VALUE,...], e.g. torch_caching:expandable_segments=true "
                    "(repeatable; each is a row labelled as written; default: every allocator)");
  r.cmd->add_option("--set", o.overrides,
                    "allocator option: --set NAME.key=value, e.g. "
                    "torch_caching.max_split_size=64MiB, for every variant of NAME (repeatable)");
  r.cmd->add_option("--out", o.out_dir, "results folder; output goes to DIR/replay/")
      ->capture_default_str();
  r.cmd
      ->add_option("--gpu", o.gpu,
                   "GPU: a name under configs/gpus/ or a YAML path (its capacity bounds the "
                   "replay: out of memory is an outcome)")
      ->capture_default_str();
  r.cmd->add_option("--device", o.device, "which device's trace to replay")->capture_default_str();
  r.cmd->add_flag("--no-min-capacity", r.no_min_capacity,
                  "skip the bisection for the smallest GPU capacity each allocator fits in");
  r.cmd
      ->add_option("--backend", r.backend,
                   "sim (default), or cuda: also replay on the GPU and compare reserved bytes "
                   "with cudaMemGetInfo after every op")
      ->check(CLI::IsMember({"sim", "cuda"}));
  r.cmd->add_option("--export", o.export_path,
                    "write torch_caching's replay as a snapshot pickle (for memory_viz)");
  r.cmd->add_flag("--no-plots", r.no_plots, "write no plots");
  r.cmd->add_flag("--explain", o.explain,
                  "after the table, what its columns mean (docs/tables.md has them all)");
}

void add_sweep(CLI::App& app, SweepCli& s) {
  s.cmd = app.add_subcommand(
      "sweep", "run a grid of points over an experiment's config keys, in parallel and resumable");
  memsim::SweepOptions& o = s.options;
  s.cmd->add_option("--config", o.config, "experiment YAML (its grid: section names axes)")
      ->required()
      ->check(CLI::ExistingFile);
  s.cmd->add_option("--sweep", o.axes,
                    "an axis: key.path=v1,v2,... (repeatable; the grid is the product)");
  s.cmd->add_option("--set", o.sets, "override a key for every point (repeatable)");
  s.cmd->add_option("--unset", o.unsets, "remove a key for every point (repeatable)");
  s.cmd->add_option("-j,--jobs", o.jobs, "points run at once (default: one per core)");
  s.cmd->add_option("--out", o.out_dir, "results folder; the sweep goes to DIR/<experiment>-sweep/")
      ->capture_default_str();
  s.cmd->add_option("--shard", o.shard,
                    "run only points i with i % N == K (K/N; default from SLURM_ARRAY_TASK_ID "
                    "and SLURM_ARRAY_TASK_COUNT inside a Slurm job array)");
  s.cmd->add_flag("--slurm", o.slurm, "write DIR/sweep.sbatch, a Slurm array job for the grid");
  s.cmd->add_flag("--submit", o.submit, "with --slurm: submit it with sbatch");
  s.cmd->add_option("--tasks", o.tasks, "with --slurm: array tasks (default min(points, 64))");
  s.cmd->add_flag("--dry-run", o.dry_run, "validate and list the points; run nothing");
  s.cmd->add_flag("--no-progress", s.quiet, "no progress bar or per-point lines");
  s.cmd->add_flag("--plots", o.plots, "let every point draw its plots (off: sweeps are faster)");
}

void add_merge(CLI::App& app, MergeCli& m) {
  m.cmd = app.add_subcommand(
      "merge", "gather a sweep's points (e.g. the shards of a Slurm array) into DIR/sweep.csv");
  m.cmd->add_option("dir", m.dir, "the sweep folder (DIR/<experiment>-sweep)")
      ->required()
      ->check(CLI::ExistingDirectory);
}

// memsim tp-rank: one rank of tp_memory --backend cuda, started by memsim itself (not listed).
struct TpRankCli {
  CLI::App* cmd = nullptr;
  std::string config, nccl_id, result;
  int rank = 0;
};

void add_tp_rank(CLI::App& app, TpRankCli& t) {
  t.cmd = app.add_subcommand("tp-rank", "one rank of tp_memory --backend cuda (internal)");
  t.cmd->group("");
  t.cmd->add_option("config", t.config, "the point's config")->required();
  t.cmd->add_option("--rank", t.rank, "this process's rank")->required();
  t.cmd->add_option("--nccl-id", t.nccl_id, "ncclUniqueId, 256 hex digits")->required();
  t.cmd->add_option("--result", t.result, "where the rank's JSON goes")->required();
}

void add_plot(CLI::App& app, PlotCli& p) {
  p.cmd = app.add_subcommand(
      "plot",
      "draw a plot of results by hand: tools/plot_KIND.py ARGS... with the interpreter "
      "memsim uses (recorded at set-up; MEMSIM_PYTHON overrides it)");
  p.cmd
      ->add_option("kind", p.kind,
                   "shapes, kv, rl, allocators or sweep; the script's own "
                   "arguments follow (listed in docs/experiments.md)")
      ->required();
  p.cmd->prefix_command();  // everything after KIND goes to the script, in order
}

int run_calibrate_cli(CalibrateCli& c) {
  memsim::CalibrateOptions& o = c.options;
  if (o.backend != "cuda") {
    std::cerr << "memsim calibrate: --backend " << o.backend
              << ": calibration measures hardware; use --backend cuda\n";
    return kExitConfigError;
  }
  // Fits to and checks against calls.csv files measure nothing: every build runs them.
  if (!o.in_context.empty()) return memsim::run_calibrate_in_context(o, std::cout, std::cerr);
  if (!o.check.empty()) return memsim::run_calibrate_check(o, std::cout, std::cerr);
  if (c.model.model.empty()) return memsim::cuda_calibrate(o, std::cout, std::cerr);
  // Grid sizes are refused before any GPU work, in every build.
  if (!c.model.decode_batches.empty()) {
    const std::string why =
        memsim::check_decode_batches(c.model.decode_batches, memsim::kCalibrateMaxSeqs);
    if (!why.empty()) {
      std::cerr << "memsim calibrate: --decode-batches: " << why << "\n";
      return kExitConfigError;
    }
  }
  if (!c.model.prefill_chunks.empty()) {
    const std::string why =
        memsim::check_prefill_chunks(c.model.prefill_chunks, memsim::kCalibrateMaxTokens);
    if (!why.empty()) {
      std::cerr << "memsim calibrate: --prefill-chunks: " << why << "\n";
      return kExitConfigError;
    }
  }
  c.model.gpu_path = o.gpu_path;
  c.model.out_path = o.out_path;
  return memsim::cuda_calibrate_model(c.model, std::cout, std::cerr);
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

int run_experiment_cli(RunCli& r) {
  // A serving run's process (started by its launcher) ends with it, from here on.
  if (r.serving_run >= 0 && !memsim::attach_to_launcher(r.serving_launcher)) return kExitRunFailure;
  const bool cuda = r.backend == "cuda";
  if (cuda && !memsim::cuda_backend_built()) {
    std::cerr << "memsim: --backend cuda: " << memsim::cuda_device_problem()
              << ", or use --backend sim\n";
    return kExitConfigError;
  }
  if (r.seed_opt->count() > 0) {
    const std::optional<std::string> s = parse_seed(r.seed);
    if (!s) return kExitConfigError;
    r.overrides.push_back("seed=" + *s);
  }
  // A ConfigError from here on (loading, or a typed loader) reaches main(): exit 2.
  const memsim::ConfigNode root =
      memsim::load_experiment_root(r.config_path, r.overrides, r.config_base, r.unsets);
  // A tensor-parallel rank (--rank, started by its launcher, which probed) uses only its own GPU:
  // probing device 0 would leave a context there on every rank.
  if (cuda && r.rank < 0) {
    if (std::string why = memsim::cuda_device_problem(); !why.empty()) {
      std::cerr << "memsim: --backend cuda: no usable CUDA device: " << why << "\n";
      return kExitConfigError;
    }
  }
  const memsim::ExperimentKind& kind = memsim::experiment_kind(root);
  if (r.process_per_run != "auto" && kind.name != "serving") {
    std::cerr << fmt::format(
        "memsim: --process-per-run {}: {} is a {} experiment; only serving experiments run in "
        "processes of their own\n",
        r.process_per_run, r.config_path, kind.name);
    return kExitConfigError;
  }
  return kind.run(root, {r.out_dir, cuda, r.explain, r.rank, r.nccl_id, r.process_per_run,
                         r.serving_run, r.serving_result, r.serving_digest});
}

int run_cli(int argc, char** argv) {
  CLI::App app{"memsim: GPU memory strategies for LLM serving, simulated and on hardware"};
  app.set_version_flag("--version", std::string("memsim ") + MEMSIM_VERSION);
  RunCli run;
  CalibrateCli calibrate;
  ReplayCli replay;
  SweepCli sweep;
  MergeCli merge;
  PlotCli plot;
  TpRankCli tp_rank;
  add_run_options(app, run);
  add_calibrate(app, calibrate);
  add_replay(app, replay);
  add_sweep(app, sweep);
  add_merge(app, merge);
  add_plot(app, plot);
  add_tp_rank(app, tp_rank);
  try {
    app.parse(argc, argv);
    if (app.get_subcommands().empty() && run.config_opt->count() == 0)
      throw CLI::RequiredError("--config");
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitConfigError;
  }
  if (run.no_plots || replay.no_plots) setenv("MEMSIM_NO_PLOTS", "1", 1);
  if (sweep.cmd->parsed()) {
    sweep.options.progress = !sweep.quiet;
    return memsim::run_sweep_command(sweep.options, std::cout, std::cerr);
  }
  if (tp_rank.cmd->parsed())
    return memsim::cuda_tp_rank(tp_rank.config, tp_rank.rank, tp_rank.nccl_id, tp_rank.result,
                                std::cerr);
  if (merge.cmd->parsed()) return memsim::run_merge_command(merge.dir, std::cout, std::cerr);
  if (plot.cmd->parsed()) {
    return memsim::run_plot_command(plot.kind, plot.cmd->remaining(), std::cerr);
  }
  if (replay.cmd->parsed()) {
    replay.options.min_capacity = !replay.no_min_capacity;
    replay.options.cuda = replay.backend == "cuda";
    return memsim::run_replay_command(replay.options, std::cout, std::cerr);
  }
  if (calibrate.cmd->parsed()) return run_calibrate_cli(calibrate);
  return run_experiment_cli(run);
}

}  // namespace

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
