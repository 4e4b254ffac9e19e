// One model-shaped forward step on the GPU (CUDA builds): a decoder of a configs/models shape with
// random weights, run over a KV cache the caller's strategy lays out, for a ragged batch of
// decode tokens and prefill chunks, returning each sequence's greedy next token.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "src/alloc/caching_allocator.h"
#include "src/kv/kv_cache_manager.h"
#include "workload/model_shape.h"

namespace memsim {

class TpGroup;

struct ModelStepConfig {
  ModelShape model;
  uint32_t layers_run = 0;     // layers executed (0 = all); the KV layout still has every layer
  uint32_t max_tokens = 8192;  // tokens of one step (max_num_batched_tokens)
  uint32_t max_seqs = 256;     // sequences of one step
  uint64_t seed = 1;           // weights: see weight_seed()
  bool return_logits = false;  // copy each step's logits to the host (checks; slows the step)
  // Tensor parallelism: this process is rank tp->rank() of tp->size() (null: one GPU). The step
  // holds the rank's shard of `model` (workload/tensor_parallel.h) and runs vLLM's collectives.
  TpGroup* tp = nullptr;
};

// A sequence of a step: its KV table (block ids for paged layouts, {slot} for contiguous ones),
// the tokens already in the cache (positions [0, cached)) and the new tokens it computes now
// (positions [cached, cached + tokens.size())).
struct StepSeqInput {
  std::vector<int32_t> table;
  uint32_t cached = 0;
  std::vector<int32_t> tokens;
};

struct StepResult {
  std::vector<int32_t> next_tokens;  // greedy token after each sequence's last new token
  double gpu_ms = 0;                 // the step's kernels, CUDA events on its stream
  double prep_ms = 0;                // host time in run() before the first event (packing)
  bool decode = false;               // every sequence had one new token (the decode kernel ran)
  bool graph = false;                // replayed a captured CUDA graph (capture_decode)
  uint32_t prefill_kv_chunk = 0;     // the prefills' split-KV chunk in tokens (0: unsplit)
  std::vector<uint16_t> logits;      // [sequences, vocab] bf16/fp16 bits (return_logits)
};

// Per layer: input RMSNorm (fused with the residual add after the first layer), QKV projection
// (+ bias), q/k RMSNorm per head (qk_norm), RoPE, KV write into the caller's cache, paged decode
// (all sequences one token) or prefill attention, output projection, fused residual add +
// RMSNorm, gate/up projection, SiLU x up, down projection; then the final norm on each
// sequence's last token, the LM head and argmax. GEMMs through cuBLASLt (kernels/gemm.h), the
// rest through kernels/. Weights are device_malloc'd through the Backend (tag "weights");
// activations, step metadata and attention workspaces come from a torch_caching allocator over
// the Backend (tag "activations"), allocated and freed as PyTorch's eager forward would, so a
// step is an allocation program like any other.
//
// Weights are uniform random (kernels::random_half), tensor i of layer l seeded with
// weight_seed(seed, l, i) (global tensors use layer kGlobalLayer): linear weights in
// +-1/sqrt(in_features), biases in +-0.1, norm weights in 1 +- 0.1, embeddings in +-1 (so
// tools/model_check.py can rebuild the same model in PyTorch).
//
// Under tensor parallelism (config.tp) each rank holds its shard of those same tensors, bit for
// bit the unsharded tensor's part (kernels::random_half_block), as vLLM's layers shard them:
// QKV by heads (a KV head replicated when there are fewer than ranks), gate/up by rows, o_proj
// and down by columns, the embedding and LM head by rows of the vocabulary padded to a multiple of
// 64, which must divide by tp (padding rows zero, as vLLM's loader fills them); norms whole. The
// step runs vLLM's collectives: the masked embedding lookup, o_proj and down give partial sums
// all-reduced out of place into new tensors, and the LM head's partial logits are all-gathered and
// copied into [sequences, padded vocabulary] rows, whose first `vocab` columns the argmax reads. So
// every rank computes the same next tokens as the unsharded model, up to the rounding of the sums.
class ModelStep {
 public:
  static constexpr uint32_t kGlobalLayer = 4096;
  enum Tensor : uint32_t {  // weight_seed's tensor index
    kInputNorm = 0,
    kQkv = 1,
    kQkvBias = 2,
    kQNorm = 3,
    kKNorm = 4,
    kO = 5,
    kPostNorm = 6,
    kGateUp = 7,
    kDown = 8,
    kEmbedding = 0,  // of kGlobalLayer
    kFinalNorm = 1,
    kLmHead = 2,
  };
  static uint64_t weight_seed(uint64_t seed, uint32_t layer, uint32_t tensor) {
    return seed * 1000003ull + uint64_t{layer} * 16 + tensor;
  }

