// The conformance suite every caching allocator of the registry passes: no overlapping live
// blocks, bytes conserved between allocator and device, failed calls change nothing the caller
// holds, everything returned at the end. Run over each allocator in several configurations.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "core/clock.h"
#include "src/alloc/cuda_async.h"
#include "src/alloc/registry.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"

using namespace memsim;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

GpuSpec small_gpu() {
  const char* r = std::getenv("MEMSIM_SOURCE_ROOT");
  GpuSpec g = load_gpu_spec(
      ConfigNode::load_file(std::string(r != nullptr ? r : ".") + "/configs/gpus/h200.yaml"));
  g.capacity = 1024 * kMiB;  // small enough that the random walk runs out of memory often
  g.context = 0;
  return g;
}

struct Case {
  std::string allocator;
  std::string yaml;
};

// The configurations whose code paths differ from the defaults; every registered allocator
// also runs with its defaults (cases()).
const std::vector<Case> kVariants = {
    {"torch_caching", "{expandable_segments: true}"},
    {"torch_caching",
     "{max_split_size: 64MiB, roundup_power2_divisions: 4, garbage_collection_threshold: 0.5, "
     "memory_limit: 768MiB}"},
    {"sma", "{region: device_malloc, heap_size: 768MiB, garbage_collection_threshold: 0.6}"},
    {"cuda_async", "{release_threshold: 0}"},
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const AllocatorEntry& e : caching_allocators()) out.push_back({e.name, "{}"});
  out.insert(out.end(), kVariants.begin(), kVariants.end());
  return out;
}

bool same_blocks(const std::vector<LiveBlock>& a, const std::vector<LiveBlock>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (a[k].ptr != b[k].ptr || a[k].size != b[k].size || a[k].requested != b[k].requested)
      return false;
  return true;
}

void conformance(const Case& c, uint64_t seed, int ops) {
  INFO(c.allocator << " " << c.yaml << " seed " << seed);
  const AllocatorEntry* info = caching_allocators().find(c.allocator);
  REQUIRE(info != nullptr);
  const ConfigNode node = ConfigNode::parse(c.yaml, "conformance");
  node.expect_keys(info->keys);
  AllocatorFactory factory = info->parse(node);
  SimClock clock;
  SimBackend backend(small_gpu(), clock);
  auto alloc = factory(backend);
  std::mt19937_64 rng(seed);
  std::map<DevPtr, std::pair<uint64_t, StreamId>> mine;  // ptr -> (requested, stream)
  uint64_t requested = 0;
  int ooms = 0;
  for (int k = 0; k < ops; ++k) {
    const int what = static_cast<int>(rng() % 100);
    if (what < 55 || mine.empty()) {
      // Log-uniform sizes from 1 B to 64 MiB, on one of two streams.
      const double lg = std::uniform_real_distribution<double>(0, 26)(rng);
      const auto bytes = static_cast<uint64_t>(std::exp2(lg)) + rng() % 512;
      const StreamId s{static_cast<uint32_t>(rng() % 2)};
      const auto before = alloc->live_blocks();
      const AllocatorStats sb = alloc->stats();
      Result<DevPtr> r = alloc->malloc(bytes, s);
      if (!r.ok()) {
        REQUIRE(r.error().code == ErrorCode::kOutOfMemory);
        ++ooms;
        // A failed call changes nothing the caller holds and takes no more device memory.
        REQUIRE(same_blocks(before, alloc->live_blocks()));
        REQUIRE(alloc->stats().allocated_bytes == sb.allocated_bytes);
        REQUIRE(alloc->stats().reserved_bytes <= sb.reserved_bytes);
        continue;
      }
      const DevPtr p = *r;
      // No overlap with any live block.
      auto next = mine.lower_bound(p);
      REQUIRE((next == mine.end() || next->first >= p + bytes));
      if (next != mine.begin()) {
        auto prev = std::prev(next);
        REQUIRE(prev->first + prev->second.first <= p);
      }
      mine[p] = {bytes, s};
      requested += bytes;
    } else if (what < 97) {
      auto it = mine.begin();
      std::advance(it, static_cast<long>(rng() % mine.size()));
      REQUIRE(alloc->free(it->first).ok());
      requested -= it->second.first;
      mine.erase(it);
    } else {
      REQUIRE(alloc->empty_cache().ok());
    }
    const AllocatorStats st = alloc->stats();
    REQUIRE(st.requested_bytes == requested);
    REQUIRE(st.live_blocks == mine.size());
    REQUIRE(st.allocated_bytes >= requested);
    REQUIRE(st.reserved_bytes >= st.allocated_bytes);
    // Bytes conserved: what the allocator says it holds is what the device has given it.
    REQUIRE(st.reserved_bytes == backend.usage().physical_bytes);
    if (k % 97 == 0) {
      std::string why;
      INFO("op " << k);
      const bool consistent = alloc->check_invariants(&why);
      INFO(why);
      REQUIRE(consistent);
      const auto live = alloc->live_blocks();
      REQUIRE(live.size() == mine.size());
      for (const auto& b : live) {
        auto m = mine.find(b.ptr);
        REQUIRE(m != mine.end());
        REQUIRE(b.requested == m->second.first);
        REQUIRE(b.size >= b.requested);
      }
    }
  }
  CHECK(ooms > 0);  // the walk must reach the out-of-memory path to test it
  // Misuse: unknown pointer and double free are error values.
  CHECK(!alloc->free(0x1234).ok());
  if (!mine.empty()) {
    const DevPtr p = mine.begin()->first;
    REQUIRE(alloc->free(p).ok());
    CHECK(!alloc->free(p).ok());
  }
  CHECK(!alloc->malloc(0, StreamId{}).ok());
  // Everything returned at the end.
  REQUIRE(alloc->release_all().ok());
  CHECK(alloc->stats().reserved_bytes == 0);
  CHECK(alloc->live_blocks().empty());
  const Usage u = backend.usage();
  CHECK(u.physical_bytes == 0);
  CHECK(u.virtual_reserved == 0);
  CHECK(u.virtual_mapped == 0);
}

}  // namespace

