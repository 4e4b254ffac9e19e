// The simulated clock: nanoseconds, advanced by the event loop and by backend primitives.
#pragma once

#include <algorithm>

#include "core/time.h"

namespace memsim {

// The clock models one host thread: backend calls advance it by their cost, and dispatching an
// event moves it forward to the event's time (never backward: work still running delays it).
class SimClock {
 public:
  SimTime now() const { return now_; }
  void advance(SimTime d) { now_ += d; }
  void advance_to(SimTime t) { now_ = std::max(now_, t); }

 private:
  SimTime now_ = 0;
};

}  // namespace memsim
