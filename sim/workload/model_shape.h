// Model shapes (layer counts, widths, dtypes) as typed data, and the derived byte counts.
#pragma once

#include <cstdint>
#include <string>

namespace memsim {

enum class DType : uint8_t { kBF16, kFP16, kFP32, kFP8, kInt32, kInt64 };
uint64_t dtype_bytes(DType t);
const char* to_string(DType t);

struct ModelShape {
  std::string name;
  uint32_t layers = 0;
  uint64_t hidden = 0;
  uint32_t heads = 0;
  uint32_t kv_heads = 0;
  uint64_t head_dim = 0;
  uint64_t intermediate = 0;
  uint64_t vocab = 0;
  DType dtype = DType::kBF16;        // weights and activations
  bool tie_embeddings = false;       // lm_head shares the embedding matrix
  bool qkv_bias = false;             // q/k/v projections carry biases (Qwen2/Qwen2.5)
  bool qk_norm = false;              // per-head RMSNorm on q and k, head_dim weights each (Qwen3)

  uint64_t weight_bytes() const;          // embeddings, attention, MLP, norms, lm_head
  uint64_t kv_bytes_per_token() const;    // 2 (K and V) x layers x kv_heads x head_dim x dtype
};

}  // namespace memsim
