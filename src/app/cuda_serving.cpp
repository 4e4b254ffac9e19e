// CudaExecutor: builds each step's slot mappings, tables and keys on the host, runs synth +
// paged_kv_write + decode/prefill attention per layer on the GPU, checks sampled steps bit for bit
// against the same kernels over K/V regenerated from each sequence's tokens (a packed token-slot
// layout of its own), and swaps sequences' rows through pinned memory with copy_blocks.
#include "src/app/cuda_serving.h"

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
namespace {

using namespace kernels;

Status cuda_error(const char* what, cudaError_t e) {
  (void)cudaGetLastError();
  return make_error(ErrorCode::kDriverError, fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

#define MEMSIM_CU(expr)                                                  \
  do {                                                                   \
    const cudaError_t memsim_cu_ = (expr);                               \
    if (memsim_cu_ != cudaSuccess) return cuda_error(#expr, memsim_cu_); \
  } while (0)

// Device memory that grows on demand; `tally` sums what every buffer of an executor holds (so the
// executor can tell its own memory from the KV pool's in cudaMemGetInfo).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(uint64_t* tally) : tally_(tally) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    cudaFree(p_);
    *tally_ -= cap_;
  }
  Status reserve(uint64_t bytes) {
    if (bytes <= cap_ && p_) return {};
    cudaFree(p_);
    p_ = nullptr;
    *tally_ -= cap_;
    cap_ = 0;
    // Whole granules: what cudaMalloc takes from the device anyway, and room to grow into.
    const uint64_t rounded = std::max<uint64_t>(1, (bytes + kGranule - 1) / kGranule) * kGranule;
    MEMSIM_CU(cudaMalloc(&p_, rounded));
    cap_ = rounded;
    *tally_ += cap_;
    return {};
  }
  template <class T = void>
  T* as() const {
    return static_cast<T*>(p_);
  }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(p_); }

 private:
  static constexpr uint64_t kGranule = 2ull << 20;
  uint64_t* tally_;
  void* p_ = nullptr;
  uint64_t cap_ = 0;
};

template <class T>
Status upload(DeviceBuffer& d, const std::vector<T>& v, cudaStream_t s) {
  MEMSIM_TRY(d.reserve(v.size() * sizeof(T)));
  if (!v.empty())
    MEMSIM_CU(cudaMemcpyAsync(d.as(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  return {};
}

// The query of a token: a function of its request, sample and position (one position per step).
uint32_t query_key(const StepSeq& s) {
  return static_cast<uint32_t>(s.request * 16 + s.sample);
}

// Reference K/V of a check are built in chunks of at most this many tokens (memory bound).
constexpr uint64_t kRefChunkTokens = 1u << 20;

// Sequences of one kind in a step (decodes, or prefill chunks) with their device inputs.
struct Part {
  explicit Part(uint64_t* tally)
      : d_qa(tally),
        d_qb(tally),
        d_lens(tally),
        d_tables(tally),
        d_slots(tally),
        d_indptr(tally),
        d_work(tally),
        q(tally),
        o(tally),
        ws(tally) {}
  std::vector<const StepSeq*> seqs;
  std::vector<std::vector<int32_t>> seq_tables;
  std::vector<uint32_t> qa, qb;  // query keys, one per query row
  std::vector<int32_t> lens, tables, slots, indptr;
  uint32_t bt_stride = 1, max_len = 0;
  DecodePlan dplan;
  PrefillPlan pplan;
  DeviceBuffer d_qa, d_qb, d_lens, d_tables, d_slots, d_indptr, d_work, q, o, ws;
  void clear() {
    seqs.clear();
    seq_tables.clear();
    qa.clear();
    qb.clear();
    lens.clear();
    tables.clear();
    slots.clear();
    indptr.assign(1, 0);
    bt_stride = 1;
    max_len = 0;
  }
  bool decode = false;
};

class CudaExecutor final : public StepExecutor {
 public:
  explicit CudaExecutor(CudaExecutorConfig c) : c_(std::move(c)) { dec_.decode = true; }
  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;
  ~CudaExecutor() override { end(); }

  Status begin(KvCacheManager& kv, Backend& backend, DevPtr swap_space,
               uint64_t swap_bytes) override;
  Status run_step(const StepWork& work) override;
  Status swap_out(SeqId seq, SeqId source, const TokenContent& content, uint32_t tokens) override;
  Status swap_in(SeqId seq, const TokenContent& content, uint32_t tokens) override;
  Status swap_drop(SeqId seq) override;
  void end() override;
  ExecutorReport report() const override;
  SimTime measured_step_ns() const override { return last_step_ns_; }
  double measured_step_gpu_ms() const override { return last_gpu_ms_; }

 private:
  // A swapped-out sequence's rows: chunks of `chunk_tokens` tokens, each in one host slot that
  // holds the chunk's rows of every layer's K and V. Samples not yet forked share their parent's.
  struct Swapped {
    std::shared_ptr<std::vector<uint32_t>> slots;
    uint32_t tokens;
  };
  uint32_t chunk_tokens() const { return layout_.paged ? layout_.block_tokens : 16; }
  uint64_t chunk_bytes() const { return uint64_t{chunk_tokens()} * layout_.row_bytes; }
  // Copies the chunks of `tokens` tokens of a table between the pool and host slots.
  Status swap_copy(const std::vector<int32_t>& table, uint32_t tokens,
                   const std::vector<uint32_t>& slots, bool out);
  // Saves `source`'s rows once under its own id (a no-op when already saved).
  Status save(SeqId source, uint32_t tokens);
  void forget(SeqId seq);  // drops a swapped sequence; its slots go back once unshared

  uint64_t elem() const { return dtype_bytes(c_.shape.dtype); }
  uint64_t row_elems() const { return c_.shape.row_elems(); }
  uint64_t q_row_elems() const { return uint64_t{c_.shape.q_heads} * c_.shape.head_dim; }
  KvLayerView view(uint32_t layer) const {
    return {layout_.k[layer], layout_.v[layer], static_cast<int64_t>(layout_.block_stride / elem()),
            layout_.paged ? layout_.block_tokens : 0,
            layout_.paged ? KvAddressing::kPaged : KvAddressing::kContiguous};
  }
  Status fail(const StepSeq& s, uint64_t step, const std::string& what) {
    report_.failure =
        fmt::format("request {} sample {}, step {}: {}", s.request, s.sample, step, what);
    return make_error(ErrorCode::kInvalidState, report_.failure);
  }
  Status build(const StepWork& w);
  Status finish_part(Part& p);
  // Attention of a part: decode with `dplan` and `workspace`, or prefill with its work list.
  Status attend(const Part& p, const KvLayerView& v, uint64_t q, uint64_t o, const SeqTables& t,
                const DecodePlan& dplan, uint64_t workspace, const int32_t* indptr,
                const int32_t* work, uint32_t tiles);
  // Synthesizes the step's new K/V rows and queries of `layer` (not timed).
  Status synth_layer(uint32_t layer);
  // KV write and attention of `layer` (timed).
  Status run_layer(uint32_t layer);
  Status check_layer(const StepWork& w, uint32_t layer);
  Status check_part(const StepWork& w, Part& p, uint32_t layer);
  // engine.gpu_step: model: the whole model step over the strategy's tables, timed.
  Status run_model(const StepWork& w);
  // Peak bytes the strategy held and the device lost (less the executor's own memory).
  Status track_peaks();

  CudaExecutorConfig c_;
  KvCacheManager* kv_ = nullptr;
  KvLayout layout_;
  DeviceLimits limits_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ev0_ = nullptr, ev1_ = nullptr;
  uint32_t layers_run_ = 0;
  std::vector<int32_t> table_;
  std::vector<uint32_t> ka_, kb_;
  std::vector<int64_t> slot_map_;
  uint64_t own_bytes_ = 0;  // device memory of the buffers below (declared first)
  DeviceBuffer d_ka_{&own_bytes_}, d_kb_{&own_bytes_}, d_slots_{&own_bytes_}, k_new_{&own_bytes_},
      v_new_{&own_bytes_}, pool_regions_{&own_bytes_}, host_regions_{&own_bytes_},
      d_pairs_{&own_bytes_};
  DeviceBuffer ref_k_{&own_bytes_}, ref_v_{&own_bytes_}, ref_a_{&own_bytes_}, ref_b_{&own_bytes_},
      ref_tables_{&own_bytes_}, ref_lens_{&own_bytes_}, ref_indptr_{&own_bytes_},
      ref_work_{&own_bytes_}, ref_q_{&own_bytes_}, ref_o_{&own_bytes_}, ref_qa_{&own_bytes_},
      ref_qb_{&own_bytes_}, ref_ws_{&own_bytes_};
  Part dec_{&own_bytes_}, pre_{&own_bytes_};  // the step's decodes and prefill chunks
  Backend* backend_ = nullptr;
  DevPtr swap_space_ = 0;
  std::vector<uint32_t> free_slots_;  // host swap slots (stack)
  std::map<SeqId, Swapped> swapped_;  // sequences whose rows are in host slots
  std::unique_ptr<ModelStep> model_;  // engine.gpu_step: model
  std::vector<StepSeqInput> inputs_;
  SimTime last_step_ns_ = 0;
  double last_gpu_ms_ = 0;
  ExecutorReport report_;
};

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
  if (layout_.row_bytes != row_elems() * elem())
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{}: rows of {} bytes, the model's are {}", kv.name(),
                                  layout_.row_bytes, row_elems() * elem()));
  if (layout_.block_tokens == 0 || layout_.block_stride % elem() != 0)
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("{}: a slot of {} bytes is not a whole number of {}-byte token "
                                  "rows; KV writes number rows per slot",
                                  kv.name(), layout_.block_stride, layout_.row_bytes));
  layers_run_ = c_.layers_run ? std::min(c_.layers_run, c_.layers) : c_.layers;
  report_.layers_run = layers_run_;
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

Status CudaExecutor::build(const StepWork& w) {
  ka_.clear();
  kb_.clear();
  slot_map_.clear();
  dec_.clear();
  pre_.clear();
  const uint32_t bt = layout_.block_tokens;
  for (const StepSeq& s : w.seqs) {
    kv_->seq_table(s.id, &table_);
    const uint32_t end = s.computed + s.new_tokens;
    const uint64_t held = layout_.paged ? uint64_t{bt} * table_.size() : table_.empty() ? 0 : bt;
    if (end > held)
      return fail(s, w.step,
                  fmt::format("computes position {} but its table holds {} tokens", end - 1, held));
    for (uint32_t pos = s.computed; pos < end; ++pos) {
      ka_.push_back(s.content->token(pos));
      kb_.push_back(pos);
      slot_map_.push_back(layout_.paged ? int64_t{table_[pos / bt]} * bt + pos % bt
                                        : int64_t{table_[0]} * bt + pos);
    }
    Part& p = s.new_tokens == 1 ? dec_ : pre_;
    p.seqs.push_back(&s);
    p.seq_tables.push_back(table_);
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
  MEMSIM_TRY(upload(d_slots_, slot_map_, stream_));
  MEMSIM_TRY(finish_part(dec_));
  return finish_part(pre_);
}

Status CudaExecutor::finish_part(Part& p) {
  if (p.seqs.empty()) return {};
  for (const auto& t : p.seq_tables) p.bt_stride = std::max<uint32_t>(p.bt_stride, t.size());
  p.tables.assign(p.seqs.size() * uint64_t{p.bt_stride}, 0);
  for (size_t i = 0; i < p.seqs.size(); ++i) {
    std::copy(p.seq_tables[i].begin(), p.seq_tables[i].end(),
              p.tables.begin() + i * uint64_t{p.bt_stride});
    p.slots.push_back(p.seq_tables[i].empty() ? 0 : p.seq_tables[i][0]);
  }
  MEMSIM_TRY(upload(p.d_qa, p.qa, stream_));
  MEMSIM_TRY(upload(p.d_qb, p.qb, stream_));
  MEMSIM_TRY(upload(p.d_lens, p.lens, stream_));
  MEMSIM_TRY(upload(p.d_tables, p.tables, stream_));
  MEMSIM_TRY(upload(p.d_slots, p.slots, stream_));
  const uint64_t q_bytes = p.qa.size() * q_row_elems() * elem();
  MEMSIM_TRY(p.q.reserve(q_bytes));
  MEMSIM_TRY(p.o.reserve(q_bytes));
  if (p.decode) {
    uint64_t sum = 0;
    for (int32_t len : p.lens) sum += static_cast<uint64_t>(len);
    p.dplan =
        plan_decode(c_.shape, static_cast<uint32_t>(p.seqs.size()), p.max_len, limits_, 0, sum);
    MEMSIM_TRY(p.ws.reserve(p.dplan.workspace_bytes));
  } else {
    std::vector<int32_t> q_lens;
    for (const StepSeq* s : p.seqs) q_lens.push_back(static_cast<int32_t>(s->new_tokens));
    p.pplan = plan_prefill(c_.shape, q_lens, p.lens);
    MEMSIM_TRY(upload(p.d_indptr, p.indptr, stream_));
    MEMSIM_TRY(upload(p.d_work, p.pplan.work, stream_));
  }
  return {};
}

Status CudaExecutor::attend(const Part& p, const KvLayerView& v, uint64_t q, uint64_t o,
                            const SeqTables& t, const DecodePlan& dplan, uint64_t workspace,
                            const int32_t* indptr, const int32_t* work, uint32_t tiles) {
  LayerAttentionArgs a;
  a.decode = p.decode;
  a.q = q;
  a.o = o;
  a.cache = v;
  a.seqs = t;
  a.dplan = dplan;
  a.workspace = workspace;
  a.qo_indptr = indptr;
  a.work = work;
  a.num_tiles = tiles;
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
  w.slot_mapping = d_slots_.as<int64_t>();
  w.num_tokens = static_cast<uint32_t>(ka_.size());
  w.cache = view(layer);
  w.slot_tokens = layout_.block_tokens;
  MEMSIM_CU(paged_kv_write(c_.shape, w, stream_));
  for (const Part* p : {&dec_, &pre_}) {
    if (p->seqs.empty()) continue;
    const SeqTables t{p->d_lens.as<int32_t>(), p->d_tables.as<int32_t>(), p->bt_stride,
                      p->d_slots.as<int32_t>(), nullptr};
    MEMSIM_TRY(attend(*p, view(layer), p->q.addr(), p->o.addr(), t, p->dplan, p->ws.addr(),
                      p->d_indptr.as<int32_t>(), p->d_work.as<int32_t>(), p->pplan.num_tiles));
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

// The same kernels over K/V regenerated from each sequence's tokens in a packed token-slot layout
// (block size 1, the table built here), with the step's split: the outputs must be identical.
Status CudaExecutor::check_part(const StepWork& w, Part& p, uint32_t layer) {
  const uint64_t qe = q_row_elems();
  std::vector<uint16_t> got, want;
  size_t first = 0;
  while (first < p.seqs.size()) {
    size_t last = first;
    uint64_t tokens = 0;
    uint32_t max_len = 0;
    while (last < p.seqs.size() &&
           (last == first || tokens + uint64_t(p.lens[last]) <= kRefChunkTokens)) {
      tokens += uint64_t(p.lens[last]);
      max_len = std::max<uint32_t>(max_len, p.lens[last]);
      ++last;
    }
    const auto c = static_cast<uint32_t>(last - first);
    std::vector<uint32_t> ra, rb, qa, qb;
    std::vector<int32_t> tables(uint64_t{c} * max_len, 0), lens, indptr{0};
    for (uint32_t i = 0; i < c; ++i) {
      const StepSeq& s = *p.seqs[first + i];
      const auto len = static_cast<uint32_t>(p.lens[first + i]);
      for (uint32_t pos = 0; pos < len; ++pos) {
        tables[uint64_t{i} * max_len + pos] = static_cast<int32_t>(ra.size());
        ra.push_back(s.content->token(pos));
        rb.push_back(pos);
      }
      lens.push_back(static_cast<int32_t>(len));
      indptr.push_back(indptr.back() + static_cast<int32_t>(s.new_tokens));
    }
    const uint64_t q0 = static_cast<uint64_t>(p.indptr[first]);
    const uint64_t q_rows = static_cast<uint64_t>(p.indptr[last]) - q0;
    qa.assign(p.qa.begin() + q0, p.qa.begin() + q0 + q_rows);
    qb.assign(p.qb.begin() + q0, p.qb.begin() + q0 + q_rows);
    MEMSIM_TRY(upload(ref_a_, ra, stream_));
    MEMSIM_TRY(upload(ref_b_, rb, stream_));
    MEMSIM_TRY(upload(ref_qa_, qa, stream_));
    MEMSIM_TRY(upload(ref_qb_, qb, stream_));
    MEMSIM_TRY(upload(ref_tables_, tables, stream_));
    MEMSIM_TRY(upload(ref_lens_, lens, stream_));
    MEMSIM_TRY(upload(ref_indptr_, indptr, stream_));
    const auto re = static_cast<uint32_t>(row_elems());
    MEMSIM_TRY(ref_k_.reserve(ra.size() * re * elem()));
    MEMSIM_TRY(ref_v_.reserve(ra.size() * re * elem()));
    MEMSIM_TRY(ref_q_.reserve(q_rows * qe * elem()));
    MEMSIM_TRY(ref_o_.reserve(q_rows * qe * elem()));
    const auto rows = static_cast<uint32_t>(ra.size());
    MEMSIM_CU(synth_rows(c_.shape.dtype, ref_k_.addr(), rows, re, ref_a_.as<uint32_t>(),
                         ref_b_.as<uint32_t>(), synth_salt_k(layer), stream_));
    MEMSIM_CU(synth_rows(c_.shape.dtype, ref_v_.addr(), rows, re, ref_a_.as<uint32_t>(),
                         ref_b_.as<uint32_t>(), synth_salt_v(layer), stream_));
    MEMSIM_CU(synth_rows(c_.shape.dtype, ref_q_.addr(), static_cast<uint32_t>(q_rows),
                         static_cast<uint32_t>(qe), ref_qa_.as<uint32_t>(), ref_qb_.as<uint32_t>(),
                         synth_salt_q(layer), stream_));
    const KvLayerView v{ref_k_.addr(), ref_v_.addr(), static_cast<int64_t>(re), 1,
                        KvAddressing::kPaged};
    const SeqTables t{ref_lens_.as<int32_t>(), ref_tables_.as<int32_t>(), max_len, nullptr,
                      nullptr};
    if (p.decode) {
      DecodePlan plan = p.dplan;  // the step's split: identical arithmetic per sequence
      plan.max_batch = c;
      plan.workspace_bytes = plan.num_splits > 1
                                 ? uint64_t{c} * plan.num_splits * c_.shape.q_heads *
                                       (c_.shape.head_dim + 1) * sizeof(float)
                                 : 0;
      MEMSIM_TRY(ref_ws_.reserve(plan.workspace_bytes));
      MEMSIM_TRY(
          attend(p, v, ref_q_.addr(), ref_o_.addr(), t, plan, ref_ws_.addr(), nullptr, nullptr, 0));
    } else {
      std::vector<int32_t> q_lens;
      for (size_t i = first; i < last; ++i) q_lens.push_back(int32_t(p.seqs[i]->new_tokens));
      const PrefillPlan plan = plan_prefill(c_.shape, q_lens, lens);
      MEMSIM_TRY(upload(ref_work_, plan.work, stream_));
      MEMSIM_TRY(attend(p, v, ref_q_.addr(), ref_o_.addr(), t, p.dplan, 0,
                        ref_indptr_.as<int32_t>(), ref_work_.as<int32_t>(), plan.num_tiles));
    }
    got.resize(q_rows * qe);
    want.resize(q_rows * qe);
    MEMSIM_CU(cudaMemcpyAsync(got.data(), p.o.as<uint16_t>() + q0 * qe, got.size() * 2,
                              cudaMemcpyDeviceToHost, stream_));
    MEMSIM_CU(cudaMemcpyAsync(want.data(), ref_o_.as(), want.size() * 2, cudaMemcpyDeviceToHost,
                              stream_));
    MEMSIM_CU(cudaStreamSynchronize(stream_));
    for (uint32_t i = 0; i < c; ++i) {
      const StepSeq& s = *p.seqs[first + i];
      const uint64_t r0 = static_cast<uint64_t>(indptr[i]),
                     r1 = static_cast<uint64_t>(indptr[i + 1]);
      for (uint64_t x = r0 * qe; x < r1 * qe; ++x) {
        if (got[x] == want[x]) continue;
        const uint64_t row = x / qe, head = (x % qe) / c_.shape.head_dim;
        return fail(s, w.step,
                    fmt::format("layer {} (checked after {}): attention output of position {} "
                                "head {} differs from the reference over its own tokens (element "
                                "{}: {:#06x}, reference {:#06x})",
                                layer, w.reason, s.computed + (row - r0), head,
                                x % c_.shape.head_dim, got[x], want[x]));
      }
      ++report_.checked_seqs;
    }
    first = last;
  }
  return {};
}

// Chunk u of a sequence: rows [u C, u C + C) of every region (K and V of each layer). In the
// pool a paged chunk is block table[u]; a contiguous chunk lies at slot base + u C rows. In host
// memory slot h holds [region][C rows] at swap_space + h x 2 layers x chunk bytes.
Status CudaExecutor::swap_copy(const std::vector<int32_t>& table, uint32_t tokens,
                               const std::vector<uint32_t>& slots, bool out) {
  const uint32_t chunks = (tokens + chunk_tokens() - 1) / chunk_tokens();
  std::vector<int64_t> pairs;
  for (uint32_t u = 0; u < chunks; ++u) {
    const int64_t pool = layout_.paged ? table[u] : u;
    pairs.push_back(out ? pool : slots[u]);
    pairs.push_back(out ? slots[u] : pool);
  }
  const uint32_t regions = 2 * c_.layers;
  const uint64_t* pool_regions = pool_regions_.as<uint64_t>();
  if (!layout_.paged) {  // the sequence's slot: regions start at its rows
    std::vector<uint64_t> bases;
    for (uint32_t l = 0; l < c_.layers; ++l)
      for (DevPtr b : {layout_.k[l], layout_.v[l]})
        bases.push_back(b + static_cast<uint64_t>(table[0]) * layout_.block_stride);
    MEMSIM_TRY(upload(host_regions_, bases, stream_));
    pool_regions = host_regions_.as<uint64_t>();
  }
  const uint64_t pool_stride = layout_.paged ? layout_.block_stride : chunk_bytes();
  const uint64_t host_stride = regions * chunk_bytes();
  MEMSIM_TRY(upload(d_pairs_, pairs, stream_));
  BlockCopyArgs a;
  a.src_regions = out ? pool_regions : nullptr;
  a.dst_regions = out ? nullptr : pool_regions;
  a.src = out ? 0 : swap_space_;
  a.dst = out ? swap_space_ : 0;
  a.src_region_stride = out ? 0 : chunk_bytes();
  a.dst_region_stride = out ? chunk_bytes() : 0;
  a.src_block_stride = out ? pool_stride : host_stride;
  a.dst_block_stride = out ? host_stride : pool_stride;
  a.block_bytes = chunk_bytes();
  a.regions = regions;
  a.pairs = d_pairs_.as<int64_t>();
  a.num_pairs = chunks;
  MEMSIM_CU(copy_blocks(a, stream_));
  MEMSIM_CU(cudaStreamSynchronize(stream_));
  return {};
}

Status CudaExecutor::save(SeqId source, uint32_t tokens) {
  if (const auto it = swapped_.find(source); it != swapped_.end()) {
    if (it->second.tokens != tokens)
      return make_error(ErrorCode::kInvalidState,
                        fmt::format("swap-out of seq {}: saved with {} tokens, now {}", source,
                                    it->second.tokens, tokens));
    return {};
  }
  const uint32_t chunks = (tokens + chunk_tokens() - 1) / chunk_tokens();
  if (chunks > free_slots_.size())
    return make_error(ErrorCode::kOutOfMemory,
                      fmt::format("swap-out of seq {}: {} chunks, {} free slots in the pinned "
                                  "swap space",
                                  source, chunks, free_slots_.size()));
  auto slots = std::make_shared<std::vector<uint32_t>>();
  for (uint32_t u = 0; u < chunks; ++u) {
    slots->push_back(free_slots_.back());
    free_slots_.pop_back();
  }
  swapped_[source] = {slots, tokens};
  kv_->seq_table(source, &table_);
  return swap_copy(table_, tokens, *slots, true);
}

// A sample not yet forked in the pool (source != seq) holds its parent's rows: it shares the
// parent's saved slots instead of a copy of its own, as the engine counts swap space.
Status CudaExecutor::swap_out(SeqId seq, SeqId source, const TokenContent&, uint32_t tokens) {
  MEMSIM_CU(cudaDeviceSynchronize());
  MEMSIM_TRY(save(source, tokens));
  if (seq != source) {
    if (swapped_.count(seq))
      return make_error(ErrorCode::kInvalidState,
                        fmt::format("swap-out of seq {}: already swapped out", seq));
    swapped_[seq] = swapped_.at(source);
  }
  return {};
}

void CudaExecutor::forget(SeqId seq) {
  const auto it = swapped_.find(seq);
  std::shared_ptr<std::vector<uint32_t>> slots = std::move(it->second.slots);
  swapped_.erase(it);
  if (slots.use_count() == 1) free_slots_.insert(free_slots_.end(), slots->begin(), slots->end());
}

Status CudaExecutor::swap_in(SeqId seq, const TokenContent&, uint32_t tokens) {
  const auto it = swapped_.find(seq);
  if (it == swapped_.end() || it->second.tokens != tokens)
    return make_error(ErrorCode::kInvalidState,
                      fmt::format("swap-in of seq {} that was not swapped out", seq));
  kv_->seq_table(seq, &table_);
  MEMSIM_TRY(swap_copy(table_, tokens, *it->second.slots, false));
  forget(seq);
  ++report_.swaps;
  return {};
}

Status CudaExecutor::swap_drop(SeqId seq) {
  if (!swapped_.count(seq))
    return make_error(ErrorCode::kInvalidState,
                      fmt::format("swap drop of seq {} that was not swapped out", seq));
  forget(seq);
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

}  // namespace

std::unique_ptr<StepExecutor> make_cuda_executor(const CudaExecutorConfig& config) {
  return std::make_unique<CudaExecutor>(config);
}

}  // namespace memsim
