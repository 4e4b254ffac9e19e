// Gauge recorder: named time series stored only when their value changes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/sample_log.h"

namespace memsim {

// Series are interned once (series()); set() is O(1) and appends a sample only if the value
// differs from the series' last one, so long runs stay small; samples are packed (SampleLog, a
// few bytes each). Peaks are tracked per series.
class MetricsRecorder {
 public:
  using SeriesId = uint32_t;
  using Sample = GaugeSample;

  explicit MetricsRecorder(const SimClock& clock) : clock_(clock) {}

  SeriesId series(std::string_view name);
  void set(SeriesId id, double value);
  void set(std::string_view name, double value) { set(series(name), value); }

  const SampleLog& samples() const { return samples_; }
  // Moves the samples out (the recorder keeps none).
  SampleLog take_samples() { return std::exchange(samples_, SampleLog()); }
  const std::string& name(SeriesId id) const { return names_[id]; }
  size_t series_count() const { return names_.size(); }
  double last(SeriesId id) const { return last_[id]; }
  double peak(SeriesId id) const { return peak_[id]; }
  // Peak of a series by name; 0 if the series was never set.
  double peak(std::string_view name) const;

 private:
  const SimClock& clock_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, SeriesId> ids_;
  std::vector<double> last_;
  std::vector<double> peak_;
  std::vector<bool> seen_;
  SampleLog samples_;
};

}  // namespace memsim
