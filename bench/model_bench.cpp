// memsim-model-bench: the model-shaped step (src/exec/model_step.h) on the GPU: measured decode
// and prefill step times over the profile grid (src/exec/step_profiler.h, the one `memsim
// calibrate --model` writes), next to the roofline step-time model's prediction; with
// --check DIR, a short ragged serving run (prefill chunks, a cached prefix, decodes) whose logits
// tools/model_check.py compares with PyTorch. --tensor-parallel N runs N ranks, one process each
// on GPUs 0..N-1 over NCCL (this program again, with --rank and --nccl-id): every rank runs the
// same steps on its shard, the check writes DIR/rank<r>/ for each, rank 0 prints the grid. Exits
// 77 without a GPU (or without N of them).
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/cuda/cuda_backend.h"
#include "bench/all_reduce_check.h"
#include "bench/bench_cli.h"
#include "bench/step_replay.h"
#include "kernels/attention.h"
#include "src/app/rank_launch.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/exec/model_step.h"
#include "src/exec/step_profiler.h"
#include "src/exec/tp_group.h"
#include "workload/collectives.h"
#include "workload/step_time.h"

namespace {

using namespace memsim;

std::string root() {
  const char* r = std::getenv("MEMSIM_ROOT");
  return r ? r : ".";
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "memsim-model-bench: %s\n", what.c_str());
  std::exit(1);
}

template <class T>
T must(Result<T> r, const char* what) {
  if (!r.ok()) die(fmt::format("{}: {}", what, r.error().message));
  return std::move(r).value();
}

// A paged KV pool in vLLM's block-major layout (every layer's K and V of a block together, as
// paged_block_pool lays them out), filled with random values so attention reads real numbers.
struct Pool {
  KvLayout layout;
  DevPtr base = 0;
  uint64_t blocks = 0;
  uint32_t next = 0;  // block ids are handed out in order
  std::vector<int32_t> take(uint32_t tokens) {
    std::vector<int32_t> t;
    for (uint32_t i = 0; i < (tokens + layout.block_tokens - 1) / layout.block_tokens; ++i)
      t.push_back(static_cast<int32_t>(next++));
    if (next > blocks) die("KV pool too small for the grid point");
    return t;
  }
};

Pool make_pool(Backend& b, const ModelShape& m, uint32_t block_size, uint64_t bytes) {
  KvInit init;
  init.layers = m.layers;
  init.kv_bytes_per_token = m.kv_bytes_per_token();
  const uint64_t block_bytes = uint64_t{block_size} * m.kv_bytes_per_token();
  Pool p;
  p.blocks = bytes / block_bytes;
  const DevPtr base = must(b.device_malloc(p.blocks * block_bytes, "kv_cache"), "KV pool");
  p.base = base;
  if (cudaError_t e = kernels::random_half(
          m.dtype == DType::kFP16 ? kernels::KvDtype::kFp16 : kernels::KvDtype::kBf16, base,
          p.blocks * block_bytes / 2, 7, nullptr);
      e != cudaSuccess)
    die(cudaGetErrorString(e));
  p.layout = block_major_layout(base, init, block_size, block_bytes, p.blocks);
  return p;
}

std::vector<int32_t> tokens_of(uint32_t seq, uint32_t n, uint64_t vocab) {
  std::vector<int32_t> t(n);
  for (uint32_t i = 0; i < n; ++i)
    t[i] = static_cast<int32_t>((uint64_t{seq} * 7919 + uint64_t{i} * 104729 + 13) % vocab);
  return t;
}

