// ServeState: KV growth with deferred in-block updates, admission with prefix lookup,
// preemption (recompute or swap) and victim choice, swap-in, release.
#include "src/serve/serve_state.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace memsim {
namespace {

// A KV call that the engine's bookkeeping guarantees is valid failed: a bug, not an outcome.
[[noreturn]] void kv_bug(const char* what, const Error& e) {
  throw std::logic_error(fmt::format("KV manager rejected {}: {}", what, e.message));
}

}  // namespace

Group& GroupWindow::add() {
  // A group finished by the scheduler (rejected, truncated) waits in finished_now until the
  // engine records it, possibly past later arrivals: only recorded groups may go.
  while (head_ < groups_.size() && groups_[head_].recorded) ++head_;
  // Erase the finished front once it is half the window (each group moves O(1) times).
  if (head_ >= 1024 && 2 * head_ >= groups_.size()) {
    groups_.erase(groups_.begin(), groups_.begin() + static_cast<ptrdiff_t>(head_));
    base_ += static_cast<uint32_t>(head_);
    head_ = 0;
  }
  return groups_.emplace_back();
}

void ServeState::sync(Sequence& s) {
  if (s.kv_tokens <= s.synced) return;
  const Status st = kv_.grow(s.id, s.content, s.kv_tokens, 0);
  if (!st.ok()) kv_bug("a grow within capacity", st.error());
  s.synced = s.kv_tokens;
}

void ServeState::sync_all() {
  for (uint32_t g : running)
    for (Sequence& s : groups_[g].seqs)
      if (s.fork_from < 0) sync(s);
}

bool ServeState::grow_seq(Sequence& s, uint32_t tokens, uint32_t prefix, bool count_oom) {
  if (tokens <= s.kv_tokens) return true;
  if (tokens <= s.capacity) {
    s.kv_tokens = tokens;
    return true;
  }
  const Status st = kv_.grow(s.id, s.content, tokens, prefix);
  if (!st.ok()) {
    if (st.error().code != ErrorCode::kOutOfMemory) kv_bug("a grow", st.error());
    if (count_oom) ++counters_.oom_events;
    last_short_ = st.error().bytes_short;
    return false;
  }
  s.kv_tokens = s.synced = tokens;
  s.capacity = kv_.seq_capacity(s.id);
  return true;
}

bool ServeState::grow_group(uint32_t g, uint32_t tokens) {
  Group& G = groups_[g];
  for (Sequence& s : G.seqs) {
    if (s.fork_from < 0) continue;
    Sequence& parent = G.seqs[s.fork_from];
    sync(parent);
    const Status st = kv_.fork(parent.id, s.id);
    if (!st.ok()) {
      if (st.error().code != ErrorCode::kOutOfMemory) kv_bug("a fork", st.error());
      ++counters_.oom_events;
      last_short_ = st.error().bytes_short;
      return false;
    }
    s.kv_tokens = s.synced = parent.synced;
    s.capacity = kv_.seq_capacity(s.id);
    parent.capacity = kv_.seq_capacity(parent.id);  // its last block may be shared now
    s.fork_from = -1;
  }
  for (Sequence& s : G.seqs)
    if (!grow_seq(s, tokens, 0)) return false;
  return true;
}

uint32_t ServeState::pending_tokens(const Group& g) const {
  return (g.schedulable_tokens() - g.computed) * g.live();
}

uint32_t ServeState::step_tokens(const Group& g, uint32_t budget) const {
  const uint32_t rest = g.schedulable_tokens() - g.computed;
  if (g.live() == 1) return std::min(rest, budget);
  return uint64_t{rest} * g.live() <= budget ? rest : 0;
}

