// VmmTaggedSaver: the pause/resume state machine, with failure handling per backend call.
//
// Follows torch_memory_saver's csrc/core.cpp: malloc = cuMemCreate + cuMemAddressReserve +
// cuMemMap + cuMemSetAccess per allocation; pause = (backup: cudaMallocHost once, copy D2H) +
// cuMemUnmap + cuMemRelease; resume = cuMemCreate + cuMemMap + cuMemSetAccess (+ copy H2D);
// free = unmap + release + address free + cudaFreeHost. Where it exits the process (pausing
// what is paused, resuming what is active) this skips the allocation instead.
#include "src/saver/vmm_tagged_saver.h"

#include <algorithm>

#include <fmt/format.h>

namespace memsim {

namespace {
constexpr StreamId kCopyStream{0};
}

bool VmmTaggedSaver::selected(const Alloc& a, const std::vector<std::string>& tags) const {
  return tags.empty() || std::find(tags.begin(), tags.end(), a.tag) != tags.end();
}

Result<DevPtr> VmmTaggedSaver::malloc(uint64_t bytes, std::string_view tag) {
  if (bytes == 0) return make_error(ErrorCode::kInvalidArgument, "memory saver: malloc of 0 bytes");
  if (tag.empty()) return make_error(ErrorCode::kInvalidArgument, "memory saver: empty tag");
  const uint64_t g = backend_.granularity();
  if (bytes > UINT64_MAX - g)
    return make_error(ErrorCode::kOutOfMemory, "memory saver: request too large", bytes);
  const uint64_t size = (bytes + g - 1) / g * g;
  MEMSIM_ASSIGN_OR_RETURN(const PhysHandle h, backend_.create_physical(size, tag));
  Result<DevPtr> va = backend_.reserve_virtual(size, g);
  if (!va.ok()) {
    (void)backend_.release_physical(h);
    return va.error();
  }
  Status s = backend_.map(*va, size, h, 0);
  if (s.ok()) {
    s = backend_.set_access(*va, size);
    if (!s.ok()) (void)backend_.unmap(*va, size);
  }
  if (!s.ok()) {
    (void)backend_.release_physical(h);
    (void)backend_.free_virtual(*va);
    return s.error();
  }
  allocs_[*va] = Alloc{size, std::string(tag), h, true, 0};
  physical_ += size;
  return *va;
}

// One allocation: backup (when asked), unmap, release. A failure before the unmap leaves it
// active; after it, paused with its handle still held (a later pause or teardown releases it,
// a resume maps it again).
Status VmmTaggedSaver::pause_one(DevPtr p, Alloc& a, SaverReport& r) {
  if (backup_on_pause(a)) {
    if (a.backup == 0) {
      MEMSIM_ASSIGN_OR_RETURN(a.backup, backend_.host_malloc_pinned(a.bytes));
      backup_bytes_ += a.bytes;
    }
    MEMSIM_TRY(backend_.copy(a.backup, p, a.bytes, kCopyStream));
    r.copied_bytes += a.bytes;
  }
  MEMSIM_TRY(backend_.unmap(p, a.bytes));
  a.mapped = false;
  MEMSIM_TRY(backend_.release_physical(a.handle));
  a.handle = PhysHandle{};
  physical_ -= a.bytes;
  return {};
}

Result<SaverReport> VmmTaggedSaver::pause(const std::vector<std::string>& tags) {
  SaverReport r;
  for (auto& [p, a] : allocs_) {
    if (!selected(a, tags)) continue;
    if (!a.mapped && a.handle.id == 0) {
      ++r.skipped;
      continue;
    }
    if (!a.mapped) {  // left holding its handle by a failed release: finish the pause
      MEMSIM_TRY(backend_.release_physical(a.handle));
      a.handle = PhysHandle{};
      physical_ -= a.bytes;
      continue;
    }
    MEMSIM_TRY(pause_one(p, a, r));
    ++r.allocations;
    r.bytes += a.bytes;
    ++pauses_;
  }
  return r;
}

Status VmmTaggedSaver::drop_backup(Alloc& a) {
  if (a.backup == 0) return {};
  MEMSIM_TRY(backend_.host_free_pinned(a.backup));
  a.backup = 0;
  backup_bytes_ -= a.bytes;
  return {};
}

// One allocation: create (unless a handle is still held), map, set access, restore. Any
// failure undoes this call's steps, so the allocation stays paused.
Status VmmTaggedSaver::resume_one(DevPtr p, Alloc& a, SaverReport& r) {
  const bool fresh = a.handle.id == 0;
  if (fresh) {
    MEMSIM_ASSIGN_OR_RETURN(a.handle, backend_.create_physical(a.bytes, a.tag));
    physical_ += a.bytes;
  }
  auto undo = [&](bool mapped) {
    if (mapped) (void)backend_.unmap(p, a.bytes);
    if (fresh && backend_.release_physical(a.handle).ok()) {
      a.handle = PhysHandle{};
      physical_ -= a.bytes;
    }
  };
  if (Status s = backend_.map(p, a.bytes, a.handle, 0); !s.ok()) {
    undo(false);
    return s;
  }
  if (Status s = backend_.set_access(p, a.bytes); !s.ok()) {
    undo(true);
    return s;
  }
  if (a.backup != 0) {
    if (Status s = backend_.copy(p, a.backup, a.bytes, kCopyStream); !s.ok()) {
      undo(true);
      return s;
    }
    r.copied_bytes += a.bytes;
    if (!keep_backup()) (void)drop_backup(a);
  }
  a.mapped = true;
  return {};
}

Result<SaverReport> VmmTaggedSaver::resume(const std::vector<std::string>& tags) {
  SaverReport r;
  for (auto& [p, a] : allocs_) {
    if (!selected(a, tags)) continue;
    if (a.mapped) {
      ++r.skipped;
      continue;
    }
    MEMSIM_TRY(resume_one(p, a, r));
    ++r.allocations;
    r.bytes += a.bytes;
    ++resumes_;
  }
  return r;
}

Status VmmTaggedSaver::free(DevPtr p) {
  auto it = allocs_.find(p);
  if (it == allocs_.end())
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("memory saver: free of {:#x}, which it did not allocate", p));
  Alloc& a = it->second;
  if (a.mapped) {
    MEMSIM_TRY(backend_.unmap(p, a.bytes));
    a.mapped = false;
  }
  if (a.handle.id != 0) {
    MEMSIM_TRY(backend_.release_physical(a.handle));
    a.handle = PhysHandle{};
    physical_ -= a.bytes;
  }
  MEMSIM_TRY(drop_backup(a));
  MEMSIM_TRY(backend_.free_virtual(p));
  allocs_.erase(it);
  return {};
}

