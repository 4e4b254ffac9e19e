// Plot scripts: looked up in this installation, drawn by the interpreter recorded at set-up (or
// MEMSIM_PYTHON), started with an argument vector (no shell); `memsim plot` runs one by hand.
#include "src/app/plots.h"

#include <fmt/format.h>

#include <cstdlib>
#include <optional>
#include <ostream>

#include "memsim_config.h"
#include "src/app/spawn.h"
#include "src/config/loaders.h"

namespace memsim {

namespace fs = std::filesystem;

namespace {

const SpawnOptions kQuiet{"/dev/null", "/dev/null", ""};
constexpr const char* kKnownPlots = "shapes, kv, rl, allocators, sweep";

bool has_matplotlib(const std::string& python) {
  std::string why;
  return run_process({python, "-c", "import matplotlib"}, kQuiet, &why) == 0;
}

}  // namespace

std::vector<fs::path> plot_script_candidates(const std::string& script_name) {
  std::vector<fs::path> out;
  for (const fs::path& root : installation_roots()) out.push_back(root / "tools" / script_name);
  return out;
}

std::string plot_python(std::string* why) {
  if (const char* env = std::getenv("MEMSIM_PYTHON"); env != nullptr && *env != '\0') {
    if (has_matplotlib(env)) return env;
    *why = fmt::format("MEMSIM_PYTHON={} cannot import matplotlib", env);
    return {};
  }
  std::vector<std::string> candidates;
  if (*MEMSIM_PLOT_PYTHON != '\0') candidates.emplace_back(MEMSIM_PLOT_PYTHON);
  candidates.insert(candidates.end(), {"python3", "/usr/bin/python3"});
  for (const std::string& py : candidates)
    if (has_matplotlib(py)) return py;
  *why =
      "no python3 with matplotlib (apt-get install python3-matplotlib, or set MEMSIM_PYTHON to "
      "an interpreter that has it)";
  return {};
}

std::string run_plot_script(const std::string& script_name, const OutputDir& dir,
                            const std::vector<std::string>& args,
                            const std::vector<std::string>& outputs) {
  if (const char* off = std::getenv("MEMSIM_NO_PLOTS"); off != nullptr && *off != '\0')
    return "plots skipped (--no-plots)";
  std::string why;  // plots are optional: a missing script or interpreter only skips them
  const auto script = first_regular_file(plot_script_candidates(script_name), &why);
  if (!script)
    return fmt::format("plots skipped: tools/{} not found in this installation (or MEMSIM_ROOT)",
                       script_name);
  const std::string py = plot_python(&why);
  if (py.empty()) return "plots skipped: " + why;
  std::vector<std::string> argv = {py, script->string(), dir.staging()};
  argv.insert(argv.end(), args.begin(), args.end());
  const int rc = run_process(argv, {"/dev/null", "", ""}, &why);
  if (rc != 0)
    return fmt::format("plots failed: {} {} {}", py, script->string(),
                       rc < 0 ? why : fmt::format("exited with status {}", rc));
  std::string line = "plots:";
  for (size_t i = 0; i < outputs.size(); ++i)
    line += fmt::format("{} {}/{}", i ? "," : "", dir.path(), outputs[i]);
  return line;
}

int run_plot_command(const std::string& kind, const std::vector<std::string>& args,
                     std::ostream& err) {
  // A plain word names a script; a path does not (no `memsim plot ../x`).
  const bool plain =
      !kind.empty() && kind.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") == std::string::npos;
  std::string why;
  std::optional<fs::path> script;
  if (plain) script = first_regular_file(plot_script_candidates("plot_" + kind + ".py"), &why);
  if (!script) {
    err << fmt::format("memsim plot: no plot '{}' (known: {})\n", kind, kKnownPlots);
    return 2;
  }
  const std::string py = plot_python(&why);
  if (py.empty()) {
    err << "memsim plot: " << why << "\n";
    return 1;
  }
  std::vector<std::string> argv = {py, script->string()};
  argv.insert(argv.end(), args.begin(), args.end());
  const int rc = run_process(argv, {"", "", ""}, &why);
  if (rc < 0) {
    err << fmt::format("memsim plot: cannot start {}: {}\n", py, why);
    return 1;
  }
  return rc;
}

}  // namespace memsim
