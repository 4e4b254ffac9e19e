// Data parallelism in serving: data_parallel_size independent engines (replicas) behind vLLM V1's
// front-end load balancer, which sends each request to the engine with the least
// 4 x waiting + running requests as the coordinator last published them.
#pragma once

#include <cstdint>
#include <vector>

#include "core/clock.h"
#include "src/serve/engine.h"
#include "src/serve/engine_impl.h"
#include "workload/request_table.h"

namespace memsim {

// vLLM's DPLBAsyncMPClient.get_core_engine_for_request (vllm/v1/engine/core_client.py) with one
// front-end (client_count 1, eng_start_index 0): the engine of least score waiting x 4 + running
// in its view of the counts, the first such from engine 0 on a tie; the chosen engine's waiting
// count then goes up by one in the view ("for better balancing between stats updates from the
// coordinator"), until the next publication replaces the view.
class DpLoadBalancer {
 public:
  explicit DpLoadBalancer(uint32_t engines) : view_(engines) {}
  uint32_t choose();
  void publish(const std::vector<RequestCounts>& counts) { view_ = counts; }
  const std::vector<RequestCounts>& view() const { return view_; }

 private:
  std::vector<RequestCounts> view_;
};

// The DP coordinator (vllm/v1/engine/coordinator.py) publishes the engines' counts to the
// front-end stats_update_interval_ms (100) after its last publication when some engine's counts
// changed, else after 5 s. memsim looks at the engines every 100 ms from the run's start and
// publishes at the first look after any engine reported new counts (even counts back at the
// published ones: the coordinator's stats_changed), or 5 s after the last publication: a change
// reaches the front-end up to 100 ms later than a coordinator that wakes on it, and IPC takes no
// time. An engine's counts are those after its last step that ended by then (vLLM publishes
// them after each step).
inline constexpr SimTime kDpStatsInterval = 100'000'000;
inline constexpr SimTime kDpStatsUnchangedInterval = 5'000'000'000;

struct DpServingResult {
  ServingResult merged;                 // the deployment: every replica's requests together
  std::vector<ServingResult> replicas;  // each engine's own run
  std::vector<uint64_t> assigned;       // requests the balancer sent to each replica
};

// Runs `requests` over `replicas` engines of `config` (each its own clock, scheduler, KV pool and
// backend; ranks and memory alike), the balancer handing each request to one as it arrives.
// merged: counts, tokens, steps and KV figures summed over the replicas (peak_used_blocks and
// peak_kv_bytes are the sum of each replica's own peak, reached at different times: an upper
// bound of the deployment's at any one moment); sim_time from the first arrival to the last
// completion anywhere; latency percentiles over every request pooled; the most sequences any
// replica ran at once (max_running_seqs); the deployment's mean running sequences; KV waste as
// the replicas' time-weighted mean (a percentage of each replica's own slots); the first replica
// error (named "dp K: ..."). The replicas' gauge samples stay in `replicas` (timeseries.csv
// names them "dpK.<metric>"; tools/plot_kv.py sums them into the run's).
DpServingResult run_serving_dp(const EngineConfig& config, const RequestTable& requests,
                               uint32_t replicas);

}  // namespace memsim
