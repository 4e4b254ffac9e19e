// The memory-saver registry: one line per implementation, and the parsers of their typed configs.
#include "src/saver/registry.h"

#include "src/saver/sleep_mode.h"
#include "src/saver/tagged_regions.h"

namespace memsim {
namespace {

TaggedRegionsConfig parse_tagged_regions(const ConfigNode& node) {
  TaggedRegionsConfig c;
  if (auto v = node.find("enable_cpu_backup")) {
    if (v->is_scalar()) {
      c.cpu_backup_all = v->as_bool();
    } else {
      for (const ConfigNode& t : v->items()) c.cpu_backup_tags.push_back(t.as_string());
    }
  }
  return c;
}

SleepModeConfig parse_sleep_mode(const ConfigNode& node) {
  SleepModeConfig c;
  if (auto v = node.find("level")) c.level = static_cast<int>(v->as_uint_in(1, 2));
  if (auto v = node.find("weights_tag")) c.weights_tag = v->as_string();
  return c;
}

}  // namespace

const Registry<SaverEntry>& memory_savers() {
  static const Registry<SaverEntry> kRegistry{
      "memory saver",
      {
          {"tagged_regions",
           "torch_memory_saver: pause/resume tagged regions at the same address, optional CPU "
           "backup",
           {"enable_cpu_backup"},
           parse_into<TaggedRegions>(parse_tagged_regions),
           {.default_tags = {"weights", "kv_cache", "cuda_graph"}}},
          {"sleep_mode",
           "vLLM sleep mode: level 1 offloads weights and discards the rest, level 2 discards all",
           {"level", "weights_tag"},
           parse_into<SleepMode>(parse_sleep_mode),
           {.default_tags = {"weights", "kv_cache"}}},
      }};
  return kRegistry;
}

}  // namespace memsim
