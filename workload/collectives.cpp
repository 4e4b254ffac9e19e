// Collective times from the GPU file's measured tables, and NCCL's and the custom all-reduce's
// memory per rank (see collectives.h).
#include "workload/collectives.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>

namespace memsim {

namespace {

constexpr uint64_t kMiB = 1ull << 20;
// PyTorch's caching allocator: a request of 1-10 MiB gets a 20 MiB segment (kLargeBuffer) when
// no cached block fits, as in an allocator holding nothing else.
constexpr uint64_t kTorchLargeBuffer = 20 * kMiB;
// With NCCL's cuMem on, opening peers' IPC handles takes 2 MiB of the opener's device memory
// (measured on H200s, in memsim's ranks and in PyTorch alike); with it off (vLLM), none.
constexpr uint64_t kIpcOpenBytesUnderCumem = 2 * kMiB;

uint64_t round_up(uint64_t bytes, uint64_t granule) {
  return granule == 0 ? bytes : (bytes + granule - 1) / granule * granule;
}

Status check_node(const GpuSpec& gpu, uint32_t ranks) {
  const InterconnectSpec& ic = gpu.interconnect;
  if (ic.gpus_per_node == 0)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("gpu {} has no interconnect: section, which {} ranks need "
                                  "(NCCL's memory and collective times; docs/gpus.md)",
                                  gpu.name, ranks));
  if (ranks > ic.gpus_per_node)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{} ranks exceed the {} GPUs of one {} node (memsim models "
                                  "one node)",
                                  ranks, ic.gpus_per_node, gpu.name));
  return {};
}

// Microseconds at `bytes` on the table (sizes ascending, at least two).
double interpolate_us(const std::vector<double>& sizes, const std::vector<double>& us,
                      double bytes) {
  if (bytes <= sizes.front()) return us.front();
  const size_t n = sizes.size();
  if (bytes >= sizes[n - 1]) {
    const double slope = (us[n - 1] - us[n - 2]) / (sizes[n - 1] - sizes[n - 2]);
    return us[n - 1] + std::max(slope, 0.0) * (bytes - sizes[n - 1]);
  }
  const size_t hi = static_cast<size_t>(
      std::distance(sizes.begin(), std::upper_bound(sizes.begin(), sizes.end(), bytes)));
  const size_t lo = hi - 1;
  const double t = std::log(bytes / sizes[lo]) / std::log(sizes[hi] / sizes[lo]);
  return std::exp(std::log(us[lo]) + t * (std::log(us[hi]) - std::log(us[lo])));
}

SimTime to_ns(double us) {
  return static_cast<SimTime>(std::llround(us * 1000.0));
}

}  // namespace

const char* all_reduce_kind(const ParallelConfig& p, const CommOptions& o) {
  if (p.tensor <= 1) return "none";
  return o.custom_all_reduce && custom_all_reduce_supported(p.tensor) ? "custom" : "nccl";
}

bool custom_all_reduce_supported(uint32_t world_size) {
  return world_size == 2 || world_size == 4 || world_size == 6 || world_size == 8;
}

Result<CommMemory> comm_memory(const GpuSpec& gpu, const ParallelConfig& p, const CommOptions& o) {
  CommMemory m;
  if (p.tensor <= 1 && p.pipeline <= 1) return m;
  MEMSIM_TRY(check_node(gpu, p.gpus()));
  const InterconnectSpec::NcclMemory& nccl =
      o.nccl_cumem ? gpu.interconnect.nccl_cumem : gpu.interconnect.nccl_no_cumem;
  if (p.pipeline > 1) {
    // The GPU file's communicator, first all-reduce and first send/recv pair (point_to_point,
    // the step pipeline parallelism adds: docs/results/tp-memory.md), measured on 2 ranks.
    m.pp_nccl = nccl.communicator + nccl.collectives + nccl.point_to_point;
    m.pp_note = fmt::format(
        "the pipeline group's NCCL memory is the GPU file's {}-rank communicator with its first "
        "all-reduce and first send/recv ({}){}",
        gpu.interconnect.nccl_memory_ranks, gpu.name,
        p.pipeline == gpu.interconnect.nccl_memory_ranks
            ? std::string()
            : fmt::format(", taken for a group of {}", p.pipeline));
  }
  if (p.tensor <= 1) return m;
  m.nccl_communicator = nccl.communicator;
  m.nccl_collectives = nccl.collectives;
  const auto& by_rank =
      o.nccl_cumem ? gpu.interconnect.nccl_by_rank_cumem : gpu.interconnect.nccl_by_rank_no_cumem;
  if (auto it = by_rank.find(p.tensor); it != by_rank.end())
    m.nccl_by_rank = it->second;
  else if (p.tensor != gpu.interconnect.nccl_memory_ranks)
    m.nccl_note = fmt::format(
        "NCCL's memory is measured at {} ranks ({}), extrapolated to {}: at 4 ranks memsim's ranks "
        "measured more, and rank by rank different (docs/results/tp-memory.md)",
        gpu.interconnect.nccl_memory_ranks, gpu.name, p.tensor);
  if (o.custom_all_reduce && custom_all_reduce_supported(p.tensor)) {
    m.custom_all_reduce = true;
    m.custom_meta =
        round_up(kCustomAllReduceSignalBytes + kCustomAllReduceMaxSize, gpu.granularity);
    m.custom_buffer = round_up(kCustomAllReduceMaxSize, gpu.granularity);
    m.custom_rank_data = kTorchLargeBuffer;
    m.custom_ipc = o.nccl_cumem ? kIpcOpenBytesUnderCumem : 0;
  }
  return m;
}

