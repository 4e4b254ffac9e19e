// Simulated time: nanoseconds since the start of a run, the unit of every clock and cost.
#pragma once

#include <cstdint>

namespace memsim {

using SimTime = int64_t;  // simulated nanoseconds

}  // namespace memsim
