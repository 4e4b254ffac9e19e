// tp_memory --backend cuda: one memsim process per rank on the GPUs of this host, NCCL set up
// with a unique id the launcher hands every rank; each rank measures NCCL's and a vLLM-style
// custom all-reduce's memory and runs the point's graph captures with the same strategy code as
// the simulation, and the launcher compares every rank with the simulated one.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/nccl.h"
#include "core/metrics.h"
#include "src/alloc/device_segment_source.h"
#include "src/alloc/torch_caching.h"
#include "src/app/cuda_modes.h"
#include "src/app/rank_launch.h"
#include "src/graph/registry.h"

namespace memsim {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

constexpr int kRankTimeoutS = 600;
constexpr uint64_t kMiB = 1ull << 20;

// Samples cudaMemGetInfo's drop against the backend's accounted bytes after every shape.
class UsageSampler final : public CaptureObserver {
 public:
  UsageSampler(CudaBackend& cuda, uint64_t free0, uint64_t accounted0)
      : cuda_(cuda), free0_(free0), accounted0_(accounted0) {}
  void after_shape(uint32_t) override { sample(); }
  void before_teardown(const CapturedView&) override { sample(); }
  int64_t worst_delta() const { return worst_; }
  uint64_t peak_used() const { return peak_; }
  const std::vector<int64_t>& deltas() const { return deltas_; }  // one per sample

