// memsim sweep / merge: grid parsing and expansion, validation of every point, the points run as
// child processes (parallel, resumable, sharded), and sweep.csv gathered from their summaries.
#include "src/app/sweep.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>
#include <thread>

#include "src/app/allocators_experiment.h"
#include "src/app/rl_experiment.h"
#include "src/app/shapes_experiment.h"
#include "src/serve/serving_experiment.h"

extern char** environ;

namespace memsim {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

std::string yaml_text(const YAML::Node& n) {
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

// Splits "a,b,[c,d],{e: f}" at the commas outside brackets and braces.
std::vector<std::string> split_values(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char ch : s) {
    if (ch == '[' || ch == '{') ++depth;
    if (ch == ']' || ch == '}') --depth;
    if (ch == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  out.push_back(cur);
  return out;
}

}  // namespace

std::vector<SweepAxis> parse_grid(const ConfigNode& root, const std::vector<std::string>& flags) {
  std::vector<SweepAxis> axes;
  std::set<std::string> seen;
  auto claim = [&](const std::string& key, const std::string& where) {
    if (!seen.insert(key).second)
      throw ConfigError(fmt::format("{}: key '{}' is swept twice", where, key));
  };
  if (auto grid = root.find("grid")) {
    if (!grid->is_map()) grid->fail("a map of key: [values] axes and name: {key: [values]} groups");
    for (const std::string& name : grid->keys()) {
      const ConfigNode v = (*grid)[name];
      SweepAxis a;
      a.name = name;
      if (v.is_sequence()) {
        claim(name, v.where());
        a.keys = {name};
        for (const ConfigNode& item : v.items()) a.steps.push_back({yaml_text(item.raw())});
      } else if (v.is_map()) {
        size_t n = 0;
        for (const std::string& key : v.keys()) {
          const ConfigNode list = v[key];
          if (!list.is_sequence()) list.fail("a group's keys each take a list of values");
          claim(key, list.where());
          const std::vector<ConfigNode> items = list.items();
          if (a.keys.empty()) {
            n = items.size();
            a.steps.resize(n);
          } else if (items.size() != n) {
            list.fail(
                fmt::format("{} values; the group's first key has {} (a group's keys move "
                            "together)",
                            items.size(), n));
          }
          a.keys.push_back(key);
          for (size_t i = 0; i < items.size(); ++i) a.steps[i].push_back(yaml_text(items[i].raw()));
        }
      } else {
        v.fail("a list of values (an axis) or a map of key: [values] (a group)");
      }
      if (a.steps.empty()) v.fail("no values");
      axes.push_back(std::move(a));
    }
  }
  for (const std::string& f : flags) {
    const size_t eq = f.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == f.size())
      throw ConfigError(fmt::format("--sweep {}: expected key.path=value1,value2,...", f));
    SweepAxis a;
    a.name = f.substr(0, eq);
    a.keys = {a.name};
    claim(a.name, "--sweep " + f);
    for (const std::string& v : split_values(f.substr(eq + 1))) {
      if (v.empty()) throw ConfigError(fmt::format("--sweep {}: an empty value", f));
      a.steps.push_back({v});
    }
    axes.push_back(std::move(a));
  }
  return axes;
}

std::vector<SweepPoint> expand_grid(const std::vector<SweepAxis>& axes) {
  std::vector<SweepPoint> points(1);
  for (const SweepAxis& a : axes) {
    std::vector<SweepPoint> next;
    for (const SweepPoint& p : points)
      for (const auto& step : a.steps) {
        SweepPoint q = p;
        for (size_t k = 0; k < a.keys.size(); ++k) q.assignments.emplace_back(a.keys[k], step[k]);
        next.push_back(std::move(q));
      }
    points = std::move(next);
  }
  for (size_t i = 0; i < points.size(); ++i) points[i].index = i;
  return points;
}

void load_experiment_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (is_allocators_config(path))
    (void)load_allocators_config(path, overrides);
  else if (is_rl_config(path))
    (void)load_rl_config(path, overrides);
  else if (is_serving_config(path))
    (void)load_serving_config(path, overrides);
  else
    (void)load_shapes_config(path, overrides);
}

