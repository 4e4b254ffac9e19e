// ModelStep: the per-step metadata upload (packed by step_metadata.h), the layer loop (kernels/
// and cuBLASLt) with its collectives, graphs, and the activations' allocation order through the
// allocator. The weights: model_weights.cpp.
#include "src/exec/model_step.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/model_ops.h"
#include "src/alloc/device_segment_source.h"
#include "src/alloc/torch_caching.h"
#include "src/exec/model_step_impl.h"
#include "src/exec/step_metadata.h"
#include "src/exec/tp_group.h"

namespace memsim {

using namespace kernels;
using namespace model_step_detail;

Result<DevPtr> ModelStep::Impl::reduced(DevPtr partial, uint64_t elems) {
  if (!tp) return partial;
  MEMSIM_ASSIGN_OR_RETURN(DevPtr sum, act(elems * kElem));
  MEMSIM_TRY(tp->all_reduce(dtype, partial, sum, elems, reinterpret_cast<uint64_t>(stream)));
  MEMSIM_TRY(free(partial));
  return sum;
}

Result<DevPtr> ModelStep::Impl::lm_head_logits(DevPtr last, uint32_t S) {
  MEMSIM_ASSIGN_OR_RETURN(DevPtr part, act(uint64_t{S} * vocab_rows * kElem));
  MEMSIM_TRY(
      gemm_status(gemm->matmul(dtype, last, lm_head, 0, part, S, static_cast<uint32_t>(vocab_rows),
                               static_cast<uint32_t>(hidden), stream)));
  MEMSIM_TRY(free(last));
  if (!tp) return part;
  // V1's all-gather: [tp, S, vocab_rows], then movedim + reshape into [S, tp x vocab_rows].
  const uint64_t part_bytes = uint64_t{S} * vocab_rows * kElem;
  MEMSIM_ASSIGN_OR_RETURN(DevPtr gathered, act(part_bytes * tp_size));
  MEMSIM_TRY(tp->all_gather(part, gathered, part_bytes, reinterpret_cast<uint64_t>(stream)));
  MEMSIM_TRY(free(part));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr logits, act(uint64_t{S} * vocab_padded * kElem));
  for (uint32_t r = 0; r < tp_size; ++r)
    MEMSIM_STEP_CU(cudaMemcpy2DAsync(
        reinterpret_cast<void*>(logits + r * vocab_rows * kElem), vocab_padded * kElem,
        reinterpret_cast<void*>(gathered + r * part_bytes), vocab_rows * kElem, vocab_rows * kElem,
        S, cudaMemcpyDeviceToDevice, stream));
  MEMSIM_TRY(free(gathered));
  return logits;
}

ModelStep::Impl::StepViews ModelStep::Impl::views(const KvLayout& kv, const PackedStep& p,
                                                  DevPtr meta) const {
  StepViews v;
  v.T = p.T;
  v.S = p.S;
  v.D = p.D;
  v.num_tiles = p.num_tiles;
  v.dplan = &p.dplan;
  v.psplit = p.psplit;
  auto dev = [&](size_t i) { return meta + p.at[i]; };
  v.ids = reinterpret_cast<const int32_t*>(dev(PackedStep::kIds));
  v.pos = reinterpret_cast<const int32_t*>(dev(PackedStep::kPositions));
  v.slots = reinterpret_cast<const int64_t*>(dev(PackedStep::kSlots));
  v.indptr = reinterpret_cast<const int32_t*>(dev(PackedStep::kIndptr));
  const auto* d_kv_lens = reinterpret_cast<const int32_t*>(dev(PackedStep::kKvLens));
  const auto* d_tables = reinterpret_cast<const int32_t*>(dev(PackedStep::kTables));
  v.last = reinterpret_cast<const int32_t*>(dev(PackedStep::kLastRows));
  v.work = reinterpret_cast<const int32_t*>(dev(PackedStep::kPrefillWork));
  v.dwork = reinterpret_cast<const int32_t*>(dev(PackedStep::kDecodeWork));
  v.wnum_tiles = p.wnum_tiles;
  v.wdplan = &p.wdplan;
  v.wpsplit = p.wpsplit;
  v.wwork = reinterpret_cast<const int32_t*>(dev(PackedStep::kWindowPrefillWork));
  v.wdwork = reinterpret_cast<const int32_t*>(dev(PackedStep::kWindowDecodeWork));
  v.decodes.kv_lens = d_kv_lens;
  if (kv.paged) {
    v.decodes.block_tables = d_tables;
    v.decodes.bt_stride = p.bt_stride;
  } else {
    v.decodes.slots = d_tables;
  }
  v.prefills = v.decodes;
  v.prefills.kv_lens = d_kv_lens + v.D;
  if (kv.paged)
    v.prefills.block_tables = d_tables + uint64_t{v.D} * p.bt_stride;
  else
    v.prefills.slots = d_tables + v.D;
  v.eps = static_cast<float>(cfg.model.rms_norm_eps);
  return v;
}

