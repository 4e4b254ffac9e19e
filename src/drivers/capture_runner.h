// The capture runner: drives one graph-memory strategy through the captures (and replays) of a
// model's batch shapes on a backend, checking invariants, and records the footprint curve.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/sim/cost_model.h"
#include "core/clock.h"
#include "core/metrics.h"
#include "src/graph/graph_memory_strategy.h"
#include "workload/alloc_program.h"
#include "workload/graph_inputs.h"
#include "workload/model_shape.h"

namespace memsim {

enum class CaptureOrder : uint8_t { kArrival, kLargeFirst, kList };
enum class Arrival : uint8_t { kFixed, kDynamic };
enum class InputBuffers : uint8_t { kPerShape, kPersistent };
enum class OutputLifetime : uint8_t { kStrong, kWeak };
enum class GraphRunners : uint8_t { kFull, kPiecewise, kBoth };
const char* to_string(CaptureOrder v);
const char* to_string(Arrival v);
const char* to_string(InputBuffers v);
const char* to_string(OutputLifetime v);
const char* to_string(GraphRunners v);

class GraphBody;

struct DynamicArrival {
  uint32_t arrivals = 2000;             // batches drawn
  double mean_interarrival_us = 20000;  // exponential gaps between batches
};

// Allocation programs by (batch, mode), generated once and shared by the runs of a sweep (the
// programs depend only on the model and program options, which a sweep holds fixed).
class ProgramCache {
 public:
  const ShapeProgram& get(const ModelShape& model, uint32_t batch, const ProgramOptions& o);

