// Serving experiments: YAML -> typed runs (base engine/scheduler/kv/requests + per-run
// overrides), KV budgets (cached per distinct input), and runs executed in parallel.
#include "src/serve/serving_experiment.h"

#include "core/parallel.h"
#include "src/config/step_profile_loader.h"

#include <filesystem>
#include <optional>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>

#include <fmt/format.h>

#include "core/host_memory.h"
#include "kernels/attention_types.h"
#include "src/config/loaders.h"
#include "src/config/requests_loader.h"
#include "src/graph/registry.h"
#include "src/kv/registry.h"
#include "src/serve/content_executor.h"
#include "src/serve/dp_serving.h"
#include "src/serve/scheduler_registry.h"
#include "workload/executor_program.h"

namespace memsim {

const ConfigKeys& serving_config_keys() {
  static const ConfigKeys kKeys = {
      {"",
       {"experiment", "gpu", "model", "engine", "scheduler", "kv", "requests", "runs",
        "sample_interval_ms", "seed", "grid", "step_profile_scale", "parallel"}},
      {"parallel", parallel_keys()},
      {"engine",
       {"gpu_memory_utilization", "mem_fraction_static", "enforce_eager", "graph_memory",
        "kv_budget", "max_model_len", "validate_content", "validate_sample", "gpu_layers",
        "step_time", "gpu_step", "export_snapshot", "kv_cache_dtype",
        "disable_hybrid_kv_cache_manager"}},
      {"step_profile_scale", {"decode", "prefill"}},
      {"scheduler", {}, "schedulers()"},
      {"kv", {}, "kv_strategies()"},
      {"runs[]", {"label", "engine", "scheduler", "kv", "requests"}},
  };
  return kKeys;
}

namespace {

struct EngineSettings {
  double gpu_memory_utilization = 0.9;
  double mem_fraction_static = 0;  // > 0: SGLang's budget rule instead
  bool enforce_eager = false;
  std::string graph_memory = "shared_pool";
  uint64_t kv_budget = 0;
  uint32_t max_model_len = 8192;
  bool validate_content = false;
  double validate_sample = 0.1;
  uint32_t gpu_layers = 0;
  std::string step_time = "auto";
  std::string gpu_step = "attention";
  bool export_snapshot = false;
  std::optional<DType> kv_cache_dtype;  // nullopt: "auto"
  bool hybrid_kv_cache = true;          // !disable_hybrid_kv_cache_manager
};

// engine.kv_cache_dtype, vLLM's CacheDType values: auto (the model's dtype), fp8 (= fp8_e4m3,
// vLLM's default fp8 format), fp8_e4m3, fp8_e5m2.
std::optional<DType> parse_kv_cache_dtype(const ConfigNode& v) {
  return kv_cache_dtype_from_name(v.as_choice(kv_cache_dtype_names()));
}

EngineSettings parse_engine(const ConfigNode& node, EngineSettings e) {
  node.expect_keys(keys_at(serving_config_keys(), "engine"));
  if (auto v = node.find("export_snapshot")) e.export_snapshot = v->as_bool();
  if (auto v = node.find("kv_cache_dtype")) e.kv_cache_dtype = parse_kv_cache_dtype(*v);
  if (auto v = node.find("disable_hybrid_kv_cache_manager")) e.hybrid_kv_cache = !v->as_bool();
  if (auto v = node.find("step_time")) e.step_time = v->as_choice({"auto", "roofline", "profile"});
  if (auto v = node.find("gpu_step")) e.gpu_step = v->as_choice({"attention", "model"});
  if (auto v = node.find("gpu_memory_utilization")) {
    e.gpu_memory_utilization = v->as_double_in(0.01, 1.0);
    e.mem_fraction_static = 0;  // the rule this node names wins over an inherited one
  }
  if (auto v = node.find("mem_fraction_static")) {
    if (node.has("gpu_memory_utilization"))
      v->fail(
          "give gpu_memory_utilization (vLLM's budget rule) or mem_fraction_static (SGLang's), "
          "not both");
    e.mem_fraction_static = v->as_double_in(0.01, 0.99);
  }
  if (auto v = node.find("enforce_eager")) e.enforce_eager = v->as_bool();
  if (auto v = node.find("graph_memory")) {
    std::vector<std::string> names = graph_strategies().names();
    names.push_back("none");
    e.graph_memory = v->as_choice(names);
    if (e.graph_memory == "none") e.enforce_eager = true;
  }
  if (auto v = node.find("kv_budget")) {
    e.kv_budget = v->as_bytes();
    if (e.kv_budget == 0) v->fail("must be positive (omit it to size the pool like vLLM)");
  }
  if (auto v = node.find("max_model_len"))
    e.max_model_len = static_cast<uint32_t>(v->as_uint_in(16, 1u << 24));
  if (auto v = node.find("validate_content")) e.validate_content = v->as_bool();
  if (auto v = node.find("validate_sample")) e.validate_sample = v->as_double_in(0.0, 1.0);
  if (auto v = node.find("gpu_layers"))
    e.gpu_layers = static_cast<uint32_t>(v->as_uint_in(1, 4096));
  if (e.gpu_step == "model" && e.gpu_layers)
    node.fail(
        "engine.gpu_step: model runs every layer (its measured time is the step's); drop "
        "engine.gpu_layers");
  return e;
}

}  // namespace

// A model with sliding-window layers: the run's KV strategy must hold vLLM's KV cache groups
// (a trait), unless the hybrid manager is off and full-attention layers make every layer full;
// pipeline stages are not modelled with windows (content checks are: each group's table, each
// window's positions).
void check_kv_groups(const ServingConfig& c, const ConfigNode& root,
                     const std::optional<ConfigNode>& node, const KvChoice& k,
                     const EngineSettings& e) {
  if (!c.model.sliding_window) return;
  const ConfigNode& at = node ? *node : root;
  auto key = [&](const char* map, const char* name) {
    for (const ConfigNode* n : {node ? &*node : nullptr, &root})
      if (n)
        if (auto m = n->find(map))
          if (auto v = m->find(name)) return *v;
    return at;
  };
  const std::vector<KvCacheGroup> groups =
      kv_cache_groups(c.model.layer_windows(), e.hybrid_kv_cache);
  if (any_window(groups) && !k.factory()->holds_kv_groups())
    key("kv", "impl")
        .fail(fmt::format("{} has sliding-window layers ({}), and the KV strategy '{}' cannot hold "
                          "KV cache groups "
                          "that free the blocks outside a window (paged_block_pool can){}",
                          c.model.name, describe_kv_groups(groups), k.impl,
                          c.model.sliding_window_pattern
                              ? "; engine.disable_hybrid_kv_cache_manager: true makes "
                                "every layer full attention, as vLLM does"
                              : ""));
  if (c.parallel.sizes.pipeline > 1)
    root["parallel"]["pipeline_parallel_size"].fail(
        "pipeline stages of a model with sliding-window layers are not modelled (vLLM groups the "
        "layers of the whole model, then gives each stage its part)");
}

std::vector<bool> graph_rows_at_once(const ModelShape& model, const GpuSpec& gpu,
                                     const std::vector<uint32_t>& sizes, uint32_t max_model_len) {
  kernels::AttentionShape shape{model.heads, model.kv_heads, static_cast<uint32_t>(model.head_dim)};
  // An fp8 cache's decode kernel fills fewer CTA slots (decode_ctas_bound).
  shape.kv_cache = kernel_kv_cache(model.kv_cache_dtype());
  const kernels::DeviceLimits limits{gpu.compute.sms, gpu.compute.decode_ctas_per_sm};
  const uint64_t slots = uint64_t{limits.num_sms} * kernels::decode_ctas(shape, limits);
  const uint32_t context = graph_context_for(max_model_len);
  std::vector<bool> at_once;
  for (const uint32_t b : sizes)
    at_once.push_back(uint64_t{b} * model.kv_heads <= slots &&
                      kernels::plan_decode(shape, b, context, limits).num_splits == 1);
  return at_once;
}

KvChoice parse_kv(const ConfigNode& node) {
  const KvEntry& info = kv_strategies().select(node, keys_at(serving_config_keys(), "kv"));
  KvChoice k;
  k.impl = info.name;
  k.factory = info.parse(node);
  for (const std::string& key : node.keys()) {
    if (key == "impl") continue;
    const ConfigNode v = node[key];
    k.params += fmt::format("{}{}={}", k.params.empty() ? "" : " ", key,
                            v.is_scalar() ? v.as_string() : "...");
  }
  // Tokens per block, for the block-table input of the budget's captured graphs (vLLM's
  // [max_num_seqs, max_model_len / block_size] table); strategies without such a table keep 16
  // so that every strategy of an experiment gets the same budget.
  if (const uint32_t b = k.factory()->block_table_tokens()) k.block_size = b;
  return k;
}

SchedulerChoice parse_scheduler(const ConfigNode& node, SchedulerChoice base) {
  if (auto impl = node.find("impl")) base.info = &schedulers().at(*impl);
  schedulers().check_keys(node, *base.info, keys_at(serving_config_keys(), "scheduler"));
  base.options = base.info->parse(node, base.options);
  if (base.options.async_scheduling) {
    const auto& keys = base.info->keys;
    const ConfigNode at = node.find("async_scheduling").value_or(node);
    if (std::find(keys.begin(), keys.end(), "async_scheduling") == keys.end())
      at.fail(
          fmt::format("scheduler '{}' has no async scheduling (async_scheduling was set "
                      "for continuous_batching; set it false here)",
                      base.info->name));
    if (base.options.preemption == Preemption::kSwap)
      node.find("preemption")
          .value_or(at)
          .fail(
              "async_scheduling models vLLM V1's AsyncScheduler, and vLLM V1 has no "
              "preemption by swapping (use recompute)");
    if (base.options.preemption == Preemption::kFreeFront)
      node.find("preemption")
          .value_or(at)
          .fail(
              "preemption: free_front (the OrinMLLM seed's strategy 3) is modelled for steps "
              "run one at a time, not with async_scheduling (use recompute)");
  }
  return base;
}

ConfigNode async_scheduling_key(const ConfigNode& root, std::optional<ConfigNode> run) {
  for (const std::optional<ConfigNode>& n : {run, std::optional<ConfigNode>(root)})
    if (n)
      if (auto s = n->find("scheduler"))
        if (auto a = s->find("async_scheduling")) return *a;
  return run.value_or(root);
}

namespace {

// The `preemption:` a run's scheduler got (its own, else the top level's).
ConfigNode preemption_key(const ConfigNode& root, std::optional<ConfigNode> run) {
  for (const std::optional<ConfigNode>& n : {run, std::optional<ConfigNode>(root)})
    if (n)
      if (auto s = n->find("scheduler"))
        if (auto p = s->find("preemption")) return *p;
  return run.value_or(root);
}

}  // namespace

bool is_serving_config(const ConfigNode& root) {
  return root.is_map() && (root.has("requests") || root.has("runs"));
}

bool is_serving_config(const std::string& path) {
  try {
    const ConfigNode root = ConfigNode::load_file(path);
    return root.is_map() && (root.has("requests") || root.has("runs"));
  } catch (const ConfigError&) {
    return false;  // the shapes loader reports the problem
  }
}

ServingConfig load_serving_config(const std::string& path,
                                  const std::vector<std::string>& overrides) {
  ConfigNode root = ConfigNode::load_file(path);
  for (const std::string& o : overrides) root.apply_override(o);
  return load_serving_config(root);
}

namespace {

// A --set of a top-level key that every run sets for itself would change nothing: an error that
// names the runs. A run's `kv:` and `requests:` replace the top level's whole; its `engine:` and
// `scheduler:` replace only the keys they give.
void check_shadowed_overrides(const ConfigNode& root, const std::vector<ConfigNode>& runs) {
  for (const std::string& key : root.overridden_keys()) {
    const size_t dot = key.find('.');
    const std::string section = key.substr(0, dot);
    const bool whole = section == "kv" || section == "requests";
    if (!whole && section != "engine" && section != "scheduler") continue;
    const std::string sub =
        dot == std::string::npos ? "" : key.substr(dot + 1, key.find('.', dot + 1) - dot - 1);
    std::vector<std::string> where;
    for (const ConfigNode& r : runs) {
      const std::optional<ConfigNode> own = r.is_map() ? r.find(section) : std::nullopt;
      if (!own || !(whole || sub.empty() || (own->is_map() && own->has(sub)))) break;
      where.push_back(own->where());
    }
    if (where.size() < runs.size()) continue;  // some run takes the top level's value
    throw ConfigError(fmt::format(
        "--set {}: every run sets its own {} ({}), so it changes nothing; set it per run "
        "(--set runs.N.{}=...)",
        key, whole || sub.empty() ? section : section + "." + sub, fmt::join(where, "; "), key));
  }
}

// The measured step-time profiles of (gpu, model, KV cache dtype `kv`; nullopt: the model's),
// eager and graphs, when they were calibrated. Under tensor parallelism, one rank's profiles
// (<model>.tp<N>...): their steps include the collectives.
StepProfiles load_step_profiles(const ConfigNode& root, const std::string& gpu_file,
                                const ServingConfig& c, std::optional<DType> kv) {
  const uint32_t tp = c.parallel.sizes.tensor;
  const auto kv_name = [](std::optional<DType> d) { return d ? to_string(*d) : "auto"; };
  auto load_profile = [&](const std::string& path, const char* mode) -> std::optional<StepProfile> {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return std::nullopt;
    const ConfigNode pnode = ConfigNode::load_file(path);
    StepProfile prof = load_step_profile(pnode);
    if (prof.model != c.model.name)
      pnode["model"].fail("is not the experiment's model " + c.model.name);
    if (prof.mode != mode)
      pnode["mode"].fail(fmt::format("is {}, but this file holds the {} profile", prof.mode, mode));
    if (prof.kv_cache_dtype != kv)
      pnode.fail(
          fmt::format("holds steps over a kv_cache_dtype {} cache, but this file is the {} "
                      "one's profile",
                      kv_name(prof.kv_cache_dtype), kv_name(kv)));
    if (prof.tensor_parallel != tp)
      pnode.fail(
          fmt::format("holds steps at tensor_parallel {}, but this file is the TP {} profile",
                      prof.tensor_parallel, tp));
    if (const char* want = all_reduce_kind(c.parallel.sizes, c.parallel.comm);
        tp > 1 && prof.all_reduce != want)
      pnode.fail(fmt::format(
          "holds steps measured with the {} all-reduce, but the experiment's parallel runs the "
          "{} one (custom_all_reduce: {}): calibrate with --all-reduce {}, or set "
          "custom_all_reduce to match",
          prof.all_reduce, want, c.parallel.comm.custom_all_reduce, want));
    if (std::string why = check_step_profile(prof); !why.empty()) pnode.fail(why);
    return prof;
  };
  StepProfiles s;
  const ProfileLocation eager =
      find_step_profile(root["gpu"], gpu_file, c.gpu.name, c.model.name, false, tp, kv);
  s.path = eager.path;
  s.note = eager.note;
  if (auto prof = load_profile(s.path, "eager"))
    s.eager = std::make_shared<const ProfiledStepTime>(std::move(*prof));
  s.graph_path =
      find_step_profile(root["gpu"], gpu_file, c.gpu.name, c.model.name, true, tp, kv).path;
  if (auto prof = load_profile(s.graph_path, "graphs"))
    s.graphs = std::make_shared<const StepProfile>(std::move(*prof));
  return s;
}

// The model dtype's profiles and the fp8 caches' (ServingConfig::profiles).
void load_step_profiles(const ConfigNode& root, const std::string& gpu_file, ServingConfig& c) {
  for (const std::optional<DType> kv :
       {std::optional<DType>{}, std::optional{DType::kFP8}, std::optional{DType::kFP8E5M2}})
    c.profiles[kv] = load_step_profiles(root, gpu_file, c, kv);
}

// vLLM's front-end fans a request of n samples out as n requests, each balanced on its own;
// memsim's engine keeps a request's samples (and beams) together, so under DP it refuses them.
void check_data_parallel_requests(const ConfigNode& root, const ServingConfig& c) {
  if (c.parallel.sizes.data <= 1) return;
  for (const ServingRunSpec& run : c.runs)
    if (c.request_sets[run.requests].requests.any_parallel())
      root["parallel"]["data_parallel_size"].fail(fmt::format(
          "run '{}' has requests with n > 1 or beams, which vLLM's front-end splits into "
          "separate requests balanced one by one over the DP engines; memsim keeps a request's "
          "samples together, so it does not model them under data parallelism",
          run.label));
}

// calibrate's flags for the rank's profile under TP ("" on one GPU).
std::string tp_calibrate_flags(const ParallelSettings& p) {
  if (p.sizes.tensor <= 1) return "";
  return fmt::format(" --tensor-parallel {} --all-reduce {}", p.sizes.tensor,
                     all_reduce_kind(p.sizes, p.comm));
}

// engine.step_time: profile needs the profile of the run's KV cache dtype.
void check_profile_exists(const ServingConfig& c, std::optional<DType> kv, const ConfigNode& at) {
  if (const StepProfiles p = profiles_for(c, kv); !p.eager)
    at.fail(fmt::format(
        "engine.step_time: profile, but {} does not exist (memsim calibrate --backend cuda "
        "--model {}{}{} writes it)",
        p.path, c.model.name, tp_calibrate_flags(c.parallel),
        kv ? fmt::format(" --kv-cache-dtype {}", to_string(*kv)) : ""));
}

// `parallel:` (what serving models of it), the step profiles (a rank's under TP), and under TP
// the rank's shard and the collectives' times.
void load_parallel_and_step_time(const ConfigNode& root, const std::string& gpu_file,
                                 ServingConfig& c) {
  c.rank_model = c.model;
  if (auto p = root.find("parallel")) {
    c.parallel = load_parallel(*p, c.model, c.gpu);
  }
  const uint32_t tp = c.parallel.sizes.tensor, pp = c.parallel.sizes.pipeline;
  load_step_profiles(root, gpu_file, c);
  if (tp > 1) {
    c.rank_model = shard_tensor_parallel(c.model, tp)->rank;  // checked by load_parallel
    const bool custom =
        std::string_view(all_reduce_kind(c.parallel.sizes, c.parallel.comm)) == "custom";
    c.collectives =
        std::make_shared<const CollectiveTime>(*CollectiveTime::make(c.gpu, tp, custom));
    const char* roofline = "; each rank is priced by the roofline plus the collectives";
    for (auto& [kv, p] : c.profiles)
      if (!p.eager) p.note += roofline;
  }
  if (pp > 1) {
    auto t = PipelineTime::make(c.rank_model, c.gpu, pp, tp, c.collectives);
    if (!t.ok()) root["parallel"]["pipeline_parallel_size"].fail(t.error().message);
    c.pipeline = std::make_shared<const PipelineTime>(std::move(t).value());
    for (auto& [kv, p] : c.profiles) p.note += "; each step split over " + c.pipeline->source();
  }
}

}  // namespace

ServingConfig load_serving_config(const ConfigNode& root) {
  root.expect_keys(keys_at(serving_config_keys(), ""));
  if (auto runs = root.find("runs"); runs && runs->is_sequence())
    check_shadowed_overrides(root, runs->items());
  ServingConfig c;
  c.source = root.file();
  c.experiment = root["experiment"].as_plain_name();
  const std::string gpu_file = resolve_config_path(root["gpu"], root["gpu"].as_string(), "gpus");
  c.gpu = load_gpu_spec(ConfigNode::load_file(gpu_file));
  c.model = load_model_shape(ConfigNode::load_file(
      resolve_config_path(root["model"], root["model"].as_string(), "models")));
  load_parallel_and_step_time(root, gpu_file, c);
  // The calibrate command that writes a missing profile (the rank's under TP).
  const std::string calibrate = fmt::format("memsim calibrate --backend cuda --model {}{}",
                                            c.model.name, tp_calibrate_flags(c.parallel));
  if (auto sc = root.find("step_profile_scale")) {
    sc->expect_keys(keys_at(serving_config_keys(), "step_profile_scale"));
    if (const StepProfiles own = profiles_for(c, std::nullopt); !own.eager)
      sc->fail(fmt::format("scales the step profile, but {} does not exist ({} writes it)",
                           own.path, calibrate));
    const double d = sc->has("decode") ? (*sc)["decode"].as_double_in(0.01, 100) : 1.0;
    const double p = sc->has("prefill") ? (*sc)["prefill"].as_double_in(0.01, 100) : 1.0;
    c = with_profile_scale(std::move(c), d, p);
  }
  if (auto v = root.find("sample_interval_ms"))
    c.sample_interval = static_cast<SimTime>(v->as_double_in(0.001, 3.6e6) * 1e6);

  EngineSettings engine;
  if (auto e = root.find("engine")) engine = parse_engine(*e, engine);
  SchedulerChoice sched{schedulers().find("continuous_batching"), {}};
  if (auto s = root.find("seed")) sched.options.seed = s->as_uint();
  if (auto s = root.find("scheduler")) sched = parse_scheduler(*s, sched);
  std::optional<KvChoice> kv;
  if (auto k = root.find("kv")) kv = parse_kv(*k);
  std::optional<size_t> requests;
  // `--seed N` (the override seed=N) is the experiment's seed: it also draws every synthetic
  // request set, over its own requests.seed.
  std::optional<uint64_t> cli_seed;
  if (root.overridden("seed")) cli_seed = root["seed"].as_uint();
  auto add_requests = [&](const ConfigNode& node) {
    RequestsConfig rc = load_requests_config(node);
    if (cli_seed && rc.source == RequestSource::kSynthetic) rc.synthetic.seed = *cli_seed;
    c.request_sets.push_back(build_request_set(rc));
    return c.request_sets.size() - 1;
  };
  if (auto r = root.find("requests")) requests = add_requests(*r);

  auto make_run = [&](const std::optional<ConfigNode>& node) {
    ServingRunSpec run;
    EngineSettings e = engine;
    SchedulerChoice s = sched;
    std::optional<KvChoice> k = kv;
    std::optional<size_t> req = requests;
    if (node) {
      node->expect_keys(keys_at(serving_config_keys(), "runs[]"));
      if (auto v = node->find("engine")) e = parse_engine(*v, e);
      if (auto v = node->find("scheduler")) s = parse_scheduler(*v, s);
      if (auto v = node->find("kv")) k = parse_kv(*v);
      if (auto v = node->find("requests")) req = add_requests(*v);
      if (auto v = node->find("label")) run.label = v->as_string();
    }
    const ConfigNode& at = node ? *node : root;
    if (!k) at.fail("no `kv:` strategy (give one at the top level or in this run)");
    if (!req) at.fail("no `requests:` (give them at the top level or in this run)");
    if (s.options.async_scheduling && c.request_sets[*req].requests.any_parallel())
      async_scheduling_key(root, node)
          .fail(
              "async scheduling with requests of n > 1 or beams is not modelled: memsim "
              "steps a request's sequences together (vLLM V0), and vLLM V1's front-end runs "
              "each sample as its own request");
    if (s.options.preemption == Preemption::kFreeFront && !k->factory()->frees_front())
      preemption_key(root, node)
          .fail(fmt::format("preemption: free_front releases a request's earliest KV blocks, and "
                            "the KV strategy '{}' cannot (paged_block_pool can)",
                            k->impl));
    check_kv_groups(c, root, node, *k, e);
    run.kv_impl = k->impl;
    run.kv_params = k->params;
    run.kv_factory = k->factory;
    run.budget_block_size = k->block_size;
    run.scheduler = s.info->name;
    run.serve = s.options;
    run.serve.max_model_len = e.max_model_len;
    run.gpu_memory_utilization = e.gpu_memory_utilization;
    run.mem_fraction_static = e.mem_fraction_static;
    run.enforce_eager = e.enforce_eager;
    run.export_snapshot = e.export_snapshot;
    run.graph_memory = e.graph_memory;
    run.kv_budget_override = e.kv_budget;
    run.validate_content = e.validate_content;
    run.validate_sample = e.validate_sample;
    run.gpu_layers = e.gpu_layers;
    run.gpu_step = e.gpu_step;
    run.kv_cache_dtype = e.kv_cache_dtype;
    run.hybrid_kv_cache = e.hybrid_kv_cache;
    if (e.step_time == "profile") check_profile_exists(c, e.kv_cache_dtype, at);
    run.step_time = e.step_time;
    run.requests = *req;
    if (run.label.empty()) run.label = k->params.empty() ? k->impl : k->impl + " " + k->params;
    for (const ServingRunSpec& other : c.runs)
      if (other.label == run.label)
        at.fail(
            fmt::format("two runs are labelled '{}' (give each a distinct `label:`)", run.label));
    c.runs.push_back(std::move(run));
  };
  if (auto runs = root.find("runs")) {
    if (!runs->is_sequence() || runs->items().empty())
      runs->fail("must be a non-empty list of runs");
    for (const ConfigNode& r : runs->items()) make_run(r);
  } else {
    make_run(std::nullopt);
  }
  check_data_parallel_requests(root, c);
  return c;
}

ServingConfig with_profile_scale(ServingConfig c, double decode, double prefill) {
  const bool any = any_step_profile(c);
  for (auto& [kv, s] : c.profiles) {
    if (s.eager)
      s.eager = std::make_shared<const ProfiledStepTime>(
          scale_step_profile(s.eager->profile(), decode, prefill));
    if (s.graphs)
      s.graphs = std::make_shared<const StepProfile>(scale_step_profile(*s.graphs, decode, 1.0));
  }
  if (any) {
    c.profile_decode_scale *= decode;
    c.profile_prefill_scale *= prefill;
  }
  return c;
}

StepProfiles profiles_for(const ServingConfig& c, std::optional<DType> kv_cache_dtype) {
  auto it = c.profiles.find(kv_cache_dtype);
  return it != c.profiles.end() ? it->second : StepProfiles{};
}

bool any_step_profile(const ServingConfig& c) {
  return std::any_of(c.profiles.begin(), c.profiles.end(),
                     [](const auto& k) { return k.second.eager || k.second.graphs; });
}

ModelShape with_kv_cache_dtype(ModelShape model, std::optional<DType> kv) {
  model.kv_dtype = kv;
  return model;
}

namespace {

// The budget a serving run shows and sizes its pool by: under pipeline parallelism the stage
// with the fewest KV blocks (the engine's count, vLLM's minimum over workers), else the rank's.
Result<KvBudget> engine_budget(const KvBudgetInput& in) {
  if (in.parallel.pipeline <= 1) return compute_kv_budget(in);
  auto e = compute_engine_kv_budget(in);
  if (!e.ok()) return e.error();
  return e->stages[e->min_stage];
}

// Each run's spec and budget (serially, cached: most runs share one).
void set_budgets(const ServingConfig& c, ServingResults& out) {
  std::map<std::string, Result<KvBudget>> budgets;
  for (size_t i = 0; i < c.runs.size(); ++i) {
    const ServingRunSpec& r = c.runs[i];
    ServingRunResult& o = out.runs[i];
    o.spec = r;
    KvBudgetInput in;
    in.model = with_kv_cache_dtype(c.model, r.kv_cache_dtype);
    in.gpu = c.gpu;
    in.gpu_memory_utilization = r.gpu_memory_utilization;
    in.mem_fraction_static = r.mem_fraction_static;
    in.max_num_batched_tokens = r.serve.max_num_batched_tokens;
    in.max_num_seqs = r.serve.max_num_seqs;
    in.enforce_eager = r.enforce_eager;
    in.graph_strategy = r.enforce_eager ? "shared_pool" : r.graph_memory;
    in.max_model_len = r.serve.max_model_len;
    in.kv_block_size = r.budget_block_size;
    in.export_profile_snapshot = r.export_snapshot;
    in.hybrid_kv_cache = r.hybrid_kv_cache;
    in.parallel = c.parallel.sizes;
    in.comm = c.parallel.comm;
    const std::string key = fmt::format(
        "{}/{}/{}/{}/{}/{}/{}/{}/{}/{}/{}", in.mem_fraction_static, in.gpu_memory_utilization,
        in.max_num_batched_tokens, in.max_num_seqs, in.enforce_eager, in.graph_strategy,
        in.max_model_len, in.kv_block_size, in.export_profile_snapshot,
        to_string(in.model.kv_cache_dtype()), in.hybrid_kv_cache);
    auto it = budgets.find(key);
    if (it == budgets.end()) it = budgets.emplace(key, engine_budget(in)).first;
    if (it->second.ok()) {
      o.budget = *it->second;
    } else {
      o.budget_error = it->second.error().message;
    }
    if (r.kv_budget_override) {
      o.budget.kv_bytes = r.kv_budget_override;
      o.budget_error.clear();
    }
  }
}

}  // namespace

ServingResults run_serving_experiment(const ServingConfig& c, const ServingRunHooks& hooks) {
  ServingResults out;
  out.runs.resize(c.runs.size());
  const auto wall0 = std::chrono::steady_clock::now();
  set_budgets(c, out);

  // Runs in parallel: each has its own backend, clock, strategy and state.
  std::vector<char> out_of_memory(c.runs.size(), 0);
  parallel_for(c.runs.size(), hooks.serial ? 1 : 0, [&](size_t i) {
    ServingRunResult& o = out.runs[i];
    const RequestTable& requests = c.request_sets[o.spec.requests].requests;
    const EngineProgress ended{requests.size(), requests.size(), 0};
    if (!o.budget_error.empty()) {
      if (hooks.progress) hooks.progress(i, ended);
      return;
    }
    if (hooks.run_elsewhere) {
      hooks.run_elsewhere(i, o);
      if (hooks.failed && !o.result.error.empty()) hooks.failed(o.spec, o.result.error);
      if (hooks.progress) hooks.progress(i, ended);
      return;
    }
    EngineConfig e;
    e.label = o.spec.label;
    const ModelShape rank_model = with_kv_cache_dtype(c.rank_model, o.spec.kv_cache_dtype);
    e.model = rank_model;
    e.gpu = c.gpu;
    e.collectives = c.collectives;
    e.pipeline = c.pipeline;
    if (c.pipeline) {
      // The stage with the fewest blocks; under engine.kv_budget (the same bytes on every
      // stage), the one with the most layers: the first (split_pipeline).
      PipelineStage stage = o.budget.stage;
      if (o.spec.kv_budget_override || stage.layers == 0)
        stage = split_pipeline(rank_model.layers, c.parallel.sizes.pipeline)->front();
      e.kv_model = stage_model(rank_model, stage);
    }
    e.scheduler = o.spec.scheduler;
    e.serve = o.spec.serve;
    e.kv_impl = o.spec.kv_impl;
    e.kv_factory = o.spec.kv_factory;
    e.kv_budget_bytes = o.budget.kv_bytes;
    e.hybrid_kv_cache = o.spec.hybrid_kv_cache;
    e.sample_interval = c.sample_interval;
    if (!o.spec.enforce_eager) e.graph_sizes = o.budget.capture_sizes;
    // The profiles of the run's KV cache dtype (an fp8 cache's own: half the KV bytes a step);
    // without them, the roofline.
    const StepProfiles prof = profiles_for(c, o.spec.kv_cache_dtype);
    if (o.spec.step_time != "roofline") e.step_profile = prof.eager;
    if (e.step_profile && prof.graphs && !e.graph_sizes.empty())
      e.step_profile = std::make_shared<const ProfiledStepTime>(
          prof.eager->profile(), prof.graphs, e.graph_sizes,
          graph_rows_at_once(rank_model, c.gpu, e.graph_sizes, o.spec.serve.max_model_len));
    if (o.spec.validate_content) e.executor = [] { return std::make_unique<ContentExecutor>(); };
    e.validate_sample = o.spec.validate_sample;
    if (hooks.customize) hooks.customize(o.spec, e);
    if (hooks.progress) e.progress = [&hooks, i](const EngineProgress& p) { hooks.progress(i, p); };
    try {
      if (c.parallel.sizes.data > 1 && hooks.customize) {
        o.result.label = o.spec.label;
        o.result.error = "data parallelism is simulated only (--backend sim)";
      } else if (c.parallel.sizes.data > 1) {
        DpServingResult dp = run_serving_dp(e, requests, c.parallel.sizes.data);
        o.result = std::move(dp.merged);
        o.replicas = std::move(dp.replicas);
        o.assigned = std::move(dp.assigned);
      } else {
        o.result = run_serving(e, requests);
      }
    } catch (const std::bad_alloc&) {
      o.result = ServingResult();  // frees what the run held
      out_of_memory[i] = 1;
    }
    if (hooks.failed && (out_of_memory[i] || !o.result.error.empty()))
      hooks.failed(o.spec, out_of_memory[i] ? "out of host memory" : o.result.error);
    if (hooks.progress) hooks.progress(i, ended);
  });
  for (size_t i = 0; i < c.runs.size(); ++i)
    if (out_of_memory[i])
      throw HostMemoryError(fmt::format(
          "memsim: out of host memory while simulating run '{}' ({} requests; {} available "
          "now)",
          c.runs[i].label, c.request_sets[c.runs[i].requests].requests.size(),
          format_host_bytes(host_memory_available().bytes)));
  out.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return out;
}

PredictionBand prediction_band(const ServingConfig& config, const ServingResults& base, double rel,
                               int steps) {
  PredictionBand band;
  band.rel = rel;
  if (!(rel > 0 && rel < 1) || steps < 1)
    throw std::invalid_argument("prediction_band: rel must be in (0, 1) and steps at least 1");
  if (!any_step_profile(config)) return band;
  const auto failed = [](const ServingRunResult& r) {
    return !r.budget_error.empty() || !r.result.error.empty();
  };
  band.runs.resize(base.runs.size());
  for (size_t i = 0; i < base.runs.size(); ++i) {
    PredictionBand::Run& b = band.runs[i];
    b.ok = !failed(base.runs[i]);
    for (size_t m = 0; m < kServingMetricCount; ++m)
      b.lo[m] = b.hi[m] = kServingMetrics[m].of(base.runs[i].result);
  }
  for (int k = -steps; k <= steps; ++k) {
    if (k == 0) continue;
    const double f = 1 + k * rel / steps;
    const ServingResults r = run_serving_experiment(with_profile_scale(config, f, f));
    for (size_t i = 0; i < band.runs.size() && i < r.runs.size(); ++i) {
      PredictionBand::Run& b = band.runs[i];
      if (failed(r.runs[i])) b.ok = false;
      for (size_t m = 0; m < kServingMetricCount; ++m) {
        const double v = kServingMetrics[m].of(r.runs[i].result);
        b.lo[m] = std::min(b.lo[m], v);
        b.hi[m] = std::max(b.hi[m], v);
      }
    }
  }
  return band;
}

}  // namespace memsim
