// The executor's decode-step allocation program (exact sizes and order), graph bodies in the
// capture runner (a body that follows the program, one that does not, one that fails), and the
// shapes experiment's graph_body key.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <map>

#include "backends/sim/sim_backend.h"
#include "src/app/shapes_experiment.h"
#include "src/drivers/capture_runner.h"
#include "src/graph/registry.h"
#include "tests/config_test_util.h"
#include "workload/executor_program.h"
#include "workload/tensor_parallel.h"

using namespace memsim;
using namespace memsim::test;

namespace {

ModelShape tiny() {
  ModelShape m;
  m.name = "tiny";
  m.layers = 2;
  m.hidden = 256;
  m.heads = 4;
  m.kv_heads = 2;
  m.head_dim = 64;
  m.intermediate = 512;
  m.vocab = 1000;
  return m;
}

ExecutorProgramOptions options() {
  ExecutorProgramOptions o;
  o.max_context = 1024;
  o.kv_block_size = 16;
  o.decode_workspace = [](uint32_t b) { return b < 4 ? uint64_t{b} * 1000 : 0; };
  return o;
}

std::vector<std::string> trace(const GraphProgram& g) {
  std::vector<std::string> out;
  for (const ProgramOp& op : g.ops)
    out.push_back(fmt::format("{}{} {}", op.kind == ProgramOp::Kind::kAlloc ? "+" : "-",
                              g.tensors[op.tensor].name, g.tensors[op.tensor].bytes));
  return out;
}

}  // namespace

TEST_CASE("executor program: ModelStep's decode step, op by op") {
  const ShapeProgram p = make_executor_decode_program(tiny(), 2, options());
  REQUIRE(p.inputs.size() == 1);
  // ids, positions 16 B each; slots 16; indptr 16; kv_lens 16; tables 2 x 64 x 4 = 512; last 16.
  CHECK(p.inputs[0].bytes == 16 + 16 + 16 + 16 + 16 + 512 + 16);
  CHECK(p.inputs[0].bytes == executor_metadata_bytes(2, 64));
  REQUIRE(p.graphs.size() == 1);
  const GraphProgram& g = p.graphs[0];
  CHECK(g.name == "b2.full");
  CHECK(validate(g).empty());
  // hidden 2 x 256 x 2 = 1024; qkv 2 x (4 + 4) x 64 x 2 = 2048; q, attn 1024; gate_up 4096;
  // act 2048; logits 2 x 1000 x 2 = 4000; next 8; the plan's workspace 2000.
  const std::vector<std::string> want = {"+attn_workspace 2000",
                                         "+residual 1024",
                                         "+layer0.input_norm 1024",
                                         "+layer0.qkv 2048",
                                         "-layer0.input_norm 1024",
                                         "+layer0.q 1024",
                                         "+layer0.attn 1024",
                                         "-layer0.q 1024",
                                         "-layer0.qkv 2048",
                                         "+layer0.o 1024",
                                         "-layer0.attn 1024",
                                         "+layer0.gate_up 4096",
                                         "-layer0.o 1024",
                                         "+layer0.act 2048",
                                         "-layer0.gate_up 4096",
                                         "+layer0.down 1024",
                                         "-layer0.act 2048",
                                         "+layer1.qkv 2048",
                                         "-layer0.down 1024",
                                         "+layer1.q 1024",
                                         "+layer1.attn 1024",
                                         "-layer1.q 1024",
                                         "-layer1.qkv 2048",
                                         "+layer1.o 1024",
                                         "-layer1.attn 1024",
                                         "+layer1.gate_up 4096",
                                         "-layer1.o 1024",
                                         "+layer1.act 2048",
                                         "-layer1.gate_up 4096",
                                         "+layer1.down 1024",
                                         "-layer1.act 2048",
                                         "+last 1024",
                                         "-layer1.down 1024",
                                         "+logits 4000",
                                         "-last 1024",
                                         "+next 8",
                                         "-logits 4000",
                                         "-next 8",
                                         "-residual 1024",
                                         "-attn_workspace 2000"};
  CHECK(trace(g) == want);
  for (const TensorSpec& t : g.tensors) CHECK(t.role == TensorRole::kIntermediate);
  // Its nodes: the embedding, 11 per layer (the split plan's combine included), 5 at the end.
  CHECK(g.body_nodes == 1 + 2 * 11 + 5);
  // No workspace when the plan does not split, and no combine.
  const ShapeProgram big = make_executor_decode_program(tiny(), 8, options());
  CHECK(big.graphs[0].tensors[0].name == "residual");
  CHECK(big.graphs[0].body_nodes == 1 + 2 * 10 + 5);
  // q and k norms (Qwen3): two more per layer.
  ModelShape qk = tiny();
  qk.qk_norm = true;
  CHECK(make_executor_decode_program(qk, 2, options()).graphs[0].body_nodes == 1 + 2 * 13 + 5);
  CHECK(executor_decode_nodes(qk, false) == 1 + 2 * 12 + 5);
  CHECK_THROWS_AS(make_executor_decode_program(tiny(), 0, options()), std::invalid_argument);
  ModelShape fp32 = tiny();
  fp32.dtype = DType::kFP32;
  CHECK_THROWS_WITH(make_executor_decode_program(fp32, 1, options()), Catch::Contains("16-bit"));
  CHECK(graph_context_for(8192) == 32768);
  CHECK(graph_context_for(131072) == 131072);
}

