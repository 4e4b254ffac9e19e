// One registry template for every strategy family: YAML `impl:` name -> entry (summary, accepted
// keys, parser -> typed config -> factory, traits), with lookups that name the closest valid name.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/config/config_node.h"

namespace memsim {

// Traits of a family whose callers need to know nothing beyond the role interface.
struct NoTraits {};

// One implementation of a family, as its registry lists it.
template <class Factory, class Traits = NoTraits>
struct RegistryEntry {
  std::string name;               // the YAML `impl:` value
  std::string summary;            // one line, for listings and documentation
  std::vector<std::string> keys;  // YAML keys it accepts besides impl
  // Reads the implementation's keys of a map whose keys were checked (Registry::select) into
  // its typed config and returns a factory holding a copy of it; a bad value is a ConfigError
  // that names the key.
  std::function<Factory(const ConfigNode&)> parse;
  // What callers need to know about the implementation (they never test `name`).
  Traits traits{};

  // The factory with every key at its default.
  Factory defaults() const { return parse(ConfigNode::parse("{}", "<" + name + " defaults>")); }
};

// The usual RegistryEntry::parse: `parse_config` reads the typed config and the factory makes
// std::make_unique<Strategy>(factory arguments..., config).
template <class Strategy, class Config>
auto parse_into(Config (*parse_config)(const ConfigNode&)) {
  return [parse_config](const ConfigNode& node) {
    return [config = parse_config(node)](auto&... args) {
      return std::make_unique<Strategy>(args..., config);
    };
  };
}

// A family's table of implementations, in listing order. `Entry` has at least `name` and
// `keys` (RegistryEntry, or a family's own entry type when its parser has another shape).
template <class Entry>
class Registry {
 public:
  // `noun` names one implementation in messages ("graph strategy"). Names must be distinct.
  Registry(std::string noun, std::vector<Entry> entries)
      : noun_(std::move(noun)), entries_(std::move(entries)) {
    for (size_t i = 0; i < entries_.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (entries_[i].name == entries_[j].name)
          throw std::logic_error(fmt::format("{} '{}' registered twice", noun_, entries_[i].name));
  }

  const std::string& noun() const { return noun_; }
  const std::vector<Entry>& entries() const { return entries_; }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }

  // The entry called `name`, or null.
  const Entry* find(std::string_view name) const {
    for (const Entry& e : entries_)
      if (e.name == name) return &e;
    return nullptr;
  }

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const Entry& e : entries_) out.push_back(e.name);
    return out;
  }

  // The entry `name` (a YAML scalar) calls; else a ConfigError at it:
  // "'x' is not one of: a, b (did you mean 'y'?)".
  const Entry& at(const ConfigNode& name) const {
    if (const Entry* e = find(name.as_string())) return *e;
    name.as_choice(names());  // fails, naming the closest
    throw std::logic_error("unreachable");
  }

  // The entry a `{impl: ..., keys...}` map selects, once every key of the map is checked
  // against impl, then `own` (the caller's keys beside the strategy's, e.g. label), then the
  // entry's keys: an unknown key is a ConfigError naming the closest valid one.
  const Entry& select(const ConfigNode& node, const std::vector<std::string>& own = {}) const {
    const Entry& e = at(node["impl"]);
    check_keys(node, e, own);
    return e;
  }

  // The key check of select, for a map whose impl is implied (e.g. a default).
  static void check_keys(const ConfigNode& node, const Entry& e,
                         const std::vector<std::string>& own = {}) {
    std::vector<std::string> allowed = {"impl"};
    allowed.insert(allowed.end(), own.begin(), own.end());
    allowed.insert(allowed.end(), e.keys.begin(), e.keys.end());
    node.expect_keys(allowed);
  }

  // For a name from outside YAML (a command line, a default in code):
  // "unknown graph strategy 'x' (did you mean 'y'?) (one of: a, b)".
  std::string unknown(std::string_view name) const {
    const std::string near = closest_match(name, names());
    return fmt::format("unknown {} '{}'{} (one of: {})", noun_, name,
                       near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near),
                       fmt::join(names(), ", "));
  }

 private:
  std::string noun_;
  std::vector<Entry> entries_;
};

}  // namespace memsim
