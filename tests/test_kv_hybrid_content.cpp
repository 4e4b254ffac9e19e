// Content checks over vLLM's hybrid KV cache groups: each layer's K/V written and read through its
// own group's block table, a sliding-window layer read only over the window its queries see (a
// freed block never), the executors' lanes (group table, window) of Gemma-3-12B with and without
// the hybrid manager, and the engine's content checks over Gemma-3-12B serving.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/kv/kv_content.h"
#include "src/kv/kv_groups.h"
#include "src/kv/kv_lanes.h"
#include "src/kv/paged_block_pool.h"
#include "src/serve/content_executor.h"
#include "src/serve/engine.h"
#include "tests/kv_test_util.h"

namespace memsim::test {
namespace {

KvInit gemma_init(uint64_t budget, bool hybrid) {
  const ModelShape m = model_from_configs("gemma-3-12b");
  KvInit i = kv_init_for(m, budget, 16, 8192);
  i.groups = kv_cache_groups(m.layer_windows(), hybrid);
  return i;
}

TEST_CASE("Gemma-3-12B's lanes: each layer reads its group's table with its own window") {
  const ModelShape gemma = model_from_configs("gemma-3-12b");
  KvRig hybrid("{impl: paged_block_pool}", gemma_init(2 * kGiB, true));
  const KvLayout h = hybrid.kv->layout();
  REQUIRE(h.layer_group.size() == 48);
  CHECK(h.group_window == std::vector<uint32_t>{1024, 1024, 1024, 1024, 1024, 0});
  CHECK(h.group_of(0) == 0);
  CHECK(h.group_of(6) == 0);
  CHECK(h.group_of(1) == 1);
  CHECK(h.group_of(5) == 5);
  CHECK(h.group_of(47) == 5);
  CHECK(h.window_of(46) == 1024);
  CHECK(h.window_of(47) == 0);
  const KvLanes lh = kv_lanes(h, gemma.layer_windows(), 48);
  CHECK(lh.groups == 6);
  REQUIRE(lh.lanes.size() == 6);
  for (uint32_t g = 0; g < 5; ++g) CHECK(lh.lanes[g] == KvLane{g, 1024});
  CHECK(lh.lanes[5] == KvLane{5, 0});
  for (uint32_t layer = 0; layer < 48; ++layer) CHECK(lh.layer_lane[layer] == layer % 6);
  // --disable-hybrid-kv-cache-manager: one full table, the sliding layers keep their window.
  KvRig full("{impl: paged_block_pool}", gemma_init(2 * kGiB, false));
  const KvLayout f = full.kv->layout();
  CHECK(f.layer_group.empty());
  CHECK(f.group_window.empty());
  const KvLanes lf = kv_lanes(f, gemma.layer_windows(), 48);
  CHECK(lf.groups == 1);
  REQUIRE(lf.lanes.size() == 2);
  CHECK(lf.lanes[0] == KvLane{0, 1024});
  CHECK(lf.lanes[1] == KvLane{0, 0});
  CHECK(lf.layer_lane[4] == 0);
  CHECK(lf.layer_lane[5] == 1);
  CHECK(lf.layer_lane[11] == 1);
  // Mistral-shaped: every layer slides, one group with the window.
  ModelShape mistral = model_from_configs("llama-3.1-8b");
  mistral.sliding_window = 4096;
  KvInit mi = kv_init_for(mistral, 2 * kGiB, 16, 8192);
  mi.groups = kv_cache_groups(mistral.layer_windows(), true);
  KvRig slides("{impl: paged_block_pool}", mi);
  const KvLayout s = slides.kv->layout();
  CHECK(s.group_window == std::vector<uint32_t>{4096});
  const KvLanes ls = kv_lanes(s, mistral.layer_windows(), mistral.layers);
  REQUIRE(ls.lanes.size() == 1);
  CHECK(ls.lanes[0] == KvLane{0, 4096});
}

TEST_CASE("the content shadow reads each group's table, a window's layers over the window only") {
  KvRig rig("{impl: paged_block_pool, prefix_caching: false}", gemma_init(2 * kGiB, true));
  auto& pool = dynamic_cast<PagedBlockPool&>(*rig.kv);
  const KvLayout layout = rig.kv->layout();
  KvContentShadow shadow(layout, {0, 5, 47});  // group 0 (window 1024), group 5 (full) twice
  const TokenContent a(11, 8192), b(12, 8192);
  // Chunked prefill of 2,048 tokens a step, then one decode step (as the hybrid test's pool).
  uint32_t done = 0;
  for (const uint32_t n : {2048u, 4096u, 5000u, 5001u}) {
    REQUIRE(rig.kv->grow(0, a, n, 0).ok());
    REQUIRE(shadow.write(*rig.kv, 0, a, done, n).empty());
    done = n;
  }
  // Computed 5,000 before the decode: 3,977 tokens skipped, blocks 0..247 of each window group
  // freed. The decode query (position 5,000) reads 3,977..5,000 in layer 0, 0..5,000 in 5, 47.
  std::vector<int32_t> t;
  rig.kv->seq_group_table(0, 0, &t);
  REQUIRE(t.size() == 313);
  CHECK(t[247] == -1);
  CHECK(t[248] == static_cast<int32_t>(pool.group_table(0, 0)[248]));
  CHECK(t[248] > 0);
  std::vector<int32_t> k;
  kernel_group_table(*rig.kv, 0, 0, &k);
  CHECK(k[0] == 0);
  CHECK(k[247] == 0);  // the null block
  CHECK(k[248] == t[248]);
  rig.kv->seq_group_table(0, 5, &t);
  CHECK(t.size() == 313);
  CHECK(std::count(t.begin(), t.end(), -1) == 0);
  CHECK(shadow.check(*rig.kv, 0, a, 5001, 5000).empty());
  // A query from 4,991 reads 3,968.. (block 248, held); one from 4,990 reads 3,967 (block 247).
  CHECK(shadow.check(*rig.kv, 0, a, 5001, 4991).empty());
  const std::string early = shadow.check(*rig.kv, 0, a, 5001, 4990);
  CHECK(early ==
        "seq 0 position 3967 layer 0 (window 1024): its block was freed, yet a query from "
        "position 4990 reads it");
  CHECK(shadow.check(*rig.kv, 0, a, 5001).find("position 0 layer 0 (window 1024)") !=
        std::string::npos);
  // Another sequence's rows copied over the window's last full block of group 0: caught.
  REQUIRE(rig.kv->grow(1, b, 64, 0).ok());
  REQUIRE(shadow.write(*rig.kv, 1, b, 0, 64).empty());
  std::vector<int32_t> tb;
  rig.kv->seq_group_table(1, 0, &tb);
  rig.kv->seq_group_table(0, 0, &t);
  shadow.copy(layout.k[0] + uint64_t(t[311]) * layout.block_stride,
              layout.k[0] + uint64_t(tb[0]) * layout.block_stride, layout.block_stride);
  const std::string bad = shadow.check(*rig.kv, 0, a, 5001, 5000);
  CHECK(bad.find("seq 0 position 4976 layer 0 K") == 0);
  CHECK(bad.find("of position 0 (written by seq 1 at 0)") != std::string::npos);
}

// Gemma-3-12B on the H200, prompts of about 3,000 tokens over a window of 1,024.
EngineConfig gemma_engine(uint64_t budget, bool hybrid) {
  EngineConfig e;
  e.model = model_from_configs("gemma-3-12b");
  e.gpu = gpu_from_configs("h200");
  const ConfigNode node = ConfigNode::parse("{impl: paged_block_pool}", "test.yaml");
  e.kv_impl = "paged_block_pool";
  e.kv_factory = kv_strategies().find(e.kv_impl)->parse(node);
  e.kv_budget_bytes = budget;
  e.serve.max_model_len = 8192;
  e.serve.max_num_batched_tokens = 2048;
  e.hybrid_kv_cache = hybrid;
  e.executor = [] { return std::make_unique<ContentExecutor>(); };
  e.validate_sample = 1.0;
  return e;
}

// An executor that reads one table with full attention, as the model step does.
class OneTable final : public StepExecutor {
 public:
  Status begin(KvCacheManager& kv, Backend& b, DevPtr s, uint64_t n) override {
    return inner_.begin(kv, b, s, n);
  }
  Status run_step(const StepWork& w) override { return inner_.run_step(w); }
  Status swap_out(SeqId s, SeqId src, const TokenContent& c, uint32_t n) override {
    return inner_.swap_out(s, src, c, n);
  }
  Status swap_in(SeqId s, const TokenContent& c, uint32_t n) override {
    return inner_.swap_in(s, c, n);
  }
  Status swap_drop(SeqId s) override { return inner_.swap_drop(s); }
  void end() override { inner_.end(); }
  ExecutorReport report() const override { return inner_.report(); }

