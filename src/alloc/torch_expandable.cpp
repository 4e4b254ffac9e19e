// TorchCachingAllocator's expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True).
//
// Follows ExpandableSegment and the expandable paths of DeviceCachingAllocator in
// c10/cuda/CUDACachingAllocator.cpp: per (pool, stream) one virtual range of device capacity +
// 1/8, mapped in pages (kSmallBuffer = 2 MiB for the small pool, kLargeBuffer = 20 MiB for the
// large pool) as allocations need them and unmapped (whole free pages only) by empty_cache().
// Reserved bytes count mapped pages. Free space that is mapped lives in pool.blocks like any
// cached block; unmapped space is a block in pool.unmapped.
#include <algorithm>

#include "src/alloc/torch_caching.h"

namespace memsim {

bool TorchCachingAllocator::UnmappedLess::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  return a->ptr < b->ptr;
}

// Follows try_allocate_expandable_block(): find room (free and unmapped blocks adjacent in one
// segment), map the unmapped part, absorb following unmapped blocks until the candidate holds
// `size`; the candidate leaves the pool for alloc_found_block to split.
Result<TorchCachingAllocator::Block*> TorchCachingAllocator::try_allocate_expandable_block(
    BlockPool& pool, uint64_t size, StreamId stream) {
  MEMSIM_ASSIGN_OR_RETURN(Block * candidate, find_expandable_block(pool, size, stream));
  if (!candidate->mapped) {
    MEMSIM_ASSIGN_OR_RETURN(const bool ok, map_block(candidate, std::min(candidate->size, size)));
    if (!ok) return make_error(ErrorCode::kOutOfMemory, "expandable segment: no memory to map");
  }
  while (candidate->size < size) {
    const uint64_t remaining = size - candidate->size;
    Block* next = candidate->next;  // free (find_expandable_block checked the room)
    if (next->mapped) {
      // A free mapped piece after unmapped pages (left by unmap_block). PyTorch asserts that
      // the next block is unmapped here; memsim absorbs the piece instead.
      pool.blocks.erase(candidate);
      try_merge_blocks(candidate, next, pool);
      insert_into_blocks(pool, candidate);
      continue;
    }
    MEMSIM_ASSIGN_OR_RETURN(const bool ok, map_block(next, std::min(remaining, next->size)));
    if (!ok) return make_error(ErrorCode::kOutOfMemory, "expandable segment: no memory to map");
    candidate = next;  // map_block merged the previous candidate into it
  }
  pool.blocks.erase(candidate);
  return candidate;
}

// Follows find_expandable_block(): the lowest-addressed unmapped block of this stream (preceded
// by a free mapped block when there is one) with enough free space after it; else a new segment.
Result<TorchCachingAllocator::Block*> TorchCachingAllocator::find_expandable_block(
    BlockPool& pool, uint64_t size, StreamId stream) {
  auto allocatable = [](const Block* b) { return b != nullptr && !b->allocated; };
  auto has_room = [&](const Block* b) {
    uint64_t bytes = 0;
    while (bytes < size && allocatable(b)) {
      bytes += b->size;
      b = b->next;
    }
    return bytes >= size;
  };
  Block key;
  key.stream = stream;
  key.ptr = 0;
  for (auto it = pool.unmapped.lower_bound(&key);
       it != pool.unmapped.end() && (*it)->stream == stream; ++it) {
    Block* c = *it;
    if (allocatable(c->prev)) c = c->prev;
    if (has_room(c)) return c;
  }
  if (vmm_ == nullptr)
    return make_error(ErrorCode::kNotSupported,
                      "torch_caching: expandable segments need a backend with virtual memory");
  const uint64_t page = pool.is_small ? kSmallBuffer : kLargeBuffer;
  const uint64_t want = config_.expandable_va_bytes != 0 ? config_.expandable_va_bytes
                                                         : vmm_->capacity() + vmm_->capacity() / 8;
  const uint64_t pages = (want + page - 1) / page;
  MEMSIM_ASSIGN_OR_RETURN(const DevPtr base,
                          vmm_->reserve_virtual(pages * page, vmm_->granularity()));
  Segment& seg = segments_[base];
  seg.base = base;
  seg.size = pages * page;
  seg.stream = stream;
  seg.pool = &pool;
  seg.expandable = true;
  seg.page = page;
  seg.handles.assign(pages, PhysHandle{});
  auto* block = new Block;
  block->ptr = base;
  block->size = seg.size;
  block->stream = stream;
  block->segment = &seg;
  block->mapped = false;
  seg.head = block;
  pool.unmapped.insert(block);
  ++stats_.segments;
  ++stats_.segment_allocs;
  return block;
}

// Follows ExpandableSegment::map(): physical pages for every page the range touches
// (segmentLeft .. segmentRight), each mapped, then one set_access over them. On OOM the pages
// created by this call are released and an empty range returned.
Result<TorchCachingAllocator::Range> TorchCachingAllocator::map_pages(Segment& seg, Range range) {
  const uint64_t begin = (range.ptr - seg.base) / seg.page;
  const uint64_t end = (range.ptr + range.size - seg.base + seg.page - 1) / seg.page;
  if (begin == end) return Range{seg.base + begin * seg.page, 0};
  for (uint64_t i = begin; i < end; ++i) {
    Result<PhysHandle> h = vmm_->create_physical(seg.page, "torch_caching");
    if (!h.ok()) {
      for (uint64_t j = begin; j < i; ++j) {
        (void)vmm_->unmap(seg.base + j * seg.page, seg.page);
        (void)vmm_->release_physical(seg.handles[j]);
        seg.handles[j] = PhysHandle{};
      }
      if (h.error().code == ErrorCode::kOutOfMemory) return Range{range.ptr, 0};
      return h.error();
    }
    seg.handles[i] = *h;
    MEMSIM_TRY(vmm_->map(seg.base + i * seg.page, seg.page, *h, 0));
  }
  MEMSIM_TRY(vmm_->set_access(seg.base + begin * seg.page, (end - begin) * seg.page));
  return Range{seg.base + begin * seg.page, (end - begin) * seg.page};
}

