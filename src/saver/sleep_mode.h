// SleepMode: vLLM's sleep mode (CuMemAllocator): sleep(level 1) offloads the weights to pinned
// host memory and discards everything else (KV cache, graphs' memory); sleep(level 2) discards
// the weights too; wake_up(tags) maps memory again (restoring offloaded contents, then freeing
// the host copy).
#pragma once

#include <string>
#include <vector>

#include "src/saver/vmm_tagged_saver.h"

namespace memsim {

struct SleepModeConfig {
  int level = 1;                        // the level pause() sleeps at
  std::string weights_tag = "weights";  // offloaded at level 1
};

class SleepMode final : public VmmTaggedSaver {
 public:
  SleepMode(Backend& backend, SleepModeConfig config)
      : VmmTaggedSaver(backend), config_(std::move(config)) {}

  // LLM.sleep(level): pause every tag at `level` (1 or 2).
  Result<SaverReport> sleep(int level);
  // LLM.wake_up(tags): resume the tags (all when empty).
  Result<SaverReport> wake_up(const std::vector<std::string>& tags) { return resume(tags); }

 protected:
  bool backup_on_pause(const Alloc& a) const override;
  bool keep_backup() const override { return false; }

 private:
  SleepModeConfig config_;
};

}  // namespace memsim
