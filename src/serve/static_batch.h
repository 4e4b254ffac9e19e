// static_batch: request-level batching (FasterTransformer, pre-Orca serving) — a batch is
// formed from the waiting queue and runs until every member finishes before the next forms.
#pragma once

#include "src/serve/scheduler.h"

namespace memsim {

class StaticBatch final : public Scheduler {
 public:
  std::string_view name() const override { return "static_batch"; }
  void schedule(ServeState& state, StepPlan& plan) override;
};

}  // namespace memsim
