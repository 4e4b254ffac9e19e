// CPU planning of split-KV prefill: cuts the KV ranges of a prefill work list into chunks across
// CTAs when the query tiles alone leave the GPU idle, and lays out the merge's partial rows.
#include <algorithm>

#include "kernels/attention_tiles.h"
#include "kernels/attention_types.h"

namespace memsim::kernels {

namespace {

// Shortest chunk a planner picks (tokens): a CTA loads its 128 query rows and fills its tile
// pipeline once per chunk, so a chunk of a few tiles would spend as long on that as on its KV.
constexpr uint32_t kMinChunkTokens = 256;

uint32_t ceil_div(uint64_t a, uint64_t b) {
  return static_cast<uint32_t>((a + b - 1) / b);
}

// Whether a split launch of `shape` runs on the Hopper kernel (DeviceLimits::prefill_sm90): its
// own KV tile, and one CTA per SM.
bool split_on_sm90(const AttentionShape& shape, const DeviceLimits* device) {
  return device != nullptr && device->prefill_sm90 && shape.head_dim == 128 && !shape.kv_fp8();
}

// Chunk length in KV tiles (0 = no split) for items whose causal ranges are `tiles` KV tiles.
// FlashInfer's PrefillSplitQOKVIndptr / PrefillBinarySearchKVChunkSize
// (include/flashinfer/attention/scheduler.cuh): no split when the query tiles alone fill the grid
// (num_sms x 2 CTAs, its PrefillPlan's num_blocks_per_sm); else the shortest chunk whose CTAs,
// counted per KV head, still fit in that grid (binary search), at least kMinChunkTokens long.
// `ctas_per_sm`: the grid's CTAs per SM (the Hopper kernel's one, else the device's count).
uint32_t chunk_tiles_for(const AttentionShape& shape, const std::vector<uint32_t>& tiles,
                         uint32_t kv_tile, const DeviceLimits* device, uint32_t force_chunks,
                         uint32_t force_chunk_tokens, uint32_t ctas_per_sm) {
  const uint32_t max_tiles = tiles.empty() ? 0 : *std::max_element(tiles.begin(), tiles.end());
  if (max_tiles <= 1) return 0;
  if (force_chunk_tokens > 0) return ceil_div(force_chunk_tokens, kv_tile);
  if (force_chunks > 0) return std::max(1u, ceil_div(max_tiles, force_chunks));
  if (device == nullptr) return 0;
  const uint64_t slots = uint64_t{device->num_sms} * std::max(1u, ctas_per_sm) / shape.kv_heads;
  if (tiles.size() >= slots) return 0;  // the grid is full already
  auto items = [&](uint32_t c) {
    uint64_t n = 0;
    for (const uint32_t t : tiles) n += ceil_div(std::max(t, 1u), c);
    return n;
  };
  uint32_t lo = std::max(1u, kMinChunkTokens / kv_tile), hi = max_tiles;
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (items(mid) > slots)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace

void split_prefill_plan(const AttentionShape& shape, const std::vector<int32_t>& q_lens,
                        const std::vector<int32_t>& kv_lens, const DeviceLimits* device,
                        uint32_t force_chunks, uint32_t force_chunk_tokens, uint32_t window,
                        PrefillPlan* p) {
  const bool sm90 = split_on_sm90(shape, device);
  const uint32_t kv_tile = sm90 ? kSm90KvTile : prefill_kv_tile(shape.head_dim);
  const int32_t per_tile = static_cast<int32_t>(prefill_tokens_per_tile(shape));
  // The first key a query tile starting at position `pos` reads: its window's start (the kernels'
  // kv_begin), 0 without a window. Its chunks count from there (FlashInfer's effective KV range).
  auto begin_of = [&](uint32_t pos) { return window && pos + 1 > window ? pos + 1 - window : 0; };
  // Each item's KV range ends with its last query token: [begin, prefix + last + 1).
  std::vector<uint32_t> begins(p->num_tiles), ends(p->num_tiles), tiles(p->num_tiles);
  for (uint32_t i = 0; i < p->num_tiles; ++i) {
    const int32_t s = p->work[2 * i], first = p->work[2 * i + 1];
    const int32_t prefix = kv_lens[s] - q_lens[s];
    begins[i] = begin_of(static_cast<uint32_t>(prefix + first));
    ends[i] = static_cast<uint32_t>(prefix + std::min(q_lens[s], first + per_tile));
    tiles[i] = ceil_div(ends[i] - begins[i], kv_tile);
  }
  const uint32_t chunk_tiles =
      chunk_tiles_for(shape, tiles, kv_tile, device, force_chunks, force_chunk_tokens,
                      sm90     ? 1u
                      : device ? device->prefill_ctas_per_sm
                               : 1u);
  const uint32_t max_tiles = tiles.empty() ? 0 : *std::max_element(tiles.begin(), tiles.end());
  if (chunk_tiles == 0 || chunk_tiles >= max_tiles) return;  // one chunk each: not split
  const uint32_t chunk = chunk_tiles * kv_tile;

  // Items {sequence, first token, chunk}, each item's chunks together in the planned order.
  std::vector<int32_t> work;
  for (uint32_t i = 0; i < p->num_tiles; ++i)
    for (uint32_t j = 0; j < ceil_div(ends[i] - begins[i], chunk); ++j)
      work.insert(work.end(), {p->work[2 * i], p->work[2 * i + 1], static_cast<int32_t>(j)});
  const auto items = static_cast<uint32_t>(work.size() / 3);
  // Token i's partial rows: one per chunk of its tile's range that its causal range
  // [begin, position + 1) reaches (with a window, the first ones may hold none of its keys).
  std::vector<int32_t> indptr = {0};
  uint32_t most = 1;
  for (size_t s = 0; s < q_lens.size(); ++s)
    for (int32_t t = 0; t < q_lens[s]; ++t) {
      const auto prefix = static_cast<uint32_t>(kv_lens[s] - q_lens[s]);
      const uint32_t begin = begin_of(prefix + static_cast<uint32_t>(t - t % per_tile));
      const uint32_t n = ceil_div(prefix + static_cast<uint32_t>(t) + 1 - begin, chunk);
      indptr.push_back(indptr.back() + static_cast<int32_t>(n));
      most = std::max(most, n);
    }
  p->split.kv_chunk = chunk;
  p->split.max_chunks = most;
  p->split.total_q = static_cast<uint32_t>(indptr.size() - 1);
  p->split.partial_rows = static_cast<uint32_t>(indptr.back());
  p->workspace_bytes = uint64_t{p->split.partial_rows} * shape.q_heads *
                       (uint64_t{shape.head_dim} + 1) * sizeof(float);
  p->num_tiles = items;
  p->work = std::move(work);
  p->work.insert(p->work.end(), indptr.begin(), indptr.end());
}

}  // namespace memsim::kernels