// Prefill chunks and decodes of four sequences over block boundaries; each step's inputs and
// logits go to DIR/steps.jsonl and DIR/logits_<step>.bin for tools/model_check.py. The fourth
// prompt's last 16 tokens are a chunk of their own over its 1,024 others, which the planner
// splits (a short chunk over a long prefix; the step's line says the KV chunk).
void check(ModelStep& step, Pool& pool, const std::string& dir, uint32_t decodes) {
  const ModelShape& m = step.config().model;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "memsim-model-bench: cannot create %s: %s\n", dir.c_str(),
                 ec.message().c_str());
    std::exit(1);
  }
  const std::vector<uint32_t> prompt = {37, 16, 5, 1040};
  const uint32_t first_chunk[] = {20, 16, 5, 1024};  // step 0's tokens of each prompt
  std::vector<std::vector<int32_t>> seq_tokens, tables;
  for (uint32_t s = 0; s < prompt.size(); ++s) {
    seq_tokens.push_back(tokens_of(s, prompt[s], m.vocab));
    tables.push_back(pool.take(prompt[s] + decodes + 2));
  }
  std::vector<uint32_t> cached(prompt.size(), 0);
  std::ofstream jl(dir + "/steps.jsonl");
  for (uint32_t k = 0; k < decodes + 2; ++k) {
    std::vector<StepSeqInput> in;
    for (uint32_t s = 0; s < prompt.size(); ++s) {
      StepSeqInput x;
      x.table = tables[s];
      x.cached = cached[s];
      // Step 0: seqs 0 and 3 compute their first chunk only (chunked prefill); step 1: the rest.
      const uint32_t end = k == 0 ? first_chunk[s] : static_cast<uint32_t>(seq_tokens[s].size());
      x.tokens.assign(seq_tokens[s].begin() + cached[s], seq_tokens[s].begin() + end);
      in.push_back(std::move(x));
    }
    const StepResult r = must(step.run(pool.layout, in), "check step");
    if (r.prefill_kv_chunk)
      std::printf("check step %u: prefill KV split in chunks of %u tokens\n", k,
                  r.prefill_kv_chunk);
    std::ofstream bin(fmt::format("{}/logits_{}.bin", dir, k), std::ios::binary);
    bin.write(reinterpret_cast<const char*>(r.logits.data()),
              static_cast<std::streamsize>(r.logits.size() * 2));
    std::string seqs;
    for (uint32_t s = 0; s < prompt.size(); ++s) {
      const uint32_t upto = in[s].cached + static_cast<uint32_t>(in[s].tokens.size());
      std::string toks;
      for (uint32_t i = 0; i < upto; ++i)
        toks += fmt::format("{}{}", i ? "," : "", seq_tokens[s][i]);
      seqs += fmt::format("{}{{\"tokens\": [{}], \"cached\": {}, \"next\": {}}}", s ? ", " : "",
                          toks, in[s].cached, r.next_tokens[s]);
      cached[s] = upto;
      if (upto == seq_tokens[s].size()) seq_tokens[s].push_back(r.next_tokens[s]);
    }
    jl << fmt::format("{{\"step\": {}, \"decode\": {}, \"seqs\": [{}]}}\n", k, r.decode, seqs);
  }
  const auto& mm = m;
  std::vector<uint32_t> windows = mm.layer_windows();  // of the layers run
  windows.resize(step.config().layers_run ? std::min(step.config().layers_run, mm.layers)
                                          : mm.layers);
  std::ofstream meta(dir + "/model.json");
  meta << fmt::format(
      "{{\"name\": \"{}\", \"layers_run\": {}, \"hidden\": {}, \"heads\": {}, \"kv_heads\": {}, "
      "\"head_dim\": {}, \"intermediate\": {}, \"vocab\": {}, \"fp16\": {}, \"tie_embeddings\": "
      "{}, "
      "\"qkv_bias\": {}, \"qk_norm\": {}, \"rope_theta\": {}, \"rms_norm_eps\": {}, "
      "\"rope_factor\": {}, \"rope_low\": {}, \"rope_high\": {}, \"rope_original\": {}, "
      "\"seed\": {}, \"layer_windows\": [{}]}}\n",
      mm.name, step.config().layers_run ? step.config().layers_run : mm.layers, mm.hidden, mm.heads,
      mm.kv_heads, mm.head_dim, mm.intermediate, mm.vocab, mm.dtype == DType::kFP16,
      mm.tie_embeddings, mm.qkv_bias, mm.qk_norm, mm.rope_theta, mm.rms_norm_eps,
      mm.rope_scaling.factor, mm.rope_scaling.low_freq_factor, mm.rope_scaling.high_freq_factor,
      mm.rope_scaling.original_max_position, step.config().seed, fmt::join(windows, ", "));
  std::printf("check: %u steps written to %s\n", decodes + 2, dir.c_str());
}

