// Serving experiment writers: terminal table, budget breakdowns, JSON/CSV files, plots.
#include "src/app/serving_writers.h"

#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <algorithm>

#include "src/app/plots.h"
#include "src/app/writers.h"

namespace memsim {
namespace fs = std::filesystem;
namespace {

constexpr ColumnDoc kServingColumns[] = {
    {"run", "the run's label", -30},
    {"KV", "the run's KV budget: the budget's = kv cache line, or engine.kv_budget", 9},
    {"blocks",
     "units the pool can hold: blocks, token slots (radix), sequence slabs (static) or page "
     "groups (vmm)",
     9},
    {"blk-table", "device bytes of block tables or request-to-token tables", 9},
    {"max seq", "the most sequences running at once (a request with n samples or beams counts n)",
     8},
    {"waste%", "time-weighted mean % of allocated token slots holding no token", 7},
    {"hit%",
     "prefix-cache hit tokens / tokens looked up; a readmission after preemption is looked up "
     "again",
     7},
    {"CoW", "copy-on-write block copies", 6},
    {"preem", "preemptions: running groups taken out to free KV", 6},
    {"swapGiB", "GiB moved over PCIe by swapping, out and back in", 7},
    {"tok/s", "output tokens / simulated seconds from the first arrival to the last completion", 9},
    {"TTFT p50", "median over requests of first-token time - arrival", 8},
    {"TPOT p50", "median over requests of (finish - first token) / (outputs - 1)", 8},
    {"E2E p99", "99th percentile over finished requests of finish - arrival", 8},
    {"outcome",
     "ok; N truncated; N rejected (never fit); no KV memory; FAILED (the error under the row)"},
};

constexpr ColumnDoc kKvBudgetLines[] = {
    {"capacity", "the GPU's capacity"},
    {"usable",
     "floor(gpu_memory_utilization x capacity), or SGLang's mem_fraction_static x the memory "
     "free before the weights"},
    {"- weights", "the model's weight bytes"},
    {"- activation peak",
     "peak allocated bytes of vLLM's profile run (one forward pass of max_num_batched_tokens, "
     "and the sampler) through torch_caching"},
    {"- graph memory",
     "peak reserved bytes of the graph strategy capturing the sizes listed, largest first "
     "(without the GEMM workspace); 0 with enforce_eager"},
    {"= kv cache", "usable less the three above; then whole tokens and whole blocks"},
};

std::string outcome(const ServingRunResult& r) {
  if (!r.budget_error.empty()) return "no KV memory";
  if (!r.result.error.empty()) return "FAILED";
  std::string s = "ok";
  if (r.result.truncated) s = fmt::format("{} truncated", r.result.truncated);
  if (r.result.rejected) s += fmt::format(", {} rejected", r.result.rejected);
  return s;
}

// Scalar figures of a run, in a fixed order: the CSV columns and the JSON fields.
std::vector<std::pair<std::string, double>> figures(const ServingRunResult& r) {
  const ServingResult& x = r.result;
  const KvStats& k = x.kv;
  const ServeCounters& n = x.counters;
  return {
      {"kv_budget_bytes", double(r.budget.kv_bytes)},
      {"kv_pool_bytes", double(k.pool_bytes)},
      {"kv_total_blocks", double(k.total_blocks)},
      {"kv_block_tokens", double(k.block_tokens)},
      {"kv_block_bytes", double(k.block_bytes)},
      {"kv_capacity_tokens", double(x.kv_capacity_tokens)},
      {"block_table_bytes", double(k.metadata_bytes)},
      {"kv_overhead_bytes", double(k.overhead_bytes())},
      {"kv_pool_growths", double(k.pool_growths)},
      {"requests", double(x.requests)},
      {"finished", double(x.finished)},
      {"truncated", double(x.truncated)},
      {"rejected", double(x.rejected)},
      {"steps", double(x.steps)},
      {"sim_seconds", double(x.sim_time) / 1e9},
      {"output_tokens", double(x.output_tokens)},
      {"output_tokens_per_s", x.output_tokens_per_s},
      {"requests_per_s", x.requests_per_s},
      {"ttft_p50_ms", x.ttft_ms.p50},
      {"ttft_p90_ms", x.ttft_ms.p90},
      {"ttft_p99_ms", x.ttft_ms.p99},
      {"tpot_p50_ms", x.tpot_ms.p50},
      {"tpot_p90_ms", x.tpot_ms.p90},
      {"tpot_p99_ms", x.tpot_ms.p99},
      {"e2e_p50_ms", x.e2e_ms.p50},
      {"e2e_p90_ms", x.e2e_ms.p90},
      {"e2e_p99_ms", x.e2e_ms.p99},
      {"max_running_seqs", double(x.max_running_seqs)},
      {"mean_running_seqs", x.mean_running_seqs},
      {"kv_waste_pct", x.waste_pct},
      {"peak_used_blocks", double(x.peak_used_blocks)},
      {"peak_kv_bytes", double(x.peak_kv_bytes)},
      {"prefix_hit_rate", x.prefix_hit_rate},
      {"cow_copies", double(k.cow_copies)},
      {"cow_bytes", double(k.cow_bytes)},
      {"evicted_blocks", double(k.evicted_blocks)},
      {"preemptions", double(n.preemptions)},
      {"recomputes", double(n.recomputes)},
      {"swap_outs", double(n.swap_outs)},
      {"swapped_bytes", double(n.swapped_bytes)},
      {"oom_events", double(n.oom_events)},
      {"restarts", double(n.restarts)},
      {"front_frees", double(n.front_frees)},
      {"front_freed_tokens", double(n.front_freed_tokens)},
      {"computed_tokens", double(x.computed_tokens)},
      {"kv_critical_ms", double(x.kv_critical_time) / 1e6},
      {"kv_background_ms", double(x.kv_background_time) / 1e6},
      {"kv_stall_ms", double(x.kv_stall_time) / 1e6},
  };
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      o += fmt::format("\\u{:04x}", static_cast<unsigned>(ch));
      continue;
    }
    o += ch;
  }
  return o + "\"";
}

