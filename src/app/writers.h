// Output writers of the shapes experiment: terminal table, summary.json, curves.csv,
// timeseries.csv, and the matplotlib plot script invocation.
#pragma once

#include <string>
#include <vector>

#include "src/app/shapes_experiment.h"

namespace memsim {

// The readable default table (the config's table slice) plus a one-line-per-variant overview.
std::string format_shapes_table(const ShapesConfig& config, const ShapesResults& results);

// Writes summary.json, curves.csv, timeseries.csv into `dir` (created). Returns an error
// message, or empty on success.
std::string write_shapes_outputs(const ShapesConfig& config, const ShapesResults& results,
                                 const std::string& dir);

// Runs tools/plot_shapes.py when python3 with matplotlib is available; returns a status line.
std::string plot_shapes(const ShapesConfig& config, const std::string& dir);

std::string human_bytes(uint64_t bytes);
// The source tree this binary was built in, guessed from its path (build/memsim -> the
// folder above build/); empty when the path cannot be read.
std::string binary_source_root();
// `s` with JSON's escapes (no surrounding quotes).
std::string json_escape(const std::string& s);

// Runs tools/<script_name> (found beside the config's experiments/ folder, MEMSIM_ROOT or the
// current folder) with python3 + matplotlib on `dir` and `args`; returns a status line naming
// `outputs` on success.
std::string run_plot_script(const std::string& config_source, const std::string& script_name,
                            const std::string& dir, const std::vector<std::string>& args,
                            const std::vector<std::string>& outputs);

}  // namespace memsim
