// Measured step times of one model on one GPU (a profile, written by `memsim calibrate --backend
// cuda --model NAME` beside the GPU's YAML) and the step-time prediction interpolated from them,
// which the serving engine uses instead of the roofline when a profile exists.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "workload/step_time.h"

namespace memsim {

// One row of a grid: steps of `size` (decode: sequences; prefill: chunk tokens) measured at
// several `points` (decode: context tokens per sequence; prefill: cached prefix tokens),
// ascending, with the median step time at each.
struct ProfileRow {
  uint32_t size = 0;
  std::vector<uint32_t> points;
  std::vector<double> ms;
};

struct StepProfile {
  std::string gpu, model;
  std::string mode = "eager";  // eager: kernels launched one by one; graphs: captured steps
  // Ranks the step ran on (tensor parallelism): each step's time is one rank's, collectives
  // included. 1: one GPU.
  uint32_t tensor_parallel = 1;
  // Under tensor parallelism, what the steps' all-reduces ran on: "custom" (vLLM's custom
  // all-reduce up to 8 MiB, NCCL above) or "nccl" (NCCL only; a file without the key).
  std::string all_reduce = "nccl";
  // The KV cache's element type when it is not the model's (calibrate --kv-cache-dtype: vLLM's
  // fp8 e4m3 or fp8_e5m2 cache, quantized by the KV write with scales of 1.0); nullopt: the
  // model's dtype. An fp8 cache's steps read half the KV bytes, so they have profiles of their
  // own (step_profile_file).
  std::optional<DType> kv_cache_dtype;
  std::string measured;             // free text: device, driver, date
  std::vector<ProfileRow> decode;   // one new token per sequence, by batch size (ascending)
  std::vector<ProfileRow> prefill;  // one sequence's chunk, by chunk tokens (ascending)
  // Factors its times were multiplied by (scale_step_profile), 1 as measured. Not written to a
  // profile file: a scaled profile describes another machine than the one that measured it.
  double decode_scale = 1, prefill_scale = 1;
};

// The profile with every decode row's times multiplied by `decode` and every prefill row's by
// `prefill` (a machine that runs the same kernels that much slower, or faster when below 1).
// Throws std::invalid_argument unless both are positive and finite.
StepProfile scale_step_profile(StepProfile p, double decode, double prefill);

// Empty when the profile is usable, else what is wrong (rows ascending by size and non-empty,
// points ascending, one time per point, times positive and finite, at least one decode row).
std::string check_step_profile(const StepProfile& p);

// Empty when `batches` can be a profile's decode rows for a model step of up to `max_seqs`
// sequences (non-empty, ascending, each 1..max_seqs), else what is wrong.
std::string check_decode_batches(const std::vector<uint32_t>& batches, uint32_t max_seqs);
// The same for prefill rows' chunk sizes and a model step of up to `max_tokens` tokens.
std::string check_prefill_chunks(const std::vector<uint32_t>& chunks, uint32_t max_tokens);

// One grid point measured on two machines: the reference profile's time and this one's.
struct ProbePoint {
  bool decode = true;
  uint32_t size = 0, point = 0;  // as in ProfileRow: sequences x context, or chunk x prefix
  double profile_ms = 0, measured_ms = 0;
};

// The points `measured` shares with `reference` (same kind, row size and point; nothing is
// interpolated) and, per kind, the geometric mean of measured / reference over them (1 where
// they share none): a machine's speed against the profiled one, step_profile_scale's factors.
struct SpeedProbe {
  std::vector<ProbePoint> points;
  double decode = 1, prefill = 1;
};
SpeedProbe profile_speed(const StepProfile& measured, const StepProfile& reference);

// Step time from a profile. A step whose every sequence computes one token is a decode step of
// B = num_seqs sequences at context kv_read_tokens / B: interpolated linearly in context within
// the two decode rows around B, then linearly in B between them. Any other step runs its
// decodes through the decode kernel and its prefill chunks through the prefill kernel (as
// ModelStep and vLLM's FlashInfer backend do), so it costs
//   one prefill chunk of all new_tokens tokens (t) whose prefix p makes its attention work equal
//   the prefill sequences' (t x p + t (t + 1) / 2 = attn_pairs - decode_kv_tokens; p < 0 when
//   several short prompts do less work than one chunk of t: each row then falls from prefix 0
//   by its least-squares slope over all its prefixes (the attention cost of a prefix token),
//   not by its first segment alone, two points close enough that their noise sets the slope),
// + the decodes' attention: the decode step of decode_seqs sequences at their mean context less
//   the same step at context 0 (extended), whose GEMM share the chunk already counts.
// Outside a grid the nearest segment's slope extends it (times never below the smallest
// measured one of the row, except in the two extensions to negative prefix and context 0; below
// prefix 0 the row's least-squares slope, as above); a grid with one row or point is flat in
// that direction.
//
// With `graphs` (a profile of mode graphs: decode steps replayed as captured CUDA graphs) and
// the engine's `graph_sizes` (ascending), a decode step of B sequences up to the largest size
// runs as vLLM runs it: padded to the smallest captured size Bp >= B and replayed, so it costs
// the graphs' decode grid at Bp sequences of context kv_read_tokens / Bp (the padding rows read
// no KV: the same attention work spread over Bp rows). Larger decode steps and every step with
// a prefill chunk run eagerly, from `profile`.
//
// `rows_at_once` (empty, or one flag per graph size) marks the sizes whose decode attention runs
// every sequence as one CTA row per KV head, all in one wave (kernels::plan_decode unsplit at the
// capture context, Bp x KV heads within the CTA slots). A row's time is then its sequence's KV,
// and the padding rows carry none, so B < Bp sequences take the graph's row at Bp sequences of
// their own mean context kv_read_tokens / B, not at the work spread over Bp rows. (Measured on
// the H200, Llama-3.1-8B: replays of 17-48 sequences ran 0.914 of the spread prediction, 0.939
// of this one.)
class ProfiledStepTime {
 public:
  explicit ProfiledStepTime(StepProfile profile,
                            std::shared_ptr<const StepProfile> graphs = nullptr,
                            std::vector<uint32_t> graph_sizes = {},
                            std::vector<bool> rows_at_once = {});
  SimTime step_time(const StepShape& s) const;
  const StepProfile& profile() const { return p_; }
  // Null when no decode step replays a graph.
  const StepProfile* graphs() const { return graph_sizes_.empty() ? nullptr : graphs_.get(); }
  const std::vector<uint32_t>& graph_sizes() const { return graph_sizes_; }
  const std::vector<bool>& rows_at_once() const { return at_once_; }
  // "<gpu>/<model> (eager)" or "<gpu>/<model> (eager; decode as CUDA graphs of N sizes)", with
  // ", fp8 KV cache" after the mode for an fp8 cache's profile and
  // ", scaled: decode x0.970, prefill x1.000" when the profile was scaled.
  std::string describe() const;

 private:
  StepProfile p_;
  std::shared_ptr<const StepProfile> graphs_;
  std::vector<uint32_t> graph_sizes_;
  std::vector<bool> at_once_;  // empty, or one flag per graph size
};

}  // namespace memsim