Result<DevPtr> ModelStep::Impl::attention(uint32_t l, const KvLayout& kv, const StepViews& v,
                                          DevPtr normed) {
  const Layer& L = layer[l];
  const uint32_t T = v.T;
  MEMSIM_ASSIGN_OR_RETURN(DevPtr qkv, act(uint64_t{T} * qkv_cols * kElem));
  MEMSIM_TRY(gemm_status(gemm->matmul(dtype, normed, L.qkv, L.qkv_bias, qkv, T,
                                      static_cast<uint32_t>(qkv_cols),
                                      static_cast<uint32_t>(hidden), stream)));
  MEMSIM_TRY(free(normed));
  if (cfg.model.qk_norm) {
    RmsNormArgs qn;
    qn.x = qn.out = qkv;
    qn.weight = L.q_norm;
    qn.tokens = T;
    qn.heads = shape.q_heads;
    qn.dim = shape.head_dim;
    qn.token_stride = qkv_cols;
    qn.eps = v.eps;
    MEMSIM_STEP_CU(rms_norm(dtype, qn, stream));
    RmsNormArgs kn = qn;
    kn.x = kn.out = qkv + q_cols * kElem;
    kn.weight = L.k_norm;
    kn.heads = shape.kv_heads;
    MEMSIM_STEP_CU(rms_norm(dtype, kn, stream));
  }
  MEMSIM_ASSIGN_OR_RETURN(DevPtr q, act(uint64_t{T} * q_cols * kElem));
  MEMSIM_STEP_CU(rope(dtype,
                      {qkv, q, v.pos, reinterpret_cast<const float*>(inv_freq), T, shape.q_heads,
                       shape.kv_heads, shape.head_dim},
                      stream));
  KvLayerView view;
  view.k = kv.k[l];
  view.v = kv.v[l];
  view.block_stride = static_cast<int64_t>(kv.block_stride / shape.kv_elem_bytes());
  view.block_size = kv.block_tokens;
  view.addressing = kv.paged ? KvAddressing::kPaged : KvAddressing::kContiguous;
  KvWriteArgs w;
  w.k_new = qkv + q_cols * kElem;
  w.v_new = qkv + (q_cols + kv_cols) * kElem;
  w.new_stride = static_cast<int64_t>(qkv_cols);
  w.slot_mapping = v.slots;
  w.num_tokens = T;
  w.cache = view;
  w.slot_tokens = kv.block_tokens;
  w.kv_scales = kv_scales;
  MEMSIM_STEP_CU(paged_kv_write(shape, w, stream));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr attn, act(uint64_t{T} * q_cols * kElem));
  LayerAttentionArgs a;
  a.cache = view;
  a.kv_scales = kv_scales;
  // A sliding-window layer reads the same tables through its own work lists (step_metadata.h).
  a.window = cfg.model.layer_window(l);
  const bool windowed = a.window != 0;
  if (v.D) {  // rows [0, D)
    a.decode = true;
    a.q = q;
    a.o = attn;
    a.seqs = v.decodes;
    a.dplan = windowed ? *v.wdplan : *v.dplan;
    a.workspace = v.workspace;
    a.work = windowed ? v.wdwork : v.dwork;
    MEMSIM_STEP_CU(layer_attention(shape, a, stream));
  }
  if (v.D < v.S) {  // rows [D, T)
    a.decode = false;
    a.q = q + uint64_t{v.D} * q_cols * kElem;
    a.o = attn + uint64_t{v.D} * q_cols * kElem;
    a.seqs = v.prefills;
    a.qo_indptr = v.indptr;
    a.work = windowed ? v.wwork : v.work;
    a.num_tiles = windowed ? v.wnum_tiles : v.num_tiles;
    a.psplit = windowed ? v.wpsplit : v.psplit;
    a.workspace = v.workspace;
    MEMSIM_STEP_CU(layer_attention(shape, a, stream));
  }
  MEMSIM_TRY(free(q));
  MEMSIM_TRY(free(qkv));
  return attn;
}