size_t custom_all_reduce_sizes(const InterconnectSpec& ic) {
  return static_cast<size_t>(std::count_if(ic.collective_sizes.begin(), ic.collective_sizes.end(),
                                           [](uint64_t b) { return b < kCustomAllReduceMaxSize; }));
}

namespace {

// The rank count of `tables` nearest to `ranks` (the larger on a tie); 0 when empty.
uint32_t nearest_count(const std::map<uint32_t, std::vector<double>>& tables, uint32_t ranks) {
  uint32_t measured = 0;
  const auto dist = [&](uint32_t k) { return k > ranks ? k - ranks : ranks - k; };
  for (const auto& [n, us] : tables)
    if (measured == 0 || dist(n) <= dist(measured)) measured = n;
  return measured;
}

}  // namespace

Result<CollectiveTime> CollectiveTime::make(const GpuSpec& gpu, uint32_t ranks,
                                            bool custom_all_reduce) {
  CollectiveTime c;
  c.ranks_ = ranks;
  if (ranks <= 1) return c;
  MEMSIM_TRY(check_node(gpu, ranks));
  const InterconnectSpec& ic = gpu.interconnect;
  const uint32_t measured = nearest_count(ic.all_reduce_us, ranks);
  if (!ic.all_gather_us.contains(measured))
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("gpu {}: all_gather_us has no row for {} ranks, which "
                                  "all_reduce_us has",
                                  gpu.name, measured));
  c.sizes_.assign(ic.collective_sizes.begin(), ic.collective_sizes.end());
  c.reduce_us_ = ic.all_reduce_us.at(measured);
  c.gather_us_ = ic.all_gather_us.at(measured);
  const double n = ranks, m = measured;
  c.reduce_scale_ = (2 * (n - 1) / n) / (2 * (m - 1) / m);
  c.gather_scale_ = (n - 1) / (m - 1);
  c.send_us_ = ic.send_recv_us;
  c.source_ =
      measured == ranks
          ? fmt::format("NCCL {} measured at {} ranks ({})", ic.nccl_version, ranks, gpu.name)
          : fmt::format("NCCL {} measured at {} ranks ({}), bytes per rank scaled to {}",
                        ic.nccl_version, measured, gpu.name, ranks);
  if (!custom_all_reduce || !custom_all_reduce_supported(ranks)) return c;
  const uint32_t custom = nearest_count(ic.custom_all_reduce_us, ranks);
  if (custom == 0) {
    c.source_ +=
        fmt::format("; the custom all-reduce is not measured on {}: NCCL's times", gpu.name);
    return c;
  }
  c.custom_us_ = ic.custom_all_reduce_us.at(custom);
  c.custom_sizes_.assign(c.sizes_.begin(),
                         c.sizes_.begin() + static_cast<long>(c.custom_us_.size()));
  c.source_ += custom == ranks
                   ? fmt::format("; custom all-reduce under 8 MiB measured at {} ranks", ranks)
                   : fmt::format(
                         "; custom all-reduce under 8 MiB measured at {} ranks "
                         "(used unscaled for {})",
                         custom, ranks);
  return c;
}

SimTime CollectiveTime::all_reduce(uint64_t bytes) const {
  if (ranks_ <= 1 || bytes == 0) return 0;
  if (!custom_us_.empty() && bytes < kCustomAllReduceMaxSize && bytes % 16 == 0)
    return to_ns(interpolate_us(custom_sizes_, custom_us_, static_cast<double>(bytes)));
  return to_ns(interpolate_us(sizes_, reduce_us_, static_cast<double>(bytes) * reduce_scale_));
}

SimTime CollectiveTime::all_gather(uint64_t part_bytes) const {
  if (ranks_ <= 1 || part_bytes == 0) return 0;
  return to_ns(interpolate_us(sizes_, gather_us_, static_cast<double>(part_bytes) * gather_scale_));
}

SimTime CollectiveTime::send_recv(uint64_t bytes) const {
  if (ranks_ <= 1 || bytes == 0) return 0;
  if (send_us_.empty()) return all_gather(bytes);
  return to_ns(interpolate_us(sizes_, send_us_, static_cast<double>(bytes)));
}

}  // namespace memsim
