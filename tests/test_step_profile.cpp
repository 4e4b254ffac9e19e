// Measured step-time profiles: exact interpolation and extension over the decode and prefill
// grids, validation, the YAML file (round trip, located errors), the serving experiment picking
// up a (gpu, model) profile beside the GPU file, and the engine using it.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>

#include "src/app/serving_writers.h"
#include "src/config/loaders.h"
#include "src/config/step_profile_loader.h"
#include "src/serve/serving_experiment.h"
#include "src/serve/step_executor.h"
#include "tests/config_test_util.h"
#include "workload/step_profile.h"

using namespace memsim;
using namespace memsim::test;

namespace {

// decode: batch 1 rises 10 -> 20 ms over contexts 100 -> 1100, batch 3 12 -> 32 ms; prefill:
// chunk 100 rises 5 -> 15 ms over prefixes 0 -> 1000, chunk 200 8 -> 28 ms.
StepProfile grid() {
  StepProfile p;
  p.gpu = "h200";
  p.model = "llama-3.1-8b";
  p.decode = {{1, {100, 1100}, {10, 20}}, {3, {100, 1100}, {12, 32}}};
  p.prefill = {{100, {0, 1000}, {5, 15}}, {200, {0, 1000}, {8, 28}}};
  return p;
}

// A step of a 99-token prompt and one decode at context 601.
StepShape prompt_and_decode() {
  StepShape mixed;
  mixed.num_seqs = 2;
  mixed.new_tokens = 100;
  mixed.decode_seqs = 1;
  mixed.decode_kv_tokens = 601;
  mixed.kv_read_tokens = 99 + 601;
  mixed.attn_pairs = 99.0 * 100 / 2 + 601;
  return mixed;
}

StepShape decode_step(uint32_t b, uint64_t ctx) {
  StepShape s;
  s.num_seqs = b;
  s.new_tokens = b;
  s.kv_read_tokens = b * ctx;
  s.attn_pairs = double(b * ctx);
  return s;
}

SimTime ms(double v) {
  return static_cast<SimTime>(std::llround(v * 1e6));
}

}  // namespace

TEST_CASE("profile: decode steps interpolate in context, then in batch") {
  const ProfiledStepTime t(grid());
  CHECK(t.step_time(decode_step(1, 100)) == ms(10));
  CHECK(t.step_time(decode_step(1, 600)) == ms(15));
  CHECK(t.step_time(decode_step(3, 600)) == ms(22));
  CHECK(t.step_time(decode_step(2, 600)) == ms(18.5));  // halfway between 15 and 22
  // Beyond the grid the nearest segment extends it: 0.01 ms a token of context at batch 1, and
  // in batch from rows 1 and 3 (7 ms more a sequence at 600 tokens each).
  CHECK(t.step_time(decode_step(1, 2100)) == ms(30));
  CHECK(t.step_time(decode_step(5, 600)) == ms(29));
  // Never below a row's fastest measured step.
  CHECK(t.step_time(decode_step(1, 1)) == ms(10));
  CHECK(t.step_time(StepShape{}) == 0);
}

TEST_CASE("profile: other steps are a prefill chunk with the step's attention work") {
  const ProfiledStepTime t(grid());
  StepShape s;  // 150 new tokens of 3 sequences, attention equal to one chunk over 500 cached
  s.num_seqs = 3;
  s.new_tokens = 150;
  s.attn_pairs = 150.0 * 500 + 150.0 * 151 / 2;
  s.kv_read_tokens = 650;
  CHECK(t.step_time(s) == ms(14));  // chunk 100 at 500: 10, chunk 200: 18
  s.attn_pairs = 150.0 * 151 / 2;   // no prefix
  CHECK(t.step_time(s) == ms(6.5));
  StepProfile decode_only = grid();
  decode_only.prefill.clear();  // without prefill rows a mixed step reads the decode grid
  CHECK(ProfiledStepTime(decode_only).step_time(s) > 0);
}

TEST_CASE("profile: several prompts and decodes in one step") {
  const ProfiledStepTime t(grid());
  // Two 50-token prompts do half the attention of one 100-token chunk: prefix -25 on the chunk
  // 100 row's slope (0.01 ms a prefix token), 5 - 0.25 ms.
  StepShape two;
  two.num_seqs = 2;
  two.new_tokens = 100;
  two.attn_pairs = 2 * (50.0 * 51 / 2);
  two.kv_read_tokens = 100;
  CHECK(std::llabs(t.step_time(two) - ms(4.75)) <= 1);
  // A 99-token prompt and one decode at context 601: the chunk of 100 tokens at prefix -1
  // (4.99 ms) plus the decode's attention, batch 1 at 601 (15.01 ms) less at 0 (9 ms).
  const StepShape mixed = prompt_and_decode();
  CHECK(std::llabs(t.step_time(mixed) - ms(4.99 + 6.01)) <= 1);
}

