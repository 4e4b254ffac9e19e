// CPU planning of the attention kernels (split-K for decode, tile work lists for prefill) and
// shape checks; no CUDA here, so the sim build and its tests use the same plans.
#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "kernels/attention_tiles.h"
#include "kernels/attention_types.h"

namespace memsim::kernels {

// attention_plan_split.cpp: cuts a plan's tiles into KV chunks when it decides (or is forced) to.
void split_prefill_plan(const AttentionShape& shape, const std::vector<int32_t>& q_lens,
                        const std::vector<int32_t>& kv_lens, const DeviceLimits* device,
                        uint32_t force_chunks, uint32_t force_chunk_tokens, uint32_t window,
                        PrefillPlan* p);

const char* to_string(KvDtype d) {
  return d == KvDtype::kBf16 ? "bf16" : "fp16";
}

const char* to_string(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::kAuto:
      return "auto";
    case KvCacheDtype::kFp8E4m3:
      return "fp8_e4m3";
    case KvCacheDtype::kFp8E5m2:
      return "fp8_e5m2";
  }
  return "unknown";
}

const char* to_string(KvAddressing a) {
  return a == KvAddressing::kPaged ? "paged" : "contiguous";
}

std::string check_shape(const AttentionShape& s) {
  if (s.head_dim != 64 && s.head_dim != 128 && s.head_dim != 256)
    return fmt::format("head_dim {} is not one of 64, 128, 256", s.head_dim);
  if (s.kv_heads == 0 || s.q_heads == 0 || s.q_heads % s.kv_heads != 0)
    return fmt::format("{} query heads are not a multiple of {} KV heads", s.q_heads, s.kv_heads);
  if (s.group() > kMaxGroup)
    return fmt::format("{} query heads per KV head (at most {})", s.group(), kMaxGroup);
  return {};
}

uint32_t decode_ctas(const AttentionShape& shape, const DeviceLimits& device) {
  return std::max(
      1u, std::min(device.decode_ctas_per_sm, decode_ctas_bound(shape.head_dim, shape.kv_fp8())));
}

namespace {

// Fraction of the CTA slots busy over the waves `ctas` CTAs take (1 = the last wave is full).
double wave_efficiency(uint64_t ctas, uint64_t slots) {
  const uint64_t waves = (ctas + slots - 1) / slots;
  return double(ctas) / double(waves * slots);
}

}  // namespace

DecodePlan plan_decode(const AttentionShape& shape, uint32_t max_batch, uint32_t max_kv_len,
                       const DeviceLimits& device, uint32_t force_splits, uint64_t sum_kv_len,
                       uint32_t window) {
  max_kv_len = window_len(max_kv_len, window);  // only the window is read and split
  sum_kv_len = std::min(sum_kv_len, uint64_t{max_batch} * max_kv_len);
  DecodePlan p;
  p.max_batch = max_batch;
  p.kv_tile = kDecodeTile;
  const uint32_t tiles = (max_kv_len + p.kv_tile - 1) / p.kv_tile;
  const uint64_t launched = uint64_t{max_batch} * shape.kv_heads;
  // The CTAs the batch's work fills at the longest sequence's length: fewer than launched when
  // the lengths differ, and then the longest sequence's CTAs set the time unless split further.
  uint64_t ctas = launched;
  if (sum_kv_len && max_batch && max_kv_len && sum_kv_len < uint64_t{max_batch} * max_kv_len)
    ctas = std::max<uint64_t>(
        1, (uint64_t{shape.kv_heads} * sum_kv_len + max_kv_len - 1) / max_kv_len);
  const uint64_t slots = uint64_t{device.num_sms} * decode_ctas(shape, device);
  // Every split at least two tiles long; at most 16 waves launched (short sequences' late splits
  // are empty CTAs that exit at once).
  const uint32_t max_splits = static_cast<uint32_t>(std::min<uint64_t>(
      tiles / 2, std::max<uint64_t>(1, 16 * slots / std::max<uint64_t>(1, launched))));
  if (force_splits > 0) {
    p.num_splits = std::clamp(force_splits, 1u, std::max(1u, tiles));
  } else if (ctas == 0 || max_splits < 2 || ctas >= 4 * slots) {
    p.num_splits = 1;  // nothing to split, or enough waves that the last one hardly matters
  } else if (ctas < slots) {
    // Under one wave: splits up to two CTAs per SM, never into a second wave. Measured on the
    // H200 (memsim-attn-bench --sweep-splits, 1 x 32K): 2 per SM beats filling the third slot,
    // which shares the SM's bandwidth but adds partial outputs to combine.
    const uint64_t per_sm = std::min(2u, decode_ctas(shape, device));
    p.num_splits =
        static_cast<uint32_t>(std::clamp<uint64_t>(device.num_sms * per_sm / ctas, 1, max_splits));
  } else {
    // A few waves: the split count (up to 4) whose last wave is fullest; fewer splits on ties.
    p.num_splits = 1;
    double best = wave_efficiency(ctas, slots);
    for (uint32_t s = 2; s <= std::min(4u, max_splits); ++s)
      if (const double e = wave_efficiency(ctas * s, slots); e > best + 1e-9) {
        best = e;
        p.num_splits = s;
      }
  }
  p.num_splits = std::max(1u, p.num_splits);
  if (p.num_splits > 1)
    p.workspace_bytes = uint64_t{max_batch} * p.num_splits * shape.q_heads *
                        (uint64_t{shape.head_dim} + 1) * sizeof(float);
  return p;
}

