// Starting other programs without a shell: an argument vector handed to posix_spawnp, so no
// character of a path, a config value or a label is ever interpreted as a command.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace memsim {

struct SpawnOptions {
  std::string stdout_path;  // empty: inherited; "/dev/null" discards
  std::string stderr_path;  // empty: inherited
  std::string program;      // the file to run; empty: argv[0]
  // "KEY=VALUE" entries set in the child's environment over this process's (a KEY here
  // replaces the inherited one).
  std::vector<std::string> env = {};
};

// Starts `program` (or argv[0]; looked up in PATH when it has no '/') with `argv`; returns its
// pid, or -1 with `*error` set to the OS's reason. The child starts with no signal blocked and
// SIGINT, SIGTERM and SIGPIPE at their default actions, whatever this process set.
pid_t spawn_process(const std::vector<std::string>& argv, const SpawnOptions& options,
                    std::string* error);

// Runs `argv` to its end. Returns its exit status (128 + signal when a signal ended it), or -1
// when it could not be started (`*error` says why).
int run_process(const std::vector<std::string>& argv, const SpawnOptions& options,
                std::string* error);

// This process's own argument vector (/proc/self/cmdline), argv[0] replaced by its executable.
std::vector<std::string> own_command_line();

}  // namespace memsim
