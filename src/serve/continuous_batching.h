// continuous_batching: vLLM V1's scheduler — running requests first (decodes and prefill chunks
// under one token budget), then waiting ones, preempting on KV exhaustion.
#pragma once

#include "src/serve/scheduler.h"

namespace memsim {

class ContinuousBatching final : public Scheduler {
 public:
  std::string_view name() const override { return "continuous_batching"; }
  void schedule(ServeState& state, StepPlan& plan) override;
};

}  // namespace memsim
