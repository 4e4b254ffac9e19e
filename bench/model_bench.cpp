// memsim-model-bench: the model-shaped step (src/exec/model_step.h) on the GPU: measured decode
// and prefill step times over a grid, next to the roofline step-time model's prediction; with
// --check DIR, a short ragged serving run (prefill chunks, a cached prefix, decodes) whose logits
// tools/model_check.py compares with PyTorch. Exits 77 without a GPU.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backends/cuda/cuda_backend.h"
#include "kernels/attention.h"
#include "sim/workload/step_time.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/exec/model_step.h"

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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Prefill chunks and decodes of three sequences over block boundaries; each step's inputs and
// logits go to DIR/steps.jsonl and DIR/logits_<step>.bin for tools/model_check.py.
void check(ModelStep& step, Pool& pool, const std::string& dir, uint32_t decodes) {
  const ModelShape& m = step.config().model;
  const std::vector<uint32_t> prompt = {37, 16, 5};
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
      // Step 0: seq 0 computes its first 20 tokens only (chunked prefill); step 1: the rest.
      const uint32_t end = (s == 0 && k == 0) ? 20 : static_cast<uint32_t>(seq_tokens[s].size());
      x.tokens.assign(seq_tokens[s].begin() + cached[s], seq_tokens[s].begin() + end);
      in.push_back(std::move(x));
    }
    const StepResult r = must(step.run(pool.layout, in), "check step");
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
  std::ofstream meta(dir + "/model.json");
  meta << fmt::format(
      "{{\"name\": \"{}\", \"layers_run\": {}, \"hidden\": {}, \"heads\": {}, \"kv_heads\": {}, "
      "\"head_dim\": {}, \"intermediate\": {}, \"vocab\": {}, \"fp16\": {}, \"tie_embeddings\": "
      "{}, "
      "\"qkv_bias\": {}, \"qk_norm\": {}, \"rope_theta\": {}, \"rms_norm_eps\": {}, "
      "\"rope_factor\": {}, \"rope_low\": {}, \"rope_high\": {}, \"rope_original\": {}, "
      "\"seed\": {}}}\n",
      mm.name, step.config().layers_run ? step.config().layers_run : mm.layers, mm.hidden, mm.heads,
      mm.kv_heads, mm.head_dim, mm.intermediate, mm.vocab, mm.dtype == DType::kFP16,
      mm.tie_embeddings, mm.qkv_bias, mm.qk_norm, mm.rope_theta, mm.rms_norm_eps,
      mm.rope_scaling.factor, mm.rope_scaling.low_freq_factor, mm.rope_scaling.high_freq_factor,
      mm.rope_scaling.original_max_position, step.config().seed);
  std::printf("check: %u steps written to %s\n", decodes + 2, dir.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"memsim-model-bench: the model-shaped step on the GPU"};
  std::string model_name = "llama-3.1-8b", gpu_name = "h200", check_dir;
  uint32_t layers = 0, block_size = 16, reps = 5, decodes = 4;
  std::vector<uint32_t> batches = {1, 8, 32, 64, 128, 256};
  std::vector<uint32_t> contexts = {128, 1024, 4096, 16384};
  std::vector<uint32_t> chunks = {16, 128, 512, 2048, 8192};
  std::vector<uint32_t> prefixes = {0, 4096};
  double pool_gib = 60;
  app.add_option("--model", model_name, "configs/models/NAME.yaml");
  app.add_option("--gpu", gpu_name, "configs/gpus/NAME.yaml: the roofline to compare with");
  app.add_option("--layers", layers, "layers to run (0 = all)");
  app.add_option("--block-size", block_size, "KV block size");
  app.add_option("--batches", batches, "decode batch sizes")->delimiter(',');
  app.add_option("--contexts", contexts, "decode context lengths")->delimiter(',');
  app.add_option("--chunks", chunks, "prefill chunk sizes (one sequence)")->delimiter(',');
  app.add_option("--prefixes", prefixes, "cached prefix before each prefill chunk")->delimiter(',');
  app.add_option("--reps", reps, "timed steps per point (median)");
  app.add_option("--pool-gib", pool_gib, "KV pool size");
  app.add_option("--check", check_dir, "write a check run for tools/model_check.py to DIR");
  app.add_option("--check-decodes", decodes, "decode steps of the check run");
  CLI11_PARSE(app, argc, argv);

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("memsim-model-bench: no GPU\n");
    return 77;
  }
  const ModelShape model =
      load_model_shape(ConfigNode::load_file(root() + "/configs/models/" + model_name + ".yaml"));
  const GpuSpec gpu =
      load_gpu_spec(ConfigNode::load_file(root() + "/configs/gpus/" + gpu_name + ".yaml"));
  SimClock clock;
  auto backend = must(CudaBackend::create(unpriced_gpu_spec(gpu_name), clock, nullptr), "backend");
  ModelStepConfig cfg;
  cfg.model = model;
  cfg.layers_run = layers;
  cfg.max_tokens = 16384;
  cfg.max_seqs = 512;
  cfg.return_logits = !check_dir.empty();
  auto step = must(ModelStep::create(cfg, *backend), "model step");
  Pool pool =
      make_pool(*backend, model, block_size, static_cast<uint64_t>(pool_gib * (1ull << 30)));
  const uint32_t run_layers = layers ? std::min(layers, model.layers) : model.layers;
  std::printf(
      "memsim-model-bench: %s (%u of %u layers), weights %.2f GiB, KV pool %.1f GiB, "
      "block %u\n",
      model.name.c_str(), run_layers, model.layers, double(step->weight_bytes()) / (1ull << 30),
      pool_gib, block_size);
  if (!check_dir.empty()) {
    check(*step, pool, check_dir, decodes);
    return 0;
  }
  const StepTimeModel roofline(model, gpu);
  const double layer_share = double(run_layers) / model.layers;  // for the roofline's body part
  std::printf("%-8s %7s %8s %10s %10s %9s %12s\n", "kind", "batch", "context", "measured",
              "roofline", "m/r", "act. peak");
  auto report = [&](const char* kind, uint32_t b, uint32_t ctx, double ms, const StepShape& s) {
    const StepBreakdown br = roofline.breakdown(s);
    const double sim = double(br.total_ns) / 1e6;
    std::printf("%-8s %7u %8u %8.3fms %8.3fms %9.2f %9.1fMiB%s\n", kind, b, ctx, ms, sim,
                sim > 0 ? ms / sim : 0,
                double(step->activation_stats().peak_reserved_bytes) / (1 << 20),
                run_layers == model.layers ? "" : " (roofline: all layers)");
    (void)layer_share;
  };
  for (uint32_t b : batches)
    for (uint32_t ctx : contexts) {
      const uint64_t need = uint64_t{b} * ((ctx + block_size) / block_size + 1);
      if (need > pool.blocks) {
        std::printf("%-8s %7u %8u  skipped: %lu blocks needed, pool has %lu\n", "decode", b, ctx,
                    static_cast<unsigned long>(need), static_cast<unsigned long>(pool.blocks));
        continue;
      }
      pool.next = 0;
      std::vector<StepSeqInput> in(b);
      for (uint32_t s = 0; s < b; ++s) {
        in[s].table = pool.take(ctx + 1);
        in[s].cached = ctx - 1;
        in[s].tokens = {static_cast<int32_t>(s % model.vocab)};
      }
      std::vector<double> ms;
      for (uint32_t r = 0; r < reps + 1; ++r) {
        const StepResult res = must(step->run(pool.layout, in), "decode step");
        if (r) ms.push_back(res.gpu_ms);  // the first step warms caches and the allocator
      }
      StepShape sh;
      sh.num_seqs = b;
      sh.new_tokens = b;
      sh.kv_read_tokens = uint64_t{b} * ctx;
      sh.attn_pairs = double(b) * ctx;
      report("decode", b, ctx, median(ms), sh);
    }
  for (uint32_t c : chunks)
    for (uint32_t p : prefixes) {
      pool.next = 0;
      std::vector<StepSeqInput> in(1);
      in[0].table = pool.take(p + c);
      in[0].cached = p;
      in[0].tokens = tokens_of(0, c, model.vocab);
      std::vector<double> ms;
      for (uint32_t r = 0; r < reps + 1; ++r) {
        const StepResult res = must(step->run(pool.layout, in), "prefill step");
        if (r) ms.push_back(res.gpu_ms);
      }
      StepShape sh;
      sh.num_seqs = 1;
      sh.new_tokens = c;
      sh.kv_read_tokens = uint64_t{p} + c;
      sh.attn_pairs = double(c) * p + double(c) * (c + 1) / 2;
      report("prefill", c, p, median(ms), sh);
    }
  return 0;
}
