// The allocation program of memsim's own model executor (src/exec/model_step.h) for one decode
// step, as it captures into a graph-memory strategy (shapes experiment, graph_body: executor).
#pragma once

#include <cstdint>
#include <functional>

#include "workload/alloc_program.h"
#include "workload/model_shape.h"

namespace memsim {

// The context a decode graph is captured for when steps reach `max_context`: at least 32K. The
// captured decode kernel keeps the KV split count planned at capture, so the profile, the
// serving executor and the shapes experiment capture at the same context to run the same
// kernels.
inline uint32_t graph_context_for(uint32_t max_context) {
  return max_context > 32768 ? max_context : 32768;
}

struct ExecutorProgramOptions {
  uint32_t max_context = 32768;  // contexts the graphs are captured for (sizes the block tables)
  uint32_t kv_block_size = 16;
  // Bytes of the decode kernel's split workspace for a batch (its graph launch at max_context,
  // kernels::plan_decode_graph); null or 0: no workspace.
  std::function<uint64_t(uint32_t batch)> decode_workspace;
  // int32 words of the decode work list in the metadata for a batch (kernels::decode_work_words
  // of that launch); null or 0: none.
  std::function<uint64_t(uint32_t batch)> decode_work_words;
  // Tensor parallelism: `model` is one rank's shard (workload/tensor_parallel.h) of a model whose
  // vocabulary is `vocab` (the argmax's width) padded to `vocab_padded` over all ranks. 1: one GPU.
  uint32_t tensor_parallel = 1;
  uint64_t vocab = 0, vocab_padded = 0;
};

// ModelStep's decode step of `batch` sequences, one full graph "b<B>.full":
//   input   step_metadata     the packed step metadata ModelStep uploads before each replay:
//                             [ids | positions | slot_mapping | indptr | kv_lens | block tables |
//                             last rows | (no prefill work) | decode work list], each section
//                             16-byte aligned (executor_metadata_bytes)
//   attn_workspace            split-KV partial outputs (when the plan splits)
//   residual                  [b, hidden]        embedding output, then the running residual
//   layer 0: input_norm       [b, hidden]        (later layers normalize the previous down
//                                                 projection in place, fused with the residual)
//   per layer: qkv [b, (heads + 2 kv_heads) head_dim]; q [b, heads head_dim] (RoPE out of
//     place); attn [b, heads head_dim]; o [b, hidden]; gate_up [b, 2 intermediate];
//     act [b, intermediate]; down [b, hidden]; each freed once its last reader has run
//   last [b, hidden], logits [b, vocab], next [b] int32 (copied to the host inside the graph)
// All activations in the model dtype (16-bit). Every tensor is freed inside the graph: the
// graph has no outputs. The GEMM workspace is the executor's own, outside graph memory.
// Under tensor parallelism (options.tensor_parallel > 1) the embedding lookup, o and down first
// give "<name>.partial", all-reduced out of place into the tensor above (the partial freed
// next), and the LM head gives "logits.partial" [b, rank's vocab rows], all-gathered into
// "logits.gathered" [b, vocab_padded] and copied into "logits" [b, vocab_padded] (ModelStep's
// collectives; model_step.h).
ShapeProgram make_executor_decode_program(const ModelShape& model, uint32_t batch,
                                          const ExecutorProgramOptions& options);

// Graph nodes of that step's own work (its GraphProgram's body_nodes): the embedding; per layer
// the input RMSNorm, the QKV GEMM (a bias rides in its epilogue), the q and k norms (qk_norm),
// RoPE, the KV write, the decode attention and, when the plan splits the KV (`split_kv`: it has
// a workspace), its combine, the O GEMM, the post-attention RMSNorm, the gate/up GEMM, SiLU x up
// and the down GEMM; then the final RMSNorm, the last-row gather, the LM head GEMM, the argmax
// and the copy of the next tokens to the host. One node per cuBLASLt matmul; a GPU run of the
// shapes experiment (graph_body: executor) checks the count against the captured graphs. Under
// tensor parallelism add one node per collective (2 x layers + 1 all-reduces, the logits'
// all-gather) and the gathered logits' copy of each rank's part.
uint64_t executor_decode_nodes(const ModelShape& model, bool split_kv,
                               uint32_t tensor_parallel = 1);

// Bytes of the packed metadata of a decode step of `batch` sequences whose block tables are
// `bt_stride` entries long, with a decode work list of `work_words` int32 words.
uint64_t executor_metadata_bytes(uint32_t batch, uint32_t bt_stride, uint64_t work_words = 0);

}  // namespace memsim
