// FP8 KV cache kernels on a real GPU: the KV write's quantization (value / scale, rounded to
// nearest even, saturated) byte for byte against a host encoder written from the formats'
// definitions, and decode / prefill over e4m3 and e5m2 caches against a float64 reference that
// dequantizes the same bytes (code value x scale); paged and contiguous bit-identical. Small
// shapes, so it also runs under compute-sanitizer. Exits 77 (skipped) without a CUDA device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "tests/kernel_test_util.h"

namespace memsim::kernels {

// The worst errors over every case, bf16 and fp16 (printed at the end).
struct Worst {
  double rel = 0, max_abs = 0;
};
Worst worst[2];

namespace {

// ---- the fp8 formats on the host (OCP FP8: e4m3 without infinities, max 448; e5m2 IEEE-like,
// max finite 57344) ------------------------------------------------------------------------------

struct Fp8Format {
  int man_bits, bias;
  uint8_t max_code;  // largest finite magnitude code
};
constexpr Fp8Format kE4m3{3, 7, 0x7e};
constexpr Fp8Format kE5m2{2, 15, 0x7b};

Fp8Format format_of(KvCacheDtype d) {
  return d == KvCacheDtype::kFp8E5m2 ? kE5m2 : kE4m3;
}

double fp8_value(Fp8Format f, uint8_t code) {
  const int e = (code & 0x7f) >> f.man_bits, m = code & ((1 << f.man_bits) - 1);
  const double mag = e == 0 ? std::ldexp(m, 1 - f.bias - f.man_bits)
                            : std::ldexp((1 << f.man_bits) + m, e - f.bias - f.man_bits);
  return (code & 0x80) ? -mag : mag;
}

// Round to nearest (ties to the even code), saturating to +-max; the sign is kept (-0 too).
uint8_t fp8_encode(Fp8Format f, float x) {
  // The magnitudes of codes 0..max_code, increasing with the code (one table per format).
  static const auto table = [](Fp8Format g) {
    std::vector<double> m(g.max_code + 1u);
    for (unsigned c = 0; c <= g.max_code; ++c) m[c] = fp8_value(g, static_cast<uint8_t>(c));
    return m;
  };
  static const std::vector<double> e4m3 = table(kE4m3), e5m2 = table(kE5m2);
  const std::vector<double>& mags = f.man_bits == kE4m3.man_bits ? e4m3 : e5m2;
  const double a = std::fabs(static_cast<double>(x));
  unsigned code = f.max_code;
  if (a < mags.back()) {
    // The largest code whose value is <= a, and the next one.
    const unsigned lo =
        static_cast<unsigned>(std::upper_bound(mags.begin(), mags.end(), a) - mags.begin()) - 1;
    const double dl = a - mags[lo], dh = mags[lo + 1] - a;
    code = dl < dh ? lo : dh < dl ? lo + 1 : (lo & 1 ? lo + 1 : lo);
  }
  return static_cast<uint8_t>(code | (std::signbit(x) ? 0x80u : 0u));
}

// ---- a batch in an fp8 cache, laid out both ways ------------------------------------------------

struct Fp8Batch {
  AttentionShape shape;
  uint32_t page = 16, max_blocks = 0, max_len = 0;
  std::vector<int32_t> kv_lens, tables, slots;
  int64_t block_stride = 0, slot_stride = 0;  // bytes (= elements)
  std::vector<std::vector<double>> k, v;      // dequantized: code value x scale
  std::vector<uint8_t> paged_k, paged_v, contig_k, contig_v;
};

constexpr KvScales kScales{0.004f, 0.0025f};  // |x| < 1: codes up to 250 and 400

Fp8Batch make_batch(const AttentionShape& shape, uint32_t page, const std::vector<int32_t>& lens,
                    std::mt19937& rng) {
  Fp8Batch b;
  b.shape = shape;
  b.page = page;
  b.kv_lens = lens;
  const uint64_t row = shape.row_elems();
  const Fp8Format f = format_of(shape.kv_cache);
  uint32_t blocks = 3;  // blocks no sequence uses
  for (int32_t l : lens) {
    b.max_blocks = std::max<uint32_t>(b.max_blocks, (l + page - 1) / page);
    blocks += (l + page - 1) / page;
    b.max_len = std::max<uint32_t>(b.max_len, l);
  }
  b.block_stride = static_cast<int64_t>(page * row + 16 * (rng() % 3));
  std::vector<int32_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const uint32_t n = static_cast<uint32_t>(lens.size()), bt = std::max(1u, b.max_blocks);
  b.tables.assign(uint64_t{n} * bt, -1);
  b.slot_stride = static_cast<int64_t>((b.max_len + 5) * row);
  b.slots.resize(n);
  std::iota(b.slots.begin(), b.slots.end(), 0);
  std::shuffle(b.slots.begin(), b.slots.end(), rng);
  b.paged_k.assign(blocks * b.block_stride, f.max_code);  // poison: the largest value
  b.paged_v = b.paged_k;
  b.contig_k.assign(n * b.slot_stride, f.max_code);
  b.contig_v = b.contig_k;
  b.k.resize(n);
  b.v.resize(n);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  uint32_t next = 0;
  for (uint32_t s = 0; s < n; ++s) {
    const uint32_t len = static_cast<uint32_t>(lens[s]);
    for (uint32_t i = 0; i < (len + page - 1) / page; ++i)
      b.tables[uint64_t{s} * bt + i] = ids[next++];
    b.k[s].resize(uint64_t{len} * row);
    b.v[s].resize(uint64_t{len} * row);
    for (uint32_t pos = 0; pos < len; ++pos)
      for (uint64_t e = 0; e < row; ++e) {
        const uint8_t kc = fp8_encode(f, u(rng) / kScales.k);
        const uint8_t vc = fp8_encode(f, u(rng) / kScales.v);
        b.k[s][pos * row + e] = fp8_value(f, kc) * kScales.k;
        b.v[s][pos * row + e] = fp8_value(f, vc) * kScales.v;
        const int64_t pe =
            b.tables[uint64_t{s} * bt + pos / page] * b.block_stride + (pos % page) * row + e;
        const int64_t ce = b.slots[s] * b.slot_stride + pos * row + e;
        b.paged_k[pe] = b.contig_k[ce] = kc;
        b.paged_v[pe] = b.contig_v[ce] = vc;
      }
  }
  return b;
}

std::vector<uint16_t> random_q(KvDtype d, size_t n, std::mt19937& rng, std::vector<float>* out) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint16_t> h(n);
  out->resize(n);
  for (size_t i = 0; i < n; ++i) (*out)[i] = from_half(d, h[i] = to_half(d, u(rng)));
  return h;
}

// Sliding window (vLLM / FlashAttention: position p sees p - window < k <= p; 0 = full): the
// first KV position a query at `pos` sees.
uint32_t first_visible(uint32_t pos, uint32_t window) {
  return window > 0 && pos + 1 > window ? pos + 1 - window : 0;
}

// float64 attention of one query row over KV positions [first, limit) of sequence s, KV head kh.
void reference_row(const Fp8Batch& b, uint32_t s, uint32_t kh, const float* q, uint32_t limit,
                   double* out, uint32_t first = 0) {
  const uint32_t D = b.shape.head_dim;
  const uint64_t row = b.shape.row_elems();
  std::fill(out, out + D, 0.0);
  if (limit == 0) return;
  std::vector<double> w(limit);
  double mx = -INFINITY, den = 0;
  for (uint32_t pos = first; pos < limit; ++pos) {
    double dot = 0;
    for (uint32_t d = 0; d < D; ++d) dot += double(q[d]) * b.k[s][pos * row + kh * D + d];
    mx = std::max(mx, w[pos] = dot / std::sqrt(double(D)));
  }
  for (uint32_t pos = first; pos < limit; ++pos) den += (w[pos] = std::exp(w[pos] - mx));
  for (uint32_t pos = first; pos < limit; ++pos)
    for (uint32_t d = 0; d < D; ++d) out[d] += w[pos] * b.v[s][pos * row + kh * D + d] / den;
}

void check_close(KvDtype dt, const std::vector<uint16_t>& got, const std::vector<double>& ref) {
  double num = 0, den = 0, mx = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double x = from_half(dt, got[i]);
    num += (x - ref[i]) * (x - ref[i]);
    den += ref[i] * ref[i];
    mx = std::isnan(x) ? INFINITY : std::max(mx, std::abs(x - ref[i]));
  }
  const double rel = std::sqrt(num / std::max(den, 1e-30));
  CAPTURE(rel, mx);
  Worst& w = worst[dt == KvDtype::kBf16 ? 0 : 1];
  w.rel = std::max(w.rel, rel);
  w.max_abs = std::max(w.max_abs, mx);
  // The bf16 / fp16 bounds of test_attention_kernels.cpp: dequantization is exact, so the error
  // is the computation's (P rounded for P x V, fp32 accumulation, the output rounded).
  CHECK(rel < (dt == KvDtype::kBf16 ? 1e-2 : 2e-3));
  CHECK(mx < (dt == KvDtype::kBf16 ? 2e-2 : 4e-3));
}

