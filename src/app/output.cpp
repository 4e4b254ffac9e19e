// Checked, atomic outputs: a stream buffer over a file descriptor that keeps the first errno,
// whole-file writers, and the staged, locked experiment folder.
#include "src/app/output.h"
#include "src/config/config_node.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <streambuf>
#include <vector>

namespace memsim {

namespace fs = std::filesystem;

namespace {

std::string os_reason(int err) {
  return std::strerror(err);
}

// A write-only stream buffer over a file descriptor. A failed write() keeps its errno; the
// stream then goes bad and writes nothing more, and close() reports the first failure.
class FdBuf : public std::streambuf {
 public:
  explicit FdBuf(int fd) : fd_(fd), buf_(1 << 16) { setp(buf_.data(), buf_.data() + buf_.size()); }

  int error() const { return error_; }

  // Flushes and closes; returns the first errno seen (0: every byte reached the file).
  int close() {
    sync();
    if (fd_ >= 0 && ::close(fd_) != 0 && error_ == 0) error_ = errno;
    fd_ = -1;
    return error_;
  }

 protected:
  int_type overflow(int_type ch) override {
    if (!drain()) return traits_type::eof();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }
  int sync() override { return drain() ? 0 : -1; }

 private:
  bool drain() {
    const char* p = pbase();
    size_t left = static_cast<size_t>(pptr() - pbase());
    while (left > 0 && error_ == 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno != EINTR) error_ = errno;
        continue;
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    setp(buf_.data(), buf_.data() + buf_.size());
    return error_ == 0;
  }

  int fd_;
  std::vector<char> buf_;
  int error_ = 0;
};

[[noreturn]] void fail_write(const std::string& path, int err) {
  throw OutputError(fmt::format("cannot write {}: {}", path, os_reason(err)));
}

std::string temp_beside(const std::string& path) {
  return fmt::format("{}.tmp-{}", path, static_cast<long>(::getpid()));
}

}  // namespace

void write_file(const std::string& path, const std::function<void(std::ostream&)>& body) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_write(path, errno);
  FdBuf buf(fd);
  std::ostream os(&buf);
  try {
    body(os);
  } catch (...) {
    buf.close();
    throw;
  }
  os.flush();
  if (const int err = buf.close(); err != 0) fail_write(path, err);
  if (!os) throw OutputError(fmt::format("cannot write {}: the stream failed", path));
}

void write_file(const std::string& path, std::string_view text) {
  write_file(path, [&](std::ostream& os) { os.write(text.data(), std::streamsize(text.size())); });
}

void write_file_atomically(const std::string& path, std::string_view text,
                           const std::function<std::string(std::string_view)>& check) {
  if (check) {
    if (std::string why = check(text); !why.empty())
      throw OutputError(
          fmt::format("{} was not written (what was there is unchanged): {}", path, why));
  }
  // A link is followed (the file it names is replaced, not the link), and what is not a
  // regular file (a device, a FIFO) is written in place: renaming over it would replace it.
  std::error_code ec;
  std::string target = path;
  if (fs::is_symlink(path, ec)) {
    const fs::path resolved = fs::weakly_canonical(path, ec);
    if (!ec) target = resolved.string();
  }
  const fs::file_status st = fs::status(target, ec);
  if (fs::exists(st) && !fs::is_regular_file(st)) {
    write_file(target, text);
    return;
  }
  const std::string tmp = temp_beside(target);
  try {
    write_file(tmp, text);
  } catch (const OutputError&) {
    fs::remove(tmp, ec);
    throw;
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    fs::remove(tmp, ec);
    fail_write(target, err);
  }
}

OutputDir::OutputDir(const std::string& root, const std::string& name)
    : root_(root.empty() ? "." : root),
      name_(name),
      final_((fs::path(root_) / name).string()),
      staging_((fs::path(root_) / fmt::format(".{}.partial-{}", name, long(::getpid()))).string()) {
  if (std::string why = check_plain_name(name); !why.empty())
    throw OutputError(fmt::format("cannot write {}: {}", final_, why));
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) throw OutputError(fmt::format("cannot create {}: {}", root_, ec.message()));
  lock_path_ = (fs::path(root_) / ("." + name + ".lock")).string();
  take_lock();
  try {
    // The lock is ours: staging folders of this name are left by runs that died.
    const std::string prefix = "." + name + ".partial-";
    for (const auto& e : fs::directory_iterator(root_, ec))
      if (e.path().filename().string().rfind(prefix, 0) == 0) fs::remove_all(e.path(), ec);
    if (fs::exists(final_, ec) && !fs::is_directory(final_, ec))
      throw OutputError(fmt::format("cannot write {}: it exists and is not a folder", final_));
    fs::create_directory(staging_, ec);
    if (ec) throw OutputError(fmt::format("cannot create {}: {}", staging_, ec.message()));
  } catch (...) {
    release_lock();
    throw;
  }
}

