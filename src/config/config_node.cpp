// Implementation of located YAML access: typed conversion, key checking, overrides.
#include "src/config/config_node.h"

#include <fmt/format.h>
#include <algorithm>
#include <cmath>
#include <filesystem>

namespace memsim {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Close enough to be a typo: at most a third of the longer word, and never fewer than 2 edits.
  const size_t limit = std::max<size_t>(2, std::max(word.size(), best.size()) / 3);
  return best_d <= limit ? best : std::string();
}

namespace {

std::shared_ptr<const std::string> base_of(const std::string& file, const std::string& base_dir) {
  return std::make_shared<const std::string>(
      base_dir.empty() ? std::filesystem::path(file).parent_path().string() : base_dir);
}

}  // namespace

std::string check_plain_name(std::string_view name) {
  if (name.empty()) return "an empty name";
  if (name.size() > 128) return fmt::format("a name of {} characters (at most 128)", name.size());
  if (name.front() == '.')
    return fmt::format("'{}' starts with '.' (a hidden file, or a path out of the folder)", name);
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok)
      return fmt::format(
          "'{}' is not a plain file name (letters, digits, '-', '_' and '.' only: it names the "
          "results folder)",
          name);
  }
  return {};
}

ConfigNode ConfigNode::load_file(const std::string& path, const std::string& base_dir) {
  auto file = std::make_shared<const std::string>(path);
  try {
    return ConfigNode(YAML::LoadFile(path), file, base_of(path, base_dir), "", 0,
                      std::make_shared<std::vector<std::string>>());
  } catch (const YAML::BadFile&) {
    throw ConfigError(fmt::format("{}: cannot open file", path));
  } catch (const YAML::ParserException& e) {
    throw ConfigError(fmt::format("{}:{}: YAML syntax error: {}", path, e.mark.line + 1, e.msg));
  }
}

ConfigNode ConfigNode::parse(const std::string& text, const std::string& name,
                             const std::string& base_dir) {
  auto file = std::make_shared<const std::string>(name);
  try {
    return ConfigNode(YAML::Load(text), file, base_of(name, base_dir), "", 0,
                      std::make_shared<std::vector<std::string>>());
  } catch (const YAML::ParserException& e) {
    throw ConfigError(fmt::format("{}:{}: YAML syntax error: {}", name, e.mark.line + 1, e.msg));
  }
}

int ConfigNode::line() const {
  // An empty value's mark points at the next token: report it at its key (parent_line_).
  const YAML::Mark m = node_.Mark();
  return m.is_null() || node_.IsNull() ? parent_line_ : m.line + 1;
}

std::string ConfigNode::where() const {
  for (const std::string& o : *overrides_)
    if (path_ == o || path_.rfind(o + ".", 0) == 0 || path_.rfind(o + "[", 0) == 0)
      return fmt::format("{} (--set {})", file(), path_);
  const int l = line();
  const std::string loc = l > 0 ? fmt::format("{}:{}", file(), l) : file();
  return path_.empty() ? loc : fmt::format("{}: {}", loc, path_);
}

void ConfigNode::fail(const std::string& message) const {
  throw ConfigError(fmt::format("{}: {}", where(), message));
}

void ConfigNode::require_map() const {
  if (node_.IsMap()) return;
  // A file of comments and blank lines parses to an empty document, which has no line.
  if (path_.empty() && node_.IsNull())
    fail("no YAML content (only comments or blank lines); expected a map of keys");
  fail("expected a map of keys");
}

std::string ConfigNode::child_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
}

void ConfigNode::expect_keys(std::initializer_list<std::string_view> allowed) const {
  expect_keys(std::vector<std::string>(allowed.begin(), allowed.end()));
}

void ConfigNode::expect_keys(const std::vector<std::string>& allowed) const {
  require_map();
  std::vector<std::string> seen;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    if (!it->first.IsScalar())
      child(it->first, path_).fail("a key must be a name, not a list or map");
    const std::string key = it->first.as<std::string>();
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      child(it->first, child_path(key)).fail(fmt::format("duplicate key '{}'", key));
    seen.push_back(key);
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    ConfigNode at = child(it->first, child_path(key));
    const std::string near = closest_match(key, allowed);
    if (!near.empty()) at.fail(fmt::format("unknown key '{}' (did you mean '{}'?)", key, near));
    at.fail(fmt::format("unknown key '{}' (valid keys: {})", key, fmt::join(allowed, ", ")));
  }
}

bool ConfigNode::has(std::string_view key) const {
  return node_.IsMap() && node_[std::string(key)].IsDefined();
}

std::optional<ConfigNode> ConfigNode::find(std::string_view key) const {
  require_map();
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    if (it->first.Scalar() != key) continue;
    // The child's fallback line is its key's line (for empty values and --set nodes).
    const YAML::Mark km = it->first.Mark();
    ConfigNode c(it->second, file_, base_, child_path(key), km.is_null() ? line() : km.line + 1,
                 overrides_);
    return c;
  }
  return std::nullopt;
}