// Decode both ways (splits 0: the planner's; work_list: plan_decode_work's list), with a
// sliding window (0 = full). q_exp: the queries are sent times 2^q_exp (exact in bf16) with the
// softmax scale times 2^-q_exp, so the reference is unchanged.
void check_decode(KvDtype dt, KvCacheDtype kv, uint32_t D, uint32_t q_heads, uint32_t kv_heads,
                  uint32_t page, const std::vector<int32_t>& lens, uint32_t splits,
                  std::mt19937& rng, bool work_list = false, uint32_t window = 0, int q_exp = 0,
                  int expect_tma = -1) {
  AttentionShape sh{q_heads, kv_heads, D, dt};
  sh.kv_cache = kv;
  CAPTURE(to_string(dt), to_string(kv), D, q_heads, kv_heads, page, splits, work_list, lens[0],
          window);
  const Fp8Batch b = make_batch(sh, page, lens, rng);
  std::vector<float> qf;
  const uint32_t n = static_cast<uint32_t>(lens.size());
  std::vector<uint16_t> q = random_q(dt, uint64_t{n} * q_heads * D, rng, &qf);
  for (size_t i = 0; i < q.size(); ++i) q[i] = to_half(dt, std::ldexp(qf[i], q_exp));
  DeviceLimits lim;
  REQUIRE(query_device(&lim) == cudaSuccess);
  DecodeWork w;
  if (work_list) w = plan_decode_work(sh, lens, lim, nullptr, window);
  const DecodePlan plan =
      work_list ? w.plan : plan_decode(sh, n, b.max_len, lim, splits, 0, window);
  DevBuf<uint16_t> dq(q);
  DevBuf<uint8_t> pk(b.paged_k), pv(b.paged_v), ck(b.contig_k), cv(b.contig_v);
  DevBuf<int32_t> dl(lens), tables(b.tables), slots(b.slots), work(w.words);
  DevBuf<uint8_t> ws(plan.workspace_bytes);
  const size_t out_n = uint64_t{n} * q_heads * D;
  DevBuf<uint16_t> o1(std::vector<uint16_t>(out_n, 0x7fc0)),
      o2(std::vector<uint16_t>(out_n, 0x7fc0));
  DecodeArgs a;
  a.q = dq.addr();
  a.seqs.kv_lens = dl.p;
  a.seqs.block_tables = tables.p;
  a.seqs.bt_stride = std::max(1u, b.max_blocks);
  a.seqs.slots = slots.p;
  a.workspace = ws.addr();
  a.work = work_list ? work.p : nullptr;
  a.kv_scales = kScales;
  a.window = window;
  a.scale = static_cast<float>(std::ldexp(1.0 / std::sqrt(double(D)), -q_exp));
  a.o = o1.addr();
  a.cache = {pk.addr(), pv.addr(), b.block_stride, page, KvAddressing::kPaged};
  if (expect_tma >= 0) CHECK(decode_uses_tma(sh, a.cache, window) == (expect_tma == 1));
  CUDA_OK(paged_decode(sh, plan, a, nullptr));
  a.o = o2.addr();
  a.cache = {ck.addr(), cv.addr(), b.slot_stride, 0, KvAddressing::kContiguous};
  CHECK_FALSE(decode_uses_tma(sh, a.cache, window));  // contiguous caches copy by cp.async
  CUDA_OK(paged_decode(sh, plan, a, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> paged = o1.download(), contig = o2.download();
  CHECK(paged == contig);
  std::vector<double> ref(out_n);
  for (uint32_t s = 0; s < n; ++s)
    for (uint32_t h = 0; h < q_heads; ++h)
      reference_row(b, s, h / sh.group(), &qf[(uint64_t{s} * q_heads + h) * D],
                    static_cast<uint32_t>(lens[s]), &ref[(uint64_t{s} * q_heads + h) * D],
                    lens[s] ? first_visible(static_cast<uint32_t>(lens[s]) - 1, window) : 0);
  check_close(dt, paged, ref);
}

TEST_CASE("fp8 decode matches a float64 reference of the dequantized cache") {
  std::mt19937 rng(11);
  for (KvCacheDtype kv : {KvCacheDtype::kFp8E4m3, KvCacheDtype::kFp8E5m2})
    for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16})
      for (uint32_t D : {64u, 128u, 256u}) {
        check_decode(dt, kv, D, 8, 8, 16, {1, 15, 16, 17, 100}, 0, rng);  // MHA, page +- 1
        check_decode(dt, kv, D, 28, 4, 1, {33, 7, 64}, 0, rng);           // group 7, page 1
        check_decode(dt, kv, D, 32, 4, 256, {255, 256, 257}, 0, rng);     // group 8, page 256
        check_decode(dt, kv, D, 12, 4, 7, {300, 1, 129}, 3, rng);         // 3 splits
      }
}