 private:
  void sample() {
    auto o = cuda_.observe();
    if (!o.ok()) return;
    const uint64_t used = free0_ > o->free_bytes ? free0_ - o->free_bytes : 0;
    const uint64_t accounted = cuda_.usage().physical_bytes - accounted0_;
    peak_ = std::max(peak_, used);
    const int64_t d = static_cast<int64_t>(used) - static_cast<int64_t>(accounted);
    deltas_.push_back(d);
    if (std::llabs(d) > std::llabs(worst_)) worst_ = d;
  }
  std::vector<int64_t> deltas_;
  CudaBackend& cuda_;
  uint64_t free0_, accounted0_;
  uint64_t peak_ = 0;
  int64_t worst_ = 0;
};

// The device's free bytes, less what the backend accounts (its own allocations).
struct Meter {
  CudaBackend& cuda;
  Result<uint64_t> taken_since(uint64_t free0, uint64_t accounted0) const {
    MEMSIM_ASSIGN_OR_RETURN(const auto o, cuda.observe());
    const uint64_t used = free0 > o.free_bytes ? free0 - o.free_bytes : 0;
    const uint64_t accounted = cuda.usage().physical_bytes - accounted0;
    return used > accounted ? used - accounted : 0;
  }
};

// vLLM's custom all-reduce buffers on this rank (custom_all_reduce.py): meta and data buffers
// cudaMalloc'd and opened by every peer, rank_data through the caching allocator, the data
// graph inputs' handles opened by every peer (register_graph_buffers). Returns the device bytes
// they took, the inputs' own bytes apart.
Result<uint64_t> custom_all_reduce_bytes(CudaBackend& cuda, Nccl& nccl, int world, int rank,
                                         uint64_t scratch) {
  MEMSIM_ASSIGN_OR_RETURN(const auto o0, cuda.observe());
  MEMSIM_ASSIGN_OR_RETURN(
      const DevPtr meta,
      cuda.device_malloc(kCustomAllReduceSignalBytes + kCustomAllReduceMaxSize, "custom_ar"));
  MEMSIM_ASSIGN_OR_RETURN(const auto meta_peers, nccl.exchange_ipc(meta, scratch, world, rank));
  MEMSIM_ASSIGN_OR_RETURN(const DevPtr buffer,
                          cuda.device_malloc(kCustomAllReduceMaxSize, "custom_ar"));
  MEMSIM_ASSIGN_OR_RETURN(const auto buf_peers, nccl.exchange_ipc(buffer, scratch, world, rank));
  DeviceSegmentSource source(cuda, "rank_data");
  TorchCachingAllocator torch(source);
  MEMSIM_ASSIGN_OR_RETURN(const StreamId stream, cuda.create_stream());
  MEMSIM_ASSIGN_OR_RETURN(const DevPtr rank_data, torch.malloc(8 * kMiB, stream));
  (void)rank_data;
  // register_graph_buffers: every peer opens the IPC handles of a captured graph's input
  // segments. 32 segments of 2 MiB stand for them; their own bytes are not the all-reduce's.
  std::vector<DevPtr> inputs;
  std::vector<std::vector<uint64_t>> input_peers;
  for (int k = 0; k < 32; ++k) {
    MEMSIM_ASSIGN_OR_RETURN(const DevPtr p, cuda.device_malloc(2 * kMiB, "graph_input"));
    inputs.push_back(p);
  }
  for (const DevPtr p : inputs) {
    MEMSIM_ASSIGN_OR_RETURN(auto peers, nccl.exchange_ipc(p, scratch, world, rank));
    input_peers.push_back(std::move(peers));
  }
  MEMSIM_ASSIGN_OR_RETURN(const auto o1, cuda.observe());
  const uint64_t inputs_bytes = 32 * 2 * kMiB;
  const uint64_t dropped = o0.free_bytes > o1.free_bytes ? o0.free_bytes - o1.free_bytes : 0;
  const uint64_t taken = dropped > inputs_bytes ? dropped - inputs_bytes : 0;
  for (const auto& peers : input_peers) MEMSIM_TRY(Nccl::close_peers(peers, rank));
  for (const DevPtr p : inputs) MEMSIM_TRY(cuda.device_free(p));
  MEMSIM_TRY(Nccl::close_peers(meta_peers, rank));
  MEMSIM_TRY(Nccl::close_peers(buf_peers, rank));
  MEMSIM_TRY(torch.release_all());
  MEMSIM_TRY(cuda.device_free(meta));
  MEMSIM_TRY(cuda.device_free(buffer));
  return taken;
}

// One rank's measurements, as a JSON object (written to the launcher's result file).
json measure_rank(const TpMemoryConfig& c, int rank, const NcclUniqueId& id) {
  json out;
  out["rank"] = rank;
  const std::vector<KvBudgetInput> inputs = tp_memory_inputs(c);
  const KvBudgetInput& in = inputs.at(0);
  const int world = static_cast<int>(in.parallel.tensor);
  auto fail = [&](const std::string& what, const Error& e) {
    out["error"] = what + ": " + e.message;
    return out;
  };
  SimClock clock;
  MetricsRecorder metrics(clock);
  auto made = CudaBackend::create(in.gpu, clock, &metrics, rank);
  if (!made.ok()) return fail("CUDA backend", made.error());
  CudaBackend& cuda = **made;
  // The exchange buffer of the IPC handles: the process's own, outside the backend (whose
  // captures must end holding nothing) and before the baseline.
  void* raw_scratch = nullptr;
  if (cudaMalloc(&raw_scratch, 2 * kMiB) != cudaSuccess) {
    out["error"] = "cudaMalloc of the exchange buffer failed";
    return out;
  }
  const uint64_t scratch = reinterpret_cast<uint64_t>(raw_scratch);
  auto o0 = cuda.observe();
  if (!o0.ok()) return fail("cudaMemGetInfo", o0.error());
  const uint64_t free0 = o0->free_bytes, acc0 = cuda.usage().physical_bytes;
  const Meter meter{cuda};
  auto nccl = Nccl::load();
  if (!nccl.ok()) return fail("NCCL", nccl.error());
  out["nccl_version"] = (*nccl)->version();
  if (auto s = (*nccl)->init_rank(id, world, rank); !s.ok()) return fail("NCCL", s.error());
  out["nccl_communicator"] = *meter.taken_since(free0, acc0);
  if (auto s = (*nccl)->all_reduce_floats(scratch, 1); !s.ok()) return fail("NCCL", s.error());
  out["nccl_total"] = *meter.taken_since(free0, acc0);
  const CommMemory model = *comm_memory(in.gpu, in.parallel, in.comm);
  if (model.custom_all_reduce) {
    auto ar = custom_all_reduce_bytes(cuda, **nccl, world, rank, scratch);
    if (!ar.ok()) return fail("custom all-reduce", ar.error());
    out["custom_all_reduce"] = *ar;
  }
  if (!in.enforce_eager) {
    auto made_rc = kv_budget_capture_config(in);
    if (!made_rc.ok()) return fail("captures", made_rc.error());
    CaptureRunConfig rc = *made_rc;
    const GraphEntry* entry = graph_strategies().find(in.graph_strategy);
    const uint64_t allocations0 =
        cuda.calls_of(Primitive::kDeviceMalloc) + cuda.calls_of(Primitive::kCreatePhysical);
    auto o1 = cuda.observe();
    UsageSampler sampler(cuda, o1->free_bytes, cuda.usage().physical_bytes);
    rc.observer = &sampler;
    auto strategy = entry->defaults()(cuda);
    const CaptureRunResult r = run_captures(rc, cuda, clock, *strategy, metrics);
    strategy.reset();
    out["graph_ok"] = r.ok && r.invariant_violation.empty();
    out["graph_failure"] = r.failure + r.invariant_violation;
    out["graph_strategy_bytes"] = r.peak_strategy_reserved;
    out["graph_measured_peak"] = sampler.peak_used();
    out["graph_worst_delta"] = sampler.worst_delta();
    out["graph_deltas"] = sampler.deltas();
    out["graphs"] = r.graphs;
    out["allocations"] = cuda.calls_of(Primitive::kDeviceMalloc) +
                         cuda.calls_of(Primitive::kCreatePhysical) - allocations0;
    out["granularity"] = cuda.granularity();
  }
  (void)(*nccl)->destroy();
  cudaFree(raw_scratch);
  return out;
}

}  // namespace

