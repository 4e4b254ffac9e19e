// The RL co-location experiment (experiments/rl_colocation.yaml): loader, table, outputs.
#pragma once

#include <iosfwd>
#include <span>
#include <string>
#include <vector>

#include "src/app/legend.h"
#include "src/app/output.h"
#include "src/config/config_keys.h"
#include "src/config/config_node.h"
#include "src/rl/rl_timeline.h"

namespace memsim {

// A config with top-level `train:` and `rollout:` maps.
bool is_rl_config(const std::string& path);
bool is_rl_config(const ConfigNode& root);
// The maps of an RL config and the keys each accepts (docs/config.md lists them).
const ConfigKeys& rl_config_keys();
// Throws ConfigError naming file, line and key.
RlConfig load_rl_config(const std::string& path, const std::vector<std::string>& overrides);
// The same from a loaded tree whose overrides are applied (paths resolve from its base_dir()).
RlConfig load_rl_config(const ConfigNode& root);

// The title, one table per model, its legend with `explain` (else a footer pointing to it) and
// the pause / resume split by primitive.
std::string format_rl_table(const RlConfig& c, const RlResults& r, bool explain = false);
// The RL table's columns (its two header lines and legend), and their section of docs/tables.md.
std::span<const ColumnDoc> rl_columns();
inline constexpr std::string_view kRlAnchor = "rl-co-location";
// summary.json, phases.csv, timeseries.csv (time, run, gpu, phase, tag, bytes) into `dir`'s
// staging folder; throws OutputError.
void write_rl_outputs(const RlConfig& c, const RlResults& r, OutputDir& dir);

// Runs, prints, writes `dir` (uncommitted: the caller commits) and the timeline plot. Exit
// code: 0, or 1 when a run failed other than by running out of memory.
int run_rl_experiment(const RlConfig& c, OutputDir& dir, std::ostream& out, std::ostream& err,
                      bool explain = false);

}  // namespace memsim
