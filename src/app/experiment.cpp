// The experiment table: each kind's recognition, validation and run (simulation, then its
// --backend cuda mode through cuda_modes.h), with its outputs written and committed.
#include "src/app/experiment.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <optional>

#include "src/app/allocators_experiment.h"
#include "src/app/cuda_modes.h"
#include "src/app/output.h"
#include "src/app/rl_experiment.h"
#include "src/app/run_progress.h"
#include "src/app/serving_processes.h"
#include "src/app/serving_writers.h"
#include "src/app/shapes_experiment.h"
#include "src/app/spawn.h"
#include "src/app/tp_memory_experiment.h"
#include "src/app/writers.h"
#include "src/serve/serving_experiment.h"

namespace memsim {

namespace {

// A temporary folder (made when `make`), removed with everything in it at the end of scope.
struct TempFolder {
  std::string path;
  explicit TempFolder(bool make) {
    char pattern[] = "/tmp/memsim-rank-XXXXXX";
    if (make && mkdtemp(pattern) != nullptr) path = pattern;
  }
  ~TempFolder() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

constexpr int kExitRunFailure = 1;
constexpr int kExitConfigError = 2;

// Commits the outputs (they appear whole, replacing the previous ones) and says where they went.
int finish(OutputDir& dir, int rc) {
  dir.commit();
  std::cout << dir.report();
  return rc;
}

// --backend cuda on a GPU other than the config's: said before anything runs (false).
bool refuse_other_gpu(const GpuSpec& gpu) {
  if (std::string why = cuda_gpu_mismatch(gpu); !why.empty()) {
    std::cerr << "memsim: --backend cuda: " << why << "\n";
    return false;
  }
  return true;
}

// experiments/kv_*.yaml: requests through KV-cache strategies and schedulers; with --backend
// cuda every run's KV pool and attention run on the GPU.
int run_serving(const ConfigNode& root, const RunContext& ctx) {
  const ServingConfig config = load_serving_config(root);
  // What runs on the sim backend only is said first, whatever the machine.
  if (ctx.cuda && config.parallel.sizes.data > 1)
    root["parallel"]["data_parallel_size"].fail(
        "--backend cuda runs one engine (its ranks under tensor parallelism); data-parallel "
        "replicas run on the sim backend only");
  if (ctx.cuda && config.parallel.sizes.pipeline > 1)
    root["parallel"]["pipeline_parallel_size"].fail(
        "--backend cuda runs one pipeline stage's ranks at most; pipeline-parallel serving runs "
        "on the sim backend only");
  for (size_t i = 0; ctx.cuda && i < config.runs.size(); ++i) {
    if (!config.runs[i].serve.async_scheduling) continue;
    std::optional<ConfigNode> run;
    if (auto runs = root.find("runs")) run = runs->items().at(i);
    async_scheduling_key(root, run).fail(
        "--backend cuda runs each step to its end before scheduling the next; async "
        "scheduling runs on the sim backend only");
  }
  if (ctx.cuda && !refuse_other_gpu(config.gpu)) return kExitConfigError;
  std::string why;
  const bool per_run =
      ctx.serving_run < 0 &&
      runs_in_own_processes(process_per_run_from_name(ctx.process_per_run), config, ctx.cuda, &why);
  if (!why.empty()) {
    std::cerr << "memsim: " << why << "\n";
    return kExitConfigError;
  }
  const uint32_t tp = config.parallel.sizes.tensor;
  if (ctx.cuda && tp > 1 && ctx.rank < 0) {  // one process per rank, this command again
    const int rc = cuda_launch_ranks(tp, config.parallel.comm.nccl_cumem, std::cout);
    return rc == 0 ? 0 : rc == 2 ? kExitConfigError : kExitRunFailure;
  }
  ServingRunHooks hooks;
  if (ctx.cuda) {  // checked here also when the runs go to processes of their own
    auto made = cuda_serving_hooks_for(config, ctx.rank, ctx.nccl_id);
    if (!made.ok()) {
      std::cerr << "memsim: --backend cuda: " << made.error().message << "\n";
      return kExitConfigError;
    }
    hooks = std::move(made).value();
  }
  if (ctx.serving_run >= 0)
    return serve_one_run(config, ctx.serving_run, hooks, ctx.serving_result,
                         serving_inputs_digest(root, config), ctx.serving_digest);
  std::optional<RunProcesses> processes;
  if (per_run) {
    if (ctx.cuda) cuda_release_device();  // the runs' processes get the whole GPU
    processes.emplace(own_command_line(), serving_inputs_digest(root, config));
    hooks = ServingRunHooks();
    hooks.serial = true;
    hooks.run_elsewhere = [&processes](size_t i, ServingRunResult& o) { processes->run(i, o); };
  }
  // Ranks other than 0 write their outputs to a folder of their own, removed at the end (their
  // tables are in their log); rank 0's are the run's.
  const TempFolder rank_out(ctx.rank > 0);
  if (ctx.rank > 0 && rank_out.path.empty()) {
    std::cerr << "memsim: rank " << ctx.rank << ": cannot make a temporary folder\n";
    return kExitRunFailure;
  }
  OutputDir dir(ctx.rank > 0 ? rank_out.path : ctx.out_dir, config.experiment);
  // A progress line on a terminal (stderr) for long runs; nothing otherwise.
  TerminalProgress progress(config, std::cerr, isatty(STDERR_FILENO) != 0);
  hooks.progress = progress.hook();
  ServingResults results = run_serving_experiment(config, hooks);
  results.process_per_run = per_run;
  std::cout << format_serving_table(config, results, ctx.explain);
  write_serving_outputs(config, results, dir);
  dir.add_note(plot_serving(config, dir));
  int rc = 0;
  for (const auto& r : results.runs)
    if (!r.result.error.empty()) rc = kExitRunFailure;
  if (ctx.cuda) rc = cuda_serving_report(config, results, dir, std::cout);
  return finish(dir, rc);
}

// experiments/shapes.yaml: CUDA-graph memory across batch shapes; with --backend cuda the table
// slice is captured again on the GPU.
int run_shapes_experiment(const ConfigNode& root, const RunContext& ctx) {
  const ShapesConfig config = load_shapes_config(root);
  if (ctx.cuda && !refuse_other_gpu(config.gpu)) return kExitConfigError;
  OutputDir dir(ctx.out_dir, config.experiment);
  const ShapesResults results = run_shapes(config);
  std::cout << format_shapes_table(config, results, ctx.explain);
  write_shapes_outputs(config, results, dir);
  if (!results.snapshots.empty())
    dir.add_note(
        fmt::format("wrote {} allocator timelines as PyTorch snapshots: {}/snapshots/ "
                    "(open them in pytorch.org/memory_viz, or memsim replay them)",
                    results.snapshots.size(), dir.path()));
  for (const std::string& note : results.snapshot_notes) dir.add_note("  " + note);
  dir.add_note(plot_shapes(config, dir));
  int rc = 0;
  for (const auto& r : results.runs)
    if (!r.result.invariant_violation.empty()) rc = kExitRunFailure;
  if (ctx.cuda && rc == 0) rc = cuda_shapes_validation(config, results, dir, std::cout);
  return finish(dir, rc);
}

int run_allocators(const ConfigNode& root, const RunContext& ctx) {
  const AllocatorsConfig config = load_allocators_config(root);
  OutputDir dir(ctx.out_dir, config.experiment);
  const int rc = run_allocators_experiment(config, dir, std::cout, std::cerr, ctx.explain);
  return finish(dir, rc);
}

int run_rl(const ConfigNode& root, const RunContext& ctx) {
  const RlConfig config = load_rl_config(root);
  if (ctx.cuda && !refuse_other_gpu(config.gpu)) return kExitConfigError;
  OutputDir dir(ctx.out_dir, config.experiment);
  int rc = run_rl_experiment(config, dir, std::cout, std::cerr, ctx.explain);
  if (ctx.cuda) {
    const int cuda_rc = cuda_rl_run(config, dir, std::cout, std::cerr);
    if (rc == 0) rc = cuda_rc;
  }
  return finish(dir, rc);
}

// experiments/tp_memory.yaml: each rank's memory under tensor parallelism (simulation only).
int run_tp_memory_experiment(const ConfigNode& root, const RunContext& ctx) {
  const TpMemoryConfig config = load_tp_memory_config(root);
  OutputDir dir(ctx.out_dir, config.experiment);
  const TpMemoryResults results = run_tp_memory(config);
  std::cout << format_tp_memory_table(config, results, ctx.explain);
  write_tp_memory_outputs(config, results, dir);
  const int rc = ctx.cuda ? cuda_tp_memory(config, results, dir, std::cout) : 0;
  return finish(dir, rc);
}

}  // namespace

const std::vector<ExperimentKind>& experiment_kinds() {
  static const std::vector<ExperimentKind> kKinds = {
      {"allocators", [](const ConfigNode& r) { return is_allocators_config(r); },
       [](const ConfigNode& r) { return load_allocators_config(r).experiment; }, run_allocators},
      {"rl", [](const ConfigNode& r) { return is_rl_config(r); },
       [](const ConfigNode& r) { return load_rl_config(r).experiment; }, run_rl},
      {"tp_memory", [](const ConfigNode& r) { return is_tp_memory_config(r); },
       [](const ConfigNode& r) { return load_tp_memory_config(r).experiment; },
       run_tp_memory_experiment},
      {"serving", [](const ConfigNode& r) { return is_serving_config(r); },
       [](const ConfigNode& r) { return load_serving_config(r).experiment; }, run_serving},
      {"shapes", [](const ConfigNode&) { return true; },
       [](const ConfigNode& r) { return load_shapes_config(r).experiment; }, run_shapes_experiment},
  };
  return kKinds;
}

const ExperimentKind& experiment_kind(const ConfigNode& root) {
  for (const ExperimentKind& k : experiment_kinds())
    if (k.matches(root)) return k;
  return experiment_kinds().back();
}

ConfigNode load_experiment_root(const std::string& path, const std::vector<std::string>& overrides,
                                const std::string& base_dir,
                                const std::vector<std::string>& unsets) {
  ConfigNode root = ConfigNode::load_file(path, base_dir);
  for (const std::string& u : unsets) root.apply_unset(u);
  for (const std::string& o : overrides) root.apply_override(o);
  return root;
}

std::string validate_experiment(const ConfigNode& root) {
  return experiment_kind(root).validate(root);
}

}  // namespace memsim
