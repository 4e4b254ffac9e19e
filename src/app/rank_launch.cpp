// Rank processes of a tensor-parallel run on this host (rank_launch.h).
#include "src/app/rank_launch.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "src/app/spawn.h"

namespace memsim {

std::string nccl_id_hex(const NcclUniqueId& id) {
  std::string s;
  for (char c : id) s += fmt::format("{:02x}", static_cast<unsigned char>(c));
  return s;
}

bool nccl_id_from_hex(const std::string& hex, NcclUniqueId* id) {
  if (hex.size() != 2 * id->size()) return false;
  for (size_t i = 0; i < id->size(); ++i) {
    char* end = nullptr;
    const std::string byte = hex.substr(2 * i, 2);
    (*id)[i] = static_cast<char>(std::strtoul(byte.c_str(), &end, 16));
    if (end != byte.c_str() + 2) return false;
  }
  return true;
}

std::vector<std::string> rank_environment(bool nccl_cumem) {
  return {"NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "NVSHMEM_DISABLE_NVLS=1",
          fmt::format("NCCL_CUMEM_ENABLE={}", nccl_cumem ? 1 : 0)};
}

std::string start_rank(std::vector<std::string> argv, uint32_t rank, bool nccl_cumem,
                       RankProcess& process) {
  SpawnOptions o;
  o.stdout_path = process.log;
  o.stderr_path = process.log + ".err";
  o.program = argv.at(0);
  o.env = rank_environment(nccl_cumem);
  if (const char* tool = std::getenv("MEMSIM_TP_RANK0_TOOL"); rank == 0 && tool && *tool) {
    std::vector<std::string> words;
    std::istringstream in(tool);
    for (std::string w; in >> w;) words.push_back(w);
    if (!words.empty()) {
      argv.insert(argv.begin(), words.begin(), words.end());
      o.program = words.front();
    }
  }
  std::string why;
  process.pid = spawn_process(argv, o, &why);
  return process.pid < 0 ? "cannot start a rank: " + why : "";
}

std::string wait_ranks(std::vector<RankProcess>& ranks, int timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  size_t left = 0;
  for (const RankProcess& r : ranks) left += r.pid > 0 ? 1 : 0;
  std::string problem;
  while (left > 0) {
    for (RankProcess& r : ranks) {
      if (r.pid <= 0) continue;
      int status = 0;
      if (waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      r.pid = -1;
      --left;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && problem.empty()) problem = "a rank failed (its log: " + r.log + ")";
    }
    if (left == 0) break;
    if (!problem.empty() || std::chrono::steady_clock::now() > deadline) {
      if (problem.empty()) problem = fmt::format("the ranks did not finish in {} s", timeout_s);
      for (RankProcess& r : ranks)
        if (r.pid > 0) kill(r.pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return problem;
}

}  // namespace memsim
