// vmm_alias: xLLM's SharedVMMAllocator — each captured shape gets a new virtual address space
// onto which every existing physical handle is mapped, so all shapes share physical memory
// (footprint max(shape)) while their addresses stay distinct (virtual sum(shape)).
#pragma once

#include <vector>

#include "src/graph/pool_strategy_base.h"

namespace memsim {

struct VmmAliasConfig {
  TorchCachingConfig allocator;
  // Physical handle size (0 = the backend's granularity). With per_extension, each extension
  // creates one handle sized to the shortfall, rounded to the granularity and at least
  // handle_bytes: no memory beyond what the pools asked for, and few handles.
  uint64_t handle_bytes = 0;
  bool handle_per_extension = false;
  double va_factor = 1.125;  // VA reserved per space, as a multiple of device capacity
  // How a new space gets access rights: one cuMemSetAccess per handle as xLLM does
  // (per_handle), or all handles mapped first and one call over the whole range (per_space).
  bool set_access_per_space = false;
  // xLLM's failed first design (seed §1.4), opt-in (`spaces: one`): one VA space for every shape;
  // before each capture the allocation pointer goes back to the space's start
  // (reset_allocation_pointer), so every shape's pool is handed the same addresses again while the
  // earlier shapes' tensors may still be live. The strategy-wide allocated_blocks then loses
  // entries (PoolStrategyBase) and a later free fails with "invalid device pointer".
  bool reset_pointer = false;
};

// The segment source: a bump offset in the current space over physical handles shared by all
// spaces. deallocate is a no-op, as in xLLM (memory is reused by switching spaces).
class SharedVmmSpaces final : public SegmentSource {
 public:
  SharedVmmSpaces(Backend& backend, const VmmAliasConfig& config);
  Result<DevPtr> allocate_segment(uint64_t bytes, StreamId stream) override;
  Status release_segment(DevPtr p, uint64_t bytes) override;
  // Reserves a new space, maps every existing handle into it, resets the offset. With
  // reset_pointer, only the first call reserves; later ones only reset the offset.
  Status switch_to_new_space();
  Status release_all();
  uint64_t physical_bytes() const { return mapped_; }
  uint64_t peak_physical_bytes() const { return peak_mapped_; }
  uint64_t handles() const { return handles_.size(); }
  uint64_t spaces() const { return spaces_.size(); }
  uint64_t mapped_virtual() const { return mapped_ * spaces_.size(); }

 private:
  Status map_handle(DevPtr space, size_t index, bool set_access);
  Status extend(uint64_t needed);

  Backend& backend_;
  struct Handle {
    PhysHandle handle;
    uint64_t offset;  // where it is mapped in every space
    uint64_t bytes;
  };
  uint64_t handle_bytes_;
  bool per_extension_;
  bool set_access_per_space_;
  bool reset_pointer_;
  uint64_t space_bytes_;
  std::vector<DevPtr> spaces_;  // base of each reserved space; the last is current
  std::vector<Handle> handles_;
  uint64_t mapped_ = 0;  // bytes of physical memory (= mapped in each space)
  uint64_t peak_mapped_ = 0;
  uint64_t offset_ = 0;  // bump offset in the current space
};

class VmmAlias final : public PoolStrategyBase {
 public:
  VmmAlias(Backend& backend, const VmmAliasConfig& config);
  Status teardown() override;
  GraphMemoryStats stats() const override;
  // Every shape's space maps the same physical handles from offset 0: a tensor held past its
  // capture is overwritten by the next shape's replay (xLLM copies outputs out right away). With
  // reset_pointer, every shape's pool is even handed the same addresses.
  bool preserves_held_tensors() const override { return false; }

 protected:
  Result<size_t> select_pool(const GraphInfo& info, StreamId stream) override;

 private:
  SharedVmmSpaces spaces_;
};

}  // namespace memsim