namespace {

uint64_t partial_bytes(const AttentionShape& shape, uint64_t rows) {
  return rows * shape.q_heads * (uint64_t{shape.head_dim} + 1) * sizeof(float);
}

uint32_t tiles_of(int64_t kv_len) {
  return static_cast<uint32_t>((std::max<int64_t>(kv_len, 0) + kDecodeTile - 1) / kDecodeTile);
}

}  // namespace

uint64_t decode_work_words(uint32_t capacity, uint32_t max_batch) {
  return 2 + 2 * uint64_t{capacity} + max_batch;
}

DecodePlan plan_decode_graph(const AttentionShape& shape, uint32_t max_batch, uint32_t max_kv_len,
                             const DeviceLimits& device, uint32_t window) {
  DecodePlan p;
  p.max_batch = max_batch;
  if (max_batch == 0) return p;
  max_kv_len = window_len(max_kv_len, window);
  // The uniform batch's rows, or one wave at two CTAs per SM (plan_decode's under-one-wave
  // fill), as FlashInfer pads a graph's decode grid to a wave: rows past the live count are CTAs
  // that exit at once, but they still take SM slots at launch (measured on the H200: a capture
  // padded to max_batch + a full wave of 3 CTAs per SM ran uniform steps up to 7% slower).
  const uint64_t uniform =
      uint64_t{max_batch} * plan_decode(shape, max_batch, max_kv_len, device).num_splits;
  const uint64_t per_sm = std::min(2u, decode_ctas(shape, device));
  const uint64_t wave =
      (device.num_sms * per_sm + shape.kv_heads - 1) / std::max(1u, shape.kv_heads);
  p.work_capacity = static_cast<uint32_t>(std::max(uniform, wave));
  p.num_splits = std::clamp((tiles_of(max_kv_len) + 1) / 2, 1u, p.work_capacity);
  if (p.num_splits > 1) p.workspace_bytes = partial_bytes(shape, p.work_capacity);
  return p;
}