Status ModelStep::Impl::decoder_layer(uint32_t l, const KvLayout& kv, const StepViews& v,
                                      DevPtr residual, DevPtr& x) {
  const Layer& L = layer[l];
  const uint32_t T = v.T;
  const uint64_t row_elems = uint64_t{T} * hidden;
  DevPtr normed = 0;
  RmsNormArgs n;
  n.weight = L.input_norm;
  n.tokens = T;
  n.dim = static_cast<uint32_t>(hidden);
  n.eps = v.eps;
  if (l == 0) {  // vLLM: residual = hidden_states; hidden_states = input_layernorm(...)
    MEMSIM_ASSIGN_OR_RETURN(normed, act(uint64_t{T} * hidden * kElem));
    n.x = residual;
    n.out = normed;
  } else {  // fused_add_rms_norm in place on the previous layer's output
    normed = x;
    n.x = n.out = x;
    n.residual = residual;
  }
  MEMSIM_STEP_CU(rms_norm(dtype, n, stream));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr attn, attention(l, kv, v, normed));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr o_part, act(row_elems * kElem));
  MEMSIM_TRY(gemm_status(gemm->matmul(dtype, attn, L.o, 0, o_part, T, static_cast<uint32_t>(hidden),
                                      static_cast<uint32_t>(q_cols), stream)));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr o, reduced(o_part, row_elems));
  MEMSIM_TRY(free(attn));
  RmsNormArgs pn;
  pn.x = pn.out = o;
  pn.residual = residual;
  pn.weight = L.post_norm;
  pn.tokens = T;
  pn.dim = static_cast<uint32_t>(hidden);
  pn.eps = v.eps;
  MEMSIM_STEP_CU(rms_norm(dtype, pn, stream));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr gu, act(uint64_t{T} * 2 * inter * kElem));
  MEMSIM_TRY(
      gemm_status(gemm->matmul(dtype, o, L.gate_up, 0, gu, T, static_cast<uint32_t>(2 * inter),
                               static_cast<uint32_t>(hidden), stream)));
  MEMSIM_TRY(free(o));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr h, act(uint64_t{T} * inter * kElem));
  MEMSIM_STEP_CU(silu_and_mul(dtype, gu, h, T, static_cast<uint32_t>(inter), stream));
  MEMSIM_TRY(free(gu));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr down_part, act(row_elems * kElem));
  MEMSIM_TRY(
      gemm_status(gemm->matmul(dtype, h, L.down, 0, down_part, T, static_cast<uint32_t>(hidden),
                               static_cast<uint32_t>(inter), stream)));
  MEMSIM_ASSIGN_OR_RETURN(x, reduced(down_part, row_elems));
  MEMSIM_TRY(free(h));
  return {};
}