std::string num(double v) {
  return fmt::format("{:.10g}", v);
}

}  // namespace

std::span<const ColumnDoc> serving_columns() {
  return kServingColumns;
}

std::span<const ColumnDoc> kv_budget_lines() {
  return kKvBudgetLines;
}

std::string format_serving_table(const ServingConfig& c, const ServingResults& results,
                                 bool explain) {
  std::ostringstream o;
  // Each distinct budget once.
  std::set<std::string> shown;
  for (const ServingRunResult& r : results.runs) {
    if (!r.budget_error.empty()) {
      o << fmt::format("{}: {}\n", r.spec.label, r.budget_error);  // "kv budget: ..."
      continue;
    }
    if (r.spec.kv_budget_override) continue;
    std::string text = format_kv_budget(r.budget);
    if (shown.insert(text).second)
      o << fmt::format("KV-cache budget ({}, {}):\n{}", c.model.name, c.gpu.name, text);
  }
  if (explain && !shown.empty())
    o << table_legend(kKvBudgetLines, kKvBudgetAnchor, true, "budget lines");
  for (const RequestSet& s : c.request_sets) o << "requests: " << s.summary.describe() << "\n";
  // Each run's step-time source once, with where its profile is (that of the run's KV cache
  // dtype) or why there is none.
  std::set<std::string> shown_sources;
  for (const ServingRunResult& r : results.runs) {
    const std::string& s = r.result.step_time_source;
    if (s.empty()) continue;
    const StepProfiles p = profiles_for(c, r.spec.kv_cache_dtype);
    std::string why;
    if (s.rfind("roofline", 0) == 0)
      why = p.eager ? " (engine.step_time: roofline)" : " (" + p.note + ")";
    else if (s == "measured")
      why = " (the GPU's wall time of each model step)";
    else
      why =
          p.note.empty() ? fmt::format(" ({})", p.path) : fmt::format(" ({}; {})", p.path, p.note);
    if (shown_sources.insert(s + why).second) o << "step time: " << s << why << "\n";
  }
  if (c.parallel.sizes.data > 1)
    o << fmt::format(
        "data parallel: {} engine replicas, each with the budget above, behind vLLM's load "
        "balancer (4 x waiting + running); a run's row is the replicas merged (blocks, tok/s, "
        "counts summed, latencies over every request), then one line per replica\n",
        c.parallel.sizes.data);
  o << header_row(kServingColumns);
  for (const ServingRunResult& r : results.runs) {
    const ServingResult& x = r.result;
    if (!r.budget_error.empty()) {
      o << fmt::format("{:<30} {:>9}  {}\n", r.spec.label, "-", outcome(r));
      continue;
    }
    o << fmt::format(
        "{:<30} {:>9} {:>9} {:>9} {:>8} {:>7.1f} {:>7.1f} {:>6} {:>6} {:>7.2f} {:>9.0f} "
        "{:>6.0f}ms "
        "{:>6.1f}ms {:>7.1f}s  {}\n",
        r.spec.label, human_bytes(r.budget.kv_bytes), x.kv.total_blocks,
        human_bytes(x.kv.metadata_bytes), x.max_running_seqs, x.waste_pct, 100 * x.prefix_hit_rate,
        x.kv.cow_copies, x.counters.preemptions, double(x.counters.swapped_bytes) / (1ull << 30),
        x.output_tokens_per_s, x.ttft_ms.p50, x.tpot_ms.p50, x.e2e_ms.p99 / 1000, outcome(r));
    if (x.kv_critical_time || x.kv_background_time)
      o << fmt::format(
          "    KV calls: {:.1f} ms on the critical path, {:.1f} ms in background steps ({:.1f} ms "
          "not hidden by compute)\n",
          double(x.kv_critical_time) / 1e6, double(x.kv_background_time) / 1e6,
          double(x.kv_stall_time) / 1e6);
    if (x.executed)
      o << fmt::format(
          "    validation ({}): {} steps, {} checked, {} sequence checks passed, {} swaps{}\n",
          x.validation.kind, x.validation.steps, x.validation.checked_steps,
          x.validation.checked_seqs, x.validation.swaps,
          x.validation.failure.empty() ? "" : ", FAILED");
    if (!x.rejections.empty())  // the first one, with its reason (the engine keeps them all)
      o << "    rejected: " << x.rejections.front()
        << (x.rejected > 1 ? fmt::format(" (and {} more)", x.rejected - 1) : "") << "\n";
    if (!x.error.empty()) o << "    error: " << x.error << "\n";
    for (size_t k = 0; k < r.replicas.size(); ++k) {  // data parallelism: each engine
      const ServingResult& y = r.replicas[k];
      o << fmt::format(
          "    dp {}: {} requests, {:.0f} tok/s, TTFT p50 {:.0f} ms, TPOT p50 {:.1f} ms, E2E p99 "
          "{:.1f} s, max seqs {}, preemptions {}{}\n",
          k, k < r.assigned.size() ? r.assigned[k] : y.requests, y.output_tokens_per_s,
          y.ttft_ms.p50, y.tpot_ms.p50, y.e2e_ms.p99 / 1000, y.max_running_seqs,
          y.counters.preemptions, y.error.empty() ? "" : ", FAILED");
    }
  }
  double sim = 0, wall = 0;
  for (const ServingRunResult& r : results.runs) {
    sim += double(r.result.sim_time) / 1e9;
    wall += r.result.wall_seconds;
  }
  o << fmt::format(
      "{} runs: {:.1f} s simulated in {:.2f} s of engine time ({:.0f}x), {:.2f} s wall{}\n",
      results.runs.size(), sim, wall, wall > 0 ? sim / wall : 0.0, results.wall_seconds,
      results.process_per_run ? ", each run in a process of its own" : "");
  o << table_legend(kServingColumns, kServingAnchor, explain);
  return o.str();
}

