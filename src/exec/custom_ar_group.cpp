// The custom all-reduce group (tp_group.h: make_custom_all_reduce_group): IPC-shared buffers, the
// rank_data slots of eager and captured all-reduces, and the registration of captured inputs.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/nccl.h"
#include "kernels/custom_all_reduce.h"
#include "src/exec/tp_group.h"
#include "workload/collectives.h"

namespace memsim {
namespace {

using kernels::CarRankPtrs;

constexpr uint64_t kRankDataBytes = 8ull << 20;  // vLLM: torch.empty(8 * 1024 * 1024, uint8)
constexpr uint64_t kSlots = kRankDataBytes / sizeof(CarRankPtrs);

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  (void)cudaGetLastError();
  return make_error(ErrorCode::kDriverError,
                    fmt::format("custom all-reduce: {}: {}", what, cudaGetErrorString(e)));
}

// cuPointerGetAttribute through the runtime's driver entry point (memsim links no libcuda).
Result<uint64_t> allocation_base(uint64_t ptr) {
  using Fn = CUresult(CUDAAPI*)(void*, CUpointer_attribute, CUdeviceptr);
  static Fn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &p, CUDA_VERSION,
                                         cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return static_cast<Fn>(nullptr);
    return reinterpret_cast<Fn>(p);
  }();
  if (!fn) return make_error(ErrorCode::kDriverError, "cuPointerGetAttribute not found");
  CUdeviceptr base = 0;
  if (const CUresult r =
          fn(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, static_cast<CUdeviceptr>(ptr));
      r != CUDA_SUCCESS)
    return make_error(ErrorCode::kDriverError,
                      fmt::format("cuPointerGetAttribute(RANGE_START_ADDR, {:#x}): CUresult {}",
                                  ptr, static_cast<int>(r)));
  return static_cast<uint64_t>(base);
}

// What a rank tells its peers of one captured input: the IPC handle of its allocation and the
// input's offset in it.
struct InputRecord {
  cudaIpcMemHandle_t handle;
  uint64_t offset;
};
static_assert(sizeof(InputRecord) == 72);

class CustomArGroup final : public TpGroup {
 public:
  CustomArGroup(Nccl& nccl, uint32_t size, uint32_t rank)
      : nccl_(nccl), fallback_(make_nccl_group(nccl, size, rank)), size_(size), rank_(rank) {}
  ~CustomArGroup() override {
    release_graph_buffers();
    (void)Nccl::close_peers(meta_peers_, static_cast<int>(rank_));
    (void)Nccl::close_peers(data_peers_, static_cast<int>(rank_));
    for (void* p : {meta_, data_, rank_data_, scratch_})
      if (p) cudaFree(p);
  }

  Status init();

  uint32_t size() const override { return size_; }
  uint32_t rank() const override { return rank_; }
  Status all_reduce(kernels::KvDtype dtype, DevPtr in, DevPtr out, uint64_t elems,
                    uint64_t stream) override;
  Status all_gather(DevPtr in, DevPtr out, uint64_t bytes, uint64_t stream) override {
    return fallback_->all_gather(in, out, bytes, stream);
  }
  Result<uint64_t> host_max(uint64_t value) override { return fallback_->host_max(value); }
  Result<uint64_t> host_min(uint64_t value) override { return fallback_->host_min(value); }
  Status register_graph_buffers() override;
  void release_graph_buffers() override {
    for (const auto& [key, ptr] : opened_)
      (void)cudaIpcCloseMemHandle(reinterpret_cast<void*>(ptr));
    (void)cudaGetLastError();
    opened_.clear();
    pending_.clear();
    pending_ipc_.clear();
    next_slot_ = pending_first_ = 1;
  }
  const char* all_reduce_kind() const override { return "custom"; }

 private:
  uint64_t slot_addr(uint64_t slot) const {
    return reinterpret_cast<uint64_t>(rank_data_) + slot * sizeof(CarRankPtrs);
  }
  Result<uint64_t> open_peer(const cudaIpcMemHandle_t& handle);
  Status register_pending();
  // What the peers need to open the allocation holding `ptr` (its IPC handle and ptr's offset
  // in it); nothing when cudaIpc cannot share it (memory not cudaMalloc'd).
  static std::optional<InputRecord> ipc_record(uint64_t ptr);