TEST_CASE("profile: below prefix 0 a prefill row falls by its least-squares slope") {
  StepProfile p = grid();
  // Chunk 100 over prefixes 0, 1,000, 2,000: 10, 30, 34 ms. Its first segment rises 0.02 ms a
  // prefix token, the row as a whole 0.012 (least squares: 24,000 / 2,000,000).
  p.prefill = {{100, {0, 1000, 2000}, {10, 30, 34}}};
  const ProfiledStepTime t(p);
  StepShape two;  // two 50-token prompts: prefix -25 on the chunk of 100
  two.num_seqs = 2;
  two.new_tokens = 100;
  two.attn_pairs = 2 * (50.0 * 51 / 2);
  two.kv_read_tokens = 100;
  CHECK(std::llabs(t.step_time(two) - ms(10 - 25 * 0.012)) <= 1);  // not 10 - 25 * 0.02
  // At and above prefix 0 the segments still interpolate: prefix 500 is 20 ms.
  two.attn_pairs = 100.0 * 500 + 100.0 * 101 / 2;
  CHECK(t.step_time(two) == ms(20));
  // A row whose times fall with the prefix (noise) is flat below prefix 0, never rising.
  p.prefill = {{100, {0, 1000, 2000}, {10, 9, 8}}};
  two.attn_pairs = 2 * (50.0 * 51 / 2);
  CHECK(ProfiledStepTime(p).step_time(two) == ms(10));
  // A row that starts above prefix 0 (500, 1,000, 2,000: 20, 30, 34 ms) is its first segment
  // down to 0 (10 ms), then its least-squares slope below (10,000 / 1,166,666.7 = 3 / 350).
  p.prefill = {{100, {500, 1000, 2000}, {20, 30, 34}}};
  CHECK(std::llabs(ProfiledStepTime(p).step_time(two) - ms(10 - 25 * 3.0 / 350)) <= 1);
}

TEST_CASE("profile: scaled to another machine's speed, decode and prefill rows apart") {
  const ProfiledStepTime t(scale_step_profile(grid(), 2.0, 0.5));
  CHECK(t.step_time(decode_step(1, 600)) == ms(30));
  CHECK(t.step_time(decode_step(2, 600)) == ms(37));  // 2 x 18.5
  StepShape chunk;  // 150 new tokens over 500 cached: 14 ms unscaled
  chunk.num_seqs = 3;
  chunk.new_tokens = 150;
  chunk.attn_pairs = 150.0 * 500 + 150.0 * 151 / 2;
  chunk.kv_read_tokens = 650;
  CHECK(t.step_time(chunk) == ms(7));
  // A mixed step: its chunk from the prefill rows, its decodes' attention from the decode rows.
  const StepShape mixed = prompt_and_decode();
  CHECK(std::llabs(t.step_time(mixed) - ms(0.5 * 4.99 + 2 * 6.01)) <= 1);
  CHECK(t.describe() == "h200/llama-3.1-8b (eager, scaled: decode x2.000, prefill x0.500)");
  CHECK(ProfiledStepTime(grid()).describe() == "h200/llama-3.1-8b (eager)");
  // Scales compose; the times are the measured ones times the product.
  const StepProfile twice = scale_step_profile(scale_step_profile(grid(), 2.0, 0.5), 1.5, 4.0);
  CHECK(twice.decode_scale == 3.0);
  CHECK(twice.prefill_scale == 2.0);
  CHECK(twice.decode[1].ms[1] == 32.0 * 3);
  CHECK(twice.prefill[0].ms[0] == 5.0 * 2);
  for (double bad : {0.0, -1.0, std::nan(""), double(INFINITY)})
    CHECK_THROWS_WITH(scale_step_profile(grid(), bad, 1.0), Catch::Contains("not positive"));
}

TEST_CASE("profile: a machine's speed against the profile, from the points both hold") {
  // Decode batch 1 at 100 runs 1.1x the reference (at 600 the reference has no point), batch 3
  // at 1,100 1.21x, batch 2 has no reference row; prefill chunk 200 at prefix 0 0.9x.
  StepProfile here;
  here.decode = {{1, {100, 600}, {11, 99}}, {3, {1100}, {32 * 1.21}}, {2, {100}, {5}}};
  here.prefill = {{200, {0}, {8 * 0.9}}};
  const SpeedProbe s = profile_speed(here, grid());
  REQUIRE(s.points.size() == 3);
  CHECK(s.points[0].decode);
  CHECK(s.points[0].size == 1);
  CHECK(s.points[0].point == 100);
  CHECK(s.points[0].profile_ms == 10);
  CHECK(s.points[0].measured_ms == 11);
  CHECK(s.decode == Approx(std::pow(1.1, 1.5)).epsilon(1e-12));  // sqrt(1.1 x 1.21)
  CHECK(s.prefill == Approx(0.9).epsilon(1e-12));
  CHECK_FALSE(s.points[2].decode);
  // Nothing shared: factors of 1 and no points.
  StepProfile none;
  none.decode = {{7, {100}, {1}}};
  const SpeedProbe z = profile_speed(none, grid());
  CHECK(z.points.empty());
  CHECK(z.decode == 1);
  CHECK(z.prefill == 1);
}

TEST_CASE("profile: one row or one point is flat in that direction") {
  StepProfile p = grid();
  p.decode = {{8, {1000}, {7}}};
  const ProfiledStepTime t(p);
  CHECK(t.step_time(decode_step(1, 10)) == ms(7));
  CHECK(t.step_time(decode_step(64, 5000)) == ms(7));
}

