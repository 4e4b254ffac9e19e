// Tensor parallelism in the simulator: collective times from the GPU file's tables, NCCL's and
// the custom all-reduce's memory per rank, the collectives' tensors in the decode program, one
// rank's KV budget (vLLM's startup check included) and the collectives in the step time.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/serve/kv_budget.h"
#include "workload/alloc_program.h"
#include "workload/collectives.h"
#include "workload/step_time.h"
#include "workload/tensor_parallel.h"

using namespace memsim;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::string root() {
  const char* r = std::getenv("MEMSIM_SOURCE_ROOT");
  return r != nullptr ? r : ".";
}

ModelShape model(const std::string& name) {
  return load_model_shape(ConfigNode::load_file(root() + "/configs/models/" + name + ".yaml"));
}

GpuSpec gpu(const std::string& name) {
  return load_gpu_spec(ConfigNode::load_file(root() + "/configs/gpus/" + name + ".yaml"));
}

uint64_t total_bytes(const ShapeProgram& p, const std::string& suffix) {
  uint64_t sum = 0;
  for (const GraphProgram& g : p.graphs)
    for (const TensorSpec& t : g.tensors)
      if (t.name.size() >= suffix.size() &&
          t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0)
        sum += t.bytes;
  return sum;
}

uint64_t all_bytes(const ShapeProgram& p) {
  return total_bytes(p, "");
}

}  // namespace

TEST_CASE("collectives: times at the measured sizes, between them and beyond", "[tp]") {
  const GpuSpec h200 = gpu("h200");
  const auto two = CollectiveTime::make(h200, 2);
  REQUIRE(two.ok());
  // The table's own points (configs/gpus/h200.yaml, 2 ranks): 2 KiB 9.1 us, 1 MiB 17.1 us.
  CHECK(two->all_reduce(2048) == 9100);
  CHECK(two->all_reduce(1 * kMiB) == 17100);
  CHECK(two->all_gather(1 * kMiB) == 21200);
  // Below the smallest size: its time. Log-log interpolation: 1.5 MiB between 1 MiB (17.1) and
  // 2 MiB (31.9).
  CHECK(two->all_reduce(16) == 9100);
  const double t = std::log(1.5);
  const double want =
      std::exp(std::log(17.1) + t / std::log(2.0) * (std::log(31.9) - std::log(17.1)));
  CHECK(two->all_reduce(3 * kMiB / 2) == static_cast<SimTime>(std::llround(want * 1000)));
  // Beyond the largest (256 MiB, 888.1 us): the last two sizes' bandwidth.
  const double slope = (888.1 - 465.8) / double(128 * kMiB);
  CHECK(two->all_reduce(512 * kMiB) ==
        static_cast<SimTime>(std::llround((888.1 + slope * 256 * kMiB) * 1000)));
  CHECK(two->all_reduce(0) == 0);
  CHECK(two->source() == "NCCL 2.28.9 measured at 2 ranks (h200)");

  // 8 ranks: 4 ranks' table with the ring's bytes per rank, 2(n-1)/n: 14/8 against 6/4.
  const auto eight = CollectiveTime::make(h200, 8);
  const auto four = CollectiveTime::make(h200, 4);
  REQUIRE(eight.ok());
  REQUIRE(four.ok());
  CHECK(eight->source().find("measured at 4 ranks (h200), bytes per rank scaled to 8") !=
        std::string::npos);
  const uint64_t b = 6 * kMiB;
  CHECK(eight->all_reduce(b) == four->all_reduce(b * 14 / 8 * 4 / 6));
  CHECK(eight->all_gather(b) == four->all_gather(b * 7 / 3));
  // Monotone enough: more ranks never make an all-reduce of a large buffer cheaper.
  CHECK(eight->all_reduce(64 * kMiB) > four->all_reduce(64 * kMiB));
  CHECK(four->all_reduce(64 * kMiB) > two->all_reduce(64 * kMiB));

  // One GPU: no collectives. Beyond the node, or a GPU file without interconnect: errors.
  CHECK(CollectiveTime::make(h200, 1)->all_reduce(kMiB) == 0);
  CHECK(CollectiveTime::make(h200, 16).error().message.find("exceed the 8 GPUs") !=
        std::string::npos);
  GpuSpec bare = h200;
  bare.interconnect = {};
  CHECK(CollectiveTime::make(bare, 2).error().message.find("no interconnect") != std::string::npos);
}

