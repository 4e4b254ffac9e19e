// Serving runs in processes of their own (serving_processes.h).
#include "src/app/serving_processes.h"

#include <fmt/format.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "src/app/output.h"
#include "src/app/run_progress.h"
#include "src/app/serving_result_io.h"
#include "src/app/spawn.h"

namespace memsim {

const std::vector<std::string>& process_per_run_names() {
  static const std::vector<std::string> names = {"auto", "on", "off"};
  return names;
}

ProcessPerRun process_per_run_from_name(const std::string& name) {
  if (name == "on") return ProcessPerRun::kOn;
  if (name == "off") return ProcessPerRun::kOff;
  if (name == "auto") return ProcessPerRun::kAuto;
  throw std::invalid_argument("process_per_run_from_name: " + name);
}

bool runs_in_own_processes(ProcessPerRun mode, const ServingConfig& config, bool cuda,
                           std::string* why) {
  const bool ranks = cuda && config.parallel.sizes.tensor > 1;
  switch (mode) {
    case ProcessPerRun::kOff:
      return false;
    case ProcessPerRun::kAuto:
      return cuda && !ranks && config.runs.size() > 1;
    case ProcessPerRun::kOn:
      if (ranks)
        *why =
            "--process-per-run on: a tensor-parallel run on the GPU already runs one process per "
            "rank, and its runs share them; use --process-per-run off, or one run per config";
      return !ranks;
  }
  return false;
}

RunProcesses::RunProcesses(std::vector<std::string> argv) : argv_(std::move(argv)) {
  std::error_code ec;
  const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);  // $TMPDIR or /tmp
  std::string pattern =
      ((ec ? std::filesystem::path("/tmp") : tmp) / "memsim-runs-XXXXXX").string();
  if (mkdtemp(pattern.data()) != nullptr) folder_ = pattern;
}

RunProcesses::~RunProcesses() {
  std::error_code ec;
  if (!folder_.empty()) std::filesystem::remove_all(folder_, ec);
}

void RunProcesses::run(size_t index, ServingRunResult& o) {
  o.result.label = o.spec.label;
  if (folder_.empty()) {
    o.result.error = "cannot make a temporary folder for the run's outcome (in $TMPDIR or /tmp)";
    return;
  }
  const std::string path = fmt::format("{}/run{}.json", folder_, index);
  std::vector<std::string> argv = argv_;
  argv.insert(argv.end(), {"--serving-run", std::to_string(index), "--serving-result", path});
  std::cout.flush();  // this process's output so far, before the run's
  std::string why;
  const int status = run_process(argv, SpawnOptions{}, &why);
  if (status != 0) {
    o.result.error =
        status < 0 ? fmt::format("its process could not start: {}", why)
        : status > 128
            ? fmt::format("its process (memsim --serving-run {}) was ended by signal {}", index,
                          status - 128)
            : fmt::format("its process (memsim --serving-run {}) exited {}; its output is above",
                          index, status);
    return;
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  if (in.is_open()) text << in.rdbuf();
  if (!in.is_open() || in.bad()) {
    o.result.error =
        fmt::format("its process (memsim --serving-run {}) left no outcome ({})", index, path);
    return;
  }
  if (std::string bad = read_run_outcome_json(text.str(), o); !bad.empty()) {
    o.result = ServingResult();
    o.result.label = o.spec.label;
    o.result.error = fmt::format("its process's outcome cannot be read: {}", bad);
    return;
  }
  if (o.result.label != o.spec.label && o.result.error.empty())
    o.result.error =
        fmt::format("its process ran run '{}', not '{}'", o.result.label, o.spec.label);
}

int serve_one_run(ServingConfig config, int index, ServingRunHooks hooks, const std::string& path) {
  // A run process ends with its launcher: none is left holding the GPU.
  (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (index < 0 || static_cast<size_t>(index) >= config.runs.size() || path.empty()) {
    std::cerr << fmt::format(
        "memsim: --serving-run {} names no run of the config's {} (or --serving-result is "
        "missing); both are set by the launcher\n",
        index, config.runs.size());
    return 2;
  }
  config.runs = {config.runs[static_cast<size_t>(index)]};
  // The run's progress line on a terminal ("run 1/1 LABEL: ..."), as the launcher's would be.
  TerminalProgress progress(config, std::cerr, isatty(STDERR_FILENO) != 0);
  hooks.progress = progress.hook();
  ServingResults results = run_serving_experiment(config, hooks);
  try {
    write_file_atomically(path, run_outcome_json(results.runs.front()));
  } catch (const OutputError& e) {
    std::cerr << "memsim: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace memsim