TEST_CASE("executor program: a tensor-parallel rank's collectives, op by op") {
  // tiny at TP 2: 2 heads, 1 KV head, intermediate 256 and 512 vocabulary rows a rank (1000
  // padded to 1024).
  const TensorParallelShard shard = *shard_tensor_parallel(tiny(), 2);
  ExecutorProgramOptions o = options();
  o.tensor_parallel = 2;
  o.vocab = 1000;
  o.vocab_padded = shard.vocab_padded;
  REQUIRE(o.vocab_padded == 1024);
  const GraphProgram g = make_executor_decode_program(shard.rank, 8, o).graphs[0];
  CHECK(validate(g).empty());
  const std::vector<std::string> t = trace(g);
  // hidden 8 x 256 x 2 = 4096; qkv 8 x (2 + 2) x 64 x 2 = 4096; q, attn 2048; gate_up 8192;
  // act 4096; logits.partial 8 x 512 x 2 = 8192; gathered and logits 8 x 1024 x 2 = 16384.
  const std::vector<std::string> head(t.begin(), t.begin() + 20);
  CHECK(head == std::vector<std::string>{"+residual.partial 4096",
                                         "+residual 4096",
                                         "-residual.partial 4096",
                                         "+layer0.input_norm 4096",
                                         "+layer0.qkv 4096",
                                         "-layer0.input_norm 4096",
                                         "+layer0.q 2048",
                                         "+layer0.attn 2048",
                                         "-layer0.q 2048",
                                         "-layer0.qkv 4096",
                                         "+layer0.o.partial 4096",
                                         "+layer0.o 4096",
                                         "-layer0.o.partial 4096",
                                         "-layer0.attn 2048",
                                         "+layer0.gate_up 8192",
                                         "-layer0.o 4096",
                                         "+layer0.act 4096",
                                         "-layer0.gate_up 8192",
                                         "+layer0.down.partial 4096",
                                         "+layer0.down 4096"});
  const std::vector<std::string> tail(t.end() - 13, t.end());
  CHECK(tail == std::vector<std::string>{"-layer1.act 4096", "+last 4096", "-layer1.down 4096",
                                         "+logits.partial 8192", "-last 4096",
                                         "+logits.gathered 16384", "-logits.partial 8192",
                                         "+logits 16384", "-logits.gathered 16384", "+next 32",
                                         "-logits 16384", "-next 32", "-residual 4096"});
  // 1 + 2 x 10 + 5 nodes, 5 all-reduces, the all-gather and the two ranks' copies.
  CHECK(g.body_nodes == 1 + 2 * 10 + 5 + 5 + 1 + 2);
  o.vocab_padded = 1000;  // not the shard's rows x tp
  CHECK_THROWS_WITH(make_executor_decode_program(shard.rank, 8, o),
                    Catch::Contains("vocab_padded"));
}

