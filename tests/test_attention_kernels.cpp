// Attention and KV-cache kernels on a real GPU against a float64 CPU reference: decode (split-K,
// graphs with a device-resident batch), prefill (chunks over cached prefixes), paged vs
// contiguous bit-identity, split-KV prefill (short chunks over long prefixes), sliding windows,
// KV write (block copies and swaps: test_block_kernels.cpp). Small shapes, so it also runs under
// compute-sanitizer. Exits 77 (skipped) without a CUDA device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/synth.h"
#include "tests/kernel_test_util.h"

namespace memsim::kernels {
namespace {

// ---- a batch laid out both ways ----------------------------------------------------------------

// K/V of every sequence in a paged cache (shuffled blocks, padded block stride) and in a
// contiguous cache (shuffled slots), plus float copies for the reference.
struct Batch {
  AttentionShape shape;
  uint32_t page = 16;
  std::vector<int32_t> kv_lens;
  uint32_t max_blocks = 0;
  int64_t block_stride = 0, slot_stride = 0;  // elements
  uint32_t max_len = 0;
  std::vector<int32_t> tables, slots;
  std::vector<std::vector<float>> k, v;  // [seq][pos * row + head * D + d] (rounded values)
  std::vector<uint16_t> paged_k, paged_v, contig_k, contig_v;
};

// pad < 0: a random block-stride padding of 0, 8 or 16 elements.
Batch make_batch(const AttentionShape& shape, uint32_t page, const std::vector<int32_t>& lens,
                 std::mt19937& rng, int pad = -1) {
  Batch b;
  b.shape = shape;
  b.page = page;
  b.kv_lens = lens;
  const uint64_t row = shape.row_elems();
  uint32_t blocks = 0;
  for (int32_t l : lens) {
    b.max_blocks = std::max<uint32_t>(b.max_blocks, (l + page - 1) / page);
    blocks += (l + page - 1) / page;
    b.max_len = std::max<uint32_t>(b.max_len, l);
  }
  blocks += 3;  // blocks no sequence uses
  b.block_stride = static_cast<int64_t>(page * row + (pad >= 0 ? pad : 8 * (rng() % 3)));
  std::vector<int32_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const uint32_t n = static_cast<uint32_t>(lens.size());
  b.tables.assign(uint64_t{n} * std::max(1u, b.max_blocks), -1);
  b.slot_stride = static_cast<int64_t>((b.max_len + 5) * row);
  b.slots.resize(n);
  std::iota(b.slots.begin(), b.slots.end(), 0);
  std::shuffle(b.slots.begin(), b.slots.end(), rng);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  b.paged_k.assign(blocks * b.block_stride, to_half(shape.dtype, 7.f));  // poison: large
  b.paged_v = b.paged_k;
  b.contig_k.assign(n * b.slot_stride, to_half(shape.dtype, 7.f));
  b.contig_v = b.contig_k;
  b.k.resize(n);
  b.v.resize(n);
  uint32_t next = 0;
  for (uint32_t s = 0; s < n; ++s) {
    const uint32_t len = static_cast<uint32_t>(lens[s]);
    for (uint32_t i = 0; i < (len + page - 1) / page; ++i)
      b.tables[uint64_t{s} * std::max(1u, b.max_blocks) + i] = ids[next++];
    b.k[s].resize(uint64_t{len} * row);
    b.v[s].resize(uint64_t{len} * row);
    for (uint32_t pos = 0; pos < len; ++pos)
      for (uint64_t e = 0; e < row; ++e) {
        const uint16_t kh = to_half(shape.dtype, u(rng)), vh = to_half(shape.dtype, u(rng));
        b.k[s][pos * row + e] = from_half(shape.dtype, kh);
        b.v[s][pos * row + e] = from_half(shape.dtype, vh);
        const int64_t pe =
            b.tables[uint64_t{s} * std::max(1u, b.max_blocks) + pos / page] * b.block_stride +
            (pos % page) * row + e;
        const int64_t ce = b.slots[s] * b.slot_stride + pos * row + e;
        b.paged_k[pe] = kh;
        b.paged_v[pe] = vh;
        b.contig_k[ce] = kh;
        b.contig_v[ce] = vh;
      }
  }
  return b;
}

// Random values in [-1, 1) of dtype d; `out` receives them as floats (exactly representable).
std::vector<uint16_t> random_half(KvDtype d, size_t n, std::mt19937& rng,
                                  std::vector<float>* out = nullptr) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint16_t> h(n);
  if (out) out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    h[i] = to_half(d, u(rng));
    if (out) (*out)[i] = from_half(d, h[i]);
  }
  return h;
}

// float64 attention of one query row over KV positions [first, limit) of sequence s, KV head kh
// (first > 0: a sliding window).
void reference_row(const Batch& b, uint32_t s, uint32_t kh, const float* q, uint32_t limit,
                   double scale, double* out, uint32_t first = 0) {
  const uint32_t D = b.shape.head_dim;
  const uint64_t row = b.shape.row_elems();
  if (limit == 0) {  // no KV: the kernels write zeros
    std::fill(out, out + b.shape.head_dim, 0.0);
    return;
  }
  std::vector<double> w(limit);
  double mx = -INFINITY;
  for (uint32_t pos = first; pos < limit; ++pos) {
    double dot = 0;
    for (uint32_t d = 0; d < D; ++d) dot += double(q[d]) * b.k[s][pos * row + kh * D + d];
    w[pos] = dot * scale;
    mx = std::max(mx, w[pos]);
  }
  double den = 0;
  for (uint32_t pos = first; pos < limit; ++pos) den += (w[pos] = std::exp(w[pos] - mx));
  for (uint32_t d = 0; d < D; ++d) {
    double acc = 0;
    for (uint32_t pos = first; pos < limit; ++pos) acc += w[pos] * b.v[s][pos * row + kh * D + d];
    out[d] = acc / den;
  }
}

