// FP8 KV cache (engine.kv_cache_dtype) in simulation: 1 byte per KV element in the model's bytes
// per token, the KV budget (about twice the tokens), every KV strategy's pool geometry, the
// roofline's KV bytes, and the serving key's parsing and errors.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <string>

#include "src/app/output.h"
#include "src/app/serving_writers.h"
#include "src/serve/kv_budget.h"
#include "src/serve/serving_experiment.h"
#include "tests/config_test_util.h"
#include "tests/kv_test_util.h"
#include "tests/temp_dir.h"
#include "workload/step_time.h"

namespace memsim::test {
namespace {

ModelShape llama8b() {
  return model_from_configs("llama-3.1-8b");
}

ModelShape with_kv(ModelShape m, DType kv) {
  m.kv_dtype = kv;
  return m;
}

}  // namespace

TEST_CASE("fp8 KV: bytes per token are 1 per element, the model's dtype otherwise") {
  const ModelShape m = llama8b();
  CHECK(m.kv_cache_dtype() == DType::kBF16);  // auto: the model's dtype
  // 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes; x 1 byte for fp8 (e4m3 or e5m2).
  CHECK(m.kv_bytes_per_token() == 131072);
  CHECK(with_kv(m, DType::kFP8).kv_bytes_per_token() == 65536);
  CHECK(with_kv(m, DType::kFP8E5M2).kv_bytes_per_token() == 65536);
  CHECK(with_kv(m, DType::kFP8).weight_bytes() == m.weight_bytes());  // weights stay bf16
  CHECK(with_kv_cache_dtype(m, DType::kFP8).kv_cache_dtype() == DType::kFP8);
  CHECK(with_kv_cache_dtype(m, std::nullopt).kv_bytes_per_token() == 131072);
  CHECK(std::string(to_string(DType::kFP8E5M2)) == "fp8_e5m2");
  CHECK(dtype_bytes(DType::kFP8E5M2) == 1);
}

TEST_CASE("fp8 KV: the H200 budget of Llama-3.1-8B holds twice the tokens in the same bytes") {
  KvBudgetInput in;
  in.model = llama8b();
  in.gpu = gpu_from_configs("h200");
  const Result<KvBudget> bf16 = compute_kv_budget(in);
  in.model.kv_dtype = DType::kFP8;
  const Result<KvBudget> fp8 = compute_kv_budget(in);
  REQUIRE(bf16.ok());
  REQUIRE(fp8.ok());
  // floor(0.9 x 150,109,880,320) - weights 16,060,522,496 - activation peak 822,312,960 - graph
  // memory 729,808,896 (tests/test_kv_budget.cpp): the KV dtype changes none of them.
  CHECK(bf16->kv_bytes == 117486247936ull);
  CHECK(fp8->kv_bytes == 117486247936ull);
  CHECK(fp8->weights == bf16->weights);
  CHECK(fp8->activation_peak == bf16->activation_peak);
  CHECK(fp8->graph_memory == bf16->graph_memory);
  CHECK(bf16->kv_bytes_per_token == 131072);
  CHECK(fp8->kv_bytes_per_token == 65536);
  CHECK(bf16->kv_tokens == 896348);  // floor(117486247936 / 131072)
  CHECK(fp8->kv_tokens == 1792697);  // floor(117486247936 / 65536) = 2 x 896348 + 1
  CHECK(bf16->kv_blocks == 56021);   // floor(117486247936 / (16 x 131072))
  CHECK(fp8->kv_blocks == 112043);   // floor(117486247936 / (16 x 65536)) = 2 x 56021 + 1
  CHECK(fp8->kv_tokens / 2 == bf16->kv_tokens);
}

TEST_CASE("fp8 KV: every KV strategy holds twice the tokens of the same budget") {
  const ModelShape bf16 = llama8b(), fp8 = with_kv(llama8b(), DType::kFP8);
  // 1 GiB: 512 blocks of 16 bf16 tokens (2 MiB each), 1024 of fp8 (1 MiB each).
  const KvInit ib = kv_init_for(bf16, kGiB, 64, 4096), i8 = kv_init_for(fp8, kGiB, 64, 4096);
  CHECK(i8.row_bytes() == 1024);  // one layer's K of a token: 8 heads x 128 x 1 byte
  CHECK(ib.row_bytes() == 2048);
  {
    KvRig b("{impl: paged_block_pool, block_size: 16}", ib), f("{impl: paged_block_pool}", i8);
    b.check();
    f.check();
    CHECK(b.kv->stats().block_bytes == 2 * kMiB);
    CHECK(f.kv->stats().block_bytes == 1 * kMiB);
    CHECK(b.kv->stats().total_blocks == 512);
    CHECK(f.kv->stats().total_blocks == 1024);
    // Less one block each for vLLM's null block.
    CHECK(b.kv->free_token_capacity() == 511 * 16);
    CHECK(f.kv->free_token_capacity() == 1023 * 16);
  }
  {
    KvRig b("{impl: radix_token_pool, page_size: 16}", ib);
    KvRig f("{impl: radix_token_pool, page_size: 16}", i8);
    b.check();
    f.check();
    CHECK(b.kv->stats().block_bytes == 2 * kMiB);
    CHECK(f.kv->stats().block_bytes == 1 * kMiB);
    // 512 and 1024 pages of 16 tokens, less one each: SGLang's padding slot (page 0).
    CHECK(b.kv->stats().total_blocks == 511);
    CHECK(f.kv->stats().total_blocks == 1023);
    CHECK(b.kv->free_token_capacity() == 511 * 16);
    CHECK(f.kv->free_token_capacity() == 1023 * 16);
  }
  {
    // One slab = max_model_len x bytes per token: 512 MiB bf16, 256 MiB fp8: 2 and 4 slots.
    KvRig b("{impl: static_contiguous}", ib), f("{impl: static_contiguous}", i8);
    b.check();
    f.check();
    CHECK(b.kv->stats().total_blocks == 2);
    CHECK(f.kv->stats().total_blocks == 4);
    CHECK(f.kv->free_token_capacity() == 2 * b.kv->free_token_capacity());
  }
  {
    KvRig b("{impl: vmm_contiguous}", ib), f("{impl: vmm_contiguous}", i8);
    b.check();
    f.check();
    // A page group holds 2 MiB of each of the 64 K/V tensors: 1024 bf16 tokens, 2048 fp8.
    CHECK(b.kv->stats().block_tokens == 1024);
    CHECK(f.kv->stats().block_tokens == 2048);
    CHECK(f.kv->free_token_capacity() == 2 * b.kv->free_token_capacity());
  }
}

TEST_CASE("fp8 KV: the roofline reads half the KV bytes") {
  const GpuSpec gpu = gpu_from_configs("h200");
  const StepTimeModel b(llama8b(), gpu), f(with_kv(llama8b(), DType::kFP8), gpu);
  StepShape s;  // 32 decodes at 4096 tokens of context
  s.num_seqs = s.decode_seqs = 32;
  s.new_tokens = 32;
  s.kv_read_tokens = s.decode_kv_tokens = 32 * 4096;
  s.attn_pairs = 32.0 * 4096;
  s.decode_max_kv = 4096;
  const StepBreakdown sb = b.breakdown(s), sf = f.breakdown(s);
  // (KV read + KV written) x 65,536 bytes fewer; weights and FLOPs unchanged.
  CHECK(sb.bytes - sf.bytes == (32ull * 4096 + 32) * 65536);
  CHECK(sb.flops == sf.flops);
  CHECK(sf.memory_ns < sb.memory_ns);
  CHECK(f.step_time(s) < b.step_time(s));
  CHECK(f.attention_time(s) < b.attention_time(s));
}

TEST_CASE("fp8 KV: engine.kv_cache_dtype sizes each run's budget and pool") {
  TempDir dir;
  const std::string base = fmt::format(R"(experiment: fp8
gpu: {0}/configs/gpus/h200.yaml
model: {0}/configs/models/llama-3.1-8b.yaml
engine: {{max_model_len: 4096, step_time: roofline}}
kv: {{impl: paged_block_pool}}
requests: {{source: synthetic, count: 8, arrival: {{process: burst}}, prompt: {{dist: fixed, value: 2000}}, output: {{dist: fixed, value: 64}}}}
)",
                                       source_root());
  const ServingConfig c = load_serving_config(
      dir.write("ok.yaml", base + "runs:\n  - label: bf16\n  - label: fp8\n    engine: "
                                  "{kv_cache_dtype: fp8}\n  - label: e5m2\n    engine: "
                                  "{kv_cache_dtype: fp8_e5m2}\n  - label: auto\n    engine: "
                                  "{kv_cache_dtype: auto}\n"),
      {});
  REQUIRE(c.runs.size() == 4);
  CHECK(!c.runs[0].kv_cache_dtype);
  CHECK(c.runs[1].kv_cache_dtype == DType::kFP8);
  CHECK(c.runs[2].kv_cache_dtype == DType::kFP8E5M2);
  CHECK(!c.runs[3].kv_cache_dtype);
  const ServingResults r = run_serving_experiment(c);
  REQUIRE(r.runs.size() == 4);
  for (const ServingRunResult& o : r.runs) {
    INFO(o.spec.label << ": " << o.budget_error << o.result.error);
    REQUIRE(o.budget_error.empty());
    REQUIRE(o.result.error.empty());
  }
  const KvBudget &b = r.runs[0].budget, &f = r.runs[1].budget;
  CHECK(f.kv_bytes == b.kv_bytes);
  CHECK(b.kv_bytes_per_token == 131072);
  CHECK(f.kv_bytes_per_token == 65536);
  CHECK(f.kv_tokens == f.kv_bytes / 65536);
  CHECK(f.kv_tokens / 2 == b.kv_tokens);
  CHECK(r.runs[2].budget.kv_tokens == f.kv_tokens);
  CHECK(r.runs[3].budget.kv_tokens == b.kv_tokens);
  // The pool the engine built: twice the blocks, each half the bytes.
  CHECK(r.runs[1].result.kv.total_blocks == f.kv_blocks);
  CHECK(r.runs[0].result.kv.total_blocks == b.kv_blocks);
  CHECK(r.runs[1].result.kv.block_bytes * 2 == r.runs[0].result.kv.block_bytes);
  // Decode reads half the KV bytes: the fp8 run ends sooner (same requests, same schedule).
  CHECK(r.runs[1].result.steps == r.runs[0].result.steps);
  CHECK(r.runs[1].result.sim_time < r.runs[0].result.sim_time);

