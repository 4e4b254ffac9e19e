// CudaExecutor: builds each step's slot mappings and each KV cache group's tables and keys on the
// host, runs synth + paged_kv_write + decode/prefill attention per layer on the GPU (each layer
// through its group's table with its window); checks and swaps: cuda_executor_checks.cpp.
#include "src/app/cuda_serving.h"

#include "src/app/cuda_executor.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "kernels/attention.h"
#include "kernels/synth.h"
#include "src/exec/model_step.h"
#include "src/exec/tp_group.h"

namespace memsim {
namespace cuda_exec {

using namespace kernels;

ExecutorReport CudaExecutor::report() const {
  ExecutorReport r = report_;
  if (const auto* cuda = dynamic_cast<const CudaBackend*>(backend_)) {
    for (Primitive p : {Primitive::kMap, Primitive::kSetAccess, Primitive::kUnmap}) {
      r.measured_map_s += double(cuda->measured_time_in(p)) / 1e9;
      r.simulated_map_s += double(cuda->time_in(p)) / 1e9;
      r.map_calls += cuda->calls_of(p);
    }
  }
  return r;
}

Status CudaExecutor::begin(KvCacheManager& kv, Backend& backend, DevPtr swap_space,
                           uint64_t swap_bytes) {
  if (backend.name() != "cuda")
    return make_error(ErrorCode::kNotSupported, "the CUDA step executor needs the cuda backend");
  report_ = {};
  report_.kind = "cuda";
  if (c_.free_before_pool && *c_.free_before_pool) {
    size_t free = 0, total = 0;
    MEMSIM_CU(cudaMemGetInfo(&free, &total));
    report_.device_kv_bytes = *c_.free_before_pool - std::min<uint64_t>(free, *c_.free_before_pool);
  }
  if (std::string why = check_shape(c_.shape); !why.empty())
    return make_error(ErrorCode::kNotSupported, "attention kernels: " + why);
  kv_ = &kv;
  backend_ = &backend;
  layout_ = kv.layout();
  if (layout_.row_bytes != row_elems() * kv_elem())
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{}: rows of {} bytes, the model's are {}", kv.name(),
                                  layout_.row_bytes, row_elems() * kv_elem()));
  if (layout_.block_tokens == 0 || layout_.block_stride % kv_elem() != 0)
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("{}: a slot of {} bytes is not a whole number of {}-byte token "
                                  "rows; KV writes number rows per slot",
                                  kv.name(), layout_.block_stride, layout_.row_bytes));
  layers_run_ = c_.layers_run ? std::min(c_.layers_run, c_.layers) : c_.layers;
  report_.layers_run = layers_run_;
  plan_lanes();
  MEMSIM_CU(query_device(&limits_));
  MEMSIM_CU(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MEMSIM_CU(cudaEventCreate(&ev0_));
  MEMSIM_CU(cudaEventCreate(&ev1_));
  if (c_.model_step) {
    ModelStepConfig mc;
    mc.model = c_.model;
    mc.max_tokens = c_.max_tokens;
    mc.max_seqs = c_.max_seqs;
    mc.tp = c_.tp;
    MEMSIM_ASSIGN_OR_RETURN(model_, ModelStep::create(mc, backend));
    report_.weight_bytes = model_->weight_bytes();
    // A warmed-up server's kernels: no step of the trace pays a GEMM kernel's first load.
    const auto t0 = std::chrono::steady_clock::now();
    MEMSIM_ASSIGN_OR_RETURN(report_.warm_up_matmuls, model_->warm_up_gemms());
    report_.warm_up_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (layout_.paged)  // vLLM captures its decode sizes before serving
      for (uint32_t b : c_.graph_sizes)
        if (b <= c_.max_seqs) {
          MEMSIM_TRY(model_->capture_decode(layout_, b, c_.graph_max_context));
          ++report_.graphs_captured;
        }
  } else {
    MEMSIM_TRY(k_new_.reserve(uint64_t{c_.max_tokens} * row_elems() * elem()));
    MEMSIM_TRY(v_new_.reserve(uint64_t{c_.max_tokens} * row_elems() * elem()));
    std::vector<int64_t> slots(c_.max_tokens);  // the fp8 reference's KV writes: row i to slot i
    for (uint32_t i = 0; i < c_.max_tokens; ++i) slots[i] = i;
    if (c_.shape.kv_fp8()) MEMSIM_TRY(upload(ref_slots_, slots, stream_));
  }
  std::vector<uint64_t> regions;
  for (uint32_t l = 0; l < c_.layers; ++l) {
    regions.push_back(layout_.k[l]);
    regions.push_back(layout_.v[l]);
  }
  MEMSIM_TRY(upload(pool_regions_, regions, stream_));
  swap_space_ = swap_space;
  free_slots_.clear();
  const uint64_t slot_bytes = 2ull * c_.layers * chunk_bytes();
  for (uint64_t n = swap_space ? swap_bytes / slot_bytes : 0; n-- > 0;)
    free_slots_.push_back(static_cast<uint32_t>(n));
  MEMSIM_CU(cudaStreamSynchronize(stream_));
  return {};
}

