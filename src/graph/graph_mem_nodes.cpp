// graph_mem_nodes: allocations become graph memory nodes; the backend's driver model decides
// the physical memory (see backends/sim/graph_memory_model.h).
#include "src/graph/graph_mem_nodes.h"

#include <fmt/format.h>
#include <algorithm>

namespace memsim {

Status GraphMemNodes::begin_graph(const GraphInfo& /*info*/, StreamId /*stream*/) {
  if (open_) return make_error(ErrorCode::kInvalidState, "begin_graph: a capture is open");
  open_ = true;
  return {};
}

Result<DevPtr> GraphMemNodes::allocate(uint64_t bytes, StreamId stream) {
  if (!open_) return make_error(ErrorCode::kInvalidState, "allocate outside a capture");
  MEMSIM_ASSIGN_OR_RETURN(DevPtr p, backend_.malloc_async(bytes, stream));
  live_.emplace(p, bytes);
  live_bytes_ += bytes;
  return p;
}

Status GraphMemNodes::free(DevPtr p, StreamId stream) {
  auto it = live_.find(p);
  if (it == live_.end())
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("free: {:#x} was not allocated by this strategy", p));
  // Inside the capture this records a free node; after it, it frees a launched output. An
  // output whose graph never ran (its launch failed) was never allocated: nothing to free.
  const Status s = backend_.free_async(p, stream);
  if (!s.ok() && s.error().code != ErrorCode::kInvalidState) return s;
  live_bytes_ -= it->second;
  live_.erase(it);
  return {};
}

Status GraphMemNodes::end_graph() {
  if (!open_) return make_error(ErrorCode::kInvalidState, "end_graph without begin");
  open_ = false;
  ++graphs_;
  peak_reserved_ = std::max(peak_reserved_, backend_.usage().graph_mem_reserved);
  return {};
}

Status GraphMemNodes::teardown() {
  const size_t leaked = live_.size();
  if (config_.trim_at_teardown) MEMSIM_TRY(backend_.graph_mem_trim());
  if (leaked > 0)
    return make_error(ErrorCode::kInvalidState,
                      fmt::format("teardown with {} graph allocations still live", leaked));
  return {};
}

GraphMemoryStats GraphMemNodes::stats() const {
  GraphMemoryStats s;
  s.reserved_bytes = backend_.usage().graph_mem_reserved;
  s.peak_reserved_bytes = std::max(peak_reserved_, s.reserved_bytes);
  s.allocated_bytes = live_bytes_;
  s.pools = graphs_;
  return s;
}

std::vector<LiveBlock> GraphMemNodes::live_allocations() const {
  std::vector<LiveBlock> out;
  for (const auto& [p, bytes] : live_) out.push_back(LiveBlock{p, bytes, bytes});
  return out;
}

bool GraphMemNodes::check_invariants(std::string* why) const {
  uint64_t sum = 0;
  for (const auto& [p, bytes] : live_) sum += bytes;
  if (sum != live_bytes_) {
    if (why) *why = "live byte counter mismatch";
    return false;
  }
  return true;
}

}  // namespace memsim
