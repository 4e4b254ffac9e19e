// kv_lanes: layers grouped by (KV cache group, window), and the kernels' view of a group's table.
#include "src/kv/kv_lanes.h"

#include <algorithm>

namespace memsim {

KvLanes kv_lanes(const KvLayout& layout, const std::vector<uint32_t>& layer_windows,
                 uint32_t layers) {
  KvLanes out;
  out.groups = std::max<uint32_t>(1, static_cast<uint32_t>(layout.group_window.size()));
  for (uint32_t layer = 0; layer < layers; ++layer) {
    const KvLane l{layout.group_of(layer), layer < layer_windows.size() ? layer_windows[layer] : 0};
    out.groups = std::max(out.groups, l.group + 1);
    const auto it = std::find(out.lanes.begin(), out.lanes.end(), l);
    out.layer_lane.push_back(static_cast<uint32_t>(it - out.lanes.begin()));
    if (it == out.lanes.end()) out.lanes.push_back(l);
  }
  return out;
}

void kernel_group_table(const KvCacheManager& kv, SeqId seq, uint32_t group,
                        std::vector<int32_t>* out) {
  kv.seq_group_table(seq, group, out);
  for (int32_t& b : *out) b = std::max(b, 0);
}

}  // namespace memsim
