// steps.csv read back (serving_measured --backend cuda writes every measured step's shape and
// times there) and a step's sequences rebuilt from its shape's sums, so that the steps can be
// timed again in isolation (memsim-model-bench --replay-steps).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/result.h"
#include "workload/step_time.h"

namespace memsim {

// steps.csv's header (written by serving_measured's report, read by read_steps_csv).
inline constexpr const char* kStepsCsvHeader =
    "run,step,num_seqs,new_tokens,decode_seqs,decode_kv_tokens,decode_max_kv,kv_read_tokens,"
    "attn_pairs,measured_ms,predicted_ms,wall_s,gpu_ms";

// One row of steps.csv.
struct MeasuredStepRow {
  std::string run;    // the run's label
  uint64_t step = 0;  // its index in the run
  StepShape shape;
  double measured_ms = 0, predicted_ms = 0;
  double gpu_ms = 0;  // the step's kernels (CUDA events); 0 where the file has none
};

// Reads a steps.csv: a header naming at least run, step, num_seqs, new_tokens, decode_seqs,
// decode_kv_tokens, decode_max_kv, kv_read_tokens, attn_pairs, measured_ms and predicted_ms (in
// any order; gpu_ms and other columns optional), then one row per step. Errors name the file,
// the line and the column.
Result<std::vector<MeasuredStepRow>> read_steps_csv(const std::string& path);

// One sequence of a step: `cached` tokens of KV before it, `tokens` computed.
struct SeqWork {
  uint32_t cached = 0, tokens = 0;
};

// Sequences whose sums are the shape's, decodes first (steps.csv keeps only the sums):
//   decodes: one at decode_max_kv tokens of context (the new one included), the others sharing
//     the rest of decode_kv_tokens evenly (the first ones one more where it does not divide);
//   prefills (the other num_seqs - decode_seqs): the new tokens left and the KV tokens before
//     them (kv_read_tokens - decode_kv_tokens less those new tokens) shared out the same way.
// So a step of one prefill sequence is rebuilt exactly, its prefix included; several are given
// the same chunk and prefix. An error says which sum is inconsistent.
Result<std::vector<SeqWork>> sequences_of(const StepShape& shape);

}  // namespace memsim