// Relative L2 error and max abs error of `got` (half) against `ref`.
struct Err {
  double rel = 0, max_abs = 0;
};
Err compare(KvDtype d, const std::vector<uint16_t>& got, const std::vector<double>& ref) {
  double num = 0, den = 0, mx = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double x = from_half(d, got[i]);
    num += (x - ref[i]) * (x - ref[i]);
    den += ref[i] * ref[i];
    mx = std::max(mx, std::abs(x - ref[i]));
    if (std::isnan(x)) mx = INFINITY;
  }
  return {std::sqrt(num / std::max(den, 1e-30)), mx};
}

// The worst errors of the sliding-window cases (bf16, fp16), printed at the end.
Err worst_window[2];
void note_window(KvDtype d, uint32_t window, const Err& e) {
  if (window == 0) return;
  Err& w = worst_window[d == KvDtype::kBf16 ? 0 : 1];
  w.rel = std::max(w.rel, e.rel);
  w.max_abs = std::max(w.max_abs, e.max_abs);
}

// Error bounds (float32 accumulation; P rounded to the storage type for P x V; output rounded).
double rel_bound(KvDtype d) {
  return d == KvDtype::kBf16 ? 1e-2 : 2e-3;
}
double abs_bound(KvDtype d) {
  return d == KvDtype::kBf16 ? 2e-2 : 4e-3;
}

DeviceLimits device_limits() {
  DeviceLimits lim;
  REQUIRE(query_device(&lim) == cudaSuccess);
  return lim;
}

struct DecodeOut {
  std::vector<uint16_t> paged, contig;
};

// Runs decode both ways with `splits` (0 = planner's choice), or over plan_decode_work's list
// when `work_list`, with a sliding `window` (0 = full), and returns the outputs.
DecodeOut run_decode(const Batch& b, const std::vector<uint16_t>& q, uint32_t splits,
                     uint32_t* used_splits = nullptr, bool work_list = false, uint32_t window = 0) {
  const AttentionShape& sh = b.shape;
  const uint32_t n = static_cast<uint32_t>(b.kv_lens.size());
  DecodeWork w;
  if (work_list) w = plan_decode_work(sh, b.kv_lens, device_limits(), nullptr, window);
  const DecodePlan plan =
      work_list ? w.plan : plan_decode(sh, n, b.max_len, device_limits(), splits, 0, window);
  if (used_splits) *used_splits = plan.num_splits;
  DevBuf<uint16_t> dq(q), pk(b.paged_k), pv(b.paged_v), ck(b.contig_k), cv(b.contig_v);
  DevBuf<int32_t> lens(b.kv_lens), tables(b.tables), slots(b.slots), work(w.words);
  DevBuf<uint8_t> ws(plan.workspace_bytes);
  const size_t out_n = uint64_t{n} * sh.q_heads * sh.head_dim;
  DevBuf<uint16_t> o1(std::vector<uint16_t>(out_n, 0x7fc0)),
      o2(std::vector<uint16_t>(out_n, 0x7fc0));
  DecodeArgs a;
  a.q = dq.addr();
  a.seqs.kv_lens = lens.p;
  a.seqs.block_tables = tables.p;
  a.seqs.bt_stride = std::max(1u, b.max_blocks);
  a.seqs.slots = slots.p;
  a.workspace = ws.addr();
  a.work = work_list ? work.p : nullptr;
  a.window = window;
  a.o = o1.addr();
  a.cache = {pk.addr(), pv.addr(), b.block_stride, b.page, KvAddressing::kPaged};
  CUDA_OK(paged_decode(sh, plan, a, nullptr));
  a.o = o2.addr();
  a.cache = {ck.addr(), cv.addr(), b.slot_stride, 0, KvAddressing::kContiguous};
  CUDA_OK(paged_decode(sh, plan, a, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  return {o1.download(), o2.download()};
}

// Sliding window (vLLM / FlashAttention: query position p sees p - window < k <= p): the first
// position a query at `pos` sees (0 = full attention), written out independently of the kernels'
// window_begin.
uint32_t first_visible(uint32_t pos, uint32_t window) {
  return window > 0 && pos + 1 > window ? pos + 1 - window : 0;
}

// Points the block-table entries of sequence s's blocks wholly before position `first` at a block
// far past the pool (vLLM's remove_skipped_blocks frees them): a kernel that read one would fault
// (compute-sanitizer names it) or read poison.
void drop_blocks_before(Batch& b, uint32_t s, uint32_t first) {
  for (uint32_t i = 0; (i + 1) * b.page <= first; ++i)
    b.tables[uint64_t{s} * std::max(1u, b.max_blocks) + i] = 1 << 28;
}

std::vector<double> reference_decode(const Batch& b, const std::vector<float>& qf,
                                     uint32_t window = 0) {
  const AttentionShape& sh = b.shape;
  const uint32_t D = sh.head_dim, n = static_cast<uint32_t>(b.kv_lens.size());
  std::vector<double> ref(uint64_t{n} * sh.q_heads * D);
  for (uint32_t s = 0; s < n; ++s) {
    const uint32_t len = static_cast<uint32_t>(b.kv_lens[s]);
    for (uint32_t h = 0; h < sh.q_heads; ++h)
      reference_row(b, s, h / sh.group(), &qf[(uint64_t{s} * sh.q_heads + h) * D], len,
                    1.0 / std::sqrt(double(D)), &ref[(uint64_t{s} * sh.q_heads + h) * D],
                    len ? first_visible(len - 1, window) : 0);
  }
  return ref;
}

uint32_t check_decode_case(KvDtype dt, uint32_t D, uint32_t q_heads, uint32_t kv_heads,
                           uint32_t page, std::vector<int32_t> lens, uint32_t splits,
                           std::mt19937& rng, bool work_list = false, uint32_t window = 0) {
  const AttentionShape sh{q_heads, kv_heads, D, dt};
  CAPTURE(to_string(dt), D, q_heads, kv_heads, page, splits, lens.size(), lens[0], window);
  Batch b = make_batch(sh, page, lens, rng);
  for (uint32_t s = 0; s < lens.size(); ++s)
    if (lens[s] > 0) drop_blocks_before(b, s, first_visible(lens[s] - 1, window));
  std::vector<float> qf;
  const auto q = random_half(dt, lens.size() * q_heads * D, rng, &qf);
  uint32_t used = 0;  // splits, or the most chunks of a sequence
  const DecodeOut out = run_decode(b, q, splits, &used, work_list, window);
  CAPTURE(used, work_list);
  CHECK(out.paged == out.contig);  // same data, same split: bit-identical
  if (window >= b.max_len) {       // a window the context does not reach: full attention, same bits
    const DecodeOut full = run_decode(b, q, splits, nullptr, work_list);
    CHECK(out.paged == full.paged);
  }
  const Err e = compare(dt, out.paged, reference_decode(b, qf, window));
  note_window(dt, window, e);
  CAPTURE(e.rel, e.max_abs);
  CHECK(e.rel < rel_bound(dt));
  CHECK(e.max_abs < abs_bound(dt));
  return used;
}

TEST_CASE("decode matches a float64 reference, paged and contiguous bit-identical") {
  std::mt19937 rng(7);
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16})
    for (uint32_t D : {64u, 128u, 256u}) {
      check_decode_case(dt, D, 8, 8, 16, {1, 15, 16, 17, 100}, 0, rng);  // MHA, page +- 1
      check_decode_case(dt, D, 28, 4, 1, {33, 7, 64}, 0, rng);           // group 7, page 1
      check_decode_case(dt, D, 32, 4, 256, {255, 256, 257}, 0, rng);     // group 8, page 256
      check_decode_case(dt, D, 12, 4, 7, {300, 1, 129}, 3, rng);  // group 3, odd page, 3 splits
    }
}

