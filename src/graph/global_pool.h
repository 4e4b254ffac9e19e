// global_pool: one caching-allocator pool for every graph runner of the process, full and
// piecewise (SGLang's global graph memory pool, set_global_graph_memory_pool()).
#pragma once

#include "src/graph/pool_strategy_base.h"

namespace memsim {

class GlobalPool final : public PoolStrategyBase {
 public:
  GlobalPool(Backend& backend, TorchCachingConfig config) : PoolStrategyBase(backend, config) {}

 protected:
  Result<size_t> select_pool(const GraphInfo& info, StreamId stream) override;
};

}  // namespace memsim