Status ModelStep::Impl::head(const StepViews& v, DevPtr residual, DevPtr x, void* host_next,
                             bool logits_out) {
  const uint32_t T = v.T, S = v.S;
  // Final norm (fused with the last residual add), each sequence's last row, LM head, argmax.
  RmsNormArgs fn;
  fn.weight = final_norm;
  fn.tokens = T;
  fn.dim = static_cast<uint32_t>(hidden);
  fn.eps = v.eps;
  DevPtr final_rows = x;
  if (x) {
    fn.x = fn.out = x;
    fn.residual = residual;
  } else {  // no layer ran
    MEMSIM_ASSIGN_OR_RETURN(final_rows, act(uint64_t{T} * hidden * kElem));
    fn.x = residual;
    fn.out = final_rows;
  }
  MEMSIM_STEP_CU(rms_norm(dtype, fn, stream));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr last, act(uint64_t{S} * hidden * kElem));
  MEMSIM_STEP_CU(
      gather_rows(dtype, final_rows, v.last, last, S, static_cast<uint32_t>(hidden), stream));
  MEMSIM_TRY(free(final_rows));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr logits, lm_head_logits(last, S));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr next, act(uint64_t{S} * 4));
  MEMSIM_STEP_CU(argmax_rows(dtype, logits, S, static_cast<uint32_t>(vocab), vocab_padded,
                             reinterpret_cast<int32_t*>(next), stream));
  if (logits_out) {  // the model's vocab columns of each row
    logits_host.resize(uint64_t{S} * vocab);
    MEMSIM_STEP_CU(cudaMemcpy2DAsync(logits_host.data(), vocab * kElem,
                                     reinterpret_cast<void*>(logits), vocab_padded * kElem,
                                     vocab * kElem, S, cudaMemcpyDeviceToHost, stream));
  }
  MEMSIM_TRY(free(logits));
  MEMSIM_STEP_CU(cudaMemcpyAsync(host_next, reinterpret_cast<void*>(next), uint64_t{S} * 4,
                                 cudaMemcpyDeviceToHost, stream));
  return free(next);
}

Status ModelStep::Impl::forward(const KvLayout& kv, const PackedStep& p, DevPtr meta,
                                void* host_next, bool logits_out) {
  StepViews v = views(kv, p, meta);
  const uint64_t ws_bytes =
      std::max({v.D ? p.dplan.workspace_bytes : 0, v.D && p.window ? p.wdplan.workspace_bytes : 0,
                v.D < v.S ? p.pworkspace_bytes : 0, v.D < v.S ? p.wpworkspace_bytes : 0});
  if (ws_bytes) {
    MEMSIM_ASSIGN_OR_RETURN(v.workspace, act(ws_bytes));
  }
  const uint64_t row_elems = uint64_t{v.T} * hidden;  // a [T, hidden] activation
  MEMSIM_ASSIGN_OR_RETURN(DevPtr looked_up, act(row_elems * kElem));
  MEMSIM_STEP_CU(embedding(dtype, embed, v.ids, looked_up, v.T, static_cast<uint32_t>(hidden),
                           static_cast<uint32_t>(vocab_rows), stream,
                           static_cast<uint32_t>(uint64_t{tp_rank} * vocab_rows)));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr residual, reduced(looked_up, row_elems));
  DevPtr x = 0;  // the layer's input before its norm (null in layer 0: the residual itself)
  for (uint32_t l = 0; l < layers; ++l) MEMSIM_TRY(decoder_layer(l, kv, v, residual, x));
  MEMSIM_TRY(head(v, residual, x, host_next, logits_out));
  MEMSIM_TRY(free(residual));
  return free(v.workspace);
}

