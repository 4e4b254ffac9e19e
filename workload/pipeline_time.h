// Pipeline-parallel step time: how a step's GPU time splits over the stages that run it in turn,
// and the sends of the intermediate tensors between them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/result.h"
#include "backends/sim/cost_model.h"
#include "workload/collectives.h"
#include "workload/step_time.h"

namespace memsim {

// A step of vLLM V1 under pipeline parallelism runs stage by stage (vllm/v1/worker/
// gpu_model_runner.py: a stage other than the last returns IntermediateTensors, which the
// worker sends to the next stage, vllm/v1/worker/gpu_worker.py). Stage j's time is
//   gpu x share_j + send_j
// - gpu: the step's whole GPU time on one rank (the engine's step-time model: a profile or the
//   roofline, its collectives included, less its host share), so that a profile's measured time
//   is kept and only split;
// - share_j: stage j's roofline time (its layers; the embedding on the first stage; the LM head
//   and the logits on the last; its tensor-parallel collectives) over the sum of every stage's;
// - send_j (not on the last stage): the intermediate tensors, hidden_states and residual, each
//   [new_tokens, hidden] in the model's dtype, each TP rank sending its 1/tp slice
//   (send_tensor_dict with all_gather_group: the receiver all-gathers them over its TP group).
//   Each send is the GPU file's measured NCCL send/recv (send_recv_us) or, where it has none, a
//   2-rank all-gather of the same bytes (CollectiveTime::send_recv), and an all-gather over the
//   TP group follows when tp > 1; source() says which.
class PipelineTime {
 public:
  // `rank`: one TP rank's shard of the whole model. Errors: split_pipeline's, and the GPU file's
  // (no interconnect section, or a collective table it lacks).
  static Result<PipelineTime> make(const ModelShape& rank, const GpuSpec& gpu, uint32_t pp,
                                   uint32_t tp, std::shared_ptr<const CollectiveTime> tp_group);

  uint32_t stages() const { return static_cast<uint32_t>(stages_.size()); }
  // Each stage's time of a step of shape `s` whose whole GPU time is `gpu` (out: one per stage).
  void stage_times(const StepShape& s, SimTime gpu, std::vector<SimTime>* out) const;
  // The send between two stages of a step of `new_tokens` tokens.
  SimTime send_time(uint64_t new_tokens) const;
  const std::string& source() const { return source_; }

 private:
  PipelineTime() = default;
  std::vector<StepTimeModel> stages_;
  std::shared_ptr<const CollectiveTime> link_;      // 2 ranks: the send proxy
  std::shared_ptr<const CollectiveTime> tp_group_;  // null on one TP rank
  uint64_t slice_row_bytes_ = 0;                    // one token's slice of one tensor a rank sends
  std::string source_;
};

}  // namespace memsim