  Nccl& nccl_;
  std::unique_ptr<TpGroup> fallback_;
  uint32_t size_, rank_;
  void* meta_ = nullptr;       // CarSignal + max_size of two-stage scratch
  void* data_ = nullptr;       // max_size: eager inputs are copied here
  void* rank_data_ = nullptr;  // kSlots CarRankPtrs: slot 0 the data buffers, then graph inputs
  void* scratch_ = nullptr;    // the handles' exchange (grown as needed)
  uint64_t scratch_bytes_ = 0;
  std::vector<uint64_t> meta_peers_, data_peers_;
  uint64_t next_slot_ = 1;                  // the next graph input's slot
  std::vector<DevPtr> pending_;             // inputs captured since the last registration
  std::vector<InputRecord> pending_ipc_;    // and what the peers need to open each
  uint64_t pending_first_ = 1;              // the slot of pending_[0]
  std::map<std::string, uint64_t> opened_;  // a peer's handle -> its mapping here
};

Status CustomArGroup::init() {
  if (!custom_all_reduce_supported(size_))
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("custom all-reduce: {} ranks (vLLM's kernel takes 2, 4, 6 or 8)", size_));
  const uint64_t meta_bytes = sizeof(kernels::CarSignal) + kCustomAllReduceMaxSize;
  MEMSIM_TRY(cuda_status(cudaMalloc(&meta_, meta_bytes), "cudaMalloc(meta)"));
  MEMSIM_TRY(cuda_status(cudaMemset(meta_, 0, meta_bytes), "cudaMemset(meta)"));
  MEMSIM_TRY(cuda_status(cudaMalloc(&data_, kCustomAllReduceMaxSize), "cudaMalloc(buffer)"));
  MEMSIM_TRY(cuda_status(cudaMalloc(&rank_data_, kRankDataBytes), "cudaMalloc(rank_data)"));
  scratch_bytes_ = 64 * 1024;
  MEMSIM_TRY(cuda_status(cudaMalloc(&scratch_, scratch_bytes_), "cudaMalloc(exchange)"));
  const auto scratch = reinterpret_cast<uint64_t>(scratch_);
  const int world = static_cast<int>(size_), me = static_cast<int>(rank_);
  MEMSIM_ASSIGN_OR_RETURN(
      meta_peers_, nccl_.exchange_ipc(reinterpret_cast<uint64_t>(meta_), scratch, world, me));
  MEMSIM_ASSIGN_OR_RETURN(
      data_peers_, nccl_.exchange_ipc(reinterpret_cast<uint64_t>(data_), scratch, world, me));
  CarRankPtrs eager{};
  for (uint32_t r = 0; r < size_; ++r) eager.ptrs[r] = data_peers_[r];
  return cuda_status(cudaMemcpy(rank_data_, &eager, sizeof eager, cudaMemcpyHostToDevice),
                     "cudaMemcpy(rank_data)");
}

std::optional<InputRecord> CustomArGroup::ipc_record(uint64_t ptr) {
  Result<uint64_t> base = allocation_base(ptr);
  if (!base.ok()) return std::nullopt;
  InputRecord r;
  const bool ok = cudaIpcGetMemHandle(&r.handle, reinterpret_cast<void*>(*base)) == cudaSuccess;
  (void)cudaGetLastError();
  if (!ok) return std::nullopt;
  r.offset = ptr - *base;
  return r;
}

Status CustomArGroup::all_reduce(kernels::KvDtype dtype, DevPtr in, DevPtr out, uint64_t elems,
                                 uint64_t stream) {
  const uint64_t bytes = elems * kernels::dtype_bytes(dtype);
  // vLLM's should_custom_ar: a 16-byte multiple under max_size (and in == out is not its case:
  // the kernel reads its peers' inputs while they write their results).
  if (bytes % 16 != 0 || bytes >= kCustomAllReduceMaxSize || in % 16 != 0 || out % 16 != 0 ||
      in == out)
    return fallback_->all_reduce(dtype, in, out, elems, stream);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MEMSIM_TRY(cuda_status(cudaStreamIsCapturing(s, &capture), "cudaStreamIsCapturing"));
  uint64_t slot = 0;
  std::optional<InputRecord> shared;
  if (capture == cudaStreamCaptureStatusActive) shared = ipc_record(in);
  if (shared) {
    if (next_slot_ >= kSlots)
      return make_error(ErrorCode::kOutOfMemory,
                        "custom all-reduce: rank_data holds no more graph inputs");
    slot = next_slot_++;
    pending_.push_back(in);
    pending_ipc_.push_back(*shared);
  } else {
    MEMSIM_TRY(cuda_status(
        cudaMemcpyAsync(data_, reinterpret_cast<void*>(in), bytes, cudaMemcpyDeviceToDevice, s),
        "copy into the IPC buffer"));
  }
  kernels::CustomAllReduceParams p;
  p.inputs = reinterpret_cast<const CarRankPtrs*>(slot_addr(slot));
  for (uint32_t r = 0; r < size_; ++r) p.signals[r] = meta_peers_[r];
  p.out = out;
  p.ranks = size_;
  p.rank = rank_;
  p.elems = elems;
  p.two_stage = kernels::custom_all_reduce_two_stage(size_, bytes);
  return cuda_status(kernels::custom_all_reduce(dtype, p, s), "custom_all_reduce");
}