Result<StepResult> ModelStep::Impl::run(const KvLayout& kv, const std::vector<StepSeqInput>& seqs) {
  if (seqs.empty()) return StepResult{};
  run_start = std::chrono::steady_clock::now();
  // A decode step replays the smallest captured graph of its batch or more over the same layout,
  // padded as vLLM pads a decode batch to the next capture size.
  if (auto g = graphs.lower_bound(static_cast<uint32_t>(seqs.size()));
      g != graphs.end() && g->second.kv_k0 == (kv.k.empty() ? 0 : kv.k[0]) &&
      std::all_of(seqs.begin(), seqs.end(),
                  [](const StepSeqInput& s) { return s.tokens.size() == 1; }))
    return replay(g->second, kv, seqs);
  PackedStep& p = step_packed;
  MEMSIM_TRY(packer.pack(kv, seqs, 0, &p));
  const uint64_t down_bytes = align16(uint64_t{p.S} * 4);
  if (staging_bytes < p.bytes.size() + down_bytes) {
    if (staging) MEMSIM_TRY(backend.host_free_pinned(staging));
    staging = 0;
    staging_bytes = 0;
    MEMSIM_ASSIGN_OR_RETURN(staging, backend.host_malloc_pinned(p.bytes.size() + down_bytes));
    staging_bytes = p.bytes.size() + down_bytes;
  }
  auto* host = reinterpret_cast<uint8_t*>(staging);
  std::memcpy(host, p.bytes.data(), p.bytes.size());
  const double prep_ms = since_run_start();
  MEMSIM_STEP_CU(cudaEventRecord(ev0, stream));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr meta, act(p.bytes.size()));
  MEMSIM_STEP_CU(cudaMemcpyAsync(reinterpret_cast<void*>(meta), host, p.bytes.size(),
                                 cudaMemcpyHostToDevice, stream));
  MEMSIM_TRY(forward(kv, p, meta, host + p.bytes.size(), cfg.return_logits));
  MEMSIM_STEP_CU(cudaEventRecord(ev1, stream));
  MEMSIM_TRY(free(meta));
  MEMSIM_STEP_CU(cudaStreamSynchronize(stream));
  StepResult r;
  r.prep_ms = prep_ms;
  r.decode = p.decode;
  r.prefill_kv_chunk = p.psplit.kv_chunk;
  r.next_tokens.resize(p.S);
  std::vector<int32_t> packed(p.S);
  std::memcpy(packed.data(), host + p.bytes.size(), uint64_t{p.S} * 4);
  for (uint32_t i = 0; i < p.S; ++i) r.next_tokens[p.order[i]] = packed[i];
  float ms = 0;
  MEMSIM_STEP_CU(cudaEventElapsedTime(&ms, ev0, ev1));
  r.gpu_ms = ms;
  if (cfg.return_logits) {  // rows back in the caller's order
    r.logits.resize(logits_host.size());
    for (uint32_t i = 0; i < p.S; ++i)
      std::copy_n(logits_host.begin() + int64_t{i} * int64_t(vocab), vocab,
                  r.logits.begin() + int64_t{p.order[i]} * int64_t(vocab));
  }
  return r;
}

Status ModelStep::Impl::capture_decode(const KvLayout& kv, uint32_t batch, uint32_t max_context) {
  if (batch == 0 || batch > cfg.max_seqs || max_context == 0 || !kv.paged)
    return make_error(ErrorCode::kInvalidArgument,
                      "capture_decode: a batch of 1..max_seqs over a paged layout");
  if (graphs.count(batch)) return make_error(ErrorCode::kInvalidState, "batch already captured");
  Graph g;
  g.batch = batch;
  g.max_context = max_context;
  g.kv_k0 = kv.k.empty() ? 0 : kv.k[0];
  MEMSIM_ASSIGN_OR_RETURN(Template * t, decode_template(kv, batch, max_context));
  g.layout = t->layout;
  MEMSIM_ASSIGN_OR_RETURN(g.meta, act(g.layout.bytes.size()));
  MEMSIM_ASSIGN_OR_RETURN(g.host_in, backend.host_malloc_pinned(g.layout.bytes.size()));
  MEMSIM_ASSIGN_OR_RETURN(g.host_out, backend.host_malloc_pinned(align16(uint64_t{batch} * 4)));
  std::memcpy(reinterpret_cast<void*>(g.host_in), g.layout.bytes.data(), g.layout.bytes.size());
  auto fail = [&](Status st) {
    (void)free(g.meta);
    (void)backend.host_free_pinned(g.host_in);
    (void)backend.host_free_pinned(g.host_out);
    return st;
  };
  // Warm-up (allocator blocks, cuBLASLt plans), then the same forward captured.
  Status st =
      cu(cudaMemcpyAsync(reinterpret_cast<void*>(g.meta), reinterpret_cast<void*>(g.host_in),
                         g.layout.bytes.size(), cudaMemcpyHostToDevice, stream),
         "upload");
  if (st.ok()) st = forward(kv, g.layout, g.meta, reinterpret_cast<void*>(g.host_out), false);
  if (st.ok()) st = cu(cudaStreamSynchronize(stream), "warm-up");
  if (!st.ok()) return fail(st);
  cudaGraph_t graph = nullptr;
  st = cu(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "begin capture");
  if (st.ok()) {
    const Status fw = forward(kv, g.layout, g.meta, reinterpret_cast<void*>(g.host_out), false);
    st = cu(cudaStreamEndCapture(stream, &graph), "end capture");
    if (!fw.ok()) st = fw;
  }
  if (st.ok()) st = cu(cudaGraphInstantiate(&g.exec, graph, 0), "instantiate");
  if (graph) cudaGraphDestroy(graph);
  if (st.ok() && tp) st = tp->register_graph_buffers();  // its collectives' inputs, to the peers
  if (!st.ok()) return fail(st);
  graphs.emplace(batch, std::move(g));
  return {};
}

