// Progress of long serving runs on a terminal: one stderr line ("run 1/2 LABEL: N of M requests
// finished, simulated S s, P%, ETA hh:mm:ss"), redrawn in place at most 4 times a second once
// the runs have taken a second, and cleared when they end. Nothing when stderr is no terminal.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "src/serve/engine.h"
#include "src/serve/serving_experiment.h"

namespace memsim {

// What one progress line shows.
struct ProgressView {
  size_t run = 0;   // index of the run shown (printed 1-based)
  size_t runs = 1;  // runs of the experiment
  std::string label;
  uint64_t finished = 0, requests = 0;  // of the run shown
  double simulated_s = 0;               // of the run shown
  double fraction = 0;                  // of all runs' requests, finished
  double elapsed_s = 0;                 // wall time since the runs started
};

// "run 2/6 LABEL: 812,345 of 2,000,000 requests finished, simulated 80,123 s, 45%, ETA 00:00:09"
// (", 45% of all runs" when there are several; "ETA --:--:--" before anything finished).
std::string format_progress_line(const ProgressView& view);
// 1234567 -> "1,234,567".
std::string with_thousands(uint64_t value);
// Seconds as hh:mm:ss (rounded).
std::string hms(double seconds);

// Collects the progress of a serving experiment's runs (ServingRunHooks::progress, from any
// thread) and draws the line on `err`. Disabled (tty false) it draws nothing at all; the caller
// passes whether stderr is a terminal (isatty(STDERR_FILENO)). The line is cleared when every run
// has ended, or at the latest by the destructor.
//   memsim::TerminalProgress progress(config, std::cerr, isatty(STDERR_FILENO) != 0);
//   hooks.progress = progress.hook();
class TerminalProgress {
 public:
  using Clock = std::function<double()>;      // seconds, monotonic
  static constexpr double kFirstDrawS = 1.0;  // runs shorter than this print nothing
  static constexpr double kRedrawS = 0.25;    // at most 4 lines a second

  TerminalProgress(const ServingConfig& config, std::ostream& err, bool tty, Clock clock = {});
  ~TerminalProgress();
  TerminalProgress(const TerminalProgress&) = delete;
  TerminalProgress& operator=(const TerminalProgress&) = delete;

  // The ServingRunHooks::progress callback (null when disabled: the engine then skips it).
  std::function<void(size_t, const EngineProgress&)> hook();
  void update(size_t run, const EngineProgress& p);
  // Erases the line if one was drawn.
  void clear();

 private:
  ProgressView view_locked(double now) const;
  void draw_locked(const std::string& line);
  void clear_locked();

  std::ostream& err_;
  const bool tty_;
  Clock clock_;
  std::vector<std::string> labels_;
  std::vector<EngineProgress> runs_;  // latest report per run
  std::vector<bool> ended_;
  double start_ = 0, last_draw_ = -1;
  size_t drawn_width_ = 0;  // characters of the line on screen (0: none)
  mutable std::mutex mu_;
};

}  // namespace memsim
