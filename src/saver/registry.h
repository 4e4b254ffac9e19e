// Registry of memory savers: YAML `impl:` name -> typed config parser -> factory.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/config/config_node.h"
#include "src/saver/memory_saver.h"

namespace memsim {

using SaverFactory = std::function<std::unique_ptr<MemorySaver>(Backend&)>;

struct SaverInfo {
  std::string name;
  std::string summary;
  std::vector<std::string> params;
  std::function<SaverFactory(const ConfigNode& node)> parse;
};

const std::vector<SaverInfo>& memory_savers();
const SaverInfo* find_memory_saver(std::string_view name);

}  // namespace memsim
