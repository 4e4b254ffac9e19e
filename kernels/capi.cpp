// C entry points of the kernels for tools/attention_check.py and tools/attn_sdpa.py (ctypes over
// PyTorch tensors' device pointers): plain integers and pointers, cudaError_t as int.
//
// KV cache dtype (the trailing kv_cache, k_scale, v_scale of the KV write, decode and prefill):
// kv_cache 0 stores K/V in the compute dtype (fp16 flag) and ignores the scales; 1 = fp8 e4m3,
// 2 = fp8 e5m2 (KvCacheDtype's order), one byte per element, quantized by memsim_kv_write as
// fp8(value / scale) with vLLM's per-tensor k_scale / v_scale, dequantized by decode and prefill
// (code x scale). For fp8 caches block_stride counts bytes (elements of the cache). The
// planners do not depend on the KV dtype.
#include <cstdint>
#include <vector>

#include "kernels/attention.h"

using namespace memsim::kernels;

namespace {

AttentionShape shape_of(uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim, int fp16,
                        int kv_cache = 0) {
  return {q_heads, kv_heads, head_dim, fp16 ? KvDtype::kFp16 : KvDtype::kBf16,
          static_cast<KvCacheDtype>(kv_cache)};
}

bool valid_kv_cache(int kv_cache) {
  return kv_cache >= 0 && kv_cache <= static_cast<int>(KvCacheDtype::kFp8E5m2);
}

KvLayerView view_of(uint64_t k, uint64_t v, int64_t block_stride, uint32_t block_size,
                    int contiguous) {
  return {k, v, block_stride, block_size,
          contiguous ? KvAddressing::kContiguous : KvAddressing::kPaged};
}

}  // namespace

