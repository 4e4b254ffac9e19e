// `--backend cuda` for the shapes experiment: runs every strategy on the real GPU through the
// CUDA backend, replays the graphs with content checks, and compares with the simulation.
#pragma once

#include <ostream>
#include <string>

#include "backends/result.h"
#include "src/app/output.h"
#include "src/app/shapes_experiment.h"

namespace memsim {

// Checks that a CUDA device can be used; the message says why not.
Status probe_cuda_device();

// Runs the table slice of `config` for every strategy on the GPU, prints the comparison to
// `out`, writes DIR/validation.csv. Returns 0 when every check passed, 1 otherwise, 2 when no
// GPU could be used.
int run_cuda_validation(const ShapesConfig& config, const ShapesResults& simulated, OutputDir& dir,
                        std::ostream& out);

}  // namespace memsim
