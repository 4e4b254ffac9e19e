// memsim sweep / memsim merge: a grid of points over any experiment's config keys, each point
// run as its own memsim process from its own resolved config (in parallel, resumable by config
// hash, shardable over a Slurm job array), and the points' summaries gathered into one sweep.csv.
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
//       scheduler.max_num_batched_tokens: [4096, 8192]
//       engine.gpu_memory_utilization: [0.8, 0.9]
// Throws ConfigError naming the file, line and key (or the flag).
std::vector<SweepAxis> parse_grid(const ConfigNode& root, const std::vector<std::string>& flags);
// The product of the axes, the first axis varying slowest; point i is numbered i.
std::vector<SweepPoint> expand_grid(const std::vector<SweepAxis>& axes);

// A point made concrete: the experiment YAML with the --set overrides and the point's
// assignments applied, as the text its process runs, and what identifies it.
struct ResolvedPoint {
  SweepPoint point;
  std::string config_text;  // written to the point's config.yaml and run from there
  std::string hash;         // of the text and the folder its relative paths resolve from
  std::string experiment;   // its results folder, DIR/points/pNNNNN/<experiment>/
  std::string error;        // non-empty: the point is invalid (the typed loader's message)
};

// Resolves and validates every point of `root` (the experiment YAML as read once, relative
// paths resolving from root.base_dir()).
std::vector<ResolvedPoint> resolve_points(const ConfigNode& root,
                                          const std::vector<SweepPoint>& points,
                                          const std::vector<std::string>& sets);

// What a sweep folder records of its grid (grid.json), enough for `merge` and for resume.
struct SweepRecord {
  std::vector<std::string> keys;  // the swept keys, in axis order (sweep.csv's columns)
  struct Point {
    size_t index = 0;
    std::vector<std::string> values;  // the swept keys' values
    std::string hash;
    std::string experiment;
  };
  std::vector<Point> points;
  std::string grid_hash;  // of every point's hash: two sweeps agree when it is equal
};

// How far a point got: complete only when its status says done for this config hash and its
// summary.json parses; else why it must run (again).
struct PointState {
  bool complete = false;
  std::string why;  // "new", "failed before", "config changed", "outputs missing", ...
};
PointState point_state(const std::string& sweep_dir, const SweepRecord::Point& p);
std::string point_dir(const std::string& sweep_dir, size_t index);

// The record of resolved, valid points (their hashes, the grid's hash over them).
SweepRecord make_sweep_record(const std::vector<SweepAxis>& axes,
                              const std::vector<ResolvedPoint>& points);

// sweep.csv from `record` and the complete points' summaries, written atomically; returns the
// number of complete points. Throws OutputError (a write, or an unreadable summary).
size_t write_sweep_csv(const std::string& dir, const SweepRecord& record);
// grid.json <-> SweepRecord (the file also carries the config's path, --set and the axes).
std::string grid_json_text(const SweepRecord& record, const std::string& config,
                           const std::vector<std::string>& sets,
                           const std::vector<SweepAxis>& axes);
// Reads DIR/grid.json, checking every field's type; throws OutputError naming the file.
SweepRecord read_grid_json(const std::string& dir);

struct SweepOptions {
  std::string config;
  std::vector<std::string> axes;    // --sweep
  std::vector<std::string> sets;    // --set, applied to every point
  std::vector<std::string> unsets;  // --unset, applied to every point (before the --set values)
  unsigned jobs = 0;                // 0: one per core
  std::string out_dir = "results";
  std::string shard;     // "K/N"; empty: SLURM_ARRAY_TASK_ID / _COUNT when set, else all points
  bool slurm = false;    // write DIR/sweep.sbatch instead of running
  bool submit = false;   // with slurm: sbatch it
  unsigned tasks = 0;    // with slurm: array tasks (0: min(points, 64))
  bool dry_run = false;  // validate and list the points only
  bool progress = true;  // a progress bar when stderr is a terminal
  bool plots = false;    // points draw their own plots (--no-plots otherwise)
};

// Exit codes: 0 every point of this shard done (and, unsharded, sweep.csv complete); 1 a point
// failed, the sweep was interrupted, or a write failed; 2 bad config, grid or flags (an invalid
// point is reported before any point runs); 130 interrupted by SIGINT.
int run_sweep_command(const SweepOptions& o, std::ostream& out, std::ostream& err);
// Gathers DIR/points/*/ into DIR/sweep.csv (one row per point and run) and draws nothing:
// tools/plot_sweep.py does. Exit 0 when every point is complete, 1 otherwise (sweep.csv then
// holds the complete ones and the message says how many are missing).
int run_merge_command(const std::string& dir, std::ostream& out, std::ostream& err);

}  // namespace memsim
