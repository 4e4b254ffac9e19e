// The graph-memory registry: one line per implementation.
#include "src/graph/registry.h"

#include "src/graph/global_pool.h"
#include "src/graph/graph_mem_nodes.h"
#include "src/graph/private_pools.h"
#include "src/graph/shared_pool.h"
#include "src/graph/vmm_alias.h"

namespace memsim {
namespace {

TorchCachingConfig parse_allocator(const ConfigNode& node) {
  TorchCachingConfig c;
  if (auto v = node.find("max_split_size")) c.max_split_size = v->as_bytes();
  return c;
}

template <class Strategy>
GraphStrategyFactory pool_factory(const ConfigNode& node) {
  const TorchCachingConfig c = parse_allocator(node);
  return [c](Backend& b) { return std::make_unique<Strategy>(b, c); };
}

GraphStrategyFactory vmm_factory(const ConfigNode& node) {
  VmmAliasConfig c;
  c.allocator = parse_allocator(node);
  if (auto v = node.find("va_factor")) c.va_factor = v->as_double_in(0.01, 64);
  if (auto v = node.find("handles"))
    c.handle_per_extension = v->as_choice({"fixed", "per_extension"}) == "per_extension";
  if (auto v = node.find("set_access"))
    c.set_access_per_space = v->as_choice({"per_handle", "per_space"}) == "per_space";
  if (auto v = node.find("handle_bytes")) {
    c.handle_bytes = v->as_bytes();
    if (c.handle_bytes == 0) v->fail("must be positive (a multiple of the GPU's granularity)");
  }
  return [c](Backend& b) -> std::unique_ptr<GraphMemoryStrategy> {
    return std::make_unique<VmmAlias>(b, c);
  };
}

GraphStrategyFactory nodes_factory(const ConfigNode& node) {
  GraphMemNodesConfig c;
  if (auto v = node.find("trim_at_teardown")) c.trim_at_teardown = v->as_bool();
  return [c](Backend& b) { return std::make_unique<GraphMemNodes>(b, c); };
}

}  // namespace

const std::vector<GraphStrategyInfo>& graph_strategies() {
  static const std::vector<GraphStrategyInfo> kRegistry = {
      {"private_pools",
       "a fresh caching-allocator pool per graph (PyTorch default)",
       {"max_split_size"},
       pool_factory<PrivatePools>},
      {"shared_pool",
       "one pool per graph runner, shared by its graphs (vLLM)",
       {"max_split_size"},
       pool_factory<SharedPool>},
      {"global_pool",
       "one pool for every graph runner of the process (SGLang)",
       {"max_split_size"},
       pool_factory<GlobalPool>},
      {"vmm_alias",
       "a new VA space per shape over shared physical handles (xLLM)",
       {"max_split_size", "handle_bytes", "handles", "va_factor", "set_access"},
       vmm_factory},
      {"graph_mem_nodes",
       "cudaMallocAsync graph memory nodes, driver-managed reuse",
       {"trim_at_teardown"},
       nodes_factory},
  };
  return kRegistry;
}

const GraphStrategyInfo* find_graph_strategy(std::string_view name) {
  for (const auto& s : graph_strategies())
    if (s.name == name) return &s;
  return nullptr;
}

std::vector<std::string> graph_strategy_names() {
  std::vector<std::string> out;
  for (const auto& s : graph_strategies()) out.push_back(s.name);
  return out;
}

}  // namespace memsim
