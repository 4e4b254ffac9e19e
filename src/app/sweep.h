// memsim sweep / memsim merge: a grid of points over any experiment's config keys, each point
// run as its own memsim process (in parallel, resumable, shardable over a Slurm job array), and
// the points' summaries gathered into one sweep.csv.
#pragma once

#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "src/config/config_node.h"

namespace memsim {

// One axis of the grid: a single key, or a named group of keys that move together (zip).
struct SweepAxis {
  std::string name;
  std::vector<std::string> keys;
  std::vector<std::vector<std::string>> steps;  // steps[i][k]: keys[k]'s value at step i (YAML)
};

struct SweepPoint {
  size_t index = 0;
  std::vector<std::pair<std::string, std::string>> assignments;  // key -> YAML value
};

// The axes of the config's `grid:` section, then those of the `--sweep key=v1,v2,...` flags:
//   grid:
//     scheduler.max_num_seqs: [64, 128]       # an axis (the grid is the product of the axes)
//     block:                                  # a named group: its keys move together (zip)
//       kv.block_size: [16, 32]
//       engine.budget_block_size: [16, 32]
// Throws ConfigError naming the file, line and key (or the flag).
std::vector<SweepAxis> parse_grid(const ConfigNode& root, const std::vector<std::string>& flags);
// The product of the axes, the first axis varying slowest; point i is numbered i.
std::vector<SweepPoint> expand_grid(const std::vector<SweepAxis>& axes);

// Loads `path` with its experiment's typed loader (allocators, RL, serving or shapes, chosen as
// main() chooses), discarding the result; throws ConfigError for any bad input.
void load_experiment_config(const std::string& path, const std::vector<std::string>& overrides);

struct SweepOptions {
  std::string config;
  std::vector<std::string> axes;  // --sweep
  std::vector<std::string> sets;  // --set, applied to every point
  unsigned jobs = 0;              // 0: one per core
  std::string out_dir = "results";
  std::string shard;     // "K/N"; empty: SLURM_ARRAY_TASK_ID / _COUNT when set, else all points
  bool slurm = false;    // write DIR/sweep.sbatch instead of running
  bool submit = false;   // with slurm: sbatch it
  unsigned tasks = 0;    // with slurm: array tasks (0: min(points, 64))
  bool dry_run = false;  // validate and list the points only
  bool progress = true;  // a progress bar when stderr is a terminal
  bool plots = false;    // points draw their own plots (--no-plots otherwise)
};

// Exit codes: 0 all points of this shard done; 1 some point failed; 2 bad config or grid (an
// invalid point is reported before any point runs).
int run_sweep_command(const SweepOptions& o, std::ostream& out, std::ostream& err);
// Gathers DIR/points/*/ into DIR/sweep.csv (one row per point and run) and draws nothing:
// tools/plot_sweep.py does. Exit 0, or 1 when no point is complete / DIR is not a sweep.
int run_merge_command(const std::string& dir, std::ostream& out, std::ostream& err);

}  // namespace memsim
