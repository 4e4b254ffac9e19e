// Runtime state of a serving run shared by the engine and its scheduler: request groups, their
// sequences, the waiting / running / swapped queues, and the KV operations with their
// out-of-memory handling (preempt by recompute or swap, truncate).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "src/kv/kv_cache_manager.h"
#include "workload/requests.h"

namespace memsim {

// What a preempted request gives up: all its KV (recomputed when it is admitted again), all of
// it to host memory (swapped back), or only its earliest blocks (the OrinMLLM seed's strategy 3,
// 10.4: enough of them for the allocation that failed; recomputed as prefill work in the step
// that admits it again, its later blocks kept on the GPU).
enum class Preemption : uint8_t { kRecompute, kSwap, kFreeFront };
// Which running request gives its KV back when memory runs out.
enum class Victim : uint8_t {
  kLastArrived,    // vLLM: the last request of the running queue (FCFS)
  kFewestDecoded,  // SGLang retract_decode: fewest output tokens, then longest prompt
  // OrinMLLM's sequence eviction (seed §10.4 strategy 2: "the longest / oldest sequence"):
  kLongest,  // the most tokens (prompt + output), the later arrival on a tie
  kOldest,   // the earliest arrival still running
};

enum class AdmitResult : uint8_t { kAdmitted, kNoBudget, kNoMemory };

enum class GroupStatus : uint8_t { kPending, kWaiting, kRunning, kSwapped, kFinished };

// One sequence of a request: the prompt plus one sample's (or beam's) output tokens.
struct Sequence {
  SeqId id = 0;
  TokenContent content;    // every token it will hold (prompt + its full output stream)
  uint32_t kv_tokens = 0;  // tokens its KV holds (may run ahead of what the manager was told)
  uint32_t synced = 0;     // tokens the KV manager was last told (grow)
  uint32_t capacity = 0;   // tokens it can hold without an allocation (KvCacheManager)
  int32_t fork_from = -1;  // beam replaced: re-fork from this sibling (index in the group)
};

// One request: its sequences advance in lockstep (prefill once, then forked samples or beams).
struct Group {
  RequestSpec spec;
  GroupStatus status = GroupStatus::kPending;
  std::vector<Sequence> seqs;  // seqs[0] is the prefill sequence
  uint32_t width = 1;          // n or beam_width: sequences after the prefill
  uint32_t computed = 0;       // tokens whose KV is computed (every live sequence)
  uint32_t outputs = 0;        // tokens sampled so far per sequence
  // Tokens that steps still in flight will sample (vLLM's num_output_placeholders): under
  // async scheduling a step is scheduled before the previous one's output arrives, its
  // `computed` counts the in-flight tokens, and these stand for the tokens not yet sampled.
  uint32_t placeholders = 0;
  uint32_t prefix_hit = 0;  // tokens served from the prefix cache at the last admission
  // Leading tokens whose KV preemption by free_front released: the step that admits the group
  // again recomputes them (ScheduledGroup::recompute) before its own tokens.
  uint32_t front_freed = 0;
  uint32_t preemptions = 0;
  uint64_t swapped_bytes = 0;  // device bytes held in the host swap space (when swapped)
  bool truncated = false;      // generation cut short by KV exhaustion (single_sequence)
  bool rejected = false;       // never fit the KV pool
  bool recorded = false;       // its figures are taken (Engine::finish): the window may drop it
  bool counted_prefix = false;
  SimTime first_token = -1;
  SimTime finished = -1;

  uint32_t num_tokens() const { return spec.prompt_tokens + outputs; }  // known tokens
  // Tokens a step may compute up to: the known ones and the placeholders (vLLM's
  // num_tokens_with_spec + num_output_placeholders, without speculative tokens).
  uint32_t schedulable_tokens() const { return num_tokens() + placeholders; }
  uint32_t live() const { return static_cast<uint32_t>(seqs.size()); }
};

// Why the scheduler last failed to place a group, for the engine to name when nothing can run
// (numbers only: admission is refused every step while a request waits for memory).
struct Refusal {
  enum class Kind : uint8_t {
    kNone,
    kBudget,   // admit: the first chunk exceeds the token budget and chunked prefill is off
    kStep,     // a multi-sequence group's lockstep step exceeds the token budget
    kMemory,   // admit: no KV for the cached prefix plus the first chunk
    kSwapIn,   // swap_in: no KV for the swapped tokens plus the step's new ones
    kPreempt,  // a running group could not grow and was its own victim (preempted)
  };
  Kind kind = Kind::kNone;
  uint32_t group = 0;
  uint32_t tokens = 0;  // kBudget, kStep: new tokens per sequence; else KV tokens per sequence
  uint32_t seqs = 1;    // sequences that needed them
  uint32_t budget = 0;  // the token budget left (kBudget, kStep)
};

// Why a request could not be placed, in words: its tokens or KV against the token budget
// (`max_num_batched_tokens`) or the pool (`capacity_tokens`, blocks of `block_tokens`).
std::string describe_refusal(const Refusal& why, uint32_t max_num_batched_tokens,
                             uint64_t block_tokens, uint64_t capacity_tokens);

// The groups of a run by request index, built as requests arrive. Recorded groups at the front
// (finished, their figures taken) are dropped when the next group is added, so a run holds the
// groups from the oldest one still in flight on, not one per request of the workload. Indices stay
// those of the requests.
class GroupWindow {
 public:
  Group& operator[](uint32_t g) { return groups_[g - base_]; }
  const Group& operator[](uint32_t g) const { return groups_[g - base_]; }
  // The first group still held and one past the last added (the next request's index).
  uint32_t begin_index() const { return base_ + static_cast<uint32_t>(head_); }
  uint32_t end_index() const { return base_ + static_cast<uint32_t>(groups_.size()); }
  // Appends the group of request end_index() (references to groups may move).
  Group& add();

