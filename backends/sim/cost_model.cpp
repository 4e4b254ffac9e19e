// Pricing of backend primitives from a GpuSpec's cost terms.
#include "backends/sim/cost_model.h"

#include <cmath>

namespace memsim {

double GpuSpec::mappings_feature(uint64_t mappings) const {
  return std::log2(1.0 + static_cast<double>(mappings) / va_mappings_knee);
}

SimTime GpuSpec::price(Primitive p, uint64_t handles, uint64_t bytes, uint64_t mappings,
                       bool first_after_launch) const {
  const CostTerm& c = cost(p);
  const double granules =
      granularity ? static_cast<double>((bytes + granularity - 1) / granularity) : 0.0;
  double us = c.per_call_us + c.per_handle_us * static_cast<double>(handles) +
              c.per_granule_us * granules + c.per_log2_mappings_us * mappings_feature(mappings) +
              (first_after_launch ? c.first_after_launch_us : 0.0);
  if (c.bytes_per_us > 0) us += static_cast<double>(bytes) / c.bytes_per_us;
  return static_cast<SimTime>(std::llround(us * 1000.0));
}

double GpuSpec::end_capture_extra_us(uint64_t nodes) const {
  return (capture_per_node_us + instantiate_per_node_us) * static_cast<double>(nodes);
}

double GpuSpec::launch_extra_us(uint64_t upload_nodes, uint64_t map_granules,
                                uint64_t remap_granules) const {
  return upload_per_node_us * static_cast<double>(upload_nodes) +
         graph_mem_map_per_granule_us * static_cast<double>(map_granules) +
         graph_mem_remap_per_granule_us * static_cast<double>(remap_granules);
}

}  // namespace memsim
