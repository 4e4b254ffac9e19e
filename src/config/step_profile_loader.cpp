// Step-time profile files: typed load with located errors, YAML write, file location.
#include "src/config/step_profile_loader.h"
#include "src/config/loaders.h"

#include <fmt/format.h>

#include <filesystem>

namespace memsim {

const ConfigKeys& step_profile_keys() {
  static const ConfigKeys kKeys = {
      {"",
       {"gpu", "model", "mode", "tensor_parallel", "all_reduce", "kv_cache_dtype", "measured",
        "decode", "prefill"}},
      {"decode[]", {"batch", "contexts", "ms"}},
      {"prefill[]", {"chunk", "prefixes", "ms"}},
  };
  return kKeys;
}

namespace {

// The rows of the list at `path` (decode[] or prefill[]), whose keys are its size key (batch,
// chunk), its points key (contexts, prefixes) and ms, in that order.
std::vector<ProfileRow> load_rows(const ConfigNode& list, std::string_view path) {
  const std::vector<std::string>& keys = keys_at(step_profile_keys(), path);
  const std::string& size_key = keys.at(0);
  const std::string& points_key = keys.at(1);
  std::vector<ProfileRow> rows;
  for (const ConfigNode& item : list.items()) {
    item.expect_keys(keys);
    ProfileRow r;
    r.size = static_cast<uint32_t>(item[size_key].as_uint_in(1, 1u << 24));
    for (const ConfigNode& p : item[points_key].items())
      r.points.push_back(static_cast<uint32_t>(p.as_uint_in(0, 1u << 24)));
    for (const ConfigNode& t : item["ms"].items()) r.ms.push_back(t.as_double_in(1e-6, 1e9));
    if (r.points.size() != r.ms.size())
      item["ms"].fail(fmt::format("{} times for {} {}", r.ms.size(), r.points.size(), points_key));
    for (size_t j = 1; j < r.points.size(); ++j)
      if (r.points[j] <= r.points[j - 1]) item[points_key].fail("must ascend");
    if (r.points.empty()) item[points_key].fail("must list at least one value");
    if (!rows.empty() && r.size <= rows.back().size)
      item[size_key].fail(fmt::format("rows must ascend ({} after {})", r.size, rows.back().size));
    rows.push_back(std::move(r));
  }
  return rows;
}

std::string list(const std::vector<uint32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", v[i]);
  return s;
}
std::string list(const std::vector<double>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{:.4f}", i ? ", " : "", v[i]);
  return s;
}

}  // namespace

StepProfile load_step_profile(const ConfigNode& node) {
  node.expect_keys(keys_at(step_profile_keys(), ""));
  StepProfile p;
  p.gpu = node["gpu"].as_string();
  p.model = node["model"].as_string();
  if (auto v = node.find("mode")) p.mode = v->as_choice({"eager", "graphs"});
  if (auto v = node.find("tensor_parallel"))
    p.tensor_parallel = static_cast<uint32_t>(v->as_uint_in(1, 1024));
  if (auto v = node.find("all_reduce")) p.all_reduce = v->as_choice({"nccl", "custom"});
  if (auto v = node.find("kv_cache_dtype"))
    p.kv_cache_dtype = kv_cache_dtype_from_name(v->as_choice(kv_cache_dtype_names()));
  if (auto v = node.find("measured")) p.measured = v->as_string();
  p.decode = load_rows(node["decode"], "decode[]");
  if (p.decode.empty()) node["decode"].fail("must list at least one row");
  if (auto v = node.find("prefill")) p.prefill = load_rows(*v, "prefill[]");
  return p;
}

std::string format_step_profile(const StepProfile& p, const std::vector<std::string>& header) {
  std::string o;
  for (const std::string& h : header) o += "# " + h + "\n";
  o += fmt::format("gpu: {}\nmodel: {}\nmode: {}\n", p.gpu, p.model, p.mode);
  if (p.tensor_parallel > 1)
    o += fmt::format("tensor_parallel: {}\nall_reduce: {}\n", p.tensor_parallel, p.all_reduce);
  if (p.kv_cache_dtype) o += fmt::format("kv_cache_dtype: {}\n", to_string(*p.kv_cache_dtype));
  o += fmt::format("measured: \"{}\"\n", p.measured);
  o += "decode:    # one new token per sequence: step ms by batch x context tokens per sequence\n";
  for (const ProfileRow& r : p.decode)
    o += fmt::format("  - {{batch: {}, contexts: [{}], ms: [{}]}}\n", r.size, list(r.points),
                     list(r.ms));
  if (!p.prefill.empty()) {
    o += "prefill:   # one sequence's chunk: step ms by chunk tokens x cached prefix tokens\n";
    for (const ProfileRow& r : p.prefill)
      o += fmt::format("  - {{chunk: {}, prefixes: [{}], ms: [{}]}}\n", r.size, list(r.points),
                       list(r.ms));
  }
  return o;
}

std::string step_profile_file(const std::string& model, bool graphs, uint32_t tensor_parallel,
                              std::optional<DType> kv_cache_dtype) {
  return model + (tensor_parallel > 1 ? fmt::format(".tp{}", tensor_parallel) : "") +
         (kv_cache_dtype ? fmt::format(".{}", to_string(*kv_cache_dtype)) : "") +
         (graphs ? ".graphs.yaml" : ".yaml");
}

std::string step_profile_path(const std::string& gpu_file, const std::string& model, bool graphs,
                              uint32_t tensor_parallel, std::optional<DType> kv_cache_dtype) {
  const std::filesystem::path g(gpu_file);
  return (g.parent_path() / (g.stem().string() + ".profiles") /
          step_profile_file(model, graphs, tensor_parallel, kv_cache_dtype))
      .string();
}

ProfileLocation find_step_profile(const ConfigNode& at, const std::string& gpu_file,
                                  const std::string& gpu_name, const std::string& model,
                                  bool graphs, uint32_t tensor_parallel,
                                  std::optional<DType> kv_cache_dtype) {
  namespace fs = std::filesystem;
  const std::string file = step_profile_file(model, graphs, tensor_parallel, kv_cache_dtype);
  const fs::path beside =
      step_profile_path(gpu_file, model, graphs, tensor_parallel, kv_cache_dtype);
  std::vector<fs::path> by_name;
  for (const fs::path& d : config_dirs(at, "gpus"))
    by_name.push_back(d / (gpu_name + ".profiles") / file);
  std::string os_reason;
  if (first_regular_file({beside}, &os_reason)) return {beside.string(), ""};
  if (auto found = first_regular_file(by_name, &os_reason)) {
    const std::string p = found->lexically_normal().string();
    return {p,
            fmt::format("found by the GPU's name {}: there is none beside {}", gpu_name, gpu_file)};
  }
  // Where it looked: beside the GPU file, and under configs/gpus/ by the GPU's name (one path
  // when those are the same).
  const std::string named = (fs::path("configs/gpus") / (gpu_name + ".profiles") / file).string();
  const std::string looked =
      beside.string() == named || beside.lexically_normal().string().ends_with("/" + named)
          ? beside.string()
          : beside.string() + " or " + named;
  const std::string kv = kv_cache_dtype ? to_string(*kv_cache_dtype) : "";
  return {beside.string(),
          fmt::format(
              "no measured profile of {}{}{} on {}: none at {} ({})", model,
              tensor_parallel > 1 ? fmt::format(" at TP {}", tensor_parallel) : "",
              kv.empty() ? "" : " with an " + kv + " KV cache", gpu_name, looked,
              tensor_parallel > 1 || !kv.empty()
                  ? fmt::format("memsim calibrate --backend cuda --model {}{}{} writes one", model,
                                tensor_parallel > 1
                                    ? fmt::format(" --tensor-parallel {}", tensor_parallel)
                                    : "",
                                kv.empty() ? "" : " --kv-cache-dtype " + kv)
                  : std::string("memsim calibrate --backend cuda --model writes one"))};
}

}  // namespace memsim
