// Pricing of backend primitives from a GpuSpec's cost terms.
#include "backends/sim/cost_model.h"

#include <cmath>

namespace memsim {

SimTime GpuSpec::price(Primitive p, uint64_t handles, uint64_t bytes) const {
  const CostTerm& c = cost(p);
  const double granules =
      granularity ? static_cast<double>((bytes + granularity - 1) / granularity) : 0.0;
  double us =
      c.per_call_us + c.per_handle_us * static_cast<double>(handles) + c.per_granule_us * granules;
  if (c.bytes_per_us > 0) us += static_cast<double>(bytes) / c.bytes_per_us;
  return static_cast<SimTime>(std::llround(us * 1000.0));
}

}  // namespace memsim
