// ModelStep's decode-step allocation program (see executor_program.h for the op sequence).
#include "workload/executor_program.h"

#include <stdexcept>
#include <string>

namespace memsim {
namespace {

uint64_t align16(uint64_t v) {
  return (v + 15) / 16 * 16;
}

}  // namespace

uint64_t executor_metadata_bytes(uint32_t batch, uint32_t bt_stride, uint64_t work_words) {
  const uint64_t b = batch;
  // ids, positions (int32), slot_mapping (int64), indptr (one entry: no prefill), kv_lens,
  // tables, last rows (int32); no prefill work; the decode work list (int32).
  return align16(b * 4) + align16(b * 4) + align16(b * 8) + align16(4) + align16(b * 4) +
         align16(b * bt_stride * 4) + align16(b * 4) + align16(work_words * 4);
}

uint64_t executor_decode_nodes(const ModelShape& m, bool split_kv, uint32_t tensor_parallel) {
  // Per layer: input norm, QKV, RoPE, KV write, attention, O, post norm, gate/up, SiLU x up,
  // down; then the q and k norms and the split's combine where they run.
  const uint64_t per_layer = 10 + (m.qk_norm ? 2 : 0) + (split_kv ? 1 : 0);
  // The embedding; final norm, last-row gather, LM head, argmax and the next tokens' copy.
  const uint64_t one_gpu = 1 + per_layer * m.layers + 5;
  if (tensor_parallel <= 1) return one_gpu;
  return one_gpu + (2ull * m.layers + 1) + 1 + tensor_parallel;
}

ShapeProgram make_executor_decode_program(const ModelShape& m, uint32_t batch,
                                          const ExecutorProgramOptions& o) {
  if (batch == 0) throw std::invalid_argument("executor program: batch must be > 0");
  if (o.kv_block_size == 0 || o.max_context == 0)
    throw std::invalid_argument("executor program: max_context and kv_block_size must be > 0");
  if (dtype_bytes(m.dtype) != 2)
    throw std::invalid_argument("executor program: the executor runs 16-bit models only");
  const bool tp = o.tensor_parallel > 1;
  if (tp &&
      (o.vocab == 0 || o.vocab > o.vocab_padded || o.vocab_padded != m.vocab * o.tensor_parallel))
    throw std::invalid_argument(
        "executor program: tensor_parallel needs vocab <= vocab_padded = the shard's vocab x tp");
  const uint64_t b = batch, e = 2;
  const uint64_t hidden = b * m.hidden * e;
  const uint64_t q = b * uint64_t{m.heads} * m.head_dim * e;
  const uint64_t qkv = b * (uint64_t{m.heads} + 2ull * m.kv_heads) * m.head_dim * e;
  const uint32_t bt_stride = (o.max_context + o.kv_block_size - 1) / o.kv_block_size;

  ShapeProgram out;
  out.batch = batch;
  const uint64_t words = o.decode_work_words ? o.decode_work_words(batch) : 0;
  out.inputs = {
      {"step_metadata", executor_metadata_bytes(batch, bt_stride, words), TensorRole::kInput}};
  GraphProgram g;
  g.name = "b" + std::to_string(batch) + ".full";
  auto alloc = [&](std::string name, uint64_t bytes) {
    g.tensors.push_back({std::move(name), std::max<uint64_t>(bytes, 1), TensorRole::kIntermediate});
    const auto t = static_cast<uint32_t>(g.tensors.size() - 1);
    g.ops.push_back({ProgramOp::Kind::kAlloc, t});
    return t;
  };
  auto free = [&](uint32_t t) { g.ops.push_back({ProgramOp::Kind::kFree, t}); };
  // A row-parallel op's output: its partial sum, then the all-reduce's out-of-place result.
  auto reduced = [&](const std::string& name) {
    if (!tp) return alloc(name, hidden);
    const uint32_t partial = alloc(name + ".partial", hidden);
    const uint32_t sum = alloc(name, hidden);
    free(partial);
    return sum;
  };

  const uint64_t ws = o.decode_workspace ? o.decode_workspace(batch) : 0;
  const uint32_t workspace = ws ? alloc("attn_workspace", ws) : UINT32_MAX;
  const uint32_t residual = reduced("residual");
  uint32_t x = UINT32_MAX;  // the previous layer's down projection
  for (uint32_t l = 0; l < m.layers; ++l) {
    const std::string p = "layer" + std::to_string(l) + ".";
    const uint32_t normed = l == 0 ? alloc(p + "input_norm", hidden) : x;
    const uint32_t t_qkv = alloc(p + "qkv", qkv);
    free(normed);
    const uint32_t t_q = alloc(p + "q", q);
    const uint32_t t_attn = alloc(p + "attn", q);
    free(t_q);
    free(t_qkv);
    const uint32_t t_o = reduced(p + "o");
    free(t_attn);
    const uint32_t t_gu = alloc(p + "gate_up", b * 2 * m.intermediate * e);
    free(t_o);
    const uint32_t t_act = alloc(p + "act", b * m.intermediate * e);
    free(t_gu);
    x = reduced(p + "down");
    free(t_act);
  }
  const uint32_t final_rows = m.layers ? x : alloc("final_norm", hidden);
  const uint32_t last = alloc("last", b * m.hidden * e);
  free(final_rows);
  uint32_t logits = alloc(tp ? "logits.partial" : "logits", b * m.vocab * e);
  free(last);
  if (tp) {
    const uint32_t gathered = alloc("logits.gathered", b * o.vocab_padded * e);
    free(logits);
    logits = alloc("logits", b * o.vocab_padded * e);
    free(gathered);
  }
  const uint32_t next = alloc("next", b * 4);
  free(logits);
  free(next);
  free(residual);
  if (workspace != UINT32_MAX) free(workspace);
  g.body_nodes = executor_decode_nodes(m, ws != 0, o.tensor_parallel);
  if (std::string err = validate(g); !err.empty())
    throw std::logic_error("executor program: generated an invalid graph: " + err);
  out.graphs.push_back(std::move(g));
  return out;
}

}  // namespace memsim
