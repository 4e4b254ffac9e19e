// Block copies, swaps and synthetic rows on a real GPU: copy_blocks over every region (and
// per-region bases), swap round trips through pinned memory, synth_rows against the host's
// synth_value, and the launchers' argument checks (decode and prefill: block strides). Exits 77
// (skipped) without a CUDA device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
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

TEST_CASE("copy_blocks copies blocks of every region; swap round-trips through pinned memory") {
  std::mt19937 rng(13);
  const uint64_t block = 4096, regions = 6, blocks = 10;
  const uint64_t region_stride = blocks * block + 256;
  std::vector<uint8_t> data(regions * region_stride);
  for (auto& x : data) x = static_cast<uint8_t>(rng());
  DevBuf<uint8_t> pool(data);
  const std::vector<int64_t> pairs = {2, 7, 0, 9, 5, 1};
  DevBuf<int64_t> dp(pairs);
  BlockCopyArgs a;
  a.src = a.dst = pool.addr();
  a.src_region_stride = a.dst_region_stride = region_stride;
  a.src_block_stride = a.dst_block_stride = block;
  a.block_bytes = block;
  a.regions = regions;
  a.pairs = dp.p;
  a.num_pairs = 3;
  CUDA_OK(copy_blocks(a, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> want = data;
  for (uint64_t r = 0; r < regions; ++r)
    for (size_t p = 0; p < 3; ++p)
      std::copy_n(data.begin() + r * region_stride + pairs[2 * p] * block, block,
                  want.begin() + r * region_stride + pairs[2 * p + 1] * block);
  CHECK(pool.download() == want);

  // Swap out blocks 7 and 9 to host slots 0 and 1, scribble over them, swap back in.
  uint8_t* host = nullptr;
  CUDA_OK(
      cudaHostAlloc(reinterpret_cast<void**>(&host), regions * 2 * block, cudaHostAllocDefault));
  DevBuf<int64_t> out_pairs(std::vector<int64_t>{7, 0, 9, 1}),
      in_pairs(std::vector<int64_t>{0, 7, 1, 9});
  BlockCopyArgs out = a;
  out.dst = reinterpret_cast<uint64_t>(host);
  out.dst_region_stride = 2 * block;
  out.pairs = out_pairs.p;
  out.num_pairs = 2;
  CUDA_OK(copy_blocks(out, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  for (uint64_t r = 0; r < regions; ++r)
    CUDA_OK(cudaMemset(pool.p + r * region_stride + 7 * block, 0, 3 * block));
  BlockCopyArgs in = a;
  in.src = reinterpret_cast<uint64_t>(host);
  in.src_region_stride = 2 * block;
  in.pairs = in_pairs.p;
  in.num_pairs = 2;
  CUDA_OK(copy_blocks(in, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> got = pool.download();
  for (uint64_t r = 0; r < regions; ++r) {
    const uint64_t base = r * region_stride;
    CHECK(std::equal(got.begin() + base + 7 * block, got.begin() + base + 8 * block,
                     want.begin() + base + 7 * block));
    CHECK(std::equal(got.begin() + base + 9 * block, got.begin() + base + 10 * block,
                     want.begin() + base + 9 * block));
    CHECK(std::all_of(got.begin() + base + 8 * block, got.begin() + base + 9 * block,
                      [](uint8_t x) { return x == 0; }));  // block 8 was not swapped back
  }
  cudaFreeHost(host);
}

TEST_CASE("synth_rows gives the host's synth_value bits, bf16 and fp16") {
  const std::vector<uint32_t> a = {0, 1, 77, 0xffffffffu, 5}, b = {0, 0, 9, 123456, 5};
  const uint32_t elems = 1024;
  DevBuf<uint32_t> da(a), db(b);
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16}) {
    DevBuf<uint16_t> out(a.size() * elems);
    CUDA_OK(synth_rows(dt, out.addr(), static_cast<uint32_t>(a.size()), elems, da.p, db.p,
                       synth_salt_v(7), nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint16_t> got = out.download();
    for (size_t r = 0; r < a.size(); ++r)
      for (uint32_t e = 0; e < elems; ++e)
        REQUIRE(got[r * elems + e] == to_half(dt, synth_value(a[r], b[r], synth_salt_v(7), e)));
  }
}

TEST_CASE("copy_blocks takes per-region base addresses (unevenly spaced regions)") {
  const uint64_t block = 512;
  std::vector<uint8_t> data(1 << 16);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 3);
  DevBuf<uint8_t> src(data), dst(std::vector<uint8_t>(1 << 16, 0));
  const std::vector<uint64_t> src_regions = {src.addr() + 4096, src.addr(), src.addr() + 40960};
  const std::vector<uint64_t> dst_regions = {dst.addr() + 1024, dst.addr() + 20480,
                                             dst.addr() + 8192};
  DevBuf<uint64_t> sr(src_regions), dr(dst_regions);
  DevBuf<int64_t> pairs(std::vector<int64_t>{3, 0, 1, 5});
  BlockCopyArgs c;
  c.src_regions = sr.p;
  c.dst_regions = dr.p;
  c.src_block_stride = c.dst_block_stride = block;
  c.block_bytes = block;
  c.regions = 3;
  c.pairs = pairs.p;
  c.num_pairs = 2;
  CUDA_OK(copy_blocks(c, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> want(1 << 16, 0);
  for (size_t r = 0; r < 3; ++r)
    for (auto [from, to] : {std::pair<uint64_t, uint64_t>{3, 0}, {1, 5}})
      std::copy_n(data.begin() + (src_regions[r] - src.addr()) + from * block, block,
                  want.begin() + (dst_regions[r] - dst.addr()) + to * block);
  CHECK(dst.download() == want);
}

TEST_CASE("launchers reject bad arguments without launching") {
  const AttentionShape bad{12, 5, 128, KvDtype::kBf16};
  DecodePlan plan;
  plan.max_batch = 1;
  CHECK(paged_decode(bad, plan, DecodeArgs{}, nullptr) == cudaErrorInvalidValue);
  const AttentionShape ok_shape{8, 8, 96, KvDtype::kBf16};  // head_dim 96 unsupported
  CHECK(paged_decode(ok_shape, plan, DecodeArgs{}, nullptr) == cudaErrorInvalidValue);
  DecodePlan listed;  // a work-list launch without its list (tables otherwise in place)
  listed.max_batch = 1;
  listed.work_capacity = 4;
  DevBuf<int32_t> table(std::vector<int32_t>{0});
  DecodeArgs no_list;
  no_list.cache.block_size = 16;
  no_list.seqs.block_tables = table.p;
  CHECK(paged_decode({8, 8, 128, KvDtype::kBf16}, listed, no_list, nullptr) ==
        cudaErrorInvalidValue);
  BlockCopyArgs c;
  c.num_pairs = 1;
  c.block_bytes = 24;  // not a multiple of 16
  int64_t* pairs = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&pairs), 16));
  c.pairs = pairs;
  CHECK(copy_blocks(c, nullptr) == cudaErrorInvalidValue);
  cudaFree(pairs);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("decode and prefill reject paged block strides of 2^32 elements or more") {
  // The kernels keep a token's offset within its block in 32 bits; a larger stride is refused
  // before any launch rather than addressed wrongly.
  const AttentionShape sh{8, 8, 128, KvDtype::kBf16};
  DevBuf<int32_t> table(std::vector<int32_t>{0}), lens(std::vector<int32_t>{1}),
      indptr(std::vector<int32_t>{0, 1});
  DevBuf<uint16_t> cache(std::vector<uint16_t>(16 * 1024, 0));
  DecodePlan plan;
  plan.max_batch = 1;
  plan.num_splits = 1;
  DecodeArgs d;
  d.seqs.block_tables = table.p;
  d.seqs.kv_lens = lens.p;
  PrefillArgs p;
  p.qo_indptr = indptr.p;
  p.seqs = {lens.p, table.p, 1, nullptr, nullptr};
  p.work = table.p;
  p.num_tiles = 1;
  for (const int64_t stride : {int64_t{1} << 32, (int64_t{1} << 32) + 1024, int64_t{0}}) {
    d.cache = {cache.addr(), cache.addr(), stride, 16, KvAddressing::kPaged};
    p.cache = d.cache;
    CHECK(paged_decode(sh, plan, d, nullptr) == cudaErrorInvalidValue);
    CHECK(paged_prefill(sh, p, nullptr) == cudaErrorInvalidValue);
  }
  CHECK(cudaGetLastError() == cudaSuccess);
}

}  // namespace
}  // namespace memsim::kernels

int main(int argc, char** argv) {
  if (const int skip = memsim::kernels::skip_without_gpu()) return skip;
  return Catch::Session().run(argc, argv);
}