int cuda_tp_rank(const std::string& config_path, int rank, const std::string& id_hex,
                 const std::string& result_path, std::ostream& err) {
  NcclUniqueId id{};
  if (!nccl_id_from_hex(id_hex, &id)) {
    err << "memsim tp-rank: --nccl-id is not 256 hex digits\n";
    return 2;
  }
  const TpMemoryConfig c = load_tp_memory_config(ConfigNode::load_file(config_path));
  const json out = measure_rank(c, rank, id);
  std::ofstream f(result_path);
  f << out.dump() << "\n";
  f.close();
  if (!f) {
    err << "memsim tp-rank: cannot write " << result_path << "\n";
    return 1;
  }
  return out.contains("error") ? 1 : 0;
}

namespace {

json read_json(const std::string& path) {
  std::ifstream f(path);
  json j = json::parse(f, nullptr, false);
  return j.is_discarded() ? json() : j;
}

double rel_error(uint64_t measured, uint64_t model) {
  return model == 0 ? (measured == 0 ? 0.0 : 1.0)
                    : std::fabs(double(measured) - double(model)) / double(model);
}

std::string mib(uint64_t b) {
  return fmt::format("{:.1f}", double(b) / double(kMiB));
}

// One point's ranks launched, waited for and compared; appends CSV rows; false on any failure.
bool run_point(const TpMemoryConfig& c, const TpMemoryPoint& p, size_t i, Nccl& nccl,
               const fs::path& tmp, OutputDir& dir, std::ostream& out, std::string& csv) {
  const fs::path yaml = tmp / fmt::format("point{}.yaml", i);
  std::ofstream(yaml) << tp_memory_point_yaml(c, i);
  auto id = nccl.unique_id();
  if (!id.ok()) {
    out << "memsim: --backend cuda: " << id.error().message << "\n";
    return false;
  }
  std::error_code ec;
  const std::string self = fs::read_symlink("/proc/self/exe", ec).string();
  std::vector<RankProcess> ranks(p.tp);
  for (uint32_t r = 0; r < p.tp; ++r) {
    RankProcess& rp = ranks[r];
    rp.result = (tmp / fmt::format("point{}_rank{}.json", i, r)).string();
    rp.log = (tmp / fmt::format("point{}_rank{}.log", i, r)).string();
    // Every rank sees every GPU (as vLLM's workers do: CUDA IPC opens a peer's memory only on a
    // visible device) and uses device `rank`.
    const std::string why = start_rank({self, "tp-rank", yaml.string(), "--rank", std::to_string(r),
                                        "--nccl-id", nccl_id_hex(*id), "--result", rp.result},
                                       r, c.comm.nccl_cumem, rp);
    if (!why.empty()) {
      out << "memsim: --backend cuda: " << why << "\n";
      for (RankProcess& started : ranks)
        if (started.pid > 0) kill(started.pid, SIGKILL);
      (void)wait_ranks(ranks, 1);
      return false;
    }
  }
  const std::string problem = wait_ranks(ranks, kRankTimeoutS);
  const KvBudget& b = p.budget;
  bool all_ok = problem.empty();
  for (uint32_t r = 0; r < p.tp; ++r) {
    const json j = read_json(ranks[r].result);
    dir.write(fmt::format("tp_ranks/point{}_rank{}.json", i, r), j.dump(2) + "\n");
    const std::string error = j.is_object() && j.contains("error") ? j["error"].get<std::string>()
                              : j.is_object()                      ? ""
                                                                   : "no result";
    const uint64_t nccl_m = j.value("nccl_total", uint64_t{0});
    const uint64_t ar_m = j.value("custom_all_reduce", uint64_t{0});
    const uint64_t graph_m = j.value("graph_strategy_bytes", uint64_t{0});
    const int64_t delta = j.value("graph_worst_delta", int64_t{0});
    const uint64_t bound = j.value("granularity", uint64_t{0}) *
                           std::max<uint64_t>(1, j.value("allocations", uint64_t{0}));
    const uint64_t nccl_sim = b.comm.nccl_of(static_cast<uint32_t>(r));  // this rank's
    const bool nccl_ok = rel_error(nccl_m, nccl_sim) <= 0.02;
    const bool ar_ok = rel_error(ar_m, b.comm.custom()) <= 0.02;
    const bool graphs = p.graph_memory != "none";
    std::vector<std::string> why;  // each failed check, named
    if (!error.empty()) why.push_back(error);
    if (!nccl_ok) why.push_back("NCCL beyond 2%");
    if (!ar_ok) why.push_back("custom all-reduce beyond 2%");
    if (graphs && !j.value("graph_ok", false))
      why.push_back("captures: " + j.value("graph_failure", std::string()));
    if (graphs && graph_m != b.graph_memory) why.push_back("graph bytes differ");
    if (graphs && static_cast<uint64_t>(std::llabs(delta)) > bound)
      why.push_back(fmt::format("usage {:+.0f} MiB over the accounted bytes after {} graphs",
                                double(delta) / double(kMiB), j.value("graphs", 0)));
    if (!problem.empty()) why.push_back(problem);
    const bool ok = why.empty();
    all_ok = all_ok && ok;
    out << fmt::format(
        "{:<14} {:>3} {:<14} {:>4} {:>8} {:>8} {:>6.2f}% {:>6} {:>6} {:>11} {:>11} {:>12}  {}\n",
        p.model, p.tp, p.graph_memory, r, mib(nccl_sim), mib(nccl_m),
        100 * rel_error(nccl_m, nccl_sim), mib(b.comm.custom()), mib(ar_m),
        graphs ? std::to_string(b.graph_memory) : "-", graphs ? std::to_string(graph_m) : "-",
        graphs ? fmt::format("{:+.1f}/{}M", double(delta) / double(kMiB), bound / kMiB) : "-",
        ok ? "ok" : fmt::format("FAIL: {}", fmt::join(why, "; ")));
    csv += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{}\n", p.model, p.gpu, p.tp,
                       p.graph_memory, r, nccl_sim, nccl_m, b.comm.custom(), ar_m, b.graph_memory,
                       graph_m, delta, ok ? "ok" : "FAIL");
  }
  return all_ok;
}

}  // namespace