namespace {

std::vector<std::string> overrides_of(const SweepPoint& p, const std::vector<std::string>& sets) {
  std::vector<std::string> out = sets;
  for (const auto& [k, v] : p.assignments) out.push_back(k + "=" + v);
  return out;
}

std::string describe(const SweepPoint& p) {
  std::string s;
  for (const auto& [k, v] : p.assignments) s += fmt::format("{}{}={}", s.empty() ? "" : " ", k, v);
  return s.empty() ? "(the base config)" : s;
}

// Loads the point's config with the experiment's typed loader: empty when valid.
std::string validate(const std::string& path, const std::vector<std::string>& ov) {
  try {
    load_experiment_config(path, ov);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return {};
}

std::string point_dir(const std::string& dir, size_t i) {
  return (fs::path(dir) / "points" / fmt::format("p{:05d}", i)).string();
}

std::string read_status(const std::string& pdir) {
  std::ifstream f(fs::path(pdir) / "status");
  std::string s;
  std::getline(f, s);
  return s;
}

void write_file_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp." + std::to_string(getpid());
  std::ofstream(tmp) << text;
  fs::rename(tmp, path);
}

std::string self_exe() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("memsim") : p.string();
}

std::string csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string json_cell(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "";
  return v.dump();
}

// sweep.csv from DIR/grid.json and the points' summaries: one row per (point, run) of the
// complete points, columns point, the swept keys, then the runs' fields (nested objects one
// level deep as parent.child). Host wall times are left out: the file is the same whatever -j,
// sharding or machine produced it.
std::string write_sweep_csv(const std::string& dir, size_t* complete, size_t* total) {
  std::ifstream gf(fs::path(dir) / "grid.json");
  if (!gf) return fmt::format("{}: no grid.json (not a sweep folder)", dir);
  json grid;
  try {
    gf >> grid;
  } catch (const json::exception& e) {
    return fmt::format("{}/grid.json: {}", dir, e.what());
  }
  std::vector<std::string> keys;
  for (const auto& a : grid["axes"])
    for (const auto& k : a["keys"]) keys.push_back(k.get<std::string>());
  std::vector<std::string> fields;
  std::set<std::string> known;
  struct Row {
    size_t point;
    std::vector<std::string> values;
    std::map<std::string, std::string> cells;
  };
  std::vector<Row> rows;
  *complete = 0;
  *total = grid["points"].size();
  for (const auto& p : grid["points"]) {
    const size_t i = p["index"].get<size_t>();
    const std::string pdir = point_dir(dir, i);
    if (read_status(pdir) != "done") continue;
    fs::path summary;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(pdir, ec))
      if (e.is_directory() && fs::exists(e.path() / "summary.json"))
        summary = e.path() / "summary.json";
    if (summary.empty()) continue;
    json s;
    try {
      std::ifstream(summary) >> s;
    } catch (const json::exception& e) {
      return fmt::format("{}: {}", summary.string(), e.what());
    }
    ++*complete;
    std::vector<std::string> values;
    for (const auto& kv : p["assignments"]) values.push_back(kv[1].get<std::string>());
    for (const auto& run : s.value("runs", json::array())) {
      Row r{i, values, {}};
      auto add = [&](const std::string& name, const json& v) {
        if (name.find("wall") != std::string::npos) return;
        if (known.insert(name).second) fields.push_back(name);
        r.cells[name] = json_cell(v);
      };
      for (const auto& [k, v] : run.items()) {
        if (v.is_object()) {
          for (const auto& [k2, v2] : v.items())
            if (!v2.is_structured()) add(k + "." + k2, v2);
        } else if (!v.is_array()) {
          add(k, v);
        }
      }
      rows.push_back(std::move(r));
    }
  }
  std::ostringstream csv;
  csv << "point";
  for (const std::string& k : keys) csv << "," << csv_cell(k);
  for (const std::string& f : fields) csv << "," << csv_cell(f);
  csv << "\n";
  for (const Row& r : rows) {
    csv << r.point;
    for (const std::string& v : r.values) csv << "," << csv_cell(v);
    for (const std::string& f : fields) {
      auto it = r.cells.find(f);
      csv << "," << (it == r.cells.end() ? "" : csv_cell(it->second));
    }
    csv << "\n";
  }
  write_file_atomically(fs::path(dir) / "sweep.csv", csv.str());
  return {};
}

