// Output writers of serving experiments: the comparison table, the KV budget breakdown,
// summary.json, curves.csv (one row per run), timeseries.csv, and plots via tools/plot_kv.py.
#pragma once

#include <string>

#include "src/app/output.h"
#include "src/serve/serving_experiment.h"

namespace memsim {

std::string format_serving_table(const ServingConfig& config, const ServingResults& results);
// Writes summary.json, timing.json, curves.csv, timeseries.csv (and snapshots/) into `dir`'s
// staging folder; throws OutputError.
void write_serving_outputs(const ServingConfig& config, const ServingResults& results,
                           OutputDir& dir);
std::string plot_serving(const ServingConfig& config, const OutputDir& dir);

}  // namespace memsim
