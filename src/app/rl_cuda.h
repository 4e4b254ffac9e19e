// memsim --config experiments/rl_colocation.yaml --backend cuda: the co-located runs' timelines
// on the GPU with real memory, device used bytes (cudaMemGetInfo) against the simulated bytes at
// every phase boundary, and the saver's measured pause and resume times next to the simulated.
#pragma once

#include <iosfwd>
#include <string>

#include "src/app/output.h"
#include "src/rl/rl_timeline.h"

namespace memsim {

// Runs every co-located model x run on CUDA device 0 (one after another; separate-GPU runs and
// runs whose simulated pinned host memory exceeds half the machine's memory are skipped and
// said so), prints a table, writes DIR/cuda_rl.csv. Returns 0 when every run that ran had the
// device's used bytes equal to the simulated ones at every phase boundary, valid graphs and
// nothing left after teardown, and the same outcome as the simulation.
int run_rl_on_cuda(const RlConfig& c, OutputDir& dir, std::ostream& out, std::ostream& err);

}  // namespace memsim