namespace {

// A body that replays the program's ops through the runner's allocator, optionally changing
// one allocation's size or failing at one op.
class ProgramBody final : public GraphBody {
 public:
  int resize_op = -1, fail_op = -1;
  int64_t node_error = 0;  // added to the program's body_nodes in what capture() returns
  uint32_t prepared = 0, captured = 0;
  Status prepare(uint32_t, const std::vector<CheckedTensor>& inputs, StreamId) override {
    ++prepared;
    if (inputs.size() != 1) return make_error(ErrorCode::kInvalidArgument, "one input");
    return {};
  }
  Result<uint64_t> capture(uint32_t, const GraphProgram& g, TensorAllocator& mem,
                           StreamId) override {
    ++captured;
    std::map<uint32_t, DevPtr> ptr;
    for (size_t i = 0; i < g.ops.size(); ++i) {
      if (int(i) == fail_op) return make_error(ErrorCode::kDriverError, "injected");
      const ProgramOp& op = g.ops[i];
      if (op.kind == ProgramOp::Kind::kFree) {
        MEMSIM_TRY(mem.free(ptr[op.tensor]));
        continue;
      }
      const uint64_t bytes = g.tensors[op.tensor].bytes + (int(i) == resize_op ? 512 : 0);
      MEMSIM_ASSIGN_OR_RETURN(ptr[op.tensor], mem.allocate(bytes));
    }
    return uint64_t(int64_t(g.body_nodes) + node_error);
  }
};

// A GPU whose only cost is 1 us per captured node.
GpuSpec node_priced_gpu() {
  GpuSpec gpu;
  gpu.name = "test";
  gpu.capacity = 8ull << 30;
  gpu.granularity = 2ull << 20;
  gpu.va_space = 1ull << 46;
  gpu.capture_per_node_us = 1.0;
  return gpu;
}

// `end_capture_ns`, when set, receives the simulated end_capture time.
CaptureRunResult run_body(GraphBody* body, const std::string& impl = "shared_pool",
                          GraphRunners runners = GraphRunners::kFull,
                          SimTime* end_capture_ns = nullptr) {
  const GpuSpec gpu = node_priced_gpu();
  SimClock clock;
  MetricsRecorder metrics(clock);
  SimBackend backend(gpu, clock, &metrics);
  auto strategy = graph_strategies().find(impl)->parse(ConfigNode::parse("{}", "<test>"))(backend);
  CaptureRunConfig c;
  c.model = tiny();
  c.capture_sizes = {1, 2, 4, 8};
  c.runners = runners;
  c.program_for = [](uint32_t b) { return make_executor_decode_program(tiny(), b, options()); };
  c.body = body;
  CaptureRunResult r = run_captures(c, backend, clock, *strategy, metrics);
  if (end_capture_ns) *end_capture_ns = backend.time_in(Primitive::kEndCapture);
  return r;
}

}  // namespace

TEST_CASE("capture runner: a graph body's allocations are checked against the program") {
  ProgramBody ok;
  SimTime body_ns = 0, fill_ns = 0;
  const CaptureRunResult a = run_body(&ok, "shared_pool", GraphRunners::kFull, &body_ns);
  CHECK(a.ok);
  CHECK(a.invariant_violation.empty());
  CHECK(a.released_all);
  CHECK(ok.prepared == 4);
  CHECK(ok.captured == 4);
  // The same footprint as the program run without a body (sim fills), and the same nodes: the
  // body's returned count, or the fills and input reads topped up to the program's body_nodes.
  // Sizes 1 and 2 split the KV (a workspace: 28 nodes), 4 and 8 do not (26).
  const CaptureRunResult plain = run_body(nullptr, "shared_pool", GraphRunners::kFull, &fill_ns);
  CHECK(plain.ok);
  CHECK(plain.peak_physical == a.peak_physical);
  CHECK(body_ns == (28 + 28 + 26 + 26) * 1000);
  CHECK(fill_ns == body_ns);
  for (const std::string impl : {"private_pools", "vmm_alias", "graph_mem_nodes"}) {
    ProgramBody again;
    const CaptureRunResult r = run_body(&again, impl);
    CHECK(r.ok);
    CHECK(r.invariant_violation.empty());
    CHECK(r.released_all);
  }

  ProgramBody off;
  off.resize_op = 3;
  const CaptureRunResult b = run_body(&off);
  CHECK(b.ok);  // the capture itself works; the difference is a violation
  CHECK(b.invariant_violation ==
        "graph b1.full: op 3 of the body is alloc #3 of 1536 bytes, the program's is alloc #3 "
        "of 1024 bytes (layer0.qkv)");

  // Nodes other than the program's are reported, and priced as the body's.
  ProgramBody extra;
  extra.node_error = 3;
  SimTime extra_ns = 0;
  const CaptureRunResult n = run_body(&extra, "shared_pool", GraphRunners::kFull, &extra_ns);
  CHECK(n.ok);
  CHECK(n.invariant_violation.empty());
  REQUIRE(n.body_nodes.size() == 4);
  CHECK(n.body_nodes[0].graph == "b1.full");
  CHECK(n.body_nodes[0].batch == 1);
  CHECK(n.body_nodes[0].body == 31);
  CHECK(n.body_nodes[0].program == 28);
  CHECK(n.body_nodes[3].body == 29);
  CHECK(n.body_nodes[3].program == 26);
  CHECK(extra_ns == body_ns + 4 * 3 * 1000);
  CHECK(a.body_nodes.size() == 4);
  CHECK(plain.body_nodes.empty());  // fills: no body

  ProgramBody failing;
  failing.fail_op = 5;
  const CaptureRunResult f = run_body(&failing);
  CHECK_FALSE(f.ok);
  CHECK(f.failure == "injected");
  CHECK(f.released_all);  // what the failed body held was freed inside the capture

  ProgramBody piecewise;
  const CaptureRunResult p = run_body(&piecewise, "shared_pool", GraphRunners::kPiecewise);
  CHECK_FALSE(p.ok);
  CHECK(p.failure.find("full graphs only") != std::string::npos);
}

