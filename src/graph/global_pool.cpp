// global_pool: a single pool, created by the first capture of any runner.
#include "src/graph/global_pool.h"

namespace memsim {

Result<size_t> GlobalPool::select_pool(const GraphInfo& /*info*/, StreamId /*stream*/) {
  return pool_count() == 0 ? add_pool(device_source()) : size_t{0};
}

}  // namespace memsim
