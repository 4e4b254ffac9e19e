// memsim-attn-bench: decode attention bandwidth (paged and contiguous) against PyTorch SDPA over
// contiguous K/V and a read-only bandwidth kernel, and causal prefill TFLOP/s, in one run on the
// GPU; the same shapes over an fp8 KV cache against bf16; sliding-window decode and prefill
// against full attention; short chunks over long prefixes (split-KV prefill against a decode
// step over the same KV). Exits 77 without a GPU.
#include <cuda_runtime_api.h>

#include <unistd.h>
#include <CLI/CLI.hpp>
#include <algorithm>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "bench/bench_cli.h"
#include "kernels/attention.h"
#include "src/app/spawn.h"

namespace {

using namespace memsim::kernels;

bool check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "memsim-attn-bench: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}
#define CK(expr) check((expr), #expr)

struct Dev {
  void* p = nullptr;
  explicit Dev(uint64_t bytes) { CK(cudaMalloc(&p, std::max<uint64_t>(bytes, 16))); }
  ~Dev() { cudaFree(p); }
  uint64_t a() const { return reinterpret_cast<uint64_t>(p); }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Median seconds per call of `fn` (enqueues one call on `st`): `reps` calls captured in one CUDA
// graph, the graph replayed `trials` times after a warm-up, each replay timed with events.
template <class F>
double time_calls(cudaStream_t st, int reps, int trials, F&& fn) {
  for (int i = 0; i < 3; ++i) fn();
  CK(cudaStreamSynchronize(st));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < reps; ++i) fn();
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, st));
  CK(cudaStreamSynchronize(st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int i = 0; i < trials; ++i) {
    CK(cudaEventRecord(e0, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms / 1e3 / reps);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// An fp8 KV cache's rows of a decode or prefill shape (kv_cache kAuto: none).
struct Fp8Figures {
  uint32_t splits = 0;
  double bytes = 0, paged_s = 0, contig_s = 0, ceiling_s = 0;
  std::vector<std::pair<uint32_t, double>> sweep;  // (splits, paged seconds)
  bool tma_paged = false, tma_contig = false;      // decode_uses_tma
};

struct DecodeRow {
  uint32_t batch = 0, ctx = 0, splits = 0;
  double bytes = 0, paged_s = 0, contig_s = 0, ceiling_s = 0, sdpa_s = 0;
  std::string sdpa_backend;
  std::vector<std::pair<uint32_t, double>> sweep;  // (splits, paged seconds)
  Fp8Figures fp8;
  // Sliding windows below ctx: paged decode with the window, and at full attention over a
  // context of the window's length (the same blocks): what the window should cost.
  struct Window {
    uint32_t window = 0, splits = 0;
    double window_s = 0, short_s = 0;
  };
  std::vector<Window> windows;
};

// Quantizes `rows` rows of the bf16/fp16 cache at `src` (row i at i x row elements) into the fp8
// cache at `dst` (row i at (i / granule) x stride + (i % granule) x row bytes) with paged_kv_write.
void quantize_rows(const AttentionShape& sh8, uint64_t src_k, uint64_t src_v, uint64_t dst_k,
                   uint64_t dst_v, uint64_t rows, uint32_t granule, int64_t stride,
                   cudaStream_t st) {
  std::vector<int64_t> slots(rows);
  std::iota(slots.begin(), slots.end(), int64_t{0});
  Dev ds(rows * 8);
  CK(cudaMemcpy(ds.p, slots.data(), rows * 8, cudaMemcpyHostToDevice));
  for (uint64_t first = 0; first < rows; first += 1u << 20) {  // grids of at most 2^20 CTAs
    KvWriteArgs w;
    const uint64_t elem_off = first * sh8.row_elems() * dtype_bytes(sh8.dtype);
    w.k_new = src_k + elem_off;
    w.v_new = src_v + elem_off;
    w.slot_mapping = ds.as<int64_t>() + first;
    w.num_tokens = static_cast<uint32_t>(std::min<uint64_t>(rows - first, 1u << 20));
    w.cache = {dst_k, dst_v, stride, granule, KvAddressing::kPaged};
    CK(paged_kv_write(sh8, w, st));
  }
  CK(cudaStreamSynchronize(st));
}

// Paged decode at each forced split count of `sweep` that the planner accepts (a's cache and
// data, a workspace of the forced plan's size): (splits, seconds) pairs.
std::vector<std::pair<uint32_t, double>> sweep_splits(const AttentionShape& sh, DecodeArgs a,
                                                      const DeviceLimits& lim, uint32_t batch,
                                                      uint32_t ctx, int reps, cudaStream_t st,
                                                      const std::vector<uint32_t>& sweep) {
  std::vector<std::pair<uint32_t, double>> out;
  for (uint32_t force : sweep) {
    const DecodePlan other = plan_decode(sh, batch, ctx, lim, force);
    if (other.num_splits != force) continue;
    Dev ws(other.workspace_bytes);
    a.workspace = ws.a();
    out.emplace_back(force, time_calls(st, reps, 7, [&] { CK(paged_decode(sh, other, a, st)); }));
  }
  return out;
}

// The fp8 rows of a decode shape: the bf16 caches quantized (scales 1, vLLM's default), the fp8
// shape's plan, paged and contiguous decode, the split sweep and the read ceiling over the fp8
// bytes.
Fp8Figures bench_decode_fp8(const AttentionShape& sh8, const DeviceLimits& lim, DecodeArgs a,
                            uint64_t pk, uint64_t pv, uint64_t ck, uint64_t cv, uint64_t blocks,
                            uint32_t page, uint32_t batch, uint32_t ctx, cudaStream_t st,
                            const std::vector<uint32_t>& sweep) {
  Fp8Figures f;
  const DecodePlan plan = plan_decode(sh8, batch, ctx, lim);
  f.splits = plan.num_splits;
  Dev ws(plan.workspace_bytes);
  a.workspace = ws.a();
  const uint64_t row = sh8.row_elems(), block = uint64_t{page} * row;
  Dev qk(blocks * block), qv(blocks * block), rk(uint64_t{batch} * ctx * row),
      rv(uint64_t{batch} * ctx * row);
  quantize_rows(sh8, pk, pv, qk.a(), qv.a(), blocks * page, page, static_cast<int64_t>(block), st);
  quantize_rows(sh8, ck, cv, rk.a(), rv.a(), uint64_t{batch} * ctx, ctx,
                static_cast<int64_t>(uint64_t{ctx} * row), st);
  const uint64_t kv_bytes = uint64_t{batch} * ctx * row * 2;
  f.bytes = double(kv_bytes + 2ull * batch * sh8.q_heads * sh8.head_dim * 2);
  const int reps = static_cast<int>(std::clamp<uint64_t>((8ull << 30) / kv_bytes, 5, 400));
  a.cache = {qk.a(), qv.a(), static_cast<int64_t>(block), page, KvAddressing::kPaged};
  f.tma_paged = decode_uses_tma(sh8, a.cache, 0);
  f.paged_s = time_calls(st, reps, 7, [&] { CK(paged_decode(sh8, plan, a, st)); });
  a.cache = {rk.a(), rv.a(), static_cast<int64_t>(uint64_t{ctx} * row), 0,
             KvAddressing::kContiguous};
  f.tma_contig = decode_uses_tma(sh8, a.cache, 0);
  f.contig_s = time_calls(st, reps, 7, [&] { CK(paged_decode(sh8, plan, a, st)); });
  a.cache = {qk.a(), qv.a(), static_cast<int64_t>(block), page, KvAddressing::kPaged};
  f.sweep = sweep_splits(sh8, a, lim, batch, ctx, reps, st, sweep);
  Dev sink(4096 * 4);
  CK(cudaMemset(sink.p, 0, 4096 * 4));
  f.ceiling_s = time_calls(st, reps, 7, [&] {
    CK(read_bandwidth(rk.a(), kv_bytes / 2, sink.as<uint32_t>(), st));
    CK(read_bandwidth(rv.a(), kv_bytes / 2, sink.as<uint32_t>(), st));
  });
  return f;
}

DecodeRow bench_decode(const AttentionShape& sh, uint32_t batch, uint32_t ctx, uint32_t page,
                       const DeviceLimits& lim, cudaStream_t st, std::mt19937& rng,
                       const std::vector<uint32_t>& sweep, KvCacheDtype fp8,
                       const std::vector<uint32_t>& windows) {
  DecodeRow r;
  r.batch = batch;
  r.ctx = ctx;
  const uint64_t row = sh.row_elems(), D = sh.head_dim;
  const uint32_t bps = (ctx + page - 1) / page;
  const uint64_t blocks = uint64_t{batch} * bps;
  const uint64_t block_elems = uint64_t{page} * row;
  Dev pk(blocks * block_elems * 2), pv(blocks * block_elems * 2);
  Dev ck(uint64_t{batch} * ctx * row * 2), cv(uint64_t{batch} * ctx * row * 2);
  Dev q(uint64_t{batch} * sh.q_heads * D * 2), o(uint64_t{batch} * sh.q_heads * D * 2);
  CK(random_half(sh.dtype, pk.a(), blocks * block_elems, 1, st));
  CK(random_half(sh.dtype, pv.a(), blocks * block_elems, 2, st));
  CK(random_half(sh.dtype, ck.a(), uint64_t{batch} * ctx * row, 3, st));
  CK(random_half(sh.dtype, cv.a(), uint64_t{batch} * ctx * row, 4, st));
  CK(random_half(sh.dtype, q.a(), uint64_t{batch} * sh.q_heads * D, 5, st));
  // Block tables over a shuffled pool (as after hours of serving), slots in order.
  std::vector<int32_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> lens(batch, static_cast<int32_t>(ctx)), slots(batch);
  std::iota(slots.begin(), slots.end(), 0);
  Dev dt(ids.size() * 4), dl(batch * 4), ds(batch * 4);
  CK(cudaMemcpy(dt.p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dl.p, lens.data(), batch * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(ds.p, slots.data(), batch * 4, cudaMemcpyHostToDevice));
  const DecodePlan plan = plan_decode(sh, batch, ctx, lim);
  r.splits = plan.num_splits;
  Dev ws(plan.workspace_bytes);
  DecodeArgs a;
  a.q = q.a();
  a.o = o.a();
  a.seqs = {dl.as<int32_t>(), dt.as<int32_t>(), bps, ds.as<int32_t>(), nullptr};
  a.workspace = ws.a();
  const uint64_t kv_bytes = uint64_t{batch} * ctx * row * 2 * 2;
  r.bytes = double(kv_bytes + 2ull * batch * sh.q_heads * D * 2);
  const int reps = static_cast<int>(std::clamp<uint64_t>((8ull << 30) / kv_bytes, 5, 200));
  a.cache = {pk.a(), pv.a(), static_cast<int64_t>(block_elems), page, KvAddressing::kPaged};
  r.paged_s = time_calls(st, reps, 7, [&] { CK(paged_decode(sh, plan, a, st)); });
  a.cache = {ck.a(), cv.a(), static_cast<int64_t>(uint64_t{ctx} * row), 0,
             KvAddressing::kContiguous};
  r.contig_s = time_calls(st, reps, 7, [&] { CK(paged_decode(sh, plan, a, st)); });
  a.cache = {pk.a(), pv.a(), static_cast<int64_t>(block_elems), page, KvAddressing::kPaged};
  r.sweep = sweep_splits(sh, a, lim, batch, ctx, reps, st, sweep);
  for (const uint32_t w : windows) {  // sliding windows: plans and reps at the window's bytes
    if (w == 0 || w >= ctx) continue;
    const int wreps = static_cast<int>(
        std::clamp<uint64_t>((8ull << 30) / (uint64_t{batch} * w * row * 4), 5, 400));
    DecodeRow::Window x{w};
    const DecodePlan wplan = plan_decode(sh, batch, ctx, lim, 0, 0, w);
    x.splits = wplan.num_splits;
    Dev ws2(wplan.workspace_bytes);
    DecodeArgs b = a;  // a's cache is the paged one
    b.workspace = ws2.a();
    b.window = w;
    x.window_s = time_calls(st, wreps, 7, [&] { CK(paged_decode(sh, wplan, b, st)); });
    const DecodePlan splan = plan_decode(sh, batch, w, lim);
    Dev ws3(splan.workspace_bytes), dls(batch * 4);
    const std::vector<int32_t> short_lens(batch, static_cast<int32_t>(w));
    CK(cudaMemcpy(dls.p, short_lens.data(), batch * 4, cudaMemcpyHostToDevice));
    b.workspace = ws3.a();
    b.window = 0;
    b.seqs.kv_lens = dls.as<int32_t>();
    x.short_s = time_calls(st, wreps, 7, [&] { CK(paged_decode(sh, splan, b, st)); });
    r.windows.push_back(x);
  }
  Dev sink(4096 * 4);
  CK(cudaMemset(sink.p, 0, 4096 * 4));
  r.ceiling_s = time_calls(st, reps, 7, [&] {
    CK(read_bandwidth(ck.a(), kv_bytes / 2, sink.as<uint32_t>(), st));
    CK(read_bandwidth(cv.a(), kv_bytes / 2, sink.as<uint32_t>(), st));
  });
  if (fp8 != KvCacheDtype::kAuto) {
    AttentionShape sh8 = sh;
    sh8.kv_cache = fp8;
    r.fp8 = bench_decode_fp8(sh8, lim, a, pk.a(), pv.a(), ck.a(), cv.a(), blocks, page, batch, ctx,
                             st, sweep);
  }
  return r;
}

struct PrefillRow {
  uint32_t len = 0;
  double flops = 0, paged_s = 0, sdpa_s = 0, fp8_s = 0;
  std::string sdpa_backend;
  std::vector<std::pair<uint32_t, double>> windows;  // (sliding window, paged seconds)
};

PrefillRow bench_prefill(const AttentionShape& sh, uint32_t len, uint32_t page, cudaStream_t st,
                         KvCacheDtype fp8, const std::vector<uint32_t>& windows) {
  PrefillRow r;
  r.len = len;
  const uint64_t row = sh.row_elems(), D = sh.head_dim;
  const uint32_t blocks = (len + page - 1) / page;
  Dev pk(uint64_t{blocks} * page * row * 2), pv(uint64_t{blocks} * page * row * 2);
  Dev q(uint64_t{len} * sh.q_heads * D * 2), o(uint64_t{len} * sh.q_heads * D * 2);
  CK(random_half(sh.dtype, pk.a(), uint64_t{blocks} * page * row, 11, st));
  CK(random_half(sh.dtype, pv.a(), uint64_t{blocks} * page * row, 12, st));
  CK(random_half(sh.dtype, q.a(), uint64_t{len} * sh.q_heads * D, 13, st));
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  const std::vector<int32_t> lens = {static_cast<int32_t>(len)}, indptr = {0, lens[0]};
  const PrefillPlan plan = plan_prefill(sh, lens, lens);
  Dev dt(blocks * 4), dl(4), di(8), dw(plan.work.size() * 4);
  CK(cudaMemcpy(dt.p, table.data(), blocks * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dl.p, lens.data(), 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(di.p, indptr.data(), 8, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw.p, plan.work.data(), plan.work.size() * 4, cudaMemcpyHostToDevice));
  PrefillArgs a;
  a.q = q.a();
  a.o = o.a();
  a.qo_indptr = di.as<int32_t>();
  a.cache = {pk.a(), pv.a(), static_cast<int64_t>(uint64_t{page} * row), page,
             KvAddressing::kPaged};
  a.seqs = {dl.as<int32_t>(), dt.as<int32_t>(), blocks, nullptr, nullptr};
  a.work = dw.as<int32_t>();
  a.num_tiles = plan.num_tiles;
  // Causal: each query row attends its position + 1 keys; two matmuls of 2 FLOP per MAC.
  r.flops = 4.0 * sh.q_heads * D * (double(len) * (len + 1) / 2);
  r.paged_s = time_calls(st, 10, 7, [&] { CK(paged_prefill(sh, a, st)); });
  for (const uint32_t w : windows) {
    if (w == 0 || w >= len) continue;
    PrefillArgs b = a;
    b.window = w;
    r.windows.emplace_back(w, time_calls(st, 10, 7, [&] { CK(paged_prefill(sh, b, st)); }));
  }
  if (fp8 != KvCacheDtype::kAuto) {
    AttentionShape sh8 = sh;
    sh8.kv_cache = fp8;
    Dev qk(uint64_t{blocks} * page * row), qv(uint64_t{blocks} * page * row);
    quantize_rows(sh8, pk.a(), pv.a(), qk.a(), qv.a(), uint64_t{blocks} * page, page,
                  static_cast<int64_t>(uint64_t{page} * row), st);
    a.cache.k = qk.a();
    a.cache.v = qv.a();
    r.fp8_s = time_calls(st, 10, 7, [&] { CK(paged_prefill(sh8, a, st)); });
  }
  return r;
}

// A short prefill chunk over a long cached prefix (issue 33's split-KV rows): the chunk's
// attention split as the planner decides and unsplit, and a batch-1 decode step over the same KV
// (context = prefix + chunk).
struct ChunkRow {
  uint32_t q = 0, prefix = 0, items = 0, kv_chunk = 0;
  double split_s = 0, unsplit_s = 0, decode_s = 0;
  std::vector<std::pair<uint32_t, double>> sweep;  // --sweep-chunks: forced chunk counts, time
};

ChunkRow bench_chunk(const AttentionShape& sh, uint32_t q_len, uint32_t prefix, uint32_t page,
                     const DeviceLimits& lim, cudaStream_t st, const std::vector<uint32_t>& sweep) {
  ChunkRow r;
  r.q = q_len;
  r.prefix = prefix;
  const uint64_t row = sh.row_elems(), D = sh.head_dim;
  const uint32_t ctx = prefix + q_len, blocks = (ctx + page - 1) / page;
  Dev pk(uint64_t{blocks} * page * row * 2), pv(uint64_t{blocks} * page * row * 2);
  Dev q(uint64_t{q_len} * sh.q_heads * D * 2), o(uint64_t{q_len} * sh.q_heads * D * 2);
  CK(random_half(sh.dtype, pk.a(), uint64_t{blocks} * page * row, 21, st));
  CK(random_half(sh.dtype, pv.a(), uint64_t{blocks} * page * row, 22, st));
  CK(random_half(sh.dtype, q.a(), uint64_t{q_len} * sh.q_heads * D, 23, st));
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  const std::vector<int32_t> ql = {static_cast<int32_t>(q_len)}, kl = {static_cast<int32_t>(ctx)},
                             indptr = {0, ql[0]};
  Dev dt(blocks * 4), dl(4), di(8);
  CK(cudaMemcpy(dt.p, table.data(), blocks * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dl.p, kl.data(), 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(di.p, indptr.data(), 8, cudaMemcpyHostToDevice));
  PrefillArgs a;
  a.q = q.a();
  a.o = o.a();
  a.qo_indptr = di.as<int32_t>();
  a.cache = {pk.a(), pv.a(), static_cast<int64_t>(uint64_t{page} * row), page,
             KvAddressing::kPaged};
  a.seqs = {dl.as<int32_t>(), dt.as<int32_t>(), blocks, nullptr, nullptr};
  auto time_plan = [&](const PrefillPlan& plan) {
    Dev dw(plan.work.size() * 4), ws(plan.workspace_bytes);
    CK(cudaMemcpy(dw.p, plan.work.data(), plan.work.size() * 4, cudaMemcpyHostToDevice));
    PrefillArgs b = a;
    b.work = dw.as<int32_t>();
    b.num_tiles = plan.num_tiles;
    b.split = plan.split;
    b.workspace = ws.a();
    return time_calls(st, 20, 7, [&] { CK(paged_prefill(sh, b, st)); });
  };
  const PrefillPlan split = plan_prefill(sh, ql, kl, &lim);
  r.items = split.num_tiles;
  r.kv_chunk = split.split.kv_chunk;
  r.split_s = time_plan(split);
  r.unsplit_s = time_plan(plan_prefill(sh, ql, kl));
  for (const uint32_t f : sweep)
    r.sweep.emplace_back(f, time_plan(plan_prefill(sh, ql, kl, &lim, f)));
  // The decode step: one query token of the same sequence, the bench's decode plan.
  const DecodePlan dp = plan_decode(sh, 1, ctx, lim);
  Dev ws(dp.workspace_bytes);
  DecodeArgs d;
  d.q = q.a();
  d.o = o.a();
  d.cache = a.cache;
  d.seqs = a.seqs;
  d.workspace = ws.a();
  r.decode_s = time_calls(st, 20, 7, [&] { CK(paged_decode(sh, dp, d, st)); });
  return r;
}

// The --chunks rows (TOKENSxPREFIX; "none" skips); false on a malformed one.
bool bench_chunks(const AttentionShape& sh, const std::vector<std::string>& chunks, uint32_t page,
                  const DeviceLimits& lim, cudaStream_t st, const std::vector<uint32_t>& sweep,
                  std::vector<ChunkRow>* rows) {
  for (const std::string& c : chunks) {
    uint32_t tq = 0, tp = 0;
    if (c == "none") continue;
    if (std::sscanf(c.c_str(), "%ux%u", &tq, &tp) != 2 || tq == 0) {
      std::fprintf(stderr, "memsim-attn-bench: --chunks %s: expected TOKENSxPREFIX\n", c.c_str());
      return false;
    }
    rows->push_back(bench_chunk(sh, tq, tp, page, lim, st, sweep));
  }
  return true;
}

void print_chunks(const std::vector<ChunkRow>& rows, std::ofstream& out) {
  if (rows.empty()) return;
  std::printf(
      "short chunks over long prefixes (us): split-KV prefill as planned, unsplit, a batch-1 "
      "decode step over the same KV (goal: split <= 2x decode)\n");
  std::printf("%-14s %6s %9s %10s %10s %10s %12s\n", "chunk x prefix", "items", "kv chunk", "split",
              "unsplit", "decode", "split/decode");
  for (const ChunkRow& r : rows) {
    std::printf("%5u x %-6u %6u %9u %10.1f %10.1f %10.1f %11.2fx %s\n", r.q, r.prefix, r.items,
                r.kv_chunk, r.split_s * 1e6, r.unsplit_s * 1e6, r.decode_s * 1e6,
                r.split_s / r.decode_s, r.split_s <= 2 * r.decode_s ? "ok" : "over");
    if (!r.sweep.empty()) {
      std::printf("  forced chunk counts (us):");
      for (const auto& [chunks, secs] : r.sweep) std::printf(" %u:%.1f", chunks, secs * 1e6);
      std::printf("\n");
    }
    if (out)
      out << fmt::format("chunk,{},{},{},{},{},{},{},0,\n", r.q, r.prefix, r.items, r.kv_chunk,
                         r.split_s, r.unsplit_s, r.decode_s);
  }
}

// Runs the SDPA side (tools/attn_sdpa.py) for the same shapes; lines "decode B L s backend" and
// "prefill L s backend". Returns an explanation when it could not run.
std::string run_sdpa(const std::string& script, const AttentionShape& sh,
                     std::vector<DecodeRow>& dec, std::vector<PrefillRow>& pre) {
  std::vector<std::string> argv = {"python3",    script,
                                   "--q-heads",  std::to_string(sh.q_heads),
                                   "--kv-heads", std::to_string(sh.kv_heads),
                                   "--head-dim", std::to_string(sh.head_dim),
                                   "--dtype",    to_string(sh.dtype)};
  for (const DecodeRow& r : dec)
    argv.insert(argv.end(), {"--decode", fmt::format("{}x{}", r.batch, r.ctx)});
  for (const PrefillRow& r : pre) argv.insert(argv.end(), {"--prefill", std::to_string(r.len)});
  std::string cmd;  // for messages only: the script is started with the vector, no shell
  for (const std::string& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  // Its stdout goes to a private temporary file (its stderr to ours), then is parsed.
  char path[] = "/tmp/memsim-attn-sdpa-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return fmt::format("cannot create a temporary file: {}", std::strerror(errno));
  close(fd);
  std::string why;
  const int rc = memsim::run_process(argv, {path, "", ""}, &why);
  std::ifstream file(path);
  const std::string out((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  unlink(path);
  if (rc < 0) return fmt::format("could not start python3: {}", why);
  std::istringstream in(out);
  std::string kind;
  int parsed = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    ls >> kind;
    if (kind == "decode") {
      uint32_t b, l;
      double s;
      std::string be;
      if (!(ls >> b >> l >> s >> be)) continue;
      for (DecodeRow& r : dec)
        if (r.batch == b && r.ctx == l) r.sdpa_s = s, r.sdpa_backend = be, ++parsed;
    } else if (kind == "prefill") {
      uint32_t l;
      double s;
      std::string be;
      if (!(ls >> l >> s >> be)) continue;
      for (PrefillRow& r : pre)
        if (r.len == l) r.sdpa_s = s, r.sdpa_backend = be, ++parsed;
    }
  }
  if (rc != 0 || parsed == 0)
    return fmt::format("`{}` failed (exit {}; its errors are above):\n{}", cmd, rc, out);
  return {};
}

std::string pct(double x) {
  return x > 0 ? fmt::format("{:.1f}%", 100 * x) : "-";
}

void print_prefill(const std::vector<PrefillRow>& pre, KvCacheDtype fp8, std::ofstream& out,
                   const char* kernel) {
  for (const PrefillRow& r : pre) {
    std::printf(
        "prefill %u x %u causal (%s): paged %.1f TFLOP/s, SDPA %.1f TFLOP/s (%s), paged/SDPA "
        "%s\n",
        r.len, r.len, kernel, r.flops / r.paged_s / 1e12,
        r.sdpa_s > 0 ? r.flops / r.sdpa_s / 1e12 : 0.0, r.sdpa_backend.c_str(),
        pct(r.sdpa_s > 0 ? r.sdpa_s / r.paged_s : 0).c_str());
    if (out)
      out << fmt::format("prefill,1,{},1,{},{},0,{},0,{}\n", r.len, r.flops, r.paged_s, r.sdpa_s,
                         r.sdpa_backend);
    if (r.fp8_s > 0) {
      std::printf("prefill %u x %u causal, %s KV cache: paged %.1f TFLOP/s (%.2fx bf16's time)\n",
                  r.len, r.len, to_string(fp8), r.flops / r.fp8_s / 1e12, r.fp8_s / r.paged_s);
      if (out)
        out << fmt::format("prefill_{},1,{},1,{},{},0,0,0,\n", to_string(fp8), r.len, r.flops,
                           r.fp8_s);
    }
  }
}

// --kv-fp8: which fp8 format's rows to add (kAuto: none).
KvCacheDtype kv_fp8_rows(const std::string& name) {
  if (name == "fp8_e4m3") return KvCacheDtype::kFp8E4m3;
  return name == "fp8_e5m2" ? KvCacheDtype::kFp8E5m2 : KvCacheDtype::kAuto;
}

// The fp8 decode rows: times, GB/s over the fp8 bytes, the ratio of bf16's time to fp8's.
void print_fp8_decode(const std::vector<DecodeRow>& dec, KvCacheDtype fp8, std::ofstream& out) {
  if (fp8 != KvCacheDtype::kAuto) {
    const auto copies = [](bool tma) { return tma ? "TMA" : "cp.async"; };
    const Fp8Figures* first = dec.empty() ? nullptr : &dec.front().fp8;
    std::printf(
        "%s KV cache decode (k/v scales 1, the fp8 shape's plan; tiles copied by %s paged, %s "
        "contiguous): tokens/s = batch / time; GB/s over Q, fp8 K/V and O\n",
        to_string(fp8), copies(first && first->tma_paged), copies(first && first->tma_contig));
    std::printf("%-12s %6s %10s %10s %10s %10s %9s %9s %12s %12s\n", "batch x ctx", "splits",
                "paged us", "bf16 us", "fp8 GB/s", "ceiling", "p/ceil", "p vs c", "fp8/bf16 p",
                "fp8/bf16 c");
  }
  for (const DecodeRow& r : dec) {
    const Fp8Figures& f = r.fp8;
    if (f.paged_s <= 0) continue;
    std::printf("%5ux%-6u %6u %10.1f %10.1f %10.0f %10.0f %9s %+8.1f%% %11.2fx %11.2fx\n", r.batch,
                r.ctx, f.splits, f.paged_s * 1e6, r.paged_s * 1e6, f.bytes / f.paged_s / 1e9,
                f.bytes / f.ceiling_s / 1e9, pct(f.ceiling_s / f.paged_s).c_str(),
                100 * (f.paged_s / f.contig_s - 1), r.paged_s / f.paged_s, r.contig_s / f.contig_s);
    if (out)
      out << fmt::format("decode_{},{},{},{},{},{},{},0,{},\n", to_string(fp8), r.batch, r.ctx,
                         f.splits, f.bytes, f.paged_s, f.contig_s, f.ceiling_s);
  }
  for (const DecodeRow& r : dec) {
    if (r.fp8.sweep.empty()) continue;
    std::printf("fp8 splits sweep %ux%u (paged us):", r.batch, r.ctx);
    for (const auto& [splits, secs] : r.fp8.sweep) std::printf(" %u:%.1f", splits, secs * 1e6);
    std::printf("\n");
  }
}

// The decode rows of the shape's dtype: GB/s of paged, contiguous, SDPA and the ceiling.
void print_decode(const std::vector<DecodeRow>& dec, std::ofstream& out) {
  std::printf("%-12s %6s %10s %10s %10s %10s %9s %9s %9s  %s\n", "batch x ctx", "splits", "paged",
              "contig", "SDPA", "ceiling", "p/SDPA", "p/ceil", "p vs c", "SDPA backend");
  for (const DecodeRow& r : dec) {
    auto gbs = [&](double s) { return s > 0 ? r.bytes / s / 1e9 : 0.0; };
    std::printf("%5ux%-6u %6u %10.0f %10.0f %10.0f %10.0f %9s %9s %+8.1f%%  %s\n", r.batch, r.ctx,
                r.splits, gbs(r.paged_s), gbs(r.contig_s), gbs(r.sdpa_s), gbs(r.ceiling_s),
                pct(r.sdpa_s > 0 ? r.sdpa_s / r.paged_s : 0).c_str(),
                pct(r.ceiling_s / r.paged_s).c_str(), 100 * (r.paged_s / r.contig_s - 1),
                r.sdpa_backend.c_str());
    if (out)
      out << fmt::format("decode,{},{},{},{},{},{},{},{},{}\n", r.batch, r.ctx, r.splits, r.bytes,
                         r.paged_s, r.contig_s, r.sdpa_s, r.ceiling_s, r.sdpa_backend);
  }
}

// The sliding-window rows: tokens/s = batch (prefill: chunk tokens) / time; "vs full" = the full
// attention time at the same context over the window's; "vs ctx=W" = the window's time over
// full attention at a context of the window's length (1.00: the window costs what a W decode does).
void print_windows(const std::vector<DecodeRow>& dec, const std::vector<PrefillRow>& pre,
                   std::ofstream& out) {
  bool any = false;
  for (const DecodeRow& r : dec) any = any || !r.windows.empty();
  for (const PrefillRow& r : pre) any = any || !r.windows.empty();
  if (!any) return;
  std::printf("sliding window (paged): tokens/s = batch / time (prefill: chunk tokens / time)\n");
  std::printf("%-12s %7s %6s %10s %12s %12s %9s %9s\n", "batch x ctx", "window", "splits",
              "window us", "tokens/s", "full tok/s", "vs full", "vs ctx=W");
  for (const DecodeRow& r : dec)
    for (const DecodeRow::Window& w : r.windows) {
      std::printf("%5ux%-6u %7u %6u %10.1f %12.0f %12.0f %8.2fx %8.2fx\n", r.batch, r.ctx, w.window,
                  w.splits, w.window_s * 1e6, r.batch / w.window_s, r.batch / r.paged_s,
                  r.paged_s / w.window_s, w.window_s / w.short_s);
      if (out)
        out << fmt::format("decode_window{},{},{},{},0,{},0,0,{},\n", w.window, r.batch, r.ctx,
                           w.splits, w.window_s, w.short_s);
    }
  for (const PrefillRow& r : pre)
    for (const auto& [window, secs] : r.windows) {
      std::printf("prefill %-4u %7u %6s %10.1f %12.0f %12.0f %8.2fx %9s\n", r.len, window, "-",
                  secs * 1e6, r.len / secs, r.len / r.paged_s, r.paged_s / secs, "-");
      if (out) out << fmt::format("prefill_window{},1,{},1,0,{},0,0,0,\n", window, r.len, secs);
    }
}

int run(int argc, char** argv) {
  CLI::App app{
      "memsim-attn-bench: paged decode/prefill attention vs PyTorch SDPA and the "
      "read-bandwidth ceiling"};
  uint32_t q_heads = 32, kv_heads = 8, head_dim = 128, page = 16, prefill_len = 4096;
  std::string dtype = "bf16", sdpa = "tools/attn_sdpa.py", csv, kv_fp8 = "fp8_e4m3";
  std::vector<uint32_t> sweep, chunk_sweep, windows = {1024, 4096};
  std::vector<std::string> shapes = {"1x32768", "32x4096", "64x8192", "256x1024", "256x4096"};
  std::vector<std::string> chunks = {"16x16384", "64x16384", "16x32768", "64x32768"};
  app.add_option("--q-heads", q_heads, "query heads (default Llama-3.1-8B: 32)");
  app.add_option("--kv-heads", kv_heads, "KV heads (8)");
  app.add_option("--head-dim", head_dim, "head dim (128)");
  app.add_option("--dtype", dtype, "bf16 or fp16")->check(CLI::IsMember({"bf16", "fp16"}));
  app.add_option("--page", page, "tokens per block (16)");
  app.add_option("--decode", shapes, "decode shapes BATCHxCONTEXT")->delimiter(',');
  app.add_option("--prefill", prefill_len, "causal prefill length (4096; 0 = skip)");
  app.add_option("--chunks", chunks,
                 "short prefill chunks over cached prefixes TOKENSxPREFIX (split-KV rows; none)")
      ->delimiter(',');
  app.add_option("--sdpa", sdpa, "SDPA script (tools/attn_sdpa.py); 'none' skips it");
  app.add_option("--csv", csv, "also write the figures to this CSV file");
  app.add_option("--kv-fp8", kv_fp8,
                 "fp8 KV cache rows: fp8_e4m3 (vLLM's fp8, the default), fp8_e5m2, or none")
      ->check(CLI::IsMember({"fp8_e4m3", "fp8_e5m2", "none"}));
  app.add_option("--sweep-splits", sweep, "also time paged decode at these split counts")
      ->delimiter(',');
  app.add_option("--sweep-chunks", chunk_sweep,
                 "also time the --chunks rows' split prefill forced into these chunk counts")
      ->delimiter(',');
  app.add_option("--windows", windows,
                 "sliding-window rows: these windows on every shape longer than them "
                 "(1024,4096; 0 = none)")
      ->delimiter(',');
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : memsim::bench::kExitBadInput;
  }

  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "memsim-attn-bench: no CUDA device: skipped\n");
    return 77;
  }
  const AttentionShape sh{q_heads, kv_heads, head_dim,
                          dtype == "fp16" ? KvDtype::kFp16 : KvDtype::kBf16};
  if (const std::string why = check_shape(sh); !why.empty()) {
    std::fprintf(stderr, "memsim-attn-bench: %s\n", why.c_str());
    return 2;
  }
  DeviceLimits lim;
  CK(query_device(&lim));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::mt19937 rng(42);
  const KvCacheDtype fp8 = kv_fp8_rows(kv_fp8);
  std::vector<DecodeRow> dec;
  for (const std::string& s : shapes) {
    uint32_t b = 0, l = 0;
    if (std::sscanf(s.c_str(), "%ux%u", &b, &l) != 2 || b == 0 || l == 0) {
      std::fprintf(stderr, "memsim-attn-bench: --decode %s: expected BATCHxCONTEXT\n", s.c_str());
      return 2;
    }
    dec.push_back(bench_decode(sh, b, l, page, lim, st, rng, sweep, fp8, windows));
  }
  std::vector<PrefillRow> pre;
  if (prefill_len > 0) pre.push_back(bench_prefill(sh, prefill_len, page, st, fp8, windows));
  std::vector<ChunkRow> chunk_rows;
  if (!bench_chunks(sh, chunks, page, lim, st, chunk_sweep, &chunk_rows)) return 2;
  const std::string sdpa_err =
      sdpa == "none" ? "skipped (--sdpa none)" : run_sdpa(sdpa, sh, dec, pre);

  std::printf(
      "memsim-attn-bench on %s (%u SMs, %u decode CTAs/SM): q_heads %u, kv_heads %u, "
      "head_dim %u, %s, page %u\n",
      prop.name, lim.num_sms, lim.decode_ctas_per_sm, q_heads, kv_heads, head_dim, dtype.c_str(),
      page);
  std::printf(
      "decode: GB/s = bytes of Q, K, V and O / time; ceiling = read-only kernel over the "
      "same K/V bytes\n");
  std::ofstream out;
  if (!csv.empty()) {
    out.open(csv);
    out << "kind,batch,ctx,splits,bytes_or_flops,paged_s,contig_s,sdpa_s,ceiling_s,sdpa_backend\n";
  }
  print_decode(dec, out);
  print_fp8_decode(dec, fp8, out);
  print_windows(dec, pre, out);
  for (const DecodeRow& r : dec) {
    if (r.sweep.empty()) continue;
    std::printf("splits sweep %ux%u (paged GB/s):", r.batch, r.ctx);
    for (const auto& [splits, secs] : r.sweep)
      std::printf(" %u:%.0f", splits, r.bytes / secs / 1e9);
    std::printf("\n");
  }
  print_prefill(pre, fp8, out, prefill_sm90_eligible(sh, false) ? "sm90 wgmma" : "mma.sync");
  print_chunks(chunk_rows, out);
  std::printf(
      "goals (issue 33): decode paged >= 95%% of SDPA and >= 85%% of the ceiling, paged at most "
      "3%% slower than contiguous; prefill >= 75%% of SDPA; split chunks <= 2x decode; fp8 "
      "decode >= 1.8x bf16's tokens/s at long context\n");
  if (!sdpa_err.empty()) std::printf("SDPA: %s\n", sdpa_err.c_str());
  cudaStreamDestroy(st);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return memsim::bench::guarded_main("memsim-attn-bench", "", argc, argv,
                                     [&] { return run(argc, argv); });
}
