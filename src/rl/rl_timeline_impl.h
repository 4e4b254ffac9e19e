// The RL timeline's inner class, shared by its two source files: rl_timeline.cpp (phases,
// samples, the trainer's programs, the iteration) and rl_engine.cpp (the rollout engine: its
// tensors, the saver's pause and resume, the weight update, the teardown baseline).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "src/rl/rl_rollout.h"
#include "src/rl/rl_timeline.h"

namespace memsim::rl_detail {

// Out of memory: ends the run as an outcome.
struct OutOfMemory {
  std::string what;
  uint64_t bytes_short = 0;
};
// Anything else that fails: ends the run as an error.
struct RunFailure {
  std::string what;
};

std::string gib(uint64_t bytes);
RlTag rollout_tag(const std::string& tag);

// One GPU: its backend and the two processes' caching allocators.
struct Device {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<CachingAllocator> train_alloc;    // the trainer process
  std::unique_ptr<CachingAllocator> rollout_alloc;  // the rollout engine's process
  std::array<uint64_t, kRlTagCount> bytes{};        // without kAllocatorCache
  uint64_t allocator_live = 0;                      // of those, blocks of the allocators
};

class Timeline {
 public:
  Timeline(const RlConfig& c, const ModelShape& m, const RlRunSpec& run, const RolloutPlan& plan,
           const RlRunHooks& hooks);
  RlRunResult run();

 private:
  static TrainSpec train_spec(const RlConfig& c, const RolloutPlan& plan);
  Device& train_gpu() { return devices_[0]; }
  Device& rollout_gpu() { return devices_.back(); }
  size_t rollout_index() const { return devices_.size() - 1; }
  void setup_devices();

  // ---- phases and samples (rl_timeline.cpp)
  void begin_phase(uint32_t iteration, std::string name);
  void end_phase();
  void close_after_failure();
  void sample_all();
  void sample(size_t g);
  bool runs_on(const std::string& name, size_t g) const;
  void thin_samples();
  // Bytes of tag `t` on GPU `g` change by `delta`: blocks of a caching allocator (the default)
  // or memory the saver holds.
  void add(size_t g, RlTag t, int64_t delta, bool allocator_block = true);

  // ---- the trainer (rl_timeline.cpp)
  struct Live {
    DevPtr ptr = 0;
    uint64_t bytes = 0;
    RlTag tag;
  };
  void exec(const std::vector<TrainOp>& ops, const std::string& what);

  // ---- the rollout engine (rl_engine.cpp)
  bool via_saver(const std::string& tag) const;
  DevPtr engine_alloc(uint64_t bytes, const std::string& tag);
  void refresh_saver_gauges();
  void init_rollout_engine();
  void capture_decode_graph();
  void launch_decode_graph();
  void deliver(DevPtr src, uint64_t bytes, const std::string& what);
  void copy_into_weights(Backend& b, DevPtr src, uint64_t bytes, const std::string& what);
  using PrimitiveTimes = std::array<SimTime, static_cast<size_t>(Primitive::kCount)>;
  PrimitiveTimes primitive_times() const;
  void add_split(const PrimitiveTimes& before, std::map<std::string, double>& split);
  std::vector<std::string> saver_tags_except(const std::vector<std::string>& skip) const;
  double saver_call(bool pause, const std::vector<std::string>& tags, const std::string& what,
                    double* measured);
  uint64_t rollout_device_bytes() { return rollout_gpu().backend->usage().physical_bytes; }
  void release(uint32_t i);
  double resume_stage(const std::vector<std::string>& tags, const std::string& what,
                      double* measured, uint64_t* bytes, uint32_t* calls);
  // The seed's baseline (RlRunSpec::teardown): the engine freed after the rollout, its weights
  // written to host (or disk) after training, the engine rebuilt before the next rollout.
  void teardown_engine(uint32_t i);
  void rebuild_engine(uint32_t i);
  void free_engine_tensor(DevPtr p, uint64_t bytes, RlTag tag);

  // ---- the timeline (rl_timeline.cpp)
  void init();
  void iteration(uint32_t i);
  void rollout_phase(uint32_t i);
  void train_phases(uint32_t i);
  void sync_phases(uint32_t i);
  void teardown();
  void summarize();
  void advance_s(double seconds);
  [[noreturn]] void fail(const Error& e, const std::string& what);
  void check(const Status& s, const std::string& what);

  const RlConfig& c_;
  const ModelShape& m_;
  const RlRunSpec& run_;
  const RolloutPlan& plan_;
  const RlRunHooks& hooks_;
  TrainProgramBuilder builder_;
  SimClock clock_;
  std::vector<Device> devices_;
  std::unique_ptr<MemorySaver> saver_;
  std::vector<std::pair<DevPtr, uint64_t>> weights_, kv_;
  std::pair<DevPtr, uint64_t> graph_pool_{0, 0};
  DevPtr comm_ = 0;  // the rollout engine's NCCL / custom all-reduce memory (TP > 1)
  StreamId stream_;
  GraphHandle graph_;
  std::unordered_map<uint64_t, Live> live_;
  std::unordered_map<uint64_t, DevPtr> host_;
  std::vector<DevPtr> weights_host_;  // teardown: the engine's weights in pinned host memory
  bool engine_up_ = false;            // teardown: the engine holds its tensors
  size_t sync_tensor_ = 0;
  uint64_t sync_offset_ = 0;
  size_t phase_first_sample_ = 0;
  bool phase_closed_ = true;
  double rollout_s_ = 0, train_s_ = 0, sync_s_ = 0, iteration_s_ = 0;
  double pause_ms_ = 0, resume_weights_ms_ = 0, resume_rest_ms_ = 0, offload_ms_ = 0,
         reload_ms_ = 0;
  double weights_out_ms_ = 0, recapture_ms_ = 0;  // teardown: sums
  uint64_t weights_out_bytes_ = 0, weights_in_bytes_ = 0;
  uint64_t rollout_tokens_ = 0;
  uint64_t freed_bytes_ = 0, resumed_weights_bytes_ = 0, resumed_rest_bytes_ = 0;  // sums
  RlMeasured measured_;
  std::map<std::string, double> pause_split_, resume_split_;
  RlRunResult r_;
};

}  // namespace memsim::rl_detail
