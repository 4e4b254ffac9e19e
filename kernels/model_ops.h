// Host launchers of the model-step kernels around attention and GEMMs: RMSNorm (with vLLM's
// fused residual add, and per-head q/k norm), rotary embedding, SiLU-and-mul, embedding gather
// and greedy sampling. bf16 or fp16 storage, fp32 math. Each enqueues on a stream and returns
// cudaError_t (cudaErrorInvalidValue for arguments it rejects, launching nothing).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention_types.h"

namespace memsim::kernels {

// RMSNorm of `tokens` x `heads` rows of `dim` elements: row (t, h) starts at element
// t * token_stride + h * dim of x (and of out, residual). out = x / rms(x) * weight, with
// rms = sqrt(mean(x^2) + eps) in fp32 and out rounded once (PyTorch / vLLM rms_norm).
// With `residual` (heads == 1), vLLM's fused_add_rms_norm: residual = x + residual (rounded to
// the storage type) first, then out = norm(residual). out may alias x (in place). dim a multiple
// of 8 up to 8192, rows 16-byte aligned (token_stride a multiple of 8).
struct RmsNormArgs {
  uint64_t x = 0, out = 0;
  uint64_t residual = 0;  // 0: none
  uint64_t weight = 0;    // [dim]
  uint32_t tokens = 0, heads = 1, dim = 0;
  uint64_t token_stride = 0;  // elements between tokens (0 = heads x dim)
  float eps = 1e-6f;
};
cudaError_t rms_norm(KvDtype dtype, const RmsNormArgs& args, cudaStream_t stream);

// Rotary embedding, GPT-NeoX style (rotate the halves of each head, as Llama and Qwen use) of
// the fused QKV rows [tokens, (q_heads + 2 kv_heads) x head_dim]: q rotated into q_out
// ([tokens, q_heads, head_dim], contiguous, what the attention kernels read), k rotated in place.
// The angle of dimension pair i at position p is float(p) * inv_freq[i] (fp32, the host computes
// inv_freq with the model's rope_theta and scaling).
struct RopeArgs {
  uint64_t qkv = 0;
  uint64_t q_out = 0;
  const int32_t* positions = nullptr;  // [tokens] device
  const float* inv_freq = nullptr;     // [head_dim / 2] device
  uint32_t tokens = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
};
cudaError_t rope(KvDtype dtype, const RopeArgs& args, cudaStream_t stream);

// vLLM silu_and_mul: gate_up [tokens, 2 x inter] (gate first) -> out [tokens, inter] with
// out = round(round(silu(gate)) x up), silu in fp32 (as F.silu(gate) * up rounds).
cudaError_t silu_and_mul(KvDtype dtype, uint64_t gate_up, uint64_t out, uint32_t tokens,
                         uint32_t inter, cudaStream_t stream);

// out[t, :] = table[ids[t] - first_id, :] for `tokens` rows of `dim` elements; the table holds
// ids [first_id, first_id + vocab) and any other id gives a zero row (a vocabulary-parallel
// shard: the all-reduce over the ranks then adds the one rank's row that holds it).
cudaError_t embedding(KvDtype dtype, uint64_t table, const int32_t* ids, uint64_t out,
                      uint32_t tokens, uint32_t dim, uint32_t vocab, cudaStream_t stream,
                      uint32_t first_id = 0);

// Greedy sampling: ids[r] = argmax over the `vocab` logits of row r (row stride `stride`
// elements); the lowest index wins a tie (torch.argmax).
cudaError_t argmax_rows(KvDtype dtype, uint64_t logits, uint32_t rows, uint32_t vocab,
                        uint64_t stride, int32_t* ids, cudaStream_t stream);

// out[t, :] = x[rows[t], :]: gathers `tokens` rows of `dim` elements (the last token of each
// sequence before the LM head).
cudaError_t gather_rows(KvDtype dtype, uint64_t x, const int32_t* rows, uint64_t out,
                        uint32_t tokens, uint32_t dim, cudaStream_t stream);

}  // namespace memsim::kernels
