// Serving runs in processes of their own: the launcher's side (this command again for each run,
// which hands its outcome back as JSON) and the side of the process that runs one.
//
// Why: on an H200, once a process had made the model step twice, every later model step ran the
// same kernels 3-4% slower (docs/results/serving-measured.md), so with --backend cuda the runs
// after the first measured slow. A process per run measures each as the first.
#pragma once

#include <string>
#include <vector>

#include "src/config/config_node.h"
#include "src/serve/serving_experiment.h"

namespace memsim {

// --process-per-run: auto (each run its own process with --backend cuda on one GPU when there is
// more than one run), on, off.
enum class ProcessPerRun { kAuto, kOn, kOff };
const std::vector<std::string>& process_per_run_names();           // "auto", "on", "off"
ProcessPerRun process_per_run_from_name(const std::string& name);  // one of those names

// Whether the runs of `config` get a process each. Sets `*why` (and returns false) when `mode`
// asks for it where it cannot be: tensor-parallel runs on the GPU, whose ranks already run in
// processes of their own.
bool runs_in_own_processes(ProcessPerRun mode, const ServingConfig& config, bool cuda,
                           std::string* why);

// A digest of what a run's process reads again and must find unchanged: the config as loaded
// (after --set and --unset), every request set, and the step-profile files. Hex.
std::string serving_inputs_digest(const ConfigNode& root, const ServingConfig& config);

// A run's process, first thing: ends with its launcher (PR_SET_PDEATHSIG). False (said why on
// stderr) when `launcher` is no longer its parent: it ended before that could be set.
bool attach_to_launcher(long launcher);

// The launcher: run `index` of the experiment as this command again (`argv`, from
// own_command_line()) with --serving-run INDEX --serving-result FILE --serving-launcher PID
// --serving-digest DIGEST, its output going to this process's; its outcome read back into `o`
// (result, replicas and assigned, all or nothing). A process that fails, or an outcome that
// cannot be read, is the run's error (o.result.error), naming how it ended.
class RunProcesses {
 public:
  RunProcesses(std::vector<std::string> argv, std::string digest);
  ~RunProcesses();  // removes the folder of outcomes
  RunProcesses(const RunProcesses&) = delete;
  RunProcesses& operator=(const RunProcesses&) = delete;
  void run(size_t index, ServingRunResult& o);

 private:
  std::vector<std::string> argv_;
  std::string digest_;
  std::string folder_;  // a temporary folder for the outcomes, in $TMPDIR or /tmp ("": none)
};

// A run's process: config.runs[index] alone, with `hooks` (and a progress line of its own on a
// terminal); its outcome written atomically to `path`. Returns 0 when the outcome was written
// (whatever the run's own result, which the launcher reports), 1 when it could not be, 2 when
// `index` names no run or `digest` (this process's inputs) is not `launcher_digest` (a file
// changed since the launcher read it).
int serve_one_run(ServingConfig config, int index, ServingRunHooks hooks, const std::string& path,
                  const std::string& digest, const std::string& launcher_digest);

}  // namespace memsim
