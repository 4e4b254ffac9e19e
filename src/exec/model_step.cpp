// ModelStep: weights, the per-step metadata upload, the layer loop (kernels/ and cuBLASLt), and
// the activations' allocation order through the caching allocator.
#include "src/exec/model_step.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/model_ops.h"
#include "src/alloc/device_segment_source.h"
#include "src/alloc/torch_caching.h"

namespace memsim {

using namespace kernels;

namespace {

Status cu(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  (void)cudaGetLastError();
  return make_error(ErrorCode::kDriverError, fmt::format("{}: {}", what, cudaGetErrorString(e)));
}
#define MEMSIM_STEP_CU(expr) MEMSIM_TRY(cu((expr), #expr))

Status gemm_status(const std::string& why) {
  if (why.empty()) return {};
  return make_error(ErrorCode::kDriverError, why);
}

constexpr uint64_t kGemmWorkspace = 32ull << 20;  // PyTorch's cuBLASLt workspace on Hopper
constexpr uint64_t kElem = 2;                     // bf16 / fp16

uint64_t align16(uint64_t v) {
  return (v + 15) / 16 * 16;
}

}  // namespace

struct ModelStep::Impl {
  struct Layer {
    DevPtr input_norm = 0, qkv = 0, qkv_bias = 0, q_norm = 0, k_norm = 0, o = 0, post_norm = 0,
           gate_up = 0, down = 0;
  };

  Impl(const ModelStepConfig& c, Backend& b)
      : cfg(c), backend(b), source(b, "activations"), alloc(source) {}
  ~Impl() {
    gemm.reset();
    (void)alloc.release_all();
    for (DevPtr p : weights) (void)backend.device_free(p);
    if (staging) (void)backend.host_free_pinned(staging);
    if (ev0) cudaEventDestroy(ev0);
    if (ev1) cudaEventDestroy(ev1);
    if (stream) cudaStreamDestroy(stream);
  }

  Status init();
  Result<DevPtr> weight(uint64_t elems, uint32_t layer, uint32_t tensor, float scale, float offset);
  Result<DevPtr> act(uint64_t bytes) { return alloc.malloc(std::max<uint64_t>(bytes, 1), {}); }
  Status free(DevPtr p) { return p ? alloc.free(p) : Status{}; }
  Result<StepResult> run(const KvLayout& kv, const std::vector<StepSeqInput>& seqs);