TEST_CASE("caching allocators conform: random malloc/free/empty_cache", "[conformance]") {
  for (const Case& c : cases())
    for (uint64_t seed : {1, 2}) conformance(c, seed, 20000);
}

// Regression (found by the walk above when the capacity shrank by the CUDA context): a request
// over two unmapped chunks whose second chunk runs out of memory trims unused chunks and retries;
// the trim must spare the chunk the same request has just mapped (it had no users yet, so it was
// released and the allocation was handed out over an unmapped chunk).
TEST_CASE("cuda_async: the out-of-memory trim spares the request's own chunks", "[conformance]") {
  GpuSpec g = small_gpu();
  g.capacity = 112 * kMiB;  // three and a half 32 MiB chunks; the pool's range is four
  SimClock clock;
  SimBackend backend(g, clock);
  CudaAsyncAllocator alloc(backend, CudaAsyncConfig{});
  const Result<DevPtr> a = alloc.malloc(32 * kMiB, StreamId{});  // chunk 0
  const Result<DevPtr> b = alloc.malloc(32 * kMiB, StreamId{});  // chunk 1
  REQUIRE((a.ok() && b.ok()));
  REQUIRE(alloc.free(*a).ok());  // chunk 0 stays mapped, unused
  // Best fit: [64, 128) MiB, chunks 2 and 3. Chunk 3 would make 128 MiB > 112: trim, retry.
  const Result<DevPtr> c = alloc.malloc(64 * kMiB, StreamId{});
  REQUIRE(c.ok());
  CHECK(*c - *b == 32 * kMiB);
  std::string why;
  const bool consistent = alloc.check_invariants(&why);
  INFO(why);
  CHECK(consistent);
  CHECK(alloc.stats().reserved_bytes == 96 * kMiB);  // chunks 1, 2, 3: chunk 0 was trimmed
  CHECK(backend.usage().physical_bytes == 96 * kMiB);
  CHECK(backend.fill(*c, 64 * kMiB, 0, StreamId{}).ok());  // every byte of it is mapped
  REQUIRE(alloc.release_all().ok());
  CHECK(backend.usage().physical_bytes == 0);
}
