// memsim sweep's records: grid parsing and expansion, each point resolved and hashed, the
// points' states, grid.json, and sweep.csv gathered from the points' summaries (merge).
#include "src/app/sweep.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>

#include "src/app/experiment.h"
#include "src/app/output.h"

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

namespace {

std::string hex64(uint64_t v) {
  return fmt::format("{:016x}", v);
}

// FNV-1a, 64 bits: a fingerprint of a point's config (not a defence against forgery).
uint64_t fnv1a(std::string_view s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string read_first_line(const fs::path& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

// The summary.json of a point, parsed; nullopt when it is missing or not a JSON object with a
// list of runs.
std::optional<json> read_summary(const fs::path& path, std::string* why) {
  std::ifstream f(path);
  if (!f) {
    *why = "outputs missing";
    return std::nullopt;
  }
  try {
    json s = json::parse(f);
    if (s.is_object() && s.contains("runs") && s["runs"].is_array()) return s;
    *why = "summary.json has no list of runs";
  } catch (const json::exception&) {
    *why = "summary.json does not parse";
  }
  return std::nullopt;
}

std::string json_cell(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "";
  return v.dump();
}

}  // namespace

std::vector<ResolvedPoint> resolve_points(const ConfigNode& root,
                                          const std::vector<SweepPoint>& points,
                                          const std::vector<std::string>& sets) {
  std::vector<ResolvedPoint> out;
  out.reserve(points.size());
  for (const SweepPoint& p : points) {
    ResolvedPoint r;
    r.point = p;
    try {
      ConfigNode c = root.clone();
      for (const std::string& s : sets) c.apply_override(s);
      for (const auto& [k, v] : p.assignments) c.apply_override(k + "=" + v);
      r.experiment = validate_experiment(c);
      // The grid is not part of a point: a point keeps its hash when other values are added.
      if (c.is_map()) c.erase("grid");
      r.config_text = yaml_text(c.raw()) + "\n";
      // The point's process reads the text back: it must mean the same tree.
      const ConfigNode back = ConfigNode::parse(r.config_text, "config.yaml", root.base_dir());
      if (yaml_text(back.raw()) + "\n" != r.config_text)
        r.error = "its resolved config does not read back the same (a YAML round trip)";
      r.hash = hex64(fnv1a(r.config_text, fnv1a(root.base_dir() + "\n")));
    } catch (const ConfigError& e) {
      r.error = e.what();
    }
    out.push_back(std::move(r));
  }
  return out;
}

SweepRecord make_sweep_record(const std::vector<SweepAxis>& axes,
                              const std::vector<ResolvedPoint>& points) {
  SweepRecord r;
  for (const SweepAxis& a : axes) r.keys.insert(r.keys.end(), a.keys.begin(), a.keys.end());
  uint64_t h = fnv1a("memsim-grid-1\n");
  for (const ResolvedPoint& p : points) {
    SweepRecord::Point q{p.point.index, {}, p.hash, p.experiment};
    for (const auto& [k, v] : p.point.assignments) q.values.push_back(v);
    h = fnv1a(fmt::format("{} {} {}\n", p.point.index, p.hash, p.experiment), h);
    r.points.push_back(std::move(q));
  }
  r.grid_hash = hex64(h);
  return r;
}

std::string point_dir(const std::string& dir, size_t i) {
  return (fs::path(dir) / "points" / fmt::format("p{:05d}", i)).string();
}

PointState point_state(const std::string& dir, const SweepRecord::Point& p) {
  const fs::path pdir = point_dir(dir, p.index);
  const std::string status = read_first_line(pdir / "status");
  if (status.empty()) return {false, "new or interrupted"};
  if (status.rfind("done", 0) != 0) return {false, "failed before"};
  if (status != "done " + p.hash) return {false, "config changed"};
  std::string why;
  if (!read_summary(pdir / p.experiment / "summary.json", &why)) return {false, why};
  return {true, {}};
}

std::string grid_json_text(const SweepRecord& record, const std::string& config,
                           const std::vector<std::string>& sets,
                           const std::vector<SweepAxis>& axes) {
  json g;
  g["config"] = config;
  g["sets"] = sets;
  g["grid_hash"] = record.grid_hash;
  g["axes"] = json::array();
  for (const SweepAxis& a : axes) g["axes"].push_back({{"name", a.name}, {"keys", a.keys}});
  g["keys"] = record.keys;
  g["points"] = json::array();
  for (const SweepRecord::Point& p : record.points)
    g["points"].push_back({{"index", p.index},
                           {"values", p.values},
                           {"config_hash", p.hash},
                           {"experiment", p.experiment}});
  return g.dump(1) + "\n";
}

SweepRecord read_grid_json(const std::string& dir) {
  const std::string path = (fs::path(dir) / "grid.json").string();
  std::ifstream f(path);
  if (!f) {
    // Given the --out folder instead of the sweep's own: name the sweeps inside it.
    std::vector<std::string> inside;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (fs::is_regular_file(it->path() / "grid.json", ec)) inside.push_back(it->path().string());
    std::sort(inside.begin(), inside.end());
    throw OutputError(fmt::format(
        "{}: no grid.json (not a sweep folder){}", dir,
        inside.empty() ? ""
                       : fmt::format("; the sweep folders in it: {}", fmt::join(inside, ", "))));
  }
  const auto bad = [&](const std::string& what) {
    return OutputError(
        fmt::format("{}: {} (written by another memsim version, or edited?)", path, what));
  };
  json g;
  try {
    g = json::parse(f);
  } catch (const json::exception& e) {
    throw OutputError(fmt::format("{}: {}", path, e.what()));
  }
  const auto strings = [&](const json& v, const char* what) {
    if (!v.is_array()) throw bad(fmt::format("'{}' is not a list", what));
    std::vector<std::string> out;
    for (const json& x : v) {
      if (!x.is_string()) throw bad(fmt::format("'{}' holds a non-string", what));
      out.push_back(x.get<std::string>());
    }
    return out;
  };
  if (!g.is_object()) throw bad("not a JSON object");
  if (!g.contains("grid_hash") || !g["grid_hash"].is_string()) throw bad("no 'grid_hash'");
  if (!g.contains("keys") || !g.contains("points") || !g["points"].is_array())
    throw bad("no 'keys' or 'points' list");
  SweepRecord r;
  r.grid_hash = g["grid_hash"].get<std::string>();
  r.keys = strings(g["keys"], "keys");
  for (const json& p : g["points"]) {
    if (!p.is_object() || !p.contains("index") || !p["index"].is_number_unsigned() ||
        !p.contains("config_hash") || !p["config_hash"].is_string() || !p.contains("experiment") ||
        !p["experiment"].is_string() || !p.contains("values"))
      throw bad("a point without index, values, config_hash and experiment");
    SweepRecord::Point q;
    q.index = p["index"].get<size_t>();
    q.values = strings(p["values"], "values");
    q.hash = p["config_hash"].get<std::string>();
    q.experiment = p["experiment"].get<std::string>();
    if (q.values.size() != r.keys.size()) throw bad("a point whose values do not match 'keys'");
    if (!check_plain_name(q.experiment).empty()) throw bad("a point's experiment is not a name");
    r.points.push_back(std::move(q));
  }
  return r;
}

// sweep.csv: one row per (point, run) of the complete points, columns point, the swept keys,
// then the runs' fields (nested objects one level deep as parent.child). Host wall times are
// left out: the file is the same whatever -j, sharding or machine produced it.
size_t write_sweep_csv(const std::string& dir, const SweepRecord& record) {
  std::vector<std::string> fields;
  std::set<std::string> known;
  struct Row {
    size_t point;
    const std::vector<std::string>* values;
    std::map<std::string, std::string> cells;
  };
  std::vector<Row> rows;
  size_t complete = 0;
  for (const SweepRecord::Point& p : record.points) {
    if (!point_state(dir, p).complete) continue;
    std::string why;
    const fs::path summary = fs::path(point_dir(dir, p.index)) / p.experiment / "summary.json";
    const std::optional<json> s = read_summary(summary, &why);
    if (!s) throw OutputError(fmt::format("{}: {}", summary.string(), why));
    ++complete;
    for (const auto& run : (*s)["runs"]) {
      if (!run.is_object()) continue;
      Row r{p.index, &p.values, {}};
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
  for (const std::string& k : record.keys) csv << "," << csv_cell(k);
  for (const std::string& f : fields) csv << "," << csv_cell(f);
  csv << "\n";
  for (const Row& r : rows) {
    csv << r.point;
    for (const std::string& v : *r.values) csv << "," << csv_cell(v);
    for (const std::string& f : fields) {
      auto it = r.cells.find(f);
      csv << "," << (it == r.cells.end() ? "" : csv_cell(it->second));
    }
    csv << "\n";
  }
  write_file_atomically((fs::path(dir) / "sweep.csv").string(), csv.str());
  return complete;
}

int run_merge_command(const std::string& dir, std::ostream& out, std::ostream& err) {
  try {
    const SweepRecord record = read_grid_json(dir);
    const size_t complete = write_sweep_csv(dir, record);
    const size_t total = record.points.size();
    out << fmt::format("memsim merge: {} of {} points complete; wrote {}/sweep.csv\n", complete,
                       total, dir);
    if (complete < total) {
      err << fmt::format(
          "memsim merge: {} points are not complete (run the sweep or its missing shards again: "
          "it resumes); sweep.csv holds the {} that are\n",
          total - complete, complete);
      return 1;
    }
    return 0;
  } catch (const OutputError& e) {
    err << "memsim merge: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace memsim
