// The RL co-location experiment (experiments/rl_colocation.yaml): loader, table, outputs.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "src/rl/rl_timeline.h"

namespace memsim {

// A config with top-level `train:` and `rollout:` maps.
bool is_rl_config(const std::string& path);
// Throws ConfigError naming file, line and key.
RlConfig load_rl_config(const std::string& path, const std::vector<std::string>& overrides);

std::string format_rl_table(const RlConfig& c, const RlResults& r);
// summary.json, phases.csv, timeseries.csv (time, run, gpu, phase, tag, bytes) into `dir`.
std::string write_rl_outputs(const RlConfig& c, const RlResults& r, const std::string& dir);

// Runs, prints, writes OUT/<experiment>/ and the timeline plot. Exit code: 0, or 1 when a run
// failed other than by running out of memory.
int run_rl_experiment(const RlConfig& c, const std::string& out_dir, std::ostream& out,
                      std::ostream& err);

}  // namespace memsim
