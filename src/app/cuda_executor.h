// The CUDA step executor's types (cuda_serving.cpp runs steps, cuda_executor_checks.cpp checks
// and swaps): device buffers, a step's parts and their per-lane tables, the executor class.
#pragma once

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "src/app/cuda_serving.h"
#include "src/exec/model_step.h"
#include "src/kv/kv_lanes.h"

namespace memsim::cuda_exec {

using namespace kernels;

inline Status cuda_error(const char* what, cudaError_t e) {
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
inline uint32_t query_key(const StepSeq& s) {
  return static_cast<uint32_t>(s.request * 16 + s.sample);
}

// Reference K/V of a check are built in chunks of at most this many tokens (memory bound).
constexpr uint64_t kRefChunkTokens = 1u << 20;

// A part's tables for one lane: the group's block table of each sequence (entries of blocks the
// window freed point at block 0, vLLM's null block; the kernels read no tile before the window)
// and, in the first lane of each window only (CudaExecutor::plan_lane_), the attention plan for
// that window: decode's, or prefill's (split when a short chunk over a long prefix leaves the
// GPU idle), with its work list and workspace. The plan depends on the window and the lengths
// only, so lanes of one window share it; their layers run one after another on one stream.
struct LaneTables {
  explicit LaneTables(uint64_t* tally) : d_tables(tally), d_work(tally), ws(tally) {}
  std::vector<std::vector<int32_t>> seq_tables;
  std::vector<int32_t> tables;
  uint32_t bt_stride = 1;
  DecodePlan dplan;
  PrefillPlan pplan;
  DeviceBuffer d_tables, d_work;
  DeviceBuffer ws;  // the plan's workspace (split decode's or split prefill's partial outputs)
};

// Sequences of one kind in a step (decodes, or prefill chunks) with their device inputs.
struct Part {
  explicit Part(uint64_t* tally)
      : tally(tally),
        d_qa(tally),
        d_qb(tally),
        d_lens(tally),
        d_slots(tally),
        d_indptr(tally),
        q(tally),
        o(tally) {}
  uint64_t* tally;
  std::vector<const StepSeq*> seqs;
  std::vector<uint32_t> qa, qb;  // query keys, one per query row
  std::vector<int32_t> lens, slots, indptr;
  uint32_t max_len = 0;
  std::vector<std::unique_ptr<LaneTables>> lanes;  // one per KvLane of the executor
  DeviceBuffer d_qa, d_qb, d_lens, d_slots, d_indptr, q, o;
  void clear(size_t num_lanes) {
    seqs.clear();
    qa.clear();
    qb.clear();
    lens.clear();
    slots.clear();
    indptr.assign(1, 0);
    max_len = 0;
    while (lanes.size() < num_lanes) lanes.push_back(std::make_unique<LaneTables>(tally));
    for (auto& l : lanes) {
      l->seq_tables.clear();
      l->tables.clear();
      l->bt_stride = 1;
    }
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
  // Each layer reads its KV cache group's table with its window; the model step does not (one
  // table for every layer, each windowed layer reading it with its window: vLLM's layout under
  // --disable-hybrid-kv-cache-manager).
  bool reads_kv_groups() const override { return !c_.model_step; }
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

  uint64_t elem() const { return dtype_bytes(c_.shape.dtype); }  // Q, O and new K/V rows
  uint64_t kv_elem() const { return c_.shape.kv_elem_bytes(); }  // the KV cache (1: fp8)
  uint64_t row_elems() const { return c_.shape.row_elems(); }
  uint64_t q_row_elems() const { return uint64_t{c_.shape.q_heads} * c_.shape.head_dim; }
  KvLayerView view(uint32_t layer) const {
    return {layout_.k[layer], layout_.v[layer],
            static_cast<int64_t>(layout_.block_stride / kv_elem()),
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
  // Attention of a part: `a` as the caller planned it (q, o, cache, seqs, window, and the decode
  // plan or the prefill work list, split and workspace), launched as the part's kind.
  Status attend(const Part& p, LayerAttentionArgs a);
  // The lanes (KV cache group and window) of the model's layers.
  void plan_lanes();
  // The reference's K/V rows [0, rows) in the cache's element type (fp8: quantized by the KV
  // write from synthesized rows, as the pool's were).
  Status synth_ref_kv(uint32_t layer, uint32_t rows);
  // Synthesizes the step's new K/V rows and queries of `layer` (not timed).
  Status synth_layer(uint32_t layer);
  // KV write and attention of `layer` (timed).
  Status run_layer(uint32_t layer);
  Status check_layer(const StepWork& w, uint32_t layer);
  Status check_part(const StepWork& w, Part& p, uint32_t layer);
  Status compare(const StepWork& w, const Part& p, uint32_t layer, size_t first,
                 const std::vector<int32_t>& indptr, uint64_t q0, uint64_t q_rows);
  std::vector<uint16_t> got_, want_;  // compare's host copies
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
  std::vector<KvLane> lanes_;         // kv_lanes: layers of one group table and window
  std::vector<uint32_t> layer_lane_;  // the model's layers' lanes
  std::vector<uint32_t> plan_lane_;   // per lane: the first lane of its window (holds the plan)
  uint32_t groups_ = 1;               // KV cache groups of the pool (slot mappings)
  std::vector<std::vector<int64_t>> slot_map_;  // per group: the step's new tokens' slots
  uint64_t own_bytes_ = 0;  // device memory of the buffers below (declared first)
  std::vector<std::unique_ptr<DeviceBuffer>> d_slots_;  // per group
  DeviceBuffer d_ka_{&own_bytes_}, d_kb_{&own_bytes_}, k_new_{&own_bytes_}, v_new_{&own_bytes_},
      pool_regions_{&own_bytes_}, host_regions_{&own_bytes_}, d_pairs_{&own_bytes_};
  DeviceBuffer ref_k_{&own_bytes_}, ref_v_{&own_bytes_}, ref_a_{&own_bytes_}, ref_b_{&own_bytes_},
      ref_tables_{&own_bytes_}, ref_lens_{&own_bytes_}, ref_indptr_{&own_bytes_},
      ref_work_{&own_bytes_}, ref_q_{&own_bytes_}, ref_o_{&own_bytes_}, ref_qa_{&own_bytes_},
      ref_qb_{&own_bytes_}, ref_ws_{&own_bytes_}, ref_slots_{&own_bytes_};
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

}  // namespace memsim::cuda_exec