 private:
  std::map<std::pair<uint32_t, GraphMode>, ShapeProgram> programs_;
};

// A tensor whose contents a replay check can verify: it was filled with `pattern`.
struct CheckedTensor {
  DevPtr ptr = 0;
  uint64_t bytes = 0;
  uint32_t pattern = 0;
  uint32_t batch = 0;
  std::string name;
};

// What the runner holds after its captures, for replay checks before teardown.
struct CapturedView {
  StreamId stream;
  std::vector<uint32_t> shapes;  // captured, in capture order
  const std::map<uint32_t, std::vector<GraphHandle>>* graphs = nullptr;  // per shape, in order
  std::vector<CheckedTensor> inputs;  // filled outside graphs: must survive every replay
  // The last graph's outputs per shape: rewritten by each replay of the shape. Held (strong)
  // outputs must also survive other shapes' replays when held_preserved is true.
  std::map<uint32_t, std::vector<CheckedTensor>> outputs;
  bool outputs_held = false;
  bool held_preserved = true;
  GraphBody* body = nullptr;  // set: inputs are rewritten by body->prepare before each replay
};

// Optional hooks for a backend-specific harness (the CUDA validation).
class CaptureObserver {
 public:
  virtual ~CaptureObserver() = default;
  virtual void after_shape(uint32_t /*batch*/) {}
  virtual void before_teardown(const CapturedView& /*view*/) {}
};

// Real work in place of the fill kernels (the shapes experiment's graph_body: executor, on the
// CUDA backend): the runner calls prepare() outside any capture before it captures or replays a
// shape (the body writes the shape's inputs: they are rewritten, so no input check applies),
// and capture() inside the capture of each of the shape's graphs, which enqueues the graph's
// work on `stream` and allocates and frees its tensors through `mem` (the strategy, through the
// runner, which checks overlaps and records the order). The runner checks that
// the body's allocations and frees are the program's, op for op and byte for byte. capture()
// returns the graph nodes it enqueued itself (beside the backend's calls, which the backend
// counts); the runner adds them to the backend's capture (Backend::add_captured_nodes) and
// reports them beside the program's body_nodes (CaptureRunResult::body_nodes).
class GraphBody {
 public:
  virtual ~GraphBody() = default;
  virtual Status prepare(uint32_t batch, const std::vector<CheckedTensor>& inputs,
                         StreamId stream) = 0;
  virtual Result<uint64_t> capture(uint32_t batch, const GraphProgram& graph, TensorAllocator& mem,
                                   StreamId stream) = 0;
};

struct CaptureRunConfig {
  ModelShape model;
  uint64_t gemm_workspace_bytes = 0;
  // Device memory that stays taken while the graphs are captured (the model's weights): it counts
  // against the GPU's capacity (run_captures_on_sim), never in the footprints.
  uint64_t resident_bytes = 0;
  uint32_t max_model_len = 8192;
  uint32_t kv_block_size = 16;
  // Tensor parallelism: `model` is one rank's shard and the generated programs hold the
  // collectives' outputs (ProgramOptions::tensor_parallel, vocab_padded, vocab).
  uint32_t tensor_parallel = 1;
  uint64_t vocab_padded = 0;
  uint64_t vocab = 0;
  // Pipeline parallelism: `model` holds one stage's layers (ProgramOptions::first_stage,
  // last_stage).
  bool first_stage = true;
  bool last_stage = true;
  std::vector<uint32_t> capture_sizes;  // the graph shapes (padded batch sizes)
  CaptureOrder order = CaptureOrder::kArrival;
  std::vector<uint32_t> order_list;  // for kList: a permutation of capture_sizes
  Arrival arrival = Arrival::kFixed;
  DynamicArrival dynamic;
  // Fixed arrival: batches (actual sequence counts, 1 to the largest capture size) replayed after
  // the captures, in order, each padded to the next capture size.
  std::vector<uint32_t> replays;
  InputBuffers inputs = InputBuffers::kPersistent;
  uint32_t inputs_sized_for = 0;  // persistent inputs' batch; 0 = the largest capture size
  // Which engine's input buffers (workload/graph_inputs.h); kXllm needs the fill body. Every
  // replay (dynamic arrival) first updates them: the front rows of each updated buffer are copied
  // from the step's inputs (device buffers of the same size, allocated at the first replay) and
  // padding rows are filled, as xLLM's update() does; the fills write the buffers' check pattern
  // where xLLM writes zeros, so replay checks still hold.
  InputSet input_set = InputSet::kProgram;
  OutputLifetime outputs = OutputLifetime::kStrong;
  GraphRunners runners = GraphRunners::kFull;
  uint64_t seed = 1;
  bool check_invariants = true;      // per-graph conformance checks (cheap; on by default)
  ProgramCache* programs = nullptr;  // optional shared cache; the runner makes its own if null
  // The program of each batch instead of make_decode_program's (graph_body: executor); full
  // graphs only.
  std::function<ShapeProgram(uint32_t batch)> program_for;
  GraphBody* body = nullptr;  // real work instead of fill kernels (CUDA backend)
  CaptureObserver* observer = nullptr;
};

struct CurvePoint {
  uint32_t shapes_captured = 0;
  uint32_t batch = 0;
  SimTime time = 0;
  uint64_t physical = 0;
  uint64_t virtual_mapped = 0;
  uint64_t strategy_reserved = 0;
};

struct CaptureRunResult {
  bool ok = true;  // false: an error stopped the run (see failure fields)
  bool out_of_memory = false;
  std::string failure;  // the error message, if any
  uint32_t failed_batch = 0;
  uint64_t bytes_short = 0;
  std::string invariant_violation;  // first conformance failure, empty if none
  bool released_all = false;        // backend held nothing after teardown
  // False when outputs were held (strong) but the strategy aliases them with other graphs'
  // memory: the footprint is measured, but the held outputs would not survive other replays.
  bool held_outputs_preserved = true;
  uint64_t peak_physical = 0;
  uint64_t peak_virtual_mapped = 0;
  uint64_t peak_virtual_reserved = 0;
  uint64_t peak_strategy_reserved = 0;
  uint64_t peak_graph_mem = 0;
  SimTime capture_time = 0;  // simulated time inside captures (incl. warm-up launch)
  SimTime switch_time = 0;   // strategy preparation time (vmm_alias space switches)
  // The replays' input updates (see CaptureRunConfig::input_set): time charged, bytes copied and
  // filled, and copy and fill calls.
  SimTime input_update_time = 0;
  uint64_t input_update_bytes = 0;
  uint64_t input_update_ops = 0;
  SimTime end_time = 0;
  uint32_t shapes_captured = 0;
  uint64_t graphs = 0;
  uint64_t launches = 0;
  std::vector<CurvePoint> curve;
  // Per graph a body captured (in capture order): the nodes it enqueued of its own, and the
  // program's body_nodes (0: unset). The sim prices the program's count; on the GPU the body's
  // is the real graph's (cuBLASLt picks its kernels per shape), priced instead.
  struct BodyNodes {
    std::string graph;
    uint32_t batch = 0;
    uint64_t body = 0, program = 0;
  };
  std::vector<BodyNodes> body_nodes;
};

// Sizes vLLM captures for a max_num_seqs: 1, 2, 4, then steps of 8 up to 256, then steps of
// 16, capped at min(2 x max_num_seqs, 512).
std::vector<uint32_t> vllm_capture_sizes(uint32_t max_num_seqs);

// Runs one capture schedule on a fresh backend whose clock is `clock` and which publishes its
// gauges (physical_bytes, virtual_mapped, virtual_reserved, graph_mem_reserved) to `metrics`;
// the runner adds strategy_reserved and reads the peaks from there.
CaptureRunResult run_captures(const CaptureRunConfig& config, Backend& backend, SimClock& clock,
                              GraphMemoryStrategy& strategy, MetricsRecorder& metrics);

// run_captures on a fresh SimBackend for `gpu` with a fresh strategy from `make_strategy` (a
// GraphStrategyFactory); a failed backend invariant check after the run is reported in
// invariant_violation (unless the run already reported one).
CaptureRunResult run_captures_on_sim(
    const CaptureRunConfig& config, const GpuSpec& gpu,
    const std::function<std::unique_ptr<GraphMemoryStrategy>(Backend&)>& make_strategy,
    SimClock& clock, MetricsRecorder& metrics);

}  // namespace memsim
