// Data-parallel serving: replica engines advanced side by side on one timeline, the coordinator's
// count publications, vLLM's load balancer, and the replicas' figures merged.
#include "src/serve/dp_serving.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <stdexcept>

namespace memsim {

uint32_t DpLoadBalancer::choose() {
  // core_client.py: score = waiting * 4 + running; strictly smaller wins, from eng_start_index 0.
  uint64_t best_score = std::numeric_limits<uint64_t>::max();
  uint32_t best = 0;
  for (uint32_t i = 0; i < view_.size(); ++i) {
    const uint64_t score = view_[i].waiting * 4 + view_[i].running;
    if (score < best_score) {
      best_score = score;
      best = i;
    }
  }
  view_[best].waiting += 1;  // current_counts[eng_index][0] += self.client_count
  return best;
}

namespace {

// The deployment's figures from its replicas' (see run_serving_dp) and every request's latencies.
ServingResult merge_replicas(const std::vector<ServingResult>& reps, LatencySamples& latency) {
  ServingResult m;
  const ServingResult& first = reps.front();
  m.label = first.label;
  m.kv_impl = first.kv_impl;
  m.scheduler = first.scheduler;
  m.step_time_source = first.step_time_source;
  double running = 0, waste = 0, replica_time = 0;
  for (size_t k = 0; k < reps.size(); ++k) {
    const ServingResult& r = reps[k];
    if (m.error.empty() && !r.error.empty()) m.error = fmt::format("dp {}: {}", k, r.error);
    m.requests += r.requests;
    m.finished += r.finished;
    m.truncated += r.truncated;
    m.rejected += r.rejected;
    m.length_capped += r.length_capped;
    for (const std::string& why : r.rejections)
      if (m.rejections.size() < 100) m.rejections.push_back(why);
    m.steps += r.steps;
    m.sim_time = std::max(m.sim_time, r.sim_time);
    m.wall_seconds += r.wall_seconds;
    m.output_tokens += r.output_tokens;
    m.computed_tokens += r.computed_tokens;
    m.max_running_seqs = std::max(m.max_running_seqs, r.max_running_seqs);
    running += r.mean_running_seqs * double(r.sim_time);
    waste += r.waste_pct * double(r.sim_time);  // each replica's share of its own slots
    replica_time += double(r.sim_time);
    m.peak_used_blocks += r.peak_used_blocks;
    m.peak_kv_bytes += r.peak_kv_bytes;
    m.kv_critical_time += r.kv_critical_time;
    m.kv_background_time += r.kv_background_time;
    m.kv_stall_time += r.kv_stall_time;
    KvStats& s = m.kv;
    s.block_tokens = r.kv.block_tokens;
    s.block_bytes = r.kv.block_bytes;
    s.total_blocks += r.kv.total_blocks;
    s.used_blocks += r.kv.used_blocks;
    s.cached_blocks += r.kv.cached_blocks;
    s.free_blocks += r.kv.free_blocks;
    s.slots_allocated += r.kv.slots_allocated;
    s.tokens_stored += r.kv.tokens_stored;
    s.pool_bytes += r.kv.pool_bytes;
    s.metadata_bytes += r.kv.metadata_bytes;
    s.host_table_bytes += r.kv.host_table_bytes;
    s.free_list_bytes += r.kv.free_list_bytes;
    s.pool_growths += r.kv.pool_growths;
    s.max_blocks += r.kv.max_blocks;
    s.cow_copies += r.kv.cow_copies;
    s.cow_bytes += r.kv.cow_bytes;
    s.evicted_blocks += r.kv.evicted_blocks;
    m.kv_capacity_tokens += r.kv_capacity_tokens;
    ServeCounters& n = m.counters;
    n.preemptions += r.counters.preemptions;
    n.recomputes += r.counters.recomputes;
    n.swap_outs += r.counters.swap_outs;
    n.swap_ins += r.counters.swap_ins;
    n.swapped_bytes += r.counters.swapped_bytes;
    n.oom_events += r.counters.oom_events;
    n.truncations += r.counters.truncations;
    n.prefix_query_tokens += r.counters.prefix_query_tokens;
    n.prefix_hit_tokens += r.counters.prefix_hit_tokens;
    n.rejected += r.counters.rejected;
    n.restarts += r.counters.restarts;
    n.front_frees += r.counters.front_frees;
    n.front_freed_tokens += r.counters.front_freed_tokens;
  }
  // Waste is a percentage of each replica's own slots: the replicas' time-weighted mean, as an
  // integral over the merged run's time (set_rate_figures divides by it).
  const double waste_mean = replica_time > 0 ? waste / replica_time : 0;
  set_rate_figures(m, latency, running, waste_mean * double(m.sim_time));
  return m;
}

}  // namespace

DpServingResult run_serving_dp(const EngineConfig& config, const RequestTable& requests,
                               uint32_t replicas) {
  if (replicas == 0) throw std::invalid_argument("run_serving_dp: no replica");
  const auto wall0 = std::chrono::steady_clock::now();
  EngineConfig each = config;
  each.progress = nullptr;  // replicas report nothing on their own
  std::vector<RequestTable> tables(replicas);
  std::vector<std::unique_ptr<Engine>> engines;
  DpServingResult out;
  out.assigned.assign(replicas, 0);
  bool started = true;
  std::vector<char> ok(replicas, 0);
  for (uint32_t k = 0; k < replicas; ++k) {
    engines.push_back(std::make_unique<Engine>(each, tables[k]));
    engines[k]->open_feed(requests.size(), requests.any_parallel());
    ok[k] = engines[k]->start();
    started = started && ok[k];
  }
  const SimTime t0 = engines.front()->origin();
  for (const auto& e : engines)
    if (started && e->origin() != t0)
      throw std::logic_error("run_serving_dp: the replicas' clocks start apart");

  DpLoadBalancer balancer(replicas);
  std::vector<RequestCounts> now(replicas);
  SimTime last_publish = t0, look = t0 + kDpStatsInterval;
  for (size_t i = 0; started && i < requests.size(); ++i) {
    const SimTime arrival = t0 + requests.arrival(i);
    for (; look <= arrival; look += kDpStatsInterval) {
      // vLLM's coordinator publishes at a tick when any engine sent new stats since the last
      // one (stats_changed), even if its counts came back to what was published, and otherwise
      // every kDpStatsUnchangedInterval; a publication also resets the front-end's increments.
      bool reported = false;
      for (uint32_t k = 0; k < replicas; ++k) {
        engines[k]->advance(look);
        now[k] = engines[k]->counts_at(look);
        reported = reported || engines[k]->counts_changed_at(look) > look - kDpStatsInterval;
      }
      if (reported || look - last_publish >= kDpStatsUnchangedInterval) {
        balancer.publish(now);
        last_publish = look;
      }
    }
    const uint32_t k = balancer.choose();
    tables[k].push_back(requests[i]);
    ++out.assigned[k];
  }
  LatencySamples latency;
  for (uint32_t k = 0; k < replicas; ++k) {
    Engine& e = *engines[k];
    e.close_feed();
    if (!ok[k]) {
      out.replicas.push_back(e.take_result());
      continue;
    }
    if (started) e.advance(INT64_MAX);  // else: release what it holds, its requests unserved
    out.replicas.push_back(e.finish());
    latency.append(e.latencies());
  }
  out.merged = merge_replicas(out.replicas, latency);
  out.merged.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return out;
}

}  // namespace memsim
