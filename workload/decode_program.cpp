// Generates the allocation program of one decode forward pass of a Llama-style model.
//
// Assumed op sequence (vLLM's LlamaForCausalLM / LlamaDecoderLayer, one token per sequence,
// b = batch, all activations in the model dtype unless noted). vLLM's decoder layer takes and
// returns a (hidden_states, residual) pair; layer 0 starts with residual = embedding output, and
// every later residual add is done by the *next* RMSNorm called with a residual argument
// (input_layernorm of the next layer, or the final norm). vLLM's CUDA kernel for that,
// fused_add_rms_norm, works in place; here it is modelled OUT OF PLACE: each norm-with-residual
// allocates the residual sum ([b, hidden]) and then the normalized output ([b, hidden]). This is
// the eager, unfused upper bound: the same kernels, two extra [b, hidden] tensors per norm.
//
//   embed                         [b, hidden]      embedding lookup (reads input_ids)
//   layer i:
//     i == 0: input_norm          [b, hidden]      rms_norm(embed); residual := embed
//     i >= 1: input_residual      [b, hidden]      down(i-1) + post_attn_residual(i-1)
//             input_norm          [b, hidden]      rms_norm(input_residual)
//     gemm_workspace              (options)        once, right before the first GEMM (layer 0)
//     qkv                         [b, (heads + 2 kv_heads) head_dim]   merged QKV GEMM (+bias
//                                                  in the GEMM epilogue when qkv_bias)
//     q_norm, k_norm              [b, heads head_dim], [b, kv_heads head_dim]   qk_norm only
//                                                  (Qwen3: per-head RMSNorm, out of place)
//     (rotary embedding: in place on q and k, no allocation; KV-cache write: into the cache)
//     attn                        [b, heads head_dim]   paged attention output
//     o_proj                      [b, hidden]
//     post_attn_residual          [b, hidden]      o_proj + residual (the layer's residual out)
//     post_attn_norm              [b, hidden]      rms_norm(post_attn_residual)
//     gate_up                     [b, 2 intermediate]   merged gate/up GEMM
//     act                         [b, intermediate]     SiluAndMul
//     down                        [b, hidden]      the layer's hidden-state out
//   final.residual                [b, hidden]      down(L-1) + post_attn_residual(L-1)
//   final.norm                    [b, hidden]
//   logits                        [b, vocab]       lm_head GEMM, model dtype
//   logits_fp32                   [b, vocab] fp32  logits.float()            (graph output)
//   probs                         [b, vocab] fp32  softmax for the sampler
//   sampled_ids                   [b] int64        sampled tokens            (graph output)
//
// Tensor parallelism (options.tensor_parallel > 1; the model is one rank's shard, vLLM's
// VocabParallelEmbedding / RowParallelLinear / LogitsProcessor): every all-reduce is out of
// place (pynccl and the custom all-reduce both return torch.empty_like(input)), so the embedding
// lookup, o_proj and down each allocate their partial sum ("embed.partial", "o_proj.partial",
// "down.partial") and then the reduced tensor under the name above, freeing the partial. The LM
// head gives [b, vocab_padded / tp] ("logits.partial"); V1 all-gathers it (use_all_gather) into
// [tp, b, vocab_padded / tp] ("logits.gathered") and the movedim + reshape copies it into
// "logits" [b, vocab_padded] (the padding is sliced off as a view). The masked-id tensors of the
// embedding ([b] int64 and bool) are left out.
//
// Pipeline parallelism (vLLM's PP ranks; model.layers is the stage's): a stage other than the
// first has no embedding; vLLM's runner keeps persistent intermediate tensors (hidden_states and
// residual, [max_num_tokens, hidden] each: make_empty_intermediate_tensors, gpu_model_runner) that
// the received ones are copied into, here two inputs "intermediate.hidden_states" and
// "intermediate.residual" [b, hidden]; its first layer adds the residual as any later layer does
// (input_residual). A stage other than the last returns IntermediateTensors(hidden_states,
// residual): its last layer's down and post_attn_residual stay live as the graph's outputs, and
// there is no final norm, LM head or sampler (vLLM's PPMissingLayer; the profile run samples on
// the last rank only).
//
// Each tensor is freed right after the op that reads it last, i.e. after that op's own output
// has been allocated (an op's inputs and output are live together). The residual chain: embed
// is read last by layer 0's post_attn_residual; input_residual(i) by post_attn_residual(i);
// post_attn_residual(i) and down(i) by input_residual(i+1) (or final.residual).
//
// Piecewise mode cuts the same sequence into graphs: "b<B>.embed" (embed), "b<B>.layer<NN>"
// (one per decoder layer, including the residual add that opens it), "b<B>.head" (final
// residual + norm, logits, sampler). A tensor still live when its graph ends is that graph's
// output (role kOutput: embed; each layer's down and post_attn_residual; logits_fp32 and
// sampled_ids). When a later graph reads a tensor for the last time it emits no free: the
// earlier graph's output lifetime is governed by the output-lifetime option, not by the op list.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "workload/alloc_program.h"
#include "workload/model_shape.h"