TEST_CASE("fp8 decode over long ranges, split-K and a ragged work list") {
  std::mt19937 rng(12);
  // Long ranges through the four-stage pipeline; split-K; a ragged work list.
  check_decode(KvDtype::kBf16, KvCacheDtype::kFp8E4m3, 128, 32, 8, 16, {2000}, 1, rng);
  check_decode(KvDtype::kBf16, KvCacheDtype::kFp8E4m3, 128, 32, 8, 16, {3000, 5}, 7, rng);
  check_decode(KvDtype::kBf16, KvCacheDtype::kFp8E4m3, 128, 32, 8, 16, {1500, 40, 700, 1}, 0, rng,
               true);
}

TEST_CASE("fp8 decode by TMA: blocks of 64, 128 and 192 tokens; splits, work lists") {
  std::mt19937 rng(13);
  AttentionShape sh{32, 8, 128, KvDtype::kBf16};
  sh.kv_cache = KvCacheDtype::kFp8E4m3;
  int dev = 0, major = 0;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  const char* off = std::getenv("MEMSIM_DECODE_TMA");  // gpu_kernels.sh runs both settings
  const int tma = major >= 9 && !(off && off[0] == '0') ? 1 : 0;
  const auto paged = [](uint32_t page) {
    return KvLayerView{256, 512, page * 1024, page, KvAddressing::kPaged};
  };
  CHECK_FALSE(decode_uses_tma(sh, paged(16), 0));    // cp.async: 16-token boxes ran slower
  CHECK_FALSE(decode_uses_tma(sh, paged(32), 0));    // and 32-token ones no faster
  CHECK_FALSE(decode_uses_tma(sh, paged(64), 512));  // windows: cp.async
  sh.head_dim = 64;
  CHECK_FALSE(decode_uses_tma(sh, paged(64), 0));
  // Whole tiles by TMA, the last partial tile by cp.async; paged (TMA) against contiguous
  // (cp.async) bit for bit and against the reference; interleaved block strides (make_batch);
  // split ranges and work-list chunks that start 64 tokens into a block.
  const auto e4m3 = KvCacheDtype::kFp8E4m3;
  check_decode(KvDtype::kBf16, e4m3, 128, 32, 8, 64, {2000}, 1, rng, false, 0, 0, tma);
  check_decode(KvDtype::kBf16, e4m3, 128, 32, 8, 128, {3000, 5, 64, 127}, 7, rng, false, 0, 0, tma);
  check_decode(KvDtype::kFp16, KvCacheDtype::kFp8E5m2, 128, 32, 8, 64, {1500, 40, 700, 1}, 0, rng,
               true, 0, 0, tma);
  check_decode(KvDtype::kBf16, e4m3, 128, 32, 8, 128, {2500, 100, 1300, 64}, 0, rng, true, 0, 0,
               tma);
  check_decode(KvDtype::kBf16, e4m3, 128, 28, 4, 192, {191, 192, 193, 1000}, 3, rng, false, 0, 0,
               tma);
  check_decode(KvDtype::kBf16, e4m3, 128, 28, 4, 192, {3000, 190, 900}, 0, rng, true, 0, 0, tma);
}