Result<ModelStep::Impl::Template*> ModelStep::Impl::decode_template(const KvLayout& kv,
                                                                    uint32_t batch,
                                                                    uint32_t max_context) {
  if (batch == 0 || batch > cfg.max_seqs || max_context == 0 || !kv.paged)
    return make_error(ErrorCode::kInvalidArgument,
                      "decode template: a batch of 1..max_seqs over a paged layout");
  if (auto it = templates.find(batch); it != templates.end()) {
    if (it->second.max_context != max_context)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("decode template of batch {}: made for context {}, not {}",
                                    batch, it->second.max_context, max_context));
    return &it->second;
  }
  // Every sequence at max_context tokens reading block 0, its KV write skipped (slot -1), so a
  // run of it touches no sequence's cache. Replays upload real metadata.
  const uint32_t blocks = (max_context + kv.block_tokens - 1) / kv.block_tokens;
  std::vector<StepSeqInput> tmpl(batch);
  for (StepSeqInput& s : tmpl) {
    s.table.assign(blocks, 0);
    s.cached = max_context - 1;
    s.tokens = {0};
  }
  Template t;
  t.max_context = max_context;
  const PackedStep launch = packer.graph_launch(batch, max_context);
  MEMSIM_TRY(packer.pack(kv, tmpl, blocks, &t.layout, &launch));
  for (uint32_t i = 0; i < t.layout.T; ++i) {
    const int64_t skip = -1;
    std::memcpy(t.layout.bytes.data() + t.layout.at[PackedStep::kSlots] + i * 8, &skip, 8);
  }
  MEMSIM_ASSIGN_OR_RETURN(t.host_out, backend.host_malloc_pinned(align16(uint64_t{batch} * 4)));
  return &templates.emplace(batch, std::move(t)).first->second;
}

