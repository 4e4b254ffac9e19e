// ModelStep's state, shared by its source files (src/exec/model_step.cpp: the step, graphs and
// replays; src/exec/model_weights.cpp: the weights and their tensor-parallel shards). Private to
// src/exec/model_step*.cpp and model_weights.cpp.
#pragma once

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "src/alloc/device_segment_source.h"
#include "src/alloc/torch_caching.h"
#include "src/exec/model_step.h"
#include "src/exec/step_metadata.h"
#include "src/exec/tp_group.h"

namespace memsim {
namespace model_step_detail {

inline Status cu(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  (void)cudaGetLastError();
  return make_error(ErrorCode::kDriverError, fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

inline Status gemm_status(const std::string& why) {
  if (why.empty()) return {};
  return make_error(ErrorCode::kDriverError, why);
}

inline constexpr uint64_t kGemmWorkspace = 32ull << 20;  // PyTorch's cuBLASLt workspace on Hopper
inline constexpr uint64_t kElem = 2;                     // bf16 / fp16

}  // namespace model_step_detail

#define MEMSIM_STEP_CU(expr) MEMSIM_TRY(::memsim::model_step_detail::cu((expr), #expr))

struct ModelStep::Impl {
  struct Layer {
    DevPtr input_norm = 0, qkv = 0, qkv_bias = 0, q_norm = 0, k_norm = 0, o = 0, post_norm = 0,
           gate_up = 0, down = 0;
  };

  Impl(const ModelStepConfig& c, Backend& b)
      : cfg(c), backend(b), source(b, "activations"), alloc(source) {}
  ~Impl() {
    for (auto& [b, g] : graphs) {
      cudaGraphExecDestroy(g.exec);
      if (g.host_in) (void)backend.host_free_pinned(g.host_in);
      if (g.host_out) (void)backend.host_free_pinned(g.host_out);
    }
    for (auto& [b, t] : templates)
      if (t.host_out) (void)backend.host_free_pinned(t.host_out);
    gemm.reset();
    // The peers' mappings of this step's captured all-reduce inputs go before the inputs do.
    if (tp && !graphs.empty()) tp->release_graph_buffers();
    (void)alloc.release_all();
    for (DevPtr p : weights) (void)backend.device_free(p);
    if (staging) (void)backend.host_free_pinned(staging);
    if (ev0) cudaEventDestroy(ev0);
    if (ev1) cudaEventDestroy(ev1);
    if (stream) cudaStreamDestroy(stream);
  }

  Status init();
  Status init_layer(uint32_t l);
  // Rows [row0, row0 + rows) x columns [col0, col0 + cols) of a whole tensor `full_cols` wide.
  struct Piece {
    uint64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
  };
  // A weight of the given pieces of the whole tensor (layer, tensor), one after the other, then
  // `zero_rows` rows of zeros (vocabulary padding); one piece of everything on one GPU.
  Result<DevPtr> weight(uint64_t full_cols, const std::vector<Piece>& pieces, uint32_t layer,
                        uint32_t tensor, float scale, float offset, uint64_t zero_rows = 0);
  Result<DevPtr> whole(uint64_t elems, uint32_t layer, uint32_t tensor, float scale, float offset) {
    return weight(elems, {{0, 1, 0, elems}}, layer, tensor, scale, offset);
  }
  // The whole tensor's rows [row0, row0 + rows) of every band: a column-parallel shard.
  static std::vector<Piece> rows_of(uint64_t cols, std::vector<std::pair<uint64_t, uint64_t>> b) {
    std::vector<Piece> v;
    for (const auto& [row0, rows] : b) v.push_back({row0, rows, 0, cols});
    return v;
  }
  // A row-parallel op's partial sum all-reduced into a new tensor (vLLM's out-of-place
  // all-reduce); the partial is freed. One GPU: the tensor itself.
  Result<DevPtr> reduced(DevPtr partial, uint64_t elems);
  // The LM head over the last rows (freed): [S, vocab_padded] logits, gathered over the ranks.
  Result<DevPtr> lm_head_logits(DevPtr last, uint32_t S);
  Result<DevPtr> act(uint64_t bytes) {
    bytes = std::max<uint64_t>(bytes, 1);
    return ext ? ext->allocate(bytes) : alloc.malloc(bytes, {});
  }
  Status free(DevPtr p) { return !p ? Status{} : ext ? ext->free(p) : alloc.free(p); }
  // A decode step of `batch` sequences captured as a CUDA graph over one KV layout: fixed
  // metadata buffer (uploaded before each replay), pinned host buffers in and out.
  struct Graph {
    uint32_t batch = 0, max_context = 0;
    DevPtr kv_k0 = 0;
    PackedStep layout;
    DevPtr meta = 0, host_in = 0, host_out = 0;
    cudaGraphExec_t exec = nullptr;
  };
  // Enqueues the step from the embedding to the next tokens' copy into host_next (pinned);
  // allocates and frees its activations. Captured as it is by capture_decode.
  Status forward(const KvLayout& kv, const PackedStep& p, DevPtr meta, void* host_next,
                 bool logits);
  // A step's device metadata as the kernels read it (packed by step_metadata.h at `meta`).
  struct StepViews {
    uint32_t T = 0, S = 0, D = 0, num_tiles = 0;
    const kernels::DecodePlan* dplan = nullptr;
    kernels::PrefillSplit psplit;  // the prefills' KV split (kv_chunk 0: unsplit)
    const int32_t *ids = nullptr, *pos = nullptr, *indptr = nullptr, *last = nullptr;
    const int32_t *work = nullptr, *dwork = nullptr;
    // The sliding-window layers' (a model without them: unused): decode plan and work list,
    // prefill tiles, work list and KV split.
    uint32_t wnum_tiles = 0;
    const kernels::DecodePlan* wdplan = nullptr;
    kernels::PrefillSplit wpsplit;
    const int32_t *wwork = nullptr, *wdwork = nullptr;
    const int64_t* slots = nullptr;
    kernels::SeqTables decodes, prefills;  // sequences [0, D) and [D, S)
    // The split decode's and the split prefill's (one after the other on the stream: the
    // larger of the two).
    DevPtr workspace = 0;
    float eps = 1e-6f;
  };
  StepViews views(const KvLayout& kv, const PackedStep& p, DevPtr meta) const;
  // Layer l from its input norm to its down projection's (reduced) output in x; the residual
  // is updated in place by the fused norms.
  Status decoder_layer(uint32_t l, const KvLayout& kv, const StepViews& v, DevPtr residual,
                       DevPtr& x);
  // Layer l's QKV projection (normed freed), q/k norms, RoPE, KV write and attention.
  Result<DevPtr> attention(uint32_t l, const KvLayout& kv, const StepViews& v, DevPtr normed);
  // The final norm, each sequence's last row, the LM head, argmax and the copies to the host.
  Status head(const StepViews& v, DevPtr residual, DevPtr x, void* host_next, bool logits_out);
  Result<StepResult> run(const KvLayout& kv, const std::vector<StepSeqInput>& seqs);
  Status capture_decode(const KvLayout& kv, uint32_t batch, uint32_t max_context);
  // capture_decode's template step of `batch` at max_context (cached per batch, with a pinned
  // buffer for its next tokens).
  struct Template {
    uint32_t max_context = 0;
    PackedStep layout;
    DevPtr host_out = 0;
  };
  Result<Template*> decode_template(const KvLayout& kv, uint32_t batch, uint32_t max_context);
  Result<StepResult> replay(const Graph& g, const KvLayout& kv,
                            const std::vector<StepSeqInput>& seqs);

  ModelStepConfig cfg;
  Backend& backend;
  DeviceSegmentSource source;
  TorchCachingAllocator alloc;
  kernels::KvDtype dtype = kernels::KvDtype::kBf16;
  kernels::AttentionShape shape;  // shape.kv_cache: the KV cache's element type
  kernels::KvScales kv_scales;    // an fp8 cache's k_scale and v_scale: 1.0 (not calibrated)
  uint32_t layers = 0;
  // Widths of this rank's tensors; `vocab` is the model's (the argmax's width), `vocab_rows` the
  // embedding and LM head rows the rank holds, `vocab_padded` the gathered logits' row width.
  uint64_t hidden = 0, q_cols = 0, kv_cols = 0, qkv_cols = 0, inter = 0, vocab = 0;
  uint64_t vocab_rows = 0, vocab_padded = 0;
  ModelShape rank_shape;  // the rank's model (the whole model on one GPU)
  TpGroup* tp = nullptr;  // null on one GPU
  uint32_t tp_size = 1, tp_rank = 0;
  uint32_t kv_head0 = 0;  // the rank's first KV head of the whole model
  std::vector<Layer> layer;
  DevPtr embed = 0, final_norm = 0, lm_head = 0, inv_freq = 0, gemm_ws = 0;
  std::vector<DevPtr> weights;  // every device_malloc, freed at the end
  uint64_t weight_bytes = 0;
  std::unique_ptr<kernels::LtGemm> gemm;
  kernels::DeviceLimits limits;
  cudaStream_t stream = nullptr;
  cudaEvent_t ev0 = nullptr, ev1 = nullptr;
  std::vector<uint16_t> logits_host;
  std::map<uint32_t, Graph> graphs;  // captured decode steps by batch
  std::map<uint32_t, Template> templates;
  TensorAllocator* ext = nullptr;    // set while a caller's memory backs the activations
  DevPtr staging = 0;                // pinned host: step metadata up, next tokens down
  StepPacker packer;                 // set up by init(); keeps its buffers from step to step
  PackedStep step_packed;            // the step's packed metadata, kept likewise
  std::vector<StepSeqInput> padded;  // a replay's sequences and its padding rows
  uint64_t staging_bytes = 0;
  std::chrono::steady_clock::time_point run_start;  // when run() was entered (prep_ms)
  double since_run_start() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - run_start)
        .count();
  }
};

}  // namespace memsim
