// Output writers of serving experiments: the comparison table, the KV budget breakdown,
// summary.json, curves.csv (one row per run), timeseries.csv, and plots via tools/plot_kv.py.
#pragma once

#include <string>

#include "src/serve/serving_experiment.h"

namespace memsim {

std::string format_serving_table(const ServingConfig& config, const ServingResults& results);
// Writes summary.json, curves.csv, timeseries.csv into `dir`; an error message or empty.
std::string write_serving_outputs(const ServingConfig& config, const ServingResults& results,
                                  const std::string& dir);
std::string plot_serving(const ServingConfig& config, const std::string& dir);

}  // namespace memsim
