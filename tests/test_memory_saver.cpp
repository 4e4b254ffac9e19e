// Tests of the memory savers (tagged_regions, sleep_mode): exact byte accounting per tag,
// addresses kept across pause/resume, CPU backups, idempotence, multi-stage wake, fault
// injection at every backend call of pause and resume, and a randomized stress.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "core/clock.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/saver/registry.h"
#include "src/saver/sleep_mode.h"
#include "src/saver/tagged_regions.h"

using namespace memsim;

namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

GpuSpec h200() {
  const char* r = std::getenv("MEMSIM_SOURCE_ROOT");
  return load_gpu_spec(
      ConfigNode::load_file(std::string(r != nullptr ? r : ".") + "/configs/gpus/h200.yaml"));
}

std::unique_ptr<MemorySaver> make(const char* impl, const char* yaml, Backend& b) {
  const SaverEntry* info = memory_savers().find(impl);
  REQUIRE(info != nullptr);
  const ConfigNode node = ConfigNode::parse(yaml, "test");
  node.expect_keys(info->keys);
  return info->parse(node)(b);
}

void require_ok(const MemorySaver& s) {
  std::string why;
  INFO(why);
  REQUIRE(s.check_invariants(&why));
}

}  // namespace

TEST_CASE(
    "tagged_regions: pause gives back exactly the tag's bytes, resume maps them at the same "
    "address",
    "[saver]") {
  SimClock clock;
  SimBackend b(h200(), clock);
  auto s = make("tagged_regions", "{}", b);
  const DevPtr w = *s->malloc(kGiB + 1, "weights");  // rounded to 1 GiB + 2 MiB
  const DevPtr kv = *s->malloc(4 * kGiB, "kv_cache");
  const DevPtr g = *s->malloc(300 * kMiB, "cuda_graph");
  const uint64_t all = kGiB + 2 * kMiB + 4 * kGiB + 300 * kMiB;
  CHECK(b.usage().physical_bytes == all);
  CHECK(s->stats().physical_bytes == all);
  CHECK(s->stats().tags.at("weights").bytes == kGiB + 2 * kMiB);
  const uint64_t va = b.usage().virtual_reserved;

  auto r = s->pause({"kv_cache"});
  REQUIRE(r.ok());
  CHECK(r->allocations == 1);
  CHECK(r->bytes == 4 * kGiB);
  CHECK(r->copied_bytes == 0);
  CHECK(b.usage().physical_bytes == all - 4 * kGiB);
  CHECK(b.usage().virtual_reserved == va);  // the range stays reserved
  CHECK(s->is_paused(kv));
  CHECK(!s->is_paused(w));
  CHECK(s->stats().tags.at("kv_cache").paused_bytes == 4 * kGiB);
  require_ok(*s);

  r = s->resume({"kv_cache"});
  REQUIRE(r.ok());
  CHECK(r->allocations == 1);
  CHECK(!s->is_paused(kv));
  CHECK(b.usage().physical_bytes == all);
  CHECK(b.usage().virtual_mapped == all);
  // Pause everything (no tags = all), then free a paused allocation: its range goes too.
  r = s->pause({});
  REQUIRE(r.ok());
  CHECK(r->allocations == 3);
  CHECK(b.usage().physical_bytes == 0);
  REQUIRE(s->free(g).ok());
  CHECK(b.usage().virtual_reserved == va - 300 * kMiB);
  REQUIRE(s->release_all().ok());
  CHECK(b.usage().virtual_reserved == 0);
  CHECK(b.usage().physical_bytes == 0);
}

TEST_CASE("pause and resume are idempotent per allocation; misuse is an error value", "[saver]") {
  SimClock clock;
  SimBackend b(h200(), clock);
  auto s = make("tagged_regions", "{}", b);
  REQUIRE(s->malloc(64 * kMiB, "weights").ok());
  REQUIRE(s->malloc(64 * kMiB, "weights").ok());
  REQUIRE(s->malloc(64 * kMiB, "kv_cache").ok());
  auto r = s->pause({"weights"});
  CHECK(r->allocations == 2);
  r = s->pause({"weights"});  // torch_memory_saver exits here
  REQUIRE(r.ok());
  CHECK(r->allocations == 0);
  CHECK(r->skipped == 2);
  r = s->resume({"kv_cache"});  // active already
  CHECK(r->allocations == 0);
  CHECK(r->skipped == 1);
  CHECK(s->stats().pauses == 2);
  CHECK(s->resume({"no_such_tag"})->allocations == 0);
  CHECK(!s->malloc(0, "weights").ok());
  CHECK(!s->malloc(kMiB, "").ok());
  CHECK(!s->free(0x1234).ok());
  require_ok(*s);
  REQUIRE(s->release_all().ok());
}

