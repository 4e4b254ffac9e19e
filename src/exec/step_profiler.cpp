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
#include <set>

#include "kernels/attention.h"
#include "src/exec/tp_group.h"

namespace memsim {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The grid's KV pool: block-major (as paged_block_pool lays it out), filled with random K/V,
// its blocks handed to tables in a seeded random order over the whole pool, as a serving pool's
// tables look after some churn; and the step timer (median of `reps` after one warm-up).
// (Measured on the H200 with Llama-3.1-8B: decode steps over shuffled tables take the same time
// as over consecutive blocks, within 1% up to batch 256; at batch 512, 2-7% less.)
class ProfilePool {
 public:
  ProfilePool(ModelStep& step, Backend& backend, const ProfileGrid& g, std::ostream& log)
      : step_(step), backend_(backend), g_(g), log_(log) {}
  ProfilePool(const ProfilePool&) = delete;
  ProfilePool& operator=(const ProfilePool&) = delete;
  ~ProfilePool() {
    if (base_) (void)backend_.device_free(base_);
  }

  Status open() {
    const ModelShape& m = step_.config().model;
    uint64_t pool = g_.pool_bytes;
    if (pool == 0) {
      size_t free = 0, total = 0;
      if (cudaMemGetInfo(&free, &total) != cudaSuccess)
        return make_error(ErrorCode::kDriverError, "cudaMemGetInfo failed");
      uint64_t least = free;
      // Under TP every rank's pool is as large as the smallest's: all run the same points.
      if (TpGroup* tp = step_.config().tp) {
        MEMSIM_ASSIGN_OR_RETURN(least, tp->host_min(free));
      }
      if (least <= g_.headroom)
        return make_error(ErrorCode::kOutOfMemory, "no device memory left for a KV pool");
      pool = least - g_.headroom;
    }
    KvInit init;
    init.layers = m.layers;
    init.kv_bytes_per_token = step_.rank_model().kv_bytes_per_token();  // the rank's KV heads
    const uint64_t block_bytes = uint64_t{g_.block_size} * init.kv_bytes_per_token;
    blocks_ = pool / block_bytes;
    if (blocks_ == 0) return make_error(ErrorCode::kOutOfMemory, "KV pool holds no block");
    MEMSIM_ASSIGN_OR_RETURN(base_, backend_.device_malloc(blocks_ * block_bytes, "kv_cache"));
    // Random 16-bit values; an fp8 cache reads their bytes as fp8 (some NaN: times do not vary).
    const auto dtype = m.dtype == DType::kFP16 ? kernels::KvDtype::kFp16 : kernels::KvDtype::kBf16;
    if (cudaError_t e = kernels::random_half(dtype, base_, blocks_ * block_bytes / 2, 7, nullptr);
        e != cudaSuccess || (e = cudaDeviceSynchronize()) != cudaSuccess)
      return make_error(ErrorCode::kDriverError, cudaGetErrorString(e));
    layout_ = block_major_layout(base_, init, g_.block_size, block_bytes, blocks_);
    log_ << fmt::format("profile: {} on a KV pool of {} blocks of {} tokens ({:.1f} GiB)\n", m.name,
                        blocks_, g_.block_size, double(blocks_ * block_bytes) / (1ull << 30));
    order_.resize(blocks_);
    std::iota(order_.begin(), order_.end(), 0);
    std::shuffle(order_.begin(), order_.end(), std::mt19937_64(g_.seed));
    return {};
  }

  const KvLayout& layout() const { return layout_; }
  uint64_t blocks() const { return blocks_; }
  uint64_t blocks_for(uint64_t tokens) const {
    return (tokens + g_.block_size - 1) / g_.block_size;
  }
  // Whether sequences of these (cached, new) tokens fit the pool at once.
  bool fits(const std::vector<SeqWork>& seqs) const {
    uint64_t need = 0;
    for (const SeqWork& s : seqs) need += blocks_for(uint64_t{s.cached} + s.tokens);
    return need <= blocks_;
  }
  // The step's inputs: each sequence's table from the shuffled order, its new tokens' ids.
  std::vector<StepSeqInput> inputs(const std::vector<SeqWork>& seqs) const {
    const uint32_t vocab = step_.config().model.vocab;
    std::vector<StepSeqInput> in(seqs.size());
    uint64_t next = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      for (uint64_t b = 0; b < blocks_for(uint64_t{seqs[s].cached} + seqs[s].tokens); ++b)
        in[s].table.push_back(order_[next++]);
      in[s].cached = seqs[s].cached;
      for (uint32_t t = 0; t < seqs[s].tokens; ++t)
        in[s].tokens.push_back(static_cast<int32_t>((uint64_t{s} * 7919 + t * 104729) % vocab));
    }
    return in;
  }
  // n sequences of `cached` tokens of KV and `new_tokens` new ones each.
  std::vector<StepSeqInput> inputs(uint32_t n, uint32_t cached, uint32_t new_tokens) const {
    return inputs(std::vector<SeqWork>(n, SeqWork{cached, new_tokens}));
  }