// Follows ExpandableSegment::unmap(): only pages wholly inside the range (segmentRight of its
// start .. segmentLeft of its end).
Result<TorchCachingAllocator::Range> TorchCachingAllocator::unmap_pages(Segment& seg, Range range) {
  const uint64_t begin = (range.ptr - seg.base + seg.page - 1) / seg.page;
  const uint64_t end = (range.ptr + range.size - seg.base) / seg.page;
  if (begin >= end) return Range{range.ptr, 0};
  for (uint64_t i = begin; i < end; ++i) {
    MEMSIM_TRY(vmm_->unmap(seg.base + i * seg.page, seg.page));
    MEMSIM_TRY(vmm_->release_physical(seg.handles[i]));
    seg.handles[i] = PhysHandle{};
  }
  return Range{seg.base + begin * seg.page, (end - begin) * seg.page};
}

// Follows map_block(): map at least `size` bytes at the start of the unmapped block, split off
// what stays unmapped, merge the now mapped block with free mapped neighbours, cache it.
Result<bool> TorchCachingAllocator::map_block(Block* to_map, uint64_t size) {
  Segment& seg = *to_map->segment;
  BlockPool& pool = *seg.pool;
  MEMSIM_ASSIGN_OR_RETURN(const Range mapped, map_pages(seg, Range{to_map->ptr, size}));
  if (mapped.size == 0) return false;
  pool.unmapped.erase(to_map);
  if (mapped.size < to_map->size) {
    auto* remaining = new Block;
    remaining->ptr = to_map->ptr + mapped.size;
    remaining->size = to_map->size - mapped.size;
    remaining->stream = to_map->stream;
    remaining->segment = &seg;
    remaining->mapped = false;
    remaining->prev = to_map;
    remaining->next = to_map->next;
    if (remaining->next != nullptr) remaining->next->prev = remaining;
    to_map->next = remaining;
    pool.unmapped.insert(remaining);
    to_map->size = mapped.size;
  }
  to_map->mapped = true;
  try_merge_blocks(to_map, to_map->prev, pool);
  try_merge_blocks(to_map, to_map->next, pool);
  insert_into_blocks(pool, to_map);
  stats_.reserved_bytes += mapped.size;
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  if (observer_ != nullptr) observer_->segment_map(mapped.ptr, mapped.size, seg.stream);
  return true;
}

// Follows unmap_block(): unmap the whole pages of a free mapped block; the pieces before and
// after stay mapped free blocks; the unmapped block merges with unmapped neighbours.
Status TorchCachingAllocator::unmap_block(Block* block) {
  Segment& seg = *block->segment;
  BlockPool& pool = *seg.pool;
  MEMSIM_ASSIGN_OR_RETURN(const Range unmapped, unmap_pages(seg, Range{block->ptr, block->size}));
  if (unmapped.size == 0) return {};
  pool.blocks.erase(block);
  const uint64_t before_size = unmapped.ptr - block->ptr;
  if (before_size > 0) {
    auto* before = new Block;
    before->ptr = block->ptr;
    before->size = before_size;
    before->stream = block->stream;
    before->segment = &seg;
    before->prev = block->prev;
    before->next = block;
    if (before->prev != nullptr) {
      before->prev->next = before;
    } else {
      seg.head = before;
    }
    block->prev = before;
    insert_into_blocks(pool, before);
  }
  const uint64_t after_size = block->size - (before_size + unmapped.size);
  if (after_size > 0) {
    auto* after = new Block;
    after->ptr = unmapped.ptr + unmapped.size;
    after->size = after_size;
    after->stream = block->stream;
    after->segment = &seg;
    after->prev = block;
    after->next = block->next;
    if (after->next != nullptr) after->next->prev = after;
    block->next = after;
    insert_into_blocks(pool, after);
  }
  block->ptr = unmapped.ptr;
  block->size = unmapped.size;
  block->mapped = false;
  try_merge_blocks(block, block->prev, pool);
  try_merge_blocks(block, block->next, pool);
  pool.unmapped.insert(block);
  stats_.reserved_bytes -= unmapped.size;
  if (observer_ != nullptr) observer_->segment_unmap(unmapped.ptr, unmapped.size, seg.stream);
  return {};
}

// Follows release_expandable_segment(): a segment that is one unmapped block gives its virtual
// range back.
Status TorchCachingAllocator::release_expandable_segment(Block* block) {
  Segment& seg = *block->segment;
  if (block->mapped || block->prev != nullptr || block->next != nullptr) return {};
  MEMSIM_TRY(vmm_->free_virtual(seg.base));
  seg.pool->unmapped.erase(block);
  --stats_.segments;
  ++stats_.segment_releases;
  delete block;
  segments_.erase(seg.base);
  return {};
}

// Teardown of one expandable segment (blocks already deleted): every mapped page, then the range.
Status TorchCachingAllocator::release_expandable_all(Segment& seg) {
  Status first;
  for (uint64_t i = 0; i < seg.handles.size(); ++i) {
    if (seg.handles[i].id == 0) continue;
    Status s = vmm_->unmap(seg.base + i * seg.page, seg.page);
    if (s.ok()) s = vmm_->release_physical(seg.handles[i]);
    if (!s.ok() && first.ok()) first = s;
    seg.handles[i] = PhysHandle{};
  }
  Status s = vmm_->free_virtual(seg.base);
  return first.ok() ? s : first;
}

}  // namespace memsim
