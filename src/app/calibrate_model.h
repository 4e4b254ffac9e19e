// `memsim calibrate --backend cuda --model NAME`: measures the model-shaped step over the profile
// grid on the GPU and writes the (gpu, model) step-time profile the serving engine reads.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace memsim {

// The most sequences one profiled step holds (the model step's max_seqs, the grid's last row).
inline constexpr uint32_t kCalibrateMaxSeqs = 512;
inline constexpr uint32_t kCalibrateMaxTokens = 8192;  // the model step's tokens a step

struct CalibrateModelOptions {
  std::string gpu_path = "configs/gpus/h200.yaml";
  std::string model;     // configs/models/<model>.yaml, or a path to a model YAML
  std::string out_path;  // empty: step_profile_path(gpu_path, model)
  uint32_t layers = 0;   // layers run (0 = all; fewer only for quick trials: times are per run)
  bool graphs = false;   // decode steps as captured CUDA graphs (profile mode "graphs")
  // The decode rows' batch sizes, ascending, 1..kCalibrateMaxSeqs (check_decode_batches);
  // empty: ProfileGrid's (powers of two).
  // With --graphs, the engine's capture sizes give a row for every graph a replay can run.
  std::vector<uint32_t> decode_batches;
  // The prefill rows' chunk sizes, ascending, 1..kCalibrateMaxTokens (check_prefill_chunks);
  // empty: ProfileGrid's (16, 64, 256, 1024, 2048, 4096, 8192).
  std::vector<uint32_t> prefill_chunks;
  // The KV cache's dtype (vLLM's --kv-cache-dtype): auto (the model's), fp8 (= fp8_e4m3) or
  // fp8_e5m2. An fp8 cache's profile is <model>[.tp<N>].fp8[.graphs].yaml.
  std::string kv_cache_dtype = "auto";
  int device = 0;
  // Tensor parallelism: one process per rank on GPUs 0..N-1 over NCCL (this command again with
  // rank and nccl_id set), each running the grid on its shard; rank 0 writes the rank's profile
  // (<model>.tp<N>[.graphs].yaml).
  uint32_t tensor_parallel = 1;
  // The all-reduce the ranks run: "custom" (vLLM's default: its custom all-reduce up to 8 MiB,
  // NCCL above, at 2, 4, 6 or 8 ranks) or "nccl". The profile records it (all_reduce:).
  std::string all_reduce = "custom";
  int rank = -1;
  std::string nccl_id;
};

// Returns 0 on success, 1 when a measurement or the read-back failed, 2 for bad options or when
// no GPU can be used.
int run_calibrate_model(const CalibrateModelOptions& options, std::ostream& out, std::ostream& err);

}  // namespace memsim
