// memsim sweep: locks, the grid record, the points run as child processes from their resolved
// configs (parallel, resumable, sharded), progress, interruption, and the Slurm script.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <thread>

#include "src/app/experiment.h"
#include "src/app/output.h"
#include "src/app/spawn.h"
#include "src/app/sweep.h"

namespace memsim {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// A sweep that cannot go on (a flag, a lock, a write): its message and exit code.
struct SweepStop {
  int code;
  std::string message;
};

std::string self_exe() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("memsim") : p.string();
}

std::string clock_text(double s) {
  const auto t = static_cast<long>(s + 0.5);
  return fmt::format("{:02d}:{:02d}:{:02d}", t / 3600, (t / 60) % 60, t % 60);
}

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 18 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// K/N from --shard or a Slurm job array's environment; {0, 1} = every point.
std::pair<size_t, size_t> parse_shard(const SweepOptions& o) {
  std::string text = o.shard;
  if (text.empty()) {
    const char* id = std::getenv("SLURM_ARRAY_TASK_ID");
    const char* count = std::getenv("SLURM_ARRAY_TASK_COUNT");
    const char* min = std::getenv("SLURM_ARRAY_TASK_MIN");
    if (id == nullptr || count == nullptr) return {0, 1};
    if (!all_digits(id) || !all_digits(count) || (min != nullptr && !all_digits(min)))
      throw SweepStop{2, fmt::format("SLURM_ARRAY_TASK_ID={}, SLURM_ARRAY_TASK_COUNT={}: not "
                                     "whole numbers",
                                     id, count)};
    const size_t first = min != nullptr ? std::stoul(min) : 0;
    text = fmt::format("{}/{}", std::stoul(id) - first, count);
  }
  const size_t slash = text.find('/');
  const std::string k = slash == std::string::npos ? text : text.substr(0, slash);
  const std::string n = slash == std::string::npos ? "" : text.substr(slash + 1);
  if (!all_digits(k) || !all_digits(n) || std::stoul(n) == 0 || std::stoul(k) >= std::stoul(n))
    throw SweepStop{2, fmt::format("--shard {}: expected K/N with 0 <= K < N (e.g. 0/4)", text)};
  return {std::stoul(k), std::stoul(n)};
}

