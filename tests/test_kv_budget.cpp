// KV-cache budget: exact byte figures for Llama-3.1-8B on an H200, eager mode, capture sizes,
// and the out-of-memory outcomes (an error value with the shortfall, never a crash).
#include <catch2/catch.hpp>

#include <string>

#include "src/config/loaders.h"
#include "src/serve/kv_budget.h"
#include "tests/config_test_util.h"

using namespace memsim;
using namespace memsim::test;

namespace {

constexpr uint64_t kActivationPeak = 822312960;      // 784.2 MiB
constexpr uint64_t kActivationReserved = 991952896;  // 946.0 MiB
constexpr uint64_t kGraphMemory = 729808896;         // 696.0 MiB

KvBudgetInput llama8b_h200() {
  KvBudgetInput in;
  in.model = load_model_shape(ConfigNode::load_file(model_file()));
  in.gpu = load_gpu_spec(ConfigNode::load_file(gpu_file()));
  return in;
}

}  // namespace

TEST_CASE("kv budget: Llama-3.1-8B on an H200 at utilization 0.9, shared_pool", "[kv_budget]") {
  const KvBudgetInput in = llama8b_h200();
  const Result<KvBudget> r = compute_kv_budget(in);
  REQUIRE(r.ok());
  const KvBudget& b = *r;
  CHECK(b.capacity == 146591680ull * 1024);
  CHECK(b.usable == 135098892288ull);  // floor(0.9 x 150109880320)
  CHECK(b.weights == in.model.weight_bytes());
  CHECK(b.weights == 16060522496ull);
  CHECK(b.activation_peak == kActivationPeak);
  CHECK(b.activation_reserved_peak == kActivationReserved);
  CHECK(b.graph_memory == kGraphMemory);
  CHECK(b.kv_bytes == b.usable - b.weights - b.activation_peak - b.graph_memory);
  CHECK(b.kv_bytes_per_token == 131072);
  CHECK(b.kv_tokens == b.kv_bytes / 131072);
  CHECK(b.kv_blocks == b.kv_bytes / (16 * 131072));
  CHECK(b.capture_sizes.size() == 51);  // vLLM's list at max_num_seqs 256: 1..512
  CHECK(b.capture_sizes.back() == 512);
  CHECK(b.sampler_rows == 256);
  CHECK(b.activation_reserved_peak >= b.activation_peak);

  const std::string text = format_kv_budget(b);
  CHECK_THAT(text, Catch::Contains("= kv cache"));
  CHECK_THAT(text, Catch::Contains(std::to_string(b.kv_bytes)));
}

// SGLang's rule (ModelRunner._profile_available_bytes): rest = post-load free - pre-load free x
// (1 - mem_fraction_static) = F x free - weights, with nothing else subtracted. At 0.8 on the
// H200, whose CUDA context holds 552,402,944 of its 150,109,880,320 bytes before the engine
// starts: floor(0.8 x 149,557,477,376) - 16,060,522,496 = 103,585,459,404 bytes of KV; the
// activation peak and the graphs are what they are under vLLM's rule, and live in the rest.
TEST_CASE("kv budget: SGLang's mem_fraction_static", "[kv_budget]") {
  KvBudgetInput in = llama8b_h200();
  in.mem_fraction_static = 0.8;
  const Result<KvBudget> r = compute_kv_budget(in);
  REQUIRE(r.ok());
  CHECK(r->usable == 119645981900ull);
  CHECK(r->kv_bytes == 119645981900ull - 16060522496ull);
  CHECK(r->activation_peak == kActivationPeak);
  CHECK(r->graph_memory == kGraphMemory);
  CHECK(r->mem_fraction_static == 0.8);
  const std::string text = format_kv_budget(*r);
  CHECK_THAT(text, Catch::Contains("mem_fraction_static 0.8 x the memory free before the weights"));
  CHECK_THAT(text, Catch::Contains("the rest (27.86 GiB) holds the activation peak and graph "
                                   "memory (1.45 GiB)\n"));
  // At 0.1 the weights alone leave no room: the error says so, with the shortfall.
  in.mem_fraction_static = 0.1;
  const Result<KvBudget> none = compute_kv_budget(in);
  REQUIRE(!none.ok());
  CHECK(none.error().code == ErrorCode::kOutOfMemory);
  CHECK_THAT(none.error().message, Catch::Contains("mem_fraction_static 0.100") &&
                                       Catch::Contains("leave less than one KV block"));
  in.mem_fraction_static = 1.0;
  CHECK(compute_kv_budget(in).error().code == ErrorCode::kInvalidArgument);
}

TEST_CASE("kv budget: enforce_eager has no graph memory", "[kv_budget]") {
  KvBudgetInput in = llama8b_h200();
  const Result<KvBudget> graphs = compute_kv_budget(in);
  in.enforce_eager = true;
  const Result<KvBudget> eager = compute_kv_budget(in);
  REQUIRE(graphs.ok());
  REQUIRE(eager.ok());
  CHECK(eager->graph_memory == 0);
  CHECK(eager->capture_sizes.empty());
  CHECK(eager->activation_peak == graphs->activation_peak);
  CHECK(eager->kv_bytes == graphs->kv_bytes + graphs->graph_memory);
}

