// Training-side memory model: per-GPU state bytes and the allocation programs of a sharded
// data-parallel trainer (see train_program.h for what is modelled).
#include "workload/train_program.h"

#include <algorithm>

namespace memsim {

namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) {
  return (a + b - 1) / b;
}

// Widths of one TP rank's layer tensors.
struct Widths {
  uint64_t h, q, kv, inter, vocab;
};

Widths widths(const ModelShape& m, uint32_t tp) {
  return {m.hidden, uint64_t{m.heads} * m.head_dim / tp, uint64_t{m.kv_heads} * m.head_dim / tp,
          m.intermediate / tp, ceil_div(m.vocab, tp)};
}

}  // namespace

const char* to_string(Sharding s) {
  switch (s) {
    case Sharding::kNone:
      return "none";
    case Sharding::kZero1:
      return "zero1";
    case Sharding::kZero2:
      return "zero2";
    case Sharding::kZero3:
      return "zero3";
  }
  return "?";
}

const char* to_string(TrainTag t) {
  switch (t) {
    case TrainTag::kParams:
      return "train.params";
    case TrainTag::kGrads:
      return "train.grads";
    case TrainTag::kOptimizer:
      return "train.optimizer";
    case TrainTag::kActivations:
      return "train.activations";
    case TrainTag::kLogits:
      return "train.logits";
    case TrainTag::kComm:
      return "train.comm";
    case TrainTag::kReference:
      return "train.reference";
  }
  return "?";
}

std::vector<TrainUnit> train_units(const ModelShape& m, uint32_t tp) {
  const Widths w = widths(m, tp);
  std::vector<TrainUnit> units;
  // Root: vocab-parallel embedding and LM head (tied: one matrix), final norm.
  uint64_t root = w.vocab * w.h + w.h;
  if (!m.tie_embeddings) root += w.vocab * w.h;
  units.push_back({"root", root});
  uint64_t layer = w.h * w.q + 2 * w.h * w.kv + w.q * w.h;  // q, k, v, o projections
  if (m.qkv_bias) layer += w.q + 2 * w.kv;
  if (m.qk_norm) layer += 2 * m.head_dim;
  layer += 3 * w.h * w.inter;  // gate, up, down
  layer += 2 * w.h;            // input and post-attention norms
  for (uint32_t l = 0; l < m.layers; ++l) units.push_back({"layer" + std::to_string(l), layer});
  return units;
}

TrainStateBytes train_state_bytes(const ModelShape& m, const TrainSpec& s) {
  const uint64_t pb = dtype_bytes(s.param_dtype);
  // Adam: m and v in fp32, plus an fp32 master copy when the parameters are not fp32.
  const uint64_t ob = 8 + (s.param_dtype == DType::kFP32 ? 0 : 4);
  TrainStateBytes b;
  for (const TrainUnit& u : train_units(m, s.tp)) {
    const uint64_t sharded = ceil_div(u.numel, s.dp);
    b.params += pb * (s.sharding == Sharding::kZero3 ? sharded : u.numel);
    b.grads += pb * (s.sharding >= Sharding::kZero2 ? sharded : u.numel);
    b.optimizer += ob * (s.sharding >= Sharding::kZero1 ? sharded : u.numel);
  }
  return b;
}

uint64_t saved_bytes_per_token_layer(const ModelShape& m, const TrainSpec& s) {
  const Widths w = widths(m, s.tp);
  const uint64_t cb = dtype_bytes(s.compute_dtype);
  // Layer input, norm output, q/k/v after RoPE, attention output, residual after attention,
  // its norm, gate, up, SiLU(gate), SiLU(gate) x up; q and k before their norms (qk_norm).
  uint64_t elems = 4 * w.h + 2 * w.q + 2 * w.kv + 4 * w.inter;
  if (m.qk_norm) elems += w.q + w.kv;
  // fp32 extras: two RMSNorm reciprocal std per token, the attention's log-sum-exp per head.
  return cb * elems + 2 * 4 + 4 * (w.q / m.head_dim);
}

TrainProgramBuilder::TrainProgramBuilder(ModelShape model, TrainSpec spec, bool reference_model)
    : model_(std::move(model)),
      spec_(spec),
      reference_model_(reference_model),
      units_(train_units(model_, spec_.tp)) {}

uint64_t TrainProgramBuilder::shard(uint64_t numel) const {
  return ceil_div(numel, spec_.dp);
}

