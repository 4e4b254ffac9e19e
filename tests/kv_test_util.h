// Test helpers for the KV-cache family: a roomy simulated GPU, model geometries from
// configs/models, and a backend + strategy bundle.
#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "core/clock.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/kv/kv_cache_manager.h"
#include "src/kv/registry.h"
#include "workload/model_shape.h"
#include "workload/requests.h"

namespace memsim::test {

constexpr uint64_t kKiB = 1ull << 10;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

// 192 GiB, 2 MiB granularity; only copies cost time (1 us per call).
inline GpuSpec kv_test_gpu() {
  GpuSpec g;
  g.name = "kv-test";
  g.capacity = 192 * kGiB;
  g.granularity = 2 * kMiB;
  g.va_space = 1ull << 46;
  g.cost(Primitive::kCopy).per_call_us = 1;
  return g;
}

inline GpuSpec gpu_from_configs(const std::string& name) {
  const char* root = std::getenv("MEMSIM_SOURCE_ROOT");
  REQUIRE(root != nullptr);
  return load_gpu_spec(
      ConfigNode::load_file(std::string(root) + "/configs/gpus/" + name + ".yaml"));
}

inline ModelShape model_from_configs(const std::string& name) {
  const char* root = std::getenv("MEMSIM_SOURCE_ROOT");
  REQUIRE(root != nullptr);
  return load_model_shape(
      ConfigNode::load_file(std::string(root) + "/configs/models/" + name + ".yaml"));
}

inline KvInit kv_init_for(const ModelShape& m, uint64_t budget, uint32_t max_num_seqs,
                          uint32_t max_model_len) {
  KvInit i;
  i.layers = m.layers;
  i.kv_bytes_per_token = m.kv_bytes_per_token();
  i.budget_bytes = budget;
  i.max_num_seqs = max_num_seqs;
  i.max_model_len = max_model_len;
  return i;
}

// A strategy from its registry name and YAML text (e.g. "{impl: paged_block_pool, ...}"),
// checked and parsed as a `kv:` map is.
inline std::unique_ptr<KvCacheManager> make_kv(const std::string& yaml) {
  const ConfigNode node = ConfigNode::parse(yaml, "test.yaml");
  return kv_strategies().select(node).parse(node)();
}

struct KvRig {
  SimClock clock;
  SimBackend backend{kv_test_gpu(), clock};
  std::unique_ptr<KvCacheManager> kv;
  KvRig(const std::string& yaml, const KvInit& init) : kv(make_kv(yaml)) {
    REQUIRE(kv->init(backend, init).ok());
  }
  void check() const {
    std::string why;
    INFO(why);
    REQUIRE(kv->check_invariants(&why));
    // The pool is one device allocation (or whole pages), which the backend rounds to its
    // granularity as cudaMalloc does.
    const uint64_t g = backend.granularity();
    REQUIRE(backend.usage().physical_bytes == (kv->stats().pool_bytes + g - 1) / g * g);
    const KvStats s = kv->stats();
    REQUIRE(s.used_blocks + s.cached_blocks + s.free_blocks == s.total_blocks);
  }
};

// Delegates to a real strategy; `lie` may edit the tables it reports (tests show that the
// content checks catch a wrong table).
class LyingTable final : public KvCacheManager {
 public:
  explicit LyingTable(std::unique_ptr<KvCacheManager> inner) : inner_(std::move(inner)) {}
  std::function<void(SeqId, std::vector<int32_t>*)> lie;

  std::string_view name() const override { return inner_->name(); }
  Status init(Backend& b, const KvInit& i) override { return inner_->init(b, i); }
  Status shutdown() override { return inner_->shutdown(); }
  uint32_t lookup_prefix(const TokenContent& c) const override { return inner_->lookup_prefix(c); }
  Status grow(SeqId s, const TokenContent& c, uint32_t n, uint32_t p) override {
    return inner_->grow(s, c, n, p);
  }
  Status fork(SeqId parent, SeqId child) override { return inner_->fork(parent, child); }
  void release(SeqId s, const TokenContent& c) override { inner_->release(s, c); }
  uint32_t seq_tokens(SeqId s) const override { return inner_->seq_tokens(s); }
  uint64_t seq_bytes(SeqId s) const override { return inner_->seq_bytes(s); }
  uint32_t seq_capacity(SeqId s) const override { return inner_->seq_capacity(s); }
  uint64_t free_token_capacity() const override { return inner_->free_token_capacity(); }
  bool caches_prefixes() const override { return inner_->caches_prefixes(); }
  uint32_t block_table_tokens() const override { return inner_->block_table_tokens(); }
  KvLayout layout() const override { return inner_->layout(); }
  void seq_table(SeqId s, std::vector<int32_t>* out) const override {
    inner_->seq_table(s, out);
    if (lie) lie(s, out);
  }
  void seq_group_table(SeqId s, uint32_t g, std::vector<int32_t>* out) const override {
    inner_->seq_group_table(s, g, out);
    if (lie) lie(s, out);
  }
  KvStats stats() const override { return inner_->stats(); }
  bool check_invariants(std::string* why) const override { return inner_->check_invariants(why); }
  KvCacheManager& inner() { return *inner_; }

 private:
  std::unique_ptr<KvCacheManager> inner_;
};

// Long prompts over Gemma-3's 1,024-token window (lognormal, mean 3,000 tokens; a quarter share one
// of 4 prefixes of 1,500 tokens), 40 requests a second: the hybrid KV tests' serving load.
inline std::vector<RequestSpec> hybrid_long_prompts(uint64_t count) {
  SyntheticRequestsConfig s;
  s.count = count;
  s.seed = 5;
  s.arrival.rate = 40;
  s.prompt = {LengthDist::kLognormal, 0, 16, 6000, 3000, 0.6};
  s.output = {LengthDist::kUniform, 0, 4, 300, 0, 0};
  s.prefix = {4, 1500, 0.25};
  return generate_requests(s);
}

}  // namespace memsim::test