TEST_CASE("collectives: the custom all-reduce's times under 8 MiB, NCCL's above", "[tp]") {
  const GpuSpec h200 = gpu("h200");
  const auto custom = CollectiveTime::make(h200, 2, true);
  const auto nccl = CollectiveTime::make(h200, 2);
  REQUIRE(custom.ok());
  // configs/gpus/h200.yaml, custom_all_reduce_us at 2 ranks: 2 KiB 4.5 us, 4 MiB 20.1 us.
  CHECK(custom->all_reduce(2048) == 4500);
  CHECK(custom->all_reduce(4 * kMiB) == 20100);
  // Between 4 MiB and max_size: the last two sizes' bandwidth (2 MiB 12.6 us).
  const double slope = (20.1 - 12.6) / double(2 * kMiB);
  CHECK(custom->all_reduce(6 * kMiB) ==
        static_cast<SimTime>(std::llround((20.1 + slope * 2 * kMiB) * 1000)));
  // max_size and above, or not a 16-byte multiple: NCCL, as vLLM's should_custom_ar decides.
  CHECK(custom->all_reduce(8 * kMiB) == nccl->all_reduce(8 * kMiB));
  CHECK(custom->all_reduce(2056 + 2) == nccl->all_reduce(2058));
  CHECK(custom->all_gather(kMiB) == nccl->all_gather(kMiB));
  CHECK(custom->source() ==
        "NCCL 2.28.9 measured at 2 ranks (h200); custom all-reduce under 8 MiB "
        "measured at 2 ranks");
  // 8 ranks: the 4-rank table, unscaled. 3 ranks: the kernel does not run there (NCCL).
  const auto eight = CollectiveTime::make(h200, 8, true);
  CHECK(eight->all_reduce(2048) == 4900);
  CHECK(eight->source().find("measured at 4 ranks (used unscaled for 8)") != std::string::npos);
  CHECK(CollectiveTime::make(h200, 3, true)->all_reduce(2048) ==
        CollectiveTime::make(h200, 3)->all_reduce(2048));
  // A GPU file without the table keeps NCCL's times and says so.
  GpuSpec bare = h200;
  bare.interconnect.custom_all_reduce_us.clear();
  const auto unmeasured = CollectiveTime::make(bare, 2, true);
  CHECK(unmeasured->all_reduce(2048) == 9100);
  CHECK(unmeasured->source().find("the custom all-reduce is not measured on h200") !=
        std::string::npos);
  // The engine's choice: custom at 2, 4, 6, 8 ranks when asked, else NCCL.
  CommOptions on, off;
  off.custom_all_reduce = false;
  ParallelConfig p;
  p.tensor = 2;
  CHECK(std::string(all_reduce_kind(p, on)) == "custom");
  CHECK(std::string(all_reduce_kind(p, off)) == "nccl");
  p.tensor = 3;
  CHECK(std::string(all_reduce_kind(p, on)) == "nccl");
  p.tensor = 1;
  CHECK(std::string(all_reduce_kind(p, on)) == "none");
}

