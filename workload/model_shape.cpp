// Model shapes: dtype sizes and names, and the weight / KV-cache byte counts of a model.
#include "workload/model_shape.h"

#include <cmath>

namespace memsim {

uint64_t dtype_bytes(DType t) {
  switch (t) {
    case DType::kBF16:
    case DType::kFP16:
      return 2;
    case DType::kFP32:
    case DType::kInt32:
      return 4;
    case DType::kFP8:
    case DType::kFP8E5M2:
      return 1;
    case DType::kInt64:
      return 8;
  }
  return 0;
}

const char* to_string(DType t) {
  switch (t) {
    case DType::kBF16:
      return "bf16";
    case DType::kFP16:
      return "fp16";
    case DType::kFP32:
      return "fp32";
    case DType::kFP8:
      return "fp8";
    case DType::kFP8E5M2:
      return "fp8_e5m2";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "unknown";
}

const std::vector<std::string>& kv_cache_dtype_names() {
  static const std::vector<std::string> names{"auto", "fp8", "fp8_e4m3", "fp8_e5m2"};
  return names;
}

std::optional<DType> kv_cache_dtype_from_name(const std::string& name) {
  if (name == "auto") return std::nullopt;
  return name == "fp8_e5m2" ? DType::kFP8E5M2 : DType::kFP8;
}

kernels::KvCacheDtype kernel_kv_cache(DType kv) {
  if (kv == DType::kFP8) return kernels::KvCacheDtype::kFp8E4m3;
  if (kv == DType::kFP8E5M2) return kernels::KvCacheDtype::kFp8E5m2;
  return kernels::KvCacheDtype::kAuto;
}

// Parameter count (all weights in the model dtype):
//   embedding                 vocab x hidden
//   per layer  q_proj         hidden x heads x head_dim        (+ heads x head_dim bias)
//              k_proj, v_proj hidden x kv_heads x head_dim each (+ kv_heads x head_dim bias each)
//              q_norm, k_norm head_dim each                     (qk_norm only)
//              o_proj         heads x head_dim x hidden
//              gate, up, down hidden x intermediate each
//              input / post-attention RMSNorm  hidden each
//   final RMSNorm             hidden
//   lm_head                   vocab x hidden (absent when tied to the embedding)
uint64_t ModelShape::layer_weight_bytes() const {
  const uint64_t q_width = uint64_t{heads} * head_dim;
  const uint64_t kv_width = uint64_t{kv_heads} * head_dim;

  uint64_t per_layer = 0;
  per_layer += hidden * q_width;       // q_proj
  per_layer += 2 * hidden * kv_width;  // k_proj, v_proj
  per_layer += q_width * hidden;       // o_proj
  if (qkv_bias) per_layer += q_width + 2 * kv_width;
  if (qk_norm) per_layer += 2 * head_dim;
  per_layer += 3 * hidden * intermediate;  // gate, up, down
  per_layer += 2 * hidden;                 // input and post-attention RMSNorm
  return per_layer * dtype_bytes(dtype);
}

uint64_t ModelShape::embedding_weight_bytes() const {
  return vocab * hidden * dtype_bytes(dtype);
}

uint64_t ModelShape::weight_bytes() const {
  uint64_t bytes = embedding_weight_bytes();
  bytes += uint64_t{layers} * layer_weight_bytes();
  bytes += hidden * dtype_bytes(dtype);                    // final norm
  if (!tie_embeddings) bytes += embedding_weight_bytes();  // lm_head
  return bytes;
}

uint64_t ModelShape::kv_bytes_per_token() const {
  return 2 * uint64_t{layers} * kv_heads * head_dim * dtype_bytes(kv_cache_dtype());
}

uint32_t ModelShape::layer_window(uint32_t layer) const {
  if (sliding_window == 0) return 0;
  const uint32_t global = first_layer + layer;
  return sliding_window_pattern && (global + 1) % sliding_window_pattern == 0 ? 0 : sliding_window;
}

std::vector<uint32_t> ModelShape::layer_windows() const {
  std::vector<uint32_t> w(layers);
  for (uint32_t l = 0; l < layers; ++l) w[l] = layer_window(l);
  return w;
}

std::vector<float> ModelShape::rope_inv_freq() const {
  const uint32_t pairs = static_cast<uint32_t>(head_dim / 2);
  std::vector<float> f(pairs);
  constexpr float kPi = 3.14159265358979f;
  const auto& r = rope_scaling;
  const float old_len = static_cast<float>(r.original_max_position);
  const float low_wavelen = old_len / static_cast<float>(r.low_freq_factor);
  const float high_wavelen = old_len / static_cast<float>(r.high_freq_factor);
  for (uint32_t i = 0; i < pairs; ++i) {
    const float base = 1.0f / std::pow(static_cast<float>(rope_theta),
                                       static_cast<float>(2 * i) / static_cast<float>(head_dim));
    if (r.factor <= 0) {
      f[i] = base;
      continue;
    }
    // Llama 3.1: long wavelengths divided by factor, short ones kept, a smooth ramp between.
    const float factor = static_cast<float>(r.factor);
    const float wavelen = 2 * kPi / base;
    if (wavelen < high_wavelen) {
      f[i] = base;
    } else if (wavelen > low_wavelen) {
      f[i] = base / factor;
    } else {
      const float smooth = (old_len / wavelen - static_cast<float>(r.low_freq_factor)) /
                           static_cast<float>(r.high_freq_factor - r.low_freq_factor);
      f[i] = (1 - smooth) * base / factor + smooth * base;
    }
  }
  return f;
}

}  // namespace memsim
