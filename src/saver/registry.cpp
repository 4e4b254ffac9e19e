// The memory-saver registry: one line per implementation.
#include "src/saver/registry.h"

#include "src/saver/sleep_mode.h"
#include "src/saver/tagged_regions.h"

namespace memsim {

namespace {

SaverFactory tagged_factory(const ConfigNode& node) {
  TaggedRegionsConfig c;
  if (auto v = node.find("enable_cpu_backup")) {
    if (v->is_scalar()) {
      c.cpu_backup_all = v->as_bool();
    } else {
      for (const ConfigNode& t : v->items()) c.cpu_backup_tags.push_back(t.as_string());
    }
  }
  return [c](Backend& b) { return std::make_unique<TaggedRegions>(b, c); };
}

SaverFactory sleep_factory(const ConfigNode& node) {
  SleepModeConfig c;
  if (auto v = node.find("level")) c.level = static_cast<int>(v->as_uint_in(1, 2));
  if (auto v = node.find("weights_tag")) c.weights_tag = v->as_string();
  return [c](Backend& b) { return std::make_unique<SleepMode>(b, c); };
}

}  // namespace

const std::vector<SaverInfo>& memory_savers() {
  static const std::vector<SaverInfo> kRegistry = {
      {"tagged_regions",
       "torch_memory_saver: pause/resume tagged regions at the same address, optional CPU backup",
       {"enable_cpu_backup"},
       tagged_factory},
      {"sleep_mode",
       "vLLM sleep mode: level 1 offloads weights and discards the rest, level 2 discards all",
       {"level", "weights_tag"},
       sleep_factory},
  };
  return kRegistry;
}

const SaverInfo* find_memory_saver(std::string_view name) {
  for (const auto& s : memory_savers())
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace memsim
