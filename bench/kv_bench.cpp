// memsim-kv-bench: replays a 100k-request synthetic trace on Llama-3.1-8B / H200 through
// continuous batching and a paged KV pool, and prints wall time, simulated time and their ratio
// at several load levels (not a test; prints numbers).
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "workload/requests.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/kv/registry.h"
#include "src/serve/engine.h"
#include "src/serve/kv_budget.h"

namespace {

constexpr const char* kName = "memsim-kv-bench";
const std::string kUsage =
    "usage: memsim-kv-bench [COUNT [RATE ...]]\n"
    "  Replays COUNT synthetic requests (default 100000) on Llama-3.1-8B / H200 through\n"
    "  continuous batching and a paged KV pool at each RATE in requests/s (default 2 5 10 20),\n"
    "  and prints wall time, simulated time and their ratio. Configs are read from MEMSIM_ROOT,\n"
    "  the current folder or the source tree of this binary.\n";

int run(int argc, char** argv) {
  using namespace memsim;
  const uint64_t count = argc > 1 ? bench::parse_count(argv[1], "COUNT") : 100000;
  std::vector<double> rates;  // optional: memsim-kv-bench COUNT RATE... runs only those loads
  for (int i = 2; i < argc; ++i) rates.push_back(bench::parse_positive(argv[i], "RATE"));
  if (rates.empty()) rates = {2.0, 5.0, 10.0, 20.0};
  const std::string root = bench::source_root("configs/gpus/h200.yaml");
  const ModelShape model =
      load_model_shape(ConfigNode::load_file(root + "/configs/models/llama-3.1-8b.yaml"));
  const GpuSpec gpu = load_gpu_spec(ConfigNode::load_file(root + "/configs/gpus/h200.yaml"));

  KvBudgetInput in;
  in.model = model;
  in.gpu = gpu;
  const Result<KvBudget> budget = compute_kv_budget(in);
  if (!budget.ok()) {
    fmt::print(stderr, "budget: {}\n", budget.error().message);
    return 1;
  }
  fmt::print(
      "memsim-kv-bench: {} requests, Llama-3.1-8B on H200, paged_block_pool (16), "
      "continuous_batching (256 seqs, 8192 tokens), KV {:.2f} GiB\n",
      count, double(budget->kv_bytes) / (1ull << 30));
  fmt::print(
      "prompt lognormal mean 1024 sigma 0.8 [16, 8192], output lognormal mean 256 sigma "
      "0.8 [8, 2048], Poisson arrivals\n");
  fmt::print("{:>8} {:>10} {:>10} {:>9} {:>9} {:>10} {:>12}\n", "req/s", "sim s", "wall s", "ratio",
             "steps", "mean seqs", "tok/s");
  const KvEntry* paged = kv_strategies().find("paged_block_pool");
  for (double rate : rates) {
    SyntheticRequestsConfig s;
    s.count = count;
    s.seed = 1;
    s.arrival.rate = rate;
    s.prompt = {LengthDist::kLognormal, 0, 16, 8192, 1024, 0.8};
    s.output = {LengthDist::kLognormal, 0, 8, 2048, 256, 0.8};
    const RequestTable requests = generate_request_set(s).requests;
    EngineConfig e;
    e.label = fmt::format("rate {}", rate);
    e.model = model;
    e.gpu = gpu;
    e.kv_impl = paged->name;
    e.kv_factory = paged->defaults();
    e.kv_budget_bytes = budget->kv_bytes;
    e.sample_interval = 1'000'000'000;
    const ServingResult r = run_serving(e, requests);
    if (!r.error.empty()) {
      fmt::print(stderr, "run failed: {}\n", r.error);
      return 1;
    }
    const double sim = double(r.sim_time) / 1e9;
    fmt::print("{:>8.1f} {:>10.1f} {:>10.3f} {:>9.0f} {:>9} {:>10.1f} {:>12.0f}\n", rate, sim,
               r.wall_seconds, sim / r.wall_seconds, r.steps, r.mean_running_seqs,
               r.output_tokens_per_s);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return memsim::bench::guarded_main(kName, kUsage, argc, argv, [&] { return run(argc, argv); });
}
