// Registry of graph-memory strategies: YAML `impl:` name -> typed config parser -> factory.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/config/config_node.h"
#include "src/graph/graph_memory_strategy.h"

namespace memsim {

using GraphStrategyFactory = std::function<std::unique_ptr<GraphMemoryStrategy>(Backend&)>;

struct GraphStrategyInfo {
  std::string name;
  std::string summary;
  std::vector<std::string> params;  // YAML keys this implementation accepts
  // Validates this implementation's keys of `node` (at load time) and returns a factory.
  std::function<GraphStrategyFactory(const ConfigNode& node)> parse;
};

const std::vector<GraphStrategyInfo>& graph_strategies();
const GraphStrategyInfo* find_graph_strategy(std::string_view name);
std::vector<std::string> graph_strategy_names();

}  // namespace memsim
