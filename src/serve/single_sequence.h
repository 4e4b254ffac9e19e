// single_sequence: the OrinMLLM seed's engine — one request at a time, prefill then decode;
// when the block pool is exhausted the generation is truncated and reported (seed 10.4, 1).
#pragma once

#include "src/serve/scheduler.h"

namespace memsim {

class SingleSequence final : public Scheduler {
 public:
  std::string_view name() const override { return "single_sequence"; }
  void schedule(ServeState& state, StepPlan& plan) override;
};

}  // namespace memsim