AdmitResult ServeState::admit(uint32_t g, uint32_t token_budget, uint32_t* new_tokens) {
  Group& G = groups_[g];
  if (G.front_freed) return admit_front_freed(g, token_budget, new_tokens);
  Sequence& s = G.seqs[0];
  const uint32_t known = G.num_tokens();
  const uint32_t prefix = kv_.lookup_prefix(s.content.slice(0, known));
  uint32_t chunk = known - prefix;
  if (chunk > token_budget) {
    if (!options_.chunked_prefill) {
      refusal = {Refusal::Kind::kBudget, g, chunk, 1, token_budget};
      return AdmitResult::kNoBudget;
    }
    chunk = token_budget;
  }
  // lookup_prefix leaves the last token uncached (the KV manager contract), so a request always
  // computes at least one token; only a budget of 0 leaves nothing to admit.
  if (chunk == 0) return AdmitResult::kNoBudget;
  // A request waiting for memory is not an out-of-memory event (it is retried every step).
  while (!grow_seq(s, prefix + chunk, prefix, false)) {
    if (!reclaim_waiting(g)) {
      refusal = {Refusal::Kind::kMemory, g, prefix + chunk, 1, token_budget};
      return AdmitResult::kNoMemory;
    }
  }
  G.computed = prefix;
  G.prefix_hit = prefix;
  counters_.prefix_query_tokens += known;
  counters_.prefix_hit_tokens += prefix;
  *new_tokens = chunk;
  return AdmitResult::kAdmitted;
}

AdmitResult ServeState::admit_front_freed(uint32_t g, uint32_t token_budget, uint32_t* new_tokens) {
  Group& G = groups_[g];
  Sequence& s = G.seqs[0];
  // The step recomputes the freed front (prefill of tokens [0, front_freed)), then goes on
  // from where the group stopped, within what the budget leaves.
  const uint32_t rest = G.schedulable_tokens() - G.computed;
  const uint32_t chunk =
      token_budget > G.front_freed ? std::min(rest, token_budget - G.front_freed) : 0;
  if (chunk == 0 || (chunk < rest && !options_.chunked_prefill)) {
    refusal = {Refusal::Kind::kBudget, g, G.front_freed + rest, 1, token_budget};
    return AdmitResult::kNoBudget;
  }
  // Straight to the KV manager: the sequence may already hold room for the new tokens (grown
  // for the step it was preempted from), but not its front.
  const uint32_t target = std::max(G.computed + chunk, s.synced);
  for (Status st = kv_.grow(s.id, s.content, target, 0); !st.ok();
       st = kv_.grow(s.id, s.content, target, 0)) {
    if (st.error().code != ErrorCode::kOutOfMemory) kv_bug("a grow", st.error());
    if (!reclaim_waiting(g)) {
      refusal = {Refusal::Kind::kMemory, g, target, 1, token_budget};
      return AdmitResult::kNoMemory;
    }
  }
  s.kv_tokens = s.synced = target;
  s.capacity = kv_.seq_capacity(s.id);
  *new_tokens = chunk;
  return AdmitResult::kAdmitted;
}

bool ServeState::reclaim_waiting(uint32_t g) {
  if (!running.empty()) return false;  // running requests will free memory as they finish
  for (auto it = waiting.rbegin(); it != waiting.rend(); ++it) {
    Group& W = groups_[*it];
    if (*it == g || W.front_freed == 0) continue;
    release_seqs(W);
    W.computed = W.front_freed = 0;
    ++counters_.recomputes;
    return true;
  }
  return false;
}

bool ServeState::free_front(uint32_t g) {
  Group& G = groups_[g];
  if (G.live() != 1 || G.seqs[0].fork_from >= 0 || !kv_.frees_front()) return false;
  Sequence& s = G.seqs[0];
  sync(s);
  const uint32_t most = std::min(options_.max_num_batched_tokens - 1, G.computed);
  const uint32_t gap = kv_.release_front(s.id, std::max<uint64_t>(last_short_, 1), most);
  if (gap == 0) return false;
  take_out_of_running(g);
  G.front_freed = gap;
  s.capacity = 0;  // its next grow restores the front
  ++counters_.front_frees;
  counters_.front_freed_tokens += gap;
  G.status = GroupStatus::kWaiting;
  waiting.push_front(g);
  return true;
}