int cuda_tp_memory(const TpMemoryConfig& c, const TpMemoryResults& sim, OutputDir& dir,
                   std::ostream& out) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  auto nccl = Nccl::load();
  if (!nccl.ok()) {
    out << "memsim: --backend cuda: " << nccl.error().message << "\n";
    return 2;
  }
  char pattern[] = "/tmp/memsim-tp-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    out << "memsim: --backend cuda: cannot make a temporary folder\n";
    return 1;
  }
  const fs::path tmp(pattern);
  const std::vector<KvBudgetInput> inputs = tp_memory_inputs(c);
  std::error_code ec;
  fs::create_directories(dir.staged("tp_ranks"), ec);
  (void)cudaDeviceReset();  // the device probe's context on GPU 0: the ranks need it not here
  out << fmt::format(
      "\nCUDA: one process per rank on {} GPU(s) here, NCCL {} ({}), NVLink multicast off; "
      "per rank, simulated against measured (MiB; graph bytes exact):\n",
      devices, (*nccl)->version(), (*nccl)->path());
  out << fmt::format(
      "{:<14} {:>3} {:<14} {:>4} {:>8} {:>8} {:>7} {:>6} {:>6} {:>11} {:>11} "
      "{:>12}  {}\n",
      "model", "TP", "graphs", "rank", "NCCL sim", "measured", "error", "AR sim", "meas.",
      "graph sim B", "graph GPU B", "usage d/bound", "result");
  std::string csv =
      "model,gpu,tensor_parallel_size,graph_memory,rank,nccl_sim,nccl_measured,"
      "custom_all_reduce_sim,custom_all_reduce_measured,graph_sim,graph_gpu,usage_delta,result\n";
  bool all_ok = true;
  size_t ran = 0;
  for (size_t i = 0; i < sim.points.size(); ++i) {
    const TpMemoryPoint& p = sim.points[i];
    // Pipeline-parallel points are simulated only (the ranks here run one TP group).
    if (!p.fits || p.pp > 1 || p.tp < 2 || p.tp > static_cast<uint32_t>(devices) ||
        !cuda_gpu_mismatch(inputs[i].gpu).empty())
      continue;
    all_ok = run_point(c, p, i, **nccl, tmp, dir, out, csv) && all_ok;
    ++ran;
  }
  if (all_ok)
    fs::remove_all(tmp);
  else  // the rank logs a failure names stay
    out << "the ranks' logs are kept in " << tmp.string() << "\n";
  if (ran == 0) {
    out << fmt::format(
        "no point to run here: each needs 2 to {} ranks, the GPU its file names, and to fit\n",
        devices);
    return 1;
  }
  dir.write("tp_validation.csv", csv);
  return all_ok ? 0 : 1;
}

}  // namespace memsim
