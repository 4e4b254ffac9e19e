// Training-side memory model: the per-GPU state of a data-parallel trainer (FSDP / ZeRO 1-3,
// optional TP) and the allocation program of its steps (forward/backward over micro-batches,
// optimizer step, scoring forwards, weight-sync gathers, offload and reload).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "workload/model_shape.h"

namespace memsim {

// How the trainer's state is split over the data-parallel group (ZeRO, Rajbhandari et al. 2020):
// stage 1 shards the optimizer state, stage 2 also the gradients, stage 3 also the parameters
// (PyTorch FSDP FULL_SHARD, as veRL runs it: one FSDP unit per decoder layer plus a root unit
// holding the embedding, the final norm and the LM head).
enum class Sharding : uint8_t { kNone, kZero1, kZero2, kZero3 };
const char* to_string(Sharding s);

struct TrainSpec {
  uint32_t dp = 8;  // data-parallel GPUs the state is sharded over
  uint32_t tp = 1;  // tensor parallel: every layer's linear weights and activations split tp ways
  Sharding sharding = Sharding::kZero3;
  // The dtype of the parameters the trainer keeps (and of their gradients): fp32 as FSDP with
  // mixed precision keeps them (veRL loads the actor in fp32; all-gathers cast to bf16, the
  // fp32 parameters are the master weights), or bf16 (Megatron / DeepSpeed bf16: a separate fp32
  // master copy lives in the optimizer state).
  DType param_dtype = DType::kFP32;
  DType compute_dtype = DType::kBF16;    // activations, gathered parameters (FSDP param_dtype)
  bool activation_checkpointing = true;  // veRL enable_gradient_checkpointing
  // The LM head's logits are kept in fp32 for the log-probabilities (veRL computes log_probs
  // and entropy on logits.float()): bf16 logits + fp32 logits + fp32 log-softmax saved for
  // backward; false: one bf16 logits tensor (a fused cross-entropy).
  bool fp32_logits = true;
  // PyTorch's default Adam(W) on CUDA is the foreach implementation, whose step allocates one
  // fp32 temporary the size of the optimizer's shard (sqrt of the second moment); fused: none.
  bool adam_foreach = true;
  uint64_t micro_batch_tokens = 16384;  // tokens per micro-batch per GPU (veRL dynamic bsz)
  uint64_t sequence_tokens = 4096;      // tokens per sequence (prompt + response): attention
  uint64_t bucket_bytes = 25ull << 20;  // ZeRO 0-2 gradient reduce buckets (DDP bucket_cap_mb)
  uint32_t prefetch = 1;                // FSDP units all-gathered ahead of the one computing
};

// Bytes one GPU holds for the trainer's persistent state.
struct TrainStateBytes {
  uint64_t params = 0;     // the trainer's parameters (its shard under ZeRO-3)
  uint64_t grads = 0;      // gradients while a step runs (sharded under ZeRO 2/3)
  uint64_t optimizer = 0;  // Adam m and v (+ fp32 master weights when params are bf16)
  uint64_t total() const { return params + grads + optimizer; }
};

// One FSDP unit (or, unsharded, one layer's tensors): its parameter count on this GPU's TP rank.
struct TrainUnit {
  std::string name;
  uint64_t numel = 0;  // parameters, after the TP split
};

// The units of `m` in forward order: "root" (embedding, final norm, LM head) then one per layer.
std::vector<TrainUnit> train_units(const ModelShape& m, uint32_t tp);
TrainStateBytes train_state_bytes(const ModelShape& m, const TrainSpec& s);
// Bytes a layer saves for backward per token without checkpointing (bf16 inputs of every
// matmul, norm and activation; flash attention's output and log-sum-exp), on one TP rank.
uint64_t saved_bytes_per_token_layer(const ModelShape& m, const TrainSpec& s);

// What the trainer's allocations are for (the timeline's tags).
enum class TrainTag : uint8_t {
  kParams,       // persistent parameters (or their shard)
  kGrads,        // gradient shards / full gradients
  kOptimizer,    // Adam state
  kActivations,  // saved activations, recomputed layers, backward temporaries
  kLogits,       // LM head outputs and log-probabilities
  kComm,         // all-gather / reduce-scatter buffers, gathered parameters
  kReference,    // the reference policy's parameters (scoring)
};
inline constexpr int kTrainTagCount = 7;
const char* to_string(TrainTag t);

// One operation of a trainer program. Allocations and frees name a tensor by id (ids are unique
// within the program that allocates them; persistent tensors keep theirs across programs).
struct TrainOp {
  enum class Kind : uint8_t {
    kAlloc,     // bytes, tag
    kFree,      // id
    kCompute,   // flops of dense math
    kComm,      // bytes moved over the GPU interconnect by a collective (per GPU)
    kMemory,    // bytes streamed through device memory by a bandwidth-bound kernel
    kToHost,    // copy tensor `id` (bytes) to pinned host memory before it is freed
    kFromHost,  // fill tensor `id` (bytes) from its pinned host copy
    kDeliver    // weight sync: tensor `id` (bytes, gathered parameters) is copied into the
                // rollout engine's weights
  };
  Kind kind = Kind::kAlloc;
  uint64_t id = 0;
  uint64_t bytes = 0;
  double flops = 0;
  TrainTag tag = TrainTag::kActivations;
  // kToHost / kFromHost: which persistent tensor's host copy (stable across offload and reload,
  // unlike ids): params i = i, reference i = 1 << 32 | i, optimizer i = 2 << 32 | i.
  uint64_t slot = 0;
};

// Ids of the persistent tensors of a trainer (params and optimizer per unit).
struct TrainTensors {
  std::vector<uint64_t> params, optimizer, reference;
  std::vector<uint64_t> params_bytes, optimizer_bytes, reference_bytes;
};

// Builds programs for one GPU of the trainer. Persistent tensors are created by
// load_state()/unload_state() and survive between programs; every other tensor a program
// allocates it also frees.
class TrainProgramBuilder {
 public:
  TrainProgramBuilder(ModelShape model, TrainSpec spec, bool reference_model);

