// Measures a StepProfile on the GPU: ModelStep over a decode grid (batch x context) and a prefill
// grid (chunk x cached prefix), on a paged KV pool of its own (CUDA builds).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "src/exec/model_step.h"
#include "workload/executor_program.h"
#include "workload/measured_steps.h"
#include "workload/step_profile.h"

namespace memsim {

struct ProfileGrid {
  std::vector<uint32_t> batches = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
  std::vector<uint32_t> contexts = {128, 512, 2048, 8192, 32768};
  std::vector<uint32_t> chunks = {16, 64, 256, 1024, 2048, 4096, 8192};
  std::vector<uint32_t> prefixes = {0, 1024, 4096, 16384, 32768};
  uint32_t block_size = 16;
  uint32_t reps = 5;  // timed steps per point (the median is kept), after one warm-up
  // KV pool; 0 = free device memory less `headroom` (under TP, the least free over the ranks)
  uint64_t pool_bytes = 0;
  uint64_t headroom = 8ull << 30;
  uint64_t seed = 1;  // the random order in which tables take the pool's blocks
  // Decode steps as captured CUDA graphs (one per batch row, captured for contexts up to
  // graph_context_for(contexts.back()), as the serving executor captures its sizes), as vLLM and
  // SGLang run them; prefill chunks stay eager, as theirs do.
  bool graphs = false;
};

// Runs the grid (points whose KV does not fit the pool are left out of their row; a row with no
// point is dropped) and returns the profile; one line per point goes to `log`.
Result<StepProfile> measure_step_profile(ModelStep& step, Backend& backend, const ProfileGrid& grid,
                                         std::ostream& log);

// Times each step (its sequences) in isolation on the grid's pool and timer, as the grid's
// points are timed: tables over blocks in the grid's random order, the median GPU time of
// grid.reps steps after one warm-up (grid.reps, block_size, pool_bytes, headroom and seed
// apply). The times in ms, one per step; an error names the first step outside the model
// step's sizes or the pool.
Result<std::vector<double>> measure_steps(ModelStep& step, Backend& backend,
                                          const ProfileGrid& grid,
                                          const std::vector<std::vector<SeqWork>>& steps,
                                          std::ostream& log);

// This GPU's speed against a profile measured on another of its kind: the profile's whole grid
// (its rows that the step takes, at every point of any row) timed again, eagerly and in
// calibrate --model's order, compared by profile_speed. The whole grid, not a few points of it:
// a step's time depends on the power the GPU draws, which a grid of seconds builds up (an H200
// reaches its 700 W cap, SM clock about 1,575 MHz, from the grid's fourth second on, where a
// two-second grid runs at 1,980 MHz), so only the same grid in the same order compares GPUs
// rather than power states.
Result<SpeedProbe> probe_profile_speed(ModelStep& step, Backend& backend,
                                       const StepProfile& profile, std::ostream& log);

}  // namespace memsim
