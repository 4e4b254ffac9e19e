// Unified memory on the sim backend (configs/gpus/orin.yaml): cudaMalloc over-commits, pages
// become physical on first touch, and the seed's Orin figures (orinmllm-paged-attention.md 16.1,
// 16.3, 16.6) follow from it.
#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <cstdlib>

#include "backends/sim/sim_backend.h"
#include "src/config/loaders.h"

using namespace memsim;

namespace {

constexpr uint64_t kKiB = 1ull << 10, kMiB = 1ull << 20, kGiB = 1ull << 30;

std::string root() {
  const char* r = std::getenv("MEMSIM_SOURCE_ROOT");
  return r != nullptr ? r : ".";
}

GpuSpec orin() {
  return load_gpu_spec(ConfigNode::load_file(root() + "/configs/gpus/orin.yaml"));
}

// One paged K or V pool of the seed's engine (paged_kv_cache.cpp): layers x ceil(8192 / 16)
// blocks of 16 tokens x kv_dim fp16 values.
uint64_t pool_bytes(uint64_t layers, uint64_t kv_dim) {
  return layers * (8192 / 16) * 16 * kv_dim * 2;
}

}  // namespace

TEST_CASE("orin.yaml: a unified-memory GPU of 64 GiB with 1 GiB for the OS", "[unified]") {
  const GpuSpec g = orin();
  CHECK(g.name == "orin");
  CHECK(g.capacity == 64 * kGiB);
  CHECK(g.unified.enabled);
  CHECK(g.unified.first_touch_page == 4 * kKiB);
  CHECK(g.unified.host_reserved == 1 * kGiB);
  CHECK(g.compute.hbm_bytes_per_s == 204e9);
  CHECK(g.compute.sms == 16);
  CHECK(!load_gpu_spec(ConfigNode::load_file(root() + "/configs/gpus/h200.yaml")).unified.enabled);
}

// Seed 16.1 and 16.6, Qwen3-8B FP16 (36 layers, kv_dim 1024): each pool is 18,432 blocks of
// 16 x 1024 x 2 B = 576 MiB; cudaMalloc reserves it, the pool's memset(0) makes it resident, and
// the 72 KiB block table (36 x 512 x 4 B) is resident once uploaded: 1,152 MiB + 72 KiB.
TEST_CASE("seed 16.6: cudaMalloc reserves, memset makes the pools resident", "[unified]") {
  SimClock clock;
  SimBackend b(orin(), clock);
  const StreamId s = *b.create_stream();
  const uint64_t pool = pool_bytes(36, 1024);
  CHECK(pool == 576 * kMiB);
  CHECK(pool / (16 * 1024 * 2) == 18432);
  const DevPtr k = *b.device_malloc(pool, "kv_cache");
  const DevPtr v = *b.device_malloc(pool, "kv_cache");
  // Reserved: address space only.
  CHECK(b.usage().physical_bytes == 0);
  CHECK(b.usage().untouched_bytes == 2 * pool);
  CHECK(b.usage().virtual_mapped == 1152 * kMiB);

  SECTION("the seed's init: memset(0) of both pools") {
    REQUIRE(b.fill(k, pool, 0, s).ok());
    CHECK(b.usage().physical_bytes == 576 * kMiB);
    REQUIRE(b.fill(v, pool, 0, s).ok());
    CHECK(b.usage().physical_bytes == 1152 * kMiB);
    CHECK(b.usage().untouched_bytes == 0);
    // A second memset touches nothing new.
    REQUIRE(b.fill(k, pool, 0, s).ok());
    CHECK(b.usage().physical_bytes == 1152 * kMiB);
    // The GPU block table, 36 layers x 512 entries x 4 B, uploaded from the CPU's copy.
    const uint64_t table = 36 * 512 * 4;
    CHECK(table == 72 * kKiB);
    const DevPtr gpu_table = *b.device_malloc(table, "block_table");
    const DevPtr cpu_table = *b.host_malloc_pinned(table);
    REQUIRE(b.copy(gpu_table, cpu_table, table, s).ok());
    CHECK(b.usage().physical_bytes == 1152 * kMiB + 72 * kKiB);
    CHECK(b.usage().per_tag.at("block_table") == 73728);
    // The 2 MiB the table's cudaMalloc reserved beyond its 18 written pages stay untouched.
    CHECK(b.usage().untouched_bytes == 2 * kMiB - 72 * kKiB);
    std::string why;
    CHECK(b.check_invariants(&why));
    INFO(why);
    REQUIRE(b.device_free(gpu_table).ok());
    REQUIRE(b.host_free_pinned(cpu_table).ok());
  }
  SECTION("the seed's lazy init (16.6): only the blocks of a 50-token conversation are written") {
    // 16.3: ceil(50 / 16) = 4 blocks a layer, 144 blocks; the fresh pool's free list hands out
    // blocks 0..143 (16.4), the pools' first 144 x 32 KiB.
    const uint64_t written = 144 * 16 * 1024 * 2;
    REQUIRE(b.fill(k, written, 0, s).ok());
    REQUIRE(b.fill(v, written, 0, s).ok());
    CHECK(b.usage().physical_bytes == 9 * kMiB);                   // the seed's 9.0 MB
    CHECK(b.usage().physical_bytes * 100000 / (2 * pool) == 781);  // 0.78% of the pools
    CHECK(b.usage().untouched_bytes == 2 * pool - 9 * kMiB);
  }
  REQUIRE(b.device_free(k).ok());
  REQUIRE(b.device_free(v).ok());
  CHECK(b.usage().physical_bytes == 0);
  CHECK(b.usage().untouched_bytes == 0);
  CHECK(b.usage().virtual_mapped == 0);
  std::string why;
  CHECK(b.check_invariants(&why));
  INFO(why);
}