TEST_CASE("profile: decode steps up to the largest graph size replay a padded graph") {
  // Graph decode rows: batch 2 at 6 ms flat, batch 4 rises 8 -> 18 ms over contexts 100 -> 1100.
  auto graphs = std::make_shared<StepProfile>(grid());
  graphs->mode = "graphs";
  graphs->decode = {{2, {100}, {6}}, {4, {100, 1100}, {8, 18}}};
  const ProfiledStepTime t(grid(), graphs, {1, 2, 4});
  REQUIRE(t.graphs() == graphs.get());
  CHECK(t.describe() == "h200/llama-3.1-8b (eager; decode as CUDA graphs of 3 sizes)");
  CHECK(t.step_time(decode_step(2, 600)) == ms(6));
  // 3 sequences pad to the graph of 4: its row at the same KV work over 4 rows (450 tokens).
  CHECK(t.step_time(decode_step(3, 600)) == ms(11.5));
  CHECK(t.step_time(decode_step(4, 450)) == ms(11.5));
  // Batch 1 is below the graph rows: rows 2 and 4 extend linearly (6 - (8 - 6) / 2 = 5 ms).
  CHECK(t.step_time(decode_step(1, 100)) == ms(5));
  // Above the largest size, and every step with a prefill chunk, stay eager.
  CHECK(t.step_time(decode_step(5, 600)) ==
        ProfiledStepTime(grid()).step_time(decode_step(5, 600)));
  StepShape mixed = decode_step(2, 600);
  mixed.new_tokens = 101;
  mixed.attn_pairs = 100 * 101 / 2.0 + 600;
  mixed.decode_seqs = 1;
  mixed.decode_kv_tokens = 600;
  CHECK(t.step_time(mixed) == ProfiledStepTime(grid()).step_time(mixed));
  // No sizes, or no graph profile: eager everywhere.
  CHECK(ProfiledStepTime(grid(), graphs, {}).graphs() == nullptr);
  CHECK(ProfiledStepTime(grid(), nullptr, {1, 2}).graphs() == nullptr);
  CHECK(ProfiledStepTime(grid(), graphs, {}).step_time(decode_step(2, 600)) == ms(18.5));
  // The graph profile must be one.
  auto eager = std::make_shared<StepProfile>(grid());
  CHECK_THROWS_WITH(ProfiledStepTime(grid(), eager, {1}), Catch::Contains("not graphs"));
  CHECK_THROWS_AS(ProfiledStepTime(grid(), graphs, {4, 2}), std::invalid_argument);

  // The graph of 4 runs its rows at once: 3 sequences of 600 tokens take its row at their own
  // context (8 + 10 x 500 / 1000 = 13 ms), not at 450 over 4 rows (11.5 ms); a full batch is
  // unchanged, and sizes not flagged spread the work as before.
  const ProfiledStepTime once(grid(), graphs, {1, 2, 4}, {false, false, true});
  CHECK(once.step_time(decode_step(3, 600)) == ms(13));
  CHECK(t.step_time(decode_step(3, 600)) == ms(11.5));
  CHECK(once.step_time(decode_step(4, 600)) == t.step_time(decode_step(4, 600)));
  CHECK(once.step_time(decode_step(1, 100)) == t.step_time(decode_step(1, 100)));
  CHECK_THROWS_WITH(ProfiledStepTime(grid(), graphs, {1, 2, 4}, {true}),
                    Catch::Contains("1 rows-at-once flags for 3 graph sizes"));
}

TEST_CASE("profile: the kernels' planner marks the graph sizes whose rows run at once") {
  // Llama-3.1-8B on the H200 (8 KV heads, 132 SMs x 3 decode CTAs), graphs captured at 32K: up to
  // 16 sequences split their KV (264 / (8 x 16) = 2 splits); 24-48 run unsplit in one wave of 396
  // slots; from 56 (448 CTAs) on they take more than one wave.
  const ServingConfig c =
      load_serving_config(source_root() + "/experiments/serving_measured.yaml", {});
  const std::vector<uint32_t> sizes{1, 8, 16, 24, 32, 40, 48, 56, 256};
  CHECK(graph_rows_at_once(c.model, c.gpu, sizes, 16384) ==
        std::vector<bool>{false, false, false, true, true, true, true, false, false});
}

TEST_CASE("profile: validation names what is wrong") {
  StepProfile p = grid();
  CHECK(check_step_profile(p).empty());
  p.decode[1].size = 1;
  CHECK(check_step_profile(p).find("ascend by size") != std::string::npos);
  p = grid();
  p.prefill[0].ms.pop_back();
  CHECK(check_step_profile(p).find("2 points but 1 times") != std::string::npos);
  p = grid();
  p.decode[0].ms[1] = NAN;
  CHECK(check_step_profile(p).find("not a positive number") != std::string::npos);
  p = grid();
  p.decode.clear();
  CHECK_THROWS_AS(ProfiledStepTime(p), std::invalid_argument);
}

TEST_CASE("profile: calibrate's decode batches are checked before any GPU work") {
  CHECK(check_decode_batches({1, 2, 4, 8, 16, 24, 512}, 512).empty());
  CHECK(check_decode_batches({}, 512) == "no batch size given");
  CHECK(check_decode_batches({0, 8}, 512) == "batch 0 is outside 1..512");
  CHECK(check_decode_batches({8, 513}, 512) == "batch 513 is outside 1..512");
  CHECK(check_decode_batches({8, 8}, 512) == "batches must ascend (8 after 8)");
  CHECK(check_decode_batches({16, 8}, 512) == "batches must ascend (8 after 16)");
  CHECK(check_prefill_chunks({16, 64, 128, 384, 8192}, 8192).empty());
  CHECK(check_prefill_chunks({}, 8192) == "no chunk size given");
  CHECK(check_prefill_chunks({16, 8193}, 8192) == "chunk 8193 is outside 1..8192");
  CHECK(check_prefill_chunks({512, 384}, 8192) == "chunks must ascend (384 after 512)");
}