 private:
  ContentExecutor inner_;
};

TEST_CASE("serving Gemma-3-12B with content checks of every step, windows included") {
  const auto reqs = hybrid_long_prompts(30);  // enough that 3 GiB preempts
  for (const bool hybrid : {true, false})
    for (const uint64_t budget : {3 * kGiB, 16 * kGiB}) {  // with and without preemption
      const ServingResult r = run_serving(gemma_engine(budget, hybrid), reqs);
      INFO("hybrid " << hybrid << " budget " << budget << ": " << r.error);
      REQUIRE(r.error.empty());
      CHECK(r.finished == reqs.size());
      CHECK(r.validation.checked_steps == r.steps);
      CHECK(r.validation.checked_seqs > r.steps);
      CHECK(r.kv.used_blocks == 1);
      if (budget == 3 * kGiB && hybrid) CHECK(r.counters.preemptions > 0);
    }
  EngineConfig e = gemma_engine(16 * kGiB, true);
  e.executor = [] { return std::make_unique<OneTable>(); };
  const ServingResult blind = run_serving(e, reqs);
  CHECK(blind.error ==
        "a step executor cannot hold KV cache groups with sliding windows (6 groups of 8 layers: "
        "5 x window 1024, 1 x full)");
  e.hybrid_kv_cache = false;  // one full table: any executor reads it
  CHECK(run_serving(e, hybrid_long_prompts(4)).error.empty());
}

}  // namespace
}  // namespace memsim::test
