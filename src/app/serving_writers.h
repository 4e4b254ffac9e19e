// Output writers of serving experiments: the comparison table, the KV budget breakdown,
// summary.json, curves.csv (one row per run), timeseries.csv, and plots via tools/plot_kv.py.
#pragma once

#include <span>
#include <string>

#include "src/app/legend.h"
#include "src/app/output.h"
#include "src/serve/serving_experiment.h"

namespace memsim {

// The KV budget breakdowns, the request and step-time lines, and the comparison table; after
// them, the budget's and the table's legends with `explain`, else one footer pointing to them.
std::string format_serving_table(const ServingConfig& config, const ServingResults& results,
                                 bool explain = false);
// The serving table's columns (its header and legend) and the KV budget breakdown's lines (as
// format_kv_budget names them), with their sections of docs/tables.md.
std::span<const ColumnDoc> serving_columns();
std::span<const ColumnDoc> kv_budget_lines();
inline constexpr std::string_view kServingAnchor = "serving-and-kv-experiments";
inline constexpr std::string_view kKvBudgetAnchor = "the-kv-budget-breakdown";
// Writes summary.json, timing.json, curves.csv, timeseries.csv (and snapshots/) into `dir`'s
// staging folder; throws OutputError.
void write_serving_outputs(const ServingConfig& config, const ServingResults& results,
                           OutputDir& dir);
std::string plot_serving(const ServingConfig& config, const OutputDir& dir);

}  // namespace memsim
