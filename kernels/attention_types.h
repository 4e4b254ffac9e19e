// Types and CPU planning of the KV-cache kernels: shapes, cache views, per-sequence tables, plans
// and launch arguments. Plain C++ (no CUDA headers): the sim build plans and checks with it too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memsim::kernels {

enum class KvDtype : uint8_t { kBf16, kFp16 };
inline constexpr uint32_t dtype_bytes(KvDtype) {
  return 2;
}
const char* to_string(KvDtype d);

// The KV cache's element type (vLLM's kv_cache_dtype): kAuto stores K/V in the shape's dtype;
// the fp8 formats store one byte per element, quantized by the KV write as value / scale
// (saturated to the format's largest finite value: 448 for e4m3, 57344 for e5m2) with one
// per-tensor scale for K and one for V, and dequantized in registers (x * scale) by decode and
// prefill, which compute in the shape's dtype as before.
enum class KvCacheDtype : uint8_t { kAuto, kFp8E4m3, kFp8E5m2 };
const char* to_string(KvCacheDtype d);

// How the kernels find token `pos` of a sequence in one layer's K (or V) cache. A token row is
// [kv_heads, head_dim] elements, rows of a block (or of a contiguous sequence) are adjacent.
//   paged:      elem(pos) = block_table[pos / block_size] * block_stride + (pos % block_size) * row
//               vLLM's [num_blocks, block_size, kv_heads, head_dim] has block_stride =
//               block_size * row; a larger stride addresses blocks of a pool that interleaves
//               other data between them. SGLang's token-slot pool is block_size 1 over
//               req_to_token.
//   contiguous: elem(pos) = slot * seq_stride + pos * row (vAttention's per-layer virtual
//               tensors [max_batch, max_len, kv_heads, head_dim], FlashAttention's
//               cache_batch_idx): no page table.
enum class KvAddressing : uint8_t { kPaged, kContiguous };
const char* to_string(KvAddressing a);

struct AttentionShape {
  uint32_t q_heads = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;           // 64, 128 or 256
  KvDtype dtype = KvDtype::kBf16;  // Q, O and the computation (and K/V when kv_cache is kAuto)
  KvCacheDtype kv_cache = KvCacheDtype::kAuto;
  uint32_t group() const { return kv_heads ? q_heads / kv_heads : 0; }
  uint64_t row_elems() const { return uint64_t{kv_heads} * head_dim; }  // one token of K or V
  bool kv_fp8() const { return kv_cache != KvCacheDtype::kAuto; }
  uint32_t kv_elem_bytes() const { return kv_fp8() ? 1 : dtype_bytes(dtype); }
};

// Per-tensor dequantization scales of an fp8 KV cache (vLLM's k_scale, v_scale; 1.0 unless
// calibrated). Ignored when the cache stores the shape's dtype.
struct KvScales {
  float k = 1.f, v = 1.f;
};

// Empty when the shape is supported, else why not (head_dim 64/128/256, 1..8 query heads per KV
// head, q_heads a multiple of kv_heads).
std::string check_shape(const AttentionShape& s);

// One layer's cache as the kernels address it (element pointers of the storage dtype; strides in
// elements of it: bytes for fp8, where they must be multiples of 16).
struct KvLayerView {
  uint64_t k = 0, v = 0;     // device addresses of element 0 of K and of V
  int64_t block_stride = 0;  // paged: elements between blocks (1 .. 2^32 - 1); contiguous: slots
  uint32_t block_size = 0;   // paged: tokens per block (any value >= 1); contiguous: unused
  KvAddressing addressing = KvAddressing::kPaged;
};

// Where a batch's per-sequence metadata lives (device memory, read at run time so one captured
// CUDA graph serves every batch up to its capture size).
struct SeqTables {
  const int32_t* kv_lens = nullptr;       // [max_batch] tokens of KV per sequence (incl. new ones)
  const int32_t* block_tables = nullptr;  // paged: [max_batch, bt_stride] block ids
  uint32_t bt_stride = 0;
  const int32_t* slots = nullptr;     // contiguous: [max_batch] slot of each sequence
  const int32_t* num_seqs = nullptr;  // optional device scalar: active batch <= max_batch
};

// ---- decode: one query token per sequence ------------------------------------------------------

// Device facts the planners need (cudaGetDeviceProperties; see query_device()).
struct DeviceLimits {
  uint32_t num_sms = 132;
  uint32_t decode_ctas_per_sm = 2;  // resident decode CTAs per SM (occupancy)
  // Prefill CTAs per SM the split-KV planner counts a wave in (FlashInfer's PrefillPlan takes 2;
  // the prefill kernel's 255 registers x 128 threads allow 2 at head_dim 128 on Hopper).
  uint32_t prefill_ctas_per_sm = 2;
  // Whether paged_prefill runs bf16/fp16 head_dim-128 prefill on the Hopper wgmma kernel, split
  // launches included (query_device: prefill_sm90_eligible). The split planner then cuts those
  // shapes' KV ranges in its 128-token tiles (kSm90KvTile) and counts one CTA per SM (its shared
  // memory holds one).
  bool prefill_sm90 = false;
};

