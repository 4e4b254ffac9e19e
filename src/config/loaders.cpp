// GPU-spec and model-shape loaders with full key validation.
#include "src/config/loaders.h"

#include "workload/pipeline_parallel.h"

#include <fmt/format.h>
#include <algorithm>
#include <cstdlib>
#include <filesystem>

namespace memsim {
namespace fs = std::filesystem;

namespace {

std::vector<std::string> primitive_names() {
  std::vector<std::string> out;
  for (size_t i = 0; i < static_cast<size_t>(Primitive::kCount); ++i)
    out.emplace_back(to_string(static_cast<Primitive>(i)));
  return out;
}

}  // namespace

const ConfigKeys& gpu_file_keys() {
  static const ConfigKeys kKeys = {
      {"",
       {"name", "capacity", "context", "granularity", "va_space", "va_mappings_knee", "graphs",
        "costs", "compute", "interconnect", "unified_memory"}},
      {"unified_memory", {"first_touch_page", "host_reserved"}},
      {"graphs",
       {"capture_per_node_us", "instantiate_per_node_us", "upload_per_node_us",
        "mem_map_per_granule_us", "mem_remap_per_granule_us", "mem_chunk"}},
      {"costs", primitive_names()},
      {"costs.<primitive>",
       {"per_call_us", "per_handle_us", "per_granule_us", "bytes_per_us", "per_log2_mappings_us",
        "first_after_launch_us"}},
      {"compute",
       {"dense_tflops", "hbm_gbps", "pcie_gbps", "flops_efficiency", "bandwidth_efficiency",
        "step_overhead_us", "sms", "decode_ctas_per_sm"}},
      {"interconnect",
       {"gpus_per_node", "nccl_version", "nccl_memory", "nccl_memory_ranks", "nccl_memory_by_rank",
        "collective_sizes", "all_reduce_us", "all_gather_us", "custom_all_reduce_us",
        "send_recv_us"}},
      {"interconnect.nccl_memory", {"cumem", "no_cumem"}},
      {"interconnect.nccl_memory_by_rank.<ranks>", {"cumem", "no_cumem"}},
      {"interconnect.nccl_memory.<env>", {"communicator", "collectives", "point_to_point"}},
  };
  return kKeys;
}

const ConfigKeys& model_file_keys() {
  static const ConfigKeys kKeys = {
      {"",
       {"name", "layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab",
        "dtype", "tie_embeddings", "qkv_bias", "qk_norm", "rope_theta", "rms_norm_eps",
        "rope_scaling", "sliding_window", "sliding_window_pattern"}},
      {"rope_scaling",
       {"rope_type", "factor", "low_freq_factor", "high_freq_factor",
        "original_max_position_embeddings"}},
  };
  return kKeys;
}

namespace {

CostTerm load_cost_term(const ConfigNode& n) {
  n.expect_keys(keys_at(gpu_file_keys(), "costs.<primitive>"));
  CostTerm t;
  if (auto v = n.find("per_call_us")) t.per_call_us = v->as_double_in(0, 1e9);
  if (auto v = n.find("per_handle_us")) t.per_handle_us = v->as_double_in(0, 1e9);
  if (auto v = n.find("per_granule_us")) t.per_granule_us = v->as_double_in(0, 1e9);
  if (auto v = n.find("bytes_per_us")) t.bytes_per_us = v->as_double_in(0, 1e15);
  if (auto v = n.find("per_log2_mappings_us")) t.per_log2_mappings_us = v->as_double_in(0, 1e9);
  if (auto v = n.find("first_after_launch_us")) t.first_after_launch_us = v->as_double_in(0, 1e9);
  return t;
}

constexpr double kTera = 1e12;
constexpr double kGiga = 1e9;

ComputeSpec load_compute_spec(const ConfigNode& n) {
  n.expect_keys(keys_at(gpu_file_keys(), "compute"));
  ComputeSpec c;
  c.peak_flops = n["dense_tflops"].as_double_in(1e-3, 1e6) * kTera;
  c.hbm_bytes_per_s = n["hbm_gbps"].as_double_in(1e-3, 1e7) * kGiga;
  c.pcie_bytes_per_s = n["pcie_gbps"].as_double_in(1e-3, 1e6) * kGiga;
  c.flops_efficiency = ComputeSpec::kDefaultFlopsEfficiency;
  c.bandwidth_efficiency = ComputeSpec::kDefaultBandwidthEfficiency;
  c.step_overhead_us = ComputeSpec::kDefaultStepOverheadUs;
  if (auto v = n.find("flops_efficiency")) c.flops_efficiency = v->as_double_in(1e-3, 1);
  if (auto v = n.find("bandwidth_efficiency")) c.bandwidth_efficiency = v->as_double_in(1e-3, 1);
  if (auto v = n.find("step_overhead_us")) c.step_overhead_us = v->as_double_in(0, 1e6);
  if (auto v = n.find("sms")) c.sms = static_cast<uint32_t>(v->as_uint_in(1, 100000));
  if (auto v = n.find("decode_ctas_per_sm"))
    c.decode_ctas_per_sm = static_cast<uint32_t>(v->as_uint_in(1, 64));
  return c;
}

InterconnectSpec::NcclMemory load_nccl_memory(const ConfigNode& n) {
  n.expect_keys(keys_at(gpu_file_keys(), "interconnect.nccl_memory.<env>"));
  return {n["communicator"].as_bytes(), n["collectives"].as_bytes(),
          n["point_to_point"].as_bytes()};
}

// A map key that is a rank count, 2 to gpus_per_node (else an error at `row`).
uint32_t rank_count_key(const ConfigNode& row, const std::string& key, uint32_t gpus_per_node) {
  char* end = nullptr;
  const unsigned long ranks = std::strtoul(key.c_str(), &end, 10);
  if (end == key.c_str() || *end != '\0' || ranks < 2 || ranks > gpus_per_node)
    row.fail(
        fmt::format("the key must be a rank count from 2 to gpus_per_node ({})", gpus_per_node));
  return static_cast<uint32_t>(ranks);
}

// `{RANKS: {cumem: [bytes per rank], no_cumem: [...]}, ...}`: NCCL's memory rank by rank.
void load_nccl_by_rank(const ConfigNode& n, InterconnectSpec& ic) {
  if (!n.is_map())
    n.fail("must map a rank count to its per-rank figures, e.g. {4: {no_cumem: [...]}}");
  for (const std::string& key : n.keys()) {
    const ConfigNode row = n[key];
    const uint32_t ranks = rank_count_key(row, key, ic.gpus_per_node);
    row.expect_keys(keys_at(gpu_file_keys(), "interconnect.nccl_memory_by_rank.<ranks>"));
    for (const char* env : {"cumem", "no_cumem"}) {
      auto figures = row.find(env);
      if (!figures) continue;
      std::vector<uint64_t> bytes;
      for (const ConfigNode& v : figures->items()) bytes.push_back(v.as_bytes());
      if (bytes.size() != ranks)
        figures->fail(
            fmt::format("has {} figures for {} ranks (one per rank)", bytes.size(), ranks));
      (std::string(env) == "cumem" ? ic.nccl_by_rank_cumem : ic.nccl_by_rank_no_cumem)[ranks] =
          std::move(bytes);
    }
  }
}

// `{RANKS: [us, ...], ...}`: one time per collective size, positive, for rank counts >= 2.
std::map<uint32_t, std::vector<double>> load_collective_times(const ConfigNode& n, size_t sizes,
                                                              uint32_t gpus_per_node,
                                                              const char* sizes_name) {
  if (!n.is_map()) n.fail("must map a rank count to its times, e.g. {2: [9.1, ...]}");
  std::map<uint32_t, std::vector<double>> out;
  for (const std::string& key : n.keys()) {
    const ConfigNode row = n[key];
    const uint32_t ranks = rank_count_key(row, key, gpus_per_node);
    const std::vector<ConfigNode> items = row.items();
    if (items.size() != sizes)
      row.fail(fmt::format("has {} times; {} has {}", items.size(), sizes_name, sizes));
    std::vector<double>& us = out[ranks];
    for (const ConfigNode& v : items) us.push_back(v.as_double_in(1e-3, 1e9));
  }
  if (out.empty()) n.fail("needs at least one rank count");
  return out;
}

InterconnectSpec load_interconnect(const ConfigNode& n) {
  n.expect_keys(keys_at(gpu_file_keys(), "interconnect"));
  InterconnectSpec ic;
  ic.gpus_per_node = static_cast<uint32_t>(n["gpus_per_node"].as_uint_in(1, 1024));
  ic.nccl_version = n["nccl_version"].as_string();
  const ConfigNode mem = n["nccl_memory"];
  mem.expect_keys(keys_at(gpu_file_keys(), "interconnect.nccl_memory"));
  ic.nccl_cumem = load_nccl_memory(mem["cumem"]);
  ic.nccl_no_cumem = load_nccl_memory(mem["no_cumem"]);
  ic.nccl_memory_ranks = static_cast<uint32_t>(n["nccl_memory_ranks"].as_uint_in(2, 1024));
  if (auto v = n.find("nccl_memory_by_rank")) load_nccl_by_rank(*v, ic);
  const ConfigNode sizes = n["collective_sizes"];
  for (const ConfigNode& v : sizes.items()) {
    const uint64_t b = v.as_bytes();
    if (b == 0 || (!ic.collective_sizes.empty() && b <= ic.collective_sizes.back()))
      v.fail("collective sizes must be positive and ascending");
    ic.collective_sizes.push_back(b);
  }
  if (ic.collective_sizes.size() < 2) sizes.fail("needs at least two sizes");
  const size_t count = ic.collective_sizes.size();
  ic.all_reduce_us =
      load_collective_times(n["all_reduce_us"], count, ic.gpus_per_node, "collective_sizes");
  ic.all_gather_us =
      load_collective_times(n["all_gather_us"], count, ic.gpus_per_node, "collective_sizes");
  if (auto v = n.find("custom_all_reduce_us")) {
    const size_t below = custom_all_reduce_sizes(ic);
    if (below < 2)
      v->fail("needs at least two collective_sizes under the custom all-reduce's 8 MiB");
    ic.custom_all_reduce_us =
        load_collective_times(*v, below, ic.gpus_per_node, "collective_sizes under 8 MiB");
  }
  if (auto v = n.find("send_recv_us")) {
    const std::vector<ConfigNode> items = v->items();
    if (items.size() != count)
      v->fail(fmt::format("has {} times; collective_sizes has {}", items.size(), count));
    for (const ConfigNode& t : items) ic.send_recv_us.push_back(t.as_double_in(1e-3, 1e9));
  }
  return ic;
}

}  // namespace

std::string format_compute_yaml(const ComputeSpec& c) {
  return fmt::format(
      "compute:\n  dense_tflops: {}\n  hbm_gbps: {}\n  pcie_gbps: {}\n  flops_efficiency: {}\n"
      "  bandwidth_efficiency: {}\n  step_overhead_us: {}\n  {:<24}# {}\n  {:<24}# {}\n",
      c.peak_flops / kTera, c.hbm_bytes_per_s / kGiga, c.pcie_bytes_per_s / kGiga,
      c.flops_efficiency, c.bandwidth_efficiency, c.step_overhead_us, fmt::format("sms: {}", c.sms),
      "what the attention planner sees (query_device on the GPU)",
      fmt::format("decode_ctas_per_sm: {}", c.decode_ctas_per_sm),
      "resident decode CTAs per SM (occupancy of the decode kernel)");
}

GpuSpec load_gpu_spec(const ConfigNode& node) {
  node.expect_keys(keys_at(gpu_file_keys(), ""));
  GpuSpec g;
  g.name = node["name"].as_string();
  g.capacity = node["capacity"].as_bytes();
  g.granularity = node["granularity"].as_bytes();
  if (g.granularity == 0 || (g.granularity & (g.granularity - 1)) != 0)
    node["granularity"].fail("must be a power of two");
  if (g.capacity < g.granularity) node["capacity"].fail("must be at least one granule");
  // Required: a file without it would silently give the process the context's memory.
  const ConfigNode context = node["context"];
  g.context = context.as_bytes();
  if (g.context >= g.capacity) context.fail("must be less than the capacity");
  g.va_space = node["va_space"].as_bytes();
  if (g.va_space < g.capacity) node["va_space"].fail("must be at least the capacity");
  if (auto v = node.find("va_mappings_knee")) g.va_mappings_knee = v->as_double_in(1e-3, 1e9);
  const ConfigNode graphs = node["graphs"];
  graphs.expect_keys(keys_at(gpu_file_keys(), "graphs"));
  g.capture_per_node_us = graphs["capture_per_node_us"].as_double_in(0, 1e6);
  g.instantiate_per_node_us = graphs["instantiate_per_node_us"].as_double_in(0, 1e6);
  g.upload_per_node_us = graphs["upload_per_node_us"].as_double_in(0, 1e6);
  g.graph_mem_map_per_granule_us = graphs["mem_map_per_granule_us"].as_double_in(0, 1e6);
  g.graph_mem_remap_per_granule_us = graphs["mem_remap_per_granule_us"].as_double_in(0, 1e6);
  if (auto c = graphs.find("mem_chunk")) {
    g.graph_mem_chunk = c->as_bytes();
    if (g.graph_mem_chunk % g.granularity != 0) c->fail("must be a multiple of the granularity");
  }
  const ConfigNode costs = node["costs"];
  const std::vector<std::string>& names = keys_at(gpu_file_keys(), "costs");
  costs.expect_keys(names);
  // Every primitive is priced: a term left out would cost nothing without a word. One that is
  // free on purpose says so with a zero term.
  std::vector<std::string> missing;
  for (size_t i = 0; i < names.size(); ++i) {
    if (auto c = costs.find(names[i]))
      g.costs[i] = load_cost_term(*c);
    else
      missing.push_back(names[i]);
  }
  if (!missing.empty())
    costs.fail(fmt::format(
        "no cost for {} of the {} primitives: {} (every primitive needs a term; `{}: "
        "{{per_call_us: 0}}` prices one at 0 on purpose; memsim calibrate measures them)",
        missing.size(), names.size(), fmt::join(missing, ", "), missing.front()));
  g.compute = load_compute_spec(node["compute"]);
  if (auto ic = node.find("interconnect")) g.interconnect = load_interconnect(*ic);
  if (auto um = node.find("unified_memory")) {
    um->expect_keys(keys_at(gpu_file_keys(), "unified_memory"));
    g.unified.enabled = true;
    const ConfigNode page = (*um)["first_touch_page"];
    g.unified.first_touch_page = page.as_bytes();
    const uint64_t p = g.unified.first_touch_page;
    if (p == 0 || (p & (p - 1)) != 0 || p > g.granularity)
      page.fail(fmt::format("must be a power of two of at most the granularity ({} bytes)",
                            g.granularity));
    if (auto v = um->find("host_reserved")) {
      g.unified.host_reserved = v->as_bytes();
      if (g.unified.host_reserved >= g.capacity) v->fail("must be less than the capacity");
    }
  }
  return g;
}

ModelShape load_model_shape(const ConfigNode& node) {
  node.expect_keys(keys_at(model_file_keys(), ""));
  ModelShape m;
  m.name = node["name"].as_string();
  m.layers = static_cast<uint32_t>(node["layers"].as_uint_in(1, 1024));
  m.hidden = node["hidden"].as_uint_in(1, 1 << 20);
  m.heads = static_cast<uint32_t>(node["heads"].as_uint_in(1, 4096));
  m.kv_heads = static_cast<uint32_t>(node["kv_heads"].as_uint_in(1, 4096));
  if (m.heads % m.kv_heads != 0) node["kv_heads"].fail("must divide heads");
  m.head_dim = node["head_dim"].as_uint_in(1, 4096);
  m.intermediate = node["intermediate"].as_uint_in(1, 1 << 22);
  m.vocab = node["vocab"].as_uint_in(1, 1 << 24);
  const std::string dt = node["dtype"].as_choice({"bf16", "fp16", "fp32", "fp8"});
  m.dtype = dt == "bf16"   ? DType::kBF16
            : dt == "fp16" ? DType::kFP16
            : dt == "fp32" ? DType::kFP32
                           : DType::kFP8;
  if (auto v = node.find("tie_embeddings")) m.tie_embeddings = v->as_bool();
  if (auto v = node.find("qkv_bias")) m.qkv_bias = v->as_bool();
  if (auto v = node.find("qk_norm")) m.qk_norm = v->as_bool();
  if (auto v = node.find("rope_theta")) m.rope_theta = v->as_double_in(1, 1e12);
  if (auto v = node.find("rms_norm_eps")) m.rms_norm_eps = v->as_double_in(1e-12, 1e-1);
  if (auto v = node.find("rope_scaling")) {
    v->expect_keys(keys_at(model_file_keys(), "rope_scaling"));
    (void)(*v)["rope_type"].as_choice({"llama3"});
    auto& r = m.rope_scaling;
    r.factor = (*v)["factor"].as_double_in(1, 1e6);
    if (auto f = v->find("low_freq_factor")) r.low_freq_factor = f->as_double_in(1e-6, 1e6);
    if (auto f = v->find("high_freq_factor")) r.high_freq_factor = f->as_double_in(1e-6, 1e6);
    if (r.high_freq_factor <= r.low_freq_factor)
      (*v)["high_freq_factor"].fail("must exceed low_freq_factor");
    if (auto f = v->find("original_max_position_embeddings"))
      r.original_max_position = f->as_uint_in(1, 1ull << 32);
  }
  // Sliding-window attention: the window in tokens, and which layers slide (every layer, or all
  // but every N-th with sliding_window_pattern N, as Gemma 2 and 3 name it).
  if (auto v = node.find("sliding_window"))
    m.sliding_window = static_cast<uint32_t>(v->as_uint_in(2, 1u << 24));
  if (auto v = node.find("sliding_window_pattern")) {
    if (!m.sliding_window)
      v->fail("needs sliding_window (the layers it marks slide over a window)");
    m.sliding_window_pattern = static_cast<uint32_t>(v->as_uint_in(2, 1024));
    if (m.sliding_window_pattern > m.layers)
      v->fail(fmt::format("a pattern of {} layers leaves none of the {} layers full attention",
                          m.sliding_window_pattern, m.layers));
  }
  return m;
}

const std::vector<std::string>& parallel_keys() {
  static const std::vector<std::string> kKeys = {"tensor_parallel_size", "pipeline_parallel_size",
                                                 "data_parallel_size", "custom_all_reduce",
                                                 "nccl_cumem"};
  return kKeys;
}

void check_tensor_parallel(const ConfigNode& at, uint32_t tp, const ModelShape& model,
                           const GpuSpec& gpu) {
  if (Result<TensorParallelShard> shard = shard_tensor_parallel(model, tp); !shard.ok())
    at.fail(shard.error().message);
  if (Result<CollectiveTime> c = CollectiveTime::make(gpu, tp); !c.ok()) at.fail(c.error().message);
}

void check_pipeline_parallel(const ConfigNode& at, uint32_t tp, uint32_t pp,
                             const ModelShape& model, const GpuSpec& gpu) {
  if (Result<std::vector<PipelineStage>> s = split_pipeline(model.layers, pp); !s.ok())
    at.fail(fmt::format("{}: {}", model.name, s.error().message));
  if (pp > 1)
    if (Result<CollectiveTime> c = CollectiveTime::make(gpu, tp * pp); !c.ok())
      at.fail(fmt::format("tensor_parallel_size {} x pipeline_parallel_size {}: {}", tp, pp,
                          c.error().message));
}

ParallelSettings load_parallel(const ConfigNode& node, const ModelShape& model,
                               const GpuSpec& gpu) {
  node.expect_keys(parallel_keys());
  ParallelSettings p;
  if (auto v = node.find("tensor_parallel_size")) {
    p.sizes.tensor = static_cast<uint32_t>(v->as_uint_in(1, 1024));
    check_tensor_parallel(*v, p.sizes.tensor, model, gpu);
  }
  if (auto v = node.find("pipeline_parallel_size")) {
    p.sizes.pipeline = static_cast<uint32_t>(v->as_uint_in(1, 1024));
    check_pipeline_parallel(*v, p.sizes.tensor, p.sizes.pipeline, model, gpu);
  }
  if (auto v = node.find("data_parallel_size")) {
    p.sizes.data = static_cast<uint32_t>(v->as_uint_in(1, 1024));
    if (p.sizes.data > 1)
      if (Result<CollectiveTime> c = CollectiveTime::make(gpu, p.sizes.gpus()); !c.ok())
        v->fail(
            fmt::format("tensor_parallel_size {} x pipeline_parallel_size {} x "
                        "data_parallel_size {}: {}",
                        p.sizes.tensor, p.sizes.pipeline, p.sizes.data, c.error().message));
  }
  if (auto v = node.find("custom_all_reduce")) p.comm.custom_all_reduce = v->as_bool();
  if (auto v = node.find("nccl_cumem")) p.comm.nccl_cumem = v->as_bool();
  return p;
}

std::vector<fs::path> installation_roots() {
  std::vector<fs::path> roots;
  if (const char* root = std::getenv("MEMSIM_ROOT"); root != nullptr && *root != '\0')
    roots.emplace_back(root);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path prefix = exe.parent_path().parent_path();
    roots.push_back(prefix);
    roots.push_back(prefix / "share" / "memsim");
  }
  return roots;
}

