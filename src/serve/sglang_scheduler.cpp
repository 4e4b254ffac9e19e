// sglang: SGLang's PrefillAdder admission, decode-memory check with retraction, new_token_ratio
// and the waiting queue's policies, over memsim's ServeState.
#include "src/serve/sglang_scheduler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

namespace memsim {

// One PrefillAdder's budgets (schedule_policy.py): the tokens offsets are doubles because the
// running requests' reservations are scaled by new_token_ratio.
struct SglangScheduler::Budget {
  double available = 0;     // free + evictable tokens when it started, less locked prefixes
  double total_offset = 0;  // rem_total_token_offset
  double cur_offset = 0;    // cur_rem_token_offset
  int64_t rem_input = 0;
  int64_t rem_chunk = INT64_MAX;  // chunked_prefill_size left (no chunking: unbounded)
  uint32_t page = 1;
  double rem_total() const { return available - total_offset; }
  double cur_rem() const { return available - cur_offset; }
  uint32_t ceil_page(uint32_t t) const { return (t + page - 1) / page * page; }
  void charge(uint32_t extend, uint32_t outputs) {
    const uint32_t in = ceil_page(extend);
    total_offset += double(in) + double(outputs);
    cur_offset += in;
    rem_input -= in;
    if (rem_chunk != INT64_MAX) rem_chunk -= in;
  }
  bool out_of_tokens() const { return rem_total() <= 0 || cur_rem() <= 0; }  // NO_TOKEN
  bool out_of_input() const { return rem_input <= 0 || rem_chunk <= 0; }     // OTHER
};

uint32_t SglangScheduler::reserved_outputs(const Group& G) const {
  return G.outputs >= G.spec.output_tokens
             ? 0
             : std::min<uint32_t>(G.spec.output_tokens - G.outputs, clip_);
}

void SglangScheduler::init(ServeState& state) {
  const SglangOptions& o = state.options().sglang;
  clip_ = o.clip_max_new_tokens;
  // ModelRunner: max_running_requests from the token pool T and the context length:
  // min(max(min(T / context_len x 512, 4096), 2048), T / 2) unless given.
  const uint64_t pool = state.kv().free_token_capacity();
  const uint64_t ctx = std::max<uint32_t>(1, state.options().max_model_len);
  const uint64_t est = std::max<uint64_t>(std::min<uint64_t>(pool * 512 / ctx, 4096), 2048);
  max_running_ = o.max_running_requests ? o.max_running_requests
                                        : static_cast<uint32_t>(std::min(est, pool / 2));
  max_running_ = std::max<uint32_t>(max_running_, 1);
  // NewTokenRatioTracker: init = min(0.7 x conservativeness, 1), min = init x 0.14, decayed
  // linearly over 600 decode steps.
  init_ratio_ = std::min(o.init_new_token_ratio * o.schedule_conservativeness, 1.0);
  min_ratio_ = std::min(init_ratio_ * o.min_new_token_ratio_factor, 1.0);
  decay_ = (init_ratio_ - min_ratio_) / std::max<uint32_t>(1, o.new_token_ratio_decay_steps);
  ratio_ = init_ratio_;
  ready_ = true;
}

void SglangScheduler::schedule(ServeState& state, StepPlan& plan) {
  if (!ready_) init(state);
  if (chunked_ >= 0 && state.group(static_cast<uint32_t>(chunked_)).status != GroupStatus::kRunning)
    chunked_ = -1;  // ended or preempted by the engine
  // A request that left the batch (finished) makes room (filter_batch: batch_is_full = False).
  if (state.running.size() < last_running_) batch_full_ = false;
  if (state.running.empty() && state.waiting.empty()) ratio_ = init_ratio_;  // idle: reset
  if (!prefill(state, plan)) decode(state, plan);
  last_running_ = state.running.size();
}

bool SglangScheduler::continue_chunked(ServeState& state, StepPlan& plan, Budget& b) {
  const auto g = static_cast<uint32_t>(chunked_);
  const Group& G = state.group(g);
  const uint32_t rest = G.schedulable_tokens() - G.computed;
  // add_chunked_req: min(rem_chunk, rem_total) tokens of it.
  const double room = std::min<double>(double(b.rem_chunk), b.rem_total());
  const uint32_t n = room <= 0 ? 0 : static_cast<uint32_t>(std::min<double>(rest, room));
  if (n == 0 || !state.grow_group(g, G.computed + n)) {
    state.refusal = {Refusal::Kind::kMemory, g, G.computed + rest, 1, 0};
    return false;
  }
  const bool last = n == rest;
  plan.groups.push_back({g, n});
  b.charge(n, last ? reserved_outputs(G) : 0);
  if (last) chunked_ = -1;
  return true;
}

void SglangScheduler::order_waiting(ServeState& state) {
  using Policy = SglangOptions::Policy;
  auto& q = state.waiting;
  Policy p = state.options().sglang.policy;
  if ((p == Policy::kLpm || p == Policy::kDfsWeight) && !state.kv().caches_prefixes())
    p = Policy::kFcfs;  // cache-aware policies without a cache
  if (p == Policy::kLpm && q.size() > 128) p = Policy::kFcfs;  // calc_priority's fallback
  if (p == Policy::kFcfs) return;
  std::vector<uint32_t> v(q.begin(), q.end());
  auto prefix_of = [&](uint32_t g) {
    Group& G = state.group(g);
    return state.kv().match_prefix(G.seqs[0].content.slice(0, G.num_tokens()));
  };
  if (p == Policy::kRandom) {
    std::shuffle(v.begin(), v.end(), state.rng());
  } else if (p == Policy::kLof) {
    std::stable_sort(v.begin(), v.end(), [&](uint32_t a, uint32_t b) {
      return state.group(a).spec.output_tokens > state.group(b).spec.output_tokens;
    });
  } else if (p == Policy::kLpm) {
    std::map<uint32_t, uint32_t> hit;
    for (uint32_t g : v) hit[g] = prefix_of(g).tokens;
    std::stable_sort(v.begin(), v.end(), [&](uint32_t a, uint32_t b) { return hit[a] > hit[b]; });
  } else {  // dfs-weight over the tree the waiting requests' matched paths span
    constexpr uint32_t kRootNode = UINT32_MAX;
    std::map<uint32_t, std::vector<uint32_t>> own, children;
    std::map<uint32_t, uint64_t> weight;
    for (uint32_t g : v) {
      const std::vector<uint32_t> path = prefix_of(g).path;
      uint32_t parent = kRootNode;
      ++weight[kRootNode];
      for (uint32_t n : path) {
        auto& c = children[parent];
        if (std::find(c.begin(), c.end(), n) == c.end()) c.push_back(n);
        ++weight[n];
        parent = n;
      }
      own[parent].push_back(g);
    }
    v.clear();
    // _get_dfs_priority: children by descending weight (ties: the older node), then its own.
    auto visit = [&](auto&& self, uint32_t node) -> void {
      std::vector<uint32_t> c = children[node];
      std::sort(c.begin(), c.end(), [&](uint32_t a, uint32_t b) {
        return weight[a] != weight[b] ? weight[a] > weight[b] : a < b;
      });
      for (uint32_t n : c) self(self, n);
      for (uint32_t g : own[node]) v.push_back(g);
    };
    visit(visit, kRootNode);
  }
  q.assign(v.begin(), v.end());  // calc_priority sorts the queue itself
}

bool SglangScheduler::prefill(ServeState& state, StepPlan& plan) {
  const ServeOptions& o = state.options();
  const size_t running = state.running.size() - (chunked_ >= 0 ? 1 : 0);
  if ((batch_full_ || state.waiting.empty()) && chunked_ < 0) return false;
  const int64_t allocatable = int64_t{max_running_} - int64_t(running);
  if (allocatable <= 0 && chunked_ < 0) {
    batch_full_ = true;
    return false;
  }
  Budget b;
  b.page = static_cast<uint32_t>(std::max<uint64_t>(1, state.kv().stats().block_tokens));
  b.available = double(state.kv().free_token_capacity());
  b.rem_input = o.sglang.max_prefill_tokens;
  if (o.chunked_prefill) b.rem_chunk = o.max_num_batched_tokens;
  for (uint32_t g : state.running)
    if (int64_t(g) != chunked_) b.total_offset += reserved_outputs(state.group(g)) * ratio_;
  if (chunked_ >= 0 && !continue_chunked(state, plan, b)) return !plan.groups.empty();
  order_waiting(state);
  int64_t admitted = 0;
  while (!state.waiting.empty()) {
    if (admitted >= allocatable) {
      batch_full_ = true;
      break;
    }
    const uint32_t g = state.waiting.front();
    Group& G = state.group(g);
    const uint32_t known = G.num_tokens();
    const KvCacheManager::PrefixMatch m =
        state.kv().match_prefix(G.seqs[0].content.slice(0, known));
    const uint32_t extend = known - m.tokens;
    const uint32_t total = extend + reserved_outputs(G);
    if (double(total) >= b.rem_total() - double(m.evictable_tokens)) {  // add_one_req: NO_TOKEN
      state.refusal = {Refusal::Kind::kMemory, g, known + reserved_outputs(G), 1, 0};
      batch_full_ = true;
      break;
    }
    if (int64_t(extend) >= b.rem_input && admitted > 0) break;  // OTHER
    uint32_t n = extend;
    const bool chunk = b.rem_chunk != INT64_MAX && int64_t(b.ceil_page(extend)) > b.rem_chunk;
    if (chunk) {
      n = static_cast<uint32_t>(b.rem_chunk / b.page * b.page);
      if (n == 0) break;  // OTHER
    }
    uint32_t got = 0;
    if (state.admit(g, n, &got) != AdmitResult::kAdmitted) break;
    state.waiting.pop_front();
    G.status = GroupStatus::kRunning;
    state.running.push_back(g);
    state.running_seqs += G.live();
    plan.groups.push_back({g, got});
    ++admitted;
    b.available -= double(m.evictable_tokens);  // its prefix is locked now
    b.charge(got, chunk ? 0 : reserved_outputs(G));
    if (chunk) {
      chunked_ = g;
      break;  // one chunked request at a time
    }
    if (b.out_of_tokens()) {
      batch_full_ = true;
      break;
    }
    if (b.out_of_input()) break;
  }
  return !plan.groups.empty();
}

bool SglangScheduler::decode_fits(ServeState& state, const std::vector<uint32_t>& batch) const {
  // check_decode_mem: a new page for each request whose next token starts one.
  const uint64_t page = std::max<uint64_t>(1, state.kv().stats().block_tokens);
  uint64_t pages = 0;
  for (uint32_t g : batch) pages += state.group(g).computed % page == 0;
  return state.kv().free_token_capacity() >= pages * page;
}

void SglangScheduler::collect_batch(const ServeState& state) {
  batch_.clear();
  for (uint32_t g : state.running)
    if (int64_t(g) != chunked_) batch_.push_back(g);
}

void SglangScheduler::decode(ServeState& state, StepPlan& plan) {
  collect_batch(state);
  if (batch_.empty()) return;
  if (!decode_fits(state, batch_)) {
    // retract_decode: sorted by (outputs, -input) descending; victims popped from the end.
    order_ = batch_;
    std::stable_sort(order_.begin(), order_.end(), [&](uint32_t a, uint32_t b) {
      const Group &A = state.group(a), &B = state.group(b);
      if (A.outputs != B.outputs) return A.outputs > B.outputs;
      return A.spec.prompt_tokens < B.spec.prompt_tokens;
    });
    do {
      if (order_.size() == 1) break;
      state.retract(order_.back());
      order_.pop_back();
    } while (!decode_fits(state, order_));
    double outputs = 0, max_new = 0;
    for (uint32_t g : order_) {
      outputs += state.group(g).outputs;
      max_new += state.group(g).spec.output_tokens;
    }
    const double steps = state.options().sglang.retract_decode_steps;
    ratio_ = std::min(1.0, (outputs + steps * double(order_.size())) / (max_new + 1));
    batch_full_ = false;
    collect_batch(state);  // those left, in the running queue's order
  } else {
    ratio_ = std::max(ratio_ - decay_, min_ratio_);
  }
  for (uint32_t g : batch_) {
    Group& G = state.group(g);
    if (!state.grow_group(g, G.computed + 1)) {  // the check held every page: not expected
      state.retract(g);
      continue;
    }
    plan.groups.push_back({g, 1});
  }
}

}  // namespace memsim
