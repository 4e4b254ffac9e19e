// Registry of graph-memory strategies: YAML `impl:` name -> typed config parser -> factory.
#pragma once

#include <functional>
#include <memory>

#include "src/config/registry.h"
#include "src/graph/graph_memory_strategy.h"

namespace memsim {

using GraphStrategyFactory = std::function<std::unique_ptr<GraphMemoryStrategy>(Backend&)>;

// What drivers and reports need to know of a graph-memory strategy before running it.
struct GraphTraits {
  // The driver, not the strategy, owns the graph memory (CUDA graph memory nodes): the driver
  // maps it at launch and reuses a tensor freed inside the graph within that graph, so a weak
  // output is not readable after its replay, each launch may map memory, the driver's
  // graph-memory attributes (cudaGraphMemAttrReservedMemHigh) describe it, and a shape captured
  // alone takes the driver's footprint, not a caching-allocator pool's.
  bool driver_managed_memory = false;
};

using GraphEntry = RegistryEntry<GraphStrategyFactory, GraphTraits>;

const Registry<GraphEntry>& graph_strategies();

}  // namespace memsim
