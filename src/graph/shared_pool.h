// shared_pool: one caching-allocator pool shared by all graphs of a graph runner
// (vLLM's graph_pool_handle(); capture order arrival or large_first decides the reuse).
#pragma once

#include <map>

#include "src/graph/pool_strategy_base.h"

namespace memsim {

class SharedPool final : public PoolStrategyBase {
 public:
  SharedPool(Backend& backend, TorchCachingConfig config) : PoolStrategyBase(backend, config) {}

 protected:
  Result<size_t> select_pool(const GraphInfo& info, StreamId stream) override;

 private:
  std::map<uint32_t, size_t> pool_of_runner_;
};

}  // namespace memsim
