// CPU planning of the attention kernels: fast division, decode split-K plans and their ranges,
// prefill work lists, shape checks. No GPU needed (the kernels use the same code and tables).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <utility>

#include "kernels/attention_tiles.h"
#include "kernels/attention_types.h"
#include "kernels/fastdiv.h"
#include "kernels/synth.h"
#include "src/drivers/capture_runner.h"

namespace memsim::kernels {
namespace {

const AttentionShape kLlama8B{32, 8, 128, KvDtype::kBf16};
const DeviceLimits kH200{132, 3};

TEST_CASE("FastDiv is exact for every divisor a page size can be") {
  std::mt19937 rng(1);
  for (uint32_t d = 1; d <= 300; ++d) {
    const FastDiv f(d);
    for (uint32_t n : {0u, 1u, d - 1, d, d + 1, 2 * d, 65535u, 1u << 20, (1u << 31) - 1}) {
      uint32_t q, r;
      f.divmod(n, q, r);
      REQUIRE(q == n / d);
      REQUIRE(r == n % d);
    }
    for (int i = 0; i < 2000; ++i) {
      const uint32_t n = rng() & 0x7fffffffu;
      REQUIRE(f.div(n) == n / d);
    }
  }
  for (uint32_t d : {1000003u, 1u << 20, (1u << 31) - 1}) {  // large divisors (slot granules)
    const FastDiv f(d);
    for (int i = 0; i < 20000; ++i) {
      const uint32_t n = rng() & 0x7fffffffu;
      REQUIRE(f.div(n) == n / d);
    }
  }
}

TEST_CASE("check_shape accepts the kernels' shapes and names what is wrong otherwise") {
  CHECK(check_shape(kLlama8B).empty());
  CHECK(check_shape({28, 4, 128, KvDtype::kFp16}).empty());  // Qwen2.5-7B: group 7
  CHECK(check_shape({8, 8, 64, KvDtype::kBf16}).empty());
  CHECK(check_shape({64, 8, 256, KvDtype::kBf16}).empty());
  CHECK(check_shape({8, 8, 96, KvDtype::kBf16}) == "head_dim 96 is not one of 64, 128, 256");
  CHECK(check_shape({12, 5, 128, KvDtype::kBf16}) ==
        "12 query heads are not a multiple of 5 KV heads");
  CHECK(check_shape({64, 4, 128, KvDtype::kBf16}) == "16 query heads per KV head (at most 8)");
  CHECK(check_shape({8, 0, 128, KvDtype::kBf16}) ==
        "8 query heads are not a multiple of 0 KV heads");
}

TEST_CASE("decode splits to fill whole waves of CTA slots") {
  // 256 x 8 = 2048 CTAs are over four waves of 396 slots: no split, no workspace.
  DecodePlan p = plan_decode(kLlama8B, 256, 4096, kH200);
  CHECK(p.num_splits == 1);
  CHECK(p.workspace_bytes == 0);
  CHECK(p.kv_tile == kDecodeTile);
  // One sequence of 32K: 8 CTAs; up to two per SM: 264 / 8 = 33 splits.
  p = plan_decode(kLlama8B, 1, 32768, kH200);
  CHECK(p.num_splits == 33);
  CHECK(p.workspace_bytes == 1ull * 33 * 32 * 129 * 4);
  CHECK(plan_decode(kLlama8B, 1, 32768, {132, 1}).num_splits == 16);  // one CTA per SM fits
  // 32 x 4K: 256 CTAs already give two per SM: unsplit.
  CHECK(plan_decode(kLlama8B, 32, 4096, kH200).num_splits == 1);
  // 64 x 8K: 512 CTAs are 1.29 waves; 3 splits make 1536 CTAs = 3.88 waves (97% full).
  CHECK(plan_decode(kLlama8B, 64, 8192, kH200).num_splits == 3);
  // 100 x 8K: 800 CTAs = 2.02 waves; 2 splits: 4.04 waves; 3 splits: 6.06; 4: 8.08 (best).
  CHECK(plan_decode(kLlama8B, 100, 8192, kH200).num_splits == 4);
  // Short contexts never split below two tiles per split.
  CHECK(plan_decode(kLlama8B, 1, 192, kH200).num_splits == 1);  // 3 tiles
  CHECK(plan_decode(kLlama8B, 1, 256, kH200).num_splits == 2);  // 4 tiles
  // Forced split counts are clamped to the tiles there are.
  CHECK(plan_decode(kLlama8B, 4, 100, kH200, 16).num_splits == 2);
  CHECK(plan_decode(kLlama8B, 4, 100, kH200, 1).num_splits == 1);
  CHECK(plan_decode(kLlama8B, 0, 100, kH200).num_splits == 1);
}

TEST_CASE("decode plans count the CTAs an SM holds for the shape's kernel") {
  AttentionShape fp8 = kLlama8B, wide{16, 8, 256, KvDtype::kBf16};
  fp8.kv_cache = KvCacheDtype::kFp8E4m3;
  CHECK(decode_ctas(kLlama8B, kH200) == 3);
  CHECK(decode_ctas(fp8, kH200) == 2);   // the fp8 kernel's launch bound
  CHECK(decode_ctas(wide, kH200) == 1);  // head_dim 256: shared memory holds one
  CHECK(decode_ctas(fp8, {132, 1}) == 1);
  // 64 x 8K over fp8: 512 CTAs on 264 slots are 1.94 waves, as full (97%) as any split: unsplit
  // (bf16 counts 396 slots, 1.29 waves, and splits in 3).
  CHECK(plan_decode(fp8, 64, 8192, kH200).num_splits == 1);
  CHECK(plan_decode(kLlama8B, 64, 8192, kH200).num_splits == 3);
  // Under one wave both fill two CTAs per SM; head_dim 256 fills one: 132 / 8 = 16 splits.
  CHECK(plan_decode(fp8, 1, 32768, kH200).num_splits == 33);
  CHECK(plan_decode(wide, 1, 32768, kH200).num_splits == 16);
  // A graph's launch pads to a wave of the CTAs its kernel holds: 132 x 1 / 8 KV heads = 17 rows.
  CHECK(plan_decode_graph(wide, 1, 32768, kH200).work_capacity == 17);
  CHECK(plan_decode_graph(kLlama8B, 1, 32768, kH200).work_capacity == 33);
}

TEST_CASE("decode splits of a ragged batch follow the longest sequence's share of the work") {
  // Uniform lengths given as a sum plan exactly as without it.
  for (uint32_t b : {1u, 32u, 64u, 100u, 256u})
    for (uint32_t len : {256u, 4096u, 8192u})
      CHECK(plan_decode(kLlama8B, b, len, kH200, 0, uint64_t{b} * len).num_splits ==
            plan_decode(kLlama8B, b, len, kH200).num_splits);
  // 20 sequences, one of 8,000 tokens among 1,000-token ones (20,000 in all): 160 CTAs, unsplit
  // by length alone; their work fills 8 x 20,000 / 8,000 = 20 CTAs of the longest length, so
  // 264 / 20 = 13 splits, as for the long sequence alone (within 16 waves: 39).
  CHECK(plan_decode(kLlama8B, 20, 8000, kH200).num_splits == 1);
  CHECK(plan_decode(kLlama8B, 20, 8000, kH200, 0, 20000).num_splits == 13);
  // The launch cap: 256 sequences, one long, stays within 16 waves of 396 slots (3 splits).
  CHECK(plan_decode(kLlama8B, 256, 32768, kH200, 0, 32768 + 255 * 64).num_splits == 3);
}

// Checks a work list's words against its lengths: every sequence's [0, len) is cut into chunks
// of chunk_tiles tiles, one item each, in sequence order (one item for an empty sequence).
void check_work(const DecodeWork& w, const std::vector<int32_t>& lens) {
  const uint32_t cap = w.plan.work_capacity;
  REQUIRE(cap >= w.num_items);
  REQUIRE(w.words.size() == decode_work_words(cap, w.plan.max_batch));
  REQUIRE(w.words[0] == static_cast<int32_t>(w.num_items));
  REQUIRE(w.words[1] == static_cast<int32_t>(w.chunk_tiles));
  const int32_t* seq = w.words.data() + 2;
  const int32_t* chunk = seq + cap;
  const int32_t* first = chunk + cap;
  const int64_t c = int64_t{w.chunk_tiles} * kDecodeTile;
  // Sequences longest first (in tiles), ties in batch order.
  std::vector<uint32_t> order(lens.size());
  for (uint32_t s = 0; s < order.size(); ++s) order[s] = s;
  auto tiles = [](int32_t len) {
    return (std::max(len, 0) + int32_t(kDecodeTile) - 1) / int32_t(kDecodeTile);
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t x, uint32_t y) { return tiles(lens[x]) > tiles(lens[y]); });
  uint32_t at = 0, most = 1;
  for (const uint32_t s : order) {
    REQUIRE(first[s] == static_cast<int32_t>(at));
    const uint32_t n = std::max<uint32_t>(1, static_cast<uint32_t>((lens[s] + c - 1) / c));
    most = std::max(most, n);
    for (uint32_t j = 0; j < n; ++j, ++at) {
      REQUIRE(seq[at] == static_cast<int32_t>(s));
      REQUIRE(chunk[at] == static_cast<int32_t>(j));
    }
  }
  REQUIRE(at == w.num_items);
  REQUIRE(most <= w.plan.num_splits);
  for (size_t s = lens.size(); s < w.plan.max_batch; ++s) REQUIRE(first[s] == -1);  // unlisted
}

TEST_CASE("decode work lists cut a uniform batch as the split plan does") {
  for (uint32_t b : {1u, 8u, 32u, 64u, 100u, 256u})
    for (uint32_t len : {1u, 100u, 256u, 4096u, 8192u, 32768u}) {
      const DecodePlan p = plan_decode(kLlama8B, b, len, kH200);
      const DecodeWork w = plan_decode_work(kLlama8B, std::vector<int32_t>(b, int32_t(len)), kH200);
      check_work(w, std::vector<int32_t>(b, int32_t(len)));
      // Same ranges as split_range's non-empty splits, no empty split launched.
      uint32_t nonempty = 0;
      for (uint32_t s = 0; s < p.num_splits; ++s) {
        uint32_t lo, hi;
        decode_split_range(p, len, s, &lo, &hi);
        if (hi > lo || s == 0) {
          ++nonempty;
          CHECK(lo == s * w.chunk_tiles * kDecodeTile);
          CHECK(hi == std::min(len, (s + 1) * w.chunk_tiles * kDecodeTile));
        }
      }
      CHECK(w.num_items == b * nonempty);
      CHECK(w.plan.num_splits == nonempty);
      CHECK(w.plan.work_capacity == w.num_items);
      CHECK(w.plan.workspace_bytes == (nonempty > 1 ? uint64_t{w.num_items} * 32 * 129 * 4 : 0));
    }
}

TEST_CASE("decode work lists split the long sequences of a ragged batch, not the short ones") {
  // One 8,000-token sequence among 19 of 1,000 (27,000 in all): 27 CTAs of the longest's work,
  // 264 / 27 = 9 splits of it, so chunks of ceil(125 / 9) = 14 tiles: 9 items for it, 2 for each
  // short one (16 tiles), 47 rows where split_range's grid launches 9 x 20 = 180.
  std::vector<int32_t> lens(20, 1000);
  lens[7] = 8000;
  CHECK(plan_decode(kLlama8B, 20, 8000, kH200, 0, 27000).num_splits == 9);
  const DecodeWork w = plan_decode_work(kLlama8B, lens, kH200);
  check_work(w, lens);
  CHECK(w.chunk_tiles == 14);
  CHECK(w.num_items == 9 + 19 * 2);
  CHECK(w.plan.num_splits == 9);
  CHECK(w.plan.max_batch == 20);
  CHECK(w.plan.workspace_bytes == 47ull * 32 * 129 * 4);
  // The long sequence's nine chunks come first (they start in the first wave), then the short
  // ones in batch order.
  const int32_t* item_seq = w.words.data() + 2;
  for (uint32_t i = 0; i < 9; ++i) CHECK(item_seq[i] == 7);
  CHECK(item_seq[9] == 0);
  CHECK(w.words[2 + 2 * w.plan.work_capacity + 7] == 0);  // seq_first[7]
  CHECK(w.words[2 + 2 * w.plan.work_capacity + 0] == 9);  // seq_first[0]
  // One 4,000-token sequence among 99 of 500 (855 tiles): the split counts 107 CTAs of the
  // longest's work, 2 splits, chunks of 32 tiles; 101 rows are 808 CTAs, two waves of 396 slots,
  // so the chunk is cut to the slots' share, ceil(855 x 8 / 396) = 18 tiles: 4 chunks of it.
  std::vector<int32_t> many(100, 500);
  many[42] = 4000;
  CHECK(plan_decode(kLlama8B, 100, 4000, kH200, 0, 99 * 500 + 4000).num_splits == 2);
  const DecodeWork m = plan_decode_work(kLlama8B, many, kH200);
  check_work(m, many);
  CHECK(m.chunk_tiles == 18);
  CHECK(m.num_items == 99 + 4);
  // A batch under one wave keeps its split's chunk (the 20-sequence case above: 47 rows), and
  // so does a batch near uniform: 44 of 1,000 tokens, 6 of 1,100 (18 tiles) and 6 graph padding
  // rows of 1 are unsplit (369 CTAs of the longest's work) in 448 CTAs, over one wave, but their
  // longest is under twice the mean: not cut to the share of 17 tiles into a chunk and a remnant.
  std::vector<int32_t> near(56, 1000);
  std::fill(near.begin(), near.begin() + 6, 1100);
  std::fill(near.end() - 6, near.end(), 1);
  const DecodeWork n = plan_decode_work(kLlama8B, near, kH200);
  check_work(n, near);
  CHECK(n.chunk_tiles == 18);
  CHECK(n.num_items == 56);
  // Empty sequences take one item (it writes zeros); an empty batch none.
  const DecodeWork z = plan_decode_work(kLlama8B, {0, 64, 0}, kH200);
  check_work(z, {0, 64, 0});
  CHECK(z.num_items == 3);
  CHECK(plan_decode_work(kLlama8B, {}, kH200).num_items == 0);
}

TEST_CASE("a graph's decode launch holds every later plan of its batch, re-planned to fit") {
  // 256 at 32K: unsplit when uniform (2,048 CTAs): 256 rows, a sequence's chunks bounded by
  // 512 tiles in chunks of two at least.
  DecodePlan g = plan_decode_graph(kLlama8B, 256, 32768, kH200);
  CHECK(g.work_capacity == 256);
  CHECK(g.num_splits == 256);
  CHECK(g.workspace_bytes == 256ull * 32 * 129 * 4);
  CHECK(g.max_batch == 256);
  // One sequence: the uniform plan's 33 splits fill the wave of 2 x 132 / 8 = 33 rows.
  g = plan_decode_graph(kLlama8B, 1, 32768, kH200);
  CHECK(g.work_capacity == 33);
  CHECK(g.num_splits == 33);
  // 24 at 16K, unsplit when uniform: padded to the wave's 33 rows, room to split a long one.
  CHECK(plan_decode_graph(kLlama8B, 24, 16384, kH200).work_capacity == 33);
  // 64 at 32K split 3 ways uniform: 192 rows.
  CHECK(plan_decode_graph(kLlama8B, 64, 32768, kH200).work_capacity == 192);
  // Short captures: one tile, no split, no workspace.
  g = plan_decode_graph(kLlama8B, 4, 64, kH200);
  CHECK(g.num_splits == 1);
  CHECK(g.workspace_bytes == 0);

  std::mt19937 rng(7);
  uint32_t refitted = 0;
  for (uint32_t graph : {1u, 2u, 8u, 24u, 40u, 64u, 128u, 256u})
    for (uint32_t ctx : {512u, 4096u, 16384u}) {
      const DecodePlan launch = plan_decode_graph(kLlama8B, graph, ctx, kH200);
      // The uniform template at ctx plans exactly as an eager step.
      const std::vector<int32_t> full(graph, int32_t(ctx));
      const DecodeWork t = plan_decode_work(kLlama8B, full, kH200, &launch);
      check_work(t, full);
      CHECK(t.chunk_tiles == plan_decode_work(kLlama8B, full, kH200).chunk_tiles);
      for (int trial = 0; trial < 200; ++trial) {
        const uint32_t b = 1 + rng() % graph;
        std::vector<int32_t> lens(b);
        for (int32_t& l : lens)
          l = rng() % 4 ? int32_t(1 + rng() % (ctx / 8)) : int32_t(1 + rng() % ctx);
        const DecodeWork eager = plan_decode_work(kLlama8B, lens, kH200);
        const DecodeWork w = plan_decode_work(kLlama8B, lens, kH200, &launch);
        check_work(w, lens);
        CHECK(w.plan.work_capacity == launch.work_capacity);
        CHECK(w.words.size() == decode_work_words(launch.work_capacity, graph));
        CHECK(w.chunk_tiles >= eager.chunk_tiles);
        if (w.chunk_tiles > eager.chunk_tiles) {  // the shortest chunk that fits
          ++refitted;
          uint32_t most = 1;
          uint64_t n = 0;
          const uint32_t shorter = (w.chunk_tiles - 1) * kDecodeTile;
          for (int32_t l : lens) {
            const uint32_t k = std::max<uint32_t>(1, (l + shorter - 1) / shorter);
            n += k;
            most = std::max(most, k);
          }
          CHECK((n > launch.work_capacity || most > launch.num_splits));
        } else {
          CHECK(w.num_items == eager.num_items);
        }
      }
    }
  CHECK(refitted > 0);  // some eager plans did not fit their graph's launch
  // Every uniform step the graph profiles measure (vLLM's capture sizes x the profile's contexts,
  // captured at 32K) fits its launch as planned: no chunk is lengthened to fit.
  for (const uint32_t graph : vllm_capture_sizes(256)) {  // 1, 2, 4, 8, ..., 512
    const DecodePlan launch = plan_decode_graph(kLlama8B, graph, 32768, kH200);
    for (uint32_t ctx : {128u, 512u, 2048u, 8192u, 32768u}) {
      CAPTURE(graph, ctx);
      const std::vector<int32_t> full(graph, int32_t(ctx));
      CHECK(plan_decode_work(kLlama8B, full, kH200, &launch).chunk_tiles ==
            plan_decode_work(kLlama8B, full, kH200).chunk_tiles);
    }
  }
  // A batch beyond the launch's gets no list.
  const DecodePlan small = plan_decode_graph(kLlama8B, 2, 4096, kH200);
  CHECK(plan_decode_work(kLlama8B, {64, 64, 64}, kH200, &small).words.empty());
}

TEST_CASE("decode split ranges tile [0, kv_len) exactly, in order, tile-aligned") {
  for (uint32_t splits : {1u, 2u, 3u, 7u, 50u, 64u}) {
    DecodePlan p = plan_decode(kLlama8B, 1, 1u << 16, kH200, splits);
    for (uint32_t len : {1u, 63u, 64u, 65u, 127u, 128u, 1000u, 4096u, 32768u, 65536u}) {
      uint32_t next = 0;
      for (uint32_t s = 0; s < p.num_splits; ++s) {
        uint32_t b, e;
        decode_split_range(p, len, s, &b, &e);
        REQUIRE(b == next);
        REQUIRE(e >= b);
        REQUIRE(e <= len);
        if (e < len) REQUIRE(e % p.kv_tile == 0);
        if (b < len) REQUIRE(b % p.kv_tile == 0);  // empty late splits sit at len
        next = e;
      }
      REQUIRE(next == len);
    }
  }
}

TEST_CASE("sliding-window decode plans split only the window") {
  // vLLM / FlashAttention semantics: the query at position kv_len - 1 sees the last `window`.
  CHECK(window_begin(32768, 1024) == 31744);
  CHECK(window_len(32768, 1024) == 1024);
  CHECK(window_len(1024, 1024) == 1024);
  CHECK(window_begin(1023, 1024) == 0);
  CHECK(window_len(1023, 1024) == 1023);
  CHECK(window_len(5000, 0) == 5000);  // 0: full attention
  CHECK(window_len(0, 7) == 0);
  // A window plans as the context of its length, whatever the context behind it.
  for (uint32_t b : {1u, 32u, 256u})
    for (uint32_t window : {1u, 64u, 1000u, 1024u, 4096u}) {
      const DecodePlan full = plan_decode(kLlama8B, b, window, kH200);
      const DecodePlan w = plan_decode(kLlama8B, b, 32768, kH200, 0, 0, window);
      CHECK(w.num_splits == full.num_splits);
      CHECK(w.workspace_bytes == full.workspace_bytes);
      const DecodePlan g = plan_decode_graph(kLlama8B, b, 32768, kH200, window);
      CHECK(g.work_capacity == plan_decode_graph(kLlama8B, b, window, kH200).work_capacity);
      CHECK(g.num_splits == plan_decode_graph(kLlama8B, b, window, kH200).num_splits);
    }
  // 1 x 32K at window 1024 splits as 1 x 1K does, not as 1 x 32K (33 splits on the H200).
  CHECK(plan_decode(kLlama8B, 1, 32768, kH200, 0, 0, 1024).num_splits ==
        plan_decode(kLlama8B, 1, 1024, kH200).num_splits);
  CHECK(plan_decode(kLlama8B, 1, 32768, kH200).num_splits > 16);
  // A window at least the context changes nothing.
  CHECK(plan_decode(kLlama8B, 1, 4096, kH200, 0, 0, 4096).num_splits ==
        plan_decode(kLlama8B, 1, 4096, kH200).num_splits);
  CHECK(plan_decode(kLlama8B, 1, 4096, kH200, 0, 0, 9000).num_splits ==
        plan_decode(kLlama8B, 1, 4096, kH200).num_splits);

  // Split ranges tile [window_begin, kv_len) exactly, tiles counted from the window's start.
  for (uint32_t splits : {1u, 2u, 3u, 16u})
    for (uint32_t window : {1u, 63u, 64u, 65u, 1000u, 4096u})
      for (uint32_t len : {1u, 64u, 65u, 1000u, 4097u, 32768u}) {
        const DecodePlan p = plan_decode(kLlama8B, 1, len, kH200, splits, 0, window);
        uint32_t next = window_begin(len, window);
        for (uint32_t s = 0; s < p.num_splits; ++s) {
          uint32_t b, e;
          decode_split_range(p, len, s, &b, &e, window);
          REQUIRE(b == next);
          REQUIRE(e <= len);
          if (e < len) REQUIRE((e - window_begin(len, window)) % p.kv_tile == 0);
          next = e;
        }
        REQUIRE(next == len);
      }

  // Work lists: a windowed batch is listed exactly as the batch of its window lengths.
  const std::vector<int32_t> lens = {32768, 100, 5000, 1024, 0, 70000, 1025};
  for (uint32_t window : {1u, 64u, 1024u, 4096u, 100000u}) {
    std::vector<int32_t> wl;
    for (int32_t l : lens) wl.push_back(static_cast<int32_t>(window_len(l, window)));
    const DecodeWork w = plan_decode_work(kLlama8B, lens, kH200, nullptr, window);
    const DecodeWork ref = plan_decode_work(kLlama8B, wl, kH200);
    CHECK(w.words == ref.words);
    CHECK(w.plan.num_splits == ref.plan.num_splits);
    CHECK(w.plan.workspace_bytes == ref.plan.workspace_bytes);
    const DecodePlan launch = plan_decode_graph(kLlama8B, 8, 70000, kH200, window);
    const DecodeWork g = plan_decode_work(kLlama8B, lens, kH200, &launch, window);
    CHECK(g.words == plan_decode_work(kLlama8B, wl, kH200, &launch).words);
    CHECK(g.num_items <= launch.work_capacity);
  }
  // Window 1024 over 32K: the list of a 1K sequence (one or a few chunks, not 33).
  CHECK(plan_decode_work(kLlama8B, {32768}, kH200, nullptr, 1024).num_items ==
        plan_decode_work(kLlama8B, {1024}, kH200).num_items);
}

TEST_CASE("prefill work lists cover every query token once, longest KV range first") {
  for (uint32_t group : {1u, 3u, 4u, 7u, 8u}) {
    const AttentionShape sh{8 * group, 8, 128, KvDtype::kBf16};
    const uint32_t per = prefill_tokens_per_tile(sh);
    CHECK(per == prefill_rows(128) / group);
    const std::vector<int32_t> q_lens = {1, 64, 65, 500, 0, 9};
    const std::vector<int32_t> kv_lens = {1, 100, 65, 4596, 7, 9};
    const PrefillPlan p = plan_prefill(sh, q_lens, kv_lens);
    CHECK(p.total_q == 1 + 64 + 65 + 500 + 9);
    REQUIRE(p.work.size() == 2 * p.num_tiles);
    std::map<int32_t, std::set<int32_t>> seen;
    int32_t last_end = INT32_MAX;
    for (uint32_t i = 0; i < p.num_tiles; ++i) {
      const int32_t s = p.work[2 * i], t0 = p.work[2 * i + 1];
      REQUIRE(s >= 0);
      REQUIRE(s < 6);
      REQUIRE(t0 % static_cast<int32_t>(per) == 0);
      REQUIRE(t0 < q_lens[s]);
      REQUIRE(seen[s].insert(t0).second);
      const int32_t end = kv_lens[s] - q_lens[s] + std::min<int32_t>(q_lens[s], t0 + per);
      REQUIRE(end <= last_end);
      last_end = end;
    }
    for (size_t s = 0; s < q_lens.size(); ++s)
      CHECK(seen[static_cast<int32_t>(s)].size() == (q_lens[s] + per - 1) / per);
  }
}

// Split prefill planned for the Hopper kernel (DeviceLimits::prefill_sm90): chunks of whole
// 128-token tiles, one CTA per SM (132 / 8 KV heads = 16 items a head); other shapes (fp8 caches,
// head_dim 64) keep the mma.sync kernel's 64-token tiles and two CTAs per SM (33 items a head).
TEST_CASE("split prefill plans for the Hopper kernel: 128-token chunks, one CTA per SM") {
  const DeviceLimits hopper{132, 2, 2, true}, other{132, 2, 2};
  struct Want {
    uint32_t items, chunk, max_chunks, rows;
  };
  auto plan = [](const AttentionShape& sh, int32_t q, int32_t prefix, const DeviceLimits* d,
                 uint32_t force = 0) {
    const PrefillPlan p = plan_prefill(sh, {q}, {prefix + q}, d, force);
    if (p.split.kv_chunk) {
      CHECK(p.split.total_q == static_cast<uint32_t>(q));
      CHECK(p.workspace_bytes ==
            uint64_t{p.split.partial_rows} * sh.q_heads * (sh.head_dim + 1) * 4);
      CHECK(p.work.size() == 3 * p.num_tiles + q + 1);
    }
    return Want{p.num_tiles, p.split.kv_chunk, p.split.max_chunks, p.split.partial_rows};
  };
  auto same = [](const Want& a, const Want& b) {
    return a.items == b.items && a.chunk == b.chunk && a.max_chunks == b.max_chunks &&
           a.rows == b.rows;
  };
  // 64 tokens over 16K: 2 query tiles of 129 KV tiles; 2 x ceil(129 / c) <= 16 at c = 17 tiles.
  CHECK(same(plan(kLlama8B, 64, 16384, &hopper), {16, 17 * 128, 8, 64 * 8}));
  CHECK(same(plan(kLlama8B, 64, 16384, &other), {32, 17 * 64, 16, 64 * 16}));
  // 16 tokens (one query tile): 15 chunks of 9 tiles over 16K, 16 of 17 over 32K.
  CHECK(same(plan(kLlama8B, 16, 16384, &hopper), {15, 9 * 128, 15, 16 * 15}));
  CHECK(same(plan(kLlama8B, 16, 32768, &hopper), {16, 17 * 128, 16, 16 * 16}));
  CHECK(same(plan(kLlama8B, 64, 32768, &hopper), {16, 33 * 128, 8, 64 * 8}));
  // 512 tokens: 16 query tiles fill the Hopper grid (unsplit), not the mma.sync one's 33.
  CHECK(same(plan(kLlama8B, 512, 16384, &hopper), {16, 0, 0, 0}));
  CHECK(same(plan(kLlama8B, 512, 16384, &other), {32, 66 * 128, 2, 512 * 2}));
  // Forced: the longest range in 4 chunks of the planner's tiles (128 here, 64 without a device).
  CHECK(same(plan(kLlama8B, 64, 16384, &hopper, 4), {8, 33 * 128, 4, 64 * 4}));
  CHECK(same(plan(kLlama8B, 64, 16384, nullptr, 4), {8, 65 * 64, 4, 64 * 4}));
  // Shapes the Hopper kernel does not take are planned as before.
  AttentionShape fp8 = kLlama8B;
  fp8.kv_cache = KvCacheDtype::kFp8E4m3;
  const AttentionShape d64{32, 8, 64, KvDtype::kBf16};
  CHECK(same(plan(fp8, 64, 16384, &hopper), plan(fp8, 64, 16384, &other)));
  CHECK(same(plan(d64, 64, 16384, &hopper), plan(d64, 64, 16384, &other)));
  CHECK(same(plan(d64, 64, 16384, &hopper), {32, 17 * 64, 16, 64 * 16}));
}

TEST_CASE("a split step's sequences planned apart with its chunk length are cut as it cut them") {
  const DeviceLimits hopper{132, 2, 2, true};
  // A step of three prefills: 16 tokens over 16K, 32 over 4K, 64 over 300.
  const std::vector<int32_t> q = {16, 32, 64}, kv = {16400, 4128, 364};
  const PrefillPlan step = plan_prefill(kLlama8B, q, kv, &hopper);
  REQUIRE(step.split.kv_chunk > 0);
  CHECK(step.split.kv_chunk % kSm90KvTile == 0);
  // Each sequence alone, with the step's chunk: its items carry the step's chunk indices, in the
  // step's order (an item's first word is its sequence, renumbered from 0 here).
  for (size_t s = 0; s < q.size(); ++s) {
    const PrefillPlan alone =
        plan_prefill(kLlama8B, {q[s]}, {kv[s]}, &hopper, 0, step.split.kv_chunk);
    std::vector<int32_t> want;  // the step's chunk indices of this sequence's items
    for (uint32_t i = 0; i < step.num_tiles; ++i)
      if (step.work[3 * i] == static_cast<int32_t>(s)) want.push_back(step.work[3 * i + 2]);
    if (alone.split.kv_chunk == 0) {  // every range fits one chunk: unsplit, as many items
      CHECK(std::all_of(want.begin(), want.end(), [](int32_t c) { return c == 0; }));
      CHECK(alone.num_tiles == want.size());
      continue;
    }
    CHECK(alone.split.kv_chunk == step.split.kv_chunk);
    std::vector<int32_t> got;
    for (uint32_t i = 0; i < alone.num_tiles; ++i) got.push_back(alone.work[3 * i + 2]);
    CHECK(got == want);
  }
  // 64 tokens over 300 (a 364-token range, three 128-token tiles): chunks of 256 tokens cut it,
  // a 512-token chunk holds it whole (unsplit).
  CHECK(plan_prefill(kLlama8B, {64}, {364}, &hopper, 0, 256).split.kv_chunk == 256);
  CHECK(plan_prefill(kLlama8B, {64}, {364}, &hopper, 0, 512).split.kv_chunk == 0);
}

TEST_CASE("a windowed split prefill cuts the window each tile reads, from its start") {
  const DeviceLimits hopper{132, 2, 2, true};
  // 16 tokens over 16,384 with a 1,024-token window: the tile reads [15,361, 16,400), 1,039
  // tokens in 9 Hopper tiles, where full attention reads 16,400 in 129.
  const PrefillPlan full = plan_prefill(kLlama8B, {16}, {16400}, &hopper);
  CHECK(full.split.kv_chunk == 1152);  // 15 chunks of 9 tiles
  const PrefillPlan w = plan_prefill(kLlama8B, {16}, {16400}, &hopper, 0, 0, 1024);
  CHECK(w.split.kv_chunk == 256);  // the shortest chunk (2 tiles): 5 CTAs a KV head
  REQUIRE(w.num_tiles == 5);
  for (int32_t j = 0; j < 5; ++j) {
    CHECK(w.work[3 * j] == 0);
    CHECK(w.work[3 * j + 1] == 0);
    CHECK(w.work[3 * j + 2] == j);
  }
  // Token 0 (position 16,384) reaches chunks 0..3 of [15,361, ...); tokens 1..15 all five.
  CHECK(w.split.max_chunks == 5);
  CHECK(w.split.total_q == 16);
  CHECK(w.split.partial_rows == 4 + 15 * 5);
  const int32_t* indptr = w.work.data() + 3 * w.num_tiles;
  CHECK(indptr[1] - indptr[0] == 4);
  CHECK(indptr[16] - indptr[15] == 5);
  CHECK(w.workspace_bytes == uint64_t{79} * 32 * 129 * sizeof(float));
  // The checks' reference, planned with the step's chunk and the window, is cut the same way.
  const PrefillPlan ref = plan_prefill(kLlama8B, {16}, {16400}, &hopper, 0, 256, 1024);
  CHECK(ref.work == w.work);
  // A window longer than every position is full attention's plan.
  CHECK(plan_prefill(kLlama8B, {16}, {16400}, &hopper, 0, 0, 20000).work == full.work);
  // Tiles of one sequence start their chunks at their own windows: 100 tokens over 3,000 with a
  // 700-token window, forced into chunks of 128 (the mma.sync kernel's planning: no device).
  const PrefillPlan r = plan_prefill(kLlama8B, {100}, {3100}, nullptr, 0, 128, 700);
  REQUIRE(r.split.kv_chunk == 128);
  const int32_t* ip = r.work.data() + 3 * r.num_tiles;
  for (int32_t t = 0; t < 100; ++t) {  // tile (t / 32)'s range starts at 3,000 + 32 (t / 32) - 699
    const int32_t begin = 3000 + 32 * (t / 32) - 699, pos = 3000 + t;
    CHECK(ip[t + 1] - ip[t] == (pos + 1 - begin + 127) / 128);
  }
}

TEST_CASE("synth_value is deterministic, in [-1, 1) on a 2^-23 grid, and keyed") {
  double sum = 0;
  std::set<float> seen;
  for (uint32_t e = 0; e < 4096; ++e) {
    const float x = synth_value(17, 4, synth_salt_k(3), e);
    REQUIRE(x == synth_value(17, 4, synth_salt_k(3), e));
    REQUIRE(x >= -1.f);
    REQUIRE(x < 1.f);
    const double grid = (double(x) + 1.0) * 8388608.0;  // an integer on the 2^-23 grid
    REQUIRE(grid == std::floor(grid));
    sum += x;
    seen.insert(x);
  }
  CHECK(std::abs(sum / 4096) < 0.05);
  CHECK(seen.size() > 4000);
  // Every key changes the values: token, position, layer, K vs V vs Q.
  const float base = synth_value(17, 4, synth_salt_k(3), 9);
  CHECK(synth_value(18, 4, synth_salt_k(3), 9) != base);
  CHECK(synth_value(17, 5, synth_salt_k(3), 9) != base);
  CHECK(synth_value(17, 4, synth_salt_k(4), 9) != base);
  CHECK(synth_value(17, 4, synth_salt_v(3), 9) != base);
  CHECK(synth_value(17, 4, synth_salt_q(3), 9) != base);
}

}  // namespace
}  // namespace memsim::kernels
