// vmm_alias: SharedVmmSpaces (xLLM's SharedVMMAllocator on the Backend's VMM primitives) under a
// fresh caching-allocator pool per captured shape.
#include "src/graph/vmm_alias.h"

#include <fmt/format.h>
#include <cmath>

namespace memsim {

SharedVmmSpaces::SharedVmmSpaces(Backend& backend, const VmmAliasConfig& config)
    : backend_(backend),
      handle_bytes_(config.handle_bytes ? config.handle_bytes : backend.granularity()),
      per_extension_(config.handle_per_extension),
      set_access_per_space_(config.set_access_per_space),
      reset_pointer_(config.reset_pointer) {
  const uint64_t g = backend.granularity();
  const auto want =
      static_cast<uint64_t>(std::ceil(config.va_factor * static_cast<double>(backend.capacity())));
  space_bytes_ = (want + g - 1) / g * g;
}

Status SharedVmmSpaces::map_handle(DevPtr space, size_t index, bool set_access) {
  // xLLM's vmm::map = cuMemMap + cuMemSetAccess, per handle.
  const Handle& h = handles_[index];
  MEMSIM_TRY(backend_.map(space + h.offset, h.bytes, h.handle, 0));
  return set_access ? backend_.set_access(space + h.offset, h.bytes) : Status{};
}

Status SharedVmmSpaces::switch_to_new_space() {
  if (reset_pointer_ && !spaces_.empty()) {
    offset_ = 0;  // reset_allocation_pointer(): the next shape starts at the same addresses
    return {};
  }
  MEMSIM_ASSIGN_OR_RETURN(DevPtr base, backend_.reserve_virtual(space_bytes_, 0));
  spaces_.push_back(base);
  offset_ = 0;
  for (size_t i = 0; i < handles_.size(); ++i)
    MEMSIM_TRY(map_handle(base, i, !set_access_per_space_));
  if (set_access_per_space_ && !handles_.empty()) return backend_.set_access(base, mapped_);
  return {};
}

Status SharedVmmSpaces::extend(uint64_t needed) {
  // New physical memory is mapped into every space at the same offset (extend_mapping).
  const uint64_t g = backend_.granularity();
  while (mapped_ < needed) {
    uint64_t bytes = handle_bytes_;
    if (per_extension_) bytes = std::max(handle_bytes_, (needed - mapped_ + g - 1) / g * g);
    if (mapped_ + bytes > space_bytes_)
      return make_error(ErrorCode::kOutOfMemory,
                        fmt::format("vmm_alias: {} bytes exceed the reserved space of {} bytes",
                                    needed, space_bytes_),
                        needed - mapped_);
    MEMSIM_ASSIGN_OR_RETURN(PhysHandle h, backend_.create_physical(bytes, "graph_pool"));
    handles_.push_back(Handle{h, mapped_, bytes});
    mapped_ += bytes;
    peak_mapped_ = std::max(peak_mapped_, mapped_);
    for (DevPtr space : spaces_) {
      Status s = map_handle(space, handles_.size() - 1, true);
      if (!s.ok()) return s;  // the handle stays listed: release_all unmaps what was mapped
    }
  }
  return {};
}

Result<DevPtr> SharedVmmSpaces::allocate_segment(uint64_t bytes, StreamId /*stream*/) {
  if (spaces_.empty()) MEMSIM_TRY(switch_to_new_space());
  const uint64_t g = backend_.granularity();
  const uint64_t aligned = (bytes + g - 1) / g * g;
  MEMSIM_TRY(extend(offset_ + aligned));
  const DevPtr p = spaces_.back() + offset_;
  offset_ += aligned;
  return p;
}

Status SharedVmmSpaces::release_segment(DevPtr /*p*/, uint64_t /*bytes*/) {
  return {};
}

Status SharedVmmSpaces::release_all() {
  Status first;
  auto keep = [&](Status s) {
    if (!s.ok() && first.ok()) first = s;
  };
  for (DevPtr space : spaces_) {
    for (size_t i = 0; i < handles_.size(); ++i) {
      // Unmap handle by handle: a failed extend may have left a space partly mapped.
      const Status s = backend_.unmap(space + handles_[i].offset, handles_[i].bytes);
      if (!s.ok() && s.error().code != ErrorCode::kInvalidState) keep(s);
    }
    keep(backend_.free_virtual(space));
  }
  for (const Handle& h : handles_) keep(backend_.release_physical(h.handle));
  spaces_.clear();
  handles_.clear();
  mapped_ = 0;
  offset_ = 0;
  return first;
}

VmmAlias::VmmAlias(Backend& backend, const VmmAliasConfig& config)
    : PoolStrategyBase(backend, config.allocator), spaces_(backend, config) {}

Result<size_t> VmmAlias::select_pool(const GraphInfo& info, StreamId /*stream*/) {
  // One space and one pool per shape: the pieces of a piecewise forward read each other's
  // outputs, so they must not alias one another.
  if (info.piece == 0 || pool_count() == 0) {
    const SimTime start = backend().now();
    MEMSIM_TRY(spaces_.switch_to_new_space());
    switch_time_ += backend().now() - start;
    return add_pool(spaces_);
  }
  return pool_count() - 1;
}

Status VmmAlias::teardown() {
  MEMSIM_TRY(PoolStrategyBase::teardown());
  return spaces_.release_all();
}

GraphMemoryStats VmmAlias::stats() const {
  GraphMemoryStats s = PoolStrategyBase::stats();
  s.reserved_bytes = spaces_.physical_bytes();
  s.peak_reserved_bytes = spaces_.peak_physical_bytes();
  s.pools = spaces_.spaces();
  return s;
}

}  // namespace memsim
