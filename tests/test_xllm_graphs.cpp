// xLLM's graph mechanisms beyond the shared spaces (seed xllm-multi-shape-vmm.md): the persistent
// input buffers of CudaGraphPersistentParam, the update() each replay makes, and the failed first
// design (one VA space whose allocation pointer is reset before each capture).
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "backends/sim/sim_backend.h"
#include "src/drivers/capture_runner.h"
#include "src/graph/registry.h"
#include "tests/tiny_model.h"
#include "workload/graph_inputs.h"

using namespace memsim;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

GpuSpec test_gpu() {
  GpuSpec g;
  g.name = "test";
  g.capacity = 8ull << 30;
  g.granularity = 2 * kMiB;
  g.va_space = 1ull << 46;
  for (auto& c : g.costs) c.per_call_us = 1.0;
  // A copy costs 2 us + 2 x bytes / 1000 (it reads and writes), a fill 1 us + bytes / 500.
  g.cost(Primitive::kCopy) = CostTerm{2.0, 0, 0, 1000.0};
  g.cost(Primitive::kFill) = CostTerm{1.0, 0, 0, 500.0};
  return g;
}

CaptureRunConfig xllm_config() {
  CaptureRunConfig c;
  c.model = test::tiny_llama();
  c.max_model_len = 2048;  // block tables: 2048 / 16 + 1 = 129 entries, 516 B a sequence
  c.kv_block_size = 16;
  c.capture_sizes = {8, 16};
  c.input_set = InputSet::kXllm;
  c.outputs = OutputLifetime::kWeak;
  return c;
}

// Keeps the runner's input tensors as they stand before teardown.
class InputsSeen final : public CaptureObserver {
 public:
  void before_teardown(const CapturedView& view) override { inputs = view.inputs; }
  std::vector<CheckedTensor> inputs;
};

struct Run {
  CaptureRunResult result;
  SimTime copy_time = 0, fill_time = 0;
  uint64_t copies = 0, fills = 0;
};

Run run(const CaptureRunConfig& c, const std::string& impl = "vmm_alias",
        const std::string& params = "{}") {
  SimClock clock;
  MetricsRecorder metrics(clock);
  SimBackend backend(test_gpu(), clock, &metrics);
  auto strategy =
      graph_strategies().find(impl)->parse(ConfigNode::parse(params, "<test>"))(backend);
  Run r;
  r.result = run_captures(c, backend, clock, *strategy, metrics);
  r.copy_time = backend.time_in(Primitive::kCopy);
  r.fill_time = backend.time_in(Primitive::kFill);
  r.copies = backend.calls_of(Primitive::kCopy);
  r.fills = backend.calls_of(Primitive::kFill);
  return r;
}

}  // namespace

// cuda_graph_executor_impl.cpp's CudaGraphPersistentParam at 16 tokens and 16 sequences of a
// hidden-1024 bf16 model with 2048 positions in blocks of 16.
TEST_CASE("xllm persistent inputs: the seed's seven buffers with xLLM's shapes", "[xllm]") {
  const auto specs = xllm_persistent_inputs(test::tiny_llama(), 2048, 16);
  std::vector<std::string> names;
  std::vector<uint64_t> bytes;
  for (const InputBufferSpec& s : specs) {
    names.push_back(s.name);
    bytes.push_back(s.bytes(16));
  }
  CHECK(names == std::vector<std::string>{"tokens", "positions", "new_cache_slots", "q_seq_lens",
                                          "kv_seq_lens", "block_tables", "hidden_states"});
  // int32 [16]; [16 + 1] for the cumulative lengths; [16, 129]; bf16 [16, 1024].
  CHECK(bytes == std::vector<uint64_t>{64, 64, 64, 68, 68, 16 * 129 * 4, 16 * 1024 * 2});
  CHECK(!specs[6].updated);  // hidden_states: the graph's output, not copied into

  SECTION("the runner allocates them once (persistent) or per shape, sized for the shape") {
    for (auto inputs : {InputBuffers::kPersistent, InputBuffers::kPerShape}) {
      CaptureRunConfig c = xllm_config();
      c.inputs = inputs;
      InputsSeen seen;
      c.observer = &seen;
      const Run r = run(c);
      REQUIRE(r.result.ok);
      CHECK(r.result.invariant_violation == "");
      uint64_t total = 0;
      for (const CheckedTensor& t : seen.inputs) total += t.bytes;
      // One set: 64 x 3 + 68 x 2 + 8,256 + 32,768 = 41,352 B. Per shape: the set at 8
      // (32 x 3 + 36 x 2 + 4,128 + 16,384 = 20,680 B) and at 16.
      if (inputs == InputBuffers::kPersistent) {
        CHECK(seen.inputs.size() == 7);
        CHECK(total == 41352);
      } else {
        CHECK(seen.inputs.size() == 14);
        CHECK(total == 20680 + 41352);
      }
    }
  }
  SECTION("a graph body writes its own inputs: the xllm set is refused with it") {
    CaptureRunConfig c = xllm_config();
    c.program_for = nullptr;
    class NoBody final : public GraphBody {
     public:
      Status prepare(uint32_t, const std::vector<CheckedTensor>&, StreamId) override { return {}; }
      Result<uint64_t> capture(uint32_t, const GraphProgram&, TensorAllocator&, StreamId) override {
        return uint64_t{0};
      }
    } body;
    c.body = &body;
    const Run r = run(c);
    CHECK(!r.result.ok);
    CHECK(r.result.failure == "a graph body writes its own inputs: input_set must be program");
  }
}

