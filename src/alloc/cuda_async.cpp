// CudaAsyncAllocator: best-fit placement in one virtual range, physical chunks on first touch.
#include "src/alloc/cuda_async.h"

#include <algorithm>

#include <fmt/format.h>

namespace memsim {

CudaAsyncAllocator::CudaAsyncAllocator(Backend& backend, CudaAsyncConfig config)
    : backend_(backend), config_(config) {}

// The pool's virtual range: the device capacity in whole chunks, reserved on first use.
Status CudaAsyncAllocator::ensure_range() {
  if (base_ != 0) return {};
  const uint64_t c = config_.chunk_bytes;
  const uint64_t bytes = (backend_.capacity() + c - 1) / c * c;
  MEMSIM_ASSIGN_OR_RETURN(base_, backend_.reserve_virtual(bytes, backend_.granularity()));
  range_ = bytes;
  add_free(0, bytes);
  return {};
}

void CudaAsyncAllocator::take_free(uint64_t offset, uint64_t size) {
  free_by_offset_.erase(offset);
  free_by_size_.erase({size, offset});
}

void CudaAsyncAllocator::add_free(uint64_t offset, uint64_t size) {
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.end() && offset + size == next->first) {
    const uint64_t n = next->second;
    take_free(next->first, n);
    size += n;
  }
  auto prev = free_by_offset_.lower_bound(offset);
  if (prev != free_by_offset_.begin()) {
    --prev;
    if (prev->first + prev->second == offset) {
      const uint64_t po = prev->first, ps = prev->second;
      take_free(po, ps);
      offset = po;
      size += ps;
    }
  }
  free_by_offset_[offset] = size;
  free_by_size_.insert({size, offset});
}

Result<DevPtr> CudaAsyncAllocator::malloc(uint64_t bytes, StreamId /*stream*/) {
  if (bytes == 0) return make_error(ErrorCode::kInvalidArgument, "cuda_async: malloc of 0 bytes");
  MEMSIM_TRY(ensure_range());
  const uint64_t a = config_.alignment;
  if (bytes > range_) {
    ++stats_.ooms;
    return make_error(ErrorCode::kOutOfMemory, "cuda_async: larger than the device", bytes);
  }
  const uint64_t size = (bytes + a - 1) / a * a;
  auto fit = free_by_size_.lower_bound({size, 0});
  if (fit == free_by_size_.end()) {
    ++stats_.ooms;
    return make_error(ErrorCode::kOutOfMemory, "cuda_async: the pool's range is full", size);
  }
  const uint64_t offset = fit->second, free_size = fit->first;
  const uint64_t c = config_.chunk_bytes;
  const uint64_t first = offset / c, last = (offset + size - 1) / c;
  // Physical memory for every chunk not yet mapped; on OOM trim unused chunks once and retry,
  // and undo this call's chunks if that fails too.
  std::vector<uint64_t> created;
  for (uint64_t k = first; k <= last; ++k) {
    if (chunks_.count(k) != 0) continue;
    Result<PhysHandle> h = backend_.create_physical(c, "cuda_async");
    if (!h.ok() && h.error().code == ErrorCode::kOutOfMemory) {
      MEMSIM_TRY(trim(0, first, last));  // not the chunks this call just mapped
      h = backend_.create_physical(c, "cuda_async");
    }
    Status st = h.ok() ? backend_.map(base_ + k * c, c, *h, 0) : Status(h.error());
    if (st.ok()) st = backend_.set_access(base_ + k * c, c);
    if (!st.ok()) {
      if (h.ok()) (void)backend_.release_physical(*h);
      for (uint64_t j : created) {
        (void)backend_.unmap(base_ + j * c, c);
        (void)backend_.release_physical(chunks_[j]);
        chunks_.erase(j);
        stats_.reserved_bytes -= c;
        ++stats_.segment_releases;
        --stats_.segments;
      }
      Error e = st.error();
      if (e.code == ErrorCode::kOutOfMemory) {
        ++stats_.ooms;
        e.message =
            fmt::format("cuda_async: out of memory for a {} B request: {}", bytes, e.message);
      }
      return e;
    }
    chunks_[k] = *h;
    created.push_back(k);
    stats_.reserved_bytes += c;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    ++stats_.segments;
    ++stats_.segment_allocs;
    if (observer_ != nullptr) observer_->segment_map(base_ + k * c, c, StreamId{});
  }
  take_free(offset, free_size);
  if (free_size > size) add_free(offset + size, free_size - size);
  for (uint64_t k = first; k <= last; ++k) ++chunk_users_[k];
  const DevPtr p = base_ + offset;
  live_[p] = Live{size, bytes};
  stats_.allocated_bytes += size;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.requested_bytes += bytes;
  ++stats_.live_blocks;
  return p;
}

