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
#include <string_view>

#include <yaml-cpp/yaml.h>

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

namespace {

// FNV-1a, 64 bits: a digest to tell "the same inputs" apart from "changed", not a secure hash.
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(std::string_view bytes) {
    for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  }
  template <class T>
  void add_value(const T& v) {
    add(std::string_view(reinterpret_cast<const char*>(&v), sizeof v));
  }
};

std::string yaml_text(const YAML::Node& n) {
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

}  // namespace

std::string serving_inputs_digest(const ConfigNode& root, const ServingConfig& config) {
  Fnv f;
  f.add(yaml_text(root.raw()));
  for (const RequestSet& set : config.request_sets)
    for (size_t i = 0; i < set.requests.size(); ++i) {
      const RequestSpec r = set.requests[i];
      for (uint64_t v : {uint64_t(r.id), uint64_t(r.arrival), uint64_t(r.prompt_tokens),
                         uint64_t(r.output_tokens), uint64_t(int64_t(r.prefix_group)),
                         uint64_t(r.prefix_tokens), uint64_t(r.n), uint64_t(r.beam_width)})
        f.add_value(v);
    }
  for (const auto& [dtype, profiles] : config.profiles)
    for (const std::string& path : {profiles.path, profiles.graph_path}) {
      std::ifstream in(path, std::ios::binary);
      std::stringstream bytes;
      if (in.is_open()) bytes << in.rdbuf();
      f.add(path);
      f.add(in.is_open() ? bytes.str() : std::string("(none)"));
    }
  return fmt::format("{:016x}", f.h);
}

bool attach_to_launcher(long launcher) {
  (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (static_cast<long>(getppid()) == launcher) return true;
  std::cerr << fmt::format(
      "memsim: --serving-launcher {}: the launcher is not this process's parent (it ended); "
      "nothing run\n",
      launcher);
  return false;
}

RunProcesses::RunProcesses(std::vector<std::string> argv, std::string digest)
    : argv_(std::move(argv)), digest_(std::move(digest)) {
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
  argv.insert(argv.end(),
              {"--serving-run", std::to_string(index), "--serving-result", path,
               "--serving-launcher", std::to_string(getpid()), "--serving-digest", digest_});
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
  ServingRunResult got;  // read whole, then taken: a bad outcome leaves nothing of itself
  if (std::string bad = read_run_outcome_json(text.str(), got); !bad.empty()) {
    o.result.error = fmt::format("its process's outcome cannot be read: {}", bad);
    return;
  }
  if (got.result.label != o.spec.label) {
    o.result.error =
        fmt::format("its process ran run '{}', not '{}'", got.result.label, o.spec.label);
    return;
  }
  o.result = std::move(got.result);
  o.replicas = std::move(got.replicas);
  o.assigned = std::move(got.assigned);
}

int serve_one_run(ServingConfig config, int index, ServingRunHooks hooks, const std::string& path,
                  const std::string& digest, const std::string& launcher_digest) {
  if (index < 0 || static_cast<size_t>(index) >= config.runs.size() || path.empty()) {
    std::cerr << fmt::format(
        "memsim: --serving-run {} names no run of the config's {} (or --serving-result is "
        "missing); both are set by the launcher\n",
        index, config.runs.size());
    return 2;
  }
  if (digest != launcher_digest) {
    std::cerr << fmt::format(
        "memsim: --serving-run {}: the config, a request trace or a step profile changed since "
        "the launcher read it (inputs {} here, {} there); nothing run\n",
        index, digest, launcher_digest);
    return 2;
  }
  config.runs = {config.runs[static_cast<size_t>(index)]};
  // The run's progress line on a terminal ("run 1/1 LABEL: ..."), as the launcher's would be.
  TerminalProgress progress(config, std::cerr, isatty(STDERR_FILENO) != 0);
  hooks.progress = progress.hook();
  ServingResults results = run_serving_experiment(config, hooks);
  try {
    write_file_atomically(path, run_outcome_json(results.runs.front()));
  } catch (const std::exception& e) {  // OutputError, or a string JSON cannot hold
    std::cerr << "memsim: --serving-run " << index
              << ": its outcome cannot be written: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace memsim
