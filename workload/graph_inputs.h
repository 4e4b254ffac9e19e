// Graph input buffers: the device buffers a graph runner fills outside its graphs (which the
// graphs read), sized for a batch, and what one replay's update copies into them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "workload/alloc_program.h"
#include "workload/model_shape.h"

namespace memsim {

// Which engine's input buffers a runner allocates. kProgram: the program's own inputs
// (ShapeProgram::inputs: vLLM's model-runner buffers for the generated decode program, the
// executor's metadata for graph_body executor). kXllm: xLLM's CudaGraphPersistentParam (seed
// xllm-multi-shape-vmm.md §4), for the generated decode program.
enum class InputSet : uint8_t { kProgram, kXllm };
const char* to_string(InputSet s);

// One input buffer of a decode graph (one token per sequence, so a row is a sequence and a token).
struct InputBufferSpec {
  std::string name;
  uint64_t row_bytes = 0;    // per sequence
  uint64_t fixed_bytes = 0;  // beside the rows (cumulative lengths have one entry more)
  // Copied into on every replay (xLLM's update(): `persistent.slice(0, 0, actual).copy_(in)`);
  // false for a buffer the graph writes (xLLM's hidden_states, the forward's output).
  bool updated = true;
  // update() zeroes the rows between the actual and the padded batch (xLLM: tokens,
  // new_cache_slots).
  bool zero_padding = false;
  uint64_t bytes(uint32_t rows) const { return rows * row_bytes + fixed_bytes; }
};

// xLLM's CudaGraphPersistentParam constructor for a decode graph whose max_tokens_per_batch and
// max_seqs_per_batch are both `rows` (cuda_graph_executor_impl.cpp): tokens, positions and
// new_cache_slots [max_tokens] int32; q_seq_lens and kv_seq_lens [max_seqs + 1] int32 (cumulative
// lengths); block_tables [max_seqs, ceil(max_seq_len / block_size) + 1] int32; hidden_states
// [max_tokens, hidden] in the model's dtype. xLLM sizes the block table by the model's
// max_position_embeddings; memsim by max_model_len (the model files do not carry the former).
// FlashInfer's planning buffers, which newer xLLM versions also allocate (paged_kv_indptr,
// paged_kv_indices, ...), and the lazily created embedding buffers are left out: the seed lists
// the seven buffers above.
std::vector<InputBufferSpec> xllm_persistent_inputs(const ModelShape& model, uint32_t max_model_len,
                                                    uint32_t block_size);

// The program's inputs as buffers: each is proportional to the program's batch (vLLM's runner
// copies the first rows of every one of them), and every one is updated.
std::vector<InputBufferSpec> program_input_buffers(const ShapeProgram& program);

// One copy (or zero fill) of a replay's update: `bytes` at the front of input `index`
// (`offset` 0), or the padding rows after it (`fill`).
struct InputUpdateOp {
  size_t index = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  bool fill = false;
};
// The copies and fills of one replay of a graph padded to `padded` rows for `actual` sequences:
// the front `actual` rows (plus the fixed bytes) of every updated buffer, then, for buffers with
// zero_padding, a fill of the rows up to `padded`.
std::vector<InputUpdateOp> input_update_ops(const std::vector<InputBufferSpec>& specs,
                                            uint32_t actual, uint32_t padded);

}  // namespace memsim
