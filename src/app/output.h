// Checked, atomic outputs: files whose every write, flush and close is checked, and experiment
// folders that appear whole or not at all, under a lock that keeps a second run out.
#pragma once

#include <functional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace memsim {

// A write that failed; what() names the full path and the OS's reason, e.g. "cannot write
// results/shapes/summary.json: No space left on device". The app reports it and exits 1.
class OutputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Writes `path` (created or truncated) through `body`, then flushes and closes it, checking
// every step. Throws OutputError naming the path and errno's text.
void write_file(const std::string& path, const std::function<void(std::ostream&)>& body);
void write_file(const std::string& path, std::string_view text);

// As write_file, into PATH.tmp-<pid> beside `path`, then renamed over `path`: readers see the
// old file or the whole new one. `check`, when given, sees the written text first and returns
// an error (empty: accept); on an error nothing is renamed and OutputError carries it.
void write_file_atomically(const std::string& path, std::string_view text,
                           const std::function<std::string(std::string_view)>& check = {});

// The folder ROOT/NAME of one experiment's outputs. Construction creates ROOT, takes the lock
// ROOT/.NAME.lock (a second run into the same folder is refused, naming the holder's pid; the
// file is removed when the run ends),
// removes what interrupted runs left and creates the staging folder ROOT/.NAME.partial-<pid>.
// Writers write into staging(); commit() swaps it into place in one rename (the previous
// results stay whole until then and are removed after). Destroyed uncommitted, the staging
// folder is removed: a failed or interrupted run leaves nothing that looks complete.
class OutputDir {
 public:
  OutputDir(const std::string& root, const std::string& name);
  ~OutputDir();
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  const std::string& path() const { return final_; }       // ROOT/NAME, where results land
  const std::string& staging() const { return staging_; }  // where writers write
  std::string staged(std::string_view file) const;         // staging()/file

  // Writes staging()/file (checked; see write_file); errors name path()/file.
  void write(std::string_view file, const std::function<void(std::ostream&)>& body);
  void write(std::string_view file, std::string_view text);
  // A line report() prints after the files (e.g. the plots' status).
  void add_note(std::string line) { notes_.push_back(std::move(line)); }
  // Moves the staged folder to path(), replacing the previous results. Throws OutputError.
  void commit();
  // "wrote DIR/first, second, ..." (the files written at the top of the folder), then the notes;
  // each line ends in a newline.
  std::string report() const;

 private:
  void take_lock();
  void release_lock();

  std::string root_, name_, final_, staging_, lock_path_;
  std::vector<std::string> files_, notes_;
  int lock_fd_ = -1;
  bool committed_ = false;
};

// `s` as one CSV cell: quoted, with inner quotes doubled, when it holds a comma, a quote, a
// carriage return or a newline (RFC 4180); as it is otherwise.
std::string csv_cell(std::string_view s);
// `s` as one CSV cell, always quoted (inner quotes doubled).
std::string csv_quoted(std::string_view s);

}  // namespace memsim
