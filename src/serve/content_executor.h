// content executor: the step executor of the sim backend. It keeps a KvContentShadow of what every
// K/V row of the first and last layer holds and checks that each scheduled sequence reads its own
// tokens through its table (engine.validate_content), the check the CUDA executor makes on real
// attention output, without a GPU.
#pragma once

#include <map>
#include <memory>

#include "src/kv/kv_content.h"
#include "src/serve/step_executor.h"

namespace memsim {

class ContentExecutor final : public StepExecutor {
 public:
  Status begin(KvCacheManager& kv, Backend& backend, DevPtr swap_space,
               uint64_t swap_bytes) override;
  Status run_step(const StepWork& work) override;
  Status swap_out(SeqId seq, SeqId source, const TokenContent& content, uint32_t tokens) override;
  Status swap_in(SeqId seq, const TokenContent& content, uint32_t tokens) override;
  Status swap_drop(SeqId seq) override;
  void end() override;
  ExecutorReport report() const override { return report_; }
  bool reads_kv_groups() const override { return true; }  // each layer's group, its window

 private:
  KvCacheManager* kv_ = nullptr;
  Backend* backend_ = nullptr;
  std::unique_ptr<KvContentShadow> shadow_;
  std::map<SeqId, uint32_t> swapped_;  // swapped-out sequence -> tokens saved
  DevPtr swap_space_ = 0;              // the engine's pinned swap space (must exist to swap)
  uint64_t swap_bytes_ = 0;
  ExecutorReport report_;
};

}  // namespace memsim