TEST_CASE("profile file: round trip and located errors") {
  TempDir dir;
  StepProfile p = grid();
  p.measured = "NVIDIA H200, test";
  const std::string text = format_step_profile(p, {"written by a test"});
  const std::string path = dir.write("p.yaml", text);
  const StepProfile back = load_step_profile(ConfigNode::load_file(path));
  CHECK(back.gpu == "h200");
  CHECK(back.model == "llama-3.1-8b");
  CHECK(back.measured == "NVIDIA H200, test");
  REQUIRE(back.decode.size() == 2);
  CHECK(back.decode[1].size == 3);
  CHECK(back.decode[1].points == std::vector<uint32_t>{100, 1100});
  CHECK(back.decode[1].ms == std::vector<double>{12, 32});
  REQUIRE(back.prefill.size() == 2);
  CHECK(back.prefill[1].ms == std::vector<double>{8, 28});

  const std::string bad = dir.write(
      "bad.yaml", replace_once(text, "{batch: 3, contexts: [100, 1100], ms: [12.0000, 32.0000]}",
                               "{batch: 3, contexts: [1100, 100], ms: [12, 32]}"));
  try {
    load_step_profile(ConfigNode::load_file(bad));
    FAIL("a descending context list loaded");
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    CHECK(msg.find(bad + ":" + std::to_string(line_of(text, "  - {batch: 3")) + ":") == 0);
    CHECK(msg.find("decode[1].contexts: must ascend") != std::string::npos);
  }
  const std::string typo = dir.write("typo.yaml", replace_once(text, "mode:", "mdoe:"));
  CHECK_THROWS_WITH(load_step_profile(ConfigNode::load_file(typo)),
                    Catch::Contains("mdoe") && Catch::Contains("did you mean 'mode'"));
  CHECK(step_profile_path("/x/configs/gpus/h200.yaml", "qwen3-8b") ==
        "/x/configs/gpus/h200.profiles/qwen3-8b.yaml");
  CHECK(step_profile_path("/x/configs/gpus/h200.yaml", "qwen3-8b", true) ==
        "/x/configs/gpus/h200.profiles/qwen3-8b.graphs.yaml");
  // A rank's profile under tensor parallelism: its own file, and its size round-trips.
  CHECK(step_profile_path("/x/configs/gpus/h200.yaml", "qwen3-8b", true, 2) ==
        "/x/configs/gpus/h200.profiles/qwen3-8b.tp2.graphs.yaml");
  CHECK(step_profile_file("qwen3-8b", false, 4) == "qwen3-8b.tp4.yaml");
  CHECK(step_profile_file("qwen3-8b", false, 1) == "qwen3-8b.yaml");
  CHECK(back.tensor_parallel == 1);
  CHECK(text.find("tensor_parallel") == std::string::npos);
  p.tensor_parallel = 2;
  const std::string tp_text = format_step_profile(p, {});
  CHECK(tp_text.find("tensor_parallel: 2\nall_reduce: nccl\n") != std::string::npos);
  CHECK(load_step_profile(ConfigNode::load_file(dir.write("tp.yaml", tp_text))).tensor_parallel ==
        2);
  // The all-reduce the steps ran on round-trips; a file without the key ran NCCL's.
  p.all_reduce = "custom";
  CHECK(load_step_profile(ConfigNode::load_file(dir.write("c.yaml", format_step_profile(p, {}))))
            .all_reduce == "custom");
  CHECK_THROWS_WITH(load_step_profile(ConfigNode::load_file(dir.write(
                        "bad.yaml", replace_once(format_step_profile(p, {}), "all_reduce: custom",
                                                 "all_reduce: nvls")))),
                    Catch::Contains("all_reduce"));
}

namespace {

// A serving experiment of two runs (auto, and engine.step_time: roofline) over a copy of
// h200.yaml in a folder of its own, and the profile the cases write beside it: every step 40 ms.
struct ProfiledExperiment {
  TempDir dir;
  std::string exp, path;
  StepProfile p = grid();
  ProfiledExperiment() {
    const std::string root = source_root();
    fs::create_directories(dir.path() / "gpus" / "h200.profiles");
    fs::copy_file(fs::path(root) / "configs/gpus/h200.yaml", dir.path() / "gpus/h200.yaml");
    exp = R"(experiment: profiled
gpu: gpus/h200.yaml
model: )" +
          model_file() + R"(
engine: {kv_budget: 4GiB, max_model_len: 4096}
kv: {impl: paged_block_pool}
requests: {source: synthetic, count: 40, arrival: {process: poisson, rate: 10},
           prompt: {dist: fixed, value: 200}, output: {dist: fixed, value: 50}}
runs:
  - label: auto
  - label: roofline
    engine: {step_time: roofline}
)";
    path = dir.write("exp.yaml", exp);
    p.decode = {{1, {100, 10000}, {40, 40}}, {256, {100, 10000}, {40, 40}}};  // 40 ms a step
    p.prefill = {{1, {0, 10000}, {40, 40}}, {8192, {0, 10000}, {40, 40}}};
  }
  void write_profile() const {
    dir.write("gpus/h200.profiles/llama-3.1-8b.yaml", format_step_profile(p, {}));
  }
};

}  // namespace