namespace memsim {

namespace {

// Records allocations and frees of one logical forward pass, split into graphs. Handles are
// global across graphs; a free of a tensor owned by an earlier graph emits no op.
class ProgramBuilder {
 public:
  using Handle = size_t;

  explicit ProgramBuilder(std::vector<GraphProgram>& graphs) : graphs_(graphs) {}

  void begin_graph(std::string name) {
    close_graph();
    graphs_.push_back(GraphProgram{std::move(name), {}, {}});
    open_ = true;
  }

  Handle alloc(std::string name, uint64_t bytes, TensorRole role = TensorRole::kIntermediate) {
    GraphProgram& g = current();
    const auto index = static_cast<uint32_t>(g.tensors.size());
    g.tensors.push_back(TensorSpec{std::move(name), bytes, role});
    g.ops.push_back(ProgramOp{ProgramOp::Kind::kAlloc, index});
    refs_.push_back(Ref{graphs_.size() - 1, index, false});
    return refs_.size() - 1;
  }

  // A tensor the program reads but does not own (a persistent input): its frees emit nothing.
  Handle external() {
    refs_.push_back(Ref{kExternal, 0, false});
    return refs_.size() - 1;
  }

  void free(Handle h) {
    Ref& r = refs_.at(h);
    if (r.freed) throw std::logic_error("decode program: tensor freed twice");
    r.freed = true;
    if (r.graph != graphs_.size() - 1) return;  // an earlier graph's output, or external
    current().ops.push_back(ProgramOp{ProgramOp::Kind::kFree, r.index});
  }

  // Tensors of the open graph that are still live (other than workspaces) become its outputs.
  void close_graph() {
    if (!open_) return;
    GraphProgram& g = current();
    for (const Ref& r : refs_) {
      if (r.graph != graphs_.size() - 1 || r.freed) continue;
      TensorSpec& t = g.tensors[r.index];
      if (t.role == TensorRole::kIntermediate) t.role = TensorRole::kOutput;
    }
    open_ = false;
  }

 private:
  static constexpr size_t kExternal = static_cast<size_t>(-1);
  struct Ref {
    size_t graph;
    uint32_t index;
    bool freed;
  };

  GraphProgram& current() {
    if (!open_) throw std::logic_error("decode program: no open graph");
    return graphs_.back();
  }

  std::vector<GraphProgram>& graphs_;
  std::vector<Ref> refs_;
  bool open_ = false;
};

std::string graph_name(uint32_t batch, const char* suffix) {
  return "b" + std::to_string(batch) + "." + suffix;
}

std::string layer_graph_name(uint32_t batch, uint32_t layer) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "layer%02u", layer);
  return graph_name(batch, buf);
}