uint64_t TrainProgramBuilder::alloc(std::vector<TrainOp>& p, uint64_t bytes, TrainTag tag) {
  TrainOp op;
  op.kind = TrainOp::Kind::kAlloc;
  op.id = next_id();
  op.bytes = bytes;
  op.tag = tag;
  p.push_back(op);
  return op.id;
}

void TrainProgramBuilder::free(std::vector<TrainOp>& p, uint64_t id) {
  TrainOp op;
  op.kind = TrainOp::Kind::kFree;
  op.id = id;
  p.push_back(op);
}

namespace {

TrainOp make_op(TrainOp::Kind k, uint64_t id, uint64_t bytes, double flops = 0) {
  TrainOp op;
  op.kind = k;
  op.id = id;
  op.bytes = bytes;
  op.flops = flops;
  return op;
}

TrainOp host_op(TrainOp::Kind k, uint64_t id, uint64_t bytes, uint64_t slot) {
  TrainOp op = make_op(k, id, bytes);
  op.slot = slot;
  return op;
}

constexpr uint64_t kReferenceSlots = 1ull << 32, kOptimizerSlots = 2ull << 32;

}  // namespace

void TrainProgramBuilder::load_tensor(std::vector<TrainOp>& p, uint64_t bytes, TrainTag tag,
                                      uint64_t slots, bool from_host, std::vector<uint64_t>& ids,
                                      std::vector<uint64_t>& sizes) {
  const uint64_t id = alloc(p, bytes, tag);
  if (from_host) p.push_back(host_op(TrainOp::Kind::kFromHost, id, bytes, slots | ids.size()));
  ids.push_back(id);
  sizes.push_back(bytes);
}

std::vector<TrainOp> TrainProgramBuilder::load_params(bool from_host) {
  std::vector<TrainOp> p;
  const uint64_t pb = dtype_bytes(spec_.param_dtype);
  const bool z3 = spec_.sharding == Sharding::kZero3;
  TrainTensors& t = tensors_;
  t.params.clear();
  t.params_bytes.clear();
  t.reference.clear();
  t.reference_bytes.clear();
  for (const TrainUnit& u : units_)
    load_tensor(p, pb * (z3 ? shard(u.numel) : u.numel), TrainTag::kParams, 0, from_host, t.params,
                t.params_bytes);
  // The reference policy: a frozen compute-dtype copy, sharded like the parameters.
  if (reference_model_)
    for (const TrainUnit& u : units_)
      load_tensor(p, compute_bytes(z3 ? shard(u.numel) : u.numel), TrainTag::kReference,
                  kReferenceSlots, from_host, t.reference, t.reference_bytes);
  return p;
}

std::vector<TrainOp> TrainProgramBuilder::load_optimizer(bool from_host) {
  std::vector<TrainOp> p;
  tensors_.optimizer.clear();
  tensors_.optimizer_bytes.clear();
  const bool sharded = spec_.sharding >= Sharding::kZero1;
  const int states = spec_.param_dtype == DType::kFP32 ? 2 : 3;  // m, v (+ master)
  for (const TrainUnit& u : units_)
    for (int s = 0; s < states; ++s)
      load_tensor(p, 4 * (sharded ? shard(u.numel) : u.numel), TrainTag::kOptimizer,
                  kOptimizerSlots, from_host, tensors_.optimizer, tensors_.optimizer_bytes);
  return p;
}

std::vector<TrainOp> TrainProgramBuilder::unload_params(bool keep_copy) {
  std::vector<TrainOp> p;
  auto drop = [&](std::vector<uint64_t>& ids, std::vector<uint64_t>& bytes, uint64_t slots) {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (keep_copy) p.push_back(host_op(TrainOp::Kind::kToHost, ids[i], bytes[i], slots | i));
      free(p, ids[i]);
    }
    ids.clear();
    bytes.clear();
  };
  drop(tensors_.params, tensors_.params_bytes, 0);
  drop(tensors_.reference, tensors_.reference_bytes, kReferenceSlots);
  return p;
}

std::vector<TrainOp> TrainProgramBuilder::unload_optimizer(bool keep_copy) {
  std::vector<TrainOp> p;
  for (size_t i = 0; i < tensors_.optimizer.size(); ++i) {
    if (keep_copy)
      p.push_back(host_op(TrainOp::Kind::kToHost, tensors_.optimizer[i],
                          tensors_.optimizer_bytes[i], kOptimizerSlots | i));
    free(p, tensors_.optimizer[i]);
  }
  tensors_.optimizer.clear();
  tensors_.optimizer_bytes.clear();
  return p;
}

