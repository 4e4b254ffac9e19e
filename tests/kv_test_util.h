// Test helpers for the KV-cache family: a roomy simulated GPU, model geometries from
// configs/models, and a backend + strategy bundle.
#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <memory>
#include <string>

#include "backends/sim/sim_backend.h"
#include "sim/clock.h"
#include "sim/workload/model_shape.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/kv/kv_cache_manager.h"
#include "src/kv/registry.h"

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

// A strategy from its registry name and YAML text (e.g. "{impl: paged_block_pool, ...}").
inline std::unique_ptr<KvCacheManager> make_kv(const std::string& yaml) {
  const ConfigNode node = ConfigNode::parse(yaml, "test.yaml");
  const KvStrategyInfo* info = find_kv_strategy(node["impl"].as_string());
  REQUIRE(info != nullptr);
  return info->parse(node)();
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

}  // namespace memsim::test
