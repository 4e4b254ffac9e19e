// Gauge recorder implementation (record-on-change).
#include "core/metrics.h"

#include <algorithm>

namespace memsim {

MetricsRecorder::SeriesId MetricsRecorder::series(std::string_view name) {
  auto it = ids_.find(std::string(name));
  if (it != ids_.end()) return it->second;
  const auto id = static_cast<SeriesId>(names_.size());
  names_.emplace_back(name);
  ids_.emplace(std::string(name), id);
  last_.push_back(0);
  peak_.push_back(0);
  seen_.push_back(false);
  return id;
}

void MetricsRecorder::set(SeriesId id, double value) {
  if (seen_[id] && last_[id] == value) return;
  seen_[id] = true;
  last_[id] = value;
  peak_[id] = std::max(peak_[id], value);
  samples_.push_back(Sample{clock_.now(), id, value});
}

double MetricsRecorder::peak(std::string_view name) const {
  auto it = ids_.find(std::string(name));
  return it == ids_.end() ? 0.0 : peak_[it->second];
}

}  // namespace memsim
