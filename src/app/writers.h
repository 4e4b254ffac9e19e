// Output writers of the shapes experiment: terminal table, summary.json, curves.csv,
// timeseries.csv, and the plot (tools/plot_shapes.py).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "src/app/legend.h"
#include "src/app/output.h"
#include "src/app/shapes_experiment.h"

namespace memsim {

// The readable default table (the config's table slice) plus a one-line-per-variant overview;
// after the table, its legend with `explain`, else a footer pointing to it.
std::string format_shapes_table(const ShapesConfig& config, const ShapesResults& results,
                                bool explain = false);
// The shapes table's columns (its header and legend), and their section of docs/tables.md.
std::span<const ColumnDoc> shapes_columns();
inline constexpr std::string_view kShapesAnchor = "shapes-the-main-job";

// Writes summary.json, curves.csv, timeseries.csv (and snapshots/) into `dir`'s staging folder;
// throws OutputError.
void write_shapes_outputs(const ShapesConfig& config, const ShapesResults& results, OutputDir& dir);

// Runs tools/plot_shapes.py when python3 with matplotlib is available; returns a status line.
std::string plot_shapes(const ShapesConfig& config, const OutputDir& dir);

std::string human_bytes(uint64_t bytes);
// The source tree this binary was built in, guessed from its path (build/memsim -> the
// folder above build/); empty when the path cannot be read.
std::string binary_source_root();
// `s` with JSON's escapes (no surrounding quotes).
std::string json_escape(const std::string& s);

}  // namespace memsim