  // summary.json names each run's KV dtype and bytes per token.
  {
    OutputDir out((dir.path() / "results").string(), "fp8");
    write_serving_outputs(c, r, out);
    out.commit();
  }
  const std::string summary = read_text(dir.path() / "results" / "fp8" / "summary.json");
  CHECK_THAT(summary, Catch::Contains("\"label\": \"fp8\"") &&
                          Catch::Contains("\"kv_cache_dtype\": \"fp8\"") &&
                          Catch::Contains("\"kv_cache_dtype\": \"fp8_e5m2\"") &&
                          Catch::Contains("\"kv_cache_dtype\": \"auto\"") &&
                          Catch::Contains("\"kv_bytes_per_token\": 65536") &&
                          Catch::Contains("\"kv_bytes_per_token\": 131072"));
}

TEST_CASE("fp8 KV: a bad kv_cache_dtype names file, line and key and the closest value") {
  TempDir dir;
  const std::string text = fmt::format(R"(experiment: fp8
gpu: {0}/configs/gpus/h200.yaml
model: {0}/configs/models/llama-3.1-8b.yaml
engine:
  kv_cache_dtype: fp8_e4m4
kv: {{impl: paged_block_pool}}
requests: {{source: synthetic, count: 2, arrival: {{process: burst}}, prompt: {{dist: fixed, value: 20}}, output: {{dist: fixed, value: 4}}}}
)",
                                       source_root());
  const std::string path = dir.write("bad.yaml", text);
  CHECK_THROWS_WITH(
      load_serving_config(path, {}),
      Catch::Contains(path + ":5:") && Catch::Contains("engine.kv_cache_dtype") &&
          Catch::Contains("'fp8_e4m4' is not one of: auto, fp8, fp8_e4m3, fp8_e5m2") &&
          Catch::Contains("did you mean 'fp8_e4m3'?"));
  // An fp8 cache's steps need a profile of their own: Llama-3.1-8B's H200 one is committed
  // (h200.profiles/llama-3.1-8b.fp8.yaml); for fp8_e5m2 there is none, and step_time: profile
  // names the file and the command that writes it.
  std::string prof = text;
  prof.replace(prof.find("fp8_e4m4"), 8, "fp8\n  step_time: profile");
  const ServingConfig with = load_serving_config(dir.write("prof.yaml", prof), {});
  REQUIRE(with.profiles.at(DType::kFP8).eager != nullptr);
  CHECK(with.profiles.at(DType::kFP8).eager->profile().kv_cache_dtype == DType::kFP8);
  prof = replace_once(prof, "kv_cache_dtype: fp8\n", "kv_cache_dtype: fp8_e5m2\n");
  CHECK_THROWS_WITH(
      load_serving_config(dir.write("e5m2.yaml", prof), {}),
      Catch::Contains("e5m2.yaml:") &&
          Catch::Contains("h200.profiles/llama-3.1-8b.fp8_e5m2.yaml does not exist") &&
          Catch::Contains("--model llama-3.1-8b --kv-cache-dtype fp8_e5m2 writes it"));
}

}  // namespace memsim::test