// Decode CTAs an SM holds for `shape`: device.decode_ctas_per_sm (query_device measures the bf16
// head_dim-128 kernel) capped by the shape's kernel's launch bound (decode_ctas_bound: 2 over an
// fp8 cache, 1 at head_dim 256). The decode planners count CTA slots with it.
uint32_t decode_ctas(const AttentionShape& shape, const DeviceLimits& device);

struct DecodePlan {
  uint32_t max_batch = 0;        // grid rows; sequences >= *num_seqs exit early
  uint32_t num_splits = 1;       // KV split across CTAs (flash-decoding); 1 = no combine pass
  uint32_t kv_tile = 64;         // tokens per KV tile; splits are whole tiles
  uint64_t workspace_bytes = 0;  // partial outputs + log-sum-exp when num_splits > 1
  // > 0: the grid rows are the chunks of a work list (DecodeArgs::work, plan_decode_work), at
  // most this many, and num_splits bounds one sequence's chunks (the combine's shared memory).
  uint32_t work_capacity = 0;
};

// Splits the KV dimension (flash-decoding) when max_batch x kv_heads CTAs leave CTA slots
// (num_sms x decode_ctas) idle: under one wave, splits up to two CTAs per SM; between one
// and four waves, the split count up to 4 with the fullest last wave; each split at least two
// tiles long. `force_splits` (> 0) overrides the heuristic (tests, benchmarks). `sum_kv_len`
// (the batch's KV tokens in all; 0 = every sequence at max_kv_len) balances ragged batches: the
// heuristic then counts the CTAs the work fills at the longest length (kv_heads x sum /
// max_kv_len), so a long sequence among short ones is split as if it ran alone, as FlashInfer's
// balanced decode scheduling does; launches stay within 16 waves.
//
// `window` (> 0: sliding-window attention, attention_tiles.h) splits only the window: max_kv_len
// counts as at most `window`, and sum_kv_len should then count each sequence's window_len.
DecodePlan plan_decode(const AttentionShape& shape, uint32_t max_batch, uint32_t max_kv_len,
                       const DeviceLimits& device, uint32_t force_splits = 0,
                       uint64_t sum_kv_len = 0, uint32_t window = 0);

// ---- decode work lists: balanced splits, re-planned before every step -------------------------
//
// FlashInfer's balanced decode scheduling: every sequence's KV is cut into chunks of one length
// (chunk_tiles whole KV tiles), one CTA row a chunk, so a long sequence among short ones is split
// and the short ones are not, and no empty split is launched. A sequence of one chunk writes its
// output directly; the chunks of a longer one write partial outputs that the combine merges. The
// list is device data: a captured CUDA graph launches work_capacity rows (the rows past the live
// count exit at once) and its split is re-planned before every replay, as FlashInfer plans into
// fixed buffers. Device layout (int32 words, decode_work_words):
//   [num_items, chunk_tiles, item_seq[capacity], item_chunk[capacity], seq_first[max_batch]]
// a sequence's items together and in chunk order, the sequences longest first (ties in batch
// order); seq_first[s] = the first item of sequence s, -1 past the batch (a graph's padding).
struct DecodeWork {
  DecodePlan plan;  // the launch (work_capacity > 0)
  uint32_t chunk_tiles = 0, num_items = 0;
  std::vector<int32_t> words;  // upload to device memory for the launch
};

uint64_t decode_work_words(uint32_t capacity, uint32_t max_batch);

// The launch a captured decode step of `max_batch` sequences of up to `max_kv_len` tokens fixes:
// work_capacity = max(max_batch x the uniform split of plan_decode, one wave of two CTAs per SM
// / kv_heads), num_splits = the most chunks of at least two tiles one sequence can have (within
// the capacity), and the workspace for them. Every later plan of that graph must fit it (and
// use its window: a windowed launch is planned at max_kv_len capped to the window).
DecodePlan plan_decode_graph(const AttentionShape& shape, uint32_t max_batch, uint32_t max_kv_len,
                             const DeviceLimits& device, uint32_t window = 0);

