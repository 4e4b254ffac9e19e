// memsim-model-bench --replay-steps: the steps a measured serving run timed (its steps.csv),
// timed again one by one in isolation, as calibrate times its grid, to tell a step-time model's
// error (the profile against isolated steps) from what serving adds (isolated against served).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "src/exec/model_step.h"
#include "src/exec/step_profiler.h"

namespace memsim::bench {

struct ReplayOptions {
  std::string steps_csv;  // empty: no replay
  std::string out_csv;    // the steps with their isolated times; empty: none written
  std::vector<std::string> classes = {"mixed", "prefill"};
  uint32_t limit = 0;  // the first N steps of those classes (0: all)
  void add_options(CLI::App& app);
};

// Reads, rebuilds (sequences_of), times and reports; the exit code (2: the file or a step is
// unusable, 1: the GPU failed or the output could not be written).
int replay_steps(ModelStep& step, Backend& backend, const ProfileGrid& grid,
                 const ReplayOptions& options);

}  // namespace memsim::bench
