// TerminalProgress: the runs' latest reports, the throttled redraw of one stderr line, and its
// formatting.
#include "src/app/run_progress.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace memsim {

std::string with_thousands(uint64_t value) {
  std::string digits = std::to_string(value);
  for (size_t i = digits.size(); i > 3; i -= 3) digits.insert(i - 3, ",");
  return digits;
}

std::string hms(double seconds) {
  const auto t = static_cast<uint64_t>(std::max(0.0, seconds) + 0.5);
  return fmt::format("{:02d}:{:02d}:{:02d}", t / 3600, (t / 60) % 60, t % 60);
}

std::string format_progress_line(const ProgressView& v) {
  const double f = std::clamp(v.fraction, 0.0, 1.0);
  const std::string eta = f > 0 ? hms(v.elapsed_s * (1 - f) / f) : std::string("--:--:--");
  return fmt::format("run {}/{} {}: {} of {} requests finished, simulated {} s, {}%{}, ETA {}",
                     v.run + 1, v.runs, v.label, with_thousands(v.finished),
                     with_thousands(v.requests),
                     with_thousands(static_cast<uint64_t>(std::max(0.0, v.simulated_s))),
                     static_cast<int>(std::floor(f * 100)), v.runs > 1 ? " of all runs" : "", eta);
}

TerminalProgress::TerminalProgress(const ServingConfig& config, std::ostream& err, bool tty,
                                   Clock clock)
    : err_(err), tty_(tty), clock_(std::move(clock)) {
  if (!clock_) {
    clock_ = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
  }
  for (const ServingRunSpec& r : config.runs) {
    labels_.push_back(r.label);
    EngineProgress p;
    p.requests = config.request_sets.empty() ? 0 : config.request_sets[r.requests].requests.size();
    runs_.push_back(p);
  }
  ended_.assign(runs_.size(), false);
  start_ = clock_();
}

TerminalProgress::~TerminalProgress() {
  clear();
}

std::function<void(size_t, const EngineProgress&)> TerminalProgress::hook() {
  if (!tty_) return {};
  return [this](size_t run, const EngineProgress& p) { update(run, p); };
}

void TerminalProgress::update(size_t run, const EngineProgress& p) {
  if (!tty_ || run >= runs_.size()) return;
  std::lock_guard<std::mutex> lock(mu_);
  runs_[run] = p;
  if (p.finished >= p.requests) ended_[run] = true;
  if (std::all_of(ended_.begin(), ended_.end(), [](bool e) { return e; })) {
    clear_locked();
    return;
  }
  const double now = clock_();
  if (now - start_ < kFirstDrawS || (last_draw_ >= 0 && now - last_draw_ < kRedrawS)) return;
  last_draw_ = now;
  draw_locked(format_progress_line(view_locked(now)));
}

void TerminalProgress::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  clear_locked();
}

// The first run still going is shown; the percentage and ETA cover all runs.
ProgressView TerminalProgress::view_locked(double now) const {
  ProgressView v;
  v.runs = runs_.size();
  uint64_t finished = 0, requests = 0;
  for (const EngineProgress& p : runs_) {
    finished += std::min(p.finished, p.requests);
    requests += p.requests;
  }
  v.fraction = requests ? double(finished) / double(requests) : 0;
  v.elapsed_s = now - start_;
  v.run = static_cast<size_t>(std::find(ended_.begin(), ended_.end(), false) - ended_.begin());
  if (v.run == runs_.size()) v.run = 0;
  v.label = labels_[v.run];
  v.finished = runs_[v.run].finished;
  v.requests = runs_[v.run].requests;
  v.simulated_s = double(runs_[v.run].simulated) / 1e9;
  return v;
}

void TerminalProgress::draw_locked(const std::string& line) {
  // Pad over a longer previous line; carriage return, no newline: the next draw overwrites it.
  const size_t pad = drawn_width_ > line.size() ? drawn_width_ - line.size() : 0;
  err_ << '\r' << line << std::string(pad, ' ') << std::flush;
  drawn_width_ = line.size();
}

void TerminalProgress::clear_locked() {
  if (drawn_width_ == 0) return;
  err_ << '\r' << std::string(drawn_width_, ' ') << '\r' << std::flush;
  drawn_width_ = 0;
}

}  // namespace memsim