void CudaExecutor::plan_lanes() {
  KvLanes l = kv_lanes(layout_, c_.layer_windows, c_.layers);
  lanes_ = std::move(l.lanes);
  layer_lane_ = std::move(l.layer_lane);
  plan_lane_.assign(lanes_.size(), 0);
  for (uint32_t i = 0; i < lanes_.size(); ++i)
    while (lanes_[plan_lane_[i]].window != lanes_[i].window) ++plan_lane_[i];
  groups_ = l.groups;
  slot_map_.assign(groups_, {});
  while (d_slots_.size() < groups_) d_slots_.push_back(std::make_unique<DeviceBuffer>(&own_bytes_));
}

Status CudaExecutor::build(const StepWork& w) {
  ka_.clear();
  kb_.clear();
  for (auto& m : slot_map_) m.clear();
  dec_.clear(lanes_.size());
  pre_.clear(lanes_.size());
  const uint32_t bt = layout_.block_tokens;
  for (const StepSeq& s : w.seqs) {
    const uint32_t end = s.computed + s.new_tokens;
    Part& p = s.new_tokens == 1 ? dec_ : pre_;
    for (uint32_t g = 0; g < groups_; ++g) {  // each group's table: its new tokens' slots
      kv_->seq_group_table(s.id, g, &table_);
      const uint64_t held = layout_.paged ? uint64_t{bt} * table_.size() : table_.empty() ? 0 : bt;
      if (end > held)
        return fail(s, w.step,
                    fmt::format("computes position {} but its table (KV cache group {}) holds {} "
                                "tokens",
                                end - 1, g, held));
      for (uint32_t pos = s.computed; pos < end; ++pos) {
        const int32_t b = layout_.paged ? table_[pos / bt] : table_[0];
        if (b < 0)
          return fail(
              s, w.step,
              fmt::format("writes position {} into a block its window freed (group {})", pos, g));
        slot_map_[g].push_back(layout_.paged ? int64_t{b} * bt + pos % bt : int64_t{b} * bt + pos);
      }
      for (int32_t& b : table_) b = std::max(b, 0);  // as kernel_group_table
      for (size_t i = 0; i < lanes_.size(); ++i)
        if (lanes_[i].group == g) p.lanes[i]->seq_tables.push_back(table_);
    }
    for (uint32_t pos = s.computed; pos < end; ++pos) {
      ka_.push_back(s.content->token(pos));
      kb_.push_back(pos);
    }
    p.seqs.push_back(&s);
    p.lens.push_back(static_cast<int32_t>(end));
    p.max_len = std::max(p.max_len, end);
    p.indptr.push_back(p.indptr.back() + static_cast<int32_t>(s.new_tokens));
    for (uint32_t pos = s.computed; pos < end; ++pos) {
      p.qa.push_back(query_key(s));
      p.qb.push_back(pos);
    }
  }
  MEMSIM_TRY(upload(d_ka_, ka_, stream_));
  MEMSIM_TRY(upload(d_kb_, kb_, stream_));
  for (uint32_t g = 0; g < groups_; ++g) MEMSIM_TRY(upload(*d_slots_[g], slot_map_[g], stream_));
  MEMSIM_TRY(finish_part(dec_));
  return finish_part(pre_);
}