std::vector<fs::path> reference_candidates(const ConfigNode& at, const fs::path& rel) {
  const fs::path base(at.base_dir());
  std::vector<fs::path> out = {base / rel, base / ".." / rel};
  for (const fs::path& root : installation_roots()) out.push_back(root / rel);
  out.push_back(rel);  // the current folder
  return out;
}

std::vector<fs::path> config_dirs(const ConfigNode& at, const std::string& kind) {
  std::vector<fs::path> dirs;
  for (const fs::path& p : reference_candidates(at, fs::path("configs") / kind / "x.yaml"))
    dirs.push_back(p.parent_path());
  return dirs;
}

namespace {

// The first of `dirs` that exists, and the names of the *.yaml files in it.
std::pair<fs::path, std::vector<std::string>> known_names(const std::vector<fs::path>& dirs) {
  for (const fs::path& d : dirs) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) continue;
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(d, ec))
      if (e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
    std::sort(names.begin(), names.end());
    return {d.lexically_normal(), names};
  }
  return {};
}

}  // namespace

std::string resolve_config_path(const ConfigNode& at, const std::string& ref,
                                const std::string& kind) {
  const std::string ext = fs::path(ref).extension().string();
  const bool bare = ref.find('/') == std::string::npos && ext != ".yaml" && ext != ".yml";
  const fs::path given(ref);
  const std::vector<fs::path> candidates =
      given.is_absolute()
          ? std::vector<fs::path>{given}
          : reference_candidates(at, bare ? fs::path("configs") / kind / (ref + ".yaml") : given);
  std::string why;
  if (auto found = first_regular_file(candidates, &why)) return found->lexically_normal().string();
  const std::string os = why.empty() ? std::string() : ": " + why;
  if (bare) {
    const auto [dir, known] = known_names(config_dirs(at, kind));
    if (dir.empty())
      at.fail(
          fmt::format("unknown {} config '{}' (no configs/{}/ beside the config, in its "
                      "project or in the installation){}",
                      kind, ref, kind, os));
    const std::string near = closest_match(ref, known);
    at.fail(fmt::format("unknown {} config '{}'{}; known in {}: {}{}", kind, ref,
                        near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near),
                        dir.string(), fmt::join(known, ", "), os));
  }
  at.fail(fmt::format("cannot find {} config '{}' (looked in {}){}", kind, ref,
                      candidates.front().lexically_normal().string(), os));
}

std::optional<fs::path> first_regular_file(const std::vector<fs::path>& candidates,
                                           std::string* os_reason) {
  for (const fs::path& p : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p;
    if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory &&
        os_reason->empty())
      *os_reason = ec.message();
  }
  return std::nullopt;
}

}  // namespace memsim
