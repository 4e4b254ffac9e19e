// One process per tensor-parallel rank on this host (CUDA builds): the NCCL unique id handed to
// each as hex, the environment every rank gets (NVLink multicast off), and waiting for all of
// them with a deadline (an NCCL peer that never comes would hang the others).
#pragma once

#include <sys/types.h>

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backends/cuda/nccl.h"
#include "src/app/spawn.h"
#include "src/exec/tp_group.h"

namespace memsim {

std::string nccl_id_hex(const NcclUniqueId& id);                  // 256 hex digits
bool nccl_id_from_hex(const std::string& hex, NcclUniqueId* id);  // false: not 256 hex digits

// "KEY=VALUE" entries for every rank: NCCL_NVLS_ENABLE=0 (and PyTorch's and NVSHMEM's multicast
// off), NCCL_CUMEM_ENABLE as asked.
std::vector<std::string> rank_environment(bool nccl_cumem);

struct RankProcess {
  pid_t pid = -1;
  std::string result, log;  // where the rank writes its result and its output
};

// Starts `argv` (argv[0] the program) for rank `rank` with rank_environment(nccl_cumem), its
// stdout to `log` and stderr to `log`.err; MEMSIM_TP_RANK0_TOOL, for rank 0, is a program (and
// its arguments, split at spaces: no shell) to run it under, e.g. "compute-sanitizer --tool
// memcheck". Returns "" or why it could not start.
std::string start_rank(std::vector<std::string> argv, uint32_t rank, bool nccl_cumem,
                       RankProcess& process);

// Waits for every rank; kills them all when one fails or `timeout_s` pass. Returns "" or what
// went wrong (the first failed rank, by its index in `ranks`, how it ended, and its log).
std::string wait_ranks(std::vector<RankProcess>& ranks, int timeout_s);

// Runs `argv` + {--rank r, --nccl-id ID} as ranks 0..ranks-1 (a fresh NCCL unique id; logs in a
// temporary folder, kept when a rank failed), waits for them, then copies each rank's output to
// `out`, rank by rank. Returns 0 when every rank exited 0, else 1 (and says why); 2 when NCCL
// cannot be loaded.
int run_rank_processes(const std::vector<std::string>& argv, uint32_t ranks, bool nccl_cumem,
                       int timeout_s, std::ostream& out);

// A rank's side: GPU `rank` made current, NCCL loaded and its communicator made from the
// launcher's id (hex), the group a ModelStep runs its collectives through: vLLM's custom
// all-reduce over NCCL when `custom_all_reduce` (and the rank count is one its kernel takes:
// 2, 4, 6, 8; otherwise NCCL alone, as vLLM falls back), else NCCL alone.
struct TpMember {
  std::unique_ptr<Nccl> nccl;
  std::unique_ptr<TpGroup> group;
};
Result<TpMember> join_tp_group(uint32_t ranks, int rank, const std::string& nccl_id_hex,
                               bool custom_all_reduce);

}  // namespace memsim