  // The step's GPU time: the median of g.reps steps after one (the first warms caches and the
  // allocator); one line to the log.
  Result<double> time(const std::vector<StepSeqInput>& in) {
    std::vector<double> ms, wall;
    for (uint32_t r = 0; r <= g_.reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      MEMSIM_ASSIGN_OR_RETURN(StepResult res, step_.run(layout_, in));
      const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - t0;
      if (r) ms.push_back(res.gpu_ms);
      if (r) wall.push_back(took.count());
    }
    log_ << fmt::format("  {} sequences, {} tokens: GPU {:.3f} ms, host wall {:.3f} ms\n",
                        in.size(), in.empty() ? 0 : in[0].cached + in[0].tokens.size(), median(ms),
                        median(wall));
    return median(ms);
  }

 private:
  ModelStep& step_;
  Backend& backend_;
  const ProfileGrid& g_;
  std::ostream& log_;
  DevPtr base_ = 0;
  uint64_t blocks_ = 0;
  KvLayout layout_;
  std::vector<int32_t> order_;
};

}  // namespace

Result<StepProfile> measure_step_profile(ModelStep& step, Backend& backend, const ProfileGrid& g,
                                         std::ostream& log) {
  const ModelShape& m = step.config().model;
  ProfilePool pool(step, backend, g, log);
  MEMSIM_TRY(pool.open());
  const KvLayout& layout = pool.layout();
  const uint64_t blocks = pool.blocks();
  auto blocks_for = [&](uint32_t tokens) { return pool.blocks_for(tokens); };
  auto seqs = [&](uint32_t n, uint32_t cached, uint32_t new_tokens) {
    return pool.inputs(n, cached, new_tokens);
  };
  auto time = [&](const std::vector<StepSeqInput>& in) { return pool.time(in); };

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
  if (!failed.ok()) return failed.error();
  return p;
}

Result<std::vector<double>> measure_steps(ModelStep& step, Backend& backend, const ProfileGrid& g,
                                          const std::vector<std::vector<SeqWork>>& steps,
                                          std::ostream& log) {
  ProfilePool pool(step, backend, g, log);
  MEMSIM_TRY(pool.open());
  std::vector<double> ms;
  for (size_t i = 0; i < steps.size(); ++i) {
    uint64_t tokens = 0;
    for (const SeqWork& s : steps[i]) tokens += s.tokens;
    if (steps[i].empty() || tokens > step.config().max_tokens ||
        steps[i].size() > step.config().max_seqs)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("step {}: {} sequences, {} new tokens: outside the model "
                                    "step's {} sequences and {} tokens",
                                    i, steps[i].size(), tokens, step.config().max_seqs,
                                    step.config().max_tokens));
    if (!pool.fits(steps[i]))
      return make_error(
          ErrorCode::kOutOfMemory,
          fmt::format("step {}: its KV does not fit the pool of {} blocks", i, pool.blocks()));
    MEMSIM_ASSIGN_OR_RETURN(const double t, pool.time(pool.inputs(steps[i])));
    ms.push_back(t);
  }
  return ms;
}

Result<SpeedProbe> probe_profile_speed(ModelStep& step, Backend& backend,
                                       const StepProfile& profile, std::ostream& log) {
  // The profile's grid: its rows the step takes, each at every point of any row (a point the
  // profile lacks is timed too, and left out of the comparison by profile_speed).
  ProfileGrid g;
  std::set<uint32_t> contexts, prefixes;
  g.batches.clear();
  g.chunks.clear();
  for (const ProfileRow& r : profile.decode)
    if (r.size <= step.config().max_seqs) {
      g.batches.push_back(r.size);
      contexts.insert(r.points.begin(), r.points.end());
    }
  for (const ProfileRow& r : profile.prefill)
    if (r.size <= step.config().max_tokens) {
      g.chunks.push_back(r.size);
      prefixes.insert(r.points.begin(), r.points.end());
    }
  g.contexts.assign(contexts.begin(), contexts.end());
  g.prefixes.assign(prefixes.begin(), prefixes.end());
  if (g.batches.empty() && g.chunks.empty())
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("speed probe: the step takes none of the profile's rows (at "
                                  "most {} sequences and {} tokens a step)",
                                  step.config().max_seqs, step.config().max_tokens));
  MEMSIM_ASSIGN_OR_RETURN(StepProfile here, measure_step_profile(step, backend, g, log));
  SpeedProbe probe = profile_speed(here, profile);
  if (probe.points.empty())
    return make_error(ErrorCode::kInvalidArgument,
                      "speed probe: no probe point is a point of the profile");
  return probe;
}

}  // namespace memsim
