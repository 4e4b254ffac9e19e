// shared_pool: the first graph of each runner creates the runner's pool; later graphs reuse it.
#include "src/graph/shared_pool.h"

namespace memsim {

Result<size_t> SharedPool::select_pool(const GraphInfo& info, StreamId /*stream*/) {
  auto it = pool_of_runner_.find(info.runner);
  if (it != pool_of_runner_.end()) return it->second;
  const size_t pool = add_pool(device_source());
  pool_of_runner_.emplace(info.runner, pool);
  return pool;
}

}  // namespace memsim
