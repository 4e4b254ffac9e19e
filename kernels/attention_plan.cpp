// CPU planning of the attention kernels (split-K for decode, tile work lists for prefill) and
// shape checks; no CUDA here, so the sim build and its tests use the same plans.
#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "kernels/attention_tiles.h"
#include "kernels/attention_types.h"

namespace memsim::kernels {

const char* to_string(KvDtype d) {
  return d == KvDtype::kBf16 ? "bf16" : "fp16";
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

namespace {

// Fraction of the CTA slots busy over the waves `ctas` CTAs take (1 = the last wave is full).
double wave_efficiency(uint64_t ctas, uint64_t slots) {
  const uint64_t waves = (ctas + slots - 1) / slots;
  return double(ctas) / double(waves * slots);
}

}  // namespace

DecodePlan plan_decode(const AttentionShape& shape, uint32_t max_batch, uint32_t max_kv_len,
                       const DeviceLimits& device, uint32_t force_splits, uint64_t sum_kv_len) {
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
  const uint64_t slots = uint64_t{device.num_sms} * std::max(1u, device.decode_ctas_per_sm);
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
    const uint64_t per_sm = std::min<uint64_t>(2, std::max(1u, device.decode_ctas_per_sm));
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

void decode_split_range(const DecodePlan& plan, uint32_t kv_len, uint32_t split, uint32_t* begin,
                        uint32_t* end) {
  split_range(kv_len, plan.kv_tile, plan.num_splits, split, begin, end);
}

uint32_t prefill_tokens_per_tile(const AttentionShape& shape) {
  return prefill_rows(shape.head_dim) / std::max(1u, shape.group());
}

PrefillPlan plan_prefill(const AttentionShape& shape, const std::vector<int32_t>& q_lens,
                         const std::vector<int32_t>& kv_lens) {
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
  return p;
}

}  // namespace memsim::kernels
