// Role interface of step executors: the real work of a serving engine step (the new tokens' K/V
// written through the KV strategy's tables, attention over them, the copies of swaps) and the
// validation of what every sequence reads. The engine runs it between scheduling and sampling.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "src/kv/kv_cache_manager.h"
#include "src/kv/token_content.h"

namespace memsim {

// One sequence of a step: it computes tokens [computed, computed + new_tokens) of `content`.
struct StepSeq {
  uint64_t request = 0;  // RequestSpec id (for messages)
  uint32_t sample = 0;   // its index among the request's sequences (n samples, beams)
  SeqId id = 0;
  const TokenContent* content = nullptr;  // every token the sequence will hold
  uint32_t computed = 0;                  // tokens whose KV exists before the step
  uint32_t new_tokens = 0;                // 1 for a decode, the chunk for a prefill
};

struct StepWork {
  uint64_t step = 0;  // engine step number, from 0
  std::vector<StepSeq> seqs;
  bool validate = false;            // check every scheduled sequence this step
  std::string reason;               // why ("sampled", "fork", "copy-on-write", "swap-in", ...)
  SimTime simulated_attention = 0;  // the step-time model's attention share (all layers)
};

// What an executor did over a run.
struct ExecutorReport {
  std::string kind;  // "content" (CPU shadow) or "cuda"
  uint64_t steps = 0;
  uint64_t checked_steps = 0;
  uint64_t checked_seqs = 0;         // sequence checks that passed
  uint64_t swaps = 0;                // sequences swapped out and back in with their contents
  uint64_t split_prefill_steps = 0;  // GPU executors: steps whose prefills split their KV
  std::string failure;               // the first failed check ("request R sample S, step N, ...")
  // GPU executors: KV writes + attention of the layers run, measured with events, against the
  // simulated attention time of the same steps (scaled to the layers run).
  double measured_attention_s = 0, simulated_attention_s = 0;
  // GPU executors: the strategy's page mapping calls (map, set_access, unmap) over the run,
  // host time around the driver calls against the cost model's time for them.
  double measured_map_s = 0, simulated_map_s = 0;
  uint64_t map_calls = 0;
  uint32_t layers_run = 0;
  uint64_t device_kv_bytes = 0;      // cudaMemGetInfo drop when the KV pool was created
  uint64_t peak_strategy_bytes = 0;  // peak device bytes the strategy held (backend accounting)
  uint64_t peak_device_bytes = 0;    // peak cudaMemGetInfo drop less the executor's buffers
  // Model-step executors (engine.gpu_step: model): host wall time of the steps (what the engine's
  // clock advanced by), the GPU's share of it (CUDA events), and the model's weight bytes.
  double measured_step_s = 0, gpu_step_s = 0;
  uint64_t weight_bytes = 0;
  uint32_t graphs_captured = 0;  // decode batch sizes captured as CUDA graphs
  uint64_t graph_steps = 0;      // steps that replayed one (padded to its size)
  // The GEMM warm-up before the first step (ModelStep::warm_up_gemms): matmuls run, host time.
  uint32_t warm_up_matmuls = 0;
  double warm_up_s = 0;
  // Tensor parallelism: this rank's own step wall time over the run, and how much the slowest
  // rank's (the time every rank's clock advanced by) added to it.
  double rank_step_s = 0, rank_wait_s = 0;
  // Model-step executors: host time of the steps before the model step starts (the strategy's
  // copies waited for, the inputs gathered) and in it before its first kernel (packing).
  double host_sync_s = 0, host_inputs_s = 0, host_pack_s = 0;
};

// Contract (every implementation):
// - begin(kv, backend, swap_space, swap_bytes) once the pool exists (kv.layout() is then fixed);
//   end() before the pool is shut down. swap_space is the engine's pinned host swap buffer (0
//   without one).
// - run_step(work): the strategy holds capacity for computed + new_tokens tokens of every
//   sequence (seq_table covers them). The executor writes the new tokens' K and V, a
//   deterministic function of (token, position, layer), so a shared prefix holds identical K/V as
//   in a real model. With work.validate it checks each sequence against a reference built from its
//   own tokens, independent of the tables; a mismatch returns kInvalidState whose message names
//   the request, sample, step and position (or layer), and the engine stops the run with it.
// - swap_out(seq, source, content, tokens) just before the engine releases a sequence whose KV
//   goes to the host swap space: tokens [0, tokens) are saved as `seq`'s, read through
//   `source`'s table (a sample not yet forked in the pool reads its parent's rows).
//   swap_in(seq, content, tokens) after the sequence regrew into new blocks brings them back;
//   swap_drop(seq) forgets them (the engine gave the request up).
class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual Status begin(KvCacheManager& kv, Backend& backend, DevPtr swap_space,
                       uint64_t swap_bytes) = 0;
  virtual Status run_step(const StepWork& work) = 0;
  virtual Status swap_out(SeqId seq, SeqId source, const TokenContent& content,
                          uint32_t tokens) = 0;
  virtual Status swap_in(SeqId seq, const TokenContent& content, uint32_t tokens) = 0;
  virtual Status swap_drop(SeqId seq) = 0;
  virtual void end() = 0;
  // Whether it reads a pool of several KV cache groups (KvLayout::layer_group), each layer
  // through its group's table with its window; the engine refuses sliding-window groups otherwise.
  virtual bool reads_kv_groups() const { return false; }
  virtual ExecutorReport report() const = 0;
  // Executors that time their steps: the host wall time of the last run_step, which the engine
  // then uses as the step's compute time (EngineConfig::measured_clock); 0 = not measured.
  virtual SimTime measured_step_ns() const { return 0; }
  // Of that, the GPU's own time (events around the step's upload and kernels), ms; 0 = unknown.
  virtual double measured_step_gpu_ms() const { return 0; }
};

using ExecutorFactory = std::function<std::unique_ptr<StepExecutor>()>;

}  // namespace memsim