TEST_CASE("a serving experiment without a profile uses the roofline") {
  ProfiledExperiment x;
  const TempDir& dir = x.dir;
  const std::string& exp = x.exp;
  const std::string& path = x.path;
  // No profile yet: both runs use the roofline, and step_time: profile is an error.
  ServingConfig plain = load_serving_config(path, {});
  CHECK(profiles_for(plain, std::nullopt).eager == nullptr);
  CHECK_THROWS_WITH(load_serving_config(
                        dir.write("noprof.yaml", exp + "step_profile_scale: {decode: 0.9}\n"), {}),
                    Catch::Contains("noprof.yaml:") &&
                        Catch::Contains("scales the step profile, but") &&
                        Catch::Contains("does not exist"));
  CHECK_THROWS_WITH(load_serving_config(path, {"engine.step_time=profile"}),
                    Catch::Contains("h200.profiles/llama-3.1-8b.yaml does not exist"));
  // engine.gpu_step: model times every layer, so gpu_layers makes no sense with it.
  CHECK(load_serving_config(path, {"engine.gpu_step=model"}).runs[0].gpu_step == "model");
  CHECK_THROWS_WITH(load_serving_config(path, {"engine.gpu_step=model", "engine.gpu_layers=2"}),
                    Catch::Contains("exp.yaml:") && Catch::Contains("drop engine.gpu_layers"));
  CHECK_THROWS_WITH(load_serving_config(path, {"engine.gpu_step=modle"}),
                    Catch::Contains("did you mean 'model'"));
}

TEST_CASE("a serving experiment uses the (gpu, model) profile beside the GPU file, with its band") {
  ProfiledExperiment x;
  const std::string& path = x.path;
  const ServingConfig plain = load_serving_config(path, {});  // before the profile exists
  x.write_profile();
  const ServingConfig c = load_serving_config(path, {});
  REQUIRE(profiles_for(c, std::nullopt).eager != nullptr);
  const ServingResults r = run_serving_experiment(c);
  REQUIRE(r.runs.size() == 2);
  const ServingResult& prof = r.runs[0].result;
  const ServingResult& roof = r.runs[1].result;
  REQUIRE(prof.error.empty());
  REQUIRE(roof.error.empty());
  CHECK(prof.step_time_source == "profile h200/llama-3.1-8b (eager)");
  CHECK(roof.step_time_source == "roofline");
  // Every step takes 40 ms with the profile, and a running request is in every step: its time per
  // output token is exactly that. The roofline's steps take a few ms.
  CHECK(prof.tpot_ms.p50 == Approx(40.0).margin(1e-6));
  CHECK(prof.tpot_ms.p99 == Approx(40.0).margin(1e-6));
  CHECK(roof.tpot_ms.p50 < 20.0);

  // The prediction's band: every step at 40 x (0.99, 0.995, 1.005, 1.01) ms, so the time per
  // output token spans 39.6..40.4 ms; the roofline run has no profile to scale.
  const PredictionBand band = prediction_band(c, r, 0.01, 2);
  REQUIRE(band.runs.size() == 2);
  CHECK(band.rel == 0.01);
  CHECK(band.runs[0].ok);
  CHECK(std::string(kServingMetrics[3].name) == "TPOT p50");
  CHECK(band.runs[0].lo[3] == Approx(39.6).margin(1e-6));
  CHECK(band.runs[0].hi[3] == Approx(40.4).margin(1e-6));
  CHECK(band.runs[0].lo[6] < prof.e2e_ms.p99);
  CHECK(band.runs[0].hi[6] > prof.e2e_ms.p99);
  CHECK(band.runs[0].hi[0] > band.runs[0].lo[0]);  // tok/s
  for (size_t m = 0; m < kServingMetricCount; ++m) {
    INFO(kServingMetrics[m].name);
    CHECK(band.runs[0].lo[m] <= kServingMetrics[m].of(prof));
    CHECK(band.runs[0].hi[m] >= kServingMetrics[m].of(prof));
    CHECK(band.runs[1].lo[m] == kServingMetrics[m].of(roof));
    CHECK(band.runs[1].hi[m] == kServingMetrics[m].of(roof));
  }
  CHECK(prediction_band(plain, run_serving_experiment(plain), 0.01, 2).runs.empty());
  CHECK_THROWS_AS(prediction_band(c, r, 0, 2), std::invalid_argument);
  CHECK_THROWS_AS(prediction_band(c, r, 0.01, 0), std::invalid_argument);
}