// A captured decode step must give the eager step's tokens, bit for bit. Uniform contexts, then
// ragged ones (the replay re-plans its split work list; the same batch, so the GEMMs run the same
// shapes). True when every replay matched.
bool graph_check_run(ModelStep& step, Pool& pool, const ModelShape& model) {
  const uint32_t b = 8, ctx = 1000;
  bool all_same = true, captured = false;
  for (const bool ragged : {false, true}) {
    std::vector<StepSeqInput> in(b);
    for (uint32_t s = 0; s < b; ++s) {
      const uint32_t len = ragged ? (s == 3 ? ctx : 1 + (s * 131) % 400) : ctx;
      in[s].table = pool.take(len + 1);
      in[s].cached = len - 1;
      in[s].tokens = {static_cast<int32_t>((s * 7919 + 11) % model.vocab)};
    }
    const StepResult eager = must(step.run(pool.layout, in), "eager decode");
    if (!captured) {
      if (const Status st = step.capture_decode(pool.layout, b, ctx); !st.ok())
        die(st.error().message);
      captured = true;
    }
    const StepResult replay = must(step.run(pool.layout, in), "graph decode");
    const bool same = replay.graph && replay.next_tokens == eager.next_tokens;
    all_same = all_same && same;
    std::printf(
        "graph check: batch %u, %s contexts up to %u: eager %.3f ms, graph %.3f ms, "
        "next tokens %s\n",
        b, ragged ? "ragged" : "uniform", ctx, eager.gpu_ms, replay.gpu_ms,
        same ? "identical" : "DIFFER");
  }
  return all_same;
}

// The grid's measured times next to the roofline's prediction for the same steps (the rank's
// shard with the GPU file's collectives added under TP), then the profiler's log.
void print_grid(const StepProfile& prof, const ModelStep& step, const GpuSpec& gpu, uint32_t tp,
                uint32_t run_layers, const std::string& profiler_log) {
  const ModelShape& model = step.config().model;
  const StepTimeModel roofline =
      tp > 1 ? StepTimeModel(step.rank_model(), gpu,
                             std::make_shared<const CollectiveTime>(
                                 must(CollectiveTime::make(gpu, tp), "collective times")))
             : StepTimeModel(model, gpu);
  std::printf("%-8s %7s %8s %10s %10s %7s%s\n", "kind", "size", "point", "measured", "roofline",
              "m/r", run_layers == model.layers ? "" : "   (roofline: all layers)");
  auto print = [&](const char* kind, const ProfileRow& r, bool decode) {
    for (size_t i = 0; i < r.points.size(); ++i) {
      StepShape sh;
      const double n = r.size, pt = r.points[i];
      sh.num_seqs = decode ? r.size : 1;
      sh.new_tokens = r.size;
      sh.kv_read_tokens = decode ? uint64_t(n * pt) : uint64_t(pt + n);
      sh.attn_pairs = decode ? n * pt : n * pt + n * (n + 1) / 2;
      const double sim = double(roofline.step_time(sh)) / 1e6;
      std::printf("%-8s %7u %8u %8.3fms %8.3fms %7.2f\n", kind, r.size, r.points[i], r.ms[i], sim,
                  sim > 0 ? r.ms[i] / sim : 0);
    }
  };
  for (const ProfileRow& r : prof.decode) print("decode", r, true);
  for (const ProfileRow& r : prof.prefill) print("prefill", r, false);
  std::printf("%s", profiler_log.c_str());  // the profiler's log: each point's GPU and host time
  std::printf("activation peak reserved: %.1f MiB\n",
              double(step.activation_stats().peak_reserved_bytes) / (1 << 20));
}

// The launcher of --tensor-parallel (one process per rank: their exit status), or 77 without the
// GPUs; nothing for a process that runs the step itself.
std::optional<int> launch_or_skip(uint32_t tp, int rank) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (tp > 1 && rank < 0) {
    if (devices < static_cast<int>(tp)) {
      std::printf("memsim-model-bench: --tensor-parallel %u needs %u GPUs, %d here\n", tp, tp,
                  devices);
      return 77;
    }
    std::ostringstream out;
    const int rc = run_rank_processes(own_command_line(), tp, false, 3600, out);
    std::printf("%s", out.str().c_str());
    return rc;
  }
  if (devices == 0) {
    std::printf("memsim-model-bench: no GPU\n");
    return 77;
  }
  return std::nullopt;
}

