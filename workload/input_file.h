// Input files read whole (request traces, snapshot pickles): refused up front unless they are
// regular files, so /dev/zero, a FIFO or a folder never starts an endless or blocking read.
#pragma once

#include <string>

namespace memsim {

// "PATH is not a regular file (a character device)" when `path` exists but is a device, FIFO,
// socket or folder; empty when it is a regular file or cannot be looked at (opening it then
// fails as it would have). Looks at the file's type without opening it (opening a FIFO blocks).
std::string special_file_error(const std::string& path);

}  // namespace memsim
