// C entry points of the model-step kernels and the cuBLASLt GEMM for tools/model_check.py
// (ctypes over PyTorch tensors' device pointers): plain integers and pointers, cudaError_t as
// int (GEMM: 0 or -1 with the message in a caller buffer).
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/model_ops.h"

using namespace memsim::kernels;

namespace {

KvDtype dtype_of(int fp16) {
  return fp16 ? KvDtype::kFp16 : KvDtype::kBf16;
}
cudaStream_t stream_of(uint64_t s) {
  return reinterpret_cast<cudaStream_t>(s);
}
void put(const std::string& msg, char* buf, uint64_t cap) {
  if (!buf || cap == 0) return;
  const size_t n = std::min<size_t>(msg.size(), cap - 1);
  std::memcpy(buf, msg.data(), n);
  buf[n] = '\0';
}

}  // namespace

extern "C" {

int memsim_random(int fp16, uint64_t ptr, uint64_t count, uint64_t seed, float scale, float offset,
                  uint64_t stream) {
  return random_half(dtype_of(fp16), ptr, count, seed, stream_of(stream), scale, offset);
}

int memsim_rms_norm(int fp16, uint64_t x, uint64_t out, uint64_t residual, uint64_t weight,
                    uint32_t tokens, uint32_t heads, uint32_t dim, uint64_t token_stride, float eps,
                    uint64_t stream) {
  RmsNormArgs a;
  a.x = x;
  a.out = out;
  a.residual = residual;
  a.weight = weight;
  a.tokens = tokens;
  a.heads = heads;
  a.dim = dim;
  a.token_stride = token_stride;
  a.eps = eps;
  return rms_norm(dtype_of(fp16), a, stream_of(stream));
}

int memsim_rope(int fp16, uint64_t qkv, uint64_t q_out, const int32_t* positions,
                const float* inv_freq, uint32_t tokens, uint32_t q_heads, uint32_t kv_heads,
                uint32_t head_dim, uint64_t stream) {
  return rope(dtype_of(fp16),
              {qkv, q_out, positions, inv_freq, tokens, q_heads, kv_heads, head_dim},
              stream_of(stream));
}

int memsim_silu_and_mul(int fp16, uint64_t gate_up, uint64_t out, uint32_t tokens, uint32_t inter,
                        uint64_t stream) {
  return silu_and_mul(dtype_of(fp16), gate_up, out, tokens, inter, stream_of(stream));
}

int memsim_embedding(int fp16, uint64_t table, const int32_t* ids, uint64_t out, uint32_t tokens,
                     uint32_t dim, uint32_t vocab, uint64_t stream) {
  return embedding(dtype_of(fp16), table, ids, out, tokens, dim, vocab, stream_of(stream));
}

int memsim_argmax(int fp16, uint64_t logits, uint32_t rows, uint32_t vocab, uint64_t stride,
                  int32_t* ids, uint64_t stream) {
  return argmax_rows(dtype_of(fp16), logits, rows, vocab, stride, ids, stream_of(stream));
}

// A cuBLASLt GEMM handle (null on failure, message in err).
void* memsim_gemm_open(uint64_t workspace, uint64_t workspace_bytes, char* err, uint64_t cap) {
  std::string why;
  auto g = LtGemm::open(workspace, workspace_bytes, &why);
  put(why, err, cap);
  return g.release();
}

int memsim_gemm(void* gemm, int fp16, uint64_t x, uint64_t w, uint64_t bias, uint64_t y, uint32_t m,
                uint32_t n, uint32_t k, uint64_t stream, char* err, uint64_t cap) {
  const std::string why =
      static_cast<LtGemm*>(gemm)->matmul(dtype_of(fp16), x, w, bias, y, m, n, k, stream_of(stream));
  put(why, err, cap);
  return why.empty() ? 0 : -1;
}

void memsim_gemm_close(void* gemm) {
  delete static_cast<LtGemm*>(gemm);
}

}  // extern "C"