TEST_CASE("decode split-K agrees with one split and covers every split count") {
  std::mt19937 rng(11);
  for (uint32_t splits : {1u, 2u, 5u, 16u, 64u})
    check_decode_case(KvDtype::kBf16, 128, 32, 8, 16, {2000, 63, 700}, splits, rng);
  // The planner splits a single long sequence (idle SMs otherwise).
  const DecodePlan p = plan_decode({32, 8, 128, KvDtype::kBf16}, 1, 32768, device_limits());
  CHECK(p.num_splits > 1);
}

// paged_decode captured into a CUDA graph on a stream of its own (destroyed with it).
struct CapturedDecode {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CapturedDecode(const AttentionShape& sh, const DecodePlan& plan, const DecodeArgs& a) {
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    REQUIRE(paged_decode(sh, plan, a, stream) == cudaSuccess);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  }
  ~CapturedDecode() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (stream) cudaStreamDestroy(stream);
  }
  CapturedDecode(const CapturedDecode&) = delete;
  CapturedDecode& operator=(const CapturedDecode&) = delete;
};

TEST_CASE("decode in a CUDA graph reads batch size, lengths and tables from device memory") {
  std::mt19937 rng(5);
  const AttentionShape sh{16, 4, 128, KvDtype::kBf16};
  const uint32_t cap = 8;
  Batch big = make_batch(sh, 16, {40, 41, 90, 7, 300, 16, 17, 200}, rng, 0);
  const DecodePlan plan = plan_decode(sh, cap, 512, device_limits(), 4);
  DevBuf<uint16_t> pk(big.paged_k), pv(big.paged_v);
  DevBuf<int32_t> lens(big.kv_lens), tables(big.tables), num(std::vector<int32_t>{cap});
  std::vector<float> qf;
  const auto q = random_half(sh.dtype, cap * sh.q_heads * 128, rng, &qf);
  DevBuf<uint16_t> dq(q), out(std::vector<uint16_t>(q.size(), 0x7fc0));
  DevBuf<uint8_t> ws(plan.workspace_bytes);
  DecodeArgs a;
  a.q = dq.addr();
  a.o = out.addr();
  a.cache = {pk.addr(), pv.addr(), big.block_stride, 16, KvAddressing::kPaged};
  a.seqs = {lens.p, tables.p, big.max_blocks, nullptr, num.p};
  a.workspace = ws.addr();
  const CapturedDecode g(sh, plan, a);
  const cudaStream_t st = g.stream;
  const cudaGraphExec_t exec = g.exec;

  // Replay 1: all 8 sequences.
  CUDA_OK(cudaGraphLaunch(exec, st));
  CUDA_OK(cudaStreamSynchronize(st));
  const Err e1 = compare(sh.dtype, out.download(), reference_decode(big, qf));
  CHECK(e1.rel < rel_bound(sh.dtype));

  // Replay 2: 3 sequences, each one block longer (a new block crosses the page boundary: the
  // seed's section 15 bug), tables rewritten between replays, the rest of the output untouched.
  std::vector<int32_t> lens2 = {57, 33, 91};
  Batch small = make_batch(sh, 16, lens2, rng, 0);
  REQUIRE(small.max_blocks <= big.max_blocks);
  std::vector<int32_t> tables2(big.tables.size(), -1), all_lens = lens2;
  all_lens.resize(cap, 1);
  for (uint32_t s = 0; s < 3; ++s)
    for (uint32_t i = 0; i < small.max_blocks; ++i)
      tables2[s * big.max_blocks + i] = small.tables[s * small.max_blocks + i];
  DevBuf<uint16_t> pk2(small.paged_k), pv2(small.paged_v);
  // The graph's pointers are fixed: copy the new cache contents into the captured buffers.
  REQUIRE(small.paged_k.size() * 2 <= big.paged_k.size() * 2);
  CUDA_OK(cudaMemcpy(pk.p, small.paged_k.data(), small.paged_k.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(pv.p, small.paged_v.data(), small.paged_v.size() * 2, cudaMemcpyHostToDevice));
  REQUIRE(small.block_stride == big.block_stride);
  lens.upload(all_lens);
  tables.upload(tables2);
  num.upload({3});
  out.upload(std::vector<uint16_t>(q.size(), 0x7fc0));
  CUDA_OK(cudaGraphLaunch(exec, st));
  CUDA_OK(cudaStreamSynchronize(st));
  const auto got = out.download();
  const std::vector<double> ref = reference_decode(small, qf);
  const size_t live = 3ull * sh.q_heads * 128;
  const Err e2 = compare(sh.dtype, std::vector<uint16_t>(got.begin(), got.begin() + live), ref);
  CAPTURE(e2.rel, e2.max_abs);
  CHECK(e2.rel < rel_bound(sh.dtype));
  CHECK(std::all_of(got.begin() + live, got.end(), [](uint16_t x) { return x == 0x7fc0; }));
}

TEST_CASE("decode over a work list: uniform batches as the split grid, ragged ones balanced") {
  std::mt19937 rng(13);
  // Uniform: the same chunks as split_range's splits, so bit-identical to the split grid.
  for (const auto& [n, len] : std::vector<std::pair<uint32_t, int32_t>>{
           {1, 4000}, {1, 100}, {3, 2048}, {20, 700}, {40, 1500}}) {
    CAPTURE(n, len);
    const AttentionShape sh{32, 8, 128, KvDtype::kBf16};
    const Batch b = make_batch(sh, 16, std::vector<int32_t>(n, len), rng);
    const auto q = random_half(sh.dtype, n * sh.q_heads * 128, rng);
    uint32_t grid_splits = 0, chunks = 0;
    const DecodeOut grid = run_decode(b, q, 0, &grid_splits);
    const DecodeOut list = run_decode(b, q, 0, &chunks, true);
    CAPTURE(grid_splits, chunks);
    CHECK(list.paged == grid.paged);
    CHECK(list.contig == grid.contig);
  }
  // Ragged: one long sequence among short ones is split, the short ones are not; an empty one
  // writes zeros.
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16})
    for (const std::vector<int32_t>& lens : std::vector<std::vector<int32_t>>{
             {8000, 100, 300, 64, 65, 1, 900}, {5000, 0, 17}, {3000, 2999, 40, 4100}})
      CHECK(check_decode_case(dt, 128, 32, 8, 16, lens, 0, rng, true) > 1);
}

