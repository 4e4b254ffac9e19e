// Binary-heap implementation of the (time, sequence)-ordered event queue.
#include "core/event_queue.h"

#include <algorithm>

namespace memsim {

uint64_t EventQueue::schedule(SimTime when, Action action) {
  const uint64_t seq = next_seq_++;
  heap_.push_back(Event{std::max(when, clock_.now()), seq, std::move(action)});
  std::push_heap(heap_.begin(), heap_.end(), Later{});
  return seq;
}

bool EventQueue::run_next() {
  if (heap_.empty()) return false;
  std::pop_heap(heap_.begin(), heap_.end(), Later{});
  Event ev = std::move(heap_.back());
  heap_.pop_back();
  clock_.advance_to(ev.when);
  ++dispatched_;
  ev.action();
  return true;
}

uint64_t EventQueue::run(SimTime until) {
  uint64_t n = 0;
  while (!heap_.empty() && heap_.front().when <= until) {
    run_next();
    ++n;
  }
  return n;
}

}  // namespace memsim
