// Tensor-parallel sharding: one rank's weights and KV heads under vLLM's rules, exact bytes for
// the shipped models, replicated KV heads, vocabulary padding, and odd splits refused.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "workload/tensor_parallel.h"

using namespace memsim;

namespace {

ModelShape model(const std::string& name) {
  const char* r = std::getenv("MEMSIM_SOURCE_ROOT");
  const std::string root = r != nullptr ? r : ".";
  return load_model_shape(ConfigNode::load_file(root + "/configs/models/" + name + ".yaml"));
}

uint64_t params(const ModelShape& m) {
  return m.weight_bytes() / dtype_bytes(m.dtype);
}

// Over all ranks, the sharded weights add up to the whole model plus the replicated norms held
// again by every rank but one (when nothing is padded or replicated besides them).
void check_shards_add_up(const ModelShape& m, const TensorParallelShard& s) {
  CHECK(s.tp * s.rank.weight_bytes() - (s.tp - 1) * s.replicated_weight_bytes == m.weight_bytes());
}

}  // namespace

TEST_CASE("tensor parallel: Qwen2.5-32B's parameters are its published count", "[tp]") {
  // 32,763,876,352: Qwen2.5-32B's architecture count (qkv biases, untied LM head).
  CHECK(params(model("qwen2.5-32b")) == 32763876352ull);
}

TEST_CASE("tensor parallel: Llama-3.1-70B at TP 1, 2, 4, 8", "[tp]") {
  const ModelShape m = model("llama-3.1-70b");
  CHECK(m.weight_bytes() == 141107412992ull);
  for (uint32_t tp : {1u, 2u, 4u, 8u}) {
    const Result<TensorParallelShard> s = shard_tensor_parallel(m, tp);
    REQUIRE(s.ok());
    CHECK(s->rank.heads == 64 / tp);
    CHECK(s->rank.kv_heads == 8 / tp);
    CHECK(s->kv_head_replicas == 1);
    CHECK(s->rank.intermediate == 28672 / tp);
    CHECK(s->vocab_padded == 128256);
    CHECK(s->rank.vocab == 128256 / tp);
    CHECK(s->rank.hidden == 8192);
    CHECK(s->rank.layers == 80);
    CHECK(s->rank.kv_bytes_per_token() == m.kv_bytes_per_token() / tp);
    // (2 x 80 + 1) RMSNorms of 8192 bf16 weights on every rank.
    CHECK(s->replicated_weight_bytes == 161ull * 8192 * 2);
    check_shards_add_up(m, *s);
  }
  CHECK(shard_tensor_parallel(m, 2)->rank.weight_bytes() == 70555025408ull);
  CHECK(shard_tensor_parallel(m, 8)->rank.weight_bytes() == 17640734720ull);
}

TEST_CASE("tensor parallel: Qwen2.5-32B at TP 2 keeps the qkv biases per rank", "[tp]") {
  const ModelShape m = model("qwen2.5-32b");
  const Result<TensorParallelShard> s = shard_tensor_parallel(m, 2);
  REQUIRE(s.ok());
  CHECK(s->rank.heads == 20);
  CHECK(s->rank.kv_heads == 4);
  CHECK(s->rank.weight_bytes() == 32764536832ull);
  check_shards_add_up(m, *s);
  CHECK(s->rank.kv_bytes_per_token() == 2ull * 64 * 4 * 128 * 2);
}

TEST_CASE("tensor parallel: fewer KV heads than ranks are replicated", "[tp]") {
  // Llama-3.1-8B has 8 KV heads: at TP 16 each rank holds one, every head on two ranks.
  const ModelShape m = model("llama-3.1-8b");
  const Result<TensorParallelShard> s = shard_tensor_parallel(m, 16);
  REQUIRE(s.ok());
  CHECK(s->rank.heads == 2);
  CHECK(s->rank.kv_heads == 1);
  CHECK(s->kv_head_replicas == 2);
  CHECK(s->rank.weight_bytes() == 1037836288ull);
  // Each rank stores a whole KV head: the KV cache per token is not 1/16 of the model's.
  CHECK(s->rank.kv_bytes_per_token() == m.kv_bytes_per_token() / 8);
  // Qwen2.5-7B has 4 KV heads: at TP 4 one each, no replica.
  const Result<TensorParallelShard> q = shard_tensor_parallel(model("qwen2.5-7b"), 4);
  REQUIRE(q.ok());
  CHECK(q->rank.kv_heads == 1);
  CHECK(q->kv_head_replicas == 1);
  CHECK(q->rank.heads == 7);
}

TEST_CASE("tensor parallel: the vocabulary is padded to a multiple of 64, then split", "[tp]") {
  ModelShape m = model("llama-3.1-8b");
  m.vocab = 32001;
  const Result<TensorParallelShard> s = shard_tensor_parallel(m, 2);
  REQUIRE(s.ok());
  CHECK(s->vocab_padded == 32064);
  CHECK(s->rank.vocab == 16032);
  // The padded rows are real weights: embedding and LM head, 63 rows of 4096 more in all.
  CHECK(2 * s->rank.weight_bytes() - s->replicated_weight_bytes ==
        m.weight_bytes() + 2ull * 63 * 4096 * 2);
}

TEST_CASE("tensor parallel: odd splits are refused, naming the field", "[tp]") {
  const ModelShape l70 = model("llama-3.1-70b");
  const Result<TensorParallelShard> three = shard_tensor_parallel(l70, 3);
  REQUIRE(!three.ok());
  CHECK(three.error().message ==
        "llama-3.1-70b: heads (64) do not divide by tensor_parallel_size 3");
  // Qwen2.5-7B: 28 heads split over 4 but not 8.
  const Result<TensorParallelShard> eight = shard_tensor_parallel(model("qwen2.5-7b"), 8);
  REQUIRE(!eight.ok());
  CHECK(eight.error().message == "qwen2.5-7b: heads (28) do not divide by tensor_parallel_size 8");
  ModelShape m = l70;
  m.kv_heads = 6;
  m.heads = 48;
  const Result<TensorParallelShard> kv = shard_tensor_parallel(m, 4);
  REQUIRE(!kv.ok());
  CHECK(kv.error().message ==
        "llama-3.1-70b: kv_heads (6) do not divide by tensor_parallel_size 4");
  const Result<TensorParallelShard> more = shard_tensor_parallel(m, 16);
  REQUIRE(!more.ok());
  CHECK(more.error().message ==
        "llama-3.1-70b: kv_heads (6) are fewer than and do not divide "
        "tensor_parallel_size 16");
  CHECK(!shard_tensor_parallel(l70, 0).ok());
}
