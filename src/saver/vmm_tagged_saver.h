// Shared machinery of the memory savers: one VMM reservation and physical handle per tagged
// allocation, paused (optional pinned-host backup, unmap, release) and resumed (create, map,
// set access, restore) in place.
#pragma once

#include <map>
#include <string>

#include "src/saver/memory_saver.h"

namespace memsim {

class VmmTaggedSaver : public MemorySaver {
 public:
  explicit VmmTaggedSaver(Backend& backend) : backend_(backend) {}
  ~VmmTaggedSaver() override = default;  // bookkeeping only; call release_all() first

  Result<DevPtr> malloc(uint64_t bytes, std::string_view tag) override;
  Status free(DevPtr p) override;
  Result<SaverReport> pause(const std::vector<std::string>& tags) override;
  Result<SaverReport> resume(const std::vector<std::string>& tags) override;
  Status release_all() override;
  SaverStats stats() const override;
  bool is_paused(DevPtr p) const override;
  bool check_invariants(std::string* why) const override;

 protected:
  struct Alloc {
    uint64_t bytes = 0;  // rounded to the granularity
    std::string tag;
    PhysHandle handle;    // id 0: none held
    bool mapped = false;  // active = mapped (and access set)
    DevPtr backup = 0;    // pinned host copy, 0: none
  };
  // Whether pausing `a` copies its contents to pinned host memory first.
  virtual bool backup_on_pause(const Alloc& a) const = 0;
  // Whether a backup is kept after it was restored (torch_memory_saver keeps it for the next
  // pause; vLLM frees it).
  virtual bool keep_backup() const = 0;

  Backend& backend() { return backend_; }

 private:
  bool selected(const Alloc& a, const std::vector<std::string>& tags) const;
  Status pause_one(DevPtr p, Alloc& a, SaverReport& r);
  Status resume_one(DevPtr p, Alloc& a, SaverReport& r);
  Status drop_backup(Alloc& a);

  Backend& backend_;
  std::map<DevPtr, Alloc> allocs_;
  uint64_t physical_ = 0;
  uint64_t backup_bytes_ = 0;
  uint64_t pauses_ = 0, resumes_ = 0;
};

}  // namespace memsim