// Prefill: chunk i of sequence s has q_lens[s] new tokens after prefixes[s] cached ones (q_exp:
// as check_decode's).
void check_prefill(KvDtype dt, KvCacheDtype kv, uint32_t D, uint32_t q_heads, uint32_t kv_heads,
                   uint32_t page, const std::vector<int32_t>& q_lens,
                   const std::vector<int32_t>& prefixes, std::mt19937& rng, uint32_t window = 0,
                   int q_exp = 0) {
  AttentionShape sh{q_heads, kv_heads, D, dt};
  sh.kv_cache = kv;
  CAPTURE(to_string(dt), to_string(kv), D, q_heads, kv_heads, page, window);
  std::vector<int32_t> lens(q_lens.size()), indptr{0};
  for (size_t s = 0; s < q_lens.size(); ++s) {
    lens[s] = prefixes[s] + q_lens[s];
    indptr.push_back(indptr.back() + q_lens[s]);
  }
  const Fp8Batch b = make_batch(sh, page, lens, rng);
  std::vector<float> qf;
  const uint64_t total_q = static_cast<uint64_t>(indptr.back());
  std::vector<uint16_t> q = random_q(dt, total_q * q_heads * D, rng, &qf);
  for (size_t i = 0; i < q.size(); ++i) q[i] = to_half(dt, std::ldexp(qf[i], q_exp));
  const PrefillPlan plan = plan_prefill(sh, q_lens, lens);
  DevBuf<uint16_t> dq(q), o1(std::vector<uint16_t>(q.size(), 0x7fc0)),
      o2(std::vector<uint16_t>(q.size(), 0x7fc0));
  DevBuf<uint8_t> pk(b.paged_k), pv(b.paged_v), ck(b.contig_k), cv(b.contig_v);
  DevBuf<int32_t> dl(lens), tables(b.tables), slots(b.slots), work(plan.work), di(indptr);
  PrefillArgs a;
  a.q = dq.addr();
  a.qo_indptr = di.p;
  a.seqs.kv_lens = dl.p;
  a.seqs.block_tables = tables.p;
  a.seqs.bt_stride = std::max(1u, b.max_blocks);
  a.seqs.slots = slots.p;
  a.work = work.p;
  a.num_tiles = plan.num_tiles;
  a.kv_scales = kScales;
  a.window = window;
  a.scale = static_cast<float>(std::ldexp(1.0 / std::sqrt(double(D)), -q_exp));
  a.o = o1.addr();
  a.cache = {pk.addr(), pv.addr(), b.block_stride, page, KvAddressing::kPaged};
  CUDA_OK(paged_prefill(sh, a, nullptr));
  a.o = o2.addr();
  a.cache = {ck.addr(), cv.addr(), b.slot_stride, 0, KvAddressing::kContiguous};
  CUDA_OK(paged_prefill(sh, a, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> paged = o1.download(), contig = o2.download();
  CHECK(paged == contig);
  std::vector<double> ref(q.size());
  for (size_t s = 0; s < q_lens.size(); ++s)
    for (int32_t i = 0; i < q_lens[s]; ++i)
      for (uint32_t h = 0; h < q_heads; ++h) {
        const uint64_t at = ((indptr[s] + i) * uint64_t{q_heads} + h) * D;
        const uint32_t pos = static_cast<uint32_t>(prefixes[s] + i);
        reference_row(b, static_cast<uint32_t>(s), h / sh.group(), &qf[at], pos + 1, &ref[at],
                      first_visible(pos, window));
      }
  check_close(dt, paged, ref);
}

TEST_CASE("fp8 prefill matches a float64 reference over cached prefixes, ragged batches") {
  std::mt19937 rng(5);
  for (KvCacheDtype kv : {KvCacheDtype::kFp8E4m3, KvCacheDtype::kFp8E5m2})
    for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16})
      for (uint32_t D : {64u, 128u, 256u}) {
        check_prefill(dt, kv, D, 8, 8, 16, {1, 16, 17, 70}, {0, 0, 15, 33}, rng);
        check_prefill(dt, kv, D, 28, 4, 1, {9, 30}, {100, 0}, rng);       // group 7
        check_prefill(dt, kv, D, 32, 4, 256, {130, 5}, {257, 256}, rng);  // group 8
      }
}