Status VmmTaggedSaver::release_all() {
  Status first;
  while (!allocs_.empty()) {
    const DevPtr p = allocs_.begin()->first;
    Status s = free(p);
    if (!s.ok()) {
      if (first.ok()) first = s;
      allocs_.erase(p);  // forget it; the backend releases what it still holds at its end
    }
  }
  physical_ = 0;
  backup_bytes_ = 0;
  return first;
}

SaverStats VmmTaggedSaver::stats() const {
  SaverStats s;
  for (const auto& [p, a] : allocs_) {
    SaverTagStats& t = s.tags[a.tag];
    ++t.allocations;
    t.bytes += a.bytes;
    (a.mapped ? t.active_bytes : t.paused_bytes) += a.bytes;
    if (a.backup != 0) t.backup_bytes += a.bytes;
  }
  s.physical_bytes = physical_;
  s.backup_bytes = backup_bytes_;
  s.pauses = pauses_;
  s.resumes = resumes_;
  return s;
}

bool VmmTaggedSaver::is_paused(DevPtr p) const {
  auto it = allocs_.find(p);
  return it != allocs_.end() && !it->second.mapped;
}

bool VmmTaggedSaver::check_invariants(std::string* why) const {
  auto fail = [&](const std::string& m) {
    if (why != nullptr) *why = m;
    return false;
  };
  uint64_t physical = 0, backup = 0;
  DevPtr end = 0;
  for (const auto& [p, a] : allocs_) {
    if (p < end) return fail("allocations overlap");
    end = p + a.bytes;
    if (a.bytes == 0 || a.bytes % backend_.granularity() != 0) return fail("bad size");
    if (a.mapped && a.handle.id == 0) return fail("mapped without a handle");
    if (a.handle.id != 0) physical += a.bytes;
    if (a.backup != 0) backup += a.bytes;
  }
  if (physical != physical_) return fail("physical bytes counter mismatch");
  if (backup != backup_bytes_) return fail("backup bytes counter mismatch");
  return true;
}

}  // namespace memsim