  // Needs the CUDA backend (device pointers); kNotSupported for a model the kernels do not take
  // (dtype not bf16/fp16, head_dim not 64/128/256, more than 8 query heads per KV head) or when
  // cuBLASLt cannot be loaded.
  static Result<std::unique_ptr<ModelStep>> create(const ModelStepConfig& config, Backend& backend);
  ~ModelStep();
  ModelStep(const ModelStep&) = delete;
  ModelStep& operator=(const ModelStep&) = delete;

  // Runs one step over `kv` (the strategy's layout: layer l reads and writes kv.k[l], kv.v[l]);
  // every sequence's table must cover cached + tokens.size() positions. Synchronizes its stream.
  // A failed step may leave activations allocated until the ModelStep is destroyed.
  Result<StepResult> run(const KvLayout& kv, const std::vector<StepSeqInput>& seqs);

  // Captures the decode step of `batch` sequences of up to `max_context` tokens over `kv` (paged)
  // as a CUDA graph, as vLLM captures its decode batch sizes: a later run() of a decode step of
  // B sequences over the same layout replays the smallest captured batch >= B, padded as vLLM
  // pads (the padding rows read one KV token and write none; their tokens are dropped). The
  // metadata is uploaded into the graph's fixed buffer first; tables, lengths, positions and the
  // decode attention's work list (re-planned for each replay's lengths within the launch the
  // capture fixed: kernels::plan_decode_graph) are read on the device. The warm-up before the
  // capture writes no KV (slot -1) and reads block 0.
  Status capture_decode(const KvLayout& kv, uint32_t batch, uint32_t max_context);

  // The template decode step of capture_decode (`batch` sequences at max_context tokens reading
  // block 0, writing no KV) as packed metadata, for a caller that captures the step into its own
  // graph: upload these bytes to a device buffer, then enqueue_decode reads them there.
  // `context` (1..max_context; 0 = max_context) sets the lengths the metadata carries (and the
  // decode work list planned for them): the launch and the table stride stay max_context's, so a
  // capture records the same kernels either way.
  Result<std::vector<uint8_t>> decode_template(const KvLayout& kv, uint32_t batch,
                                               uint32_t max_context, uint32_t context = 0);
  // Enqueues that step on `stream` (a cudaStream_t; capturable), its metadata read at `meta`,
  // its activations allocated and freed through `mem` (null: the step's own allocator) in the
  // order of make_executor_decode_program (workload/executor_program.h). The next tokens go
  // to a pinned buffer of the template. Does not synchronize.
  Status enqueue_decode(const KvLayout& kv, uint32_t batch, uint32_t max_context, DevPtr meta,
                        uint64_t stream, TensorAllocator* mem);
  // Returns the step's cached activation memory to the backend (empty_cache).
  Status release_cached();

  // Loads the GEMM kernels the steps will use before any step runs (LtGemm::warm_up over every
  // token count 1..64, then every multiple of 8 up to max_tokens; the LM head's up to max_seqs),
  // as a warmed-up server has them: a step of a new size then pays cuBLASLt's heuristic for it,
  // not a kernel's first load. Synchronizes; its buffers go back to the backend. Returns the
  // matmuls run (per GEMM, one for each algorithm not picked at a smaller token count).
  Result<uint32_t> warm_up_gemms();

  const ModelStepConfig& config() const;
  // This rank's model (the whole model without config.tp): its kv_bytes_per_token() sizes a KV
  // layout the step reads.
  const ModelShape& rank_model() const;
  uint64_t weight_bytes() const;
  AllocatorStats activation_stats() const;
  uint64_t stream() const;  // the cudaStream_t the step runs on

 private:
  struct Impl;
  explicit ModelStep(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace memsim