TEST_CASE("collectives: a send/recv between two GPUs, measured or priced as an all-gather",
          "[tp]") {
  GpuSpec g = gpu("h200");
  // A table at the file's 18 sizes (2 KiB .. 256 MiB): 10 us up to 1 MiB, then 10 us a MiB more.
  g.interconnect.send_recv_us.clear();
  const auto unmeasured = CollectiveTime::make(g, 2);
  CHECK(!unmeasured->send_recv_measured());
  CHECK(unmeasured->send_recv(kMiB) == unmeasured->all_gather(kMiB));
  for (uint64_t b : g.interconnect.collective_sizes)
    g.interconnect.send_recv_us.push_back(b <= kMiB ? 10.0 : 10.0 * double(b / kMiB));
  const auto two = CollectiveTime::make(g, 2);
  CHECK(two->send_recv_measured());
  CHECK(two->send_recv(2048) == 10000);
  CHECK(two->send_recv(kMiB) == 10000);
  CHECK(two->send_recv(64 * kMiB) == 640000);
  CHECK(two->send_recv(0) == 0);

  // configs/gpus/h200.yaml's measured pairs: 2 KiB 5.8 us, 1 MiB 12.5 us.
  const auto measured = CollectiveTime::make(gpu("h200"), 2);
  CHECK(measured->send_recv_measured());
  CHECK(measured->send_recv(2048) == 5800);
  CHECK(measured->send_recv(kMiB) == 12500);

  // The GPU file: one time for each collective size.
  const std::string root = std::getenv("MEMSIM_SOURCE_ROOT");
  std::ifstream in(root + "/configs/gpus/h200.yaml");
  std::stringstream text;
  text << in.rdbuf();
  std::string yaml = text.str();
  const size_t row = yaml.find("  send_recv_us: [");
  REQUIRE(row != std::string::npos);
  yaml = yaml.substr(0, row) + "  send_recv_us: [1, 2, 3]\n";
  CHECK_THROWS_WITH(load_gpu_spec(ConfigNode::parse(yaml, "h200.yaml")),
                    Catch::Contains("interconnect.send_recv_us") &&
                        Catch::Contains("has 3 times; collective_sizes has 18"));
}

TEST_CASE("collectives: NCCL's and the custom all-reduce's memory per rank", "[tp]") {
  const GpuSpec h200 = gpu("h200");
  ParallelConfig p;
  CommOptions vllm;  // NCCL_CUMEM_ENABLE=0, custom all-reduce on
  CHECK(comm_memory(h200, p, vllm)->total() == 0);

  p.tensor = 2;
  const CommMemory m = *comm_memory(h200, p, vllm);
  CHECK(m.nccl_communicator == 736 * kMiB);  // measured, cuMem off
  CHECK(m.nccl_collectives == 186 * kMiB);
  CHECK(m.custom_all_reduce);
  CHECK(m.custom_meta == 10 * kMiB);  // 8 MiB + 2560 B, rounded to 2 MiB granules
  CHECK(m.custom_buffer == 8 * kMiB);
  CHECK(m.custom_rank_data == 20 * kMiB);  // PyTorch's 20 MiB segment for an 8 MiB request
  CHECK(m.custom_ipc == 0);                // no IPC cost with cuMem off
  CHECK(m.total() == (736 + 186 + 38) * kMiB);
  CHECK(m.nccl_note.empty());  // measured at 2 ranks
  // 4 ranks: measured rank by rank (nccl_memory_by_rank); the largest rank decides. 8 ranks: the
  // 2-rank figures, extrapolated, and the note says so.
  ParallelConfig four = p;
  four.tensor = 4;
  const CommMemory m4 = *comm_memory(h200, four, vllm);
  CHECK(m4.nccl_note.empty());
  CHECK(m4.nccl_of(0) == 1162 * kMiB);
  CHECK(m4.nccl_of(1) == 1210 * kMiB);
  CHECK(m4.nccl_of(3) == 970 * kMiB);
  CHECK(m4.nccl() == 1210 * kMiB);
  CHECK(m4.total_of(3) == (970 + 38) * kMiB);
  CommOptions cumem4 = vllm;
  cumem4.nccl_cumem = true;
  CHECK(comm_memory(h200, four, cumem4)->nccl_of(2) == 862 * kMiB);
  ParallelConfig eight = p;
  eight.tensor = 8;
  const CommMemory m8 = *comm_memory(h200, eight, vllm);
  CHECK(m8.nccl_note.find("extrapolated to 8") != std::string::npos);
  CHECK(m8.nccl_of(5) == (736 + 186) * kMiB);
  // A row that does not give one figure per rank is an error naming it.
  std::ifstream in(root() + "/configs/gpus/h200.yaml");
  std::stringstream text;
  text << in.rdbuf();
  std::string bad = text.str();
  const std::string row = "cumem: [862MiB, 862MiB, 862MiB, 862MiB]";
  REQUIRE(bad.find(row) != std::string::npos);
  bad.replace(bad.find(row), row.size(), "cumem: [862MiB]");
  CHECK_THROWS_WITH(load_gpu_spec(ConfigNode::parse(bad, "h200.yaml")),
                    Catch::Contains("nccl_memory_by_rank.4.cumem") &&
                        Catch::Contains("has 1 figures for 4 ranks"));

  CommOptions cumem = vllm;
  cumem.nccl_cumem = true;
  cumem.custom_all_reduce = false;
  const CommMemory c = *comm_memory(h200, p, cumem);
  CHECK(c.nccl() == (386 + 474) * kMiB);
  CHECK(c.custom() == 0);
  cumem.custom_all_reduce = true;
  CHECK(comm_memory(h200, p, cumem)->custom() == 40 * kMiB);  // 2 MiB of IPC opens with cuMem

  // World sizes vLLM's custom all-reduce refuses: 3, 5, 7.
  p.tensor = 3;
  CHECK_FALSE(comm_memory(h200, p, vllm)->custom_all_reduce);
  for (uint32_t n : {2u, 4u, 6u, 8u}) CHECK(custom_all_reduce_supported(n));
  for (uint32_t n : {1u, 3u, 5u, 7u, 16u}) CHECK_FALSE(custom_all_reduce_supported(n));
}