// One micro-batch's forward. `saved` receives the tensors kept for backward (in allocation
// order; the last is the logits' saved set); `held` the gathered units still live (ZeRO-3:
// the root unit, kept for backward as FSDP keeps its root unsharded).
std::vector<uint64_t> TrainProgramBuilder::alloc_layer_set(std::vector<TrainOp>& p, uint64_t T) {
  const Widths w = widths(model_, spec_.tp);
  const uint64_t cb = dtype_bytes(spec_.compute_dtype);
  std::vector<uint64_t> ids;
  if (model_.qk_norm) {  // q and k before their norms
    ids.push_back(alloc(p, T * w.q * cb, TrainTag::kActivations));
    ids.push_back(alloc(p, T * w.kv * cb, TrainTag::kActivations));
  }
  // Norm output, q, k, v, attention output, residual after attention, its norm, gate, up,
  // SiLU(gate), SiLU(gate) x up.
  for (uint64_t width : {w.h, w.q, w.kv, w.kv, w.q, w.h, w.h, w.inter, w.inter, w.inter, w.inter})
    ids.push_back(alloc(p, T * width * cb, TrainTag::kActivations));
  return ids;
}

void TrainProgramBuilder::forward_micro(std::vector<TrainOp>& p, uint64_t T, bool save,
                                        std::vector<uint64_t>* saved, std::vector<uint64_t>* held) {
  const Widths w = widths(model_, spec_.tp);
  const uint64_t cb = dtype_bytes(spec_.compute_dtype);
  const bool z3 = spec_.sharding == Sharding::kZero3;
  const bool ckpt = spec_.activation_checkpointing;
  const uint64_t S = std::max<uint64_t>(1, std::min(spec_.sequence_tokens, T));
  // Per layer: the FSDP gather of the layer's unit (prefetched `prefetch` units ahead).
  std::vector<uint64_t> gathers(units_.size(), 0);
  auto gather = [&](size_t u) {
    if (!z3 || u >= units_.size() || gathers[u] != 0) return;
    gathers[u] = alloc(p, compute_bytes(units_[u].numel), TrainTag::kComm);
    p.push_back(make_op(TrainOp::Kind::kComm, 0, compute_bytes(units_[u].numel)));
  };
  gather(0);                                                    // root: embedding
  uint64_t x = alloc(p, T * w.h * cb, TrainTag::kActivations);  // embedding output
  p.push_back(make_op(TrainOp::Kind::kMemory, 0, 2 * T * w.h * cb));
  std::vector<uint64_t> layer_saved;
  for (size_t l = 1; l < units_.size(); ++l) {
    for (size_t k = l; k <= l + spec_.prefetch; ++k) gather(k);
    // q/k/v/o and MLP matmuls, and causal attention over sequences of S tokens.
    const double flops =
        2.0 * static_cast<double>(T) * static_cast<double>(units_[l].numel) +
        2.0 * static_cast<double>(T) * static_cast<double>(S) * static_cast<double>(w.q);
    p.push_back(make_op(TrainOp::Kind::kCompute, 0, 0, flops));
    // The layer's tensors (see saved_bytes_per_token_layer), then its output.
    const std::vector<uint64_t> ids = alloc_layer_set(p, T);
    const uint64_t out = alloc(p, T * w.h * cb, TrainTag::kActivations);
    if (save && !ckpt) {
      layer_saved.push_back(x);
      for (uint64_t id : ids) layer_saved.push_back(id);
    } else {
      for (uint64_t id : ids) free(p, id);
      if (save) {
        layer_saved.push_back(x);  // checkpoint: the layer's input
      } else {
        free(p, x);
      }
    }
    x = out;
    if (z3) {
      free(p, gathers[l]);
      gathers[l] = 0;
    }
  }
  // Final norm and LM head (root unit), log-probabilities of the sampled tokens.
  const uint64_t normed = alloc(p, T * w.h * cb, TrainTag::kActivations);
  p.push_back(make_op(TrainOp::Kind::kCompute, 0, 0,
                      2.0 * static_cast<double>(T) * static_cast<double>(w.vocab * w.h)));
  std::vector<uint64_t> logits{alloc(p, T * w.vocab * cb, TrainTag::kLogits)};
  if (spec_.fp32_logits) {
    logits.push_back(alloc(p, T * w.vocab * 4, TrainTag::kLogits));  // logits.float()
    logits.push_back(alloc(p, T * w.vocab * 4, TrainTag::kLogits));  // log_softmax
    p.push_back(make_op(TrainOp::Kind::kMemory, 0, 3 * T * w.vocab * 4));
  }
  const uint64_t logprobs = alloc(p, T * 4, TrainTag::kLogits);
  if (save) {
    layer_saved.push_back(x);
    layer_saved.push_back(normed);
    for (uint64_t id : logits) layer_saved.push_back(id);
    layer_saved.push_back(logprobs);
    *saved = std::move(layer_saved);
    if (z3) held->push_back(gathers[0]);
  } else {
    free(p, x);
    free(p, normed);
    for (uint64_t id : logits) free(p, id);
    free(p, logprobs);
    if (z3) free(p, gathers[0]);
  }
}

