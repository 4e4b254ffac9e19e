// TaggedRegions: torch_memory_saver (SGLang, veRL): tagged regions paused and resumed by tag,
// with an optional CPU backup kept across cycles.
#pragma once

#include <string>
#include <vector>

#include "src/saver/vmm_tagged_saver.h"

namespace memsim {

struct TaggedRegionsConfig {
  // enable_cpu_backup: tags whose regions copy their contents to pinned host memory before a
  // pause and back after a resume. torch_memory_saver keeps the pinned buffer allocated after a
  // resume (no re-allocation next time), so its host memory stays held.
  std::vector<std::string> cpu_backup_tags;
  bool cpu_backup_all = false;
};

class TaggedRegions final : public VmmTaggedSaver {
 public:
  TaggedRegions(Backend& backend, TaggedRegionsConfig config)
      : VmmTaggedSaver(backend), config_(std::move(config)) {}

 protected:
  bool backup_on_pause(const Alloc& a) const override;
  bool keep_backup() const override { return true; }

 private:
  TaggedRegionsConfig config_;
};

}  // namespace memsim