TEST_CASE("fp8 attention with bf16 queries past fp16's range and far below it") {
  // Prefill multiplies fp8 K and V with fp16 operands: bf16 Q is rescaled by a power of two into
  // fp16's range (2^40 overflows fp16, 2^-40 flushes to zero, without it). Decode keeps bf16
  // operands; it is checked at the same queries.
  std::mt19937 rng(13);
  for (KvCacheDtype kv : {KvCacheDtype::kFp8E4m3, KvCacheDtype::kFp8E5m2})
    for (int q_exp : {40, -40}) {
      CAPTURE(q_exp);
      check_prefill(KvDtype::kBf16, kv, 128, 32, 8, 16, {1, 70, 130}, {0, 33, 257}, rng, 0, q_exp);
      check_prefill(KvDtype::kBf16, kv, 256, 8, 8, 16, {17}, {15}, rng, 0, q_exp);
      check_decode(KvDtype::kBf16, kv, 128, 32, 8, 16, {1, 200, 1000}, 0, rng, false, 0, q_exp);
      check_decode(KvDtype::kBf16, kv, 128, 8, 8, 16, {300, 129}, 3, rng, false, 0, q_exp);
    }
}

TEST_CASE("fp8 sliding-window decode and prefill match a float64 reference") {
  std::mt19937 rng(21);
  // Windows below, at and past the contexts; decode split, listed and through the four-stage
  // pipeline; prefill chunks over prefixes the window cuts into.
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16})
    for (uint32_t D : {64u, 128u, 256u})
      for (uint32_t window : {1u, 16u, 65u, 300u, 2000u}) {
        const KvCacheDtype kv = D == 128 ? KvCacheDtype::kFp8E5m2 : KvCacheDtype::kFp8E4m3;
        check_decode(dt, kv, D, 32, 8, 16, {1, 100, 300, 1500}, 0, rng, false, window);
        check_decode(dt, kv, D, 12, 4, 7, {700, 64, 9}, 3, rng, false, window);
        check_decode(dt, kv, D, 28, 4, 1, {1500, 40, 300}, 0, rng, true, window);
        check_prefill(dt, kv, D, 32, 8, 16, {1, 70, 150}, {400, 33, 0}, rng, window);
      }
}