TEST_CASE("CPU backup: torch_memory_saver keeps the pinned copy, vLLM frees it on wake",
          "[saver]") {
  SimClock clock;
  SimBackend b(h200(), clock);
  auto tms = make("tagged_regions", "{enable_cpu_backup: [weights]}", b);
  REQUIRE(tms->malloc(512 * kMiB, "weights").ok());
  REQUIRE(tms->malloc(kGiB, "kv_cache").ok());
  auto r = tms->pause({});
  CHECK(r->copied_bytes == 512 * kMiB);  // only the weights are backed up
  CHECK(b.usage().pinned_host_bytes == 512 * kMiB);
  // The copy to pinned host memory is priced over PCIe (compute.pcie_gbps), not HBM.
  CHECK(b.time_in(Primitive::kCopy) == static_cast<SimTime>(static_cast<double>(512 * kMiB) * 1e9 /
                                                            h200().compute.pcie_bytes_per_s));
  r = tms->resume({});
  CHECK(r->copied_bytes == 512 * kMiB);
  CHECK(b.usage().pinned_host_bytes == 512 * kMiB);  // kept for the next pause
  r = tms->pause({"weights"});
  CHECK(b.usage().pinned_host_bytes == 512 * kMiB);  // reused, not allocated again
  REQUIRE(tms->release_all().ok());
  CHECK(b.usage().pinned_host_bytes == 0);

  SimBackend b2(h200(), clock);
  auto vllm = make("sleep_mode", "{}", b2);
  REQUIRE(vllm->malloc(512 * kMiB, "weights").ok());
  REQUIRE(vllm->malloc(kGiB, "kv_cache").ok());
  auto* sleep = dynamic_cast<SleepMode*>(vllm.get());
  REQUIRE(sleep != nullptr);
  r = sleep->sleep(1);  // weights offloaded, KV discarded
  CHECK(r->copied_bytes == 512 * kMiB);
  CHECK(b2.usage().pinned_host_bytes == 512 * kMiB);
  CHECK(b2.usage().physical_bytes == 0);
  r = sleep->wake_up({});
  CHECK(r->copied_bytes == 512 * kMiB);
  CHECK(b2.usage().pinned_host_bytes == 0);  // freed after restoring
  r = sleep->sleep(2);                       // everything discarded
  CHECK(r->copied_bytes == 0);
  CHECK(b2.usage().pinned_host_bytes == 0);
  CHECK(!sleep->sleep(3).ok());
  REQUIRE(vllm->release_all().ok());
}

TEST_CASE("multi-stage awake: weights first, then KV cache and graphs", "[saver]") {
  SimClock clock;
  SimBackend b(h200(), clock);
  auto s = make("tagged_regions", "{}", b);
  REQUIRE(s->malloc(15 * kGiB, "weights").ok());
  REQUIRE(s->malloc(60 * kGiB, "kv_cache").ok());
  REQUIRE(s->malloc(2 * kGiB, "cuda_graph").ok());
  REQUIRE(s->pause({}).ok());
  // Stage 1: weights only (the training engine's copy is still resident while they update).
  REQUIRE(s->resume({"weights"}).ok());
  CHECK(b.usage().physical_bytes == 15 * kGiB);
  // Stage 2: the rest, once the training model is gone.
  REQUIRE(s->resume({"kv_cache", "cuda_graph"}).ok());
  CHECK(b.usage().physical_bytes == 77 * kGiB);
  REQUIRE(s->release_all().ok());
}

