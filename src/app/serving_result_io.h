// A serving run's result as JSON and back, every field exactly (doubles bit for bit): how a run
// measured in a process of its own hands its result to the process that reports the experiment.
#pragma once

#include <string>
#include <string_view>

#include "src/serve/serving_experiment.h"

namespace memsim {

// The run's outcome: `result`, `replicas` and `assigned` (not `spec` and `budget`, which the
// receiving process makes from the same config). Non-finite doubles are written as strings.
std::string run_outcome_json(const ServingRunResult& run);

// Reads what run_outcome_json wrote into `run`'s result, replicas and assigned. Returns "" or
// what is wrong (not JSON, a key missing, a value of the wrong type), naming the key's path.
std::string read_run_outcome_json(std::string_view text, ServingRunResult& run);

}  // namespace memsim
