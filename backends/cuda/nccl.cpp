// NCCL loaded at run time, a communicator, two collectives and the CUDA IPC exchange (nccl.h).
#include "backends/cuda/nccl.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

namespace memsim {

namespace {

// NCCL's ABI (nccl.h of 2.x): results and enums are ints, the communicator an opaque pointer,
// the unique id 128 bytes passed by value.
struct UniqueIdAbi {
  char internal[128];
};
constexpr int kNcclSuccess = 0;

}  // namespace

struct Nccl::Api {
  void* lib = nullptr;
  int (*ncclGetVersion)(int*) = nullptr;
  int (*ncclGetUniqueId)(UniqueIdAbi*) = nullptr;
  int (*ncclCommInitRank)(void**, int, UniqueIdAbi, int) = nullptr;
  int (*ncclAllReduce)(const void*, void*, size_t, int, int, void*, cudaStream_t) = nullptr;
  int (*ncclAllGather)(const void*, void*, size_t, int, void*, cudaStream_t) = nullptr;
  int (*ncclCommDestroy)(void*) = nullptr;
  const char* (*ncclGetErrorString)(int) = nullptr;
  ~Api() {
    if (lib) dlclose(lib);
  }
};

Nccl::Nccl(std::unique_ptr<Api> api, std::string path)
    : api_(std::move(api)), path_(std::move(path)) {}

Nccl::~Nccl() {
  if (comm_) api_->ncclCommDestroy(comm_);
}

Result<std::unique_ptr<Nccl>> Nccl::load() {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("MEMSIM_NCCL"); p != nullptr && *p != '\0')
    candidates.emplace_back(p);
  candidates.emplace_back("libnccl.so.2");
  candidates.emplace_back("/usr/lib/x86_64-linux-gnu/libnccl.so.2");
  auto api = std::make_unique<Api>();
  std::string path, tried;
  for (const std::string& c : candidates) {
    api->lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (api->lib) {
      path = c;
      break;
    }
    tried += (tried.empty() ? "" : ", ") + c;
  }
  if (!api->lib)
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("cannot load NCCL (tried {}; set MEMSIM_NCCL)", tried));
  std::string missing;
  auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(api->lib, name));
    if (!fn) missing += (missing.empty() ? "" : ", ") + std::string(name);
  };
  bind(api->ncclGetVersion, "ncclGetVersion");
  bind(api->ncclGetUniqueId, "ncclGetUniqueId");
  bind(api->ncclCommInitRank, "ncclCommInitRank");
  bind(api->ncclAllReduce, "ncclAllReduce");
  bind(api->ncclAllGather, "ncclAllGather");
  bind(api->ncclCommDestroy, "ncclCommDestroy");
  bind(api->ncclGetErrorString, "ncclGetErrorString");
  if (!missing.empty())
    return make_error(ErrorCode::kNotSupported, fmt::format("{} has no {}", path, missing));
  return std::unique_ptr<Nccl>(new Nccl(std::move(api), path));
}

Status Nccl::check(int result, const char* what) const {
  if (result == kNcclSuccess) return {};
  return make_error(ErrorCode::kDriverError, fmt::format("{} failed: {} ({})", what,
                                                         api_->ncclGetErrorString(result), result));
}

std::string Nccl::version() const {
  int v = 0;
  if (api_->ncclGetVersion(&v) != kNcclSuccess) return "unknown";
  // NCCL_VERSION_CODE: major x 10000 + minor x 100 + patch (2.9 onwards).
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

Result<NcclUniqueId> Nccl::unique_id() const {
  UniqueIdAbi raw{};
  MEMSIM_TRY(check(api_->ncclGetUniqueId(&raw), "ncclGetUniqueId"));
  NcclUniqueId id;
  std::memcpy(id.data(), raw.internal, id.size());
  return id;
}

Status Nccl::init_rank(const NcclUniqueId& id, int world, int rank) {
  if (comm_) return make_error(ErrorCode::kInvalidState, "NCCL communicator already made");
  UniqueIdAbi raw{};
  std::memcpy(raw.internal, id.data(), id.size());
  return check(api_->ncclCommInitRank(&comm_, world, raw, rank), "ncclCommInitRank");
}

namespace {

Status cuda_check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return make_error(ErrorCode::kDriverError,
                    fmt::format("{} failed: {}", what, cudaGetErrorString(e)));
}

}  // namespace