void check_shape(const ModelShape& m, uint32_t batch, const ProgramOptions& o) {
  if (batch == 0) throw std::invalid_argument("decode program: batch must be > 0");
  if (m.layers == 0 || m.hidden == 0 || m.heads == 0 || m.kv_heads == 0 || m.head_dim == 0 ||
      m.intermediate == 0 || m.vocab == 0) {
    throw std::invalid_argument("decode program: model '" + m.name + "' has a zero dimension");
  }
  if (o.kv_block_size == 0 || o.max_model_len == 0) {
    throw std::invalid_argument("decode program: max_model_len and kv_block_size must be > 0");
  }
  if (o.tensor_parallel > 1 &&
      (o.vocab == 0 || o.vocab > o.vocab_padded || o.vocab_padded != m.vocab * o.tensor_parallel)) {
    throw std::invalid_argument(
        "decode program: tensor_parallel needs vocab <= vocab_padded = the shard's vocab x tp");
  }
}

// The last stage's head: final residual add and norm, LM head (all-gathered under TP), sampler.
void emit_head(ProgramBuilder& pb, const ModelShape& model, const ProgramOptions& options,
               uint32_t batch, ProgramBuilder::Handle hidden, ProgramBuilder::Handle residual) {
  using Handle = ProgramBuilder::Handle;
  const uint64_t b = batch;
  const uint64_t act = dtype_bytes(model.dtype);
  const uint64_t fp32 = dtype_bytes(DType::kFP32);
  const uint64_t hidden_bytes = b * model.hidden * act;
  const bool tp = options.tensor_parallel > 1;
  if (options.mode == GraphMode::kPiecewise) pb.begin_graph(graph_name(batch, "head"));
  const Handle final_sum = pb.alloc("final.residual", hidden_bytes);
  pb.free(hidden);
  pb.free(residual);
  const Handle final_norm = pb.alloc("final.norm", hidden_bytes);
  pb.free(final_sum);
  Handle logits;
  if (tp) {
    const Handle partial = pb.alloc("logits.partial", b * model.vocab * act);
    pb.free(final_norm);
    const Handle gathered = pb.alloc("logits.gathered", b * options.vocab_padded * act);
    pb.free(partial);
    logits = pb.alloc("logits", b * options.vocab_padded * act);
    pb.free(gathered);
  } else {
    logits = pb.alloc("logits", b * model.vocab * act);
    pb.free(final_norm);
  }
  const uint64_t vocab = tp ? options.vocab : model.vocab;
  pb.alloc("logits_fp32", b * vocab * fp32);  // output
  pb.free(logits);
  const Handle probs = pb.alloc("probs", b * vocab * fp32);
  pb.alloc("sampled_ids", b * dtype_bytes(DType::kInt64));  // output
  pb.free(probs);
}

}  // namespace

