// ModelStep's weights: every tensor of the model with random values, on one GPU whole and under
// tensor parallelism the rank's shard of the same tensors (model_step.h says how they split).
#include <cmath>

#include "kernels/attention.h"
#include "src/exec/model_step_impl.h"
#include "src/exec/tp_group.h"
#include "workload/tensor_parallel.h"

namespace memsim {

using namespace kernels;
using namespace model_step_detail;

Result<DevPtr> ModelStep::Impl::weight(uint64_t full_cols, const std::vector<Piece>& pieces,
                                       uint32_t l, uint32_t tensor, float scale, float offset,
                                       uint64_t zero_rows) {
  uint64_t elems = zero_rows * full_cols;
  for (const Piece& pc : pieces) elems += pc.rows * pc.cols;
  MEMSIM_ASSIGN_OR_RETURN(DevPtr p, backend.device_malloc(elems * kElem, "weights"));
  weights.push_back(p);
  weight_bytes += elems * kElem;
  const uint64_t seed = ModelStep::weight_seed(cfg.seed, l, tensor);
  DevPtr at = p;
  for (const Piece& pc : pieces) {
    const RandomBlock block{pc.rows * pc.cols, pc.cols, full_cols, pc.row0 * full_cols + pc.col0};
    MEMSIM_STEP_CU(random_half_block(dtype, at, block, seed, stream, scale, offset));
    at += block.count * kElem;
  }
  if (zero_rows)
    MEMSIM_STEP_CU(
        cudaMemsetAsync(reinterpret_cast<void*>(at), 0, zero_rows * full_cols * kElem, stream));
  return p;
}

Status ModelStep::Impl::init() {
  const ModelShape& m = cfg.model;
  if (m.dtype != DType::kBF16 && m.dtype != DType::kFP16)
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("model {}: the executor runs bf16 or fp16 models", m.name));
  dtype = m.dtype == DType::kFP16 ? KvDtype::kFp16 : KvDtype::kBf16;
  tp = cfg.tp;
  rank_shape = m;
  vocab = vocab_rows = vocab_padded = m.vocab;
  if (tp) {
    tp_size = tp->size();
    tp_rank = tp->rank();
    MEMSIM_ASSIGN_OR_RETURN(const TensorParallelShard shard, shard_tensor_parallel(m, tp_size));
    rank_shape = shard.rank;
    vocab_rows = shard.rank.vocab;
    vocab_padded = shard.vocab_padded;
    // vLLM: each KV head is held by kv_head_replicas consecutive ranks.
    kv_head0 = tp_rank / shard.kv_head_replicas * shard.rank.kv_heads;
    if (tp_size == 1) tp = nullptr;  // one rank: no collectives
  }
  const ModelShape& r = rank_shape;
  shape = {r.heads, r.kv_heads, static_cast<uint32_t>(m.head_dim), dtype};
  // engine.kv_cache_dtype: an fp8 cache the KV write quantizes into and attention dequantizes,
  // with per-tensor scales of 1.0 (kv_scales: vLLM's default when the checkpoint has none).
  const DType kv = m.kv_cache_dtype();
  shape.kv_cache = kernel_kv_cache(kv);
  if (shape.kv_cache == KvCacheDtype::kAuto && kv != m.dtype)
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("model {}: a {} KV cache (the executor stores the model's "
                                  "dtype or fp8)",
                                  m.name, to_string(kv)));
  if (std::string why = check_shape(shape); !why.empty())
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("model {}: attention kernels: {}", m.name, why));
  layers = cfg.layers_run ? std::min(cfg.layers_run, m.layers) : m.layers;
  hidden = m.hidden;
  q_cols = uint64_t{r.heads} * m.head_dim;
  kv_cols = uint64_t{r.kv_heads} * m.head_dim;
  qkv_cols = q_cols + 2 * kv_cols;
  inter = r.intermediate;
  if (hidden % 8 || q_cols % 8 || inter % 8 || vocab_rows % 8)
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("model {}: widths must be multiples of 8", m.name));
  MEMSIM_STEP_CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  MEMSIM_STEP_CU(cudaEventCreate(&ev0));
  MEMSIM_STEP_CU(cudaEventCreate(&ev1));
  MEMSIM_STEP_CU(query_device(&limits));
  packer = StepPacker({cfg.max_seqs, cfg.max_tokens, layers, kv_cols * shape.kv_elem_bytes(), vocab,
                       shape, limits, m.sliding_window});

  layer.resize(layers);
  for (uint32_t l = 0; l < layers; ++l) MEMSIM_TRY(init_layer(l));
  // The vocabulary rows [v0, v0 + vocab_rows) of the padded table; those past the model's are
  // padding (zero).
  const uint64_t v0 = uint64_t{tp_rank} * vocab_rows;
  const uint64_t real = std::min<uint64_t>(vocab_rows, m.vocab - std::min<uint64_t>(v0, m.vocab));
  const std::vector<Piece> vocab_part = rows_of(hidden, {{v0, real}});
  MEMSIM_ASSIGN_OR_RETURN(
      embed, weight(hidden, vocab_part, kGlobalLayer, kEmbedding, 1.0f, 0, vocab_rows - real));
  MEMSIM_ASSIGN_OR_RETURN(final_norm, whole(hidden, kGlobalLayer, kFinalNorm, 0.1f, 1.0f));
  if (m.tie_embeddings) {
    lm_head = embed;
  } else {
    const float scale = 1.0f / std::sqrt(static_cast<float>(hidden));
    MEMSIM_ASSIGN_OR_RETURN(
        lm_head, weight(hidden, vocab_part, kGlobalLayer, kLmHead, scale, 0, vocab_rows - real));
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

// Layer l's weights: the rank's shard of each whole tensor (all of it on one GPU). Scales are
// the whole tensor's (1/sqrt of its in_features).
Status ModelStep::Impl::init_layer(uint32_t l) {
  const ModelShape& m = cfg.model;
  auto lin = [](uint64_t in) { return 1.0f / std::sqrt(static_cast<float>(in)); };
  const uint64_t hd = m.head_dim, full_q = uint64_t{m.heads} * hd;
  const uint64_t full_kv = uint64_t{m.kv_heads} * hd;
  const uint64_t q0 = uint64_t{tp_rank} * q_cols, k0 = uint64_t{kv_head0} * hd;
  const uint64_t i0 = uint64_t{tp_rank} * inter;
  // QKVParallelLinear's rows: the rank's query heads, then its KV heads' k and v.
  const std::vector<std::pair<uint64_t, uint64_t>> qkv_rows = {
      {q0, q_cols}, {full_q + k0, kv_cols}, {full_q + full_kv + k0, kv_cols}};
  Layer& L = layer[l];
  MEMSIM_ASSIGN_OR_RETURN(L.input_norm, whole(hidden, l, kInputNorm, 0.1f, 1.0f));
  MEMSIM_ASSIGN_OR_RETURN(L.qkv,
                          weight(hidden, rows_of(hidden, qkv_rows), l, kQkv, lin(hidden), 0));
  if (m.qkv_bias) {
    MEMSIM_ASSIGN_OR_RETURN(L.qkv_bias, weight(1, rows_of(1, qkv_rows), l, kQkvBias, 0.1f, 0));
  }
  if (m.qk_norm) {
    MEMSIM_ASSIGN_OR_RETURN(L.q_norm, whole(hd, l, kQNorm, 0.1f, 1.0f));
    MEMSIM_ASSIGN_OR_RETURN(L.k_norm, whole(hd, l, kKNorm, 0.1f, 1.0f));
  }
  MEMSIM_ASSIGN_OR_RETURN(L.o, weight(full_q, {{0, hidden, q0, q_cols}}, l, kO, lin(full_q), 0));
  MEMSIM_ASSIGN_OR_RETURN(L.post_norm, whole(hidden, l, kPostNorm, 0.1f, 1.0f));
  MEMSIM_ASSIGN_OR_RETURN(
      L.gate_up, weight(hidden, rows_of(hidden, {{i0, inter}, {m.intermediate + i0, inter}}), l,
                        kGateUp, lin(hidden), 0));
  MEMSIM_ASSIGN_OR_RETURN(
      L.down, weight(m.intermediate, {{0, hidden, i0, inter}}, l, kDown, lin(m.intermediate), 0));
  return {};
}

}  // namespace memsim
