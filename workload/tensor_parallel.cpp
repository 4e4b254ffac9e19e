// Tensor-parallel sharding of a model (vLLM's rules; see tensor_parallel.h).
#include "workload/tensor_parallel.h"

#include <fmt/format.h>

namespace memsim {

namespace {

Error not_divisible(const ModelShape& m, const char* what, uint64_t value, uint32_t tp,
                    const char* rule) {
  return make_error(
      ErrorCode::kInvalidArgument,
      fmt::format("{}: {} ({}) {} tensor_parallel_size {}", m.name, what, value, rule, tp));
}

}  // namespace

Result<TensorParallelShard> shard_tensor_parallel(const ModelShape& m, uint32_t tp) {
  if (tp == 0) return make_error(ErrorCode::kInvalidArgument, "tensor_parallel_size must be >= 1");
  if (m.heads % tp != 0) return not_divisible(m, "heads", m.heads, tp, "do not divide by");
  if (m.intermediate % tp != 0)
    return not_divisible(m, "intermediate", m.intermediate, tp, "does not divide by");
  TensorParallelShard s;
  s.tp = tp;
  s.rank = m;
  s.rank.heads = m.heads / tp;
  if (tp <= m.kv_heads) {
    if (m.kv_heads % tp != 0)
      return not_divisible(m, "kv_heads", m.kv_heads, tp, "do not divide by");
    s.rank.kv_heads = m.kv_heads / tp;
  } else {
    // Fewer KV heads than ranks: each rank holds one, and tp must be a multiple of them.
    if (tp % m.kv_heads != 0)
      return not_divisible(m, "kv_heads", m.kv_heads, tp, "are fewer than and do not divide");
    s.rank.kv_heads = 1;
    s.kv_head_replicas = tp / m.kv_heads;
  }
  s.rank.intermediate = m.intermediate / tp;
  s.vocab_padded = (m.vocab + kVocabPadding - 1) / kVocabPadding * kVocabPadding;
  if (s.vocab_padded % tp != 0)
    return not_divisible(m, "vocab padded to a multiple of 64", s.vocab_padded, tp,
                         "does not divide by");
  s.rank.vocab = s.vocab_padded / tp;
  // Input and post-attention RMSNorm per layer, the final norm; q/k norms are per head_dim.
  uint64_t norms = (2 * uint64_t{m.layers} + 1) * m.hidden;
  if (m.qk_norm) norms += 2 * uint64_t{m.layers} * m.head_dim;
  s.replicated_weight_bytes = norms * dtype_bytes(m.dtype);
  return s;
}

}  // namespace memsim
