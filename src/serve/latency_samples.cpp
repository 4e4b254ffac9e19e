// LatencySamples: percentiles of sorted samples read through a conversion to ms.
#include "src/serve/latency_samples.h"

#include <algorithm>
#include <cmath>

namespace memsim {
namespace {

// Percentiles of the n values value(0) <= ... <= value(n - 1).
template <class Value>
Percentiles sorted_percentiles(size_t n, Value value) {
  Percentiles p;
  if (n == 0) return p;
  auto at = [&](double q) {  // linear interpolation between closest ranks (numpy's default)
    const double pos = q * static_cast<double>(n - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, n - 1);
    return value(lo) + (value(hi) - value(lo)) * (pos - static_cast<double>(lo));
  };
  p.p50 = at(0.5);
  p.p90 = at(0.9);
  p.p99 = at(0.99);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += value(i);
  p.mean = sum / static_cast<double>(n);
  return p;
}

Percentiles ns_percentiles_ms(std::vector<SimTime>& ns) {
  std::sort(ns.begin(), ns.end());
  return sorted_percentiles(ns.size(), [&](size_t i) { return double(ns[i]) / 1e6; });
}

}  // namespace

void LatencySamples::append(const LatencySamples& other) {
  ttft_ns_.insert(ttft_ns_.end(), other.ttft_ns_.begin(), other.ttft_ns_.end());
  e2e_ns_.insert(e2e_ns_.end(), other.e2e_ns_.begin(), other.e2e_ns_.end());
  tpot_ms_.insert(tpot_ms_.end(), other.tpot_ms_.begin(), other.tpot_ms_.end());
}

void LatencySamples::reserve(size_t requests) {
  ttft_ns_.reserve(requests);
  e2e_ns_.reserve(requests);
  tpot_ms_.reserve(requests);
}

Percentiles LatencySamples::ttft_ms() {
  return ns_percentiles_ms(ttft_ns_);
}

Percentiles LatencySamples::e2e_ms() {
  return ns_percentiles_ms(e2e_ns_);
}

Percentiles LatencySamples::tpot_ms() {
  std::sort(tpot_ms_.begin(), tpot_ms_.end());
  return sorted_percentiles(tpot_ms_.size(), [&](size_t i) { return tpot_ms_[i]; });
}

}  // namespace memsim