TEST_CASE("step_profile_scale scales the profile: another machine's speed") {
  ProfiledExperiment x;
  x.write_profile();
  const TempDir& dir = x.dir;
  const std::string& exp = x.exp;
  // step_profile_scale: another machine's speed. At 0.75 every step takes 30 ms.
  const std::string scaled_path =
      dir.write("scaled.yaml", exp + "step_profile_scale: {decode: 0.75, prefill: 0.75}\n");
  const ServingConfig cs = load_serving_config(scaled_path, {"engine.enforce_eager=true"});
  CHECK(cs.profile_decode_scale == 0.75);
  CHECK(cs.profile_prefill_scale == 0.75);
  const ServingResults rs = run_serving_experiment(cs);
  const ServingResult& sc = rs.runs[0].result;
  REQUIRE(sc.error.empty());
  CHECK(sc.step_time_source ==
        "profile h200/llama-3.1-8b (eager, scaled: decode x0.750, prefill x0.750)");
  CHECK(sc.tpot_ms.p50 == Approx(30.0).margin(1e-6));
  CHECK(sc.tpot_ms.p99 == Approx(30.0).margin(1e-6));
  // with_profile_scale on top of it multiplies: 0.75 x 2 = 1.5, 60 ms steps.
  const ServingConfig twice = with_profile_scale(cs, 2.0, 2.0);
  CHECK(twice.profile_decode_scale == 1.5);
  CHECK(run_serving_experiment(twice).runs[0].result.tpot_ms.p50 == Approx(60.0).margin(1e-6));
  // Apart: pure decode steps at 30 ms, steps with a prefill chunk at 50.
  const ServingResults split = run_serving_experiment(load_serving_config(
      scaled_path, {"engine.enforce_eager=true", "step_profile_scale.prefill=1.25"}));
  CHECK(split.runs[0].result.tpot_ms.p50 > 30.0);
  CHECK(split.runs[0].result.tpot_ms.p50 < 50.0);
  CHECK(split.runs[0].result.ttft_ms.p50 > sc.ttft_ms.p50);
  CHECK_THROWS_WITH(
      load_serving_config(scaled_path, {"step_profile_scale.decode=0"}),
      Catch::Contains("step_profile_scale.decode") && Catch::Contains("out of range"));
  CHECK_THROWS_WITH(
      load_serving_config(dir.write("typo.yaml", exp + "step_profile_scale: {decod: 0.9}\n"), {}),
      Catch::Contains("typo.yaml:") && Catch::Contains("did you mean 'decode'"));
}

TEST_CASE("a graph profile prices the decode steps of runs that capture graphs") {
  ProfiledExperiment x;
  x.write_profile();
  const TempDir& dir = x.dir;
  const std::string& path = x.path;
  const StepProfile& p = x.p;
  // A graph profile beside it prices the decode steps of runs that capture graphs (vLLM's
  // default), here 30 ms a step; enforce_eager runs keep the eager profile.
  StepProfile g = p;
  g.mode = "graphs";
  g.decode = {{1, {100, 10000}, {30, 30}}, {256, {100, 10000}, {30, 30}}};
  dir.write("gpus/h200.profiles/llama-3.1-8b.graphs.yaml", format_step_profile(g, {}));
  const ServingConfig cg = load_serving_config(path, {});
  REQUIRE(profiles_for(cg, std::nullopt).graphs != nullptr);
  const ServingResults rg = run_serving_experiment(cg);
  const ServingResult& graphed = rg.runs[0].result;
  REQUIRE(graphed.error.empty());
  CHECK(graphed.step_time_source == "profile h200/llama-3.1-8b (eager; decode as CUDA graphs of " +
                                        std::to_string(rg.runs[0].budget.capture_sizes.size()) +
                                        " sizes)");
  // Pure decode steps take 30 ms, steps with a prefill chunk still 40.
  CHECK(graphed.tpot_ms.p50 >= 30.0 - 1e-6);
  CHECK(graphed.tpot_ms.p50 < 40.0);
  const ServingResults re =
      run_serving_experiment(load_serving_config(path, {"engine.enforce_eager=true"}));
  CHECK(re.runs[0].result.tpot_ms.p50 == Approx(40.0).margin(1e-6));
  // Each file holds its own mode.
  dir.write("gpus/h200.profiles/llama-3.1-8b.graphs.yaml", format_step_profile(p, {}));
  CHECK_THROWS_WITH(load_serving_config(path, {}),
                    Catch::Contains("llama-3.1-8b.graphs.yaml:") &&
                        Catch::Contains("is eager, but this file holds the graphs profile"));
  fs::remove(dir.path() / "gpus/h200.profiles/llama-3.1-8b.graphs.yaml");

  StepProfile other = p;
  other.model = "qwen3-8b";
  dir.write("gpus/h200.profiles/llama-3.1-8b.yaml", format_step_profile(other, {}));
  CHECK_THROWS_WITH(load_serving_config(path, {}),
                    Catch::Contains("model: is not the experiment's model llama-3.1-8b"));
}