 private:
  std::vector<Group> groups_;
  uint32_t base_ = 0;  // request index of groups_[0]
  size_t head_ = 0;    // groups_[0, head_) are finished, to be erased in one go
};

// SGLang's scheduling knobs (python/sglang/srt/server_args.py and environ.py defaults), read by
// the sglang scheduler (src/serve/sglang_scheduler.h).
struct SglangOptions {
  enum class Policy : uint8_t { kFcfs, kLpm, kDfsWeight, kLof, kRandom };
  Policy policy = Policy::kFcfs;               // --schedule-policy
  uint32_t max_running_requests = 0;           // 0: SGLang's rule from the token pool's size
  uint32_t max_prefill_tokens = 16384;         // --max-prefill-tokens
  double schedule_conservativeness = 1.0;      // --schedule-conservativeness
  double init_new_token_ratio = 0.7;           // SGLANG_INIT_NEW_TOKEN_RATIO
  double min_new_token_ratio_factor = 0.14;    // SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
  uint32_t new_token_ratio_decay_steps = 600;  // SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
  uint32_t retract_decode_steps = 20;          // SGLANG_RETRACT_DECODE_STEPS
  uint32_t clip_max_new_tokens = 4096;         // SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
};

struct ServeOptions {
  uint32_t max_num_seqs = 256;
  uint32_t max_num_batched_tokens = 8192;
  uint32_t max_model_len = 8192;
  bool chunked_prefill = true;
  Preemption preemption = Preemption::kRecompute;
  Victim victim = Victim::kLastArrived;
  uint64_t swap_space = 4ull << 30;  // host bytes for swapped KV (vLLM V0 swap_space 4 GiB)
  double beam_fork_prob = 0.1;       // per beam per step: replaced by a fork of a sibling
  // vLLM V1's AsyncScheduler: the next step is scheduled while the previous one runs (two
  // steps in flight, output placeholders); see src/serve/engine_batch_queue.cpp.
  bool async_scheduling = false;
  uint64_t seed = 1;
  SglangOptions sglang;  // the sglang scheduler's own
};

struct ServeCounters {
  uint64_t preemptions = 0;
  uint64_t recomputes = 0;
  uint64_t swap_outs = 0;
  uint64_t swap_ins = 0;
  uint64_t swapped_bytes = 0;  // total bytes moved out (and back in)
  uint64_t oom_events = 0;     // KV allocations of running requests that failed (each led to
                               // a preemption or truncation); waiting for memory is not one
  uint64_t truncations = 0;
  uint64_t prefix_query_tokens = 0;
  uint64_t prefix_hit_tokens = 0;
  uint64_t rejected = 0;  // requests whose KV can never fit the pool
  uint64_t restarts = 0;  // multi-sequence groups restarted from scratch (no swap space)
  // Preemption by free_front: requests that gave up their earliest blocks, and the tokens of KV
  // those held, all recomputed as prefill work when the requests were admitted again.
  uint64_t front_frees = 0;
  uint64_t front_freed_tokens = 0;
};

// The scheduler's view of the run. KV growth goes through grow_group(), which keeps the KV
// manager exact at block boundaries and lazy inside a block (sync() catches it up).
class ServeState {
 public:
  ServeState(KvCacheManager& kv, const ServeOptions& options, GroupWindow& groups)
      : kv_(kv), options_(options), groups_(groups), rng_(options.seed) {}

  KvCacheManager& kv() { return kv_; }
  const ServeOptions& options() const { return options_; }
  GroupWindow& groups() { return groups_; }
  Group& group(uint32_t g) { return groups_[g]; }
  ServeCounters& counters() { return counters_; }
  std::mt19937_64& rng() { return rng_; }

