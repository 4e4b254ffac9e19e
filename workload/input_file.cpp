// special_file_error: stat(2) of an input file, naming its type when it is not a regular file.
#include "workload/input_file.h"

#include <sys/stat.h>

#include <fmt/format.h>

namespace memsim {
namespace {

const char* file_type(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

}  // namespace

std::string special_file_error(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return {};
  return fmt::format("{} is not a regular file ({})", path, file_type(st.st_mode));
}

}  // namespace memsim
