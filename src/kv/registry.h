// Registry of KV-cache strategies: YAML `impl:` name -> typed config parser -> factory.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/config/config_node.h"
#include "src/kv/kv_cache_manager.h"

namespace memsim {

using KvFactory = std::function<std::unique_ptr<KvCacheManager>()>;

struct KvStrategyInfo {
  std::string name;
  std::string summary;
  std::vector<std::string> params;  // YAML keys this implementation accepts (besides impl)
  // Validates this implementation's keys of `node` (at load time) and returns a factory.
  std::function<KvFactory(const ConfigNode& node)> parse;
};

const std::vector<KvStrategyInfo>& kv_strategies();
const KvStrategyInfo* find_kv_strategy(std::string_view name);
std::vector<std::string> kv_strategy_names();

}  // namespace memsim