void TrainProgramBuilder::backward_micro(std::vector<TrainOp>& p, uint64_t T,
                                         std::vector<uint64_t>& saved, std::vector<uint64_t>& held,
                                         std::vector<uint64_t>& grads, bool first) {
  const Widths w = widths(model_, spec_.tp);
  const uint64_t cb = dtype_bytes(spec_.compute_dtype);
  const uint64_t pb = dtype_bytes(spec_.param_dtype);
  const bool z3 = spec_.sharding == Sharding::kZero3;
  const bool ckpt = spec_.activation_checkpointing;
  const uint64_t S = std::max<uint64_t>(1, std::min(spec_.sequence_tokens, T));
  // Gradient of one unit: where it goes depends on the sharding.
  auto reduce_unit = [&](size_t u) {
    const uint64_t n = units_[u].numel;
    if (spec_.sharding >= Sharding::kZero2) {
      // The full gradient in the compute dtype, cast to the reduce dtype (the parameter dtype),
      // reduce-scattered into this GPU's gradient shard.
      const uint64_t full = alloc(p, compute_bytes(n), TrainTag::kGrads);
      uint64_t cast = 0;
      if (pb != cb) cast = alloc(p, pb * n, TrainTag::kComm);
      p.push_back(make_op(TrainOp::Kind::kComm, 0, pb * n));
      if (first) grads[u] = alloc(p, pb * shard(n), TrainTag::kGrads);
      if (cast) free(p, cast);
      free(p, full);
    } else {
      // ZeRO 0/1: the full gradient stays (accumulated over micro-batches) and is all-reduced
      // bucket by bucket through a bucket buffer.
      if (first) grads[u] = alloc(p, pb * n, TrainTag::kGrads);
      for (uint64_t done = 0; done < pb * n; done += spec_.bucket_bytes) {
        const uint64_t b = std::min(spec_.bucket_bytes, pb * n - done);
        const uint64_t buf = alloc(p, b, TrainTag::kComm);
        p.push_back(make_op(TrainOp::Kind::kComm, 0, b));
        free(p, buf);
      }
    }
  };
  // The saved list holds, per layer, its input (checkpointing) or its full saved set; then the
  // last hidden state, the final norm's output, the logits and the log-probabilities.
  const size_t per_layer = ckpt ? 1 : 12 + (model_.qk_norm ? 2 : 0);
  // Loss backward through the log-softmax and the LM head.
  const uint64_t dlogits = alloc(p, T * w.vocab * (spec_.fp32_logits ? 4 : cb), TrainTag::kLogits);
  for (size_t i = saved.size(); i-- > (units_.size() - 1) * per_layer + 2;) free(p, saved[i]);
  p.push_back(make_op(TrainOp::Kind::kCompute, 0, 0,
                      4.0 * static_cast<double>(T) * static_cast<double>(w.vocab * w.h)));
  uint64_t dx = alloc(p, T * w.h * cb, TrainTag::kActivations);
  free(p, dlogits);
  free(p, saved[(units_.size() - 1) * per_layer + 1]);  // final norm output
  free(p, saved[(units_.size() - 1) * per_layer]);      // last hidden state
  std::vector<uint64_t> gathers(units_.size(), 0);
  auto gather = [&](size_t u) {
    if (!z3 || u == 0 || gathers[u] != 0) return;
    gathers[u] = alloc(p, compute_bytes(units_[u].numel), TrainTag::kComm);
    p.push_back(make_op(TrainOp::Kind::kComm, 0, compute_bytes(units_[u].numel)));
  };
  for (size_t l = units_.size() - 1; l >= 1; --l) {
    for (size_t k = l; k >= 1 && k + spec_.prefetch >= l; --k) gather(k);
    const double layer_flops =
        2.0 * static_cast<double>(T) * static_cast<double>(units_[l].numel) +
        2.0 * static_cast<double>(T) * static_cast<double>(S) * static_cast<double>(w.q);
    std::vector<uint64_t> recomputed;
    if (ckpt) {
      // Recompute the layer's forward from its checkpointed input.
      p.push_back(make_op(TrainOp::Kind::kCompute, 0, 0, layer_flops));
      recomputed = alloc_layer_set(p, T);
    }
    p.push_back(make_op(TrainOp::Kind::kCompute, 0, 0, 2.0 * layer_flops));
    // Backward temporaries: the MLP's gradients, q/k/v's, and the new input gradient.
    const uint64_t d_inter = alloc(p, T * 2 * w.inter * cb, TrainTag::kActivations);
    const uint64_t d_qkv = alloc(p, T * (w.q + 2 * w.kv) * cb, TrainTag::kActivations);
    const uint64_t d_in = alloc(p, T * w.h * cb, TrainTag::kActivations);
    reduce_unit(l);
    free(p, d_inter);
    free(p, d_qkv);
    free(p, dx);
    dx = d_in;
    for (uint64_t id : recomputed) free(p, id);
    const size_t base = (l - 1) * per_layer;
    for (size_t i = 0; i < per_layer; ++i) free(p, saved[base + i]);
    if (z3) {
      free(p, gathers[l]);
      gathers[l] = 0;
    }
  }
  // Embedding backward, then the root unit's gradient (LM head and embedding).
  reduce_unit(0);
  free(p, dx);
  for (uint64_t id : held) free(p, id);
  held.clear();
  saved.clear();
}