ConfigNode ConfigNode::operator[](std::string_view key) const {
  auto child = find(key);
  if (!child) fail(fmt::format("missing required key '{}'", key));
  if (child->node_.IsNull()) child->fail("has no value");
  return *child;
}

std::vector<ConfigNode> ConfigNode::items() const {
  if (!node_.IsSequence()) fail("expected a list");
  std::vector<ConfigNode> out;
  for (size_t i = 0; i < node_.size(); ++i)
    out.push_back(child(node_[i], fmt::format("{}[{}]", path_, i)));
  return out;
}

std::vector<std::string> ConfigNode::keys() const {
  require_map();
  std::vector<std::string> out;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    if (!it->first.IsScalar())
      child(it->first, path_).fail("a key must be a name, not a list or map");
    out.push_back(it->first.as<std::string>());
  }
  return out;
}

std::string ConfigNode::as_string() const {
  if (!node_.IsScalar()) fail("expected a single value");
  return node_.Scalar();
}

bool ConfigNode::as_bool() const {
  const std::string s = as_string();
  if (s == "true" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "no" || s == "off") return false;
  fail(fmt::format("expected true or false, got '{}'", s));
}

int64_t ConfigNode::as_int() const {
  const std::string s = as_string();
  try {
    size_t used = 0;
    // Decimal (YAML 1.2: leading zeros are not octal), or hexadecimal with 0x.
    const bool hex = s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
    const long long v = std::stoll(s, &used, hex ? 16 : 10);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  fail(fmt::format("expected an integer, got '{}'", s));
}

uint64_t ConfigNode::as_uint() const {
  const int64_t v = as_int();
  if (v < 0) fail(fmt::format("expected a non-negative integer, got {}", v));
  return static_cast<uint64_t>(v);
}

double ConfigNode::as_double() const {
  const std::string s = as_string();
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used == s.size() && std::isfinite(v)) return v;
  } catch (const std::exception&) {
  }
  fail(fmt::format("expected a number, got '{}'", s));
}

uint64_t ConfigNode::as_bytes() const {
  const std::string s = as_string();
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    fail(fmt::format("expected a byte size like 4096, 2MiB or 1.5GiB, got '{}'", s));
  }
  std::string unit = s.substr(used);
  // Plain integers are read exactly (a double would round above 2^53).
  if (unit.empty() && s.find_first_of(".eE") == std::string::npos && s[0] != '-') {
    try {
      return std::stoull(s, nullptr, 10);
    } catch (const std::exception&) {
      fail(fmt::format("'{}' is not a byte size", s));
    }
  }
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  static const std::vector<std::pair<std::string, double>> kUnits = {{"", 1},
                                                                     {"B", 1},
                                                                     {"KiB", 1024.0},
                                                                     {"MiB", 1048576.0},
                                                                     {"GiB", 1073741824.0},
                                                                     {"TiB", 1099511627776.0},
                                                                     {"KB", 1e3},
                                                                     {"MB", 1e6},
                                                                     {"GB", 1e9},
                                                                     {"TB", 1e12}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    const double bytes = v * scale;
    if (!(bytes >= 0) || bytes > 1.8e19 || bytes != std::floor(bytes))
      fail(fmt::format("'{}' is not a whole, non-negative number of bytes", s));
    return static_cast<uint64_t>(bytes);
  }
  fail(fmt::format("unknown unit '{}' in '{}' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)", unit,
                   s));
}

std::string ConfigNode::as_plain_name() const {
  const std::string s = as_string();
  if (std::string why = check_plain_name(s); !why.empty()) fail(why);
  return s;
}

std::string ConfigNode::as_choice(const std::vector<std::string>& choices) const {
  const std::string s = as_string();
  if (std::find(choices.begin(), choices.end(), s) != choices.end()) return s;
  const std::string near = closest_match(s, choices);
  fail(fmt::format("'{}' is not one of: {}{}", s, fmt::join(choices, ", "),
                   near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near)));
}

uint64_t ConfigNode::as_uint_in(uint64_t lo, uint64_t hi) const {
  const uint64_t v = as_uint();
  if (v < lo || v > hi) fail(fmt::format("{} is out of range [{}, {}]", v, lo, hi));
  return v;
}

double ConfigNode::as_double_in(double lo, double hi) const {
  const double v = as_double();
  if (v < lo || v > hi) fail(fmt::format("{} is out of range [{}, {}]", v, lo, hi));
  return v;
}

namespace {

bool is_index(const std::string& part) {
  return !part.empty() && part.size() <= 9 &&
         std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A key path's parts ("runs.0.kv.impl" -> runs, 0, kv, impl); `flag` names the flag in errors.
std::vector<std::string> key_parts(const std::string& key, const std::string& flag) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot - start));
    if (parts.back().empty()) throw ConfigError(fmt::format("{}: empty key in path", flag));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