Result<StepResult> ModelStep::Impl::replay(const Graph& g, const KvLayout& kv,
                                           const std::vector<StepSeqInput>& seqs) {
  // Padding sequences (up to the graph's batch) have one token of the first sequence's first
  // block, write no KV (slot -1) and are not in the decode's work list: vLLM pads the batch's
  // rows, but the attention work goes to the real sequences (the list's rows split their long
  // ones where padding rows would each take one).
  const uint32_t real = static_cast<uint32_t>(seqs.size());
  const std::vector<StepSeqInput>* in = &seqs;
  if (real < g.batch) {
    padded = seqs;  // into the kept vectors
    padded.resize(g.batch);
    for (uint32_t i = real; i < g.batch; ++i) {
      padded[i].table.assign(1, seqs[0].table[0]);
      padded[i].cached = 0;
      padded[i].tokens.assign(1, 0);
    }
    in = &padded;
  }
  // The split is re-planned for these lengths within the captured launch.
  PackedStep& p = step_packed;
  MEMSIM_TRY(packer.pack(kv, *in, g.layout.bt_stride, &p, &g.layout, real));
  if (p.bt_stride != g.layout.bt_stride || p.max_kv > g.max_context)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("decode step of context {} exceeds the graph of batch {} "
                                  "(captured for {})",
                                  p.max_kv, g.batch, g.max_context));
  if (p.bytes.size() != g.layout.bytes.size() ||
      !std::equal(std::begin(p.at), std::end(p.at), std::begin(g.layout.at)))
    return make_error(ErrorCode::kInvalidState,
                      "decode replay: metadata layout differs from the capture's");
  for (uint32_t t = real; t < p.T; ++t) {
    const int64_t skip = -1;
    std::memcpy(p.bytes.data() + p.at[PackedStep::kSlots] + t * 8, &skip, 8);
  }
  std::memcpy(reinterpret_cast<void*>(g.host_in), p.bytes.data(), p.bytes.size());
  const double prep_ms = since_run_start();
  MEMSIM_STEP_CU(cudaEventRecord(ev0, stream));
  MEMSIM_STEP_CU(cudaMemcpyAsync(reinterpret_cast<void*>(g.meta),
                                 reinterpret_cast<void*>(g.host_in), p.bytes.size(),
                                 cudaMemcpyHostToDevice, stream));
  MEMSIM_STEP_CU(cudaGraphLaunch(g.exec, stream));
  MEMSIM_STEP_CU(cudaEventRecord(ev1, stream));
  MEMSIM_STEP_CU(cudaStreamSynchronize(stream));
  StepResult r;
  r.prep_ms = prep_ms;
  r.decode = true;
  r.graph = true;
  r.next_tokens.resize(real);
  std::memcpy(r.next_tokens.data(), reinterpret_cast<void*>(g.host_out), uint64_t{real} * 4);
  float ms = 0;
  MEMSIM_STEP_CU(cudaEventElapsedTime(&ms, ev0, ev1));
  r.gpu_ms = ms;
  return r;
}