// The work list of a batch with these KV lengths. The chunk length takes plan_decode's split of
// the longest sequence, balanced by the batch's sum (a uniform batch is cut exactly as
// plan_decode's split_range cuts it). `fixed` (a plan_decode_graph launch): the list fits its
// capacity and combine bound, longer chunks where needed (FlashInfer's binary search); its
// words are then sized for it (and empty when the batch exceeds its max_batch). Null: an eager
// launch of exactly the list's rows. `window` (> 0): each sequence's chunks cover only its last
// window_len tokens (chunk j from window_begin + j x chunk), so the list is the one of a batch
// of window_len lengths; the launch must pass the same window.
DecodeWork plan_decode_work(const AttentionShape& shape, const std::vector<int32_t>& kv_lens,
                            const DeviceLimits& device, const DecodePlan* fixed = nullptr,
                            uint32_t window = 0);

// KV range [begin, end) of split `split` for a sequence of kv_len tokens: splits are contiguous,
// tile-aligned and cover [0, kv_len); late splits may be empty. (The kernels use the same rule.)
// With a window the splits cover [window_begin, kv_len) the same way, tiles counted from there.
void decode_split_range(const DecodePlan& plan, uint32_t kv_len, uint32_t split, uint32_t* begin,
                        uint32_t* end, uint32_t window = 0);

struct DecodeArgs {
  uint64_t q = 0;  // [max_batch, q_heads, head_dim]
  uint64_t o = 0;  // [max_batch, q_heads, head_dim]
  KvLayerView cache;
  SeqTables seqs;
  uint64_t workspace = 0;         // plan.workspace_bytes of device memory (unused when 1 split)
  const int32_t* work = nullptr;  // device copy of DecodeWork::words when plan.work_capacity > 0
  float scale = 0;                // softmax scale (0 = 1/sqrt(head_dim))
  KvScales kv_scales;             // fp8 caches
  // Sliding window (0 = full attention): the query sees the last `window` tokens only, and the
  // kernel reads no tile before them. The plan must come from the planners with this window.
  uint32_t window = 0;
};

// ---- prefill: a chunk of new tokens per sequence, causal over its cached prefix and itself ------

// Query rows of a CTA are (token, query head of the KV head) pairs, whole tokens per tile:
// prefill_rows(head_dim) / group tokens (attention_tiles.h).
uint32_t prefill_tokens_per_tile(const AttentionShape& shape);

// Split-KV prefill (FlashInfer's split prefill, PrefillSplitQOKVIndptr): when a step's query
// tiles alone leave the GPU idle (a short chunk over a long cached prefix), each tile's causal KV
// range is cut into chunks of kv_chunk tokens, one CTA row a chunk. Chunks write partial outputs
// and log-sum-exps into a workspace, which the decode combine's math merges per query token.
// Eager only: the work list and workspace are sized per step (a graph would need FlashInfer's
// padded, fixed-capacity lists; memsim's executor captures decode steps only).
struct PrefillSplit {
  uint32_t kv_chunk = 0;      // KV tokens per chunk, whole KV tiles; 0 = not split
  uint32_t max_chunks = 0;    // most chunks one query token's keys span (the merge's bound)
  uint32_t total_q = 0;       // query tokens (the merge's rows)
  uint32_t partial_rows = 0;  // workspace rows: every token's chunk count, summed
};

struct PrefillPlan {
  // One work item per CTA row of the grid: {sequence, first query token of the tile}, longest KV
  // range first (causal tiles late in a sequence do the most work). Split: {sequence, first
  // token, KV chunk} per item (each tile's chunks together), then the merge's indptr over the
  // query tokens (total_q + 1 words: token i's partial rows start at indptr[i], one per chunk
  // of its tile's range that its causal range reaches).
  std::vector<int32_t> work;  // upload to device memory for the launch
  uint32_t num_tiles = 0;     // grid rows (work items)
  uint64_t total_q = 0;
  PrefillSplit split;
  uint64_t workspace_bytes = 0;  // split: partial outputs + log-sum-exp (fp32)
};
// q_lens: new tokens of each sequence (host copy of the indptr differences); kv_lens: KV tokens
// after the chunk (prefix + q_len). `device` null: never split (callers without a workspace);
// given: the plan decides, splitting only when the tiles x KV heads fill less than one wave of
// device->num_sms x prefill_ctas_per_sm CTAs (so long chunks keep the unsplit plan and its bits);
// with device->prefill_sm90, a head_dim-128 bf16/fp16 shape counts one CTA per SM and cuts
// chunks of kSm90KvTile tokens (the Hopper kernel's tiles).
// `force_chunks` > 0 (tests, benchmarks): the longest tile's range in that many chunks (the
// others in chunks of the same length); 1, or a chunk past every range, is the unsplit plan.
// `force_chunk_tokens` > 0: chunks of that many KV tokens (rounded up to whole KV tiles), so that
// some of a split step's sequences, planned apart with the step's split.kv_chunk, are cut as the
// step cut them (a reference of the same arithmetic); unsplit when every range fits one chunk.
// `window` (> 0, the launch's sliding window): a tile's range starts at its first query's window
// start (the kernels' first key), and its chunks count from there (FlashInfer's effective KV
// length), so a short chunk over a long prefix splits only the window it reads.
PrefillPlan plan_prefill(const AttentionShape& shape, const std::vector<int32_t>& q_lens,
                         const std::vector<int32_t>& kv_lens, const DeviceLimits* device = nullptr,
                         uint32_t force_chunks = 0, uint32_t force_chunk_tokens = 0,
                         uint32_t window = 0);

