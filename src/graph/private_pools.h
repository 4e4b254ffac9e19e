// private_pools: a fresh caching-allocator pool per captured graph (PyTorch's default for
// torch.cuda.graph without a pool argument).
#pragma once

#include "src/graph/pool_strategy_base.h"

namespace memsim {

class PrivatePools final : public PoolStrategyBase {
 public:
  PrivatePools(Backend& backend, TorchCachingConfig config) : PoolStrategyBase(backend, config) {}

 protected:
  Result<size_t> select_pool(const GraphInfo& info, StreamId stream) override;
};

}  // namespace memsim