size_t ServeState::pick_victim() const {
  if (options_.victim == Victim::kLastArrived) return running.size() - 1;
  if (options_.victim == Victim::kLongest || options_.victim == Victim::kOldest) {
    // Requests arrive in group order: the smallest group index is the oldest.
    size_t best = 0;
    for (size_t i = 1; i < running.size(); ++i) {
      const Group &a = groups_[running[i]], &b = groups_[running[best]];
      const bool better =
          options_.victim == Victim::kOldest
              ? running[i] < running[best]
              : a.num_tokens() > b.num_tokens() ||
                    (a.num_tokens() == b.num_tokens() && running[i] > running[best]);
      if (better) best = i;
    }
    return best;
  }
  size_t best = running.size() - 1;
  for (size_t i = running.size(); i-- > 0;) {
    const Group& a = groups_[running[i]];
    const Group& b = groups_[running[best]];
    if (a.outputs < b.outputs ||
        (a.outputs == b.outputs && a.spec.prompt_tokens > b.spec.prompt_tokens))
      best = i;
  }
  return best;
}

void ServeState::release_seqs(Group& G, uint32_t cached_tokens) {
  for (Sequence& s : G.seqs) {
    if (s.fork_from < 0) {
      sync(s);
      // Only [0, computed) holds KV: a preempted group may have grown for a step that never ran.
      kv_.release(s.id, s.content.slice(0, std::min(G.computed, cached_tokens)));
    }
    s.kv_tokens = s.synced = s.capacity = 0;
  }
}

void ServeState::take_out_of_running(uint32_t g) {
  Group& G = groups_[g];
  running.erase(std::find(running.begin(), running.end(), g));
  running_seqs -= G.live();
  ++G.preemptions;
  ++counters_.preemptions;
  // Its KV will be looked up (recompute) or recomputed beside cached copies (swap-in): its
  // content is no longer private.
  for (Sequence& s : G.seqs) {
    s.content.set_private_from(TokenContent::kShared);
    if (s.fork_from < 0) kv_.publish(s.id, s.content);
  }
}

void ServeState::preempt(uint32_t g) {
  if (options_.preemption == Preemption::kFreeFront && free_front(g)) return;
  Group& G = groups_[g];
  take_out_of_running(g);
  // vLLM V0 swaps a multi-sequence group whatever the mode: recomputing would lose its samples.
  if (options_.preemption == Preemption::kSwap || G.live() > 1) {
    uint64_t bytes = 0;
    for (Sequence& s : G.seqs)
      if (s.fork_from < 0) bytes += kv_.seq_bytes(s.id);
    if (swap_used + bytes <= options_.swap_space) {
      for (Sequence& s : G.seqs)
        run_swap_hook(s, s.fork_from >= 0 ? G.seqs[s.fork_from].id : s.id, G.computed,
                      SwapEvent::kOut);
      release_seqs(G);
      for (Sequence& s : G.seqs) s.fork_from = -1;
      swap_used += bytes;
      G.swapped_bytes = bytes;
      step_swap_bytes += bytes;
      ++counters_.swap_outs;
      counters_.swapped_bytes += bytes;
      G.status = GroupStatus::kSwapped;
      swapped.push_back(g);
      return;
    }
  }
  release_seqs(G);
  G.computed = 0;
  if (G.live() > 1) {  // no swap space for its samples: start the request over
    G.outputs = 0;
    G.seqs.resize(1);
    ++counters_.restarts;
  }
  G.seqs[0].fork_from = -1;
  ++counters_.recomputes;
  G.status = GroupStatus::kWaiting;
  waiting.push_front(g);
}

void ServeState::retract(uint32_t g) {
  Group& G = groups_[g];
  take_out_of_running(g);
  ++counters_.recomputes;
  release_seqs(G, G.spec.prompt_tokens);
  G.computed = 0;
  G.status = GroupStatus::kWaiting;
  waiting.push_back(g);
}