  ModelStepConfig cfg;
  Backend& backend;
  DeviceSegmentSource source;
  TorchCachingAllocator alloc;
  KvDtype dtype = KvDtype::kBf16;
  AttentionShape shape;
  uint32_t layers = 0;
  uint64_t hidden = 0, q_cols = 0, kv_cols = 0, qkv_cols = 0, inter = 0, vocab = 0;
  std::vector<Layer> layer;
  DevPtr embed = 0, final_norm = 0, lm_head = 0, inv_freq = 0, gemm_ws = 0;
  std::vector<DevPtr> weights;  // every device_malloc, freed at the end
  uint64_t weight_bytes = 0;
  std::unique_ptr<LtGemm> gemm;
  DeviceLimits limits;
  cudaStream_t stream = nullptr;
  cudaEvent_t ev0 = nullptr, ev1 = nullptr;
  std::vector<uint16_t> logits_host;
  DevPtr staging = 0;  // pinned host: step metadata up, next tokens down
  uint64_t staging_bytes = 0;
};

Result<DevPtr> ModelStep::Impl::weight(uint64_t elems, uint32_t l, uint32_t tensor, float scale,
                                       float offset) {
  MEMSIM_ASSIGN_OR_RETURN(DevPtr p, backend.device_malloc(elems * kElem, "weights"));
  weights.push_back(p);
  weight_bytes += elems * kElem;
  MEMSIM_STEP_CU(random_half(dtype, p, elems, ModelStep::weight_seed(cfg.seed, l, tensor), stream,
                             scale, offset));
  return p;
}

Status ModelStep::Impl::init() {
  const ModelShape& m = cfg.model;
  if (m.dtype != DType::kBF16 && m.dtype != DType::kFP16)
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("model {}: the executor runs bf16 or fp16 models", m.name));
  dtype = m.dtype == DType::kFP16 ? KvDtype::kFp16 : KvDtype::kBf16;
  shape = {m.heads, m.kv_heads, static_cast<uint32_t>(m.head_dim), dtype};
  if (std::string why = check_shape(shape); !why.empty())
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("model {}: attention kernels: {}", m.name, why));
  layers = cfg.layers_run ? std::min(cfg.layers_run, m.layers) : m.layers;
  hidden = m.hidden;
  q_cols = uint64_t{m.heads} * m.head_dim;
  kv_cols = uint64_t{m.kv_heads} * m.head_dim;
  qkv_cols = q_cols + 2 * kv_cols;
  inter = m.intermediate;
  vocab = m.vocab;
  if (hidden % 8 || q_cols % 8 || inter % 8)
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("model {}: widths must be multiples of 8", m.name));
  MEMSIM_STEP_CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  MEMSIM_STEP_CU(cudaEventCreate(&ev0));
  MEMSIM_STEP_CU(cudaEventCreate(&ev1));
  MEMSIM_STEP_CU(query_device(&limits));

  auto lin = [](uint64_t in) { return 1.0f / std::sqrt(static_cast<float>(in)); };
  layer.resize(layers);
  for (uint32_t l = 0; l < layers; ++l) {
    Layer& L = layer[l];
    MEMSIM_ASSIGN_OR_RETURN(L.input_norm, weight(hidden, l, kInputNorm, 0.1f, 1.0f));
    MEMSIM_ASSIGN_OR_RETURN(L.qkv, weight(qkv_cols * hidden, l, kQkv, lin(hidden), 0));
    if (m.qkv_bias) {
      MEMSIM_ASSIGN_OR_RETURN(L.qkv_bias, weight(qkv_cols, l, kQkvBias, 0.1f, 0));
    }
    if (m.qk_norm) {
      MEMSIM_ASSIGN_OR_RETURN(L.q_norm, weight(m.head_dim, l, kQNorm, 0.1f, 1.0f));
      MEMSIM_ASSIGN_OR_RETURN(L.k_norm, weight(m.head_dim, l, kKNorm, 0.1f, 1.0f));
    }
    MEMSIM_ASSIGN_OR_RETURN(L.o, weight(hidden * q_cols, l, kO, lin(q_cols), 0));
    MEMSIM_ASSIGN_OR_RETURN(L.post_norm, weight(hidden, l, kPostNorm, 0.1f, 1.0f));
    MEMSIM_ASSIGN_OR_RETURN(L.gate_up, weight(2 * inter * hidden, l, kGateUp, lin(hidden), 0));
    MEMSIM_ASSIGN_OR_RETURN(L.down, weight(hidden * inter, l, kDown, lin(inter), 0));
  }
  MEMSIM_ASSIGN_OR_RETURN(embed, weight(vocab * hidden, kGlobalLayer, kEmbedding, 1.0f, 0));
  MEMSIM_ASSIGN_OR_RETURN(final_norm, weight(hidden, kGlobalLayer, kFinalNorm, 0.1f, 1.0f));
  if (m.tie_embeddings) {
    lm_head = embed;
  } else {
    MEMSIM_ASSIGN_OR_RETURN(lm_head, weight(vocab * hidden, kGlobalLayer, kLmHead, lin(hidden), 0));
  }

  const std::vector<float> freqs = m.rope_inv_freq();
  MEMSIM_ASSIGN_OR_RETURN(inv_freq, backend.device_malloc(freqs.size() * 4, "weights"));
  weights.push_back(inv_freq);
  MEMSIM_STEP_CU(cudaMemcpyAsync(reinterpret_cast<void*>(inv_freq), freqs.data(), freqs.size() * 4,
                                 cudaMemcpyHostToDevice, stream));
  MEMSIM_ASSIGN_OR_RETURN(gemm_ws, backend.device_malloc(kGemmWorkspace, "gemm_workspace"));
  weights.push_back(gemm_ws);
  std::string why;
  gemm = LtGemm::open(gemm_ws, kGemmWorkspace, &why);
  if (!gemm) return make_error(ErrorCode::kNotSupported, why);
  MEMSIM_STEP_CU(cudaStreamSynchronize(stream));
  return {};
}

