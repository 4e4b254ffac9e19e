// graph_mem_nodes: graph tensors as CUDA graph memory nodes (cudaMallocAsync inside the capture),
// relying on the driver to share physical memory between graphs launched into one stream.
#pragma once

#include <unordered_map>

#include "src/graph/graph_memory_strategy.h"

namespace memsim {

struct GraphMemNodesConfig {
  bool trim_at_teardown = true;  // cudaDeviceGraphMemTrim after the graphs are destroyed
};

class GraphMemNodes final : public GraphMemoryStrategy {
 public:
  GraphMemNodes(Backend& backend, GraphMemNodesConfig config)
      : backend_(backend), config_(config) {}
  Status begin_graph(const GraphInfo& info, StreamId stream) override;
  Result<DevPtr> allocate(uint64_t bytes, StreamId stream) override;
  Status free(DevPtr p, StreamId stream) override;
  Status end_graph() override;
  Status teardown() override;
  GraphMemoryStats stats() const override;
  std::vector<LiveBlock> live_allocations() const override;
  bool check_invariants(std::string* why) const override;

 private:
  Backend& backend_;
  GraphMemNodesConfig config_;
  bool open_ = false;
  std::unordered_map<DevPtr, uint64_t> live_;  // pointer -> requested bytes
  uint64_t live_bytes_ = 0;
  uint64_t graphs_ = 0;
  uint64_t peak_reserved_ = 0;
};

}  // namespace memsim