bool ServeState::swap_in(uint32_t g, uint32_t new_tokens) {
  Group& G = groups_[g];
  // The swapped-in KV ([0, computed)) plus room for the tokens the group computes in this very
  // step (the scheduler schedules it at once): vLLM V0 swaps the blocks in, then appends slots.
  const uint32_t tokens = G.computed + new_tokens;
  for (size_t i = 0; i < G.seqs.size(); ++i) {
    if (!grow_seq(G.seqs[i], tokens, 0, false)) {
      refusal = {Refusal::Kind::kSwapIn, g, tokens, G.live(), 0};
      for (size_t j = 0; j < i; ++j) {
        // Nothing was swapped back into the KV it grew: it holds no tokens to cache.
        kv_.release(G.seqs[j].id, G.seqs[j].content.slice(0, 0));
        G.seqs[j].kv_tokens = G.seqs[j].synced = G.seqs[j].capacity = 0;
      }
      return false;
    }
  }
  for (Sequence& s : G.seqs) run_swap_hook(s, s.id, G.computed, SwapEvent::kIn);
  swap_used -= G.swapped_bytes;
  step_swap_bytes += G.swapped_bytes;
  counters_.swapped_bytes += G.swapped_bytes;
  G.swapped_bytes = 0;
  ++counters_.swap_ins;
  G.status = GroupStatus::kRunning;
  running.push_back(g);
  running_seqs += G.live();
  return true;
}

void ServeState::run_swap_hook(const Sequence& s, SeqId source, uint32_t tokens, SwapEvent e) {
  if (!swap_hook || !hook_error.ok()) return;
  if (Status st = swap_hook(s, source, tokens, e); !st.ok()) hook_error = st;
}

void ServeState::drop_swapped(uint32_t g, const std::string& why) {
  Group& G = groups_[g];
  swapped.erase(std::find(swapped.begin(), swapped.end(), g));
  for (Sequence& s : G.seqs) run_swap_hook(s, s.id, G.computed, SwapEvent::kDrop);
  swap_used -= G.swapped_bytes;
  G.swapped_bytes = 0;
  reject(g, why);
}

void ServeState::release_group(uint32_t g) {
  release_seqs(groups_[g]);
}

void ServeState::truncate(uint32_t g) {
  Group& G = groups_[g];
  if (auto it = std::find(running.begin(), running.end(), g); it != running.end()) {
    running.erase(it);
    running_seqs -= G.live();
  } else if (auto w = std::find(waiting.begin(), waiting.end(), g); w != waiting.end()) {
    waiting.erase(w);
  }
  release_seqs(G);
  G.truncated = true;
  G.status = GroupStatus::kFinished;
  ++counters_.truncations;
  finished_now.push_back(g);
}

void ServeState::reject(uint32_t g, const std::string& why) {
  Group& G = groups_[g];
  if (rejections.size() < kKeptRejections)
    rejections.push_back(fmt::format("request {} (group {}): {}", G.spec.id, g, why));
  if (auto w = std::find(waiting.begin(), waiting.end(), g); w != waiting.end()) waiting.erase(w);
  release_seqs(G);
  G.rejected = true;
  G.status = GroupStatus::kFinished;
  ++counters_.rejected;
  finished_now.push_back(g);
}

std::string describe_refusal(const Refusal& why, uint32_t max_num_batched_tokens,
                             uint64_t block_tokens, uint64_t capacity_tokens) {
  const char* each = why.seqs > 1 ? " per sequence" : "";
  switch (why.kind) {
    case Refusal::Kind::kNone:
      break;
    case Refusal::Kind::kBudget:
      return fmt::format(
          "needs {} tokens in one step with chunked prefill off; the token budget "
          "is {} (max_num_batched_tokens {})",
          why.tokens, why.budget, max_num_batched_tokens);
    case Refusal::Kind::kStep:
      return fmt::format(
          "steps its {} sequences together ({} x {} tokens); the token budget is {} "
          "(max_num_batched_tokens {})",
          why.seqs, why.seqs, why.tokens, why.budget, max_num_batched_tokens);
    case Refusal::Kind::kMemory:
    case Refusal::Kind::kSwapIn:
    case Refusal::Kind::kPreempt: {
      // Blocks (slots, pages) of the pool's unit; the pool's own count leaves out reserved ones
      // (vLLM's null block) as kv_capacity_tokens does.
      const uint64_t unit = std::max<uint64_t>(1, block_tokens);
      return fmt::format(
          "needs KV for {} tokens{} ({} blocks of {}{}); the pool holds {} tokens "
          "({} blocks)",
          why.tokens, each, (why.tokens + unit - 1) / unit, unit, each, capacity_tokens,
          capacity_tokens / unit);
    }
  }
  return "the scheduler gave no reason";
}

}  // namespace memsim