Status CudaExecutor::finish_part(Part& p) {
  if (p.seqs.empty()) return {};
  for (size_t lane = 0; lane < lanes_.size(); ++lane) {
    LaneTables& t = *p.lanes[lane];
    for (const auto& r : t.seq_tables) t.bt_stride = std::max<uint32_t>(t.bt_stride, r.size());
    t.tables.assign(p.seqs.size() * uint64_t{t.bt_stride}, 0);
    for (size_t i = 0; i < p.seqs.size(); ++i)
      std::copy(t.seq_tables[i].begin(), t.seq_tables[i].end(),
                t.tables.begin() + i * uint64_t{t.bt_stride});
    MEMSIM_TRY(upload(t.d_tables, t.tables, stream_));
    if (!p.decode || plan_lane_[lane] != lane) continue;
    const uint32_t window = lanes_[lane].window;  // the plan splits the window only
    uint64_t sum = 0;
    for (int32_t len : p.lens)
      sum += window ? std::min<uint32_t>(static_cast<uint32_t>(len), window)
                    : static_cast<uint32_t>(len);
    t.dplan = plan_decode(c_.shape, static_cast<uint32_t>(p.seqs.size()), p.max_len, limits_, 0,
                          sum, window);
    MEMSIM_TRY(t.ws.reserve(t.dplan.workspace_bytes));
  }
  for (const auto& r : p.lanes[0]->seq_tables) p.slots.push_back(r.empty() ? 0 : r[0]);
  MEMSIM_TRY(upload(p.d_qa, p.qa, stream_));
  MEMSIM_TRY(upload(p.d_qb, p.qb, stream_));
  MEMSIM_TRY(upload(p.d_lens, p.lens, stream_));
  MEMSIM_TRY(upload(p.d_slots, p.slots, stream_));
  const uint64_t q_bytes = p.qa.size() * q_row_elems() * elem();
  MEMSIM_TRY(p.q.reserve(q_bytes));
  MEMSIM_TRY(p.o.reserve(q_bytes));
  if (!p.decode) {
    std::vector<int32_t> q_lens;
    for (const StepSeq* s : p.seqs) q_lens.push_back(static_cast<int32_t>(s->new_tokens));
    MEMSIM_TRY(upload(p.d_indptr, p.indptr, stream_));
    // A short chunk over a long prefix splits its KV (FlashInfer's split prefill), as the model
    // step's prefills do; a windowed lane splits the window its tiles read.
    bool split = false;
    for (size_t lane = 0; lane < lanes_.size(); ++lane) {
      if (plan_lane_[lane] != lane) continue;
      LaneTables& t = *p.lanes[lane];
      t.pplan = plan_prefill(c_.shape, q_lens, p.lens, &limits_, 0, 0, lanes_[lane].window);
      split = split || t.pplan.split.kv_chunk != 0;
      MEMSIM_TRY(t.ws.reserve(t.pplan.workspace_bytes));
      MEMSIM_TRY(upload(t.d_work, t.pplan.work, stream_));
    }
    if (split) ++report_.split_prefill_steps;
  }
  return {};
}

Status CudaExecutor::attend(const Part& p, LayerAttentionArgs a) {
  a.decode = p.decode;
  a.kv_scales = c_.kv_scales;
  MEMSIM_CU(layer_attention(c_.shape, a, stream_));
  return {};
}

