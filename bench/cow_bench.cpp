// memsim-cow-bench: the cost of one copy-on-write of a shared last block per block size (the
// OrinMLLM seed's 6.2.6 and 6.3), run through paged_block_pool on the sim backend: the bytes
// copied and the copy's time in a GPU file's cost model (not a test; prints numbers).
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "bench/bench_cli.h"
#include "core/clock.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/kv/registry.h"

namespace {

constexpr const char* kName = "memsim-cow-bench";
const std::string kUsage =
    "usage: memsim-cow-bench [GPU [MODEL]]\n"
    "  For block sizes 4 to 128, forks a 2-token sequence in the OrinMLLM seed's paged pool\n"
    "  (per-layer blocks, one sequence of 8192 tokens) and writes its 3rd token: prints the\n"
    "  bytes one copy-on-write copies (per layer and pool, and in all) and the time of memsim's\n"
    "  copies (one per pool) and of the seed's (one per layer and pool) in the cost model of\n"
    "  configs/gpus/GPU.yaml (default h200) for configs/models/MODEL.yaml (default qwen3-8b).\n"
    "  Configs are read from MEMSIM_ROOT, the current folder or the source tree of this binary.\n";

struct Row {
  uint32_t block_size = 0;
  uint64_t per_layer_pool_bytes = 0, bytes = 0;
  memsim::SimTime ns = 0;
};

Row measure(const memsim::GpuSpec& gpu, const memsim::ModelShape& model, uint32_t block_size) {
  using namespace memsim;
  SimClock clock;
  SimBackend backend(gpu, clock);
  const std::string yaml = fmt::format(
      "{{impl: paged_block_pool, block_size: {}, layout: per_layer, prefix_caching: false}}",
      block_size);
  const ConfigNode node = ConfigNode::parse(yaml, "memsim-cow-bench");
  const std::unique_ptr<KvCacheManager> kv = kv_strategies().select(node).parse(node)();
  KvInit init;
  init.layers = model.layers;
  init.kv_bytes_per_token = model.kv_bytes_per_token();
  init.budget_bytes = uint64_t{8192} * model.kv_bytes_per_token();  // the seed's pool
  init.max_num_seqs = 1;
  init.max_model_len = 8192;
  auto check = [&](const Status& s, const char* what) {
    if (!s.ok()) throw std::runtime_error(fmt::format("{}: {}", what, s.error().message));
  };
  check(kv->init(backend, init), "init");
  TokenContent seq(1, 2);  // "Hello world", then "How"
  seq.append(3, 1);
  check(kv->grow(0, seq, 2, 0), "prefill");
  check(kv->fork(0, 1), "fork");
  const SimTime before = backend.time_in(Primitive::kCopy);
  check(kv->grow(0, seq, 3, 0), "write");
  const KvStats s = kv->stats();
  Row r;
  r.block_size = block_size;
  r.per_layer_pool_bytes = s.block_bytes / 2;
  r.bytes = s.cow_bytes;
  r.ns = backend.time_in(Primitive::kCopy) - before;
  check(kv->shutdown(), "shutdown");
  return r;
}

int run(int argc, char** argv) {
  using namespace memsim;
  if (argc > 3) throw bench::UsageError("at most two arguments: GPU and MODEL");
  const std::string gpu_name = argc > 1 ? argv[1] : "h200";
  const std::string model_name = argc > 2 ? argv[2] : "qwen3-8b";
  const std::string root = bench::source_root("configs/gpus/h200.yaml");
  const GpuSpec gpu =
      load_gpu_spec(ConfigNode::load_file(root + "/configs/gpus/" + gpu_name + ".yaml"));
  const ModelShape model =
      load_model_shape(ConfigNode::load_file(root + "/configs/models/" + model_name + ".yaml"));
  fmt::print(
      "memsim-cow-bench: one copy-on-write of a shared last block, {} with per-layer blocks "
      "({} layers), copy cost of {}\n",
      model_name, model.layers, gpu_name);
  fmt::print("{:>10} {:>16} {:>14} {:>12} {:>16}\n", "block size", "K or V / layer", "bytes copied",
             "copy us", "seed's copies us");
  for (const uint32_t b : {4u, 8u, 16u, 32u, 64u, 128u}) {
    const Row r = measure(gpu, model, b);
    // The seed's cow_on_write copies each layer's K and V block on its own (6.2.3): 2 x layers
    // copies of one layer's block, each read and written.
    const SimTime seed_ns = 2 * SimTime{model.layers} *
                            gpu.price(Primitive::kCopy, 0, 2 * r.per_layer_pool_bytes, 0, false);
    fmt::print("{:>10} {:>13} KiB {:>10} KiB {:>12.3f} {:>16.3f}\n", r.block_size,
               r.per_layer_pool_bytes >> 10, r.bytes >> 10, double(r.ns) / 1e3,
               double(seed_ns) / 1e3);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return memsim::bench::guarded_main(kName, kUsage, argc, argv, [&] { return run(argc, argv); });
}
