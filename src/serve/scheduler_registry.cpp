// The scheduler registry: one line per implementation, and the parser of their options.
#include "src/serve/scheduler_registry.h"

#include "src/serve/continuous_batching.h"
#include "src/serve/sglang_scheduler.h"
#include "src/serve/single_sequence.h"
#include "src/serve/static_batch.h"

namespace memsim {
namespace {

// Every ServeOptions key a scheduler may accept (the entry's keys were checked).
ServeOptions parse_serve_options(const ConfigNode& node, ServeOptions o) {
  if (auto v = node.find("max_num_seqs"))
    o.max_num_seqs = static_cast<uint32_t>(v->as_uint_in(1, 1u << 20));
  if (auto v = node.find("max_num_batched_tokens"))
    o.max_num_batched_tokens = static_cast<uint32_t>(v->as_uint_in(1, 1u << 24));
  if (auto v = node.find("chunked_prefill")) o.chunked_prefill = v->as_bool();
  if (auto v = node.find("preemption")) {
    const std::string c = v->as_choice({"recompute", "swap", "free_front"});
    o.preemption = c == "swap"         ? Preemption::kSwap
                   : c == "free_front" ? Preemption::kFreeFront
                                       : Preemption::kRecompute;
  }
  if (auto v = node.find("victim")) {
    const std::string c = v->as_choice({"last_arrived", "fewest_decoded", "longest", "oldest"});
    o.victim = c == "fewest_decoded" ? Victim::kFewestDecoded
               : c == "longest"      ? Victim::kLongest
               : c == "oldest"       ? Victim::kOldest
                                     : Victim::kLastArrived;
  }
  if (auto v = node.find("swap_space")) o.swap_space = v->as_bytes();
  if (auto v = node.find("beam_fork_prob")) o.beam_fork_prob = v->as_double_in(0, 1);
  if (auto v = node.find("async_scheduling")) o.async_scheduling = v->as_bool();
  return o;
}

// A batch runs to its end: a request preempted by free_front would come back only in the next
// batch, which starts every request over, so that mode is refused.
ServeOptions parse_static_batch(const ConfigNode& node, ServeOptions o) {
  o = parse_serve_options(node, o);
  if (o.preemption == Preemption::kFreeFront)
    node["preemption"].fail(
        "static_batch restarts a preempted request in the next batch; free_front (its earliest "
        "blocks recomputed, the rest kept) needs continuous_batching");
  return o;
}

// One sequence at a time, whatever the experiment's max_num_seqs.
ServeOptions parse_single_sequence(const ConfigNode& node, ServeOptions o) {
  o = parse_serve_options(node, o);
  o.max_num_seqs = 1;
  return o;
}

// SGLang's server arguments and environment knobs, under their own names.
ServeOptions parse_sglang(const ConfigNode& node, ServeOptions o) {
  SglangOptions& s = o.sglang;
  if (auto v = node.find("schedule_policy")) {
    const std::string p = v->as_choice({"fcfs", "lpm", "dfs-weight", "lof", "random"});
    using P = SglangOptions::Policy;
    s.policy = p == "lpm"          ? P::kLpm
               : p == "dfs-weight" ? P::kDfsWeight
               : p == "lof"        ? P::kLof
               : p == "random"     ? P::kRandom
                                   : P::kFcfs;
  }
  if (auto v = node.find("max_running_requests")) {
    s.max_running_requests = static_cast<uint32_t>(v->as_uint_in(1, 1u << 20));
    o.max_num_seqs = s.max_running_requests;
  }
  if (auto v = node.find("chunked_prefill_size")) {  // <= 0: no chunking, as in SGLang
    const int64_t n = v->as_int();
    o.chunked_prefill = n > 0;
    if (n > 0) o.max_num_batched_tokens = static_cast<uint32_t>(v->as_uint_in(1, 1u << 24));
  }
  if (auto v = node.find("max_prefill_tokens"))
    s.max_prefill_tokens = static_cast<uint32_t>(v->as_uint_in(1, 1u << 24));
  if (auto v = node.find("schedule_conservativeness"))
    s.schedule_conservativeness = v->as_double_in(0.01, 100);
  if (auto v = node.find("init_new_token_ratio")) s.init_new_token_ratio = v->as_double_in(0, 1);
  if (auto v = node.find("min_new_token_ratio_factor"))
    s.min_new_token_ratio_factor = v->as_double_in(0, 1);
  if (auto v = node.find("new_token_ratio_decay_steps"))
    s.new_token_ratio_decay_steps = static_cast<uint32_t>(v->as_uint_in(1, 1u << 24));
  if (auto v = node.find("retract_decode_steps"))
    s.retract_decode_steps = static_cast<uint32_t>(v->as_uint_in(0, 1u << 24));
  if (auto v = node.find("clip_max_new_tokens"))
    s.clip_max_new_tokens = static_cast<uint32_t>(v->as_uint_in(1, 1u << 24));
  // SGLang retracts by recompute, fewest outputs first (retract_decode).
  o.preemption = Preemption::kRecompute;
  o.victim = Victim::kFewestDecoded;
  return o;
}

}  // namespace

const Registry<SchedulerEntry>& schedulers() {
  static const Registry<SchedulerEntry> kRegistry{
      "scheduler",
      {
          {"continuous_batching",
           "vLLM V1: token budget, max_num_seqs, chunked prefill, preemption by recompute, swap "
           "or free_front, async scheduling",
           {"max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "preemption", "victim",
            "swap_space", "beam_fork_prob", "async_scheduling"},
           parse_serve_options,
           [] { return std::make_unique<ContinuousBatching>(); }},
          {"static_batch",
           "a batch is formed, run to completion, then the next (FasterTransformer / pre-Orca)",
           {"max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "preemption", "victim",
            "swap_space", "beam_fork_prob"},
           parse_static_batch,
           [] { return std::make_unique<StaticBatch>(); }},
          {"sglang",
           "SGLang: prefill batches by its PrefillAdder (new_token_ratio), decode steps, "
           "retraction, fcfs / lpm / dfs-weight / lof / random",
           {"schedule_policy", "max_running_requests", "chunked_prefill_size", "max_prefill_tokens",
            "schedule_conservativeness", "init_new_token_ratio", "min_new_token_ratio_factor",
            "new_token_ratio_decay_steps", "retract_decode_steps", "clip_max_new_tokens"},
           parse_sglang,
           [] { return std::make_unique<SglangScheduler>(); }},
          {"single_sequence",
           "one request at a time; KV exhaustion truncates its generation (OrinMLLM, seed 10.4)",
           {"max_num_batched_tokens", "chunked_prefill", "beam_fork_prob"},
           parse_single_sequence,
           [] { return std::make_unique<SingleSequence>(); }},
      }};
  return kRegistry;
}

}  // namespace memsim
