// memsim replay --backend cuda: the same allocators on the GPU, reserved bytes against
// cudaMemGetInfo after every op.
#pragma once

#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "backends/sim/cost_model.h"
#include "workload/alloc_trace.h"
#include "src/alloc/registry.h"
#include "src/app/output.h"

namespace memsim {

// Replays `trace` on the GPU through each allocator. Prints, per allocator, how many ops had
// the device's used bytes (cudaMemGetInfo, from before the replay) equal to the allocator's
// reserved bytes, the largest difference, and what is left after teardown; writes
// DIR/cuda_replay.csv. Returns 0 when every allocator matched at every op and left nothing.
int replay_on_cuda(const AllocTrace& trace,
                   const std::vector<std::pair<std::string, AllocatorFactory>>& allocators,
                   const GpuSpec& gpu, OutputDir& dir, std::ostream& out, std::ostream& err);

}  // namespace memsim