Result<uint64_t> CustomArGroup::open_peer(const cudaIpcMemHandle_t& handle) {
  std::string key(reinterpret_cast<const char*>(&handle), sizeof handle);
  if (auto it = opened_.find(key); it != opened_.end()) return it->second;
  void* p = nullptr;
  MEMSIM_TRY(cuda_status(cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess),
                         "cudaIpcOpenMemHandle(graph input)"));
  opened_.emplace(std::move(key), reinterpret_cast<uint64_t>(p));
  return reinterpret_cast<uint64_t>(p);
}

Status CustomArGroup::register_graph_buffers() {
  Status st = register_pending();
  pending_.clear();  // registered, or failed: a later registration starts after them
  pending_ipc_.clear();
  pending_first_ = next_slot_;
  return st;
}

Status CustomArGroup::register_pending() {
  const uint64_t n = pending_.size();
  MEMSIM_ASSIGN_OR_RETURN(const uint64_t most, fallback_->host_max(n));
  MEMSIM_ASSIGN_OR_RETURN(const uint64_t least, fallback_->host_min(n));
  if (most != least)
    return make_error(ErrorCode::kInvalidState,
                      fmt::format("custom all-reduce: the ranks captured {} to {} registered "
                                  "all-reduces (every rank must capture the same)",
                                  least, most));
  if (n == 0) return {};
  const uint64_t part = n * sizeof(InputRecord);
  if (scratch_bytes_ < part * (size_ + 1)) {
    cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = part * (size_ + 1);
    MEMSIM_TRY(cuda_status(cudaMalloc(&scratch_, scratch_bytes_), "cudaMalloc(exchange)"));
  }
  const auto scratch = reinterpret_cast<uint64_t>(scratch_);
  MEMSIM_TRY(cuda_status(cudaMemcpy(scratch_, pending_ipc_.data(), part, cudaMemcpyHostToDevice),
                         "cudaMemcpy(exchange)"));
  MEMSIM_TRY(nccl_.all_gather_bytes(scratch, scratch + part, part));
  std::vector<InputRecord> all(n * size_);
  MEMSIM_TRY(cuda_status(cudaMemcpy(all.data(), reinterpret_cast<void*>(scratch + part),
                                    part * size_, cudaMemcpyDeviceToHost),
                         "cudaMemcpy(exchange)"));
  std::vector<CarRankPtrs> slots(n);
  for (uint64_t i = 0; i < n; ++i)
    for (uint32_t r = 0; r < size_; ++r) {
      if (r == rank_) {
        slots[i].ptrs[r] = pending_[i];
        continue;
      }
      const InputRecord& rec = all[r * n + i];
      MEMSIM_ASSIGN_OR_RETURN(const uint64_t base, open_peer(rec.handle));
      slots[i].ptrs[r] = base + rec.offset;
    }
  MEMSIM_TRY(cuda_status(cudaMemcpy(reinterpret_cast<void*>(slot_addr(pending_first_)),
                                    slots.data(), n * sizeof(CarRankPtrs), cudaMemcpyHostToDevice),
                         "cudaMemcpy(rank_data)"));
  return {};
}

}  // namespace

Result<std::unique_ptr<TpGroup>> make_custom_all_reduce_group(Nccl& nccl, uint32_t size,
                                                              uint32_t rank) {
  auto g = std::make_unique<CustomArGroup>(nccl, size, rank);
  MEMSIM_TRY(g->init());
  return std::unique_ptr<TpGroup>(std::move(g));
}

}  // namespace memsim