namespace {

// summary.json: the experiment's identity and one record per run (budget, validation, figures).
void write_summary_json(std::ostream& f, const ServingConfig& c, const ServingResults& results) {
  f << "{\n  \"experiment\": " << json_string(c.experiment)
    << ",\n  \"source\": " << json_string(c.source) << ",\n  \"gpu\": " << json_string(c.gpu.name)
    << ",\n  \"model\": " << json_string(c.model.name);
  if (c.parallel.sizes.tensor > 1 || c.parallel.sizes.pipeline > 1)  // one rank simulated
    f << ",\n  \"parallel\": {\"tensor_parallel_size\": " << c.parallel.sizes.tensor
      << ", \"pipeline_parallel_size\": " << c.parallel.sizes.pipeline
      << ", \"custom_all_reduce\": " << (c.parallel.comm.custom_all_reduce ? "true" : "false")
      << ", \"nccl_cumem\": " << (c.parallel.comm.nccl_cumem ? "true" : "false")
      << ", \"figures\": \"per rank\"}";
  if (c.parallel.sizes.data > 1)  // replicas alike: the budget is each one's
    f << ",\n  \"data_parallel_size\": " << c.parallel.sizes.data;
  f << ",\n  \"requests\": [";
  for (size_t i = 0; i < c.request_sets.size(); ++i)
    f << (i ? ", " : "") << json_string(c.request_sets[i].summary.describe());
  f << "],\n  \"runs\": [\n";
  for (size_t i = 0; i < results.runs.size(); ++i) {
    const ServingRunResult& r = results.runs[i];
    const KvBudget& b = r.budget;
    f << "    {\"label\": " << json_string(r.spec.label)
      << ", \"kv\": " << json_string(r.spec.kv_impl)
      << ", \"kv_params\": " << json_string(r.spec.kv_params)
      << ", \"scheduler\": " << json_string(r.spec.scheduler)
      << ", \"async_scheduling\": " << (r.spec.serve.async_scheduling ? "true" : "false")
      << ", \"step_time\": " << json_string(r.result.step_time_source) << ", \"kv_cache_dtype\": "
      << json_string(r.spec.kv_cache_dtype ? to_string(*r.spec.kv_cache_dtype) : "auto")
      << ", \"outcome\": " << json_string(outcome(r))
      << ", \"error\": " << json_string(r.result.error.empty() ? r.budget_error : r.result.error)
      << ",\n     \"budget\": {\"capacity\": " << b.capacity << ", \"usable\": " << b.usable
      << ", \"weights\": " << b.weights << ", \"activation_peak\": " << b.activation_peak
      << ", \"graph_memory\": " << b.graph_memory << ", \"kv_bytes\": " << b.kv_bytes
      << ", \"kv_bytes_per_token\": " << b.kv_bytes_per_token
      << ", \"graph_strategy\": " << json_string(b.graph_strategy);
    if (b.tensor_parallel > 1)
      f << ", \"nccl\": " << b.comm.nccl() << ", \"custom_all_reduce\": " << b.comm.custom()
        << ", \"free\": " << b.free_bytes();
    f << "},\n     ";
    if (r.result.executed) {
      const ExecutorReport& v = r.result.validation;
      f << "\"validation\": {\"kind\": " << json_string(v.kind) << ", \"steps\": " << v.steps
        << ", \"checked_steps\": " << v.checked_steps << ", \"checked_seqs\": " << v.checked_seqs
        << ", \"swaps\": " << v.swaps << ", \"failure\": " << json_string(v.failure) << "},\n     ";
    }
    const auto figs = figures(r);
    for (size_t j = 0; j < figs.size(); ++j)
      f << (j ? ", " : "") << json_string(figs[j].first) << ": " << num(figs[j].second);
    if (!r.replicas.empty()) {  // data parallelism: each engine's own figures
      f << ",\n     \"replicas\": [";
      for (size_t k = 0; k < r.replicas.size(); ++k) {
        ServingRunResult one;
        one.budget = r.budget;
        one.result = r.replicas[k];
        f << (k ? ",\n       " : "\n       ") << "{\"replica\": " << k
          << ", \"assigned\": " << (k < r.assigned.size() ? r.assigned[k] : 0)
          << ", \"error\": " << json_string(one.result.error);
        for (const auto& [name, v] : figures(one)) f << ", " << json_string(name) << ": " << num(v);
        f << "}";
      }
      f << "]";
    }
    f << "}" << (i + 1 < results.runs.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
}

}  // namespace

void write_serving_outputs(const ServingConfig& c, const ServingResults& results, OutputDir& dir) {
  // engine.export_snapshot: each run's profile-run allocator timeline as a PyTorch snapshot.
  for (const auto& r : results.runs) {
    if (r.budget.profile_snapshot.empty()) continue;
    std::error_code ec;
    fs::create_directories(dir.staged("snapshots"), ec);
    if (ec)
      throw OutputError(fmt::format("cannot create {}/snapshots: {}", dir.path(), ec.message()));
    std::string name = r.spec.label;
    for (char& ch : name)
      if (ch == '/' || ch == ' ') ch = '_';
    dir.write("snapshots/" + name + "_profile_run.pickle",
              [&](std::ostream& f) { f << r.budget.profile_snapshot; });
  }
  dir.write("summary.json", [&](std::ostream& f) { write_summary_json(f, c, results); });
  // Host timings: the one output that differs between identical reruns, kept apart.
  dir.write("timing.json", [&](std::ostream& f) {
    f << "{\n  \"wall_seconds\": " << num(results.wall_seconds) << ",\n  \"runs\": [";
    for (size_t i = 0; i < results.runs.size(); ++i)
      f << (i ? ", " : "") << "{\"label\": " << json_string(results.runs[i].spec.label)
        << ", \"wall_seconds\": " << num(results.runs[i].result.wall_seconds) << "}";
    f << "]\n}\n";
  });
  dir.write("curves.csv", [&](std::ostream& f) {
    f << "run,kv,kv_params,scheduler,outcome";
    if (!results.runs.empty())
      for (const auto& [name, v] : figures(results.runs[0])) f << "," << name;
    f << "\n";
    for (const ServingRunResult& r : results.runs) {
      f << csv_quoted(r.spec.label) << "," << csv_cell(r.spec.kv_impl) << ","
        << csv_quoted(r.spec.kv_params) << "," << csv_cell(r.spec.scheduler) << ","
        << csv_quoted(outcome(r));
      for (const auto& [name, v] : figures(r)) f << "," << num(v);
      f << "\n";
    }
  });
  dir.write("timeseries.csv", [&](std::ostream& f) {
    f << "time_s,strategy,metric,value\n";
    for (const ServingRunResult& r : results.runs) {
      const std::string label = csv_quoted(r.spec.label);
      for (const MetricsRecorder::Sample& s : r.result.samples)
        f << num(double(s.time) / 1e9) << "," << label << "," << r.result.series[s.series] << ","
          << num(s.value) << "\n";
      for (size_t k = 0; k < r.replicas.size(); ++k)  // data parallelism: "dp K." per engine
        for (const MetricsRecorder::Sample& s : r.replicas[k].samples)
          f << num(double(s.time) / 1e9) << "," << label << ",dp" << k << "."
            << r.replicas[k].series[s.series] << "," << num(s.value) << "\n";
    }
  });
}

std::string plot_serving(const ServingConfig&, const OutputDir& dir) {
  return run_plot_script(
      "plot_kv.py", dir, {},
      {"kv_summary.png", "kv_summary.svg", "kv_timeseries.png", "kv_timeseries.svg"});
}

}  // namespace memsim