// An flock on a file of the sweep folder, released when destroyed or when the process dies.
// The points inherit it: points orphaned by a killed sweep keep it until they end, so a rerun
// cannot start the same points beside them.
class FolderLock {
 public:
  explicit FolderLock(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
    if (fd_ < 0)
      throw SweepStop{1, fmt::format("cannot create {}: {}", path, std::strerror(errno))};
  }
  ~FolderLock() { ::close(fd_); }
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  bool try_exclusive() { return ::flock(fd_, LOCK_EX | LOCK_NB) == 0; }
  void shared() {
    while (::flock(fd_, LOCK_SH) != 0)
      if (errno != EINTR)
        throw SweepStop{1, fmt::format("cannot lock {}: {}", path_, std::strerror(errno))};
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// Makes grid.json ours. Every running sweep of the folder holds .sweep.lock shared; grid.json
// is rewritten only under the exclusive lock, i.e. when no sweep runs. A sweep that finds
// others running joins them only when their grid is the same (the shards of one sweep).
void claim_grid(FolderLock& lock, const std::string& dir, const SweepRecord& record,
                const std::string& grid_text, bool keep_shared) {
  const std::string path = (fs::path(dir) / "grid.json").string();
  if (lock.try_exclusive()) {
    write_file_atomically(path, grid_text);
    if (keep_shared) lock.shared();  // converts the exclusive lock
    return;
  }
  lock.shared();
  std::string theirs;
  try {
    theirs = read_grid_json(dir).grid_hash;
  } catch (const OutputError&) {
  }
  if (theirs != record.grid_hash)
    throw SweepStop{1, fmt::format("another sweep with a different grid or config is running in "
                                   "{}; wait for it to finish or choose another --out",
                                   dir)};
}

// The Slurm array script: each task runs its shard of the grid (the shard is taken from the
// array's environment), all writing into the same folder; `memsim merge` then gathers them.
int write_slurm(const SweepOptions& o, const std::string& dir, size_t points, std::ostream& out,
                std::ostream& err) {
  const size_t tasks = o.tasks ? std::min<size_t>(o.tasks, points) : std::min<size_t>(points, 64);
  auto quote = [](const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  std::string cmd =
      fmt::format("{} sweep --config {} --out {} --no-progress", quote(self_exe()),
                  quote(fs::absolute(o.config).string()), quote(fs::absolute(o.out_dir).string()));
  if (o.jobs) cmd += fmt::format(" -j {}", o.jobs);
  for (const std::string& a : o.axes) cmd += " --sweep " + quote(a);
  for (const std::string& s : o.sets) cmd += " --set " + quote(s);
  const std::string script = fmt::format(
      "#!/bin/bash\n"
      "# memsim sweep as a Slurm job array: task K of N runs the grid points i with i % N == K.\n"
      "# When every task has finished: memsim merge {dir}\n"
      "#SBATCH --job-name=memsim-sweep\n"
      "#SBATCH --array=0-{last}\n"
      "#SBATCH --cpus-per-task={cpus}\n"
      "#SBATCH --output={dir}/slurm-%A_%a.out\n"
      "cd {cwd}\n"
      "exec {cmd}\n",
      fmt::arg("dir", fs::absolute(dir).string()), fmt::arg("last", tasks - 1),
      fmt::arg("cpus", o.jobs ? o.jobs : 1), fmt::arg("cwd", quote(fs::current_path().string())),
      fmt::arg("cmd", cmd));
  const std::string path = (fs::path(dir) / "sweep.sbatch").string();
  write_file_atomically(path, script);
  std::error_code ec;
  fs::permissions(path, fs::perms::owner_exec, fs::perm_options::add, ec);
  out << fmt::format("wrote {} ({} array tasks over {} points)\n", path, tasks, points);
  if (!o.submit) {
    out << fmt::format("submit it with: sbatch {}; then: memsim merge {}\n", path, dir);
    return 0;
  }
  out << "$ sbatch " << path << "\n" << std::flush;
  std::string why;
  const int rc = run_process({"sbatch", path}, {}, &why);
  if (rc != 0) {
    err << "memsim sweep: sbatch "
        << (rc < 0 ? "could not start: " + why : fmt::format("failed (exit {})", rc)) << "\n";
    return 1;
  }
  return 0;
}

std::string last_line(const fs::path& path) {
  std::ifstream e(path);
  std::string last;
  for (std::string line; std::getline(e, line);)
    if (!line.empty()) last = line;
  return last;
}

std::string describe(const SweepPoint& p) {
  std::string s;
  for (const auto& [k, v] : p.assignments) s += fmt::format("{}{}={}", s.empty() ? "" : " ", k, v);
  return s.empty() ? "(the base config)" : s;
}

// The points of one shard run as child processes, `jobs` at a time.
class PointRunner {
 public:
  PointRunner(const SweepOptions& o, const std::string& dir, const std::string& base,
              const std::vector<ResolvedPoint>& points, std::ostream& out, std::ostream& err)
      : o_(o), dir_(dir), points_(points), out_(out), err_(err), exe_(self_exe()), base_(base) {}

  // Runs `todo`; returns 0, 1 (a point failed, a write failed) or 128 + the signal that
  // interrupted it (SIGINT, SIGTERM; blocked here and read with sigtimedwait).
  int run(const std::vector<size_t>& todo, const sigset_t& signals);

 private:
  bool start(size_t i);
  void finished(pid_t pid, int status, bool interrupted);
  void draw(size_t total);
  void say(const std::string& line);

  struct Running {
    pid_t pid;
    size_t point;
    Clock::time_point start;
  };
  const SweepOptions& o_;
  std::string dir_;
  const std::vector<ResolvedPoint>& points_;
  std::ostream& out_;
  std::ostream& err_;
  std::string exe_, base_;
  std::vector<Running> running_;
  std::vector<std::string> failures_;
  size_t done_ = 0, failed_ = 0;
  std::string fatal_;  // a write of the sweep's own records failed: stop
  bool stdout_lost_ = false;
  Clock::time_point t0_ = Clock::now();
};

void PointRunner::say(const std::string& line) {
  if (stdout_lost_) return;
  out_ << line << std::flush;
  if (out_) return;
  stdout_lost_ = true;
  err_ << fmt::format(
      "memsim sweep: standard output was closed ({}); the sweep goes on, its results go to {}\n",
      std::strerror(EPIPE), dir_);
}

bool PointRunner::start(size_t i) {
  const ResolvedPoint& p = points_[i];
  const std::string pdir = point_dir(dir_, i);
  std::error_code ec;
  fs::create_directories(pdir, ec);
  if (ec) {
    fatal_ = fmt::format("cannot create {}: {}", pdir, ec.message());
    return false;
  }
  fs::remove(fs::path(pdir) / "status", ec);
  const std::string config = (fs::path(pdir) / "config.yaml").string();
  try {
    write_file(config, p.config_text);
  } catch (const OutputError& e) {
    fatal_ = e.what();
    return false;
  }
  std::vector<std::string> args = {exe_, "--config", config, "--config-base", base_, "--out", pdir};
  if (!o_.plots) args.push_back("--no-plots");
  // The overrides again (the text holds their values already): the point's process then knows
  // which keys the command line set, as a run of its own would (--set seed=N draws requests).
  for (const std::string& s : o_.sets) args.insert(args.end(), {"--set", s});
  for (const auto& [k, v] : p.point.assignments) args.insert(args.end(), {"--set", k + "=" + v});
  SpawnOptions so;
  so.stdout_path = (fs::path(pdir) / "stdout.txt").string();
  so.stderr_path = (fs::path(pdir) / "stderr.txt").string();
  so.program = "/proc/self/exe";  // this very binary, even if the file was rebuilt meanwhile
  std::string why;
  const pid_t pid = spawn_process(args, so, &why);
  if (pid < 0) {
    ++failed_;
    failures_.push_back(
        fmt::format("point {} ({}): could not start {}: {}", i, describe(p.point), exe_, why));
    return true;
  }
  running_.push_back({pid, i, Clock::now()});
  return true;
}

void PointRunner::finished(pid_t pid, int status, bool interrupted) {
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const Running& r) { return r.pid == pid; });
  if (it == running_.end()) return;
  const size_t i = it->point;
  const double secs = std::chrono::duration<double>(Clock::now() - it->start).count();
  running_.erase(it);
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (interrupted && rc != 0) return;  // no status: the next run starts it again
  const fs::path pdir = point_dir(dir_, i);
  try {
    write_file_atomically((pdir / "status").string(),
                          rc == 0 ? fmt::format("done {}\n", points_[i].hash)
                                  : fmt::format("failed {} {}\n", rc, points_[i].hash));
  } catch (const OutputError& e) {
    fatal_ = e.what();
  }
  if (rc == 0) {
    ++done_;
  } else {
    ++failed_;
    failures_.push_back(fmt::format("point {} ({}): exit {}: {}", i, describe(points_[i].point), rc,
                                    last_line(pdir / "stderr.txt")));
  }
  if (!isatty(STDERR_FILENO) && o_.progress)
    say(fmt::format("point {} {} in {:.1f} s ({} done, {} failed)\n", i,
                    rc == 0 ? "done" : "FAILED", secs, done_, failed_));
}

void PointRunner::draw(size_t total) {
  const double e = std::chrono::duration<double>(Clock::now() - t0_).count();
  const size_t finished = done_ + failed_;
  const double eta = finished > 0 ? e / double(finished) * double(total - finished) : 0;
  const size_t width = 30;
  const size_t fill = total == 0 ? width : width * finished / total;
  err_ << fmt::format("\r[{}{}] {}/{} done, {} running, {} failed, {} elapsed, ETA {}   ",
                      std::string(fill, '#'), std::string(width - fill, '.'), done_, total,
                      running_.size(), failed_, clock_text(e),
                      finished > 0 ? clock_text(eta) : std::string("--:--:--"))
       << std::flush;
}

int PointRunner::run(const std::vector<size_t>& todo, const sigset_t& signals) {
  const unsigned jobs = o_.jobs ? o_.jobs : std::max(1u, std::thread::hardware_concurrency());
  const bool tty = o_.progress && isatty(STDERR_FILENO);
  int signal = 0;
  size_t next = 0;
  auto last_draw = t0_;
  while ((next < todo.size() && signal == 0 && fatal_.empty()) || !running_.empty()) {
    while (running_.size() < jobs && next < todo.size() && signal == 0 && fatal_.empty())
      if (!start(todo[next++])) break;
    const timespec zero{0, 0};
    if (const int sig = sigtimedwait(&signals, nullptr, &zero); sig > 0 && signal == 0) {
      signal = sig;  // a terminal's Ctrl-C reached the points too; a kill of this process not
      for (const Running& r : running_) ::kill(r.pid, sig);
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      finished(pid, status, signal != 0);
      if (tty) draw(todo.size());
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (tty && Clock::now() - last_draw > std::chrono::milliseconds(250)) {
      draw(todo.size());
      last_draw = Clock::now();
    }
  }
  if (tty) {
    draw(todo.size());
    err_ << "\n";
  }
  for (const std::string& f : failures_) err_ << "memsim sweep: " << f << "\n";
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0_).count();
  say(fmt::format("{} points run in {}: {} done, {} failed\n", done_ + failed_, clock_text(elapsed),
                  done_, failed_));
  if (!fatal_.empty()) {
    err_ << "memsim sweep: " << fatal_ << "\n";
    return 1;
  }
  if (signal != 0) {
    err_ << fmt::format(
        "memsim sweep: interrupted ({}) after {} of {} points; the points that did not finish "
        "have no status: run the same command again to resume\n",
        strsignal(signal), done_ + failed_, todo.size());
    return 128 + signal;
  }
  return failed_ > 0 ? 1 : 0;
}

// Validates every point; prints the first few invalid ones. False when any is invalid.
bool all_valid(const std::vector<ResolvedPoint>& points, std::ostream& err) {
  size_t invalid = 0;
  for (const ResolvedPoint& p : points) {
    if (p.error.empty()) continue;
    if (invalid++ < 5)
      err << fmt::format("memsim sweep: point {} ({}): {}\n", p.point.index, describe(p.point),
                         p.error);
  }
  if (invalid == 0) return true;
  err << fmt::format("memsim sweep: {} of {} points are invalid; nothing was run\n", invalid,
                     points.size());
  return false;
}

// This shard's points that must run, and a line saying why some run again.
std::vector<size_t> points_to_run(const std::string& dir, const SweepRecord& record, size_t shard_k,
                                  size_t shard_n, std::ostream& out) {
  std::vector<size_t> todo;
  std::map<std::string, size_t> again;  // reason -> count, for points that ran before
  size_t mine = 0, complete = 0;
  for (const SweepRecord::Point& p : record.points) {
    if (p.index % shard_n != shard_k) continue;
    ++mine;
    const PointState s = point_state(dir, p);
    if (s.complete) {
      ++complete;
      continue;
    }
    todo.push_back(p.index);
    if (s.why != "new or interrupted") ++again[s.why];
  }
  if (shard_n > 1) out << fmt::format("shard {}/{}: {} points\n", shard_k, shard_n, mine);
  if (complete > 0)
    out << fmt::format("{} of {} points already complete (skipped)\n", complete, mine);
  if (!again.empty()) {
    std::string why;
    size_t n = 0;
    for (const auto& [reason, count] : again) {
      why += fmt::format("{}{} {}", why.empty() ? "" : ", ", count, reason);
      n += count;
    }
    out << fmt::format("{} points run again: {}\n", n, why);
  }
  return todo;
}

int sweep(const SweepOptions& o, std::ostream& out, std::ostream& err) {
  if (o.submit && !o.slurm) throw SweepStop{2, "--submit submits the Slurm script: add --slurm"};
  const auto [shard_k, shard_n] = parse_shard(o);
  // The YAML is read once; every point runs from its own resolved config, whose relative paths
  // resolve from the YAML's folder (absolute: the points' hashes do not depend on the cwd).
  ConfigNode root = ConfigNode::load_file(
      o.config, fs::absolute(fs::path(o.config).parent_path()).lexically_normal().string());
  for (const std::string& u : o.unsets) root.apply_unset(u);
  const std::vector<SweepAxis> axes = parse_grid(root, o.axes);
  if (axes.empty())
    throw SweepStop{2, o.config +
                           ": nothing to sweep (give a grid: section or --sweep "
                           "key=v1,v2,...)"};
  const std::vector<ResolvedPoint> points = resolve_points(root, expand_grid(axes), o.sets);
  if (!all_valid(points, err)) return 2;
  std::string experiment = points.front().experiment;
  if (auto v = root.find("experiment"); v && v->is_scalar()) experiment = v->as_plain_name();
  const std::string dir = (fs::path(o.out_dir) / (experiment + "-sweep")).string();
  std::string axes_text;
  for (const SweepAxis& a : axes)
    axes_text += fmt::format("{}{} x{}", axes_text.empty() ? "" : ", ", a.name, a.steps.size());
  out << fmt::format("sweep {}: {} points ({} axes: {}), all valid; folder {}\n", o.config,
                     points.size(), axes.size(), axes_text, dir);
  if (o.dry_run) {
    for (const ResolvedPoint& p : points)
      out << fmt::format("  {:5d}  {}\n", p.point.index, describe(p.point));
    return 0;
  }
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "points", ec);
  if (ec) throw SweepStop{1, fmt::format("cannot create {}: {}", dir, ec.message())};
  const SweepRecord record = make_sweep_record(axes, points);
  const std::string grid_text =
      grid_json_text(record, fs::absolute(o.config).string(), o.sets, axes);
  FolderLock folder((fs::path(dir) / ".sweep.lock").string());
  claim_grid(folder, dir, record, grid_text, !o.slurm);
  if (o.slurm) return write_slurm(o, dir, points.size(), out, err);