// The model's overrides: --sliding-window and --sliding-window-pattern (its window, for a
// check) and --kv-cache-dtype (an fp8 cache).
struct ModelOverrides {
  std::optional<uint32_t> window, pattern;
  std::string kv_cache_dtype = "auto";
  void add_options(CLI::App& app) {
    app.add_option("--sliding-window", window,
                   "override the model's sliding window (tokens; 0: every layer full attention)")
        ->check(CLI::Range(0u, 1u << 24));
    app.add_option("--sliding-window-pattern", pattern,
                   "override its pattern: every N-th layer full attention (0: every layer slides)")
        ->check(CLI::Range(0u, 1024u));
    app.add_option("--kv-cache-dtype", kv_cache_dtype,
                   "the KV cache's dtype, as vLLM's --kv-cache-dtype: auto (the model's), fp8 (= "
                   "fp8_e4m3, quantized by the KV write with scales of 1.0) or fp8_e5m2")
        ->check(CLI::IsMember(memsim::kv_cache_dtype_names()));
  }
  // False (said why) when the result is no valid model, or a --check run (whose PyTorch
  // reference keeps the model's dtype) is asked of an fp8 cache.
  bool apply(ModelShape& m, bool check) const {
    if (window) m.sliding_window = *window;
    if (pattern) m.sliding_window_pattern = *pattern;
    if (m.sliding_window == 0) m.sliding_window_pattern = 0;
    if (m.sliding_window_pattern > m.layers || m.sliding_window == 1) {
      std::printf(
          "memsim-model-bench: --sliding-window must be 0 or 2 or more, and the pattern at "
          "most the model's %u layers\n",
          m.layers);
      return false;
    }
    if (kv_cache_dtype == "auto") return true;
    if (check) {
      std::printf(
          "memsim-model-bench: --check with --kv-cache-dtype %s: the PyTorch check does "
          "not quantize the cache (use --graph-check, or the grid)\n",
          kv_cache_dtype.c_str());
      return false;
    }
    m.kv_dtype = kv_cache_dtype_from_name(kv_cache_dtype);
    return true;
  }
};

// The grid's options: its points, repetitions and graphs, and how often to measure it.
struct GridOptions {
  ProfileGrid grid;
  uint32_t instances = 1;
  memsim::bench::ReplayOptions replay;  // or steps of a serving run, on the grid's pool and timer
  void add_options(CLI::App& app) {
    replay.add_options(app);
    app.add_option("--block-size", grid.block_size, "KV block size");
    app.add_option("--batches", grid.batches, "decode batch sizes")->delimiter(',');
    app.add_option("--contexts", grid.contexts, "decode context lengths")->delimiter(',');
    app.add_option("--chunks", grid.chunks, "prefill chunk sizes (one sequence)")->delimiter(',');
    app.add_option("--prefixes", grid.prefixes, "cached prefix before each prefill chunk")
        ->delimiter(',');
    app.add_option("--reps", grid.reps, "timed steps per point (median)");
    app.add_flag("--graphs", grid.graphs, "decode steps as captured CUDA graphs");
    app.add_option("--instances", instances,
                   "measure the grid N times in this process, the backend and the model step "
                   "(weights, graphs, activations) made again each time")
        ->check(CLI::Range(1, 64));
  }
};