  const TrainSpec& spec() const { return spec_; }
  const std::vector<TrainUnit>& units() const { return units_; }
  const TrainTensors& tensors() const { return tensors_; }

  // Creates the parameters (and the optimizer state, when `optimizer`), from host copies when
  // `from_host` (a reload after an offload) or fresh (initial load). Reference parameters too
  // when the builder has a reference model.
  std::vector<TrainOp> load_params(bool from_host);
  std::vector<TrainOp> load_optimizer(bool from_host);
  // Offloads (copy to host when `keep_copy`, then free) the parameters / optimizer state.
  std::vector<TrainOp> unload_params(bool keep_copy);
  std::vector<TrainOp> unload_optimizer(bool keep_copy);
  // Forward passes without gradients over `tokens` tokens in micro-batches (the old or the
  // reference policy's log-probabilities: the same shapes).
  std::vector<TrainOp> score(uint64_t tokens);
  // One optimizer step over `tokens` tokens: forward and backward per micro-batch, gradient
  // reduction, then Adam; gradients are freed after the step (zero_grad(set_to_none=True)).
  std::vector<TrainOp> train_step(uint64_t tokens);
  // Weight sync: the full compute-dtype parameters, materialized (all-gathered under ZeRO-3,
  // cast from the parameter dtype) in buckets of about `bucket_bytes` (whole units per bucket,
  // at least one), each delivered (kDeliver) and then freed.
  std::vector<TrainOp> weight_sync(uint64_t bucket_bytes);

 private:
  uint64_t next_id() { return ++last_id_; }
  uint64_t shard(uint64_t numel) const;  // elements this GPU holds of a sharded tensor
  uint64_t compute_bytes(uint64_t numel) const { return numel * dtype_bytes(spec_.compute_dtype); }
  // A layer's saved set (saved_bytes_per_token_layer) for `tokens` tokens, in allocation order.
  std::vector<uint64_t> alloc_layer_set(std::vector<TrainOp>& p, uint64_t tokens);
  void forward_micro(std::vector<TrainOp>& p, uint64_t tokens, bool save,
                     std::vector<uint64_t>* saved, std::vector<uint64_t>* held);
  void backward_micro(std::vector<TrainOp>& p, uint64_t tokens, std::vector<uint64_t>& saved,
                      std::vector<uint64_t>& held, std::vector<uint64_t>& grads, bool first);
  uint64_t alloc(std::vector<TrainOp>& p, uint64_t bytes, TrainTag tag);
  // Allocates a persistent tensor (filled from its host copy `slots | index` when from_host)
  // and appends its id and size.
  void load_tensor(std::vector<TrainOp>& p, uint64_t bytes, TrainTag tag, uint64_t slots,
                   bool from_host, std::vector<uint64_t>& ids, std::vector<uint64_t>& sizes);
  static void free(std::vector<TrainOp>& p, uint64_t id);

  ModelShape model_;
  TrainSpec spec_;
  bool reference_model_;
  std::vector<TrainUnit> units_;
  TrainTensors tensors_;
  uint64_t last_id_ = 0;
};

}  // namespace memsim
