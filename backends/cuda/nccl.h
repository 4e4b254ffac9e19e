// NCCL through dlopen (libnccl.so.2; no header is needed): the few entry points memsim's rank
// processes call, a communicator per process, and CUDA IPC buffers exchanged over it, as vLLM's
// custom all-reduce shares its buffers. NVLink multicast is never used (NCCL_NVLS_ENABLE=0 is
// set in every rank's environment by the launcher; nothing here calls cuMulticastCreate).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/result.h"

namespace memsim {

// ncclUniqueId: 128 opaque bytes, made by one process and handed to every rank.
using NcclUniqueId = std::array<char, 128>;

// The element types and reductions memsim uses (ncclDataType_t, ncclRedOp_t values).
enum class NcclType : int { kUint8 = 1, kFloat16 = 6, kFloat32 = 7, kFloat64 = 8, kBfloat16 = 9 };
enum class NcclOp : int { kSum = 0, kMax = 2, kMin = 3 };

class Nccl {
 public:
  // Loads $MEMSIM_NCCL, else libnccl.so.2 from the loader's path, else the Debian/Ubuntu
  // location. Errors say what was tried.
  static Result<std::unique_ptr<Nccl>> load();
  ~Nccl();
  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;

  const std::string& path() const { return path_; }
  std::string version() const;  // "2.28.3"

  Result<NcclUniqueId> unique_id() const;
  // ncclCommInitRank on the current CUDA device. One communicator per Nccl.
  Status init_rank(const NcclUniqueId& id, int world, int rank);
  // In-place sum of `count` floats at `device_ptr` on the default stream, then synchronized.
  Status all_reduce_floats(uint64_t device_ptr, size_t count);
  // Every rank's `bytes` at `send` gathered, rank by rank, into `recv` (world x bytes), synced.
  Status all_gather_bytes(uint64_t send, uint64_t recv, size_t bytes);
  // The same two enqueued on `stream` (a cudaStream_t; 0 = the default stream), not
  // synchronized: capturable into a CUDA graph. send == recv reduces in place.
  Status all_reduce(uint64_t send, uint64_t recv, size_t count, NcclType type, NcclOp op,
                    uint64_t stream);
  Status all_gather(uint64_t send, uint64_t recv, size_t bytes, uint64_t stream);
  Status destroy();

  // CUDA IPC over the communicator: each rank's allocation at `device_ptr` (a cudaMalloc'd
  // base) is opened by every other rank (cudaIpcMemLazyEnablePeerAccess), as vLLM's
  // create_shared_buffer and register_graph_buffers do. `scratch` is a device buffer of at least
  // world x 64 bytes x 2 for the exchange. Returns the peers' pointers (this rank's own at its
  // index); close them with close_peers.
  Result<std::vector<uint64_t>> exchange_ipc(uint64_t device_ptr, uint64_t scratch, int world,
                                             int rank);
  static Status close_peers(const std::vector<uint64_t>& ptrs, int rank);

 private:
  struct Api;
  explicit Nccl(std::unique_ptr<Api> api, std::string path);
  Status check(int result, const char* what) const;
  std::unique_ptr<Api> api_;
  std::string path_;
  void* comm_ = nullptr;
};

}  // namespace memsim