std::string clock_text(double s) {
  const auto t = static_cast<long>(s + 0.5);
  return fmt::format("{:02d}:{:02d}:{:02d}", t / 3600, (t / 60) % 60, t % 60);
}

}  // namespace

int run_merge_command(const std::string& dir, std::ostream& out, std::ostream& err) {
  size_t complete = 0, total = 0;
  if (std::string e = write_sweep_csv(dir, &complete, &total); !e.empty()) {
    err << "memsim merge: " << e << "\n";
    return 1;
  }
  out << fmt::format("memsim merge: {} of {} points complete; wrote {}/sweep.csv\n", complete,
                     total, dir);
  return complete > 0 ? 0 : 1;
}

namespace {

// K/N from --shard or a Slurm job array's environment; {0, 1} = every point.
bool parse_shard(const SweepOptions& o, size_t* k, size_t* n, std::string* error) {
  *k = 0;
  *n = 1;
  std::string text = o.shard;
  if (text.empty()) {
    const char* id = std::getenv("SLURM_ARRAY_TASK_ID");
    const char* count = std::getenv("SLURM_ARRAY_TASK_COUNT");
    const char* min = std::getenv("SLURM_ARRAY_TASK_MIN");
    if (id == nullptr || count == nullptr) return true;
    const long first = min != nullptr ? std::atol(min) : 0;
    text = fmt::format("{}/{}", std::atol(id) - first, count);
  }
  const size_t slash = text.find('/');
  try {
    if (slash == std::string::npos) throw std::invalid_argument("no /");
    *k = std::stoul(text.substr(0, slash));
    *n = std::stoul(text.substr(slash + 1));
  } catch (const std::exception&) {
    *error = fmt::format("--shard {}: expected K/N with 0 <= K < N", text);
    return false;
  }
  if (*n == 0 || *k >= *n) {
    *error = fmt::format("--shard {}: expected K/N with 0 <= K < N", text);
    return false;
  }
  return true;
}

std::string experiment_name(const ConfigNode& root, const std::string& path) {
  if (auto v = root.find("experiment"); v && v->is_scalar()) return v->as_string();
  return fs::path(path).stem().string();
}

// The Slurm array script: each task runs its shard of the grid (the shard is taken from the
// array's environment), all writing into the same folder; `memsim merge` then gathers them.
int write_slurm(const SweepOptions& o, const std::string& dir, size_t points, std::ostream& out,
                std::ostream& err) {
  const size_t tasks = o.tasks ? std::min<size_t>(o.tasks, points) : std::min<size_t>(points, 64);
  std::string cmd = fmt::format("{} sweep --config {} --out {} --no-progress", self_exe(),
                                fs::absolute(o.config).string(), fs::absolute(o.out_dir).string());
  if (o.jobs) cmd += fmt::format(" -j {}", o.jobs);
  auto quote = [](const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
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
  const fs::path path = fs::path(dir) / "sweep.sbatch";
  std::ofstream(path) << script;
  fs::permissions(path, fs::perms::owner_exec, fs::perm_options::add);
  out << fmt::format("wrote {} ({} array tasks over {} points)\n", path.string(), tasks, points);
  if (!o.submit) {
    out << fmt::format("submit it with: sbatch {}; then: memsim merge {}\n", path.string(), dir);
    return 0;
  }
  const std::string sub = "sbatch " + quote(path.string());
  out << "$ " << sub << "\n" << std::flush;
  const int rc = std::system(sub.c_str());
  if (rc != 0) {
    err << "memsim sweep: sbatch failed (exit " << rc << ")\n";
    return 1;
  }
  return 0;
}

struct Running {
  pid_t pid;
  size_t point;
  std::chrono::steady_clock::time_point start;
};

// Starts `memsim --config C --out PDIR --set ...` for point `p` (stdout/stderr into PDIR).
pid_t spawn_point(const SweepOptions& o, const std::string& pdir, const SweepPoint& p) {
  std::vector<std::string> args = {self_exe(), "--config", o.config, "--out", pdir};
  if (!o.plots) args.push_back("--no-plots");
  for (const std::string& s : overrides_of(p, o.sets)) {
    args.push_back("--set");
    args.push_back(s);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const std::string so = (fs::path(pdir) / "stdout.txt").string();
  const std::string se = (fs::path(pdir) / "stderr.txt").string();
  posix_spawn_file_actions_addopen(&fa, 1, so.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, se.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

}  // namespace

int run_sweep_command(const SweepOptions& o, std::ostream& out, std::ostream& err) {
  std::vector<SweepAxis> axes;
  std::string experiment;
  try {
    const ConfigNode root = ConfigNode::load_file(o.config);
    axes = parse_grid(root, o.axes);
    experiment = experiment_name(root, o.config);
  } catch (const ConfigError& e) {
    err << "memsim sweep: config error: " << e.what() << "\n";
    return 2;
  }
  if (axes.empty()) {
    err << "memsim sweep: " << o.config
        << ": nothing to sweep (give a grid: section or --sweep key=v1,v2,...)\n";
    return 2;
  }
  const std::vector<SweepPoint> points = expand_grid(axes);
  size_t shard_k = 0, shard_n = 1;
  std::string shard_error;
  if (!parse_shard(o, &shard_k, &shard_n, &shard_error)) {
    err << "memsim sweep: " << shard_error << "\n";
    return 2;
  }
  // Every point is validated before any runs.
  size_t invalid = 0;
  for (const SweepPoint& p : points) {
    const std::string e = validate(o.config, overrides_of(p, o.sets));
    if (e.empty()) continue;
    if (invalid++ < 5)
      err << fmt::format("memsim sweep: point {} ({}): {}\n", p.index, describe(p), e);
  }
  if (invalid > 0) {
    err << fmt::format("memsim sweep: {} of {} points are invalid; nothing was run\n", invalid,
                       points.size());
    return 2;
  }
  const std::string dir = (fs::path(o.out_dir) / (experiment + "-sweep")).string();
  out << fmt::format(
      "sweep {}: {} points ({} axes: {}), all valid; folder {}\n", o.config, points.size(),
      axes.size(),
      [&] {
        std::string s;
        for (const SweepAxis& a : axes)
          s += fmt::format("{}{} x{}", s.empty() ? "" : ", ", a.name, a.steps.size());
        return s;
      }(),
      dir);
  if (o.dry_run) {
    for (const SweepPoint& p : points) out << fmt::format("  {:5d}  {}\n", p.index, describe(p));
    return 0;
  }
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "points", ec);
  if (ec) {
    err << "memsim sweep: cannot create " << dir << ": " << ec.message() << "\n";
    return 1;
  }
  {
    json g;
    g["config"] = fs::absolute(o.config).string();
    g["experiment"] = experiment;
    g["sets"] = o.sets;
    for (const SweepAxis& a : axes) g["axes"].push_back({{"name", a.name}, {"keys", a.keys}});
    for (const SweepPoint& p : points) {
      json as = json::array();
      for (const auto& [k, v] : p.assignments) as.push_back({k, v});
      g["points"].push_back({{"index", p.index}, {"assignments", as}});
    }
    write_file_atomically(fs::path(dir) / "grid.json", g.dump(1) + "\n");
  }
  if (o.slurm) return write_slurm(o, dir, points.size(), out, err);

  // One sweep per shard at a time: a second one would run the same points into the same folders.
  const std::string lock_path =
      (fs::path(dir) / fmt::format(".lock-{}-of-{}", shard_k, shard_n)).string();
  const int lock_fd = open(lock_path.c_str(), O_CREAT | O_RDWR, 0644);
  if (lock_fd < 0 || flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    err << fmt::format("memsim sweep: another sweep is running shard {}/{} of {} (lock {})\n",
                       shard_k, shard_n, dir, lock_path);
    if (lock_fd >= 0) close(lock_fd);
    return 1;
  }
  // This shard's points not yet complete.
  std::vector<size_t> todo;
  size_t mine = 0, already = 0;
  for (const SweepPoint& p : points) {
    if (p.index % shard_n != shard_k) continue;
    ++mine;
    if (read_status(point_dir(dir, p.index)) == "done")
      ++already;
    else
      todo.push_back(p.index);
  }
  if (shard_n > 1) out << fmt::format("shard {}/{}: {} points\n", shard_k, shard_n, mine);
  if (already > 0)
    out << fmt::format("{} of {} points already complete (skipped)\n", already, mine);
  const unsigned jobs = o.jobs ? o.jobs : std::max(1u, std::thread::hardware_concurrency());
  const bool tty = o.progress && isatty(STDERR_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Running> running;
  size_t next = 0, done = 0, failed = 0;
  std::vector<std::string> failures;
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto draw = [&] {
    const double e = elapsed();
    const size_t finished = done + failed;
    const double eta = finished > 0 ? e / finished * (todo.size() - finished) : 0;
    const size_t width = 30;
    const size_t fill = todo.empty() ? width : width * finished / todo.size();
    err << fmt::format("\r[{}{}] {}/{} done, {} running, {} failed, {} elapsed, ETA {}   ",
                       std::string(fill, '#'), std::string(width - fill, '.'), done, todo.size(),
                       running.size(), failed, clock_text(e),
                       finished > 0 ? clock_text(eta) : std::string("--:--:--"))
        << std::flush;
  };
  auto last_draw = t0;
  while (next < todo.size() || !running.empty()) {
    while (running.size() < jobs && next < todo.size()) {
      const size_t i = todo[next++];
      const std::string pdir = point_dir(dir, i);
      fs::create_directories(pdir, ec);
      fs::remove(fs::path(pdir) / "status", ec);
      {
        // The point's resolved config, for the record.
        try {
          ConfigNode c = ConfigNode::load_file(o.config);
          for (const std::string& s : overrides_of(points[i], o.sets)) c.apply_override(s);
          std::ofstream(fs::path(pdir) / "config.yaml") << yaml_text(c.raw()) << "\n";
        } catch (const ConfigError&) {
        }
      }
      const pid_t pid = spawn_point(o, pdir, points[i]);
      if (pid < 0) {
        ++failed;
        failures.push_back(
            fmt::format("point {} ({}): could not start {}", i, describe(points[i]), self_exe()));
        continue;
      }
      running.push_back({pid, i, std::chrono::steady_clock::now()});
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (tty && std::chrono::steady_clock::now() - last_draw > std::chrono::milliseconds(250)) {
        draw();
        last_draw = std::chrono::steady_clock::now();
      }
      continue;
    }
    auto it = std::find_if(running.begin(), running.end(),
                           [&](const Running& r) { return r.pid == pid; });
    if (it == running.end()) continue;
    const size_t i = it->point;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - it->start).count();
    running.erase(it);
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    const std::string pdir = point_dir(dir, i);
    if (rc == 0) {
      ++done;
      write_file_atomically(fs::path(pdir) / "status", "done\n");
    } else {
      ++failed;
      write_file_atomically(fs::path(pdir) / "status", fmt::format("failed {}\n", rc));
      std::string last;
      std::ifstream e(fs::path(pdir) / "stderr.txt");
      for (std::string line; std::getline(e, line);)
        if (!line.empty()) last = line;
      failures.push_back(
          fmt::format("point {} ({}): exit {}: {}", i, describe(points[i]), rc, last));
    }
    if (tty) {
      draw();
    } else if (o.progress) {
      out << fmt::format("point {} {} in {:.1f} s ({}/{}, {} failed)\n", i,
                         rc == 0 ? "done" : "FAILED", secs, done + failed, todo.size(), failed)
          << std::flush;
    }
  }
  if (tty) {
    draw();
    err << "\n";
  }
  for (const std::string& f : failures) err << "memsim sweep: " << f << "\n";
  out << fmt::format("{} points run in {}: {} done, {} failed\n", todo.size(),
                     clock_text(elapsed()), done, failed);
  if (shard_n > 1) {
    out << fmt::format("when every shard has finished: memsim merge {}\n", dir);
  } else {
    size_t complete = 0, total = 0;
    if (std::string e = write_sweep_csv(dir, &complete, &total); !e.empty()) {
      err << "memsim sweep: " << e << "\n";
      return 1;
    }
    out << fmt::format("wrote {}/sweep.csv ({} of {} points complete)\n", dir, complete, total);
  }
  return failed > 0 ? 1 : 0;
}

}  // namespace memsim