Result<StepResult> ModelStep::Impl::run(const KvLayout& kv, const std::vector<StepSeqInput>& seqs) {
  const uint32_t S = static_cast<uint32_t>(seqs.size());
  if (S == 0) return StepResult{};
  if (S > cfg.max_seqs)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("step of {} sequences exceeds max_seqs {}", S, cfg.max_seqs));
  if (kv.k.size() < layers || kv.v.size() < layers || kv.row_bytes != kv_cols * kElem ||
      kv.block_tokens == 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "KV layout does not match the model (layers, row bytes or block tokens)");

  // ---- host metadata -----------------------------------------------------------------------
  std::vector<int32_t> ids, positions, indptr{0}, kv_lens, q_lens, last_rows, tables;
  std::vector<int64_t> slot_mapping;
  uint32_t bt_stride = 1, max_kv = 0;
  bool decode = true;
  for (const StepSeqInput& s : seqs) {
    if (s.tokens.empty()) return make_error(ErrorCode::kInvalidArgument, "a sequence has no token");
    const uint32_t len = s.cached + static_cast<uint32_t>(s.tokens.size());
    if (kv.paged) {
      const uint64_t need = (uint64_t{len} + kv.block_tokens - 1) / kv.block_tokens;
      if (s.table.size() < need)
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("a table of {} blocks for {} tokens", s.table.size(), len));
      bt_stride = std::max<uint32_t>(bt_stride, static_cast<uint32_t>(need));
    } else if (s.table.size() != 1 || len > kv.block_tokens) {
      return make_error(ErrorCode::kInvalidArgument, "contiguous layouts take one slot a sequence");
    }
    decode = decode && s.tokens.size() == 1;
    max_kv = std::max(max_kv, len);
  }
  for (const StepSeqInput& s : seqs) {
    for (uint32_t i = 0; i < s.tokens.size(); ++i) {
      const uint32_t pos = s.cached + i;
      if (s.tokens[i] < 0 || static_cast<uint64_t>(s.tokens[i]) >= vocab)
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("token {} outside the vocab", s.tokens[i]));
      ids.push_back(s.tokens[i]);
      positions.push_back(static_cast<int32_t>(pos));
      slot_mapping.push_back(kv.paged ? int64_t{s.table[pos / kv.block_tokens]} * kv.block_tokens +
                                            pos % kv.block_tokens
                                      : int64_t{s.table[0]} * kv.block_tokens + pos);
    }
    const uint32_t len = s.cached + static_cast<uint32_t>(s.tokens.size());
    indptr.push_back(static_cast<int32_t>(ids.size()));
    last_rows.push_back(static_cast<int32_t>(ids.size()) - 1);
    kv_lens.push_back(static_cast<int32_t>(len));
    q_lens.push_back(static_cast<int32_t>(s.tokens.size()));
    if (kv.paged) {
      const size_t at = tables.size();
      tables.resize(at + bt_stride, 0);
      const uint64_t need = (uint64_t{len} + kv.block_tokens - 1) / kv.block_tokens;
      std::copy(s.table.begin(), s.table.begin() + static_cast<int64_t>(need), tables.begin() + at);
    } else {
      tables.push_back(s.table[0]);
    }
  }
  const uint32_t T = static_cast<uint32_t>(ids.size());
  if (T > cfg.max_tokens)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("step of {} tokens exceeds max_tokens {}", T, cfg.max_tokens));
  DecodePlan dplan;
  PrefillPlan pplan;
  if (decode)
    dplan = plan_decode(shape, S, max_kv, limits);
  else
    pplan = plan_prefill(shape, q_lens, kv_lens);

  // One upload: [ids | positions | slot_mapping | indptr | kv_lens | tables | last_rows | work].
  struct Section {
    const void* data;
    uint64_t bytes;
    uint64_t at = 0;
  };
  std::vector<Section> sec = {{ids.data(), ids.size() * 4},
                              {positions.data(), positions.size() * 4},
                              {slot_mapping.data(), slot_mapping.size() * 8},
                              {indptr.data(), indptr.size() * 4},
                              {kv_lens.data(), kv_lens.size() * 4},
                              {tables.data(), tables.size() * 4},
                              {last_rows.data(), last_rows.size() * 4},
                              {pplan.work.data(), pplan.work.size() * 4}};
  uint64_t meta_bytes = 0;
  for (Section& x : sec) {
    x.at = meta_bytes;
    meta_bytes += align16(x.bytes);
  }
  const uint64_t down_bytes = align16(uint64_t{S} * 4);
  if (staging_bytes < meta_bytes + down_bytes) {
    if (staging) MEMSIM_TRY(backend.host_free_pinned(staging));
    staging = 0;
    staging_bytes = 0;
    MEMSIM_ASSIGN_OR_RETURN(staging, backend.host_malloc_pinned(meta_bytes + down_bytes));
    staging_bytes = meta_bytes + down_bytes;
  }
  auto* host = reinterpret_cast<uint8_t*>(staging);
  for (const Section& x : sec)
    if (x.bytes) std::memcpy(host + x.at, x.data, x.bytes);

  // ---- device work -------------------------------------------------------------------------
  MEMSIM_STEP_CU(cudaEventRecord(ev0, stream));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr meta, act(meta_bytes));
  MEMSIM_STEP_CU(cudaMemcpyAsync(reinterpret_cast<void*>(meta), host, meta_bytes,
                                 cudaMemcpyHostToDevice, stream));
  auto dev = [&](size_t i) { return meta + sec[i].at; };
  const auto* d_ids = reinterpret_cast<const int32_t*>(dev(0));
  const auto* d_pos = reinterpret_cast<const int32_t*>(dev(1));
  const auto* d_slots = reinterpret_cast<const int64_t*>(dev(2));
  const auto* d_indptr = reinterpret_cast<const int32_t*>(dev(3));
  const auto* d_kv_lens = reinterpret_cast<const int32_t*>(dev(4));
  const auto* d_tables = reinterpret_cast<const int32_t*>(dev(5));
  const auto* d_last = reinterpret_cast<const int32_t*>(dev(6));
  const auto* d_work = reinterpret_cast<const int32_t*>(dev(7));
  SeqTables st;
  st.kv_lens = d_kv_lens;
  if (kv.paged) {
    st.block_tables = d_tables;
    st.bt_stride = bt_stride;
  } else {
    st.slots = d_tables;
  }
  DevPtr workspace = 0;
  if (decode && dplan.workspace_bytes) {
    MEMSIM_ASSIGN_OR_RETURN(workspace, act(dplan.workspace_bytes));
  }
  const float eps = static_cast<float>(cfg.model.rms_norm_eps);

  MEMSIM_ASSIGN_OR_RETURN(DevPtr residual, act(uint64_t{T} * hidden * kElem));
  MEMSIM_STEP_CU(embedding(dtype, embed, d_ids, residual, T, static_cast<uint32_t>(hidden),
                           static_cast<uint32_t>(vocab), stream));
  DevPtr x = 0;  // the layer's input before its norm (null in layer 0: the residual itself)
  for (uint32_t l = 0; l < layers; ++l) {
    const Layer& L = layer[l];
    DevPtr normed = 0;
    RmsNormArgs n;
    n.weight = L.input_norm;
    n.tokens = T;
    n.dim = static_cast<uint32_t>(hidden);
    n.eps = eps;
    if (l == 0) {  // vLLM: residual = hidden_states; hidden_states = input_layernorm(...)
      MEMSIM_ASSIGN_OR_RETURN(normed, act(uint64_t{T} * hidden * kElem));
      n.x = residual;
      n.out = normed;
    } else {  // fused_add_rms_norm in place on the previous layer's output
      normed = x;
      n.x = n.out = x;
      n.residual = residual;
    }
    MEMSIM_STEP_CU(rms_norm(dtype, n, stream));

    MEMSIM_ASSIGN_OR_RETURN(DevPtr qkv, act(uint64_t{T} * qkv_cols * kElem));
    MEMSIM_TRY(gemm_status(gemm->matmul(dtype, normed, L.qkv, L.qkv_bias, qkv, T,
                                        static_cast<uint32_t>(qkv_cols),
                                        static_cast<uint32_t>(hidden), stream)));
    MEMSIM_TRY(free(normed));
    if (cfg.model.qk_norm) {
      RmsNormArgs qn;
      qn.x = qn.out = qkv;
      qn.weight = L.q_norm;
      qn.tokens = T;
      qn.heads = shape.q_heads;
      qn.dim = shape.head_dim;
      qn.token_stride = qkv_cols;
      qn.eps = eps;
      MEMSIM_STEP_CU(rms_norm(dtype, qn, stream));
      RmsNormArgs kn = qn;
      kn.x = kn.out = qkv + q_cols * kElem;
      kn.weight = L.k_norm;
      kn.heads = shape.kv_heads;
      MEMSIM_STEP_CU(rms_norm(dtype, kn, stream));
    }
    MEMSIM_ASSIGN_OR_RETURN(DevPtr q, act(uint64_t{T} * q_cols * kElem));
    MEMSIM_STEP_CU(rope(dtype,
                        {qkv, q, d_pos, reinterpret_cast<const float*>(inv_freq), T, shape.q_heads,
                         shape.kv_heads, shape.head_dim},
                        stream));
    KvLayerView view;
    view.k = kv.k[l];
    view.v = kv.v[l];
    view.block_stride = static_cast<int64_t>(kv.block_stride / kElem);
    view.block_size = kv.block_tokens;
    view.addressing = kv.paged ? KvAddressing::kPaged : KvAddressing::kContiguous;
    KvWriteArgs w;
    w.k_new = qkv + q_cols * kElem;
    w.v_new = qkv + (q_cols + kv_cols) * kElem;
    w.new_stride = static_cast<int64_t>(qkv_cols);
    w.slot_mapping = d_slots;
    w.num_tokens = T;
    w.cache = view;
    w.slot_tokens = kv.block_tokens;
    MEMSIM_STEP_CU(paged_kv_write(shape, w, stream));
    MEMSIM_ASSIGN_OR_RETURN(DevPtr attn, act(uint64_t{T} * q_cols * kElem));
    if (decode) {
      DecodeArgs a;
      a.q = q;
      a.o = attn;
      a.cache = view;
      a.seqs = st;
      a.workspace = workspace;
      MEMSIM_STEP_CU(paged_decode(shape, dplan, a, stream));
    } else {
      PrefillArgs a;
      a.q = q;
      a.o = attn;
      a.qo_indptr = d_indptr;
      a.cache = view;
      a.seqs = st;
      a.work = d_work;
      a.num_tiles = pplan.num_tiles;
      MEMSIM_STEP_CU(paged_prefill(shape, a, stream));
    }
    MEMSIM_TRY(free(q));
    MEMSIM_TRY(free(qkv));
    MEMSIM_ASSIGN_OR_RETURN(DevPtr o, act(uint64_t{T} * hidden * kElem));
    MEMSIM_TRY(gemm_status(gemm->matmul(dtype, attn, L.o, 0, o, T, static_cast<uint32_t>(hidden),
                                        static_cast<uint32_t>(q_cols), stream)));
    MEMSIM_TRY(free(attn));
    RmsNormArgs pn;
    pn.x = pn.out = o;
    pn.residual = residual;
    pn.weight = L.post_norm;
    pn.tokens = T;
    pn.dim = static_cast<uint32_t>(hidden);
    pn.eps = eps;
    MEMSIM_STEP_CU(rms_norm(dtype, pn, stream));
    MEMSIM_ASSIGN_OR_RETURN(DevPtr gu, act(uint64_t{T} * 2 * inter * kElem));
    MEMSIM_TRY(
        gemm_status(gemm->matmul(dtype, o, L.gate_up, 0, gu, T, static_cast<uint32_t>(2 * inter),
                                 static_cast<uint32_t>(hidden), stream)));
    MEMSIM_TRY(free(o));
    MEMSIM_ASSIGN_OR_RETURN(DevPtr h, act(uint64_t{T} * inter * kElem));
    MEMSIM_STEP_CU(silu_and_mul(dtype, gu, h, T, static_cast<uint32_t>(inter), stream));
    MEMSIM_TRY(free(gu));
    MEMSIM_ASSIGN_OR_RETURN(DevPtr down, act(uint64_t{T} * hidden * kElem));
    MEMSIM_TRY(gemm_status(gemm->matmul(dtype, h, L.down, 0, down, T, static_cast<uint32_t>(hidden),
                                        static_cast<uint32_t>(inter), stream)));
    MEMSIM_TRY(free(h));
    x = down;
  }
  // Final norm (fused with the last residual add), each sequence's last row, LM head, argmax.
  RmsNormArgs fn;
  fn.weight = final_norm;
  fn.tokens = T;
  fn.dim = static_cast<uint32_t>(hidden);
  fn.eps = eps;
  DevPtr final_rows = x;
  if (x) {
    fn.x = fn.out = x;
    fn.residual = residual;
  } else {  // no layer ran
    MEMSIM_ASSIGN_OR_RETURN(final_rows, act(uint64_t{T} * hidden * kElem));
    fn.x = residual;
    fn.out = final_rows;
  }
  MEMSIM_STEP_CU(rms_norm(dtype, fn, stream));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr last, act(uint64_t{S} * hidden * kElem));
  MEMSIM_STEP_CU(
      gather_rows(dtype, final_rows, d_last, last, S, static_cast<uint32_t>(hidden), stream));
  MEMSIM_TRY(free(final_rows));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr logits, act(uint64_t{S} * vocab * kElem));
  MEMSIM_TRY(
      gemm_status(gemm->matmul(dtype, last, lm_head, 0, logits, S, static_cast<uint32_t>(vocab),
                               static_cast<uint32_t>(hidden), stream)));
  MEMSIM_TRY(free(last));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr next, act(uint64_t{S} * 4));
  MEMSIM_STEP_CU(argmax_rows(dtype, logits, S, static_cast<uint32_t>(vocab), vocab,
                             reinterpret_cast<int32_t*>(next), stream));
  if (cfg.return_logits) {
    logits_host.resize(uint64_t{S} * vocab);
    MEMSIM_STEP_CU(cudaMemcpyAsync(logits_host.data(), reinterpret_cast<void*>(logits),
                                   logits_host.size() * kElem, cudaMemcpyDeviceToHost, stream));
  }
  MEMSIM_TRY(free(logits));
  MEMSIM_STEP_CU(cudaMemcpyAsync(host + meta_bytes, reinterpret_cast<void*>(next), uint64_t{S} * 4,
                                 cudaMemcpyDeviceToHost, stream));
  MEMSIM_STEP_CU(cudaEventRecord(ev1, stream));
  MEMSIM_TRY(free(next));
  MEMSIM_TRY(free(residual));
  MEMSIM_TRY(free(workspace));
  MEMSIM_TRY(free(meta));
  MEMSIM_STEP_CU(cudaStreamSynchronize(stream));

  StepResult r;
  r.decode = decode;
  r.next_tokens.resize(S);
  std::memcpy(r.next_tokens.data(), host + meta_bytes, uint64_t{S} * 4);
  float ms = 0;
  MEMSIM_STEP_CU(cudaEventElapsedTime(&ms, ev0, ev1));
  r.gpu_ms = ms;
  if (cfg.return_logits) r.logits = std::move(logits_host);
  return r;
}

// ---- public ---------------------------------------------------------------------------------

ModelStep::ModelStep(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ModelStep::~ModelStep() = default;

Result<std::unique_ptr<ModelStep>> ModelStep::create(const ModelStepConfig& config,
                                                     Backend& backend) {
  if (backend.name() != "cuda")
    return make_error(ErrorCode::kNotSupported, "the model step runs on the CUDA backend");
  auto impl = std::make_unique<Impl>(config, backend);
  MEMSIM_TRY(impl->init());
  return std::unique_ptr<ModelStep>(new ModelStep(std::move(impl)));
}

Result<StepResult> ModelStep::run(const KvLayout& kv, const std::vector<StepSeqInput>& seqs) {
  return impl_->run(kv, seqs);
}

const ModelStepConfig& ModelStep::config() const {
  return impl_->cfg;
}
uint64_t ModelStep::weight_bytes() const {
  return impl_->weight_bytes;
}
AllocatorStats ModelStep::activation_stats() const {
  return impl_->alloc.stats();
}
uint64_t ModelStep::stream() const {
  return reinterpret_cast<uint64_t>(impl_->stream);
}

}  // namespace memsim
