// Discrete-event queue: events ordered by (time, sequence number) for bit-reproducible runs.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/clock.h"

namespace memsim {

// Complexity: schedule O(log n), pop O(log n), size/empty O(1) (binary heap).
// Tie-break: events at the same time run in the order they were scheduled (sequence number),
// so a run is a pure function of its inputs and seed.
class EventQueue {
 public:
  using Action = std::function<void()>;

  explicit EventQueue(SimClock& clock) : clock_(clock) {}

  // Schedules `action` at absolute time `when` (clamped to now: no event runs in the past).
  uint64_t schedule(SimTime when, Action action);
  uint64_t schedule_after(SimTime delay, Action action) {
    return schedule(clock_.now() + delay, std::move(action));
  }
  // Pops the earliest event, moves the clock to its time and runs it. False if empty.
  bool run_next();
  // Runs events until the queue is empty or the next event is later than `until`.
  uint64_t run(SimTime until = INT64_MAX);
  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  uint64_t dispatched() const { return dispatched_; }

 private:
  struct Event {
    SimTime when;
    uint64_t seq;
    Action action;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.when != b.when ? a.when > b.when : a.seq > b.seq;
    }
  };
  SimClock& clock_;
  std::vector<Event> heap_;
  uint64_t next_seq_ = 0;
  uint64_t dispatched_ = 0;
};

}  // namespace memsim
