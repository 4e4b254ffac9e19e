// Allocation programs: the ordered tensor allocations and frees of one forward pass, as plain
// data (generated from a model shape, or later imported from a real trace).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memsim {

enum class TensorRole : uint8_t {
  kInput,         // allocated by the runner outside any graph (per shape, or persistent)
  kIntermediate,  // allocated and freed inside the graph
  kOutput,        // allocated inside the graph, not freed by it: its lifetime follows the
                  // output-lifetime option (strong: held until teardown, weak: returned to the
                  // pool after capture)
  kWorkspace,     // GEMM-library workspace: allocated on first use per capture stream, never freed
};
const char* to_string(TensorRole r);

struct TensorSpec {
  std::string name;  // e.g. "layer3.qkv"
  uint64_t bytes = 0;
  TensorRole role = TensorRole::kIntermediate;
};

struct ProgramOp {
  enum class Kind : uint8_t { kAlloc, kFree } kind = Kind::kAlloc;
  uint32_t tensor = 0;  // index into GraphProgram::tensors
};

// One capturable graph: the tensors its body allocates (roles kIntermediate, kOutput,
// kWorkspace) and the ordered alloc/free ops over them. The graph reads the shape's inputs (the
// first graph of a shape) or the previous graph's outputs (piecewise graphs); those are not
// listed here.
struct GraphProgram {
  std::string name;  // e.g. "b64.full", "b64.layer07"
  std::vector<TensorSpec> tensors;
  std::vector<ProgramOp> ops;
  // Graph nodes of the body's own work (kernels and copies; memory nodes are the strategy's).
  // 0: the generated forward's, one fill kernel per allocated tensor plus the input reads. Set
  // for a real body (the model executor's step), whose kernels outnumber its tensors: the sim
  // counts this many nodes at end_capture and upload; a GPU run reports the real graph's beside it.
  uint64_t body_nodes = 0;
};

// Everything one batch shape needs: the runner-provided inputs and the graphs captured for it
// (one for a full-model graph; embedding + one per layer + head for piecewise graphs).
struct ShapeProgram {
  uint32_t batch = 0;
  std::vector<TensorSpec> inputs;  // role kInput
  std::vector<GraphProgram> graphs;
};

enum class GraphMode : uint8_t { kFull, kPiecewise };
const char* to_string(GraphMode m);

struct ProgramOptions {
  GraphMode mode = GraphMode::kFull;
  uint64_t gemm_workspace_bytes = 0;  // per capture stream; 0 = no workspace tensor
  uint32_t max_model_len = 8192;      // sizes the block-table input
  uint32_t kv_block_size = 16;
  // Tensor parallelism: `model` is one rank's shard (workload/tensor_parallel.h) and the program
  // gains vLLM's collectives' outputs (see decode_program.cpp); vocab_padded is the whole padded
  // vocabulary the gathered logits span, vocab the model's own (the sampler's width). 1: one
  // GPU, no collectives.
  uint32_t tensor_parallel = 1;
  uint64_t vocab_padded = 0;
  uint64_t vocab = 0;
  // Pipeline parallelism: `model` holds one stage's layers (workload/pipeline_parallel.h). A stage
  // other than the first has no embedding and reads the previous stage's hidden states and
  // residual from two persistent [b, hidden] inputs; a stage other than the last ends after its
  // last layer, with those two tensors as its outputs (no final norm, logits or sampler).
  bool first_stage = true;
  bool last_stage = true;
};

// Checks a graph: every op names a tensor in range; every intermediate is allocated once and
// freed once after its allocation; outputs and workspaces are allocated once and never freed;
// no tensor has role kInput or zero bytes. Returns an empty string when valid, else the first
// problem found.
std::string validate(const GraphProgram& g);

struct ModelShape;
// The allocation program of one decode forward pass (one new token per sequence) at `batch`.
ShapeProgram make_decode_program(const ModelShape& model, uint32_t batch,
                                 const ProgramOptions& options);

}  // namespace memsim