ModelStep::ModelStep(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ModelStep::~ModelStep() = default;

Result<std::unique_ptr<ModelStep>> ModelStep::create(const ModelStepConfig& config,
                                                     Backend& backend) {
  if (backend.name() != "cuda")
    return make_error(ErrorCode::kNotSupported, "the model step runs on the CUDA backend");
  auto impl = std::make_unique<Impl>(config, backend);
  MEMSIM_TRY(impl->init());
  return std::unique_ptr<ModelStep>(new ModelStep(std::move(impl)));
}

Result<StepResult> ModelStep::run(const KvLayout& kv, const std::vector<StepSeqInput>& seqs) {
  return impl_->run(kv, seqs);
}

Status ModelStep::capture_decode(const KvLayout& kv, uint32_t batch, uint32_t max_context) {
  return impl_->capture_decode(kv, batch, max_context);
}

Result<std::vector<uint8_t>> ModelStep::decode_template(const KvLayout& kv, uint32_t batch,
                                                        uint32_t max_context, uint32_t context) {
  MEMSIM_ASSIGN_OR_RETURN(Impl::Template * t, impl_->decode_template(kv, batch, max_context));
  std::vector<uint8_t> bytes = t->layout.bytes;
  if (context == 0 || context == max_context) return bytes;
  if (context > max_context)
    return make_error(ErrorCode::kInvalidArgument, "decode template: context above max_context");
  const auto pos = static_cast<int32_t>(context - 1), len = static_cast<int32_t>(context);
  for (uint32_t i = 0; i < batch; ++i) {
    std::memcpy(bytes.data() + t->layout.at[PackedStep::kPositions] + i * 4, &pos, 4);
    std::memcpy(bytes.data() + t->layout.at[PackedStep::kKvLens] + i * 4, &len, 4);
  }
  // The decode work lists (and the windowed layers') re-planned for these lengths within the
  // captured launches.
  const std::vector<int32_t> lens(batch, len);
  const DecodeWork w = plan_decode_work(impl_->shape, lens, impl_->limits, &t->layout.dplan);
  std::memcpy(bytes.data() + t->layout.at[PackedStep::kDecodeWork], w.words.data(),
              w.words.size() * 4);
  if (t->layout.window) {
    const DecodeWork ww =
        plan_decode_work(impl_->shape, lens, impl_->limits, &t->layout.wdplan, t->layout.window);
    std::memcpy(bytes.data() + t->layout.at[PackedStep::kWindowDecodeWork], ww.words.data(),
                ww.words.size() * 4);
  }
  return bytes;
}

Status ModelStep::enqueue_decode(const KvLayout& kv, uint32_t batch, uint32_t max_context,
                                 DevPtr meta, uint64_t stream, TensorAllocator* mem) {
  Impl& m = *impl_;
  MEMSIM_ASSIGN_OR_RETURN(Impl::Template * t, m.decode_template(kv, batch, max_context));
  // The forward enqueues on the member stream: point it at the caller's for this call.
  const cudaStream_t own = m.stream;
  m.stream = reinterpret_cast<cudaStream_t>(stream);
  m.ext = mem;
  const Status st = m.forward(kv, t->layout, meta, reinterpret_cast<void*>(t->host_out), false);
  m.ext = nullptr;
  m.stream = own;
  return st;
}

Status ModelStep::release_cached() {
  return impl_->alloc.empty_cache();
}

Result<uint32_t> ModelStep::warm_up_gemms() {
  Impl& m = *impl_;
  // Every row count a step's GEMM can have is covered by these plans (kernels::LtGemm).
  const auto counts = [](uint32_t most) { return kernels::LtGemm::plan_rows(most); };
  const uint32_t T = m.cfg.max_tokens, S = std::min(m.cfg.max_seqs, T);
  const uint64_t in_cols = std::max({m.hidden, m.q_cols, m.inter});
  const uint64_t out_elems = std::max(uint64_t{T} * std::max({m.qkv_cols, 2 * m.inter, m.hidden}),
                                      uint64_t{S} * m.vocab_rows);
  MEMSIM_ASSIGN_OR_RETURN(DevPtr x, m.act(uint64_t{T} * in_cols * kElem));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr y, m.act(out_elems * kElem));
  MEMSIM_STEP_CU(
      cudaMemsetAsync(reinterpret_cast<void*>(x), 0, uint64_t{T} * in_cols * kElem, m.stream));
  uint32_t launched = 0;
  const Impl::Layer& L = m.layer[0];
  const auto n32 = [](uint64_t v) { return static_cast<uint32_t>(v); };
  struct Gemm {
    DevPtr w, bias;
    uint64_t n, k;
    uint32_t most;
  };
  const Gemm gemms[] = {{L.qkv, L.qkv_bias, m.qkv_cols, m.hidden, T},
                        {L.o, 0, m.hidden, m.q_cols, T},
                        {L.gate_up, 0, 2 * m.inter, m.hidden, T},
                        {L.down, 0, m.hidden, m.inter, T},
                        {m.lm_head, 0, m.vocab_rows, m.hidden, S}};
  for (const Gemm& g : gemms)
    MEMSIM_TRY(gemm_status(m.gemm->warm_up(m.dtype, x, g.w, g.bias, y, n32(g.n), n32(g.k),
                                           counts(g.most), m.stream, &launched)));
  MEMSIM_STEP_CU(cudaStreamSynchronize(m.stream));
  MEMSIM_TRY(m.free(y));
  MEMSIM_TRY(m.free(x));
  MEMSIM_TRY(m.alloc.empty_cache());
  return launched;
}

const ModelStepConfig& ModelStep::config() const {
  return impl_->cfg;
}
const ModelShape& ModelStep::rank_model() const {
  return impl_->rank_shape;
}
uint64_t ModelStep::weight_bytes() const {
  return impl_->weight_bytes;
}
AllocatorStats ModelStep::activation_stats() const {
  return impl_->alloc.stats();
}
uint64_t ModelStep::stream() const {
  return reinterpret_cast<uint64_t>(impl_->stream);
}

}  // namespace memsim
