// Rank processes of a tensor-parallel run on this host (rank_launch.h).
#include "src/app/rank_launch.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "src/app/spawn.h"
#include "workload/collectives.h"

namespace memsim {

std::string nccl_id_hex(const NcclUniqueId& id) {
  std::string s;
  for (char c : id) s += fmt::format("{:02x}", static_cast<unsigned char>(c));
  return s;
}

bool nccl_id_from_hex(const std::string& hex, NcclUniqueId* id) {
  if (hex.size() != 2 * id->size()) return false;
  for (size_t i = 0; i < id->size(); ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(hex[2 * i])) ||
        !std::isxdigit(static_cast<unsigned char>(hex[2 * i + 1])))
      return false;
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
    for (size_t i = 0; i < ranks.size(); ++i) {
      RankProcess& r = ranks[i];
      if (r.pid <= 0) continue;
      int status = 0;
      const pid_t got = waitpid(r.pid, &status, WNOHANG);
      if (got == 0 || (got < 0 && errno == EINTR)) continue;  // still running
      r.pid = -1;  // ended (got == pid), or not ours to wait for any more (ECHILD)
      --left;
      const bool ok = got > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (ok || !problem.empty()) continue;
      const std::string how = got < 0 ? std::string("could not be waited for")
                              : WIFEXITED(status)
                                  ? fmt::format("exited {}", WEXITSTATUS(status))
                                  : fmt::format("was ended by signal {}", WTERMSIG(status));
      problem = fmt::format("a rank failed: rank {} {} (its output: {} and {}.err)", i, how, r.log,
                            r.log);
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

int run_rank_processes(const std::vector<std::string>& argv, uint32_t ranks, bool nccl_cumem,
                       int timeout_s, std::ostream& out) {
  auto nccl = Nccl::load();
  if (!nccl.ok()) {
    out << nccl.error().message << "\n";
    return 2;
  }
  auto id = (*nccl)->unique_id();
  char pattern[] = "/tmp/memsim-ranks-XXXXXX";
  if (!id.ok() || mkdtemp(pattern) == nullptr) {
    out << (id.ok() ? "cannot make a temporary folder" : id.error().message) << "\n";
    return 1;
  }
  const std::filesystem::path tmp(pattern);
  std::vector<RankProcess> procs(ranks);
  std::string problem;
  for (uint32_t r = 0; r < ranks && problem.empty(); ++r) {
    std::vector<std::string> args = argv;
    args.insert(args.end(), {"--rank", std::to_string(r), "--nccl-id", nccl_id_hex(*id)});
    procs[r].log = (tmp / fmt::format("rank{}.log", r)).string();
    problem = start_rank(args, r, nccl_cumem, procs[r]);
  }
  if (!problem.empty())
    for (RankProcess& p : procs)
      if (p.pid > 0) kill(p.pid, SIGKILL);
  const std::string waited = wait_ranks(procs, problem.empty() ? timeout_s : 1);
  if (problem.empty()) problem = waited;
  for (uint32_t r = 0; r < ranks; ++r) {
    for (const std::string& f : {procs[r].log, procs[r].log + ".err"}) {
      std::ifstream in(f);
      std::stringstream text;
      text << in.rdbuf();
      if (!text.str().empty())
        out << fmt::format("---- rank {}{} ----\n", r, f == procs[r].log ? "" : " (stderr)")
            << text.str();
    }
  }
  std::error_code ec;
  if (problem.empty())
    std::filesystem::remove_all(tmp, ec);
  else  // the logs the problem names stay
    out << problem << "; every rank's log is kept in " << tmp.string() << "\n";
  return problem.empty() ? 0 : 1;
}

Result<TpMember> join_tp_group(uint32_t ranks, int rank, const std::string& hex,
                               bool custom_all_reduce) {
  NcclUniqueId id{};
  if (rank < 0 || rank >= static_cast<int>(ranks) || !nccl_id_from_hex(hex, &id))
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("--rank {} is not one of {} ranks, or --nccl-id is not 256 hex "
                                  "digits (both are set by the launcher)",
                                  rank, ranks));
  // A rank ends with the process that started it (its launcher, or the tool rank 0 runs under):
  // none is left holding a GPU and waiting in a collective.
  (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (cudaSetDevice(rank) != cudaSuccess)
    return make_error(ErrorCode::kDriverError, fmt::format("cudaSetDevice({}) failed", rank));
  TpMember m;
  MEMSIM_ASSIGN_OR_RETURN(m.nccl, Nccl::load());
  MEMSIM_TRY(m.nccl->init_rank(id, static_cast<int>(ranks), rank));
  if (custom_all_reduce && custom_all_reduce_supported(ranks)) {
    MEMSIM_ASSIGN_OR_RETURN(
        m.group, make_custom_all_reduce_group(*m.nccl, ranks, static_cast<uint32_t>(rank)));
  } else {
    m.group = make_nccl_group(*m.nccl, ranks, static_cast<uint32_t>(rank));
  }
  return m;
}

}  // namespace memsim