DecodeWork plan_decode_work(const AttentionShape& shape, const std::vector<int32_t>& all_lens,
                            const DeviceLimits& device, const DecodePlan* fixed, uint32_t window) {
  // A windowed batch is listed as the batch of its window lengths (the kernel offsets the chunks).
  std::vector<int32_t> windowed;
  if (window) {
    windowed.reserve(all_lens.size());
    for (const int32_t len : all_lens)
      windowed.push_back(
          static_cast<int32_t>(window_len(static_cast<uint32_t>(std::max(len, 0)), window)));
  }
  const std::vector<int32_t>& kv_lens = window ? windowed : all_lens;
  const auto batch = static_cast<uint32_t>(kv_lens.size());
  if (fixed && batch > fixed->max_batch) return {};
  uint32_t max_len = 0;
  uint64_t sum = 0, sum_tiles = 0;
  for (const int32_t len : kv_lens) {
    max_len = std::max(max_len, static_cast<uint32_t>(std::max(len, 0)));
    sum += static_cast<uint32_t>(std::max(len, 0));
    sum_tiles += tiles_of(len);
  }
  const uint32_t max_tiles = tiles_of(max_len);
  // Rows and the most chunks of one sequence at a chunk of c tiles (every sequence one row at
  // least, an empty one too: it writes zeros).
  auto count = [&](uint32_t c, uint32_t* most) {
    uint64_t n = 0;
    *most = 1;
    for (const int32_t len : kv_lens) {
      const uint32_t k = std::max(1u, (tiles_of(len) + c - 1) / c);
      n += k;
      *most = std::max(*most, k);
    }
    return n;
  };
  const uint32_t splits = plan_decode(shape, batch, max_len, device, 0, sum).num_splits;
  uint32_t chunk = std::max(1u, (max_tiles + splits - 1) / splits);
  uint32_t most = 1;
  const uint64_t slots = uint64_t{device.num_sms} * decode_ctas(shape, device);
  if (uint64_t{max_tiles} * batch >= 2 * sum_tiles &&
      count(chunk, &most) * shape.kv_heads > slots) {
    // A ragged batch (the longest at twice the mean or more) of more than one wave: the chunk is
    // at most the slots' fair share of the batch's tiles (and two tiles), so the long sequences'
    // chunks, listed first, end about when the short rows filling in behind them do. The split
    // above counts the work in sequences of the longest length, which leaves a large batch's few
    // long sequences in long chunks that outlast every other slot. Under one wave every row
    // already runs at once; a batch near uniform gains nothing from cutting its longest rows
    // into a chunk and a remnant (a first version did: on the H200 graph steps of 49-128
    // near-uniform sequences ran 3.7% slower, in a build that also carried a kernel change
    // costing single-sequence steps 0.8%).
    const uint64_t share = (sum_tiles * shape.kv_heads + slots - 1) / slots;
    chunk = static_cast<uint32_t>(std::min<uint64_t>(chunk, std::max<uint64_t>(2, share)));
  }
  uint64_t items = count(chunk, &most);
  if (fixed && (items > fixed->work_capacity || most > fixed->num_splits)) {
    // The shortest chunk that fits (rows and chunks fall as the chunk grows; at max_tiles every
    // sequence is one row, and the capacity holds max_batch rows).
    uint32_t lo = chunk + 1, hi = std::max(1u, max_tiles);
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo) / 2;
      uint32_t m = 1;
      if (count(mid, &m) <= fixed->work_capacity && m <= fixed->num_splits)
        hi = mid;
      else
        lo = mid + 1;
    }
    chunk = lo;
    items = count(chunk, &most);
  }
  DecodeWork w;
  w.chunk_tiles = chunk;
  w.num_items = static_cast<uint32_t>(items);
  if (fixed) {
    w.plan = *fixed;
  } else {
    w.plan.max_batch = batch;
    w.plan.num_splits = most;
    w.plan.work_capacity = w.num_items;
    if (most > 1) w.plan.workspace_bytes = partial_bytes(shape, w.num_items);
  }
  const uint32_t cap = w.plan.work_capacity;
  w.words.assign(decode_work_words(cap, w.plan.max_batch), 0);
  w.words[0] = static_cast<int32_t>(w.num_items);
  w.words[1] = static_cast<int32_t>(chunk);
  int32_t* item_seq = w.words.data() + 2;
  int32_t* item_chunk = item_seq + cap;
  int32_t* seq_first = item_chunk + cap;
  // Longest sequences first: the grid dispatches rows in order, so the full-length chunks start
  // in the first wave and short rows fill in behind them (longest-processing-time-first). A
  // uniform batch keeps its order (a stable sort), so its list is the split plan's.
  std::vector<uint32_t> order(batch);
  for (uint32_t s = 0; s < batch; ++s) order[s] = s;
  std::stable_sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) {
    return tiles_of(kv_lens[x]) > tiles_of(kv_lens[y]);
  });
  std::fill(seq_first, seq_first + w.plan.max_batch, -1);  // past the batch: not listed
  uint32_t at = 0;
  for (const uint32_t s : order) {  // items <= cap: at max_tiles one a sequence
    seq_first[s] = static_cast<int32_t>(at);
    const uint32_t k = std::max(1u, (tiles_of(kv_lens[s]) + chunk - 1) / chunk);
    for (uint32_t j = 0; j < k; ++j, ++at) {
      item_seq[at] = static_cast<int32_t>(s);
      item_chunk[at] = static_cast<int32_t>(j);
    }
  }
  return w;
}

void decode_split_range(const DecodePlan& plan, uint32_t kv_len, uint32_t split, uint32_t* begin,
                        uint32_t* end, uint32_t window) {
  const uint32_t wb = window_begin(kv_len, window);
  split_range(kv_len - wb, plan.kv_tile, plan.num_splits, split, begin, end);
  *begin += wb;
  *end += wb;
}

uint32_t prefill_tokens_per_tile(const AttentionShape& shape) {
  return prefill_rows(shape.head_dim) / std::max(1u, shape.group());
}

PrefillPlan plan_prefill(const AttentionShape& shape, const std::vector<int32_t>& q_lens,
                         const std::vector<int32_t>& kv_lens, const DeviceLimits* device,
                         uint32_t force_chunks, uint32_t force_chunk_tokens, uint32_t window) {
  PrefillPlan p;
  const int32_t per_tile = static_cast<int32_t>(prefill_tokens_per_tile(shape));
  struct Item {
    int32_t seq, first, kv_end;
  };
  std::vector<Item> items;
  for (size_t i = 0; i < q_lens.size(); ++i) {
    const int32_t q = q_lens[i];
    p.total_q += static_cast<uint64_t>(std::max(q, 0));
    const int32_t prefix = kv_lens[i] - q;
    for (int32_t t = 0; t < q; t += per_tile)
      items.push_back({static_cast<int32_t>(i), t, prefix + std::min(q, t + per_tile)});
  }
  // Longest KV range first; ties in sequence and tile order (deterministic).
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.kv_end > b.kv_end; });
  p.work.reserve(2 * items.size());
  for (const Item& it : items) {
    p.work.push_back(it.seq);
    p.work.push_back(it.first);
  }
  p.num_tiles = static_cast<uint32_t>(items.size());
  if (device || force_chunks || force_chunk_tokens)
    split_prefill_plan(shape, q_lens, kv_lens, device, force_chunks, force_chunk_tokens, window,
                       &p);
  return p;
}

}  // namespace memsim::kernels