Status Nccl::all_reduce(uint64_t send, uint64_t recv, size_t count, NcclType type, NcclOp op,
                        uint64_t stream) {
  if (!comm_) return make_error(ErrorCode::kInvalidState, "no NCCL communicator");
  return check(
      api_->ncclAllReduce(reinterpret_cast<const void*>(send), reinterpret_cast<void*>(recv), count,
                          static_cast<int>(type), static_cast<int>(op), comm_,
                          reinterpret_cast<cudaStream_t>(stream)),
      "ncclAllReduce");
}

Status Nccl::all_gather(uint64_t send, uint64_t recv, size_t bytes, uint64_t stream) {
  if (!comm_) return make_error(ErrorCode::kInvalidState, "no NCCL communicator");
  return check(
      api_->ncclAllGather(reinterpret_cast<const void*>(send), reinterpret_cast<void*>(recv), bytes,
                          static_cast<int>(NcclType::kUint8), comm_,
                          reinterpret_cast<cudaStream_t>(stream)),
      "ncclAllGather");
}

Status Nccl::all_reduce_floats(uint64_t device_ptr, size_t count) {
  MEMSIM_TRY(all_reduce(device_ptr, device_ptr, count, NcclType::kFloat32, NcclOp::kSum, 0));
  return cuda_check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
}

Status Nccl::all_gather_bytes(uint64_t send, uint64_t recv, size_t bytes) {
  MEMSIM_TRY(all_gather(send, recv, bytes, 0));
  return cuda_check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
}

Status Nccl::destroy() {
  if (!comm_) return {};
  void* c = comm_;
  comm_ = nullptr;
  return check(api_->ncclCommDestroy(c), "ncclCommDestroy");
}

Result<std::vector<uint64_t>> Nccl::exchange_ipc(uint64_t device_ptr, uint64_t scratch, int world,
                                                 int rank) {
  constexpr size_t kHandle = sizeof(cudaIpcMemHandle_t);
  static_assert(kHandle == 64);
  cudaIpcMemHandle_t mine{};
  MEMSIM_TRY(cuda_check(cudaIpcGetMemHandle(&mine, reinterpret_cast<void*>(device_ptr)),
                        "cudaIpcGetMemHandle"));
  MEMSIM_TRY(cuda_check(
      cudaMemcpy(reinterpret_cast<void*>(scratch), &mine, kHandle, cudaMemcpyHostToDevice),
      "cudaMemcpy"));
  const uint64_t gathered = scratch + kHandle;
  MEMSIM_TRY(all_gather_bytes(scratch, gathered, kHandle));
  std::vector<cudaIpcMemHandle_t> all(static_cast<size_t>(world));
  MEMSIM_TRY(cuda_check(cudaMemcpy(all.data(), reinterpret_cast<void*>(gathered),
                                   kHandle * all.size(), cudaMemcpyDeviceToHost),
                        "cudaMemcpy"));
  std::vector<uint64_t> ptrs(all.size(), 0);
  for (int r = 0; r < world; ++r) {
    if (r == rank) {
      ptrs[static_cast<size_t>(r)] = device_ptr;
      continue;
    }
    void* p = nullptr;
    MEMSIM_TRY(cuda_check(
        cudaIpcOpenMemHandle(&p, all[static_cast<size_t>(r)], cudaIpcMemLazyEnablePeerAccess),
        "cudaIpcOpenMemHandle"));
    ptrs[static_cast<size_t>(r)] = reinterpret_cast<uint64_t>(p);
  }
  return ptrs;
}

Status Nccl::close_peers(const std::vector<uint64_t>& ptrs, int rank) {
  for (size_t r = 0; r < ptrs.size(); ++r)
    if (static_cast<int>(r) != rank && ptrs[r] != 0)
      MEMSIM_TRY(cuda_check(cudaIpcCloseMemHandle(reinterpret_cast<void*>(ptrs[r])),
                            "cudaIpcCloseMemHandle"));
  return {};
}

}  // namespace memsim
