// PoolStrategyBase: routes a graph's allocations to its caching-allocator pool.
#include "src/graph/pool_strategy_base.h"

#include <fmt/format.h>
#include <algorithm>

namespace memsim {

PoolStrategyBase::PoolStrategyBase(Backend& backend, TorchCachingConfig allocator_config)
    : backend_(backend), config_(allocator_config), device_source_(backend, "graph_pool") {}

size_t PoolStrategyBase::add_pool(SegmentSource& source) {
  pools_.push_back(std::make_unique<TorchCachingAllocator>(source, config_));
  pools_.back()->set_observer(observer_);
  return pools_.size() - 1;
}

bool PoolStrategyBase::set_observer(AllocatorObserver* observer) {
  observer_ = observer;
  for (auto& pool : pools_) pool->set_observer(observer);
  return true;
}

Status PoolStrategyBase::begin_graph(const GraphInfo& info, StreamId stream) {
  if (current_ != SIZE_MAX)
    return make_error(ErrorCode::kInvalidState, "begin_graph: a capture is already open");
  MEMSIM_ASSIGN_OR_RETURN(current_, select_pool(info, stream));
  return {};
}

Result<DevPtr> PoolStrategyBase::allocate(uint64_t bytes, StreamId stream) {
  if (current_ == SIZE_MAX)
    return make_error(ErrorCode::kInvalidState, "allocate outside begin_graph/end_graph");
  TorchCachingAllocator& pool = *pools_[current_];
  const AllocatorStats before = pool.stats();
  auto p = pool.malloc(bytes, stream);
  reserved_ = reserved_ + pool.stats().reserved_bytes - before.reserved_bytes;  // OOM may shrink
  allocated_ = allocated_ + pool.stats().allocated_bytes - before.allocated_bytes;
  if (dirty_.empty() || dirty_.back() != current_) dirty_.push_back(current_);
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  if (!p.ok()) return p.error();
  if (auto [it, fresh] = owner_.try_emplace(*p, current_); !fresh) {
    lost_[*p] = {it->second, current_};  // allocated_blocks[ptr] = block: the earlier is gone
    it->second = current_;
  }
  if (observer_ != nullptr) observer_->block_alloc(*p, bytes, stream);
  return p;
}

Status PoolStrategyBase::free(DevPtr p, StreamId /*stream*/) {
  auto it = owner_.find(p);
  if (it == owner_.end()) {
    if (auto lost = lost_.find(p); lost != lost_.end())
      return make_error(
          ErrorCode::kInvalidArgument,
          fmt::format("free: invalid device pointer {:#x}: pools {} and {} both handed out this "
                      "address while it was live, so allocated_blocks kept one entry for two "
                      "blocks, and the address's first free removed it",
                      p, lost->second.first, lost->second.second));
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("free: {:#x} was not allocated by this strategy", p));
  }
  TorchCachingAllocator& pool = *pools_[it->second];
  const uint64_t before = pool.stats().allocated_bytes;
  MEMSIM_TRY(pool.free(p));
  if (observer_ != nullptr) observer_->block_free(p);
  allocated_ = allocated_ + pool.stats().allocated_bytes - before;
  if (dirty_.empty() || dirty_.back() != it->second) dirty_.push_back(it->second);
  owner_.erase(it);
  return {};
}

Status PoolStrategyBase::end_graph() {
  if (current_ == SIZE_MAX) return make_error(ErrorCode::kInvalidState, "end_graph without begin");
  current_ = SIZE_MAX;
  return {};
}

Status PoolStrategyBase::teardown() {
  for (auto& pool : pools_) MEMSIM_TRY(pool->release_all());
  owner_.clear();
  lost_.clear();
  pools_.clear();
  dirty_.clear();
  reserved_ = 0;
  allocated_ = 0;
  return {};
}

GraphMemoryStats PoolStrategyBase::stats() const {
  GraphMemoryStats s;
  s.allocated_bytes = allocated_;
  s.reserved_bytes = reserved_;
  s.peak_reserved_bytes = peak_reserved_;
  s.pools = pools_.size();
  s.switch_time = switch_time_;
  return s;
}

std::vector<LiveBlock> PoolStrategyBase::live_allocations() const {
  std::vector<LiveBlock> out;
  for (const auto& pool : pools_) {
    auto blocks = pool->live_blocks();
    out.insert(out.end(), blocks.begin(), blocks.end());
  }
  return out;
}

bool PoolStrategyBase::check_invariants(std::string* why) const {
  // Only pools changed since the last check can have broken: checking them keeps per-graph
  // conformance checks O(touched pools) instead of O(all pools).
  std::sort(dirty_.begin(), dirty_.end());
  dirty_.erase(std::unique(dirty_.begin(), dirty_.end()), dirty_.end());
  for (size_t i : dirty_) {
    if (!pools_[i]->check_invariants(why)) {
      if (why) *why = fmt::format("pool {}: {}", i, *why);
      return false;
    }
  }
  dirty_.clear();
  if (owner_.size() > 0 && pools_.empty()) {
    if (why) *why = "live pointers without pools";
    return false;
  }
  return true;
}

}  // namespace memsim