struct PrefillArgs {
  uint64_t q = 0;                      // [total_q, q_heads, head_dim], sequences back to back
  uint64_t o = 0;                      // same shape
  const int32_t* qo_indptr = nullptr;  // [batch + 1] device: first query token of each sequence
  KvLayerView cache;
  SeqTables seqs;                 // kv_lens include the chunk's tokens
  const int32_t* work = nullptr;  // device copy of plan.work
  uint32_t num_tiles = 0;
  float scale = 0;
  KvScales kv_scales;      // fp8 caches
  PrefillSplit split;      // plan.split (kv_chunk 0: the unsplit kernel)
  uint64_t workspace = 0;  // split: plan.workspace_bytes of device memory
  // Sliding window (0 = full attention): query position p sees keys p - window < k <= p; a CTA
  // reads no KV before its first query's window.
  uint32_t window = 0;
};

// ---- one layer of a step: decode or prefill -----------------------------------------------------

// What an executor launches per layer: decode when every sequence has one query token (dplan,
// workspace and work as for DecodeArgs), else prefill (qo_indptr, work, num_tiles as for
// PrefillArgs; psplit as PrefillArgs::split, with `workspace` its workspace).
struct LayerAttentionArgs {
  bool decode = true;
  uint64_t q = 0, o = 0;
  KvLayerView cache;
  SeqTables seqs;
  DecodePlan dplan;
  uint64_t workspace = 0;
  const int32_t* qo_indptr = nullptr;
  const int32_t* work = nullptr;
  uint32_t num_tiles = 0;
  float scale = 0;
  KvScales kv_scales;  // fp8 caches
  PrefillSplit psplit;
  uint32_t window = 0;  // sliding window (0 = full attention), as in DecodeArgs and PrefillArgs
};

// ---- KV write, block copies, swaps -------------------------------------------------------------

// vLLM reshape_and_cache: token i's K and V rows go to slot slot_mapping[i] of the layer cache
// (slot = block * block_size + offset for paged views, slot * max_len + pos for contiguous ones,
// i.e. slot = row index at block_size granularity); a negative slot skips a padding token.
struct KvWriteArgs {
  uint64_t k_new = 0, v_new = 0;  // [num_tokens, kv_heads, head_dim] with row stride new_stride
  int64_t new_stride = 0;         // elements between tokens (0 = kv_heads x head_dim)
  const int64_t* slot_mapping = nullptr;  // [num_tokens] device
  uint32_t num_tokens = 0;
  KvLayerView cache;
  // Contiguous views: tokens per slot (slot_mapping holds slot * slot_tokens + pos). Paged views
  // use cache.block_size.
  uint32_t slot_tokens = 0;
  // fp8 caches (shape.kv_cache): each element is stored as fp8(value / scale), saturated
  // (vLLM's reshape_and_cache_flash with kv_cache_dtype fp8).
  KvScales kv_scales;
};

// vLLM copy_blocks / swap_blocks over `regions` regions (e.g. K and V of every layer): for each
// pair p, bytes [src_region + pairs[2p] * src_block_stride, +block_bytes) go to
// [dst_region + pairs[2p+1] * dst_block_stride, ...), in every region. Either side may be pinned
// host memory (swap): the copy kernel reads and writes it through unified addressing. All sizes
// and strides must be multiples of 16 bytes.
struct BlockCopyArgs {
  uint64_t src = 0, dst = 0;  // region 0 base addresses
  uint64_t src_region_stride = 0, dst_region_stride = 0;
  uint64_t src_block_stride = 0, dst_block_stride = 0;
  uint64_t block_bytes = 0;
  uint32_t regions = 1;
  const int64_t* pairs = nullptr;  // [num_pairs, 2] {src block, dst block}, device-readable
  uint32_t num_pairs = 0;
  // Optional device arrays of `regions` base addresses (regions not evenly spaced, e.g.
  // vAttention's per-layer tensors; each 16-byte aligned); when set they replace
  // src/dst + r x region stride.
  const uint64_t* src_regions = nullptr;
  const uint64_t* dst_regions = nullptr;
};

}  // namespace memsim::kernels