TEST_CASE("a fault at any backend call of pause or resume leaves the saver consistent", "[saver]") {
  const Primitive kinds[] = {Primitive::kUnmap,           Primitive::kReleasePhysical,
                             Primitive::kCreatePhysical,  Primitive::kMap,
                             Primitive::kSetAccess,       Primitive::kCopy,
                             Primitive::kHostMallocPinned};
  // The script: 2 allocations per tag, then pause/resume cycles with a CPU backup of weights.
  auto script = [](MemorySaver& s, bool check) {
    for (const char* tag : {"weights", "kv_cache", "cuda_graph"})
      for (int k = 0; k < 2; ++k) (void)s.malloc(64 * kMiB, tag);
    const std::vector<std::vector<std::string>> steps = {
        {}, {"weights"}, {"kv_cache", "cuda_graph"}, {"weights"}, {"weights"}, {}};
    for (size_t i = 0; i < steps.size(); ++i) {
      (void)(i % 2 == 0 ? s.pause(steps[i]) : s.resume(steps[i]));
      if (check) {
        std::string why;
        INFO(why);
        REQUIRE(s.check_invariants(&why));
      }
    }
    (void)s.resume({});  // everything back (may fail again at the injected call)
  };
  for (Primitive p : kinds) {
    // Calls of this primitive the script makes, fault-free.
    SimClock c0;
    SimBackend b0(h200(), c0);
    auto s0 = make("tagged_regions", "{enable_cpu_backup: [weights]}", b0);
    script(*s0, false);
    const uint64_t n = b0.calls_of(p);
    REQUIRE(s0->release_all().ok());
    for (uint64_t k = 1; k <= n; ++k) {
      INFO(to_string(p) << " call " << k);
      SimClock clock;
      SimBackend b(h200(), clock, nullptr, {FaultInjection{p, k, 1}});
      auto s = make("tagged_regions", "{enable_cpu_backup: [weights]}", b);
      script(*s, true);
      CHECK(s->stats().physical_bytes == b.usage().physical_bytes);
      REQUIRE(s->release_all().ok());
      const Usage u = b.usage();
      CHECK(u.physical_bytes == 0);
      CHECK(u.virtual_reserved == 0);
      CHECK(u.pinned_host_bytes == 0);
    }
  }
}

TEST_CASE("randomized pause/resume/malloc/free keeps the accounting exact", "[saver]") {
  for (const char* impl : {"tagged_regions", "sleep_mode"}) {
    INFO(impl);
    SimClock clock;
    GpuSpec gpu = h200();
    gpu.capacity = 8 * kGiB;  // small: mallocs and resumes run out of memory sometimes
    SimBackend b(gpu, clock);
    auto s = make(
        impl, std::string(impl) == "tagged_regions" ? "{enable_cpu_backup: [weights]}" : "{}", b);
    const std::vector<std::string> tags = {"weights", "kv_cache", "cuda_graph", "extra"};
    std::mt19937_64 rng(42);
    std::map<DevPtr, std::pair<std::string, uint64_t>> mine;
    for (int op = 0; op < 500000; ++op) {  // a million over the two savers
      const int what = static_cast<int>(rng() % 10);
      const std::string& tag = tags[rng() % tags.size()];
      if (what < 3) {
        const uint64_t bytes = (1 + rng() % 64) * kMiB - rng() % 4096;
        auto p = s->malloc(bytes, tag);
        if (p.ok()) mine[*p] = {tag, bytes};
      } else if (what < 6 && !mine.empty()) {  // as many frees as mallocs: the set stays small
        auto it = mine.begin();
        std::advance(it, static_cast<long>(rng() % mine.size()));
        REQUIRE(s->free(it->first).ok());
        mine.erase(it);
      } else if (what < 8) {
        (void)s->pause(rng() % 4 == 0 ? std::vector<std::string>{} : std::vector{tag});
      } else {
        (void)s->resume(rng() % 4 == 0 ? std::vector<std::string>{} : std::vector{tag});
      }
      const SaverStats st = s->stats();
      REQUIRE(st.physical_bytes == b.usage().physical_bytes);
      REQUIRE(st.backup_bytes == b.usage().pinned_host_bytes);
      uint64_t active_stat = 0;
      for (const auto& [t, ts] : st.tags) active_stat += ts.active_bytes;
      REQUIRE(active_stat <= st.physical_bytes);
      if (op % 1000 == 0) require_ok(*s);
    }
    REQUIRE(s->release_all().ok());
    CHECK(b.usage().physical_bytes == 0);
    CHECK(b.usage().virtual_reserved == 0);
    CHECK(b.usage().pinned_host_bytes == 0);
  }
}