Status CudaAsyncAllocator::free(DevPtr p) {
  auto it = live_.find(p);
  if (it == live_.end())
    return make_error(ErrorCode::kInvalidArgument, "cuda_async: free of unknown pointer");
  const uint64_t offset = p - base_, size = it->second.size;
  const uint64_t c = config_.chunk_bytes;
  for (uint64_t k = offset / c; k <= (offset + size - 1) / c; ++k)
    if (--chunk_users_[k] == 0) chunk_users_.erase(k);
  stats_.allocated_bytes -= size;
  stats_.requested_bytes -= it->second.requested;
  --stats_.live_blocks;
  live_.erase(it);
  add_free(offset, size);
  if (config_.release_threshold != UINT64_MAX) return trim(config_.release_threshold);
  return {};
}

// Releases unused chunks (highest first) while more than `keep_unused` bytes of them are held.
Status CudaAsyncAllocator::trim(uint64_t keep_unused, uint64_t spare_first, uint64_t spare_last) {
  const uint64_t c = config_.chunk_bytes;
  auto releasable = [&](uint64_t k) {
    return chunk_users_.count(k) == 0 && (k < spare_first || k > spare_last);
  };
  uint64_t unused = 0;
  for (const auto& [k, h] : chunks_) unused += releasable(k) ? c : 0;
  for (auto it = chunks_.end(); it != chunks_.begin() && unused > keep_unused;) {
    --it;
    if (!releasable(it->first)) continue;
    const uint64_t k = it->first;
    MEMSIM_TRY(backend_.unmap(base_ + k * c, c));
    MEMSIM_TRY(backend_.release_physical(it->second));
    if (observer_ != nullptr) observer_->segment_unmap(base_ + k * c, c, StreamId{});
    it = chunks_.erase(it);
    unused -= c;
    stats_.reserved_bytes -= c;
    --stats_.segments;
    ++stats_.segment_releases;
  }
  return {};
}

Status CudaAsyncAllocator::empty_cache() {
  return trim(0);  // cudaMemPoolTrimTo(pool, 0)
}

Status CudaAsyncAllocator::release_all() {
  Status first;
  const uint64_t c = config_.chunk_bytes;
  for (const auto& [k, h] : chunks_) {
    Status s = backend_.unmap(base_ + k * c, c);
    if (s.ok()) s = backend_.release_physical(h);
    if (!s.ok() && first.ok()) first = s;
    ++stats_.segment_releases;
  }
  chunks_.clear();
  chunk_users_.clear();
  live_.clear();
  free_by_offset_.clear();
  free_by_size_.clear();
  if (base_ != 0) {
    Status s = backend_.free_virtual(base_);
    if (!s.ok() && first.ok()) first = s;
  }
  base_ = 0;
  range_ = 0;
  clear_current(stats_);
  return first;
}

std::vector<LiveBlock> CudaAsyncAllocator::live_blocks() const {
  std::vector<LiveBlock> out;
  for (const auto& [p, l] : live_) out.push_back({p, l.size, l.requested});
  return by_address(std::move(out));
}

bool CudaAsyncAllocator::check_invariants(std::string* why) const {
  auto fail = [&](const std::string& m) { return invariant_broken(why, m); };
  if (free_by_offset_.size() != free_by_size_.size()) return fail("free trees differ in size");
  uint64_t free_total = 0, prev_end = 0;
  bool first = true;
  for (const auto& [o, s] : free_by_offset_) {
    if (free_by_size_.count({s, o}) == 0) return fail("free range missing from the size tree");
    if (!first && o <= prev_end) return fail("free ranges overlap or are not coalesced");
    first = false;
    prev_end = o + s;
    free_total += s;
  }
  uint64_t used = 0, requested = 0;
  const uint64_t c = config_.chunk_bytes;
  std::map<uint64_t, uint32_t> users;
  for (const auto& [p, l] : live_) {
    used += l.size;
    requested += l.requested;
    const uint64_t o = p - base_;
    auto f = free_by_offset_.upper_bound(o);
    if (f != free_by_offset_.begin() && std::prev(f)->first + std::prev(f)->second > o)
      return fail("a live block lies in a free range");
    for (uint64_t k = o / c; k <= (o + l.size - 1) / c; ++k) {
      if (chunks_.count(k) == 0) return fail("a live block on an unmapped chunk");
      ++users[k];
    }
  }
  if (base_ != 0 && used + free_total != range_) return fail("live + free != the range");
  for (const auto& [k, n] : users)
    if (chunk_users_.count(k) == 0 || chunk_users_.at(k) != n) return fail("chunk users wrong");
  if (users.size() != chunk_users_.size()) return fail("chunk users hold stale chunks");
  if (stats_.allocated_bytes != used || stats_.requested_bytes != requested)
    return fail("byte counters mismatch");
  if (stats_.reserved_bytes != chunks_.size() * c) return fail("reserved_bytes mismatch");
  if (stats_.live_blocks != live_.size()) return fail("live_blocks mismatch");
  return true;
}

}  // namespace memsim
