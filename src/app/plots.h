// Plots drawn by the matplotlib scripts in tools/, started without a shell, found only in this
// installation (never beside a config file or in the current folder).
#pragma once

#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

#include "src/app/output.h"

namespace memsim {

// Where tools/<script> is looked up, in order: $MEMSIM_ROOT/tools (set on purpose), the source
// tree of this binary (build/memsim -> tools/), then the installed copy (bin/memsim ->
// share/memsim/tools/).
std::vector<std::filesystem::path> plot_script_candidates(const std::string& script_name);

// The interpreter that draws: $MEMSIM_PYTHON when set, else the first of the one recorded at
// set-up (meson: MEMSIM_PLOT_PYTHON), python3 on PATH and /usr/bin/python3 that has matplotlib;
// empty (with `*why`) when none has.
std::string plot_python(std::string* why);

// Runs tools/<script_name> with plot_python() on the staged folder of `dir` and `args`, so the
// plots are part of the results committed with it. Returns a status line naming `outputs` in
// dir.path(); plots are optional, so a missing script or matplotlib only skips them.
// MEMSIM_NO_PLOTS (--no-plots) turns them off.
std::string run_plot_script(const std::string& script_name, const OutputDir& dir,
                            const std::vector<std::string>& args,
                            const std::vector<std::string>& outputs);

// `memsim plot KIND ARGS...`: tools/plot_KIND.py ARGS with plot_python(), its output on the
// terminal. Returns its exit status; 2 when there is no such plot, 1 when nothing can draw it.
int run_plot_command(const std::string& kind, const std::vector<std::string>& args,
                     std::ostream& err);

}  // namespace memsim
