// SleepMode: the level decides what is offloaded (vllm/device_allocator/cumem.py: sleep with
// offload_tags=("weights",) at level 1, () at level 2; wake_up frees each CPU backup).
#include "src/saver/sleep_mode.h"

#include <fmt/format.h>

namespace memsim {

Result<SaverReport> SleepMode::sleep(int level) {
  if (level != 1 && level != 2)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("sleep_mode: level {} (vLLM has levels 1 and 2)", level));
  const int saved = config_.level;
  config_.level = level;
  Result<SaverReport> r = pause({});
  config_.level = saved;
  return r;
}

bool SleepMode::backup_on_pause(const Alloc& a) const {
  return config_.level == 1 && a.tag == config_.weights_tag;
}

}  // namespace memsim