// update() before each replay: persistent_*.slice(0, 0, actual).copy_(input) for tokens,
// positions, new_cache_slots, q_seq_lens, kv_seq_lens and the block tables' rows, then the padding
// of tokens and new_cache_slots zeroed.
TEST_CASE("xllm update(): each replay copies the step's inputs into the buffers' front", "[xllm]") {
  CaptureRunConfig c = xllm_config();
  const Run captures_only = run(c);
  REQUIRE(captures_only.result.ok);
  CHECK(captures_only.result.input_update_ops == 0);

  c.replays = {5, 16};  // 5 sequences padded to the graph of 8, then a full graph of 16
  const Run r = run(c);
  REQUIRE(r.result.ok);
  CHECK(r.result.invariant_violation == "");
  CHECK(r.result.launches == captures_only.result.launches + 2);
  // Replay of 5 in 8: copies of 20, 20, 20, 24, 24 and 5 x 516 = 2,580 B; fills of 3 x 4 = 12 B
  // (tokens, new_cache_slots). Replay of 16: 64, 64, 64, 68, 68 and 8,256 B; no padding.
  const uint64_t copied = (20 + 20 + 20 + 24 + 24 + 2580) + (64 + 64 + 64 + 68 + 68 + 8256);
  CHECK(copied == 11272);
  CHECK(r.result.input_update_bytes == copied + 24);
  CHECK(r.result.input_update_ops == 14);  // 12 copies, 2 fills
  CHECK(r.copies - captures_only.copies == 12);
  // The step's input buffers (all but hidden_states, which the graph writes) are filled once
  // (6 fills) before the first update's 2 fills.
  CHECK(r.fills - captures_only.fills == 6 + 2);
  // A copy: 2 us + 2 x bytes / 1000 us = 2,000 + 2 x bytes ns; a fill 1,000 + 2 x bytes ns.
  const SimTime copy_ns = 12 * 2000 + 2 * copied;
  const SimTime fill_ns = 2 * 1000 + 2 * 24;
  CHECK(copy_ns == 46544);
  CHECK(r.result.input_update_time == copy_ns + fill_ns);
  CHECK(r.copy_time - captures_only.copy_time == copy_ns);

  SECTION("a replay no captured shape holds is an error value") {
    c.replays = {17};
    const Run bad = run(c);
    CHECK(!bad.result.ok);
    CHECK(bad.result.failure == "replay of 17 sequences: no captured shape holds it");
  }
}

// Seed §1.4: reset_allocation_pointer() before each capture, one VA space. PyTorch's
// allocated_blocks maps each address to one block; the second shape's pool is handed the first
// shape's addresses while the first shape's held outputs still live there.
TEST_CASE("xllm's failed first design: one space, pointer reset, invalid device pointer",
          "[xllm]") {
  CaptureRunConfig c = xllm_config();
  c.outputs = OutputLifetime::kStrong;  // the graphs keep their outputs, as xLLM's did
  c.capture_sizes = {8, 8 + 8};
  const Run ok = run(c, "vmm_alias");
  REQUIRE(ok.result.ok);
  CHECK(ok.result.invariant_violation == "");

  const Run failed = run(c, "vmm_alias", "{spaces: one}");
  CHECK(!failed.result.ok);
  CHECK(!failed.result.out_of_memory);
  INFO(failed.result.failure);
  CHECK(failed.result.failure.find("free: invalid device pointer 0x") == 0);
  CHECK(failed.result.failure.find("pools 0 and 1 both handed out this address") !=
        std::string::npos);
  // memsim's own overlap check saw the second shape's tensor land on a live one first.
  CHECK(failed.result.invariant_violation.find("overlaps live tensor") != std::string::npos);
  // Nothing leaks: the space and its handles are released whatever the bookkeeping said.
  CHECK(failed.result.released_all);

  SECTION("with no tensor held across captures the reset goes unnoticed") {
    c.outputs = OutputLifetime::kWeak;
    const Run weak = run(c, "vmm_alias", "{spaces: one}");
    CHECK(weak.result.ok);
    CHECK(weak.result.invariant_violation == "");
    // One space: the virtual bytes are the physical ones, beside the default pool's 2 MiB small
    // segment that holds the 41,352 B of inputs.
    CHECK(weak.result.peak_virtual_mapped == weak.result.peak_strategy_reserved + 2 * kMiB);
  }
}