TEST_CASE("decode program: tensor parallelism adds the collectives' tensors", "[tp]") {
  const ModelShape whole = model("llama-3.1-70b");
  const TensorParallelShard s = *shard_tensor_parallel(whole, 2);
  ProgramOptions one;
  ProgramOptions tp = one;
  tp.tensor_parallel = 2;
  tp.vocab_padded = s.vocab_padded;
  tp.vocab = whole.vocab;
  const uint32_t b = 64;
  const ShapeProgram plain = make_decode_program(s.rank, b, one);
  const ShapeProgram sharded = make_decode_program(s.rank, b, tp);
  const uint64_t row = b * whole.hidden * 2;
  // One partial sum per all-reduce: the embedding, and o_proj and down of every layer.
  CHECK(total_bytes(sharded, ".partial") == (2 * whole.layers + 1) * row + b * s.rank.vocab * 2);
  CHECK(total_bytes(plain, ".partial") == 0);
  // The logits: the rank's [b, vocab / tp] becomes the gathered [b, vocab_padded] and its copy;
  // the sampler's tensors span the whole vocabulary.
  CHECK(total_bytes(sharded, "logits.gathered") == b * s.vocab_padded * 2);
  CHECK(total_bytes(sharded, "logits_fp32") == b * whole.vocab * 4);
  CHECK(total_bytes(plain, "logits_fp32") == b * s.rank.vocab * 4);
  // Everything else is the same program: the difference is exactly the collectives' tensors.
  const uint64_t extra = (2 * whole.layers + 1) * row                 // partial sums
                         + b * s.rank.vocab * 2                       // the rank's logits
                         + b * s.vocab_padded * 2                     // gathered logits
                         + b * (s.vocab_padded - s.rank.vocab) * 2    // their copy, wider
                         + 2 * b * (whole.vocab - s.rank.vocab) * 4;  // fp32 logits and probs
  CHECK(all_bytes(sharded) == all_bytes(plain) + extra);
  // A shard whose vocabulary does not match is refused.
  tp.vocab_padded = s.vocab_padded + 64;
  CHECK_THROWS(make_decode_program(s.rank, b, tp));
}

