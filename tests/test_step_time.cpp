// Roofline step-time model: an exact hand-computed case, Llama-3.1-8B / H200 sanity figures, and
// the GPU file's compute: section (loading, errors that name file:line:key, the YAML writer).
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>

#include "workload/step_time.h"
#include "src/config/loaders.h"
#include "tests/config_test_util.h"

using namespace memsim;
using namespace memsim::test;

namespace {

// 1 layer, hidden 4, 2 heads / 1 KV head of dim 2, intermediate 8, vocab 16, bf16, untied.
ModelShape tiny_model() {
  ModelShape m;
  m.name = "tiny";
  m.layers = 1;
  m.hidden = 4;
  m.heads = 2;
  m.kv_heads = 1;
  m.head_dim = 2;
  m.intermediate = 8;
  m.vocab = 16;
  return m;
}

// Achieved 1 FLOP/ns and 2 B/ns, 1 us overhead, PCIe 1 B/ns.
GpuSpec round_gpu() {
  GpuSpec g;
  g.name = "round";
  g.compute.peak_flops = 2e9;
  g.compute.flops_efficiency = 0.5;
  g.compute.hbm_bytes_per_s = 4e9;
  g.compute.bandwidth_efficiency = 0.5;
  g.compute.step_overhead_us = 1;
  g.compute.pcie_bytes_per_s = 1e9;
  return g;
}

ModelShape llama8b() {
  return load_model_shape(ConfigNode::load_file(model_file()));
}
GpuSpec h200() {
  return load_gpu_spec(ConfigNode::load_file(gpu_file()));
}

StepShape decode(uint32_t batch, uint64_t context) {
  return StepShape{batch, batch, uint64_t{batch} * context, static_cast<double>(batch) * context};
}

StepShape prefill(uint64_t tokens) {
  return StepShape{1, tokens, tokens, static_cast<double>(tokens) * (tokens + 1) / 2};
}

// The message of the ConfigError that loading `yaml` as a GPU file throws.
std::string gpu_error(const std::string& yaml) {
  try {
    load_gpu_spec(ConfigNode::parse(yaml, "gpu.yaml"));
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError");
  return "";
}

}  // namespace

TEST_CASE("step time: a hand-computed case, exact to the nanosecond", "[step_time]") {
  const StepTimeModel m(tiny_model(), round_gpu());
  // Per layer: q 4x4 + k, v 2 x 4x2 + o 4x4 + gate/up/down 3 x 4x8 = 144; lm_head 16x4 = 64.
  CHECK(m.body_matmul_params() == 144);
  CHECK(m.lm_head_params() == 64);
  // weight_bytes = 2 x (embedding 64 + layer 144 + 2 norms x 4 + final norm 4 + lm_head 64)
  // = 568; the untied embedding table (128 B) is not read whole.
  CHECK(tiny_model().weight_bytes() == 568);
  CHECK(m.static_weight_bytes() == 440);

  // 2 sequences, 3 new tokens, 10 KV tokens read, 5 attention pairs.
  const StepBreakdown b = m.breakdown(StepShape{2, 3, 10, 5});
  // FLOPs: 2 x 144 x 3 + 2 x 64 x 2 + 4 x 1 layer x 2 heads x 2 dims x 5 = 864 + 256 + 80.
  CHECK(b.flops == 1200);
  // Bytes: 440 + 3 embedding rows x 8 + (10 read + 3 written) x 8 KV bytes per token.
  CHECK(b.bytes == 568);
  CHECK(b.compute_ns == 1200);  // 1 FLOP/ns
  CHECK(b.memory_ns == 284);    // 2 B/ns
  CHECK(b.overhead_ns == 1000);
  CHECK(b.total_ns == 2200);
  CHECK(b.bound == StepBound::kCompute);
  CHECK(m.step_time(StepShape{2, 3, 10, 5}) == 2200);
  CHECK(m.pcie_transfer(12345) == 12345);
  // Attention share: max(80 FLOPs at 1/ns, (10 + 3) x 8 KV bytes at 2 B/ns) = max(80, 52).
  CHECK(m.attention_time(StepShape{2, 3, 10, 5}) == 80);
  CHECK(m.attention_time(StepShape{2, 3, 1000, 5}) == 4012);  // (1000 + 3) x 8 / 2
  CHECK(m.attention_time(StepShape{}) == 0);

  // No token computed: no step.
  CHECK(m.step_time(StepShape{}) == 0);
  CHECK(m.breakdown(StepShape{}).bytes == 0);

  // A tied model reads its (shared) table once, for the lm_head, and no embedding rows.
  ModelShape tied = tiny_model();
  tied.tie_embeddings = true;
  const StepTimeModel t(tied, round_gpu());
  CHECK(t.static_weight_bytes() == tied.weight_bytes());
  CHECK(t.breakdown(StepShape{2, 3, 10, 5}).bytes == tied.weight_bytes() + 13 * 8);
}

TEST_CASE("step time: a spec without compute figures is refused", "[step_time]") {
  GpuSpec g = round_gpu();
  g.compute.hbm_bytes_per_s = 0;
  CHECK_THROWS_AS(StepTimeModel(tiny_model(), g), std::invalid_argument);
  g = round_gpu();
  g.compute.step_overhead_us = -1;
  CHECK_THROWS_AS(StepTimeModel(tiny_model(), g), std::invalid_argument);
}

TEST_CASE("step time: Llama-3.1-8B on an H200", "[step_time]") {
  const ModelShape model = llama8b();
  const StepTimeModel m(model, h200());
  // 32 x (2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336) and 128256 x 4096.
  CHECK(m.body_matmul_params() == 6979321856ull);
  CHECK(m.lm_head_params() == 525336576ull);
  CHECK(m.static_weight_bytes() == model.weight_bytes() - 128256ull * 4096 * 2);

  SECTION("decode at batch 1 is memory-bound, ~4 ms (15 GB of weights at 0.8 x 4.8 TB/s)") {
    const StepBreakdown b = m.breakdown(decode(1, 1000));
    CHECK(b.bound == StepBound::kMemory);
    CHECK(b.total_ns > 3'000'000);
    CHECK(b.total_ns < 5'000'000);
    CHECK(b.memory_ns > 20 * b.compute_ns);
  }
  SECTION("decode stays memory-bound at batch 64 and 256, and grows with the batch") {
    const SimTime t1 = m.step_time(decode(1, 1000));
    const StepBreakdown b64 = m.breakdown(decode(64, 1000));
    const StepBreakdown b256 = m.breakdown(decode(256, 1000));
    CHECK(b64.bound == StepBound::kMemory);
    CHECK(b256.bound == StepBound::kMemory);
    CHECK(t1 < b64.total_ns);
    CHECK(b64.total_ns < b256.total_ns);
    // Weights are shared by the batch: 256 decodes cost far less than 256 single ones.
    CHECK(b256.total_ns < 4 * t1);
  }
  SECTION("an 8192-token prefill is compute-bound") {
    const StepBreakdown b = m.breakdown(prefill(8192));
    CHECK(b.bound == StepBound::kCompute);
    CHECK(b.compute_ns > 10 * b.memory_ns);
    CHECK(b.total_ns > 100'000'000);  // ~1.3e14 FLOPs at 0.6 x 989.4 TFLOP/s: ~0.23 s
    CHECK(b.total_ns < 400'000'000);
  }
  SECTION("monotonic in new tokens and in KV tokens read") {
    SimTime prev = 0;
    for (uint64_t tokens : {1, 2, 16, 128, 512, 2048, 8192}) {
      const SimTime t = m.step_time(prefill(tokens));
      CHECK(t > prev);
      prev = t;
    }
    prev = 0;
    for (uint64_t context : {1, 100, 1000, 10000, 100000}) {
      const SimTime t = m.step_time(decode(32, context));
      CHECK(t > prev);
      prev = t;
    }
  }
  SECTION("PCIe swap: 1 GiB at 55 GB/s") {
    CHECK(m.pcie_transfer(1ull << 30) == 19522579);  // 2^30 / 55e9 s, rounded to ns
    CHECK(m.pcie_transfer(0) == 0);
  }
}

TEST_CASE("gpu file: the compute section", "[step_time][config]") {
  const std::string gpu = read_text(gpu_file());
  SECTION("h200 values") {
    const ComputeSpec c = h200().compute;
    CHECK(c.peak_flops == Approx(989.4e12));
    CHECK(c.hbm_bytes_per_s == Approx(4.8e12));
    CHECK(c.pcie_bytes_per_s == Approx(55e9));
    CHECK(c.flops_efficiency == 0.6);
    CHECK(c.bandwidth_efficiency == 0.8);
    CHECK(c.step_overhead_us == 50);
  }
  SECTION("optional keys take the documented defaults") {
    std::string t = replace_once(gpu, "  flops_efficiency: 0.6\n", "");
    t = replace_once(t, "  bandwidth_efficiency: 0.8\n", "");
    t = replace_once(t, "  step_overhead_us: 50\n", "");
    const ComputeSpec c = load_gpu_spec(ConfigNode::parse(t, "gpu.yaml")).compute;
    CHECK(c.flops_efficiency == ComputeSpec::kDefaultFlopsEfficiency);
    CHECK(c.bandwidth_efficiency == ComputeSpec::kDefaultBandwidthEfficiency);
    CHECK(c.step_overhead_us == ComputeSpec::kDefaultStepOverheadUs);
  }
  SECTION("a typo names file, line and key") {
    const std::string t = replace_once(gpu, "  hbm_gbps: 4800", "  hbm_gpbs: 4800");
    CHECK(gpu_error(t) == fmt::format("gpu.yaml:{}: compute.hbm_gpbs: unknown key 'hbm_gpbs' "
                                      "(did you mean 'hbm_gbps'?)",
                                      line_of(t, "  hbm_gpbs:")));
  }
  SECTION("a missing required key") {
    const std::string t = replace_once(gpu, "  pcie_gbps: 55\n", "");
    CHECK(gpu_error(t) == fmt::format("gpu.yaml:{}: compute: missing required key 'pcie_gbps'",
                                      line_of(t, "  dense_tflops:")));
  }
  SECTION("an efficiency above 1") {
    const std::string t = replace_once(gpu, "  flops_efficiency: 0.6", "  flops_efficiency: 1.5");
    CHECK_THAT(gpu_error(t), Catch::StartsWith(fmt::format("gpu.yaml:{}: compute.flops_efficiency:",
                                                           line_of(t, "  flops_efficiency:"))));
  }
  SECTION("no compute section") {
    const std::string t = gpu.substr(0, gpu.find("\ncompute:") + 1);
    CHECK_THAT(gpu_error(t), Catch::EndsWith("missing required key 'compute'"));
  }
  SECTION("format_compute_yaml reads back to the same values") {
    const GpuSpec g = h200();
    const std::string t =
        gpu.substr(0, gpu.find("\ncompute:") + 1) + format_compute_yaml(g.compute);
    const ComputeSpec c = load_gpu_spec(ConfigNode::parse(t, "gpu.yaml")).compute;
    CHECK(c.peak_flops == g.compute.peak_flops);
    CHECK(c.hbm_bytes_per_s == g.compute.hbm_bytes_per_s);
    CHECK(c.pcie_bytes_per_s == g.compute.pcie_bytes_per_s);
    CHECK(c.flops_efficiency == g.compute.flops_efficiency);
    CHECK(c.bandwidth_efficiency == g.compute.bandwidth_efficiency);
    CHECK(c.step_overhead_us == g.compute.step_overhead_us);
  }
}