TEST_CASE("decode in a CUDA graph re-plans its work list before every replay") {
  // A capture of 8 sequences at up to 512 tokens (plan_decode_graph's launch), replayed over
  // ragged batches whose lists need other chunk lengths, padded as the executor pads (length 1,
  // not in the list).
  std::mt19937 rng(17);
  const AttentionShape sh{32, 8, 128, KvDtype::kBf16};
  const uint32_t cap = 8, ctx = 512;
  const DeviceLimits lim = device_limits();
  const DecodePlan launch = plan_decode_graph(sh, cap, ctx, lim);
  REQUIRE(launch.num_splits > 1);
  const std::vector<int32_t> full(cap, int32_t(ctx));
  Batch tmpl = make_batch(sh, 16, full, rng, 0);
  DevBuf<uint16_t> pk(tmpl.paged_k), pv(tmpl.paged_v);
  DevBuf<int32_t> lens(full), tables(tmpl.tables);
  DevBuf<int32_t> work(plan_decode_work(sh, full, lim, &launch).words);
  const auto q = random_half(sh.dtype, cap * sh.q_heads * 128, rng);
  DevBuf<uint16_t> dq(q), out(std::vector<uint16_t>(q.size(), 0x7fc0));
  DevBuf<uint8_t> ws(launch.workspace_bytes);
  DecodeArgs a;
  a.q = dq.addr();
  a.o = out.addr();
  a.cache = {pk.addr(), pv.addr(), tmpl.block_stride, 16, KvAddressing::kPaged};
  a.seqs = {lens.p, tables.p, tmpl.max_blocks, nullptr, nullptr};
  a.workspace = ws.addr();
  a.work = work.p;
  const CapturedDecode g(sh, launch, a);
  const cudaStream_t st = g.stream;
  const cudaGraphExec_t exec = g.exec;
  std::vector<uint32_t> chunk_tiles;
  for (const std::vector<int32_t>& live : std::vector<std::vector<int32_t>>{
           {512, 512, 512, 512, 512, 512, 512, 512}, {500, 3, 40}, {511}, {70, 200, 9, 300, 64}}) {
    CAPTURE(live.size(), live[0]);
    std::vector<int32_t> padded = live;
    padded.resize(cap, 1);
    Batch b = make_batch(sh, 16, padded, rng, 0);
    REQUIRE(b.block_stride == tmpl.block_stride);
    REQUIRE(b.paged_k.size() <= tmpl.paged_k.size());
    std::vector<int32_t> t(tmpl.tables.size(), -1);
    for (uint32_t s = 0; s < cap; ++s)
      for (uint32_t i = 0; i < b.max_blocks; ++i)
        t[s * tmpl.max_blocks + i] = b.tables[s * b.max_blocks + i];
    CUDA_OK(cudaMemcpy(pk.p, b.paged_k.data(), b.paged_k.size() * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(pv.p, b.paged_v.data(), b.paged_v.size() * 2, cudaMemcpyHostToDevice));
    // The list covers the live rows only, as the executor's replay plans it: padding rows are
    // not computed (their outputs keep the sentinel).
    const DecodeWork w = plan_decode_work(sh, live, lim, &launch);
    REQUIRE(w.words.size() == work.n);
    chunk_tiles.push_back(w.chunk_tiles);
    lens.upload(padded);
    tables.upload(t);
    work.upload(w.words);
    out.upload(std::vector<uint16_t>(q.size(), 0x7fc0));
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    std::vector<float> qf(q.size());
    for (size_t i = 0; i < q.size(); ++i) qf[i] = from_half(sh.dtype, q[i]);
    std::vector<uint16_t> got = out.download();
    const size_t row = size_t{sh.q_heads} * 128, n = live.size() * row;
    CHECK(std::all_of(got.begin() + n, got.end(), [](uint16_t x) { return x == 0x7fc0; }));
    got.resize(n);
    std::vector<double> ref = reference_decode(b, qf);
    ref.resize(n);
    const Err e = compare(sh.dtype, got, ref);
    CAPTURE(w.chunk_tiles, w.num_items, e.rel, e.max_abs);
    CHECK(e.rel < rel_bound(sh.dtype));
    CHECK(e.max_abs < abs_bound(sh.dtype));
  }
  // The replays ran different chunk lengths through the one captured launch.
  CHECK(*std::min_element(chunk_tiles.begin(), chunk_tiles.end()) <
        *std::max_element(chunk_tiles.begin(), chunk_tiles.end()));
}

// Returns the paged output (the contiguous one is checked equal to it).
std::vector<uint16_t> check_prefill_case(KvDtype dt, uint32_t D, uint32_t q_heads,
                                         uint32_t kv_heads, uint32_t page,
                                         const std::vector<int32_t>& q_lens,
                                         const std::vector<int32_t>& prefixes, std::mt19937& rng,
                                         uint32_t window = 0) {
  const AttentionShape sh{q_heads, kv_heads, D, dt};
  CAPTURE(to_string(dt), D, q_heads, kv_heads, page, q_lens[0], prefixes[0], window);
  std::vector<int32_t> kv_lens(q_lens.size());
  for (size_t i = 0; i < q_lens.size(); ++i) kv_lens[i] = q_lens[i] + prefixes[i];
  Batch b = make_batch(sh, page, kv_lens, rng);
  for (uint32_t s = 0; s < q_lens.size(); ++s)  // no chunk's query sees these blocks
    drop_blocks_before(b, s, first_visible(prefixes[s], window));
  const PrefillPlan plan = plan_prefill(sh, q_lens, kv_lens);
  std::vector<int32_t> indptr(q_lens.size() + 1, 0);
  for (size_t i = 0; i < q_lens.size(); ++i) indptr[i + 1] = indptr[i] + q_lens[i];
  REQUIRE(plan.total_q == static_cast<uint64_t>(indptr.back()));
  std::vector<float> qf;
  const auto q = random_half(dt, plan.total_q * q_heads * D, rng, &qf);
  DevBuf<uint16_t> dq(q), pk(b.paged_k), pv(b.paged_v), ck(b.contig_k), cv(b.contig_v);
  DevBuf<int32_t> lens(kv_lens), tables(b.tables), slots(b.slots), ind(indptr), work(plan.work);
  DevBuf<uint16_t> o1(std::vector<uint16_t>(q.size(), 0x7fc0)),
      o2(std::vector<uint16_t>(q.size(), 0x7fc0));
  PrefillArgs a;
  a.q = dq.addr();
  a.qo_indptr = ind.p;
  a.seqs = {lens.p, tables.p, std::max(1u, b.max_blocks), slots.p, nullptr};
  a.work = work.p;
  a.num_tiles = plan.num_tiles;
  a.window = window;
  a.o = o1.addr();
  a.cache = {pk.addr(), pv.addr(), b.block_stride, page, KvAddressing::kPaged};
  CUDA_OK(paged_prefill(sh, a, nullptr));
  a.o = o2.addr();
  a.cache = {ck.addr(), cv.addr(), b.slot_stride, 0, KvAddressing::kContiguous};
  CUDA_OK(paged_prefill(sh, a, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = o1.download();
  CHECK(got == o2.download());
  std::vector<double> ref(q.size());
  for (size_t s = 0; s < q_lens.size(); ++s)
    for (int32_t i = 0; i < q_lens[s]; ++i)
      for (uint32_t h = 0; h < q_heads; ++h) {
        const uint64_t at = (uint64_t(indptr[s] + i) * q_heads + h) * D;
        const uint32_t pos = static_cast<uint32_t>(prefixes[s] + i);
        reference_row(b, static_cast<uint32_t>(s), h / sh.group(), &qf[at], pos + 1,
                      1.0 / std::sqrt(double(D)), &ref[at], first_visible(pos, window));
      }
  const Err e = compare(dt, got, ref);
  note_window(dt, window, e);
  CAPTURE(e.rel, e.max_abs);
  CHECK(e.rel < rel_bound(dt));
  CHECK(e.max_abs < abs_bound(dt));
  return got;
}

TEST_CASE("prefill matches a float64 reference over cached prefixes, ragged batches") {
  std::mt19937 rng(3);
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16})
    for (uint32_t D : {64u, 128u, 256u}) {
      check_prefill_case(dt, D, 8, 8, 16, {1, 16, 17, 70}, {0, 0, 15, 33}, rng);
      check_prefill_case(dt, D, 28, 4, 1, {9, 30}, {100, 0}, rng);       // group 7
      check_prefill_case(dt, D, 32, 4, 256, {130, 5}, {257, 256}, rng);  // group 8
      check_prefill_case(dt, D, 12, 4, 7, {64, 1}, {3, 200}, rng);       // group 3, odd page
    }
}

// The Hopper wgmma kernel takes head_dim 128 (bf16, fp16) on compute capability 9.0 unless
// MEMSIM_PREFILL_SM90=0: long chunks over long prefixes, many KV tiles through its two-stage ring,
// pages of 1, 5 and 16 tokens, groups 1, 4 and 6 (GQA rows r = token * group + head).
TEST_CASE("prefill at head_dim 128: long ranges through the Hopper kernel where it runs") {
  int dev = 0, major = 0, minor = 0;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  const char* env = std::getenv("MEMSIM_PREFILL_SM90");
  const bool want = major == 9 && minor == 0 && !(env && env[0] == '0');
  CHECK(prefill_sm90_eligible({32, 8, 128, KvDtype::kBf16}, false) == want);
  CHECK(prefill_sm90_eligible({32, 8, 128, KvDtype::kFp16}, false) == want);
  CHECK(prefill_sm90_eligible({32, 8, 128, KvDtype::kBf16}, true) == want);  // split too
  CHECK_FALSE(prefill_sm90_eligible({32, 8, 64, KvDtype::kBf16}, false));
  std::printf("prefill at head_dim 128 runs the %s kernel\n", want ? "sm90 wgmma" : "mma.sync");
  std::mt19937 rng(29);
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16}) {
    check_prefill_case(dt, 128, 8, 2, 5, {300, 2, 129}, {900, 1500, 0}, rng);  // group 4
    check_prefill_case(dt, 128, 6, 1, 1, {40, 257}, {700, 3}, rng);            // group 6
    check_prefill_case(dt, 128, 4, 4, 16, {520}, {0}, rng);                    // group 1
  }
  check_prefill_case(KvDtype::kBf16, 128, 8, 2, 16, {300, 64}, {900, 20}, rng, 200);  // window
}