TEST_CASE("kv budget: one rank of Llama-3.1-70B at TP 2 on an H200", "[tp]") {
  KvBudgetInput in;
  in.model = model("llama-3.1-70b");
  in.gpu = gpu("h200");
  in.parallel.tensor = 2;
  const auto r = compute_kv_budget(in);
  REQUIRE(r.ok());
  const KvBudget& b = *r;
  CHECK(b.tensor_parallel == 2);
  CHECK(b.weights == 70555025408ull);     // the shard (test_tensor_parallel)
  CHECK(b.kv_bytes_per_token == 163840);  // 2 x 80 layers x 4 KV heads x 128 x 2 B
  CHECK(b.comm.total() == (736 + 186 + 38) * kMiB);
  // vLLM's formula, with the communication outside it.
  CHECK(b.kv_bytes == b.usable - b.weights - b.activation_peak - b.graph_memory);
  CHECK(b.context == 552402944);
  CHECK(b.free_bytes() == b.capacity - b.context - b.usable - b.comm.total());
  CHECK(b.kv_blocks == b.kv_bytes / (16 * b.kv_bytes_per_token));
  // The collectives' out-of-place tensors never lower a rank's peaks against the same shard
  // without them (at 8192 tokens the MLP's peak is elsewhere; the graphs' is higher).
  KvBudgetInput single = in;
  single.parallel.tensor = 1;
  single.model = shard_tensor_parallel(in.model, 2)->rank;
  const auto s = compute_kv_budget(single);
  REQUIRE(s.ok());
  CHECK(b.activation_peak >= s->activation_peak);
  CHECK(b.graph_memory > s->graph_memory);

  // Fewer KV heads than ranks: every rank holds one KV head (8 heads, TP 8 would hold 1 each;
  // Llama-3.1-8B has 8 KV heads, so TP 8 keeps 1 head a rank and no replica).
  KvBudgetInput eight = in;
  eight.parallel.tensor = 8;
  const auto e = compute_kv_budget(eight);
  REQUIRE(e.ok());
  CHECK(e->kv_bytes_per_token == 2 * 80 * 1 * 128 * 2);
  CHECK(e->kv_head_replicas == 1);

  // vLLM refuses to start when NCCL leaves less free than utilization x capacity.
  KvBudgetInput tight = in;
  tight.gpu_memory_utilization = 0.999;
  const auto t = compute_kv_budget(tight);
  REQUIRE_FALSE(t.ok());
  CHECK(t.error().code == ErrorCode::kOutOfMemory);
  CHECK(t.error().message.find("free memory on startup") != std::string::npos);
}

TEST_CASE("step time: a TP step adds 2 x layers + 1 all-reduces and the logits' all-gather",
          "[tp]") {
  const ModelShape whole = model("llama-3.1-70b");
  const GpuSpec h200 = gpu("h200");
  const TensorParallelShard s = *shard_tensor_parallel(whole, 2);
  auto coll = std::make_shared<const CollectiveTime>(*CollectiveTime::make(h200, 2));
  const StepTimeModel tp(s.rank, h200, coll);
  const StepTimeModel alone(s.rank, h200);
  StepShape decode;
  decode.num_seqs = 64;
  decode.new_tokens = 64;
  decode.kv_read_tokens = 64 * 1024;
  decode.attn_pairs = 64 * 1024;
  const StepBreakdown b = tp.breakdown(decode);
  // 64 tokens x 8192 x 2 B = 1 MiB a row-parallel output: 17.1 us each (measured point).
  const SimTime reduce = 161 * SimTime{17100};
  CHECK(b.collective_ns == reduce + coll->all_gather(64 * s.rank.vocab * 2));
  CHECK(b.total_ns == alone.breakdown(decode).total_ns + b.collective_ns);
  CHECK(tp.step_time(decode) == b.total_ns);
  CHECK(tp.source().find("roofline + collectives") == 0);
  CHECK(alone.breakdown(decode).collective_ns == 0);
  StepShape idle;
  CHECK(tp.step_time(idle) == 0);
}