TEST_CASE("kv budget: capture sizes follow vLLM's cap", "[kv_budget]") {
  KvBudgetInput in = llama8b_h200();
  in.max_num_seqs = 8;  // min(2 x 8, 512) = 16
  CHECK(kv_budget_capture_sizes(in) == std::vector<uint32_t>{1, 2, 4, 8, 16});
  in.max_num_batched_tokens = 6;  // and never above the token budget
  CHECK(kv_budget_capture_sizes(in) == std::vector<uint32_t>{1, 2, 4});
  in.capture_sizes = {64, 2, 2, 5};  // an explicit list: deduplicated, sorted, capped
  CHECK(kv_budget_capture_sizes(in) == std::vector<uint32_t>{2, 5});
  in.enforce_eager = true;
  CHECK(kv_budget_capture_sizes(in).empty());
}

TEST_CASE("kv budget: too small a utilization is an out-of-memory outcome", "[kv_budget]") {
  KvBudgetInput in = llama8b_h200();
  in.gpu_memory_utilization = 0.1;  // 14 GB usable < 16 GB of weights
  const Result<KvBudget> r = compute_kv_budget(in);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == ErrorCode::kOutOfMemory);
  in.gpu_memory_utilization = 0.9;
  const Result<KvBudget> ok = compute_kv_budget(in);
  REQUIRE(ok.ok());
  const uint64_t usable = static_cast<uint64_t>(0.1 * static_cast<double>(ok->capacity));
  const uint64_t needed = ok->weights + ok->activation_peak + ok->graph_memory;
  CHECK(r.error().bytes_short == needed + 16 * 131072 - usable);  // short of one KV block
  CHECK_THAT(r.error().message, Catch::Contains("no memory for the KV cache"));
}

// vLLM refuses to start when the memory free at startup (the device less the CUDA context,
// 552,402,944 B on the H200) is less than gpu_memory_utilization x total: 0.996 x
// 150,109,880,320 = 149,509,440,798 fits in 149,557,477,376; 0.997 x it = 149,659,550,679 does not.
TEST_CASE("kv budget: vLLM's startup check counts the CUDA context as not free", "[kv_budget]") {
  KvBudgetInput in = llama8b_h200();
  REQUIRE(in.gpu.context == 552402944);
  in.gpu_memory_utilization = 0.996;
  const Result<KvBudget> fits = compute_kv_budget(in);
  REQUIRE(fits.ok());
  CHECK(fits->context == 552402944);
  CHECK(fits->free_bytes() == 150109880320ull - 552402944 - 149509440798ull);
  CHECK_THAT(format_kv_budget(*fits), Catch::Contains("CUDA context"));
  in.gpu_memory_utilization = 0.997;
  const Result<KvBudget> refused = compute_kv_budget(in);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code == ErrorCode::kOutOfMemory);
  CHECK(refused.error().bytes_short == 149659550679ull - 149557477376ull);
  CHECK_THAT(refused.error().message, Catch::Contains("after the CUDA context 0.51 GiB") &&
                                          Catch::Contains("as vLLM refuses to start"));
}

TEST_CASE("kv budget: weights larger than the device", "[kv_budget]") {
  KvBudgetInput in = llama8b_h200();
  in.gpu.capacity = 8ull << 30;
  const Result<KvBudget> r = compute_kv_budget(in);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == ErrorCode::kOutOfMemory);
  CHECK(r.error().bytes_short == in.model.weight_bytes() - (8ull << 30));
  CHECK_THAT(r.error().message, Catch::Contains("do not fit"));
}

TEST_CASE("kv budget: Llama-3.1-70B fits an H200 but leaves no KV cache", "[kv_budget]") {
  KvBudgetInput in = llama8b_h200();
  in.model =
      load_model_shape(ConfigNode::load_file(source_root() + "/configs/models/llama-3.1-70b.yaml"));
  const Result<KvBudget> r = compute_kv_budget(in);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == ErrorCode::kOutOfMemory);
  CHECK(r.error().bytes_short > in.model.weight_bytes() - 135098892288ull);
}

TEST_CASE("kv budget: invalid settings are error values", "[kv_budget]") {
  KvBudgetInput in = llama8b_h200();
  in.gpu_memory_utilization = 1.5;
  CHECK(compute_kv_budget(in).error().code == ErrorCode::kInvalidArgument);
  in = llama8b_h200();
  in.graph_strategy = "shared_poool";
  const Result<KvBudget> r = compute_kv_budget(in);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == ErrorCode::kInvalidArgument);
  CHECK_THAT(r.error().message, Catch::Contains("unknown graph strategy 'shared_poool'"));
  in = llama8b_h200();
  in.max_num_batched_tokens = 0;
  CHECK(compute_kv_budget(in).error().code == ErrorCode::kInvalidArgument);
}
