// ContentExecutor: token writes and read-back checks on a KvContentShadow; strategy copies reach
// the shadow through the SimBackend's copy observer, swaps rewrite the sequence's rows.
#include "src/serve/content_executor.h"

#include <fmt/format.h>

#include <utility>

#include "backends/sim/sim_backend.h"

namespace memsim {

Status ContentExecutor::begin(KvCacheManager& kv, Backend& backend, DevPtr swap_space,
                              uint64_t swap_bytes) {
  auto* sim = dynamic_cast<SimBackend*>(&backend);
  if (!sim)
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("engine.validate_content shadows KV contents on the sim "
                                  "backend; the {} backend checks real attention output instead",
                                  backend.name()));
  kv_ = &kv;
  backend_ = &backend;
  swap_space_ = swap_space;
  swap_bytes_ = swap_bytes;
  const KvLayout layout = kv.layout();
  // The first and the last layer, and the first of every KV cache group (each group's table).
  std::vector<uint32_t> layers{0, static_cast<uint32_t>(layout.k.size()) - 1};
  for (uint32_t l = 0; l < layout.layer_group.size(); ++l) {
    bool seen = false;
    for (uint32_t t : layers) seen = seen || layout.group_of(t) == layout.group_of(l);
    if (!seen) layers.push_back(l);
  }
  shadow_ = std::make_unique<KvContentShadow>(layout, std::move(layers));
  sim->set_copy_observer(
      [this](DevPtr dst, DevPtr src, uint64_t bytes) { shadow_->copy(dst, src, bytes); });
  report_ = {};
  report_.kind = "content";
  return {};
}

Status ContentExecutor::run_step(const StepWork& work) {
  ++report_.steps;
  for (const StepSeq& s : work.seqs) {
    const std::string bad =
        shadow_->write(*kv_, s.id, *s.content, s.computed, s.computed + s.new_tokens, work.step);
    if (!bad.empty()) {
      report_.failure =
          fmt::format("request {} sample {}, step {}: {}", s.request, s.sample, work.step, bad);
      return make_error(ErrorCode::kInvalidState, report_.failure);
    }
  }
  if (!work.validate) return {};
  ++report_.checked_steps;
  for (const StepSeq& s : work.seqs) {
    const std::string bad =
        shadow_->check(*kv_, s.id, *s.content, s.computed + s.new_tokens, s.computed);
    if (!bad.empty()) {
      report_.failure = fmt::format("request {} sample {}, step {} (checked after {}): {}",
                                    s.request, s.sample, work.step, work.reason, bad);
      return make_error(ErrorCode::kInvalidState, report_.failure);
    }
    ++report_.checked_seqs;
  }
  return {};
}

Status ContentExecutor::swap_out(SeqId seq, SeqId source, const TokenContent& content,
                                 uint32_t tokens) {
  if (!swap_space_ || !swap_bytes_)
    return make_error(ErrorCode::kInvalidState,
                      fmt::format("swap-out of seq {}: the engine allocated no swap space", seq));
  // What goes to host memory must be the sequence's own tokens: check the rows read for it.
  const std::string bad = shadow_->check(*kv_, source, content, tokens, tokens);
  if (!bad.empty())
    return make_error(ErrorCode::kInvalidState, fmt::format("swap-out of seq {}: {}", seq, bad));
  swapped_[seq] = tokens;
  return {};
}

Status ContentExecutor::swap_in(SeqId seq, const TokenContent& content, uint32_t tokens) {
  const auto it = swapped_.find(seq);
  if (it == swapped_.end() || it->second != tokens)
    return make_error(ErrorCode::kInvalidState,
                      fmt::format("swap-in of seq {} ({} tokens) that was not swapped out with "
                                  "that many",
                                  seq, tokens));
  swapped_.erase(it);
  const std::string bad = shadow_->write(*kv_, seq, content, 0, tokens, report_.steps);
  if (!bad.empty()) return make_error(ErrorCode::kInvalidState, "swap-in: " + bad);
  ++report_.swaps;
  return {};
}

Status ContentExecutor::swap_drop(SeqId seq) {
  if (swapped_.erase(seq) == 0)
    return make_error(ErrorCode::kInvalidState,
                      fmt::format("swap drop of seq {} that was not swapped out", seq));
  return {};
}

void ContentExecutor::end() {
  if (auto* sim = dynamic_cast<SimBackend*>(backend_)) sim->set_copy_observer(nullptr);
  backend_ = nullptr;
  kv_ = nullptr;
}

}  // namespace memsim