Status CudaExecutor::synth_layer(uint32_t layer) {
  const auto n = static_cast<uint32_t>(ka_.size());
  const auto re = static_cast<uint32_t>(row_elems());
  MEMSIM_CU(synth_rows(c_.shape.dtype, k_new_.addr(), n, re, d_ka_.as<uint32_t>(),
                       d_kb_.as<uint32_t>(), synth_salt_k(layer), stream_));
  MEMSIM_CU(synth_rows(c_.shape.dtype, v_new_.addr(), n, re, d_ka_.as<uint32_t>(),
                       d_kb_.as<uint32_t>(), synth_salt_v(layer), stream_));
  for (Part* p : {&dec_, &pre_})
    if (!p->seqs.empty())
      MEMSIM_CU(synth_rows(c_.shape.dtype, p->q.addr(), static_cast<uint32_t>(p->qa.size()),
                           static_cast<uint32_t>(q_row_elems()), p->d_qa.as<uint32_t>(),
                           p->d_qb.as<uint32_t>(), synth_salt_q(layer), stream_));
  return {};
}

Status CudaExecutor::run_layer(uint32_t layer) {
  KvWriteArgs w;
  w.k_new = k_new_.addr();
  w.v_new = v_new_.addr();
  const uint32_t lane = layer_lane_[layer];
  w.slot_mapping = d_slots_[lanes_[lane].group]->as<int64_t>();
  w.num_tokens = static_cast<uint32_t>(ka_.size());
  w.cache = view(layer);
  w.slot_tokens = layout_.block_tokens;
  w.kv_scales = c_.kv_scales;
  MEMSIM_CU(paged_kv_write(c_.shape, w, stream_));
  for (const Part* p : {&dec_, &pre_}) {
    if (p->seqs.empty()) continue;
    const LaneTables& l = *p->lanes[lane];
    const LaneTables& plan = *p->lanes[plan_lane_[lane]];
    const SeqTables t{p->d_lens.as<int32_t>(), l.d_tables.as<int32_t>(), l.bt_stride,
                      p->d_slots.as<int32_t>(), nullptr};
    LayerAttentionArgs a;
    a.q = p->q.addr();
    a.o = p->o.addr();
    a.cache = view(layer);
    a.seqs = t;
    a.window = lanes_[lane].window;
    a.workspace = plan.ws.addr();
    if (p->decode) {
      a.dplan = plan.dplan;
    } else {
      a.qo_indptr = p->d_indptr.as<int32_t>();
      a.work = plan.d_work.as<int32_t>();
      a.num_tiles = plan.pplan.num_tiles;
      a.psplit = plan.pplan.split;
    }
    MEMSIM_TRY(attend(*p, a));
  }
  return {};
}

Status CudaExecutor::track_peaks() {
  // The strategy's bytes are the backend's less what the model step allocated through it.
  const Usage u = backend_->usage();
  uint64_t own = 0;
  for (const char* tag : {"weights", "activations"})
    if (auto it = u.per_tag.find(tag); it != u.per_tag.end()) own += it->second;
  report_.peak_strategy_bytes =
      std::max(report_.peak_strategy_bytes, u.physical_bytes - std::min(own, u.physical_bytes));
  if (c_.free_before_pool && *c_.free_before_pool) {
    size_t free = 0, total = 0;
    MEMSIM_CU(cudaMemGetInfo(&free, &total));
    const uint64_t drop = *c_.free_before_pool - std::min<uint64_t>(free, *c_.free_before_pool);
    own += own_bytes_;
    report_.peak_device_bytes = std::max(report_.peak_device_bytes, drop - std::min(drop, own));
  }
  return {};
}

