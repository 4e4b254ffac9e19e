// Plot scripts: looked up in this installation, started with an argument vector (no shell).
#include "src/app/plots.h"

#include <fmt/format.h>

#include <cstdlib>

#include "src/app/spawn.h"
#include "src/config/loaders.h"

namespace memsim {

namespace fs = std::filesystem;

std::vector<fs::path> plot_script_candidates(const std::string& script_name) {
  std::vector<fs::path> out;
  for (const fs::path& root : installation_roots()) out.push_back(root / "tools" / script_name);
  return out;
}

std::string run_plot_script(const std::string& script_name, const OutputDir& dir,
                            const std::vector<std::string>& args,
                            const std::vector<std::string>& outputs) {
  if (const char* off = std::getenv("MEMSIM_NO_PLOTS"); off != nullptr && *off != '\0')
    return "plots skipped (--no-plots)";
  std::string os_reason;  // plots are optional: a missing script only skips them
  const auto script = first_regular_file(plot_script_candidates(script_name), &os_reason);
  if (!script)
    return fmt::format("plots skipped: tools/{} not found in this installation (or MEMSIM_ROOT)",
                       script_name);
  const SpawnOptions quiet{"/dev/null", "/dev/null", ""};
  for (const char* py : {"python3", "/usr/bin/python3"}) {
    std::string why;
    if (run_process({py, "-c", "import matplotlib"}, quiet, &why) != 0) continue;
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
  return "plots skipped: no python3 with matplotlib (apt-get install python3-matplotlib)";
}

}  // namespace memsim