int run(int argc, char** argv) {
  CLI::App app{"memsim-model-bench: the model-shaped step on the GPU"};
  std::string model_name = "llama-3.1-8b", gpu_name = "h200", check_dir;
  uint32_t layers = 0, decodes = 4;
  double pool_gib = 60;
  app.add_option("--model", model_name, "configs/models/NAME.yaml");
  app.add_option("--gpu", gpu_name, "configs/gpus/NAME.yaml: the roofline to compare with");
  app.add_option("--layers", layers, "layers to run (0 = all)");
  GridOptions g;
  g.add_options(app);
  bool graph_check = false;
  app.add_flag("--graph-check", graph_check,
               "check that a captured decode step gives the eager step's tokens");
  app.add_option("--pool-gib", pool_gib, "KV pool of the check runs");
  app.add_option("--check", check_dir, "write a check run for tools/model_check.py to DIR");
  app.add_option("--check-decodes", decodes, "decode steps of the check run");
  ModelOverrides overrides;
  overrides.add_options(app);
  uint32_t tp = 1;
  int rank = -1;
  std::string nccl_id;
  app.add_option("--tensor-parallel", tp, "ranks, one process and GPU each, over NCCL")
      ->check(CLI::Range(1, 64));
  std::string all_reduce = "custom";
  app.add_option("--all-reduce", all_reduce,
                 "custom: vLLM's custom all-reduce up to 8 MiB, NCCL above (vLLM's default); "
                 "nccl: NCCL only")
      ->check(CLI::IsMember({"custom", "nccl"}));
  bool all_reduce_check_only = false;
  app.add_flag("--all-reduce-check", all_reduce_check_only,
               "check the custom all-reduce against the host's sums and NCCL, and time both");
  app.add_option("--rank", rank, "this process's rank (set by --tensor-parallel)")->group("");
  app.add_option("--nccl-id", nccl_id, "NCCL unique id (set by --tensor-parallel)")->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : memsim::bench::kExitBadInput;
  }
  if (const std::optional<int> rc = launch_or_skip(tp, rank)) return *rc;
  // A rank: GPU `rank`, an NCCL communicator over the launcher's id, the group the step runs.
  TpMember member;
  if (rank >= 0)
    member =
        must(join_tp_group(tp, rank, nccl_id, all_reduce == "custom" && !all_reduce_check_only),
             "tensor-parallel rank");
  if (all_reduce_check_only) {
    if (rank < 0) {
      std::printf("memsim-model-bench: --all-reduce-check needs --tensor-parallel 2 or more\n");
      return memsim::bench::kExitBadInput;
    }
    return memsim::bench::all_reduce_check(*member.nccl, tp, static_cast<uint32_t>(rank));
  }
  const bool lead = rank <= 0;  // prints the grid
  ModelShape model =
      load_model_shape(ConfigNode::load_file(root() + "/configs/models/" + model_name + ".yaml"));
  if (!overrides.apply(model, !check_dir.empty())) return memsim::bench::kExitBadInput;
  const GpuSpec gpu =
      load_gpu_spec(ConfigNode::load_file(root() + "/configs/gpus/" + gpu_name + ".yaml"));
  const bool check_or_tp = !check_dir.empty() || graph_check || tp > 1;
  for (const char* mode : {!g.replay.steps_csv.empty() ? "--replay-steps" : nullptr,
                           g.instances > 1 ? "--instances" : nullptr})
    if (mode && check_or_tp) {
      std::printf(
          "memsim-model-bench: %s times steps on one GPU: not with --check, "
          "--graph-check or --tensor-parallel\n",
          mode);
      return memsim::bench::kExitBadInput;
    }
  // One measurement: a backend and a model step of their own, the grid (or the check run).
  const auto run_once = [&]() -> int {
    SimClock clock;
    auto backend =
        must(CudaBackend::create(unpriced_gpu_spec(gpu_name), clock, nullptr, std::max(rank, 0)),
             "backend");
    ModelStepConfig cfg;
    cfg.model = model;
    cfg.layers_run = layers;
    cfg.max_tokens = 16384;
    cfg.max_seqs = 512;
    cfg.return_logits = !check_dir.empty();
    cfg.tp = member.group.get();
    auto step = must(ModelStep::create(cfg, *backend), "model step");
    // The check runs' pool (the grid measures on a pool of its own).
    Pool pool = make_pool(
        *backend, step->rank_model(), g.grid.block_size,
        static_cast<uint64_t>((check_dir.empty() && !graph_check ? 1 : pool_gib) * (1ull << 30)));
    const DevPtr pool_base = pool.base;
    const uint32_t run_layers = layers ? std::min(layers, model.layers) : model.layers;
    const std::string ranks = rank >= 0 ? fmt::format(", rank {} of {}, all-reduce {}", rank, tp,
                                                      member.group->all_reduce_kind())
                                        : "";
    std::printf("memsim-model-bench: %s (%u of %u layers)%s, weights %.2f GiB, block %u, KV %s\n",
                model.name.c_str(), run_layers, model.layers, ranks.c_str(),
                double(step->weight_bytes()) / (1ull << 30), g.grid.block_size,
                to_string(model.kv_cache_dtype()));
    if (!check_dir.empty()) {
      check(*step, pool, rank >= 0 ? fmt::format("{}/rank{}", check_dir, rank) : check_dir,
            decodes);
      return 0;
    }
    if (graph_check) return graph_check_run(*step, pool, model) ? 0 : 1;
    // The grid through the profiler (what `memsim calibrate --model` writes), each point next to
    // the roofline's prediction for the same step.
    pool.layout = {};
    if (const Status st = backend->device_free(pool_base); !st.ok()) die(st.error().message);
    if (!g.replay.steps_csv.empty())
      return memsim::bench::replay_steps(*step, *backend, g.grid, g.replay);
    std::ostringstream log;
    const StepProfile prof = must(measure_step_profile(*step, *backend, g.grid, log), "profile");
    if (lead) print_grid(prof, *step, gpu, member.group ? tp : 1, run_layers, log.str());
    return 0;
  };
  for (uint32_t instance = 1; instance <= g.instances; ++instance) {
    if (g.instances > 1)
      std::printf("instance %u of %u (the backend and the model step made again)\n", instance,
                  g.instances);
    if (const int rc = run_once(); rc != 0) return rc;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return memsim::bench::guarded_main("memsim-model-bench", "", argc, argv,
                                     [&] { return run(argc, argv); });
}