// flock on ROOT/.NAME.lock, which the holder removes when it is done: a run that opened the file
// before it was removed then holds a lock on a file no longer there, so it checks that the path
// still names the file it locked, and tries again when not.
void OutputDir::take_lock() {
  for (int attempt = 0; attempt < 100; ++attempt) {
    lock_fd_ = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd_ < 0) fail_write(lock_path_, errno);
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      char pid[32] = {};
      const ssize_t n = ::pread(lock_fd_, pid, sizeof pid - 1, 0);
      ::close(lock_fd_);
      lock_fd_ = -1;
      const std::string holder = n > 0 ? fmt::format(" (pid {})", std::string(pid, size_t(n))) : "";
      throw OutputError(fmt::format(
          "{} is being written by another memsim run{}; wait for it to finish or choose another "
          "--out",
          final_, holder));
    }
    struct stat held {
    }, named{};
    if (::fstat(lock_fd_, &held) == 0 && ::stat(lock_path_.c_str(), &named) == 0 &&
        held.st_ino == named.st_ino && held.st_dev == named.st_dev) {
      const std::string me = std::to_string(::getpid());
      if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, me.data(), me.size(), 0) < 0)
        fail_write(lock_path_, errno);
      return;
    }
    ::close(lock_fd_);  // the file was removed by the run before: lock the new one
    lock_fd_ = -1;
  }
  throw OutputError(fmt::format("cannot lock {}: it keeps being replaced", lock_path_));
}

void OutputDir::release_lock() {
  if (lock_fd_ < 0) return;
  ::unlink(lock_path_.c_str());  // while still held: see take_lock
  ::close(lock_fd_);             // releases the flock
  lock_fd_ = -1;
}

OutputDir::~OutputDir() {
  std::error_code ec;
  if (!committed_) fs::remove_all(staging_, ec);
  release_lock();
}

std::string OutputDir::staged(std::string_view file) const {
  return (fs::path(staging_) / file).string();
}

void OutputDir::write(std::string_view file, const std::function<void(std::ostream&)>& body) {
  const std::string p = staged(file);
  if (file.find('/') == std::string_view::npos) files_.emplace_back(file);
  try {
    write_file(p, body);
  } catch (const OutputError& e) {
    // Name the file where it was going to be, not the staging folder's.
    std::string msg = e.what();
    if (const size_t at = msg.find(p); at != std::string::npos)
      msg.replace(at, p.size(), (fs::path(final_) / file).string());
    throw OutputError(msg);
  }
}

void OutputDir::commit() {
  if (committed_) return;
  std::error_code ec;
  if (!fs::exists(final_, ec)) {
    if (::rename(staging_.c_str(), final_.c_str()) != 0) fail_write(final_, errno);
    committed_ = true;
    return;
  }
  // Swap the new folder with the previous results in one step, then remove those.
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, final_.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno != EINVAL && errno != ENOSYS) fail_write(final_, errno);
    // A file system without RENAME_EXCHANGE: move the old folder aside first.
    const std::string old =
        (fs::path(root_) / fmt::format(".{}.old-{}", name_, long(::getpid()))).string();
    if (::rename(final_.c_str(), old.c_str()) != 0) fail_write(final_, errno);
    if (::rename(staging_.c_str(), final_.c_str()) != 0) {
      const int err = errno;
      (void)::rename(old.c_str(), final_.c_str());
      fail_write(final_, err);
    }
    fs::remove_all(old, ec);
    committed_ = true;
    return;
  }
  committed_ = true;
  fs::remove_all(staging_, ec);  // now the previous results
}

void OutputDir::write(std::string_view file, std::string_view text) {
  write(file, [&](std::ostream& os) { os.write(text.data(), std::streamsize(text.size())); });
}

std::string OutputDir::report() const {
  std::string out;
  for (size_t i = 0; i < files_.size(); ++i)
    out += i == 0 ? fmt::format("wrote {}/{}", final_, files_[i]) : ", " + files_[i];
  if (!out.empty()) out += "\n";
  for (const std::string& n : notes_) out += n + "\n";
  return out;
}

std::string csv_cell(std::string_view s) {
  if (s.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(s);
  return csv_quoted(s);
}

std::string csv_quoted(std::string_view s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

}  // namespace memsim