std::vector<TrainOp> TrainProgramBuilder::score(uint64_t tokens) {
  std::vector<TrainOp> p;
  for (uint64_t done = 0; done < tokens; done += spec_.micro_batch_tokens) {
    const uint64_t T = std::min(spec_.micro_batch_tokens, tokens - done);
    forward_micro(p, T, false, nullptr, nullptr);
  }
  return p;
}

std::vector<TrainOp> TrainProgramBuilder::train_step(uint64_t tokens) {
  std::vector<TrainOp> p;
  std::vector<uint64_t> grads(units_.size(), 0);
  bool first = true;
  for (uint64_t done = 0; done < tokens; done += spec_.micro_batch_tokens) {
    const uint64_t T = std::min(spec_.micro_batch_tokens, tokens - done);
    std::vector<uint64_t> saved, held;
    forward_micro(p, T, true, &saved, &held);
    backward_micro(p, T, saved, held, grads, first);
    first = false;
  }
  // Adam over this GPU's optimizer shard: reads and writes parameters, gradients, m and v
  // (and the master copy); the foreach implementation's fp32 temporary per tensor.
  const uint64_t pb = dtype_bytes(spec_.param_dtype);
  const bool sharded = spec_.sharding >= Sharding::kZero1;
  std::vector<uint64_t> temps;
  uint64_t streamed = 0;
  for (const TrainUnit& u : units_) {
    const uint64_t n = sharded ? shard(u.numel) : u.numel;
    if (spec_.adam_foreach) temps.push_back(alloc(p, 4 * n, TrainTag::kOptimizer));
    streamed += n * (2 * pb + 2 * 8 + (pb == 4 ? 0 : 8));
  }
  p.push_back(make_op(TrainOp::Kind::kMemory, 0, streamed));
  for (uint64_t id : temps) free(p, id);
  if (sharded && spec_.sharding != Sharding::kZero3) {
    // ZeRO 1/2: the updated shards are all-gathered into the full parameters.
    uint64_t bytes = 0;
    for (const TrainUnit& u : units_) bytes += pb * u.numel;
    p.push_back(make_op(TrainOp::Kind::kComm, 0, bytes));
  }
  for (uint64_t id : grads)
    if (id != 0) free(p, id);  // zero_grad(set_to_none=True)
  return p;
}

std::vector<TrainOp> TrainProgramBuilder::weight_sync(uint64_t bucket_bytes) {
  std::vector<TrainOp> p;
  const bool z3 = spec_.sharding == Sharding::kZero3;
  size_t u = 0;
  while (u < units_.size()) {
    uint64_t bytes = 0;
    size_t end = u;
    while (end < units_.size() &&
           (end == u || bytes + compute_bytes(units_[end].numel) <= bucket_bytes))
      bytes += compute_bytes(units_[end++].numel);
    const uint64_t id = alloc(p, bytes, TrainTag::kComm);
    if (z3) p.push_back(make_op(TrainOp::Kind::kComm, 0, bytes));
    p.push_back(make_op(TrainOp::Kind::kMemory, 0, 2 * bytes));
    p.push_back(make_op(TrainOp::Kind::kDeliver, id, bytes));
    free(p, id);
    u = end;
  }
  return p;
}

}  // namespace memsim
