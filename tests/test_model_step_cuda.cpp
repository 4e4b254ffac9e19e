// ModelStep on a real GPU: the GEMM warm-up (warm_up_gemms) against steps run without it, and a
// row count between the planned ones (the covering plan's algorithm) against its own; exits
// 77 (skipped) when no CUDA device is present.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "core/clock.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/exec/model_step.h"
#include "src/kv/kv_cache_manager.h"
#include "tests/cuda_test_util.h"

namespace memsim {
namespace {

std::string source_root() {
  const char* r = std::getenv("MEMSIM_SOURCE_ROOT");
  return r ? r : ".";
}

// A model of the configs with one layer run, and a paged pool of `blocks` blocks of 16 tokens
// (block-major, as paged_block_pool lays it out) filled with random values.
struct Fixture {
  explicit Fixture(const std::string& model, uint32_t blocks = 64) {
    backend = take(CudaBackend::create(unpriced_gpu_spec("test"), clock, nullptr));
    ModelStepConfig cfg;
    cfg.model = load_model_shape(
        ConfigNode::load_file(source_root() + "/configs/models/" + model + ".yaml"));
    cfg.layers_run = 1;
    cfg.max_tokens = 256;
    cfg.max_seqs = 16;
    cfg.return_logits = true;
    step = take(ModelStep::create(cfg, *backend));
    KvInit init;
    init.layers = cfg.model.layers;
    init.kv_bytes_per_token = cfg.model.kv_bytes_per_token();
    const uint64_t block_bytes = 16 * init.kv_bytes_per_token;
    pool = take(backend->device_malloc(blocks * block_bytes, "kv_cache"));
    REQUIRE(kernels::random_half(kernels::KvDtype::kBf16, pool, blocks * block_bytes / 2, 7,
                                 nullptr) == cudaSuccess);
    layout = block_major_layout(pool, init, 16, block_bytes, blocks);
  }
  // Two prefill chunks (33 tokens over nothing cached, 7 over 20 cached) and two decodes: one
  // step of each GEMM at m = 42, then m = 2 (and the LM head at 4 rows).
  std::vector<StepResult> run_steps() {
    std::vector<StepSeqInput> in(4);
    const uint32_t cached[] = {0, 20, 40, 9}, tokens[] = {33, 7, 1, 1};
    for (uint32_t s = 0; s < 4; ++s) {
      for (uint32_t b = 0; b < 4; ++b) in[s].table.push_back(static_cast<int32_t>(4 * s + b));
      in[s].cached = cached[s];
      for (uint32_t i = 0; i < tokens[s]; ++i)
        in[s].tokens.push_back(static_cast<int32_t>((s * 7919 + i * 104729 + 13) % 32000));
    }
    std::vector<StepResult> out;
    out.push_back(take(step->run(layout, in)));
    std::vector<StepSeqInput> two(in.begin(), in.begin() + 2);
    for (StepSeqInput& s : two) {
      s.cached += static_cast<uint32_t>(s.tokens.size());
      s.tokens = {s.tokens.back()};
    }
    out.push_back(take(step->run(layout, two)));
    return out;
  }
  SimClock clock;
  std::unique_ptr<CudaBackend> backend;
  std::unique_ptr<ModelStep> step;
  DevPtr pool = 0;
  KvLayout layout;
};

TEST_CASE("GEMM warm-up: one matmul per new algorithm, no memory kept, no result changed") {
  for (const char* model : {"llama-3.1-8b", "qwen2.5-7b"}) {  // without and with a QKV bias
    INFO(model);
    Fixture f(model);
    const std::vector<StepResult> cold = f.run_steps();
    ok(f.step->release_cached());
    const uint64_t held = f.backend->usage().physical_bytes;
    const uint32_t launched = take(f.step->warm_up_gemms());
    // Token counts 1..64 and 72..256 in steps of 8 (88 shapes) for four GEMMs, 1..16 for the LM
    // head: at least one algorithm each, never more than one matmul per shape.
    CHECK(launched >= 5);
    CHECK(launched <= 4 * 88 + 16);
    // Its buffers went back to the backend (empty_cache): the device holds what it held.
    CHECK(f.step->activation_stats().reserved_bytes == 0);
    CHECK(f.backend->usage().physical_bytes == held);
    // Every plan is cached now: a second warm-up finds the same algorithms.
    CHECK(take(f.step->warm_up_gemms()) == launched);
    // The steps after it give the same logits, bit for bit (their KV writes are the same).
    const std::vector<StepResult> warm = f.run_steps();
    REQUIRE(warm.size() == cold.size());
    for (size_t i = 0; i < warm.size(); ++i) {
      CHECK(warm[i].next_tokens == cold[i].next_tokens);
      CHECK(warm[i].logits == cold[i].logits);
    }
    ok(f.step->release_cached());
    ok(f.backend->device_free(f.pool));
  }
}

TEST_CASE("GEMM plans: a row count between the planned ones takes the covering plan's algorithm") {
  // plan_rows: each count to 64, then multiples of 8, and the largest.
  const std::vector<uint32_t> rows = kernels::LtGemm::plan_rows(90);
  CHECK(rows.size() == 64 + 3 + 1);
  CHECK(rows[63] == 64);
  CHECK(rows[64] == 72);
  CHECK(rows[66] == 88);
  CHECK(rows.back() == 90);
  CHECK(kernels::LtGemm::plan_rows(0).empty());
  CHECK(kernels::LtGemm::plan_rows(8) == std::vector<uint32_t>{1, 2, 3, 4, 5, 6, 7, 8});

  // One prefill chunk of 67 tokens (every GEMM at m = 67, between the plans of 64 and 72):
  // cold, cuBLASLt's heuristic plans m = 67 itself; after the warm-up it borrows the plan of 72.
  // The same tokens either way, and logits within bf16 rounding of each other.
  Fixture f("llama-3.1-8b");
  std::vector<StepSeqInput> in(1);
  for (int32_t b = 0; b < 5; ++b) in[0].table.push_back(b);
  for (uint32_t i = 0; i < 67; ++i)
    in[0].tokens.push_back(static_cast<int32_t>((i * 104729 + 13) % 32000));
  const StepResult cold = take(f.step->run(f.layout, in));
  Fixture g("llama-3.1-8b");
  (void)take(g.step->warm_up_gemms());
  const StepResult warm = take(g.step->run(g.layout, in));
  CHECK(warm.next_tokens == cold.next_tokens);
  REQUIRE(warm.logits.size() == cold.logits.size());
  REQUIRE(!cold.logits.empty());
  const auto value = [](uint16_t bf16) {  // the logits' bits as a float
    const uint32_t bits = uint32_t{bf16} << 16;
    float v = 0;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  };
  float most = 0, diff = 0;
  for (size_t i = 0; i < cold.logits.size(); ++i) {
    most = std::max(most, std::abs(value(cold.logits[i])));
    diff = std::max(diff, std::abs(value(warm.logits[i]) - value(cold.logits[i])));
  }
  CHECK(most > 0);
  CHECK(diff <= 0.02f * most);
  ok(f.step->release_cached());
  ok(g.step->release_cached());
  ok(f.backend->device_free(f.pool));
  ok(g.backend->device_free(g.pool));
}

}  // namespace
}  // namespace memsim

int main(int argc, char** argv) {
  return memsim::run_on_gpu("test_model_step_cuda", memsim::unpriced_gpu_spec("probe"), argc, argv);
}
