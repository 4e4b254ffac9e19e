// Roofline step-time model: the simulated duration of one engine step (a batch of decodes and
// prefill chunks) of a model on a GPU, and of host<->device KV swap transfers.
//
// The model (one forward pass over the batch, all weights in the model dtype):
//
//   time = step_overhead + max(compute, memory)
//   compute = FLOPs / (dense_peak x flops_efficiency)
//   memory  = bytes / (hbm_bandwidth x bandwidth_efficiency)
//
//   FLOPs = 2 x body_matmul_params x new_tokens          q, k, v, o, gate, up, down of every layer
//         + 2 x lm_head_params x num_seqs                logits of each sequence's last position
//         + 4 x layers x heads x head_dim x attn_pairs   QK^T and PV (2 FLOPs per multiply-add
//         each)
//   bytes = weights read once per step                   every weight except the untied input
//                                                        embedding table, of which only the
//                                                        new_tokens looked-up rows are read
//         + kv_read_tokens x kv_bytes_per_token          KV attended (context incl. the new
//         tokens);
//                                                        KV bytes in the KV cache dtype (fp8: 1)
//         + new_tokens x kv_bytes_per_token              KV written for the new tokens
//
// vLLM computes logits only at each sequence's last scheduled position (logit_indices), hence
// lm_head x num_seqs rather than x new_tokens (equal for pure decode). A step computing no token
// (new_tokens == 0) takes no time.
//
// What it ignores: activation traffic (hidden states, MLP intermediates; small next to weights in
// decode, hidden under compute in prefill), elementwise and norm FLOPs, biases, softmax, sampling
// on the GPU, kernel-launch gaps and tail effects beyond the two efficiency factors, overlap of
// compute and memory inside a kernel (max() assumes perfect overlap), tensor parallelism and
// communication (but see below), quantized weights (dtype is the model dtype), and attention
// variants (sliding windows, MLA). The efficiencies and overhead come from the GPU file
// (GpuSpec.compute).
//
// Tensor parallelism (a StepCollectives given): `model` is one rank's shard, so FLOPs, weights
// and KV bytes are one rank's, and the step adds its collectives, serialized with the compute
// (vLLM's TP forward waits on each): an all-reduce of [new_tokens, hidden] after the embedding
// and after each layer's o_proj and down (2 x layers + 1), and the all-gather of the logits
// ([num_seqs, vocab / tp] a rank), priced by workload/collectives.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backends/backend.h"
#include "backends/sim/cost_model.h"
#include "workload/model_shape.h"

namespace memsim {

// The shape of one engine step.
struct StepShape {
  uint32_t num_seqs = 0;        // sequences in the batch (decodes + prefill chunks)
  uint64_t new_tokens = 0;      // tokens computed this step (sum over seqs; a decode = 1)
  uint64_t kv_read_tokens = 0;  // sum over seqs of KV tokens attended (context incl. new ones)
  double attn_pairs = 0;        // sum over computed tokens of positions attended (causal)
  // Of those, the sequences computing one token (decodes) and the KV tokens they attend.
  uint32_t decode_seqs = 0;
  uint64_t decode_kv_tokens = 0;
  uint32_t decode_max_kv = 0;  // the longest decode's KV tokens (steps.csv; not priced)
};

enum class StepBound : uint8_t { kCompute, kMemory };
const char* to_string(StepBound b);

struct StepBreakdown {
  double flops = 0;
  uint64_t bytes = 0;
  SimTime compute_ns = 0;
  SimTime memory_ns = 0;
  SimTime overhead_ns = 0;
  SimTime collective_ns = 0;  // tensor parallelism's collectives (0 on one GPU)
  // overhead_ns + max(compute_ns, memory_ns) + collective_ns; 0 when no token is computed
  SimTime total_ns = 0;
  StepBound bound = StepBound::kMemory;  // the larger of the two (memory on a tie)
};

class ProfiledStepTime;
class CollectiveTime;
struct PipelineStage;

class StepTimeModel {
 public:
  // Throws std::invalid_argument when gpu.compute has a non-positive rate or efficiency (the
  // GPU loader never produces one; a hand-built GpuSpec might).
  // With `profile`, step_time() interpolates its measurements (workload/step_profile.h)
  // instead of the roofline; breakdown() and attention_time() stay the roofline's.
  StepTimeModel(const ModelShape& model, const GpuSpec& gpu,
                std::shared_ptr<const ProfiledStepTime> profile = nullptr);
  // Tensor parallelism: `model` is one rank's shard; collectives priced by `collectives` are
  // added to the roofline (no profile: a step profile is measured on one GPU).
  StepTimeModel(const ModelShape& model, const GpuSpec& gpu,
                std::shared_ptr<const CollectiveTime> collectives);

  // One pipeline stage of `rank` (its layers; the embedding rows on the first stage, the LM head
  // and the logits' all-gather on the last; the embedding's all-reduce on the first), with its
  // tensor-parallel collectives when `collectives` is given: breakdown() prices the stage's
  // share of a step (workload/pipeline_time.h).
  StepTimeModel(const ModelShape& rank, const GpuSpec& gpu, const PipelineStage& stage,
                std::shared_ptr<const CollectiveTime> collectives);

  SimTime step_time(const StepShape& s) const;
  // The host's share of a step's time (scheduling, input preparation, launches), which a step
  // issued while another runs overlaps with it (async scheduling): the roofline's
  // step_overhead; 0 with a profile, whose times were measured with each step issued after the
  // last one ended and are all GPU time here.
  SimTime host_time() const { return profile_ ? 0 : overhead_ns_; }
  // "roofline", or "profile <gpu>/<model> (<mode>)".
  std::string source() const;
  StepBreakdown breakdown(const StepShape& s) const;
  // The attention share of a step (every layer), for comparison with the attention kernels
  // measured on a GPU: max(attention FLOPs / achieved FLOP/s, (KV read + KV written) bytes /
  // achieved bandwidth). Part of step_time's roofline, not added to it.
  SimTime attention_time(const StepShape& s) const;
  // Host<->device copy of `bytes` over PCIe (KV swap): bytes / pcie bandwidth, no fixed latency.
  SimTime pcie_transfer(uint64_t bytes) const;

  // The model's fixed figures (for docs and tests).
  uint64_t body_matmul_params() const { return body_params_; }
  uint64_t lm_head_params() const { return lm_head_params_; }
  // Weight bytes one step reads besides the embedding rows (weight_bytes() minus an untied
  // input-embedding table).
  uint64_t static_weight_bytes() const { return static_weight_bytes_; }

 private:
  uint64_t body_params_ = 0;
  uint64_t lm_head_params_ = 0;
  uint64_t static_weight_bytes_ = 0;
  uint64_t embed_row_bytes_ = 0;  // per new token, untied embeddings only
  uint64_t kv_bytes_per_token_ = 0;
  double attn_flops_per_pair_ = 0;
  double flops_per_s_ = 0;  // achieved
  double bytes_per_s_ = 0;  // achieved
  double pcie_bytes_per_s_ = 0;
  SimTime overhead_ns_ = 0;
  std::shared_ptr<const ProfiledStepTime> profile_;
  std::shared_ptr<const CollectiveTime> collectives_;
  uint64_t hidden_row_bytes_ = 0;  // one token's hidden state (an all-reduce row)
  uint64_t logits_row_bytes_ = 0;  // one sequence's logits on this rank (an all-gather part)
  uint32_t all_reduces_ = 0;       // per step: 2 x layers + 1
  bool last_stage_ = true;         // computes the logits (and all-gathers them under TP)
};

}  // namespace memsim