  std::deque<uint32_t> waiting;
  std::vector<uint32_t> running;  // in scheduling order
  std::deque<uint32_t> swapped;
  uint32_t running_seqs = 0;           // sequences of running groups
  uint64_t swap_used = 0;              // host swap bytes in use
  uint64_t step_swap_bytes = 0;        // PCIe bytes moved by this step (swap out + in)
  std::vector<uint32_t> finished_now;  // ended by the scheduler (truncated / rejected)
  Refusal refusal;                     // the last placement that failed (reset by the engine)
  // "request R (group g): why" for the first kKeptRejections rejected groups (counters count all:
  // a trace of millions of requests over max_model_len keeps its memory).
  static constexpr size_t kKeptRejections = 100;
  std::vector<std::string> rejections;
  // Optional (step executors): called for every sequence of a group before its KV is released
  // to the host swap space (kOut: reads `source`'s rows; a sample not yet forked reads its
  // parent's), after it regrew at swap-in (kIn), or when a swapped group is dropped without
  // coming back (kDrop), with the tokens whose KV moves. The first failure is kept in
  // hook_error; the engine stops the run with it.
  enum class SwapEvent : uint8_t { kOut, kIn, kDrop };
  std::function<Status(const Sequence& s, SeqId source, uint32_t tokens, SwapEvent e)> swap_hook;
  Status hook_error;
  // Drops swapped group g (its KV can never come back): frees its swap space, rejects it.
  void drop_swapped(uint32_t g, const std::string& why);

  // Makes every sequence of g hold `tokens` tokens (forking pending samples/beams first).
  // All-or-nothing per call is not required; false = out of KV memory (counted).
  bool grow_group(uint32_t g, uint32_t tokens);
  // Admission (or re-admission after recompute) of a waiting group: prefix-cache lookup, then
  // KV for the cached prefix plus the first prefill chunk (at most token_budget tokens, or the
  // whole rest without chunked prefill). Sets *new_tokens to the chunk on success; a refusal is
  // recorded in `refusal`.
  AdmitResult admit(uint32_t g, uint32_t token_budget, uint32_t* new_tokens);
  // Tokens the group's next step would compute if unlimited (prefill rest or 1 per sequence).
  uint32_t pending_tokens(const Group& g) const;
  // Tokens per sequence group g computes in its next step under `budget` tokens (vLLM V1
  // Scheduler.schedule(): min(num_new_tokens, token_budget) for every request, a prefill chunk,
  // a decode, or the recompute of a request resumed after preemption alike). A group of several
  // sequences (samples, beams) steps them together unsplit (vLLM V0 _get_num_new_tokens: more
  // than one sequence means a decode, never chunked): 0 when that exceeds the budget.
  uint32_t step_tokens(const Group& g, uint32_t budget) const;
  // Preempts running group g (removing it from `running`): recompute, swap or free_front per
  // the options. free_front releases the group's earliest blocks, enough for the allocation
  // that failed last (at most max_num_batched_tokens - 1 tokens and only tokens computed, so
  // their recompute and one more token fit a step), and queues it first among the waiting; a
  // group of several sequences, or one whose blocks could not free anything, is preempted by
  // recompute instead.
  void preempt(uint32_t g);
  // SGLang's retraction of running group g (ScheduleBatch.retract_decode): its KV is released
  // with only its prompt's tokens cached (release_req: cache_finished_req without inserting
  // what it decoded), and it goes to the back of the waiting queue to recompute.
  void retract(uint32_t g);
  // Picks the victim among the running groups per options().victim; its index in running.
  size_t pick_victim() const;
  // Swaps a swapped group back in with room for the `new_tokens` per sequence that the step
  // swapping it in computes (step_tokens()); false (and a refusal) when that does not fit now.
  bool swap_in(uint32_t g, uint32_t new_tokens);
  // Releases all KV of g (finished), caching its prefix where the strategy does.
  void release_group(uint32_t g);
  // Ends g now with what it generated (KV exhausted: single_sequence), or rejects a waiting g
  // that can never run, saying why in `rejections`. Both release its KV and queue it in
  // finished_now.
  void truncate(uint32_t g);
  void reject(uint32_t g, const std::string& why);
  // Tells the KV manager every lazily grown token of the running groups.
  void sync_all();
  void sync(Sequence& s);

 private:
  bool grow_seq(Sequence& s, uint32_t tokens, uint32_t prefix, bool count_oom = true);
  bool free_front(uint32_t g);
  // A request preempted by free_front keeps the rest of its KV while it waits. When nothing runs
  // and waiting group g cannot get its KV, the last such request in the queue besides g gives
  // up the rest too (it becomes a preemption by recompute); false when none holds any.
  bool reclaim_waiting(uint32_t g);
  // admit() for a group whose front free_front released: the restored blocks and a chunk.
  AdmitResult admit_front_freed(uint32_t g, uint32_t token_budget, uint32_t* new_tokens);
  void run_swap_hook(const Sequence& s, SeqId source, uint32_t tokens, SwapEvent e);
  void release_seqs(Group& g, uint32_t cached_tokens = UINT32_MAX);
  // Preemption's and retraction's first part: g leaves `running`, counted, its content public.
  void take_out_of_running(uint32_t g);

  KvCacheManager& kv_;
  ServeOptions options_;
  GroupWindow& groups_;
  ServeCounters counters_;
  std::mt19937_64 rng_;
  uint64_t last_short_ = 0;  // bytes the last failed KV allocation was short
};

}  // namespace memsim
