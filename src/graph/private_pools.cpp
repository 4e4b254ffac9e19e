// private_pools: every capture gets its own pool; nothing is shared between graphs.
#include "src/graph/private_pools.h"

namespace memsim {

Result<size_t> PrivatePools::select_pool(const GraphInfo& /*info*/, StreamId /*stream*/) {
  return add_pool(device_source());
}

}  // namespace memsim
