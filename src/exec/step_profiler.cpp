// The profile grid: a block-major paged pool (as paged_block_pool lays it out) filled with random
// K/V, decode steps of B sequences at a context, prefill chunks of one sequence over a prefix.
#include "src/exec/step_profiler.h"

#include "src/exec/tp_group.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>

#include "kernels/attention.h"
#include "src/exec/tp_group.h"

namespace memsim {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

Result<StepProfile> measure_step_profile(ModelStep& step, Backend& backend, const ProfileGrid& g,
                                         std::ostream& log) {
  const ModelShape& m = step.config().model;
  uint64_t pool = g.pool_bytes;
  if (pool == 0) {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess)
      return make_error(ErrorCode::kDriverError, "cudaMemGetInfo failed");
    uint64_t least = free;
    // Under TP every rank's pool is as large as the smallest's, so that all run the same points.
    if (TpGroup* tp = step.config().tp) {
      MEMSIM_ASSIGN_OR_RETURN(least, tp->host_min(free));
    }
    if (least <= g.headroom)
      return make_error(ErrorCode::kOutOfMemory, "no device memory left for a KV pool");
    pool = least - g.headroom;
  }
  KvInit init;
  init.layers = m.layers;
  init.kv_bytes_per_token = step.rank_model().kv_bytes_per_token();  // the rank's KV heads
  const uint64_t block_bytes = uint64_t{g.block_size} * init.kv_bytes_per_token;
  const uint64_t blocks = pool / block_bytes;
  if (blocks == 0) return make_error(ErrorCode::kOutOfMemory, "KV pool holds no block");
  MEMSIM_ASSIGN_OR_RETURN(DevPtr base, backend.device_malloc(blocks * block_bytes, "kv_cache"));
  // Random 16-bit values; an fp8 cache reads their bytes as fp8 (some NaN: times do not vary).
  const auto dtype = m.dtype == DType::kFP16 ? kernels::KvDtype::kFp16 : kernels::KvDtype::kBf16;
  if (cudaError_t e = kernels::random_half(dtype, base, blocks * block_bytes / 2, 7, nullptr);
      e != cudaSuccess || (e = cudaDeviceSynchronize()) != cudaSuccess) {
    (void)backend.device_free(base);
    return make_error(ErrorCode::kDriverError, cudaGetErrorString(e));
  }
  const KvLayout layout = block_major_layout(base, init, g.block_size, block_bytes, blocks);
  log << fmt::format("profile: {} on a KV pool of {} blocks of {} tokens ({:.1f} GiB)\n", m.name,
                     blocks, g.block_size, double(blocks * block_bytes) / (1ull << 30));

