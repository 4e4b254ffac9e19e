// Test helpers for the config tests: temp copies of experiments/shapes.yaml with one defect,
// and checks that the loader's ConfigError names file, line and key path exactly.
#pragma once

#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "src/app/shapes_experiment.h"
#include "src/config/config_node.h"
#include "tests/temp_dir.h"

namespace memsim::test {

namespace fs = std::filesystem;

inline std::string source_root() {
  const char* root = std::getenv("MEMSIM_SOURCE_ROOT");
  REQUIRE(root != nullptr);
  return root;
}

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Sets (or unsets) an environment variable for one scope, restoring the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Replaces the one occurrence of `from` in `text` (there must be exactly one).
inline std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  INFO("replacing '" << from << "'");
  REQUIRE(at != std::string::npos);
  REQUIRE(text.find(from, at + 1) == std::string::npos);
  text.replace(at, from.size(), to);
  return text;
}

// 1-based number of the first line of `text` that starts with `prefix`.
inline int line_of(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n)
    if (line.rfind(prefix, 0) == 0) return n;
  FAIL("no line starts with '" << prefix << "'");
  return 0;
}

// 1-based number of the first line that holds a YAML key (not blank, not a comment).
inline int first_key_line(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n)
    if (!line.empty() && line[0] != '#') return n;
  FAIL("no key line");
  return 0;
}

inline std::string gpu_file() {
  return (fs::path(source_root()) / "configs/gpus/h200.yaml").string();
}
inline std::string model_file() {
  return (fs::path(source_root()) / "configs/models/llama-3.1-8b.yaml").string();
}

// experiments/shapes.yaml as shipped (gpu and model as bare names).
inline std::string shapes_yaml_bare() {
  return read_text(fs::path(source_root()) / "experiments" / "shapes.yaml");
}

// experiments/shapes.yaml with the gpu and model referenced by absolute path, so the copy loads
// from any folder.
inline std::string shapes_yaml() {
  std::string t = shapes_yaml_bare();
  t = replace_once(t, "\ngpu: h200", "\ngpu: " + gpu_file());
  t = replace_once(t, "\nmodel: llama-3.1-8b", "\nmodel: " + model_file());
  return t;
}

// Loads `path`, expecting a ConfigError; returns its message (checked to be a single line).
inline std::string load_error(const std::string& path,
                              const std::vector<std::string>& overrides = {}) {
  try {
    load_shapes_config(path, overrides);
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find('\n') == std::string::npos);
    return msg;
  }
  FAIL("expected a ConfigError from " << path);
  return {};
}

// "file:line: key.path: message", the format of every located error.
inline std::string located(const std::string& file, int line, const std::string& key_path,
                           const std::string& message) {
  return fmt::format("{}:{}: {}: {}", file, line, key_path, message);
}

// Writes `text` as `name`, loads it expecting an error, and checks the exact message.
inline void expect_error(const TempDir& dir, const std::string& name, const std::string& text,
                         int line, const std::string& key_path, const std::string& message) {
  const std::string path = dir.write(name, text);
  const std::string got = load_error(path);
  // The parts first (clearer failures), then the exact text.
  CHECK_THAT(got, Catch::Contains(path));
  CHECK_THAT(got, Catch::Contains(fmt::format(":{}:", line)));
  CHECK_THAT(got, Catch::Contains(key_path));
  CHECK(got == located(path, line, key_path, message));
}

inline std::vector<std::string> labels(const ShapesConfig& c) {
  std::vector<std::string> out;
  for (const StrategySpec& s : c.strategies) out.push_back(s.label);
  return out;
}

}  // namespace memsim::test
