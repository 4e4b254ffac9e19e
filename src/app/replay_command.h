// `memsim replay SNAPSHOT.pickle`: a PyTorch memory snapshot replayed under every caching
// allocator; table, summary.json, timeseries.csv and a plot.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace memsim {

struct ReplayCommandOptions {
  std::string snapshot;
  std::vector<std::string> allocators;  // empty = every registered allocator
  std::vector<std::string> overrides;   // NAME.key=value
  std::string out_dir = "results";      // outputs go to OUT/replay/
  std::string gpu = "h200";             // a name under configs/gpus/ or a path
  int device = 0;
  bool min_capacity = true;  // bisect the smallest capacity per allocator
  std::string export_path;   // write torch_caching's replay as a snapshot pickle here
  bool cuda = false;         // also replay on the GPU, checked against cudaMemGetInfo
  bool explain = false;      // --explain: the table's legend after it (else a footer line)
};

// Returns the process exit code: 0, 1 (a replay failed other than by running out of memory) or
// 2 (bad snapshot or options).
int run_replay_command(const ReplayCommandOptions& options, std::ostream& out, std::ostream& err);

}  // namespace memsim