Status CudaExecutor::run_model(const StepWork& w) {
  const auto t0 = std::chrono::steady_clock::now();
  ++report_.steps;
  // The strategy's copies (backend stream) come first; a backend that syncs its work has.
  if (!c_.backend_syncs) MEMSIM_CU(cudaDeviceSynchronize());
  const auto t_synced = std::chrono::steady_clock::now();
  report_.host_sync_s += std::chrono::duration<double>(t_synced - t0).count();
  inputs_.resize(w.seqs.size());
  for (size_t i = 0; i < w.seqs.size(); ++i) {
    const StepSeq& s = w.seqs[i];
    StepSeqInput& in = inputs_[i];
    kv_->seq_table(s.id, &in.table);
    in.cached = s.computed;
    in.tokens.clear();
    for (uint32_t pos = s.computed; pos < s.computed + s.new_tokens; ++pos)
      in.tokens.push_back(static_cast<int32_t>(s.content->token(pos) % c_.model.vocab));
  }
  report_.host_inputs_s +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_synced).count();
  auto r = model_->run(layout_, inputs_);
  if (!r.ok())
    return fail(w.seqs.front(), w.step, fmt::format("model step: {}", r.error().message));
  last_step_ns_ =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  if (c_.tp) {  // every rank's engine advances by the slowest rank's step
    auto agreed = c_.tp->host_max(static_cast<uint64_t>(last_step_ns_));
    if (!agreed.ok())
      return fail(w.seqs.front(), w.step, "step time over the ranks: " + agreed.error().message);
    report_.rank_step_s += double(last_step_ns_) / 1e9;
    report_.rank_wait_s += double(*agreed - static_cast<uint64_t>(last_step_ns_)) / 1e9;
    last_step_ns_ = static_cast<SimTime>(*agreed);
  }
  report_.measured_step_s += double(last_step_ns_) / 1e9;
  report_.gpu_step_s += r->gpu_ms / 1e3;
  report_.host_pack_s += r->prep_ms / 1e3;
  last_gpu_ms_ = r->gpu_ms;
  if (r->graph) ++report_.graph_steps;
  return track_peaks();
}

Status CudaExecutor::run_step(const StepWork& work) {
  if (model_) return run_model(work);
  ++report_.steps;
  MEMSIM_CU(cudaDeviceSynchronize());  // the strategy's copies (backend stream) come first
  MEMSIM_TRY(build(work));
  MEMSIM_TRY(track_peaks());
  if (ka_.empty()) return {};
  const uint32_t last = layers_run_ - 1;
  float total_ms = 0;
  for (uint32_t layer = 0; layer < layers_run_; ++layer) {
    MEMSIM_TRY(synth_layer(layer));
    MEMSIM_CU(cudaEventRecord(ev0_, stream_));
    MEMSIM_TRY(run_layer(layer));
    MEMSIM_CU(cudaEventRecord(ev1_, stream_));
    MEMSIM_CU(cudaEventSynchronize(ev1_));
    float ms = 0;
    MEMSIM_CU(cudaEventElapsedTime(&ms, ev0_, ev1_));
    total_ms += ms;
    if (work.validate && (layer == 0 || layer == last)) MEMSIM_TRY(check_layer(work, layer));
  }
  report_.measured_attention_s += total_ms / 1e3;
  report_.simulated_attention_s +=
      double(work.simulated_attention) / 1e9 * layers_run_ / std::max(1u, c_.layers);
  if (work.validate) ++report_.checked_steps;
  return {};
}

Status CudaExecutor::check_layer(const StepWork& w, uint32_t layer) {
  for (Part* p : {&dec_, &pre_})
    if (!p->seqs.empty()) MEMSIM_TRY(check_part(w, *p, layer));
  return {};
}

void CudaExecutor::end() {
  model_.reset();  // its weights and activations go back to the backend before the pool does
  if (stream_) cudaStreamSynchronize(stream_);
  if (ev0_) cudaEventDestroy(ev0_);
  if (ev1_) cudaEventDestroy(ev1_);
  if (stream_) cudaStreamDestroy(stream_);
  ev0_ = ev1_ = nullptr;
  stream_ = nullptr;
  kv_ = nullptr;
}

}  // namespace cuda_exec

std::unique_ptr<StepExecutor> make_cuda_executor(const CudaExecutorConfig& config) {
  return std::make_unique<cuda_exec::CudaExecutor>(config);
}

}  // namespace memsim