ShapeProgram make_decode_program(const ModelShape& model, uint32_t batch,
                                 const ProgramOptions& options) {
  check_shape(model, batch, options);

  const uint64_t b = batch;
  const uint64_t act = dtype_bytes(model.dtype);
  const uint64_t i32 = dtype_bytes(DType::kInt32);
  const uint64_t i64 = dtype_bytes(DType::kInt64);
  const uint64_t q_width = uint64_t{model.heads} * model.head_dim;
  const uint64_t kv_width = uint64_t{model.kv_heads} * model.head_dim;
  const uint64_t hidden_bytes = b * model.hidden * act;
  const uint64_t blocks_per_seq =
      (uint64_t{options.max_model_len} + options.kv_block_size - 1) / options.kv_block_size;
  const bool piecewise = options.mode == GraphMode::kPiecewise;

  ShapeProgram out;
  out.batch = batch;
  out.inputs = {
      {"input_ids", b * i64, TensorRole::kInput},
      {"positions", b * i64, TensorRole::kInput},
      {"slot_mapping", b * i64, TensorRole::kInput},
      {"seq_lens", b * i32, TensorRole::kInput},
      {"block_tables", b * blocks_per_seq * i32, TensorRole::kInput},
  };

  if (!options.first_stage) {
    out.inputs.push_back({"intermediate.hidden_states", hidden_bytes, TensorRole::kInput});
    out.inputs.push_back({"intermediate.residual", hidden_bytes, TensorRole::kInput});
  }

  ProgramBuilder pb(out.graphs);
  pb.begin_graph(graph_name(batch, piecewise ? "embed" : "full"));

  using Handle = ProgramBuilder::Handle;
  const bool tp = options.tensor_parallel > 1;
  // A row-parallel op's output: its partial sum, then the all-reduce's out-of-place result.
  auto reduced = [&](const std::string& name) {
    if (!tp) return pb.alloc(name, hidden_bytes);
    const Handle partial = pb.alloc(name + ".partial", hidden_bytes);
    const Handle sum = pb.alloc(name, hidden_bytes);
    pb.free(partial);
    return sum;
  };
  // First stage: the embedding, which layer 0 also takes as its residual. Later stages: the
  // persistent intermediate inputs (never freed by the program).
  Handle hidden = options.first_stage ? reduced("embed") : pb.external();
  Handle residual = options.first_stage ? hidden : pb.external();
  bool workspace_done = options.gemm_workspace_bytes == 0;

  for (uint32_t i = 0; i < model.layers; ++i) {
    if (piecewise) pb.begin_graph(layer_graph_name(batch, i));
    const std::string p = "layer" + std::to_string(i) + ".";

    Handle norm_in;
    if (i == 0 && options.first_stage) {
      norm_in = pb.alloc(p + "input_norm", hidden_bytes);
    } else {
      const Handle sum = pb.alloc(p + "input_residual", hidden_bytes);
      pb.free(hidden);
      pb.free(residual);
      residual = sum;
      norm_in = pb.alloc(p + "input_norm", hidden_bytes);
    }

    if (!workspace_done) {
      pb.alloc("gemm_workspace", options.gemm_workspace_bytes, TensorRole::kWorkspace);
      workspace_done = true;
    }
    const Handle qkv = pb.alloc(p + "qkv", b * (q_width + 2 * kv_width) * act);
    pb.free(norm_in);

    Handle attn;
    if (model.qk_norm) {
      const Handle qn = pb.alloc(p + "q_norm", b * q_width * act);
      const Handle kn = pb.alloc(p + "k_norm", b * kv_width * act);
      attn = pb.alloc(p + "attn", b * q_width * act);
      pb.free(qn);
      pb.free(kn);
    } else {
      attn = pb.alloc(p + "attn", b * q_width * act);
    }
    pb.free(qkv);  // v (and q, k when not normalized) is read by attention last

    const Handle o = reduced(p + "o_proj");
    pb.free(attn);

    const Handle res2 = pb.alloc(p + "post_attn_residual", hidden_bytes);
    pb.free(o);
    pb.free(residual);
    residual = res2;

    const Handle norm_post = pb.alloc(p + "post_attn_norm", hidden_bytes);
    const Handle gate_up = pb.alloc(p + "gate_up", b * 2 * model.intermediate * act);
    pb.free(norm_post);
    const Handle a = pb.alloc(p + "act", b * model.intermediate * act);
    pb.free(gate_up);
    hidden = reduced(p + "down");
    pb.free(a);
  }

  // A stage other than the last ends here: hidden (down) and residual are its outputs.
  if (options.last_stage) emit_head(pb, model, options, batch, hidden, residual);
  pb.close_graph();

  for (const GraphProgram& g : out.graphs) {
    if (std::string err = validate(g); !err.empty()) {
      throw std::logic_error("decode program: generated an invalid graph: " + err);
    }
  }
  return out;
}

}  // namespace memsim