TEST_CASE("fp8 paged_kv_write quantizes value / scale to the nearest code, saturated") {
  std::mt19937 rng(9);
  for (KvCacheDtype kv : {KvCacheDtype::kFp8E4m3, KvCacheDtype::kFp8E5m2})
    for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16}) {
      CAPTURE(to_string(dt), to_string(kv));
      AttentionShape sh{16, 4, 128, dt};
      sh.kv_cache = kv;
      const Fp8Format f = format_of(kv);
      const uint64_t row = sh.row_elems(), in_stride = row + 8;
      const uint32_t page = 16, blocks = 6;
      const int64_t stride = page * row + 64;  // padded blocks, bytes
      const std::vector<int64_t> slots = {5, -1, 17, 95, 0, -1, 40};
      // Values across the range: small (subnormal codes), typical, and past the largest code
      // (saturated): |x| / scale up to 2 / 0.002 = 1000 for K (e4m3 saturates at 448), and
      // 60 / 0.001 = 60000 for V (e5m2 saturates at 57344).
      const KvScales sc{0.002f, 0.001f};
      std::uniform_real_distribution<float> uk(-2.f, 2.f), uv(-60.f, 60.f), tiny(-1e-5f, 1e-5f);
      std::vector<uint16_t> kn(slots.size() * in_stride), vn(kn.size());
      for (size_t i = 0; i < kn.size(); ++i) {
        kn[i] = to_half(dt, i % 5 == 0 ? tiny(rng) : uk(rng));
        vn[i] = to_half(dt, i % 7 == 0 ? tiny(rng) : uv(rng));
      }
      const std::vector<uint8_t> cache(blocks * stride, 0x5a);
      DevBuf<uint8_t> dk(cache), dv(cache);
      DevBuf<uint16_t> nk(kn), nv(vn);
      DevBuf<int64_t> ds(slots);
      KvWriteArgs a;
      a.k_new = nk.addr();
      a.v_new = nv.addr();
      a.new_stride = static_cast<int64_t>(in_stride);  // a fused QKV tensor's rows
      a.slot_mapping = ds.p;
      a.num_tokens = static_cast<uint32_t>(slots.size());
      a.cache = {dk.addr(), dv.addr(), stride, page, KvAddressing::kPaged};
      a.kv_scales = sc;
      CUDA_OK(paged_kv_write(sh, a, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      std::vector<uint8_t> want_k = cache, want_v = cache;
      uint64_t saturated = 0;
      for (size_t t = 0; t < slots.size(); ++t) {
        if (slots[t] < 0) continue;
        const int64_t at = (slots[t] / page) * stride + (slots[t] % page) * row;
        for (uint64_t e = 0; e < row; ++e) {
          const float k = from_half(dt, kn[t * in_stride + e]) / sc.k;
          const float v = from_half(dt, vn[t * in_stride + e]) / sc.v;
          want_k[at + e] = fp8_encode(f, k);
          want_v[at + e] = fp8_encode(f, v);
          saturated += (want_k[at + e] & 0x7f) == f.max_code;
          saturated += (want_v[at + e] & 0x7f) == f.max_code;
        }
      }
      CHECK(saturated > 0);
      CHECK(dk.download() == want_k);
      CHECK(dv.download() == want_v);
      a.kv_scales.v = 0;  // a scale must be positive
      CHECK(paged_kv_write(sh, a, nullptr) == cudaErrorInvalidValue);
    }
}

TEST_CASE("the host fp8 encoder: exact codes, ties to even, saturation") {
  CHECK(fp8_value(kE4m3, 0x7e) == 448);
  CHECK(fp8_value(kE4m3, 0x01) == std::ldexp(1.0, -9));  // smallest subnormal
  CHECK(fp8_value(kE5m2, 0x7b) == 57344);
  CHECK(fp8_encode(kE4m3, 1.0f) == 0x38);
  CHECK(fp8_encode(kE4m3, -448.f) == 0xfe);
  CHECK(fp8_encode(kE4m3, 1000.f) == 0x7e);
  CHECK(fp8_encode(kE4m3, 1.0625f) == 0x38);  // halfway 1 and 1.125: the even code (1)
  CHECK(fp8_encode(kE4m3, 1.1875f) == 0x3a);  // halfway 1.125 and 1.25: the even code (1.25)
  CHECK(fp8_encode(kE5m2, 1e6f) == 0x7b);
  CHECK(fp8_encode(kE4m3, -1e-6f) == 0x80);
}

TEST_CASE("fp8 launchers reject caches that 16-byte copies cannot address") {
  AttentionShape sh{8, 8, 128, KvDtype::kBf16};
  sh.kv_cache = KvCacheDtype::kFp8E4m3;
  DevBuf<int32_t> table(std::vector<int32_t>{0}), lens(std::vector<int32_t>{1});
  DevBuf<uint8_t> cache(4096);
  DecodePlan plan;
  plan.max_batch = 1;
  DecodeArgs a;
  a.seqs.block_tables = table.p;
  a.seqs.kv_lens = lens.p;
  a.cache = {cache.addr(), cache.addr(), 16 * 1024 + 8, 16, KvAddressing::kPaged};
  CHECK(paged_decode(sh, plan, a, nullptr) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);
}

}  // namespace
}  // namespace memsim::kernels

int main(int argc, char** argv) {
  if (const int skip = memsim::kernels::skip_without_gpu()) return skip;
  const int rc = Catch::Session().run(argc, argv);
  for (int i = 0; i < 2; ++i)
    std::printf("worst %s output error against float64: relative L2 %.3g, max abs %.3g\n",
                i == 0 ? "bf16" : "fp16", memsim::kernels::worst[i].rel,
                memsim::kernels::worst[i].max_abs);
  return rc;
}
