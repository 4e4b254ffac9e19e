// A serving run's outcome as JSON and back (serving_result_io.h): one list of fields per struct,
// walked by a writer and by a reader, so that the two directions cannot disagree.
#include "src/app/serving_result_io.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace memsim {

namespace {

using json = nlohmann::json;

// A struct added to or grown here must have its new fields in its visit() below: these sizes
// stop the build until it does (then update the size).
static_assert(sizeof(Percentiles) == 32, "a field of Percentiles is missing from visit()");
static_assert(sizeof(StepShape) == 56, "a field of StepShape is missing from visit()");
static_assert(sizeof(MeasuredStep) == 88, "a field of MeasuredStep is missing from visit()");
static_assert(sizeof(KvStats) == 136, "a field of KvStats is missing from visit()");
static_assert(sizeof(ServeCounters) == 104, "a field of ServeCounters is missing from visit()");
static_assert(sizeof(ExecutorReport) == 272, "a field of ExecutorReport is missing from visit()");
static_assert(sizeof(ServingResult) == 1112, "a field of ServingResult is missing from visit()");

// Each struct's fields, by name. V is called as v(name, field); S is the struct, const or not.
template <class V, class S>
void visit(V& v, S& p) requires std::is_same_v<std::remove_const_t<S>, Percentiles> {
  v("p50", p.p50), v("p90", p.p90), v("p99", p.p99), v("mean", p.mean);
}

template <class V, class S>
void visit(V& v, S& s) requires std::is_same_v<std::remove_const_t<S>, StepShape> {
  v("num_seqs", s.num_seqs), v("new_tokens", s.new_tokens), v("kv_read_tokens", s.kv_read_tokens);
  v("attn_pairs", s.attn_pairs), v("decode_seqs", s.decode_seqs);
  v("decode_kv_tokens", s.decode_kv_tokens), v("decode_max_kv", s.decode_max_kv);
}

template <class V, class S>
void visit(V& v, S& m) requires std::is_same_v<std::remove_const_t<S>, MeasuredStep> {
  v("shape", m.shape), v("predicted", m.predicted), v("measured", m.measured);
  v("wall_s", m.wall_s), v("gpu_ms", m.gpu_ms);
}

template <class V, class S>
void visit(V& v, S& k) requires std::is_same_v<std::remove_const_t<S>, KvStats> {
  v("block_tokens", k.block_tokens), v("block_bytes", k.block_bytes);
  v("total_blocks", k.total_blocks), v("used_blocks", k.used_blocks);
  v("cached_blocks", k.cached_blocks), v("free_blocks", k.free_blocks);
  v("slots_allocated", k.slots_allocated), v("tokens_stored", k.tokens_stored);
  v("pool_bytes", k.pool_bytes), v("metadata_bytes", k.metadata_bytes);
  v("host_table_bytes", k.host_table_bytes), v("free_list_bytes", k.free_list_bytes);
  v("cow_copies", k.cow_copies), v("cow_bytes", k.cow_bytes);
  v("evicted_blocks", k.evicted_blocks), v("pool_growths", k.pool_growths);
  v("max_blocks", k.max_blocks);
}

template <class V, class S>
void visit(V& v, S& c) requires std::is_same_v<std::remove_const_t<S>, ServeCounters> {
  v("preemptions", c.preemptions), v("recomputes", c.recomputes), v("swap_outs", c.swap_outs);
  v("swap_ins", c.swap_ins), v("swapped_bytes", c.swapped_bytes), v("oom_events", c.oom_events);
  v("truncations", c.truncations), v("prefix_query_tokens", c.prefix_query_tokens);
  v("prefix_hit_tokens", c.prefix_hit_tokens), v("rejected", c.rejected);
  v("restarts", c.restarts), v("front_frees", c.front_frees);
  v("front_freed_tokens", c.front_freed_tokens);
}

template <class V, class S>
void visit(V& v, S& e) requires std::is_same_v<std::remove_const_t<S>, ExecutorReport> {
  v("kind", e.kind), v("steps", e.steps), v("checked_steps", e.checked_steps);
  v("checked_seqs", e.checked_seqs), v("swaps", e.swaps);
  v("split_prefill_steps", e.split_prefill_steps), v("failure", e.failure);
  v("measured_attention_s", e.measured_attention_s);
  v("simulated_attention_s", e.simulated_attention_s);
  v("measured_map_s", e.measured_map_s), v("simulated_map_s", e.simulated_map_s);
  v("map_calls", e.map_calls), v("layers_run", e.layers_run);
  v("device_kv_bytes", e.device_kv_bytes), v("peak_strategy_bytes", e.peak_strategy_bytes);
  v("peak_device_bytes", e.peak_device_bytes), v("measured_step_s", e.measured_step_s);
  v("gpu_step_s", e.gpu_step_s), v("weight_bytes", e.weight_bytes);
  v("graphs_captured", e.graphs_captured), v("graph_steps", e.graph_steps);
  v("warm_up_matmuls", e.warm_up_matmuls), v("warm_up_s", e.warm_up_s);
  v("rank_step_s", e.rank_step_s), v("rank_wait_s", e.rank_wait_s);
  v("host_sync_s", e.host_sync_s), v("host_inputs_s", e.host_inputs_s);
  v("host_pack_s", e.host_pack_s);
}

template <class V, class S>
void visit(V& v, S& r) requires std::is_same_v<std::remove_const_t<S>, ServingResult> {
  v("label", r.label), v("kv_impl", r.kv_impl), v("scheduler", r.scheduler);
  v("error", r.error), v("step_time_source", r.step_time_source);
  v("requests", r.requests), v("finished", r.finished), v("truncated", r.truncated);
  v("rejected", r.rejected), v("length_capped", r.length_capped);
  v("rejections", r.rejections), v("steps", r.steps), v("sim_time", r.sim_time);
  v("wall_seconds", r.wall_seconds), v("output_tokens", r.output_tokens);
  v("computed_tokens", r.computed_tokens), v("output_tokens_per_s", r.output_tokens_per_s);
  v("requests_per_s", r.requests_per_s), v("ttft_ms", r.ttft_ms), v("tpot_ms", r.tpot_ms);
  v("e2e_ms", r.e2e_ms), v("max_running_seqs", r.max_running_seqs);
  v("mean_running_seqs", r.mean_running_seqs), v("waste_pct", r.waste_pct);
  v("peak_used_blocks", r.peak_used_blocks), v("peak_kv_bytes", r.peak_kv_bytes);
  v("prefix_hit_rate", r.prefix_hit_rate), v("kv_critical_time", r.kv_critical_time);
  v("kv_background_time", r.kv_background_time), v("kv_stall_time", r.kv_stall_time);
  v("kv", r.kv), v("kv_capacity_tokens", r.kv_capacity_tokens), v("counters", r.counters);
  v("executed", r.executed), v("validation", r.validation);
  v("measured_steps", r.measured_steps), v("samples", r.samples), v("series", r.series);
}

template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

// A double as a JSON number, or, when not finite, as the string "nan", "inf" or "-inf".
json encode_double(double d) {
  if (std::isfinite(d)) return d;
  return std::isnan(d) ? "nan" : d > 0 ? "inf" : "-inf";
}

template <class T>
json encode(const T& x);

struct Writer {
  json& out;
  template <class T>
  void operator()(const char* name, const T& x) {
    out[name] = encode(x);
  }
};

template <class T>
json encode(const T& x) {
  if constexpr (std::is_same_v<T, double>) {
    return encode_double(x);
  } else if constexpr (std::is_arithmetic_v<T> || std::is_same_v<T, std::string>) {
    return x;
  } else if constexpr (std::is_same_v<T, SampleLog>) {
    json a = json::array();
    for (const GaugeSample& s : x)
      a.push_back(json::array({s.time, s.series, encode_double(s.value)}));
    return a;
  } else if constexpr (is_vector<T>::value) {
    json a = json::array();
    for (const auto& e : x) a.push_back(encode(e));
    return a;
  } else {
    json o = json::object();
    Writer w{o};
    visit(w, x);
    return o;
  }
}

// Reading: a value of the wrong type or a missing key throws BadValue naming its path.
struct BadValue : std::runtime_error {
  using std::runtime_error::runtime_error;
};

double decode_double(const json& j, const std::string& path) {
  if (j.is_number()) return j.get<double>();
  if (j == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (j == "inf") return std::numeric_limits<double>::infinity();
  if (j == "-inf") return -std::numeric_limits<double>::infinity();
  throw BadValue(fmt::format("{}: not a number", path));
}

template <class T>
void decode(const json& j, const std::string& path, T& x);

struct Reader {
  const json& in;
  const std::string& path;
  template <class T>
  void operator()(const char* name, T& x) {
    const auto it = in.find(name);
    if (it == in.end()) throw BadValue(fmt::format("{}.{}: missing", path, name));
    decode(*it, path + "." + name, x);
  }
};

template <class T>
void decode(const json& j, const std::string& path, T& x) {
  if constexpr (std::is_same_v<T, double>) {
    x = decode_double(j, path);
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!j.is_boolean()) throw BadValue(fmt::format("{}: not true or false", path));
    x = j.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    const bool fits = std::is_signed_v<T> ? j.is_number_integer() : j.is_number_unsigned();
    if (!fits) throw BadValue(fmt::format("{}: not a whole number of its kind", path));
    if constexpr (std::is_signed_v<T>) {
      if (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(std::numeric_limits<T>::max()))
        throw BadValue(fmt::format("{}: out of range", path));
      const int64_t v = j.get<int64_t>();
      if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max())
        throw BadValue(fmt::format("{}: out of range", path));
      x = static_cast<T>(v);
    } else {
      const uint64_t v = j.get<uint64_t>();
      if (v > std::numeric_limits<T>::max()) throw BadValue(fmt::format("{}: out of range", path));
      x = static_cast<T>(v);
    }
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!j.is_string()) throw BadValue(fmt::format("{}: not a string", path));
    x = j.get<std::string>();
  } else if constexpr (std::is_same_v<T, SampleLog>) {
    if (!j.is_array()) throw BadValue(fmt::format("{}: not a list", path));
    x = SampleLog();
    for (size_t i = 0; i < j.size(); ++i) {
      const std::string at = fmt::format("{}[{}]", path, i);
      if (!j[i].is_array() || j[i].size() != 3) throw BadValue(at + ": not [time, series, value]");
      GaugeSample s{};
      decode(j[i][0], at, s.time);
      decode(j[i][1], at, s.series);
      s.value = decode_double(j[i][2], at);
      x.push_back(s);
    }
  } else if constexpr (is_vector<T>::value) {
    if (!j.is_array()) throw BadValue(fmt::format("{}: not a list", path));
    x.assign(j.size(), typename T::value_type{});
    for (size_t i = 0; i < j.size(); ++i) decode(j[i], fmt::format("{}[{}]", path, i), x[i]);
  } else {
    if (!j.is_object()) throw BadValue(fmt::format("{}: not a map", path));
    Reader r{j, path};
    visit(r, x);
  }
}

}  // namespace

std::string run_outcome_json(const ServingRunResult& run) {
  json o = json::object();
  o["result"] = encode(run.result);
  o["replicas"] = encode(run.replicas);
  o["assigned"] = encode(run.assigned);
  return o.dump();
}

std::string read_run_outcome_json(std::string_view text, ServingRunResult& run) {
  try {
    const json o = json::parse(text);
    if (!o.is_object()) return "the run's outcome is not a JSON map";
    Reader r{o, "outcome"};
    r("result", run.result);
    r("replicas", run.replicas);
    r("assigned", run.assigned);
    return "";
  } catch (const json::exception& e) {
    return fmt::format("the run's outcome is not valid JSON: {}", e.what());
  } catch (const BadValue& e) {
    return e.what();
  }
}

}  // namespace memsim