// Seed 16.1, Qwen2.5-7B FP16 (28 layers, kv_dim 512): 224 MiB a pool, 448 MiB + 56 KiB.
TEST_CASE("seed 16.1: Qwen2.5-7B pools are 448 MiB + 56 KiB once written", "[unified]") {
  SimClock clock;
  SimBackend b(orin(), clock);
  const StreamId s = *b.create_stream();
  const uint64_t pool = pool_bytes(28, 512);
  CHECK(pool == 224 * kMiB);
  CHECK(pool / (16 * 512 * 2) == 14336);
  for (int i = 0; i < 2; ++i) REQUIRE(b.fill(*b.device_malloc(pool, "kv_cache"), pool, 0, s).ok());
  const uint64_t table = 28 * 512 * 4;
  const DevPtr t = *b.device_malloc(table, "block_table");
  REQUIRE(b.fill(t, table, 0xFFFFFFFFu, s).ok());  // clear(): every entry -1
  CHECK(b.usage().physical_bytes == 448 * kMiB + 56 * kKiB);
}

// 8.2, 8.4: one DRAM for the CPU and the GPU. cudaMalloc may reserve more than there is; the
// touch that finds the DRAM full fails (an error value), and pinned host memory and the OS's
// share come out of the same 64 GiB.
TEST_CASE("unified memory: over-commit, first touch runs out, the host shares the DRAM",
          "[unified]") {
  SimClock clock;
  SimBackend b(orin(), clock);
  const StreamId s = *b.create_stream();
  const DevPtr a = *b.device_malloc(40 * kGiB, "a");
  const DevPtr c = *b.device_malloc(40 * kGiB, "c");  // 80 GiB reserved on a 64 GiB device
  CHECK(b.usage().untouched_bytes == 80 * kGiB);
  REQUIRE(b.fill(a, 40 * kGiB, 0, s).ok());
  // 40 GiB resident + 1 GiB for the OS: 23 GiB left, the next 40 GiB are 17 GiB short.
  const Status full = b.fill(c, 40 * kGiB, 0, s);
  REQUIRE(!full.ok());
  CHECK(full.error().code == ErrorCode::kOutOfMemory);
  CHECK(full.error().bytes_short == 17 * kGiB);
  CHECK(full.error().message.find("fill (first touch)") == 0);
  CHECK(b.usage().physical_bytes == 40 * kGiB);  // the failed touch took nothing
  // Touching part of it works while the DRAM lasts; pinned host memory takes from the rest.
  REQUIRE(b.fill(c, 20 * kGiB, 0, s).ok());
  CHECK(!b.host_malloc_pinned(4 * kGiB).ok());  // 40 + 20 + 1 + 4 > 64
  const DevPtr h = *b.host_malloc_pinned(3 * kGiB);
  CHECK(b.fill(c + 20 * kGiB, 4 * kKiB, 0, s).error().bytes_short == 4 * kKiB);
  std::string why;
  CHECK(b.check_invariants(&why));
  INFO(why);
  REQUIRE(b.host_free_pinned(h).ok());
  REQUIRE(b.device_free(a).ok());
  REQUIRE(b.device_free(c).ok());
  CHECK(b.usage().physical_bytes == 0);
}