TEST_CASE("an fp8 KV cache's runs are priced by the fp8 profile (<model>.fp8.yaml)") {
  ProfiledExperiment x;
  const TempDir& dir = x.dir;
  const std::string fp8_runs = x.exp +
                               "  - label: fp8\n    engine: {kv_cache_dtype: fp8}\n"
                               "  - label: e5m2\n    engine: {kv_cache_dtype: fp8_e5m2}\n";
  const std::string path = dir.write("fp8.yaml", fp8_runs);
  CHECK(step_profile_file("qwen3-8b", false, 1, DType::kFP8) == "qwen3-8b.fp8.yaml");
  CHECK(step_profile_file("qwen3-8b", true, 2, DType::kFP8) == "qwen3-8b.tp2.fp8.graphs.yaml");
  CHECK(step_profile_file("qwen3-8b", false, 1, DType::kFP8E5M2) == "qwen3-8b.fp8_e5m2.yaml");

  // Only the bf16 profile: the fp8 runs take the roofline, and step_time: profile on one of them
  // names the missing file and the command that writes it.
  x.write_profile();
  const std::string fp8_file = "gpus/h200.profiles/llama-3.1-8b.fp8.yaml";
  {
    const ServingConfig c = load_serving_config(path, {});
    REQUIRE(c.profiles.count(DType::kFP8) == 1);
    CHECK(c.profiles.at(DType::kFP8).eager == nullptr);
    CHECK_THAT(c.profiles.at(DType::kFP8).note,
               Catch::Contains("with an fp8 KV cache") && Catch::Contains("--kv-cache-dtype fp8"));
    const ServingResults r = run_serving_experiment(c);
    REQUIRE(r.runs.size() == 4);
    CHECK(r.runs[2].result.step_time_source == "roofline");
    CHECK_THROWS_WITH(load_serving_config(path, {"runs.2.engine.step_time=profile"}),
                      Catch::Contains("fp8.yaml:") &&
                          Catch::Contains("llama-3.1-8b.fp8.yaml does not exist") &&
                          Catch::Contains("--kv-cache-dtype fp8 writes it"));
  }
  // The fp8 profile (every step 20 ms) prices the fp8 run; bf16 keeps its 40 ms and e5m2, which
  // has none, the roofline.
  StepProfile f = x.p;
  f.kv_cache_dtype = DType::kFP8;
  f.decode = {{1, {100, 10000}, {20, 20}}, {256, {100, 10000}, {20, 20}}};
  f.prefill = {{1, {0, 10000}, {20, 20}}, {8192, {0, 10000}, {20, 20}}};
  dir.write(fp8_file, format_step_profile(f, {}));
  const ServingConfig c = load_serving_config(path, {});
  REQUIRE(c.profiles.at(DType::kFP8).eager != nullptr);
  const ServingResults r = run_serving_experiment(c);
  REQUIRE(r.runs.size() == 4);
  for (const ServingRunResult& o : r.runs) REQUIRE(o.result.error.empty());
  CHECK(r.runs[0].result.step_time_source == "profile h200/llama-3.1-8b (eager)");
  CHECK(r.runs[0].result.tpot_ms.p50 == Approx(40.0).margin(1e-6));
  CHECK(r.runs[1].result.step_time_source == "roofline");
  CHECK(r.runs[2].result.step_time_source == "profile h200/llama-3.1-8b (eager, fp8 KV cache)");
  CHECK(r.runs[2].result.tpot_ms.p50 == Approx(20.0).margin(1e-6));
  CHECK(r.runs[2].result.tpot_ms.p99 == Approx(20.0).margin(1e-6));
  CHECK(r.runs[3].result.step_time_source == "roofline");
  // Each run's step-time line names its own profile, or why it has none.
  const std::string table = format_serving_table(c, r);
  CHECK_THAT(table, Catch::Contains("step time: profile h200/llama-3.1-8b (eager, fp8 KV cache) (" +
                                    (dir.path() / fp8_file).string() + ")") &&
                        Catch::Contains("no measured profile of llama-3.1-8b with an fp8_e5m2 KV "
                                        "cache"));
  // The band and step_profile_scale move the fp8 profile's steps too.
  const PredictionBand band = prediction_band(c, r, 0.01, 2);
  REQUIRE(band.runs.size() == 4);
  CHECK(band.runs[2].lo[3] == Approx(19.8).margin(1e-6));
  CHECK(band.runs[2].hi[3] == Approx(20.2).margin(1e-6));
  const ServingResults half = run_serving_experiment(with_profile_scale(c, 0.5, 0.5));
  CHECK(half.runs[2].result.tpot_ms.p50 == Approx(10.0).margin(1e-6));
  CHECK(half.runs[0].result.tpot_ms.p50 == Approx(20.0).margin(1e-6));

  // The file holds its cache's dtype: a bf16 profile at the fp8 path is refused, and the key
  // round-trips (fp8_e4m3 is fp8).
  const std::string fp8_text = format_step_profile(f, {});
  CHECK(fp8_text.find("kv_cache_dtype: fp8\n") != std::string::npos);
  CHECK(
      load_step_profile(ConfigNode::load_file(dir.write(
                            "e4m3.yaml", replace_once(fp8_text, "dtype: fp8", "dtype: fp8_e4m3"))))
          .kv_cache_dtype == DType::kFP8);
  CHECK_THROWS_WITH(load_step_profile(ConfigNode::load_file(
                        dir.write("bad.yaml", replace_once(fp8_text, "dtype: fp8", "dtype: fp9")))),
                    Catch::Contains("kv_cache_dtype") && Catch::Contains("did you mean 'fp8'"));
  dir.write(fp8_file, format_step_profile(x.p, {}));
  CHECK_THROWS_WITH(load_serving_config(path, {}),
                    Catch::Contains("llama-3.1-8b.fp8.yaml:") &&
                        Catch::Contains("holds steps over a kv_cache_dtype auto cache, but this "
                                        "file is the fp8 one's profile"));
}