// Split-KV prefill: the planner's split (`lim`) or a forced one against the float64 reference,
// paged and contiguous bit-identical; an unsplit plan (the grid already full, or one chunk) must
// give the unsplit launch's bits. `window` (> 0): both launches and the plan slide over it.
// Returns the plan's chunk length (0: not split).
uint32_t check_split_prefill(const AttentionShape& sh, uint32_t page,
                             const std::vector<int32_t>& q_lens,
                             const std::vector<int32_t>& prefixes, const DeviceLimits* lim,
                             uint32_t force, std::mt19937& rng, uint32_t window = 0) {
  const uint32_t D = sh.head_dim;
  std::vector<int32_t> kv_lens(q_lens.size());
  for (size_t i = 0; i < q_lens.size(); ++i) kv_lens[i] = q_lens[i] + prefixes[i];
  const Batch b = make_batch(sh, page, kv_lens, rng);
  const PrefillPlan base = plan_prefill(sh, q_lens, kv_lens);
  const PrefillPlan plan = plan_prefill(sh, q_lens, kv_lens, lim, force, 0, window);
  CAPTURE(to_string(sh.dtype), D, sh.q_heads, sh.kv_heads, q_lens[0], prefixes[0], force, window,
          plan.num_tiles, plan.split.kv_chunk, plan.split.max_chunks);
  if (plan.split.kv_chunk == 0) REQUIRE(plan.work == base.work);
  std::vector<int32_t> indptr(q_lens.size() + 1, 0);
  for (size_t i = 0; i < q_lens.size(); ++i) indptr[i + 1] = indptr[i] + q_lens[i];
  std::vector<float> qf;
  const auto q = random_half(sh.dtype, base.total_q * sh.q_heads * D, rng, &qf);
  DevBuf<uint16_t> dq(q), pk(b.paged_k), pv(b.paged_v), ck(b.contig_k), cv(b.contig_v);
  DevBuf<int32_t> lens(kv_lens), tables(b.tables), slots(b.slots), ind(indptr), w0(base.work),
      w1(plan.work);
  DevBuf<float> ws(plan.workspace_bytes / 4);
  const std::vector<uint16_t> nan(q.size(), 0x7fc0);
  DevBuf<uint16_t> o0(nan), o1(nan), o2(nan);
  PrefillArgs a;
  a.q = dq.addr();
  a.qo_indptr = ind.p;
  a.seqs = {lens.p, tables.p, std::max(1u, b.max_blocks), slots.p, nullptr};
  a.cache = {pk.addr(), pv.addr(), b.block_stride, page, KvAddressing::kPaged};
  a.work = w0.p;  // the unsplit launch
  a.num_tiles = base.num_tiles;
  a.o = o0.addr();
  a.window = window;
  CUDA_OK(paged_prefill(sh, a, nullptr));
  a.work = w1.p;  // the plan's
  a.num_tiles = plan.num_tiles;
  a.split = plan.split;
  a.workspace = ws.addr();
  a.o = o1.addr();
  CUDA_OK(paged_prefill(sh, a, nullptr));
  a.o = o2.addr();
  a.cache = {ck.addr(), cv.addr(), b.slot_stride, 0, KvAddressing::kContiguous};
  CUDA_OK(paged_prefill(sh, a, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = o1.download();
  CHECK(got == o2.download());
  if (plan.split.kv_chunk == 0) CHECK(got == o0.download());
  std::vector<double> ref(q.size());
  for (size_t s = 0; s < q_lens.size(); ++s)
    for (int32_t i = 0; i < q_lens[s]; ++i)
      for (uint32_t h = 0; h < sh.q_heads; ++h) {
        const uint64_t at = (uint64_t(indptr[s] + i) * sh.q_heads + h) * D;
        const auto end = static_cast<uint32_t>(prefixes[s] + i + 1);
        reference_row(b, static_cast<uint32_t>(s), h / sh.group(), &qf[at], end,
                      1.0 / std::sqrt(double(D)), &ref[at],
                      window && end > window ? end - window : 0);
      }
  const Err e = compare(sh.dtype, got, ref);
  CAPTURE(e.rel, e.max_abs);
  CHECK(e.rel < rel_bound(sh.dtype));
  CHECK(e.max_abs < abs_bound(sh.dtype));
  return plan.split.kv_chunk;
}

TEST_CASE("split-KV prefill: short chunks over long prefixes match the reference") {
  std::mt19937 rng(21);
  const DeviceLimits h100{132, 2, 2};
  const AttentionShape llama{8, 2, 128, KvDtype::kBf16};  // Llama-3.1-8B's group of 4
  for (int32_t q : {1, 16, 64, 100})
    for (int32_t prefix : {0, 1024, 16384}) {
      const uint32_t chunk = check_split_prefill(llama, 16, {q}, {prefix}, &h100, 0, rng);
      CHECK((chunk > 0) == (prefix > 0));  // one tile over 1K+ tokens is split, a bare chunk not
    }
  // Ragged: short over long with long chunks; then a full grid (16 SMs): the unsplit plan's bits.
  CHECK(check_split_prefill(llama, 16, {16, 700, 3, 64}, {16384, 0, 4000, 1024}, &h100, 0, rng));
  const DeviceLimits small{16, 2, 2};
  CHECK(check_split_prefill(llama, 16, {2000, 16}, {0, 8000}, &small, 0, rng) == 0);
  // Forced split counts, dtypes, head dims, groups 1 / 7 / 8, odd pages.
  for (uint32_t force : {1u, 2u, 3u, 7u, 64u})
    check_split_prefill(llama, 16, {16, 100, 1}, {3000, 500, 2500}, nullptr, force, rng);
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16})
    for (uint32_t D : {64u, 128u, 256u}) {
      check_split_prefill({8, 8, D, dt}, 7, {5, 40}, {1500, 300}, nullptr, 5, rng);
      check_split_prefill({28, 4, D, dt}, 1, {9}, {700}, nullptr, 3, rng);
      check_split_prefill({32, 4, D, dt}, 256, {20, 1}, {2000, 257}, &h100, 0, rng);
    }
}