  // One process per shard: a second one would run the same points into the same folders.
  const std::string shard_lock =
      (fs::path(dir) / fmt::format(".lock-{}-of-{}", shard_k, shard_n)).string();
  FolderLock mine(shard_lock);
  if (!mine.try_exclusive())
    throw SweepStop{1, fmt::format("another sweep is running shard {}/{} of {} (lock {})", shard_k,
                                   shard_n, dir, shard_lock)};
  const std::vector<size_t> todo = points_to_run(dir, record, shard_k, shard_n, out);
  // SIGINT and SIGTERM are read in the loop (the points get them back at their default);
  // SIGPIPE is held so that a closed stdout is an error to report, not a silent death.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigset_t blocked = signals;
  sigaddset(&blocked, SIGPIPE);
  sigprocmask(SIG_BLOCK, &blocked, nullptr);
  PointRunner runner(o, dir, root.base_dir(), points, out, err);
  const int rc = runner.run(todo, signals);
  if (rc > 128 || shard_n > 1) {
    if (shard_n > 1 && rc <= 128)
      out << fmt::format("when every shard has finished: memsim merge {}\n", dir);
    return rc;
  }
  const size_t complete = write_sweep_csv(dir, record);
  out << fmt::format("wrote {}/sweep.csv ({} of {} points complete)\n", dir, complete,
                     points.size());
  if (complete < points.size()) {
    err << fmt::format("memsim sweep: sweep.csv lacks {} of {} points (see the failures above)\n",
                       points.size() - complete, points.size());
    return std::max(rc, 1);
  }
  return rc;
}

}  // namespace

int run_sweep_command(const SweepOptions& o, std::ostream& out, std::ostream& err) {
  try {
    return sweep(o, out, err);
  } catch (const SweepStop& s) {
    err << "memsim sweep: " << s.message << "\n";
    return s.code;
  } catch (const ConfigError& e) {
    err << "memsim sweep: config error: " << e.what() << "\n";
    return 2;
  } catch (const OutputError& e) {
    err << "memsim sweep: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace memsim
