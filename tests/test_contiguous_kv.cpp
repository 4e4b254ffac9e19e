// static_contiguous and vmm_contiguous: the seed's Qwen3-8B slab figures (ch. 16.1), slot
// exhaustion, vAttention page groups, exact backend call counts for eager and deferred
// reclamation, rollback under injected faults, fork copies, shutdown, randomized invariants.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "src/kv/static_contiguous.h"
#include "src/kv/vmm_contiguous.h"
#include "tests/kv_test_util.h"

namespace memsim::test {
namespace {

using P = Primitive;
constexpr uint64_t kQwenKv = 2ull * 36 * 1024 * 2;  // 147456 bytes per token
constexpr uint64_t kSlab = 1152 * kMiB;             // 8192 tokens x kQwenKv (seed ch. 16.1)
constexpr uint64_t kGroup = 72 * 2 * kMiB;          // one 2 MiB page in each of 72 K/V tensors

// A SimBackend (optionally with faults) and one strategy made through the registry.
struct Rig {
  SimClock clock;
  SimBackend backend;
  std::unique_ptr<KvCacheManager> kv;
  Rig(const std::string& yaml, const KvInit& init, std::vector<FaultInjection> faults = {})
      : backend(kv_test_gpu(), clock, nullptr, std::move(faults)), kv(make_kv(yaml)) {
    const Status st = kv->init(backend, init);
    INFO((st.ok() ? "" : st.error().message));
    REQUIRE(st.ok());
    check();
  }
  void check() const {
    std::string why;
    const bool ok = kv->check_invariants(&why);
    INFO(why);
    REQUIRE(ok);
    std::string bwhy;
    REQUIRE(backend.check_invariants(&bwhy));
    const KvStats s = kv->stats();
    REQUIRE(backend.usage().physical_bytes == s.pool_bytes);
    REQUIRE(s.used_blocks + s.cached_blocks + s.free_blocks == s.total_blocks);
  }
  uint64_t calls(P p) const { return backend.calls_of(p); }
  template <class T>
  T& as() {
    return dynamic_cast<T&>(*kv);
  }
};

KvInit qwen(uint64_t budget, uint32_t max_num_seqs, uint32_t max_model_len = 8192) {
  const ModelShape m = model_from_configs("qwen3-8b");
  REQUIRE(m.layers == 36);
  REQUIRE(m.kv_bytes_per_token() == kQwenKv);
  return kv_init_for(m, budget, max_num_seqs, max_model_len);
}

bool same(const KvStats& a, const KvStats& b) {
  return a.total_blocks == b.total_blocks && a.used_blocks == b.used_blocks &&
         a.cached_blocks == b.cached_blocks && a.free_blocks == b.free_blocks &&
         a.slots_allocated == b.slots_allocated && a.tokens_stored == b.tokens_stored &&
         a.pool_bytes == b.pool_bytes && a.cow_copies == b.cow_copies &&
         a.evicted_blocks == b.evicted_blocks;
}

ErrorCode code(const Status& s) {
  REQUIRE_FALSE(s.ok());
  return s.error().code;
}

const TokenContent kChat(7, 8192);

// ---- static_contiguous ----------------------------------------------------------------------

TEST_CASE("static_contiguous: seed 16.1 slab, one allocation, slots capped by budget and seqs") {
  Rig rig("{impl: static_contiguous}", qwen(4 * kSlab + 100 * kMiB, 8));
  auto& sc = rig.as<StaticContiguous>();
  CHECK(sc.slab_bytes() == kSlab);  // 576 MiB K + 576 MiB V
  CHECK(sc.slots() == 4);
  CHECK(rig.calls(P::kDeviceMalloc) == 1);
  CHECK(rig.backend.usage().per_tag.at("kv_cache") == 4 * kSlab);
  KvStats s = rig.kv->stats();
  CHECK(s.block_tokens == 8192);
  CHECK(s.block_bytes == kSlab);
  CHECK(s.total_blocks == 4);
  CHECK(s.free_blocks == 4);
  CHECK(s.pool_bytes == 4 * kSlab);
  CHECK(rig.kv->free_token_capacity() == 4 * 8192);

  Rig capped("{impl: static_contiguous}", qwen(100 * kSlab, 2));
  CHECK(capped.kv->stats().total_blocks == 2);
  CHECK(capped.kv->stats().pool_bytes == 2 * kSlab);

  SimClock clock;
  SimBackend b(kv_test_gpu(), clock);
  auto small = make_kv("{impl: static_contiguous}");
  CHECK(code(small->init(b, qwen(kSlab - 1, 4))) == ErrorCode::kOutOfMemory);
  CHECK(b.usage().physical_bytes == 0);
}

TEST_CASE("static_contiguous: grow, limits, exhaustion leaves state unchanged, release") {
  Rig rig("{impl: static_contiguous}", qwen(4 * kSlab, 8));
  REQUIRE(rig.kv->grow(1, kChat, 100, 0).ok());
  rig.check();
  KvStats s = rig.kv->stats();
  CHECK(s.used_blocks == 1);
  CHECK(s.slots_allocated == 8192);
  CHECK(s.tokens_stored == 100);
  CHECK(rig.kv->seq_bytes(1) == kSlab);
  CHECK(rig.kv->free_token_capacity() == 3 * 8192);
  CHECK(rig.kv->lookup_prefix(kChat) == 0);

  CHECK(code(rig.kv->grow(1, kChat, 99, 0)) == ErrorCode::kInvalidArgument);
  CHECK(code(rig.kv->grow(1, TokenContent(7, 9000), 8193, 0)) == ErrorCode::kInvalidArgument);
  CHECK(code(rig.kv->grow(1, TokenContent(7, 50), 200, 0)) == ErrorCode::kInvalidArgument);
  CHECK(code(rig.kv->grow(2, kChat, 10, 5)) == ErrorCode::kInvalidArgument);
  REQUIRE(rig.kv->grow(1, kChat, 8192, 0).ok());
  CHECK(rig.kv->seq_tokens(1) == 8192);
  for (SeqId q = 2; q <= 4; ++q) REQUIRE(rig.kv->grow(q, kChat, 10 * q, 0).ok());
  rig.check();
  const KvStats full = rig.kv->stats();
  CHECK(full.free_blocks == 0);
  CHECK(rig.kv->free_token_capacity() == 0);
  CHECK(code(rig.kv->grow(5, kChat, 1, 0)) == ErrorCode::kOutOfMemory);
  CHECK(code(rig.kv->fork(2, 5)) == ErrorCode::kOutOfMemory);
  CHECK(same(rig.kv->stats(), full));
  CHECK(rig.kv->seq_tokens(5) == 0);
  rig.check();

  rig.kv->release(3, kChat);
  rig.kv->release(3, kChat);  // not live: ignored
  rig.check();
  CHECK(rig.kv->stats().tokens_stored == 8192 + 20 + 40);
  REQUIRE(rig.kv->grow(5, kChat, 0, 0).ok());  // a first grow to 0 tokens takes a slab
  CHECK(rig.kv->stats().used_blocks == 4);
  rig.check();
  REQUIRE(rig.kv->shutdown().ok());
  CHECK(rig.calls(P::kDeviceFree) == 1);
  CHECK(rig.backend.usage().physical_bytes == 0);
  rig.check();
}

TEST_CASE("static_contiguous: fork copies the parent's written tokens into a new slab") {
  Rig rig("{impl: static_contiguous}", qwen(3 * kSlab, 8));
  REQUIRE(rig.kv->grow(1, kChat, 1000, 0).ok());
  CHECK(code(rig.kv->fork(9, 2)) == ErrorCode::kInvalidArgument);
  CHECK(code(rig.kv->fork(1, 1)) == ErrorCode::kInvalidArgument);
  const SimTime before = rig.backend.time_in(P::kCopy);
  REQUIRE(rig.kv->fork(1, 2).ok());
  rig.check();
  CHECK(rig.calls(P::kCopy) == 72);  // K and V of each layer
  CHECK(rig.backend.time_in(P::kCopy) - before == 72 * 1000);
  KvStats s = rig.kv->stats();
  CHECK(s.cow_copies == 1);
  CHECK(s.cow_bytes == 1000 * kQwenKv);
  CHECK(s.tokens_stored == 2000);
  CHECK(rig.kv->seq_tokens(2) == 1000);
  REQUIRE(rig.kv->grow(2, kChat, 1001, 0).ok());
  CHECK(rig.kv->seq_tokens(1) == 1000);
  rig.check();
}

// ---- vmm_contiguous: layout, growth, eager reclamation --------------------------------------

TEST_CASE("vmm_contiguous: Qwen3-8B virtual tensors and page groups on demand (eager)") {
  Rig rig("{impl: vmm_contiguous, physical: on_demand, reclaim: eager, allocation: sync}",
          qwen(10 * kGroup, 4));
  auto& vm = rig.as<VmmContiguous>();
  CHECK(vm.page_size() == 2 * kMiB);
  CHECK(vm.slot_stride() == 16 * kMiB);  // 8192 tokens x 2048 bytes of K per layer
  CHECK(vm.groups_per_slot() == 8);
  CHECK(rig.calls(P::kReserveVirtual) == 72);
  CHECK(rig.backend.usage().virtual_reserved == 72 * 4 * 16 * kMiB);
  CHECK(rig.backend.usage().physical_bytes == 0);
  KvStats s = rig.kv->stats();
  CHECK(s.block_tokens == 1024);
  CHECK(s.block_bytes == kGroup);
  CHECK(s.total_blocks == 10);
  CHECK(s.free_blocks == 10);
  CHECK(rig.kv->free_token_capacity() == 8192 + 2 * 1024);  // one full slot + 2 groups

  REQUIRE(rig.kv->grow(1, kChat, 1, 0).ok());
  rig.check();
  CHECK(rig.kv->stats().used_blocks == 1);
  CHECK(rig.calls(P::kCreatePhysical) == 72);
  CHECK(rig.calls(P::kMap) == 72);
  CHECK(rig.calls(P::kSetAccess) == 72);
  CHECK(rig.backend.usage().per_tag.at("kv_cache") == kGroup);
  CHECK(rig.kv->seq_bytes(1) == kGroup);
  REQUIRE(rig.kv->grow(1, kChat, 1024, 0).ok());  // still inside the first page
  rig.check();
  CHECK(rig.calls(P::kMap) == 72);
  REQUIRE(rig.kv->grow(1, kChat, 1025, 0).ok());  // crosses into the second page
  rig.check();
  s = rig.kv->stats();
  CHECK(s.used_blocks == 2);
  CHECK(s.slots_allocated == 2048);
  CHECK(s.tokens_stored == 1025);
  CHECK(s.pool_bytes == 2 * kGroup);
  CHECK(rig.calls(P::kCreatePhysical) == 144);
  CHECK(rig.calls(P::kMap) == 144);
  CHECK(rig.calls(P::kSetAccess) == 144);
  // Slot 0's first two pages of every tensor are mapped, the third is not.
  for (uint32_t b = 0; b < 72; ++b) {
    CHECK(rig.backend.resolve(vm.tensor_base(b)).has_value());
    CHECK(rig.backend.resolve(vm.tensor_base(b) + 2 * kMiB + 5).has_value());
    CHECK_FALSE(rig.backend.resolve(vm.tensor_base(b) + 4 * kMiB).has_value());
  }
  CHECK(code(rig.kv->grow(1, TokenContent(7, 9000), 8193, 0)) == ErrorCode::kInvalidArgument);
  CHECK(code(rig.kv->grow(1, kChat, 1000, 0)) == ErrorCode::kInvalidArgument);
  CHECK(code(rig.kv->grow(2, kChat, 5, 1)) == ErrorCode::kInvalidArgument);

  rig.kv->release(1, kChat);
  rig.check();
  CHECK(rig.calls(P::kUnmap) == 72);  // one per tensor over the slot's mapped range
  CHECK(rig.calls(P::kReleasePhysical) == 144);
  CHECK(rig.kv->stats().free_blocks == 10);
  CHECK(rig.backend.usage().virtual_mapped == 0);
  REQUIRE(rig.kv->shutdown().ok());
  rig.check();
  CHECK(rig.calls(P::kFreeVirtual) == 72);
  CHECK(rig.backend.usage().physical_bytes == 0);
  CHECK(rig.backend.usage().virtual_reserved == 0);
}

TEST_CASE("vmm_contiguous: budget and slot exhaustion leave state unchanged") {
  Rig rig("{impl: vmm_contiguous, physical: on_demand, reclaim: eager, allocation: sync}",
          qwen(3 * kGroup, 2));
  CHECK(rig.kv->stats().total_blocks == 3);
  Rig capped("{impl: vmm_contiguous, physical: on_demand, reclaim: eager, allocation: sync}",
             qwen(100 * kGroup, 2));
  CHECK(capped.kv->stats().total_blocks == 16);  // 2 slots x 8 groups
  CHECK(capped.kv->free_token_capacity() == 2 * 8192);

  REQUIRE(rig.kv->grow(1, kChat, 2048, 0).ok());
  const KvStats before = rig.kv->stats();
  const uint64_t creates = rig.calls(P::kCreatePhysical);
  CHECK(code(rig.kv->grow(1, kChat, 3073, 0)) == ErrorCode::kOutOfMemory);  // 4 groups > 3
  CHECK(code(rig.kv->grow(2, kChat, 2000, 0)) == ErrorCode::kOutOfMemory);
  CHECK(same(rig.kv->stats(), before));
  CHECK(rig.calls(P::kCreatePhysical) == creates);
  CHECK(rig.kv->seq_tokens(2) == 0);
  rig.check();
  REQUIRE(rig.kv->grow(2, kChat, 1000, 0).ok());
  CHECK(code(rig.kv->grow(3, kChat, 0, 0)) == ErrorCode::kOutOfMemory);  // both slots taken
  CHECK(rig.kv->free_token_capacity() == 0);
  rig.check();

  SimClock clock;
  SimBackend b(kv_test_gpu(), clock);
  auto small =
      make_kv("{impl: vmm_contiguous, physical: on_demand, reclaim: eager, allocation: sync}");
  CHECK(code(small->init(b, qwen(kGroup - 1, 4))) == ErrorCode::kOutOfMemory);
  CHECK(b.usage().virtual_reserved == 0);
}

TEST_CASE("vmm_contiguous: a failing backend call mid-group rolls the whole grow back") {
  for (P p : {P::kCreatePhysical, P::kMap, P::kSetAccess}) {
    // The 100th call falls in the second page group (pages 73..144).
    Rig rig("{impl: vmm_contiguous, physical: on_demand, reclaim: eager, allocation: sync}",
            qwen(10 * kGroup, 4), {{p, 100, 1}});
    CHECK(code(rig.kv->grow(1, kChat, 2048, 0)) == ErrorCode::kOutOfMemory);
    rig.check();
    CHECK(rig.kv->seq_tokens(1) == 0);
    CHECK(rig.kv->stats().free_blocks == 10);
    CHECK(rig.backend.usage().virtual_mapped == 0);
    REQUIRE(rig.kv->grow(1, kChat, 2048, 0).ok());  // the fault fired once
    rig.check();
    CHECK(rig.kv->stats().used_blocks == 2);
  }
  // A failing copy undoes a fork.
  Rig rig("{impl: vmm_contiguous, physical: on_demand, reclaim: eager, allocation: sync}",
          qwen(10 * kGroup, 4), {{P::kCopy, 5, 1}});
  REQUIRE(rig.kv->grow(1, kChat, 1500, 0).ok());
  const KvStats before = rig.kv->stats();
  CHECK(code(rig.kv->fork(1, 2)) == ErrorCode::kOutOfMemory);
  rig.check();
  CHECK(same(rig.kv->stats(), before));
  CHECK(rig.kv->seq_tokens(2) == 0);
}

TEST_CASE("vmm_contiguous: fork maps the child's pages and copies each tensor") {
  Rig rig("{impl: vmm_contiguous, physical: on_demand, reclaim: eager, allocation: sync}",
          qwen(10 * kGroup, 4));
  auto& vm = rig.as<VmmContiguous>();
  REQUIRE(rig.kv->grow(1, kChat, 1500, 0).ok());
  REQUIRE(rig.kv->fork(1, 2).ok());
  rig.check();
  CHECK(rig.calls(P::kMap) == 4 * 72);
  CHECK(rig.calls(P::kCopy) == 72);
  CHECK(rig.backend.time_in(P::kCopy) == 72 * 1000);
  KvStats s = rig.kv->stats();
  CHECK(s.cow_copies == 2);  // page groups copied
  CHECK(s.cow_bytes == 1500 * kQwenKv);
  CHECK(s.used_blocks == 4);
  CHECK(s.tokens_stored == 3000);
  CHECK(vm.seq_mapped_groups(2) == 2);
  CHECK(vm.seq_mapped_groups(3) == -1);
  CHECK(code(rig.kv->fork(5, 6)) == ErrorCode::kInvalidArgument);
  CHECK(code(rig.kv->fork(1, 2)) == ErrorCode::kInvalidArgument);
  REQUIRE(rig.kv->shutdown().ok());
  CHECK(rig.backend.usage().physical_bytes == 0);
  CHECK(rig.backend.usage().virtual_reserved == 0);
}

// ---- vmm_contiguous: deferred reclamation ---------------------------------------------------

TEST_CASE("vmm_contiguous: deferred pages are reused in their slot, then reclaimed on demand") {
  Rig rig("{impl: vmm_contiguous, physical: on_demand, reclaim: deferred, allocation: sync}",
          qwen(4 * kGroup, 4));
  auto& vm = rig.as<VmmContiguous>();
  auto maps = [&] { return rig.calls(P::kMap); };
  auto unmaps = [&] { return rig.calls(P::kUnmap); };

  REQUIRE(rig.kv->grow(1, kChat, 2048, 0).ok());  // A: 2 groups, slot 0
  REQUIRE(rig.kv->grow(2, kChat, 1025, 0).ok());  // B: 2 groups, slot 1
  rig.check();
  CHECK(maps() == 4 * 72);
  rig.kv->release(1, kChat);
  rig.kv->release(2, kChat);
  rig.check();
  KvStats s = rig.kv->stats();
  CHECK(unmaps() == 0);
  CHECK(s.used_blocks == 0);
  CHECK(s.cached_blocks == 4);
  CHECK(s.free_blocks == 0);
  CHECK(s.pool_bytes == 4 * kGroup);
  CHECK(rig.kv->free_token_capacity() == 4 * 1024);

  // C takes B's slot (most recently released) and needs 3 groups: 2 are there, the third is
  // reclaimed from A's slot (least recently released).
  REQUIRE(rig.kv->grow(3, kChat, 2049, 0).ok());
  rig.check();
  CHECK(unmaps() == 72);
  CHECK(rig.calls(P::kReleasePhysical) == 72);
  CHECK(maps() == 5 * 72);
  CHECK(rig.calls(P::kCreatePhysical) == 5 * 72);
  s = rig.kv->stats();
  CHECK(s.used_blocks == 3);
  CHECK(s.cached_blocks == 1);
  CHECK(s.evicted_blocks == 1);
  CHECK(vm.seq_mapped_groups(3) == 3);

  // D takes A's slot and finds its remaining group mapped: no calls.
  REQUIRE(rig.kv->grow(4, kChat, 1000, 0).ok());
  rig.check();
  CHECK(maps() == 5 * 72);
  CHECK(rig.kv->stats().cached_blocks == 0);

  // E takes C's slot after C ends and uses 1 of its 3 groups; F in an empty slot needs 2, which
  // come from E's unneeded groups.
  rig.kv->release(3, kChat);
  REQUIRE(rig.kv->grow(5, kChat, 1, 0).ok());
  rig.check();
  CHECK(vm.seq_mapped_groups(5) == 3);
  CHECK(rig.kv->seq_bytes(5) == kGroup);
  s = rig.kv->stats();
  CHECK(s.used_blocks == 2);
  CHECK(s.cached_blocks == 2);
  CHECK(s.slots_allocated == 2048);
  REQUIRE(rig.kv->grow(6, kChat, 1025, 0).ok());
  rig.check();
  CHECK(vm.seq_mapped_groups(5) == 1);
  CHECK(vm.seq_mapped_groups(6) == 2);
  CHECK(unmaps() == 2 * 72);  // both groups of E's slot in one unmap per tensor
  CHECK(rig.calls(P::kReleasePhysical) == 3 * 72);
  CHECK(rig.kv->stats().evicted_blocks == 3);

  // Nothing free and nothing reclaimable: out of memory, nothing changed.
  const KvStats full = rig.kv->stats();
  const uint64_t calls_before = maps() + unmaps() + rig.calls(P::kCreatePhysical);
  CHECK(code(rig.kv->grow(7, kChat, 1, 0)) == ErrorCode::kOutOfMemory);
  CHECK(code(rig.kv->grow(5, kChat, 1025, 0)) == ErrorCode::kOutOfMemory);
  CHECK(same(rig.kv->stats(), full));
  CHECK(maps() + unmaps() + rig.calls(P::kCreatePhysical) == calls_before);
  rig.check();

  // Shutdown releases live and deferred pages alike.
  rig.kv->release(6, kChat);
  rig.check();
  CHECK(rig.kv->stats().cached_blocks == 2);
  REQUIRE(rig.kv->shutdown().ok());
  rig.check();
  CHECK(rig.backend.usage().physical_bytes == 0);
  CHECK(rig.backend.usage().virtual_reserved == 0);
  CHECK(rig.backend.usage().virtual_mapped == 0);
  CHECK(rig.calls(P::kCreatePhysical) == rig.calls(P::kReleasePhysical));
}

TEST_CASE("vmm_contiguous: a fault after reclaiming leaves the request out, groups accounted") {
  Rig rig("{impl: vmm_contiguous, physical: on_demand, reclaim: deferred, allocation: sync}",
          qwen(2 * kGroup, 2), {{P::kMap, 155, 1}});
  REQUIRE(rig.kv->grow(1, kChat, 1025, 0).ok());  // maps 1..144
  rig.kv->release(1, kChat);
  REQUIRE(rig.kv->grow(2, kChat, 10, 0).ok());  // A's slot: 1 group needed, 1 cached
  rig.check();
  CHECK(code(rig.kv->grow(3, kChat, 10, 0)) == ErrorCode::kOutOfMemory);  // map 155 fails
  rig.check();
  KvStats s = rig.kv->stats();
  CHECK(s.used_blocks == 1);
  CHECK(s.cached_blocks == 0);  // the reclaimed group stays reclaimed: it is free now
  CHECK(s.free_blocks == 1);
  CHECK(s.evicted_blocks == 1);
  CHECK(rig.kv->seq_tokens(3) == 0);
  REQUIRE(rig.kv->grow(3, kChat, 10, 0).ok());
  rig.check();
  CHECK(rig.kv->stats().free_blocks == 0);
}

TEST_CASE("vmm_contiguous: page_size parameter") {
  Rig rig("{impl: vmm_contiguous, page_size: 4MiB, physical: on_demand, reclaim: eager}",
          qwen(10 * 2 * kGroup, 4));
  CHECK(rig.kv->stats().block_tokens == 2048);
  CHECK(rig.kv->stats().block_bytes == 2 * kGroup);
  CHECK(rig.as<VmmContiguous>().groups_per_slot() == 4);
  REQUIRE(rig.kv->grow(1, kChat, 2049, 0).ok());
  rig.check();
  CHECK(rig.calls(P::kMap) == 2 * 72);
  {
    // A page of three granules (not a power of two) is reserved on granule boundaries.
    Rig three("{impl: vmm_contiguous, page_size: 6MiB, physical: on_demand, reclaim: eager}",
              qwen(10 * 3 * kGroup, 4));
    CHECK(three.kv->stats().block_bytes == 3 * kGroup);
    REQUIRE(three.kv->grow(1, kChat, 3073, 0).ok());
    three.check();
    CHECK(three.calls(P::kMap) == 2 * 72);
  }

  SimClock clock;
  SimBackend b(kv_test_gpu(), clock);
  auto small_pages = make_kv("{impl: vmm_contiguous, page_size: 64KiB}");
  const Status st = small_pages->init(b, qwen(10 * kGroup, 4));
  REQUIRE(code(st) == ErrorCode::kInvalidArgument);
  CHECK(st.error().message.find("modified NVIDIA driver") != std::string::npos);
  CHECK_THROWS_AS(make_kv("{impl: vmm_contiguous, page_size: 0}"), ConfigError);
  CHECK_THROWS_AS(make_kv("{impl: vmm_contiguous, reclaim: lazy}"), ConfigError);
  const KvEntry* info = kv_strategies().find("vmm_contiguous");
  REQUIRE(info != nullptr);
  CHECK(info->keys == std::vector<std::string>{"page_size", "physical", "reclaim", "allocation",
                                               "eager_steps", "eager_groups"});
  CHECK_THROWS_AS(make_kv("{impl: vmm_contiguous, physical: lazy}"), ConfigError);
  CHECK_THROWS_AS(make_kv("{impl: vmm_contiguous, allocation: background}"), ConfigError);
  CHECK_THROWS_AS(make_kv("{impl: vmm_contiguous, eager_steps: 0}"), ConfigError);
  REQUIRE(kv_strategies().find("static_contiguous") != nullptr);
  CHECK(kv_strategies().find("static_contiguous")->keys.empty());
}

// ---- vmm_contiguous as vAttention runs it: reserved pages, background mapping ---------------

TEST_CASE("vmm_contiguous: reserved pages are created once and mapped from a free list") {
  Rig rig("{impl: vmm_contiguous, reclaim: eager, allocation: sync}", qwen(10 * kGroup, 4));
  CHECK(rig.calls(P::kCreatePhysical) == 720);  // reserve_physical_pages: 10 groups x 72 pages
  CHECK(rig.backend.usage().physical_bytes == 10 * kGroup);
  CHECK(rig.kv->stats().pool_bytes == 10 * kGroup);
  CHECK(rig.kv->stats().free_blocks == 10);
  CHECK_FALSE(rig.kv->has_background());
  REQUIRE(rig.kv->grow(1, kChat, 1025, 0).ok());
  rig.check();
  CHECK(rig.calls(P::kCreatePhysical) == 720);
  CHECK(rig.calls(P::kMap) == 144);
  CHECK(rig.calls(P::kSetAccess) == 144);
  CHECK(rig.kv->stats().used_blocks == 2);
  rig.kv->release(1, kChat);  // sync + eager: unmapped now, the pages back in the list
  rig.check();
  CHECK(rig.calls(P::kUnmap) == 72);
  CHECK(rig.calls(P::kReleasePhysical) == 0);
  CHECK(rig.kv->stats().free_blocks == 10);
  CHECK(rig.backend.usage().virtual_mapped == 0);
  REQUIRE(rig.kv->shutdown().ok());
  rig.check();
  CHECK(rig.calls(P::kReleasePhysical) == 720);
  CHECK(rig.backend.usage().physical_bytes == 0);

  // Not even the reserve fits: init fails and leaves nothing behind.
  SimClock clock;
  SimBackend small(kv_test_gpu(), clock, nullptr, {{P::kCreatePhysical, 300, 1}});
  auto kv = make_kv("{impl: vmm_contiguous}");
  CHECK_FALSE(kv->init(small, qwen(10 * kGroup, 4)).ok());
  CHECK(small.usage().physical_bytes == 0);
  CHECK(small.usage().virtual_reserved == 0);
}

TEST_CASE("vmm_contiguous: the background step maps the next step's groups, then eagerly") {
  Rig rig("{impl: vmm_contiguous}", qwen(10 * kGroup, 4));  // vAttention: async, deferred
  auto& vm = rig.as<VmmContiguous>();
  REQUIRE(rig.kv->has_background());
  for (SeqId s = 1; s <= 4; ++s) REQUIRE(rig.kv->grow(s, kChat, 1000, 0).ok());
  CHECK(rig.calls(P::kMap) == 4 * 72);
  // 1000 tokens: no group needed within eager_steps - 1 = 9 tokens. Nothing to do.
  rig.kv->background_step({{1, 1000}, {2, 1000}, {3, 1000}, {4, 1000}});
  CHECK(rig.calls(P::kMap) == 4 * 72);
  // At 1020 tokens every sequence needs its second group 5 steps later: eager allocation maps
  // eager_groups = 2 of them, in sequence order, and stops.
  rig.kv->background_step({{1, 1020}, {2, 1020}, {3, 1020}, {4, 1020}});
  rig.check();
  CHECK(rig.calls(P::kMap) == 6 * 72);
  CHECK(vm.seq_mapped_groups(1) == 2);
  CHECK(vm.seq_mapped_groups(2) == 2);
  CHECK(vm.seq_mapped_groups(3) == 1);
  KvStats s = rig.kv->stats();
  CHECK(s.used_blocks == 4);
  CHECK(s.cached_blocks == 2);
  CHECK(rig.kv->seq_capacity(1) == 1024);  // mapped ahead is not capacity: no token moved
  CHECK(rig.kv->seq_tokens(1) == 1000);
  // At 1024 tokens the next step's groups are required: seqs 3 and 4 (1 and 2 have theirs).
  rig.kv->background_step({{1, 1024}, {2, 1024}, {3, 1024}, {4, 1024}, {99, 5}});
  rig.check();
  CHECK(rig.calls(P::kMap) == 8 * 72);
  // The grows that follow map nothing: the critical path only counts tokens.
  for (SeqId q = 1; q <= 4; ++q) REQUIRE(rig.kv->grow(q, kChat, 1025, 0).ok());
  rig.check();
  CHECK(rig.calls(P::kMap) == 8 * 72);
  s = rig.kv->stats();
  CHECK(s.used_blocks == 8);
  CHECK(s.cached_blocks == 0);
  CHECK(s.free_blocks == 2);
  // Two groups left: three sequences needing their third group is all or nothing.
  rig.kv->background_step({{1, 2048}, {2, 2048}, {3, 2048}});
  CHECK(rig.calls(P::kMap) == 8 * 72);
  rig.kv->background_step({{1, 2048}, {2, 2048}});
  rig.check();
  CHECK(rig.calls(P::kMap) == 10 * 72);
  CHECK(rig.kv->stats().free_blocks == 0);
  CHECK(rig.kv->stats().cached_blocks == 2);
}

TEST_CASE("vmm_contiguous: async release keeps pages; eager reclaim unmaps one group a step") {
  Rig rig("{impl: vmm_contiguous, reclaim: eager}", qwen(10 * kGroup, 4));
  for (SeqId s = 1; s <= 3; ++s) REQUIRE(rig.kv->grow(s, kChat, 2048, 0).ok());
  rig.kv->release(1, kChat);  // free_batch_idx: the slot keeps its 2 groups
  rig.kv->release(2, kChat);
  rig.check();
  CHECK(rig.calls(P::kUnmap) == 0);
  CHECK(rig.kv->stats().cached_blocks == 4);
  // A step that needs a group (seq 3's third, mapped ahead) reclaims nothing.
  rig.kv->background_step({{3, 2048}});
  CHECK(rig.calls(P::kUnmap) == 0);
  CHECK(rig.kv->stats().cached_blocks == 5);
  // Steps that need none unmap one group of the least recently released slot (slot of seq 1),
  // never of the slot the next request gets (seq 2's).
  for (int i = 0; i < 4; ++i) rig.kv->background_step({{3, 2049}});
  rig.check();
  CHECK(rig.calls(P::kUnmap) == 2 * 72);
  CHECK(rig.kv->stats().cached_blocks == 3);
  CHECK(rig.kv->stats().evicted_blocks == 0);    // reclaimed in the background, not evicted
  REQUIRE(rig.kv->grow(4, kChat, 100, 0).ok());  // seq 2's slot: its pages, no mapping
  CHECK(rig.as<VmmContiguous>().seq_mapped_groups(4) == 2);
  CHECK(rig.calls(P::kMap) == 3 * 2 * 72 + 72);  // the first 3 grows, then seq 3's next group
}

// ---- randomized: both strategies against a reference model ----------------------------------

void random_ops(const std::string& yaml, const KvInit& init, uint64_t seed, int ops) {
  Rig rig(yaml, init);
  std::mt19937_64 rng(seed);
  std::map<SeqId, uint32_t> ref;  // live sequences and their lengths
  const TokenContent content(3, init.max_model_len);
  for (int i = 0; i < ops; ++i) {
    const auto pick = rng() % 100;
    const SeqId seq = static_cast<SeqId>(rng() % (2 * init.max_num_seqs));
    auto it = ref.find(seq);
    if (pick < 60) {
      const uint32_t cur = it == ref.end() ? 0 : it->second;
      const uint32_t n =
          std::min<uint32_t>(init.max_model_len, cur + static_cast<uint32_t>(rng() % 700));
      const KvStats before = rig.kv->stats();
      const Status st = rig.kv->grow(seq, content, n, 0);
      if (st.ok()) {
        ref[seq] = n;
      } else {
        REQUIRE(st.error().code == ErrorCode::kOutOfMemory);
        CHECK(rig.kv->stats().used_blocks == before.used_blocks);
        CHECK(rig.kv->stats().tokens_stored == before.tokens_stored);
      }
    } else if (pick < 68) {
      const SeqId child = static_cast<SeqId>(rng() % (2 * init.max_num_seqs));
      const Status st = rig.kv->fork(seq, child);
      if (st.ok()) {
        ref[child] = ref.at(seq);
      } else {
        REQUIRE((st.error().code == ErrorCode::kOutOfMemory || it == ref.end() ||
                 ref.count(child) != 0));
      }
    } else {
      rig.kv->release(seq, content);
      ref.erase(seq);
    }
    uint64_t tokens = 0;
    for (const auto& [q, n] : ref) {
      REQUIRE(rig.kv->seq_tokens(q) == n);
      tokens += n;
    }
    REQUIRE(rig.kv->stats().tokens_stored == tokens);
    rig.check();
  }
  REQUIRE(rig.kv->shutdown().ok());
  CHECK(rig.backend.usage().physical_bytes == 0);
  CHECK(rig.backend.usage().virtual_reserved == 0);
}

TEST_CASE("random operations keep invariants and the backend in step") {
  // An odd geometry: 3000 bytes of K per token per layer do not divide the 2 MiB page.
  KvInit odd;
  odd.layers = 2;
  odd.kv_bytes_per_token = 2 * 2 * 3000;
  odd.max_num_seqs = 6;
  odd.max_model_len = 2000;
  odd.budget_bytes = 10 * 4 * 2 * kMiB;  // 10 page groups
  random_ops("{impl: vmm_contiguous, physical: on_demand, reclaim: eager, allocation: sync}", odd,
             1, 4000);
  random_ops("{impl: vmm_contiguous, physical: on_demand, reclaim: deferred, allocation: sync}",
             odd, 2, 4000);
  odd.budget_bytes = 3 * 2000 * odd.kv_bytes_per_token;
  random_ops("{impl: static_contiguous}", odd, 3, 4000);
  const KvInit q = qwen(12 * kGroup, 5, 4096);
  random_ops("{impl: vmm_contiguous, physical: on_demand, reclaim: deferred, allocation: sync}", q,
             4, 1500);
}

TEST_CASE("seq_capacity: the whole static slab; vmm's needed groups, not a slot's excess") {
  Rig st("{impl: static_contiguous}", qwen(2 * kSlab, 2));
  CHECK(st.kv->seq_capacity(1) == 0);
  REQUIRE(st.kv->grow(1, kChat, 10, 0).ok());
  CHECK(st.kv->seq_capacity(1) == 8192);

  Rig rig("{impl: vmm_contiguous, physical: on_demand, reclaim: deferred, allocation: sync}",
          qwen(4 * kGroup, 4));
  auto& vm = rig.as<VmmContiguous>();
  REQUIRE(rig.kv->grow(1, kChat, 2048, 0).ok());  // slot 0, 2 groups
  REQUIRE(rig.kv->grow(2, kChat, 2000, 0).ok());  // slot 1, 2 groups
  CHECK(rig.kv->seq_capacity(2) == 2048);
  rig.kv->release(1, kChat);
  rig.kv->release(2, kChat);
  REQUIRE(rig.kv->grow(3, kChat, 1, 0).ok());  // slot 1: needs 1 group, 1 more mapped
  REQUIRE(rig.kv->grow(4, kChat, 1, 0).ok());  // slot 0 likewise
  CHECK(vm.seq_mapped_groups(3) == 2);
  CHECK(rig.kv->seq_capacity(3) == 1024);  // the excess group is reclaimable by others
  // A grow within capacity changes only the token counters: no call, no block moves, and the
  // slot keeps its place in the reclaim order (seq 3's slot became excess first).
  const KvStats before = rig.kv->stats();
  const uint64_t maps = rig.calls(P::kMap);
  REQUIRE(rig.kv->grow(3, kChat, 1024, 0).ok());
  KvStats want = before;
  want.tokens_stored += 1023;
  CHECK(same(rig.kv->stats(), want));
  CHECK(rig.calls(P::kMap) == maps);
  REQUIRE(rig.kv->grow(5, kChat, 1, 0).ok());  // an empty slot: reclaims one excess group
  rig.check();
  CHECK(vm.seq_mapped_groups(3) == 1);
  CHECK(vm.seq_mapped_groups(4) == 2);
  CHECK(rig.kv->seq_capacity(5) == 1024);
  rig.kv->release(3, kChat);
  CHECK(rig.kv->seq_capacity(3) == 0);
}

}  // namespace
}  // namespace memsim::test