// Split launches at head_dim 128 run the Hopper kernel where it runs (query_device's
// prefill_sm90): its planner's chunks (whole 128-token tiles, one CTA per SM) and forced chunks
// of the mma.sync kernel's 64-token tiles (chunk ends inside a 128-token tile, masked as causal),
// pages of 1, 5 and 16 tokens, groups 1 and 4, chunk lengths that are not whole query tiles.
TEST_CASE("split-KV prefill at head_dim 128: the Hopper kernel's chunks where it runs") {
  const DeviceLimits dev = device_limits();
  CHECK(dev.prefill_sm90 == prefill_sm90_eligible({32, 8, 128, KvDtype::kBf16}, true));
  std::printf("split prefill at head_dim 128 runs the %s kernel\n",
              dev.prefill_sm90 ? "sm90 wgmma" : "mma.sync");
  const DeviceLimits hopper{132, 2, 2, true};
  std::mt19937 rng(31);
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16})
    for (uint32_t page : {1u, 5u, 16u}) {
      const AttentionShape g4{8, 2, 128, dt}, g1{4, 4, 128, dt};
      // Issue 33's chunks scaled down: 64 and 16 tokens over long prefixes, group 4.
      const uint32_t c64 = check_split_prefill(g4, page, {64}, {3000}, &hopper, 0, rng);
      CHECK(c64 == 256);  // 2 x 24 tiles of 128 into 66 CTAs a KV head: the 2-tile minimum
      CHECK(check_split_prefill(g4, page, {16, 37}, {2500, 1100}, &hopper, 0, rng) % 128 == 0);
      // Forced: 448- and 320-token chunks (3.5 and 2.5 tiles of 128), ragged, group 1.
      CHECK(check_split_prefill(g4, page, {16, 100, 1}, {3000, 500, 2500}, nullptr, 7, rng) == 448);
      CHECK(check_split_prefill(g1, page, {100, 7}, {1500, 2000}, nullptr, 7, rng) == 320);
      check_split_prefill(g1, page, {130, 1}, {2000, 700}, &hopper, 3, rng);  // 2 query tiles
    }
  // The device's own plan (a Hopper one on 9.0): issue 33's shape, 64 tokens over 4K.
  check_split_prefill({32, 8, 128, KvDtype::kBf16}, 16, {64}, {4096}, &dev, 0, rng);
}

