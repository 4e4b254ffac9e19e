// Host launchers of the KV-cache kernels: paged/contiguous decode and prefill attention, KV
// write, block copies and swaps, and the read-bandwidth ceiling. Each enqueues on a stream and
// returns cudaError_t (cudaErrorInvalidValue for arguments it rejects, launching nothing). Plans
// and argument types are in attention_types.h.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention_types.h"

namespace memsim::kernels {

// SM count and decode occupancy of the current device.
cudaError_t query_device(DeviceLimits* out);

cudaError_t paged_kv_write(const AttentionShape& shape, const KvWriteArgs& args,
                           cudaStream_t stream);
// Whether paged_decode copies whole KV tiles by TMA (Hopper tensor maps) for this shape, cache
// and window, rather than by cp.async: paged fp8 caches in blocks of a multiple of 64 tokens at
// head_dim 128 without a window, on compute capability 9.0 or later, unless the environment sets
// MEMSIM_DECODE_TMA=0 (read once) or the view's tensor maps cannot be encoded. The outputs are
// the same either way (bit for bit).
bool decode_uses_tma(const AttentionShape& shape, const KvLayerView& cache, uint32_t window);
cudaError_t paged_decode(const AttentionShape& shape, const DecodePlan& plan,
                         const DecodeArgs& args, cudaStream_t stream);
cudaError_t paged_prefill(const AttentionShape& shape, const PrefillArgs& args,
                          cudaStream_t stream);
// Whether paged_prefill runs this shape on the Hopper wgmma kernel (attention_prefill_sm90.cu):
// bf16/fp16 Q (its own dtype's or an fp8 cache) at head_dim 128 on a compute capability 9.0 device,
// split launches (`split`) as unsplit ones, unless the environment sets MEMSIM_PREFILL_SM90=0 (then
// the mma.sync kernel, as on other GPUs).
bool prefill_sm90_eligible(const AttentionShape& shape, bool split);
// paged_decode or paged_prefill, as args.decode says.
cudaError_t layer_attention(const AttentionShape& shape, const LayerAttentionArgs& args,
                            cudaStream_t stream);
cudaError_t copy_blocks(const BlockCopyArgs& args, cudaStream_t stream);

// The practical bandwidth ceiling: reads [p, p + bytes) with 16-byte loads and XORs what it read
// into one word per CTA of `sink` (device memory, at least 4096 words). bytes a multiple of 16.
cudaError_t read_bandwidth(uint64_t p, uint64_t bytes, uint32_t* sink, cudaStream_t stream);

// Row i of `rows` rows of `row_elems` elements at `out` gets synth_value(a[i], b[i], salt, e)
// (kernels/synth.h) rounded to `dtype`: K/V of tokens (a = token, b = position), Q of requests.
// a and b are device arrays.
cudaError_t synth_rows(KvDtype dtype, uint64_t out, uint32_t rows, uint32_t row_elems,
                       const uint32_t* a, const uint32_t* b, uint32_t salt, cudaStream_t stream);

// Fills `count` elements at `ptr` with offset + scale x (uniform in [-1, 1)) of `dtype`, a
// deterministic function of (seed, index) (benchmark and test data, model weights; with the
// default scale and offset never zero, never NaN).
cudaError_t random_half(KvDtype dtype, uint64_t ptr, uint64_t count, uint64_t seed,
                        cudaStream_t stream, float scale = 1.0f, float offset = 0.0f);

// A block of a row-major tensor whose rows are `full_cols` wide: `count` elements taken `cols`
// per row, starting at element `first` (a tensor-parallel shard of a weight).
struct RandomBlock {
  uint64_t count = 0, cols = 0, full_cols = 0, first = 0;
};
// Fills `ptr` with that block of the tensor random_half(seed, scale, offset) would fill whole:
// a rank's shard holds exactly the bits of the unsharded tensor's part.
cudaError_t random_half_block(KvDtype dtype, uint64_t ptr, const RandomBlock& block, uint64_t seed,
                              cudaStream_t stream, float scale = 1.0f, float offset = 0.0f);

}  // namespace memsim::kernels