extern "C" {

// Fills *num_splits and *workspace_bytes for a decode launch; force_splits 0 = heuristic; window:
// sliding window (0 = full attention), here and in the launches below.
int memsim_plan_decode(uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim, int fp16,
                       uint32_t max_batch, uint32_t max_kv_len, uint32_t force_splits,
                       uint32_t* num_splits, uint64_t* workspace_bytes, uint32_t window) {
  DeviceLimits lim;
  if (cudaError_t e = query_device(&lim); e != cudaSuccess) return e;
  const DecodePlan p = plan_decode(shape_of(q_heads, kv_heads, head_dim, fp16), max_batch,
                                   max_kv_len, lim, force_splits, 0, window);
  *num_splits = p.num_splits;
  *workspace_bytes = p.workspace_bytes;
  return 0;
}

int memsim_decode(uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim, int fp16, int contiguous,
                  uint64_t q, uint64_t o, uint64_t k, uint64_t v, int64_t block_stride,
                  uint32_t block_size, const int32_t* kv_lens, const int32_t* block_tables,
                  uint32_t bt_stride, const int32_t* slots, const int32_t* num_seqs,
                  uint32_t max_batch, uint32_t num_splits, uint64_t workspace, float scale,
                  uint64_t stream, uint32_t window, int kv_cache, float k_scale, float v_scale) {
  if (!valid_kv_cache(kv_cache)) return cudaErrorInvalidValue;
  const AttentionShape sh = shape_of(q_heads, kv_heads, head_dim, fp16, kv_cache);
  DecodePlan plan;
  plan.max_batch = max_batch;
  plan.num_splits = num_splits;
  DecodeArgs a;
  a.q = q;
  a.o = o;
  a.cache = view_of(k, v, block_stride, block_size, contiguous);
  a.seqs = {kv_lens, block_tables, bt_stride, slots, num_seqs};
  a.workspace = workspace;
  a.scale = scale;
  a.window = window;
  a.kv_scales = {k_scale, v_scale};
  return paged_decode(sh, plan, a, reinterpret_cast<cudaStream_t>(stream));
}

// Writes the prefill work list (2 ints per tile, at most `cap` tiles) and returns the number of
// tiles, or -1 when cap is too small.
int64_t memsim_plan_prefill(uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim, int fp16,
                            const int32_t* q_lens, const int32_t* kv_lens, uint32_t batch,
                            int32_t* work, uint64_t cap) {
  const PrefillPlan p = plan_prefill(shape_of(q_heads, kv_heads, head_dim, fp16),
                                     std::vector<int32_t>(q_lens, q_lens + batch),
                                     std::vector<int32_t>(kv_lens, kv_lens + batch));
  if (p.num_tiles > cap) return -1;
  for (size_t i = 0; i < p.work.size(); ++i) work[i] = p.work[i];
  return p.num_tiles;
}

// memsim_prefill with a split-KV plan (memsim_plan_prefill_split's split words and a workspace
// of its workspace_bytes); split null: unsplit, as memsim_prefill.
int memsim_prefill_split(uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim, int fp16,
                         int contiguous, uint64_t q, uint64_t o, uint64_t k, uint64_t v,
                         int64_t block_stride, uint32_t block_size, const int32_t* qo_indptr,
                         const int32_t* kv_lens, const int32_t* block_tables, uint32_t bt_stride,
                         const int32_t* slots, const int32_t* work, uint32_t num_tiles, float scale,
                         uint64_t stream, uint32_t window, int kv_cache, float k_scale,
                         float v_scale, const uint32_t* split, uint64_t workspace) {
  if (!valid_kv_cache(kv_cache)) return cudaErrorInvalidValue;
  PrefillArgs a;
  a.q = q;
  a.o = o;
  a.qo_indptr = qo_indptr;
  a.cache = view_of(k, v, block_stride, block_size, contiguous);
  a.seqs = {kv_lens, block_tables, bt_stride, slots, nullptr};
  a.work = work;
  a.num_tiles = num_tiles;
  a.scale = scale;
  a.window = window;
  a.kv_scales = {k_scale, v_scale};
  if (split != nullptr) a.split = {split[0], split[1], split[2], split[3]};
  a.workspace = workspace;
  return paged_prefill(shape_of(q_heads, kv_heads, head_dim, fp16, kv_cache), a,
                       reinterpret_cast<cudaStream_t>(stream));
}

int memsim_prefill(uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim, int fp16, int contiguous,
                   uint64_t q, uint64_t o, uint64_t k, uint64_t v, int64_t block_stride,
                   uint32_t block_size, const int32_t* qo_indptr, const int32_t* kv_lens,
                   const int32_t* block_tables, uint32_t bt_stride, const int32_t* slots,
                   const int32_t* work, uint32_t num_tiles, float scale, uint64_t stream,
                   uint32_t window, int kv_cache, float k_scale, float v_scale) {
  return memsim_prefill_split(q_heads, kv_heads, head_dim, fp16, contiguous, q, o, k, v,
                              block_stride, block_size, qo_indptr, kv_lens, block_tables, bt_stride,
                              slots, work, num_tiles, scale, stream, window, kv_cache, k_scale,
                              v_scale, nullptr, 0);
}

// Plans a split-KV prefill: plan_prefill with the current device's limits (FlashInfer's chunk
// rule), or with the longest tile's KV range in force_chunks chunks (> 0). Writes the work words
// (at most `cap`; *words of them), split[4] = {kv_chunk, max_chunks, total_q, partial_rows}
// (kv_chunk 0: not split, the words are memsim_plan_prefill's) and *workspace_bytes; returns the
// grid rows, or -1 when cap is too small. `window`: the launch's sliding window (0: none), whose
// tiles' chunks count from their windows' starts.
int64_t memsim_plan_prefill_split(uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim, int fp16,
                                  const int32_t* q_lens, const int32_t* kv_lens, uint32_t batch,
                                  uint32_t force_chunks, int32_t* work, uint64_t cap,
                                  uint64_t* words, uint32_t* split, uint64_t* workspace_bytes,
                                  uint32_t window) {
  DeviceLimits lim;
  if (query_device(&lim) != cudaSuccess) return -1;
  const PrefillPlan p = plan_prefill(
      shape_of(q_heads, kv_heads, head_dim, fp16), std::vector<int32_t>(q_lens, q_lens + batch),
      std::vector<int32_t>(kv_lens, kv_lens + batch), &lim, force_chunks, 0, window);
  if (p.work.size() > cap) return -1;
  for (size_t i = 0; i < p.work.size(); ++i) work[i] = p.work[i];
  *words = p.work.size();
  split[0] = p.split.kv_chunk;
  split[1] = p.split.max_chunks;
  split[2] = p.split.total_q;
  split[3] = p.split.partial_rows;
  *workspace_bytes = p.workspace_bytes;
  return p.num_tiles;
}

int memsim_kv_write(uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim, int fp16,
                    uint64_t k_new, uint64_t v_new, int64_t new_stride, const int64_t* slot_mapping,
                    uint32_t num_tokens, uint64_t k, uint64_t v, int64_t block_stride,
                    uint32_t block_size, int contiguous, uint32_t slot_tokens, uint64_t stream,
                    int kv_cache, float k_scale, float v_scale) {
  if (!valid_kv_cache(kv_cache)) return cudaErrorInvalidValue;
  KvWriteArgs a;
  a.k_new = k_new;
  a.v_new = v_new;
  a.new_stride = new_stride;
  a.slot_mapping = slot_mapping;
  a.num_tokens = num_tokens;
  a.cache = view_of(k, v, block_stride, block_size, contiguous);
  a.slot_tokens = slot_tokens;
  a.kv_scales = {k_scale, v_scale};
  return paged_kv_write(shape_of(q_heads, kv_heads, head_dim, fp16, kv_cache), a,
                        reinterpret_cast<cudaStream_t>(stream));
}

int memsim_copy_blocks(uint64_t src, uint64_t dst, uint64_t src_region_stride,
                       uint64_t dst_region_stride, uint64_t src_block_stride,
                       uint64_t dst_block_stride, uint64_t block_bytes, uint32_t regions,
                       const int64_t* pairs, uint32_t num_pairs, uint64_t stream) {
  BlockCopyArgs a;
  a.src = src;
  a.dst = dst;
  a.src_region_stride = src_region_stride;
  a.dst_region_stride = dst_region_stride;
  a.src_block_stride = src_block_stride;
  a.dst_block_stride = dst_block_stride;
  a.block_bytes = block_bytes;
  a.regions = regions;
  a.pairs = pairs;
  a.num_pairs = num_pairs;
  return copy_blocks(a, reinterpret_cast<cudaStream_t>(stream));
}

int memsim_read_bandwidth(uint64_t p, uint64_t bytes, uint32_t* sink, uint64_t stream) {
  return read_bandwidth(p, bytes, sink, reinterpret_cast<cudaStream_t>(stream));
}

}  // extern "C"