// A small split launch of each kind for compute-sanitizer (memcheck, racecheck): planned and
// forced chunks (one ending inside a 128-token tile), odd pages.
TEST_CASE("split-KV prefill small: the sanitizers' case") {
  const DeviceLimits hopper{132, 2, 2, true};
  std::mt19937 rng(37);
  CHECK(check_split_prefill({8, 2, 128, KvDtype::kBf16}, 5, {20, 3}, {600, 300}, &hopper, 0, rng));
  CHECK(check_split_prefill({8, 2, 128, KvDtype::kFp16}, 1, {40}, {500}, nullptr, 3, rng) == 192);
  CHECK(check_split_prefill({8, 2, 128, KvDtype::kBf16}, 5, {40}, {900}, &hopper, 0, rng, 300));
  CHECK(check_split_prefill({8, 8, 64, KvDtype::kFp16}, 3, {20}, {700}, nullptr, 3, rng, 150));
}

// With a sliding window each query tile's chunks count from its first query's window start:
// the planner's chunks (the Hopper kernel's at head_dim 128 where it runs) and forced ones,
// windows shorter and longer than a chunk, tiles whose rows' windows start in different chunks
// (100 tokens: several query tiles), prefixes inside the window, every head_dim.
TEST_CASE("split-KV prefill with a sliding window matches the reference") {
  const DeviceLimits hopper{132, 2, 2, true}, h100{132, 2, 2};
  std::mt19937 rng(41);
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16})
    for (uint32_t D : {64u, 128u, 256u}) {
      const AttentionShape g4{8, 2, D, dt};
      for (uint32_t window : {100u, 700u, 2048u}) {
        // 16 tokens read 115 keys with the 100-token window: one chunk (unsplit).
        const uint32_t chunk = check_split_prefill(g4, 16, {16}, {6000}, &hopper, 0, rng, window);
        CHECK((chunk > 0) == (window > 100));
        check_split_prefill(g4, 7, {16, 100, 1}, {5000, 3000, 50}, nullptr, 5, rng, window);
        check_split_prefill(g4, 1, {64}, {4000}, &h100, 0, rng, window);
      }
      check_split_prefill({28, 4, D, dt}, 5, {9, 130}, {2000, 1500}, nullptr, 3, rng, 333);
    }
}