TEST_CASE("under tensor parallelism a rank's profile (tp<N>) prices its steps, collectives in it") {
  ProfiledExperiment x;
  const std::string tp2 = x.dir.write("tp2.yaml", x.exp + "parallel: {tensor_parallel_size: 2}\n");
  // No TP-2 profile: the roofline plus the collectives; step_time: profile names the file to make.
  const ServingConfig none = load_serving_config(tp2, {});
  CHECK(profiles_for(none, std::nullopt).eager == nullptr);
  CHECK_THROWS_WITH(load_serving_config(tp2, {"engine.step_time=profile"}),
                    Catch::Contains("h200.profiles/llama-3.1-8b.tp2.yaml does not exist") &&
                        Catch::Contains("--tensor-parallel 2"));
  const ServingResults roof = run_serving_experiment(none);
  REQUIRE(roof.runs[0].result.error.empty());
  CHECK(roof.runs[0].result.step_time_source.rfind("roofline + collectives (", 0) == 0);
  // One GPU's profile does not price a TP-2 rank.
  x.write_profile();
  CHECK(profiles_for(load_serving_config(tp2, {}), std::nullopt).eager == nullptr);
  // The rank's profile: every step 40 ms, collectives included (nothing is added to it).
  StepProfile p = x.p;
  p.tensor_parallel = 2;
  p.all_reduce = "custom";  // vLLM's default, as the experiment's parallel section leaves it
  const std::string file =
      x.dir.write("gpus/h200.profiles/llama-3.1-8b.tp2.yaml", format_step_profile(p, {}));
  const ServingConfig c = load_serving_config(tp2, {});
  REQUIRE(profiles_for(c, std::nullopt).eager != nullptr);
  CHECK(profiles_for(c, std::nullopt).path == file);
  const ServingResults r = run_serving_experiment(c);
  REQUIRE(r.runs.size() == 2);
  REQUIRE(r.runs[0].result.error.empty());
  CHECK(r.runs[0].result.step_time_source ==
        "profile h200/llama-3.1-8b (eager, one rank of TP 2, custom all-reduce)");
  CHECK(r.runs[0].result.tpot_ms.p50 == Approx(40.0).margin(1e-6));
  CHECK(r.runs[1].result.step_time_source.rfind("roofline + collectives (", 0) == 0);
  // Steps measured with another all-reduce than the experiment's are refused, naming both; the
  // experiment that asks for NCCL takes them.
  p.all_reduce = "nccl";
  x.dir.write("gpus/h200.profiles/llama-3.1-8b.tp2.yaml", format_step_profile(p, {}));
  CHECK_THROWS_WITH(load_serving_config(tp2, {}),
                    Catch::Contains("llama-3.1-8b.tp2.yaml:") &&
                        Catch::Contains("measured with the nccl all-reduce") &&
                        Catch::Contains("--all-reduce custom"));
  CHECK(profiles_for(load_serving_config(tp2, {"parallel.custom_all_reduce=false"}), std::nullopt)
            .eager != nullptr);
  // A file of another size's steps is refused, naming it.
  p.tensor_parallel = 4;
  x.dir.write("gpus/h200.profiles/llama-3.1-8b.tp2.yaml", format_step_profile(p, {}));
  CHECK_THROWS_WITH(load_serving_config(tp2, {}),
                    Catch::Contains("llama-3.1-8b.tp2.yaml:") &&
                        Catch::Contains("holds steps at tensor_parallel 4"));
}

namespace {

// An executor whose every step fails (a rank's GPU step that could not run).
class FailingExecutor final : public StepExecutor {
 public:
  Status begin(KvCacheManager&, Backend&, DevPtr, uint64_t) override { return {}; }
  Status run_step(const StepWork&) override {
    return make_error(ErrorCode::kDriverError, "the step could not run");
  }
  Status swap_out(SeqId, SeqId, const TokenContent&, uint32_t) override { return {}; }
  Status swap_in(SeqId, const TokenContent&, uint32_t) override { return {}; }
  Status swap_drop(SeqId) override { return {}; }
  void end() override {}
  ExecutorReport report() const override { return {}; }
};

}  // namespace

TEST_CASE("a failed run is reported through hooks.failed before the next run starts") {
  // A tensor-parallel rank ends itself there, so that its peers do not meet the next run's
  // collectives; here the hook records the order.
  ProfiledExperiment x;
  const ServingConfig c = load_serving_config(x.path, {});
  REQUIRE(c.runs.size() == 2);
  std::vector<std::string> events;
  ServingRunHooks hooks;
  hooks.serial = true;
  hooks.customize = [&](const ServingRunSpec& spec, EngineConfig& e) {
    events.push_back("start " + spec.label);
    if (spec.label == "auto") e.executor = [] { return std::make_unique<FailingExecutor>(); };
  };
  hooks.failed = [&](const ServingRunSpec& spec, const std::string& error) {
    events.push_back("failed " + spec.label + ": " + error);
  };
  const ServingResults r = run_serving_experiment(c, hooks);
  REQUIRE(events.size() == 3);
  CHECK(events[0] == "start auto");
  CHECK(events[1].rfind("failed auto: ", 0) == 0);
  CHECK(events[1].find("the step could not run") != std::string::npos);
  CHECK(events[2] == "start roofline");
  CHECK_FALSE(r.runs[0].result.error.empty());
  CHECK(r.runs[1].result.error.empty());
}