// The path as ConfigNode::path() spells it: list entries in brackets ("runs[0].kv.impl").
std::string node_path(const std::vector<std::string>& parts, const YAML::Node& root) {
  std::string out;
  std::vector<YAML::Node> chain{root};  // not `cur = child`: that would rebind the tree's data
  for (const std::string& p : parts) {
    const YAML::Node& cur = chain.back();
    const bool index = cur.IsSequence() && is_index(p);
    out += index ? "[" + p + "]" : (out.empty() ? p : "." + p);
    if (index)
      chain.push_back(cur[std::stoul(p)]);
    else if (cur.IsMap())
      chain.push_back(cur[p]);
    else
      chain.push_back(YAML::Node());
  }
  return out;
}

// The node that holds parts.back(): walks the maps (created when `create`) and list entries
// (which must exist) of parts[0..n-1]. yaml-cpp nodes are handles and assigning one to another
// rebinds the data, not the handle: the walk keeps each step's node in a chain of its own.
YAML::Node parent_of(YAML::Node root, const std::vector<std::string>& parts, bool create,
                     const std::string& flag) {
  std::vector<YAML::Node> chain{root};
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const std::string& p = parts[i];
    YAML::Node& cur = chain.back();
    const std::string owner = i == 0 ? std::string("the document") : "'" + parts[i - 1] + "'";
    if (cur.IsSequence()) {
      if (!is_index(p))
        throw ConfigError(fmt::format("{}: {} is a list: give an entry's index (e.g. {}.0.{})",
                                      flag, owner, i == 0 ? "" : parts[i - 1], p));
      const size_t k = std::stoul(p);
      if (k >= cur.size())
        throw ConfigError(
            fmt::format("{}: {} has {} entries (indexes from 0)", flag, owner, cur.size()));
      chain.push_back(cur[k]);
      continue;
    }
    if (!cur.IsMap() && !cur.IsNull())
      throw ConfigError(fmt::format("{}: {} is not a map", flag, owner));
    if (!cur[p].IsDefined()) {
      if (!create) throw ConfigError(fmt::format("{}: no key '{}'", flag, p));
      cur[p] = YAML::Node(YAML::NodeType::Map);
    }
    chain.push_back(cur[p]);
  }
  return chain.back();
}

}  // namespace

void ConfigNode::apply_override(const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(fmt::format("--set {}: expected key.path=value", assignment));
  const std::string key = assignment.substr(0, eq);
  const std::string flag = "--set " + assignment;
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::ParserException& e) {
    throw ConfigError(fmt::format("{}: value is not valid YAML: {}", flag, e.msg));
  }
  const std::vector<std::string> parts = key_parts(key, flag);
  // Missing maps along the path are created; a list entry must exist; a scalar along it is an
  // error.
  YAML::Node parent = parent_of(node_, parts, true, flag);
  const std::string& last = parts.back();
  if (parent.IsSequence()) {
    if (!is_index(last) || std::stoul(last) >= parent.size())
      throw ConfigError(fmt::format("{}: '{}' is a list of {} entries: give an index below {}",
                                    flag, parts.size() > 1 ? parts[parts.size() - 2] : key,
                                    parent.size(), parent.size()));
    parent[std::stoul(last)] = value;
  } else {
    if (!parent.IsMap() && !parent.IsNull())
      throw ConfigError(fmt::format("{}: '{}' is not a map", flag,
                                    parts.size() > 1 ? parts[parts.size() - 2] : key));
    parent[last] = value;
  }
  overrides_->push_back(node_path(parts, node_));
}

void ConfigNode::apply_unset(const std::string& key) {
  const std::string flag = "--unset " + key;
  const std::vector<std::string> parts = key_parts(key, flag);
  YAML::Node parent = parent_of(node_, parts, false, flag);
  const std::string& last = parts.back();
  if (parent.IsSequence())
    throw ConfigError(
        fmt::format("{}: a list entry cannot be removed; --set the whole list", flag));
  if (!parent.IsMap() || !parent[last].IsDefined()) {
    std::vector<std::string> keys;
    if (parent.IsMap())
      for (auto it = parent.begin(); it != parent.end(); ++it)
        keys.push_back(it->first.as<std::string>());
    const std::string near = closest_match(last, keys);
    throw ConfigError(fmt::format("{}: no key '{}' to remove{}", flag, last,
                                  near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near)));
  }
  parent.remove(last);
}

bool ConfigNode::overridden(std::string_view key_path) const {
  return std::find(overrides_->begin(), overrides_->end(), key_path) != overrides_->end();
}

ConfigNode ConfigNode::clone() const {
  return ConfigNode(YAML::Clone(node_), file_, base_, path_, parent_line_,
                    std::make_shared<std::vector<std::string>>(*overrides_));
}

}  // namespace memsim