TEST_CASE("gpu file: unified_memory keys are validated", "[unified][config]") {
  const std::string base =
      "name: x\ncapacity: 8GiB\ncontext: 0\ngranularity: 2MiB\nva_space: 1TiB\n"
      "graphs: {capture_per_node_us: 0, instantiate_per_node_us: 0, upload_per_node_us: 0, "
      "mem_map_per_granule_us: 0, mem_remap_per_granule_us: 0}\n"
      "compute: {dense_tflops: 1, hbm_gbps: 1, pcie_gbps: 1}\ncosts:\n";
  std::string costs;
  for (size_t i = 0; i < static_cast<size_t>(Primitive::kCount); ++i)
    costs += fmt::format("  {}: {{per_call_us: 0}}\n", to_string(static_cast<Primitive>(i)));
  auto load = [&](const std::string& um) {
    return load_gpu_spec(ConfigNode::parse(base + costs + um, "gpu.yaml"));
  };
  CHECK(load("unified_memory: {first_touch_page: 64KiB}").unified.first_touch_page == 64 * kKiB);
  CHECK_THROWS_WITH(load("unified_memory: {first_touch_page: 3KiB}"),
                    Catch::Contains("first_touch_page") &&
                        Catch::Contains("must be a power of two of at most the granularity"));
  CHECK_THROWS_WITH(
      load("unified_memory: {first_touch_page: 4KiB, host_reserved: 8GiB}"),
      Catch::Contains("host_reserved") && Catch::Contains("must be less than the capacity"));
  CHECK_THROWS_WITH(load("unified_memory: {first_touch_pages: 4KiB}"),
                    Catch::Contains("first_touch_page"));
}

// Seed 8.3: Qwen3-8B FP16 on Orin, weights ~16 GB + KV pools ~1.15 GB + block table ~72 KB +
// buffers ~50 MB + ~1 GB for the system, ~18.3 GB: "needs a 32 GB Orin". memsim's figures (the
// buffers left out): 8,190,735,360 parameters x 2 B, the two pools and the table written, the
// OS's 1 GiB and a 4 KiB pinned staging page, 18.66 GB: more than a 16 GB module holds, less
// than a 32 GB one.
TEST_CASE("seed 8.3: Qwen3-8B FP16 needs more than 16 GB of Orin and fits 32 GB", "[unified]") {
  const ModelShape m =
      load_model_shape(ConfigNode::load_file(root() + "/configs/models/qwen3-8b.yaml"));
  CHECK(m.weight_bytes() == 8190735360ull * 2);
  SimClock clock;
  SimBackend b(orin(), clock);
  const StreamId s = *b.create_stream();
  const DevPtr host = *b.host_malloc_pinned(4096);  // the loader's staging buffer, reused
  const DevPtr weights = *b.device_malloc(m.weight_bytes(), "weights");
  CHECK(b.usage().physical_bytes == 0);
  // Loading copies every weight byte in: each page is touched once.
  for (uint64_t off = 0; off < m.weight_bytes(); off += 1ull << 30)
    REQUIRE(b.copy(weights + off, host, std::min<uint64_t>(1ull << 30, m.weight_bytes() - off), s)
                .ok());
  const uint64_t pool = pool_bytes(36, 1024);
  for (int i = 0; i < 2; ++i) REQUIRE(b.fill(*b.device_malloc(pool, "kv_cache"), pool, 0, s).ok());
  REQUIRE(b.fill(*b.device_malloc(72 * kKiB, "block_table"), 72 * kKiB, 0, s).ok());
  const uint64_t used = b.usage().physical_bytes + orin().unified.host_reserved + 4096;
  // The weights end half-way into a 4 KiB page, which is touched whole: 16,381,472,768 B.
  CHECK(b.usage().physical_bytes == 16381472768ull + 1152 * kMiB + 72 * kKiB);
  CHECK(used == 18663251968ull);
  CHECK(used > 16'000'000'000ull);
  CHECK(used < 32'000'000'000ull);
}
