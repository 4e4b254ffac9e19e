// Starting other programs without a shell: posix_spawnp with an argument vector, output
// redirected by file actions, and the child's exit status decoded.
#include "src/app/spawn.h"

#include <string_view>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <csignal>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

extern char** environ;

namespace memsim {

pid_t spawn_process(const std::vector<std::string>& argv, const SpawnOptions& o,
                    std::string* error) {
  if (argv.empty()) {
    *error = "no program to start";
    return -1;
  }
  std::vector<std::string> args = argv;  // posix_spawn takes char* const[]
  std::vector<char*> ptrs;
  for (std::string& a : args) ptrs.push_back(a.data());
  ptrs.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC;
  if (!o.stdout_path.empty())
    posix_spawn_file_actions_addopen(&fa, 1, o.stdout_path.c_str(), kFlags, 0644);
  if (!o.stderr_path.empty())
    posix_spawn_file_actions_addopen(&fa, 2, o.stderr_path.c_str(), kFlags, 0644);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGTERM, SIGPIPE}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  const char* file = o.program.empty() ? ptrs[0] : o.program.c_str();
  // The environment: this process's, with o.env's keys replaced or added.
  std::vector<std::string> env_strings = o.env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view key = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const std::string& set : o.env)
      if (set.size() > key.size() && set.compare(0, key.size(), key) == 0 && set[key.size()] == '=')
        replaced = true;
    if (!replaced) env_strings.emplace_back(entry);
  }
  std::vector<char*> env_ptrs;
  for (std::string& e : env_strings) env_ptrs.push_back(e.data());
  env_ptrs.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, file, &fa, &attr, ptrs.data(), env_ptrs.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    *error = std::strerror(rc);
    return -1;
  }
  return pid;
}

int run_process(const std::vector<std::string>& argv, const SpawnOptions& o, std::string* error) {
  const pid_t pid = spawn_process(argv, o, error);
  if (pid < 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      *error = std::strerror(errno);
      return -1;
    }
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

std::vector<std::string> own_command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  for (std::string arg; std::getline(f, arg, '\0');) argv.push_back(arg);
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (!argv.empty() && !self.empty()) argv[0] = self;
  return argv;
}

}  // namespace memsim
