// Model shapes (layer counts, widths, dtypes) as typed data, and the derived byte counts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/attention_types.h"

namespace memsim {

// kFP8 is e4m3 (vLLM's kv_cache_dtype "fp8" and "fp8_e4m3"); kFP8E5M2 its e5m2 variant.
enum class DType : uint8_t { kBF16, kFP16, kFP32, kFP8, kInt32, kInt64, kFP8E5M2 };
uint64_t dtype_bytes(DType t);
const char* to_string(DType t);

// vLLM's kv_cache_dtype names (CacheDType): auto, fp8, fp8_e4m3, fp8_e5m2.
const std::vector<std::string>& kv_cache_dtype_names();
// The KV cache dtype a name gives: nullopt for "auto" (the model's dtype), kFP8 for "fp8" and
// "fp8_e4m3" (vLLM's fp8 is e4m3), kFP8E5M2 for "fp8_e5m2". The name must be one of
// kv_cache_dtype_names() (callers check it against that list first).
std::optional<DType> kv_cache_dtype_from_name(const std::string& name);
// The attention kernels' cache format for a KV dtype: the fp8 formats, kAuto (the model's
// dtype) for the rest.
kernels::KvCacheDtype kernel_kv_cache(DType kv);

struct ModelShape {
  std::string name;
  uint32_t layers = 0;
  uint64_t hidden = 0;
  uint32_t heads = 0;
  uint32_t kv_heads = 0;
  uint64_t head_dim = 0;
  uint64_t intermediate = 0;
  uint64_t vocab = 0;
  DType dtype = DType::kBF16;  // weights and activations
  // The KV cache's element type (vLLM's kv_cache_dtype); nullopt is vLLM's "auto": the model's
  // dtype. Set by a serving run's engine.kv_cache_dtype, never by a model file.
  std::optional<DType> kv_dtype;
  DType kv_cache_dtype() const { return kv_dtype.value_or(dtype); }
  bool tie_embeddings = false;  // lm_head shares the embedding matrix
  bool qkv_bias = false;        // q/k/v projections carry biases (Qwen2/Qwen2.5)
  bool qk_norm = false;         // per-head RMSNorm on q and k, head_dim weights each (Qwen3)
  // Numerics the model executor needs (config.json's rope_theta, rms_norm_eps, rope_scaling).
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  struct RopeScaling {  // rope_type "llama3" (Llama 3.1); factor 0 = none
    double factor = 0, low_freq_factor = 1, high_freq_factor = 4;
    uint64_t original_max_position = 8192;
  } rope_scaling;
  // RoPE inverse frequencies of the head_dim / 2 dimension pairs, in fp32 as the executor and
  // transformers' _compute_default_rope_parameters / _compute_llama3_parameters compute them.
  std::vector<float> rope_inv_freq() const;

  uint64_t weight_bytes() const;            // embeddings, attention, MLP, norms, lm_head
  uint64_t layer_weight_bytes() const;      // one decoder layer (attention, MLP, its two norms)
  uint64_t embedding_weight_bytes() const;  // vocab x hidden: the embedding (or an untied lm_head)
  uint64_t kv_bytes_per_token() const;      // 2 (K and V) x layers x kv_heads x head_dim x KV dtype

  // Sliding-window attention (config.json's sliding_window, sliding_window_pattern): 0 = none.
  // With a window and pattern N > 0, layer l is full attention when (l + 1) % N == 0 (Gemma 2
  // and 3: every N-th layer global), sliding otherwise; pattern 0: every layer slides (Mistral).
  uint32_t sliding_window = 0;
  uint32_t sliding_window_pattern = 0;
  uint32_t first_layer = 0;  // a pipeline stage's first layer (the pattern counts from layer 0)
  // The window of layer `layer` of this shape (0 = full attention).
  uint32_t layer_window(uint32_t layer) const;
  std::vector<uint32_t> layer_windows() const;  // one per layer
};

}  // namespace memsim
