// The scheduler registry: one line per implementation, and the parser of their options.
#include "src/serve/scheduler_registry.h"

#include "src/serve/continuous_batching.h"
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
  if (auto v = node.find("preemption"))
    o.preemption =
        v->as_choice({"recompute", "swap"}) == "swap" ? Preemption::kSwap : Preemption::kRecompute;
  if (auto v = node.find("victim"))
    o.victim = v->as_choice({"last_arrived", "fewest_decoded"}) == "fewest_decoded"
                   ? Victim::kFewestDecoded
                   : Victim::kLastArrived;
  if (auto v = node.find("swap_space")) o.swap_space = v->as_bytes();
  if (auto v = node.find("beam_fork_prob")) o.beam_fork_prob = v->as_double_in(0, 1);
  if (auto v = node.find("async_scheduling")) o.async_scheduling = v->as_bool();
  return o;
}

// One sequence at a time, whatever the experiment's max_num_seqs.
ServeOptions parse_single_sequence(const ConfigNode& node, ServeOptions o) {
  o = parse_serve_options(node, o);
  o.max_num_seqs = 1;
  return o;
}

}  // namespace

const Registry<SchedulerEntry>& schedulers() {
  static const Registry<SchedulerEntry> kRegistry{
      "scheduler",
      {
          {"continuous_batching",
           "vLLM V1: token budget, max_num_seqs, chunked prefill, preemption by recompute or "
           "swap, async scheduling",
           {"max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "preemption", "victim",
            "swap_space", "beam_fork_prob", "async_scheduling"},
           parse_serve_options,
           [] { return std::make_unique<ContinuousBatching>(); }},
          {"static_batch",
           "a batch is formed, run to completion, then the next (FasterTransformer / pre-Orca)",
           {"max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "preemption", "victim",
            "swap_space", "beam_fork_prob"},
           parse_serve_options,
           [] { return std::make_unique<StaticBatch>(); }},
          {"single_sequence",
           "one request at a time; KV exhaustion truncates its generation (OrinMLLM, seed 10.4)",
           {"max_num_batched_tokens", "chunked_prefill", "beam_fork_prob"},
           parse_single_sequence,
           [] { return std::make_unique<SingleSequence>(); }},
      }};
  return kRegistry;
}

}  // namespace memsim