  auto time = [&](const std::vector<StepSeqInput>& in) -> Result<double> {
    std::vector<double> ms, wall;
    for (uint32_t r = 0; r <= g.reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      MEMSIM_ASSIGN_OR_RETURN(StepResult res, step.run(layout, in));
      const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - t0;
      if (r) ms.push_back(res.gpu_ms);  // the first step warms caches and the allocator
      if (r) wall.push_back(took.count());
    }
    log << fmt::format("  {} sequences, {} tokens: GPU {:.3f} ms, host wall {:.3f} ms\n", in.size(),
                       in.empty() ? 0 : in[0].cached + in[0].tokens.size(), median(ms),
                       median(wall));
    return median(ms);
  };
  auto blocks_for = [&](uint32_t tokens) {
    return (uint64_t{tokens} + g.block_size - 1) / g.block_size;
  };
  // Tables take blocks in a seeded random order over the whole pool, as a serving pool's tables
  // look after some churn. (Measured on the H200 with Llama-3.1-8B: decode steps over shuffled
  // tables take the same time as over consecutive blocks, within 1% up to batch 256; at batch
  // 512, 2-7% less.)
  std::vector<int32_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(g.seed));
  auto seqs = [&](uint32_t n, uint32_t cached, uint32_t new_tokens) {
    std::vector<StepSeqInput> in(n);
    uint64_t next = 0;
    for (uint32_t s = 0; s < n; ++s) {
      for (uint64_t b = 0; b < blocks_for(cached + new_tokens); ++b)
        in[s].table.push_back(order[next++]);
      in[s].cached = cached;
      for (uint32_t t = 0; t < new_tokens; ++t)
        in[s].tokens.push_back(static_cast<int32_t>((uint64_t{s} * 7919 + t * 104729) % m.vocab));
    }
    return in;
  };

  StepProfile p;
  p.model = m.name;
  p.mode = g.graphs ? "graphs" : "eager";
  Status failed;
  for (uint32_t b : g.batches) {
    if (b > step.config().max_seqs) continue;
    ProfileRow row{b, {}, {}};
    if (g.graphs) {
      if (Status st = step.capture_decode(layout, b, graph_context_for(g.contexts.back()));
          !st.ok()) {
        failed = st;
        break;
      }
    }
    for (uint32_t ctx : g.contexts) {
      if (uint64_t{b} * blocks_for(ctx) > blocks) continue;
      auto ms = time(seqs(b, ctx - 1, 1));
      if (!ms.ok()) {
        failed = ms.error();
        break;
      }
      row.points.push_back(ctx);
      row.ms.push_back(*ms);
      log << fmt::format("  decode  batch {:>5} context {:>6}: {:9.3f} ms\n", b, ctx, *ms);
    }
    if (!failed.ok()) break;
    if (!row.points.empty()) p.decode.push_back(std::move(row));
  }
  for (uint32_t c : g.chunks) {
    if (!failed.ok() || c > step.config().max_tokens) break;
    ProfileRow row{c, {}, {}};
    for (uint32_t pre : g.prefixes) {
      if (blocks_for(pre + c) > blocks) continue;
      auto ms = time(seqs(1, pre, c));
      if (!ms.ok()) {
        failed = ms.error();
        break;
      }
      row.points.push_back(pre);
      row.ms.push_back(*ms);
      log << fmt::format("  prefill chunk {:>5} prefix  {:>6}: {:9.3f} ms\n", c, pre, *ms);
    }
    if (!row.points.empty()) p.prefill.push_back(std::move(row));
  }
  (void)backend.device_free(base);
  if (!failed.ok()) return failed.error();
  return p;
}

Result<SpeedProbe> probe_profile_speed(ModelStep& step, Backend& backend,
                                       const StepProfile& profile, std::ostream& log) {
  // The probe's rows among the profile's (profile_speed matches their points).
  auto row_of = [](const std::vector<ProfileRow>& rows, uint32_t size) -> const ProfileRow* {
    for (const ProfileRow& r : rows)
      if (r.size == size) return &r;
    return nullptr;
  };
  ProfileGrid g;
  g.batches.clear();
  g.chunks.clear();
  for (uint32_t b : {1u, 8u, 32u, 128u})
    if (row_of(profile.decode, b) && b <= step.config().max_seqs) g.batches.push_back(b);
  for (uint32_t c : {256u, 1024u})
    if (row_of(profile.prefill, c) && c <= step.config().max_tokens) g.chunks.push_back(c);
  g.contexts = {512, 2048};
  g.prefixes = {0, 4096};
  if (g.batches.empty() && g.chunks.empty())
    return make_error(ErrorCode::kInvalidArgument,
                      "speed probe: the profile holds none of the probe's rows (decode batches "
                      "1, 8, 32, 128; prefill chunks 256, 1024)");
  MEMSIM_ASSIGN_OR_RETURN(StepProfile here, measure_step_profile(step, backend, g, log));
  SpeedProbe probe = profile_speed(here, profile);
  if (probe.points.empty())
    return make_error(ErrorCode::kInvalidArgument,
                      "speed probe: no probe point is a point of the profile");
  return probe;
}

}  // namespace memsim