TEST_CASE("sliding-window decode matches a float64 reference, split and listed") {
  std::mt19937 rng(17);
  // Windows below, at and past the contexts of a ragged batch (pages cut by the window's start;
  // 1: the query sees itself only). A window past every context checks full attention's bits.
  const std::vector<int32_t> lens = {1, 15, 100, 300, 1000, 64};
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16})
    for (uint32_t D : {64u, 128u, 256u}) {
      if (dt == KvDtype::kFp16 && D != 128) continue;
      for (uint32_t window : {1u, 16u, 64u, 65u, 100u, 1000u, 4096u}) {
        check_decode_case(dt, D, 32, 8, 16, lens, 0, rng, false, window);  // planner's split
        check_decode_case(dt, D, 12, 4, 7, lens, 3, rng, false, window);   // 3 splits, odd page
        check_decode_case(dt, D, 28, 4, 1, lens, 0, rng, true, window);    // work list, page 1
      }
    }
  // A long sequence with a short window: the split count of a short one, every split checked.
  for (uint32_t splits : {1u, 2u, 5u, 16u})
    check_decode_case(KvDtype::kBf16, 128, 32, 8, 16, {5000, 70, 1100}, splits, rng, false, 1000);
  CHECK(
      plan_decode({32, 8, 128, KvDtype::kBf16}, 1, 32768, device_limits(), 0, 0, 1024).num_splits ==
      plan_decode({32, 8, 128, KvDtype::kBf16}, 1, 1024, device_limits()).num_splits);
}

TEST_CASE("sliding-window prefill matches a float64 reference over cached prefixes") {
  std::mt19937 rng(19);
  // Chunks over prefixes the window cuts into, windows shorter than a tile's tokens (several
  // rows' ranges start inside one KV tile), and a window past every context (same bits as full).
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16})
    for (uint32_t D : {64u, 128u, 256u}) {
      if (dt == KvDtype::kFp16 && D != 128) continue;
      for (uint32_t window : {1u, 16u, 63u, 100u, 129u, 700u})
        check_prefill_case(dt, D, 32, 8, 16, {1, 70, 200, 9}, {500, 33, 0, 130}, rng, window);
      check_prefill_case(dt, D, 28, 4, 7, {130, 5}, {257, 256}, rng, 40);  // group 7, odd page
    }
  for (uint32_t D : {64u, 128u, 256u}) {
    std::mt19937 r1(23), r2(23);  // the same data twice
    const auto windowed =
        check_prefill_case(KvDtype::kBf16, D, 16, 4, 16, {90, 7}, {40, 300}, r1, 400);
    CHECK(windowed == check_prefill_case(KvDtype::kBf16, D, 16, 4, 16, {90, 7}, {40, 300}, r2));
  }
}

TEST_CASE("paged_kv_write places rows by slot and skips negative slots") {
  std::mt19937 rng(9);
  const AttentionShape sh{16, 4, 128, KvDtype::kBf16};
  const uint64_t row = sh.row_elems();
  const uint32_t page = 16, blocks = 6;
  const int64_t stride = page * row + 64;  // padded blocks
  std::vector<uint16_t> cache(blocks * stride, 0x1234);
  const std::vector<int64_t> slots = {5, -1, 17, 95, 0, -1, 40};
  std::vector<uint16_t> kn = random_half(sh.dtype, slots.size() * (row + 8), rng);
  std::vector<uint16_t> vn = random_half(sh.dtype, slots.size() * (row + 8), rng);
  DevBuf<uint16_t> dk(cache), dv(cache), nk(kn), nv(vn);
  DevBuf<int64_t> ds(slots);
  KvWriteArgs a;
  a.k_new = nk.addr();
  a.v_new = nv.addr();
  a.new_stride = static_cast<int64_t>(row + 8);  // strided input (a fused QKV tensor)
  a.slot_mapping = ds.p;
  a.num_tokens = static_cast<uint32_t>(slots.size());
  a.cache = {dk.addr(), dv.addr(), stride, page, KvAddressing::kPaged};
  CUDA_OK(paged_kv_write(sh, a, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> want_k = cache, want_v = cache;
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;
    const int64_t at = (slots[t] / page) * stride + (slots[t] % page) * row;
    std::copy_n(kn.begin() + t * (row + 8), row, want_k.begin() + at);
    std::copy_n(vn.begin() + t * (row + 8), row, want_v.begin() + at);
  }
  CHECK(dk.download() == want_k);
  CHECK(dv.download() == want_v);
}

}  // namespace
}  // namespace memsim::kernels

int main(int argc, char** argv) {
  if (const int skip = memsim::kernels::skip_without_gpu()) return skip;
  const int rc = Catch::Session().run(argc, argv);
  for (int i = 0; i < 2; ++i)
    std::printf("worst %s sliding-window error against float64: relative L2 %.3g, max abs %.3g\n",
                i == 0 ? "bf16" : "fp16", memsim::kernels::worst_window[i].rel,
                memsim::kernels::worst_window[i].max_abs);
  return rc;
}