TEST_CASE("shapes experiment: graph_body: executor") {
  const std::string shapes = source_root() + "/experiments/shapes.yaml";
  CHECK_THROWS_WITH(load_shapes_config(shapes, {"graph_body=executor"}),
                    Catch::Contains("shapes.yaml") && Catch::Contains("graph_body") &&
                        Catch::Contains("set sweep.graphs: full"));
  CHECK_THROWS_WITH(load_shapes_config(shapes, {"graph_body=exec"}),
                    Catch::Contains("is not one of: fill, executor"));
  // The main job keeps xLLM's input buffers, which the executor's step does not read.
  CHECK_THROWS_WITH(load_shapes_config(shapes, {"graph_body=executor", "sweep.graphs=full"}),
                    Catch::Contains("input_set: xllm needs graph_body: fill"));
  const ShapesConfig c =
      load_shapes_config(shapes, {"graph_body=executor", "sweep.graphs=full", "input_set=program"});
  CHECK(c.executor_body);
  CHECK(c.executor_context == 32768);
  const CaptureRunConfig rc = run_config(c, c.table, nullptr);
  REQUIRE(rc.program_for);
  CHECK(rc.gemm_workspace_bytes == 0);
  const ShapeProgram p = rc.program_for(256);
  CHECK(p.graphs.size() == 1);
  // The H200 launch of 256 sequences at 32K (kernels::plan_decode_graph): 256 rows of work,
  // 2 + 2 x 256 + 256 words.
  CHECK(p.inputs[0].bytes == executor_metadata_bytes(256, 2048, 770));
  // Every strategy runs the executor's program in the simulation.
  ShapesConfig small = c;
  small.capture_sizes = {1, 8, 64};
  small.variants = {small.table};
  const ShapesResults r = run_shapes(small);
  for (const RunRecord& run : r.runs) {
    CHECK(run.result.ok);
    CHECK(run.result.invariant_violation.empty());
  }
}

TEST_CASE("sim backend: nodes enqueued beside the backend count in the capture") {
  GpuSpec gpu = node_priced_gpu();
  gpu.upload_per_node_us = 0.5;
  SimClock clock;
  SimBackend backend(gpu, clock, nullptr);
  const StreamId s = *backend.create_stream();
  const Status outside = backend.add_captured_nodes(s, 3);
  REQUIRE_FALSE(outside.ok());
  CHECK(outside.error().code == ErrorCode::kInvalidState);
  CHECK(outside.error().message == "add_captured_nodes: stream 1 is not capturing");
  REQUIRE(backend.begin_capture(s).ok());
  REQUIRE(backend.add_captured_nodes(s, 40).ok());
  REQUIRE(backend.add_captured_nodes(s, 2).ok());
  CHECK(backend.nodes_in_capture(s) == 42);
  const auto g = backend.end_capture(s);
  REQUIRE(g.ok());
  CHECK(backend.nodes_in_capture(s) == 0);
  CHECK(backend.time_in(Primitive::kEndCapture) == 42 * 1000);
  REQUIRE(backend.launch(*g, s).ok());  // the first launch uploads them
  CHECK(backend.time_in(Primitive::kLaunch) == 21 * 1000);
  CHECK(backend.last_call().nodes == 42);
}
