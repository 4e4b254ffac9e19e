// LatencySamples: a serving run's per-request latencies (TTFT, TPOT, E2E) kept packed for exact
// percentiles: 24 bytes a request, not its whole state.
#pragma once

#include <cstddef>
#include <vector>

#include "core/clock.h"

namespace memsim {

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
};

// TTFT and E2E are kept as the whole ns they are measured in, TPOT as the double in ms it is
// reported in. The figures are exactly those of the doubles (ns / 1e6 for TTFT and E2E) sorted:
// p50/p90/p99 by linear interpolation between closest ranks (numpy's default), the mean summed
// in ascending order. Sorting the ns sorts their doubles too (the conversion is monotonic).
class LatencySamples {
 public:
  void reserve(size_t requests);
  void add_ttft(SimTime ns) { ttft_ns_.push_back(ns); }
  void add_e2e(SimTime ns) { e2e_ns_.push_back(ns); }
  void add_tpot_ms(double ms) { tpot_ms_.push_back(ms); }
  // Adds every sample of `other` (several engines' requests, for their merged percentiles).
  void append(const LatencySamples& other);

  // Each sorts its samples in place.
  Percentiles ttft_ms();
  Percentiles e2e_ms();
  Percentiles tpot_ms();

 private:
  std::vector<SimTime> ttft_ns_, e2e_ns_;
  std::vector<double> tpot_ms_;
};

}  // namespace memsim
