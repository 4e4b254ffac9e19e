// Typed, located access to YAML configuration: every error names file, line and key path, and an
// unknown key names the closest valid one.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace memsim {

// Thrown only by config loading; the app turns it into one message and exit code 2.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Levenshtein distance and the closest candidate (empty when none is close enough).
size_t edit_distance(std::string_view a, std::string_view b);
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

// Empty when `name` is a plain file name (letters, digits, '-', '_', '.'; not starting with
// '.'; at most 128 characters), else why it is not. Experiment names become folder names.
std::string check_plain_name(std::string_view name);

class ConfigNode {
 public:
  // `base_dir`: the folder that relative paths in the file resolve from (resolve_config_path,
  // resolve_data_path); empty: the file's own folder. A sweep point's resolved config keeps the
  // folder of the experiment YAML it came from.
  static ConfigNode load_file(const std::string& path, const std::string& base_dir = "");
  static ConfigNode parse(const std::string& text, const std::string& name,
                          const std::string& base_dir = "");

  const std::string& file() const { return *file_; }
  const std::string& base_dir() const { return *base_; }
  const std::string& path() const { return path_; }  // e.g. "strategies[2].impl"
  int line() const;                                  // 1-based; 0 if unknown
  std::string where() const;                         // "file:line: key path"
  bool is_map() const { return node_.IsMap(); }
  bool is_sequence() const { return node_.IsSequence(); }
  bool is_scalar() const { return node_.IsScalar(); }

  // Rejects keys outside `allowed`, naming the closest valid key.
  void expect_keys(std::initializer_list<std::string_view> allowed) const;
  void expect_keys(const std::vector<std::string>& allowed) const;
  bool has(std::string_view key) const;
  ConfigNode operator[](std::string_view key) const;  // required key
  std::optional<ConfigNode> find(std::string_view key) const;
  std::vector<ConfigNode> items() const;  // a sequence's elements
  std::vector<std::string> keys() const;  // a map's keys, in file order

  std::string as_string() const;
  bool as_bool() const;
  int64_t as_int() const;
  uint64_t as_uint() const;
  double as_double() const;
  // Byte sizes: an integer, or a number with a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB).
  uint64_t as_bytes() const;
  // One of `choices`; else an error listing them and naming the closest.
  std::string as_choice(const std::vector<std::string>& choices) const;
  // A name that becomes a file or folder name (check_plain_name); else a located error.
  std::string as_plain_name() const;

  // Range-checked helpers (inclusive bounds).
  uint64_t as_uint_in(uint64_t lo, uint64_t hi) const;
  double as_double_in(double lo, double hi) const;

  [[noreturn]] void fail(const std::string& message) const;

  // Applies a `--set a.b.c=value` override (value parsed as YAML) to this tree. Creates missing
  // maps along the path; a number after a list's key picks an entry (`runs.0.kv.impl=...`), which
  // must exist. The key itself is checked later by the typed loader like any other.
  void apply_override(const std::string& assignment);
  // Applies `--unset a.b.c`: removes the key (it must exist; the closest one is named if not).
  void apply_unset(const std::string& key);
  // The key paths --set set, as path() spells them ("runs[0].kv.impl").
  const std::vector<std::string>& overridden_keys() const { return *overrides_; }
  // Whether `--set key_path=...` set this key path (of the root).
  bool overridden(std::string_view key_path) const;
  // A deep copy (yaml-cpp nodes are shared handles): overrides applied to it leave this alone.
  ConfigNode clone() const;
  // Removes `key` from this map, if there.
  void erase(std::string_view key) { node_.remove(std::string(key)); }

  const YAML::Node& raw() const { return node_; }

 private:
  void require_map() const;  // fails unless this node is a map
  ConfigNode(YAML::Node node, std::shared_ptr<const std::string> file,
             std::shared_ptr<const std::string> base, std::string path, int parent_line,
             std::shared_ptr<std::vector<std::string>> overrides)
      : node_(std::move(node)),
        file_(std::move(file)),
        base_(std::move(base)),
        path_(std::move(path)),
        parent_line_(parent_line),
        overrides_(std::move(overrides)) {}
  ConfigNode child(YAML::Node node, std::string path) const {
    return ConfigNode(std::move(node), file_, base_, std::move(path), line(), overrides_);
  }
  std::string child_path(std::string_view key) const;

  YAML::Node node_;
  std::shared_ptr<const std::string> file_;
  std::shared_ptr<const std::string> base_;
  std::string path_;
  int parent_line_ = 0;
  std::shared_ptr<std::vector<std::string>> overrides_;  // key paths set by --set
};

}  // namespace memsim
