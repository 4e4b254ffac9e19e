// One process per tensor-parallel rank on this host (CUDA builds): the NCCL unique id handed to
// each as hex, the environment every rank gets (NVLink multicast off), and waiting for all of
// them with a deadline (an NCCL peer that never comes would hang the others).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "backends/cuda/nccl.h"

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
// went wrong (naming the failed rank's log).
std::string wait_ranks(std::vector<RankProcess>& ranks, int timeout_s);

}  // namespace memsim
