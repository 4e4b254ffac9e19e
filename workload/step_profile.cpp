// Step-time profiles: validation and the piecewise-linear interpolation over measured grids.
#include "workload/step_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace memsim {
namespace {

// Linear through (x0, y0), (x1, y1) at x (flat when the two x coincide).
double lerp(double x0, double y0, double x1, double y1, double x) {
  if (x1 == x0) return y0;
  return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
}

// Index i of the segment [i, i + 1] of ascending `xs` to interpolate (or extend) at x.
template <class V>
size_t segment(const V& xs, double x) {
  if (xs.size() < 2) return 0;
  const auto it = std::upper_bound(xs.begin(), xs.end(), x,
                                   [](double v, const auto& e) { return v < double(e); });
  const size_t hi =
      static_cast<size_t>(std::clamp<ptrdiff_t>(it - xs.begin(), 1, ptrdiff_t(xs.size()) - 1));
  return hi - 1;
}

// The least-squares slope of a row's times over its points (at least two), never below 0.
double row_slope(const ProfileRow& r) {
  const double n = static_cast<double>(r.points.size());
  double mx = 0, my = 0;
  for (size_t j = 0; j < r.points.size(); ++j) {
    mx += r.points[j] / n;
    my += r.ms[j] / n;
  }
  double sxy = 0, sxx = 0;
  for (size_t j = 0; j < r.points.size(); ++j) {
    sxy += (r.points[j] - mx) * (r.ms[j] - my);
    sxx += (r.points[j] - mx) * (r.points[j] - mx);
  }
  return sxx > 0 ? std::max(0.0, sxy / sxx) : 0.0;
}

// How a row is read outside its points. kFloored: the nearest segment extends it, no time below
// the row's fastest measured step. kSegment: the same, unfloored. kRowSlope: as kSegment down to
// point 0, and below 0 the row's least-squares slope over all its points extends it from there.
enum class Extend { kFloored, kSegment, kRowSlope };

double row_at(const ProfileRow& r, double point, Extend how = Extend::kFloored) {
  if (r.points.size() == 1) return r.ms[0];
  if (how == Extend::kRowSlope && point < 0)
    return row_at(r, 0, Extend::kSegment) + row_slope(r) * point;
  const size_t i = segment(r.points, point);
  const double y = lerp(r.points[i], r.ms[i], r.points[i + 1], r.ms[i + 1], point);
  return how != Extend::kFloored ? y : std::max(y, *std::min_element(r.ms.begin(), r.ms.end()));
}

double grid_at(const std::vector<ProfileRow>& rows, double size, double point,
               Extend how = Extend::kFloored) {
  if (rows.size() == 1) return row_at(rows[0], point, how);
  std::vector<double> sizes;
  for (const ProfileRow& r : rows) sizes.push_back(r.size);
  const size_t i = segment(sizes, size);
  const double y = lerp(sizes[i], row_at(rows[i], point, how), sizes[i + 1],
                        row_at(rows[i + 1], point, how), size);
  return how != Extend::kFloored ? y : std::max(y, 0.0);
}

std::string check_rows(const std::vector<ProfileRow>& rows, const char* what) {
  for (size_t i = 0; i < rows.size(); ++i) {
    const ProfileRow& r = rows[i];
    if (r.size == 0) return fmt::format("{} row {}: size must be positive", what, i);
    if (i && r.size <= rows[i - 1].size)
      return fmt::format("{} rows must ascend by size ({} after {})", what, r.size,
                         rows[i - 1].size);
    if (r.points.empty() || r.points.size() != r.ms.size())
      return fmt::format("{} row {}: {} points but {} times", what, r.size, r.points.size(),
                         r.ms.size());
    for (size_t j = 0; j < r.points.size(); ++j) {
      if (j && r.points[j] <= r.points[j - 1])
        return fmt::format("{} row {}: points must ascend ({} after {})", what, r.size, r.points[j],
                           r.points[j - 1]);
      if (!(r.ms[j] > 0) || !std::isfinite(r.ms[j]))
        return fmt::format("{} row {}: time {} at point {} is not a positive number", what, r.size,
                           r.ms[j], r.points[j]);
    }
  }
  return {};
}

}  // namespace

std::string check_step_profile(const StepProfile& p) {
  if (p.decode.empty()) return "a profile needs at least one decode row";
  if (std::string why = check_rows(p.decode, "decode"); !why.empty()) return why;
  return check_rows(p.prefill, "prefill");
}

namespace {

// Empty when `sizes` is non-empty, ascending and each in 1..most; else what is wrong, naming one
// size `what` and all of them `whats`.
std::string check_row_sizes(const std::vector<uint32_t>& sizes, uint32_t most, const char* what,
                            const char* whats) {
  if (sizes.empty()) return fmt::format("no {} size given", what);
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0 || sizes[i] > most)
      return fmt::format("{} {} is outside 1..{}", what, sizes[i], most);
    if (i && sizes[i] <= sizes[i - 1])
      return fmt::format("{} must ascend ({} after {})", whats, sizes[i], sizes[i - 1]);
  }
  return {};
}

}  // namespace

std::string check_decode_batches(const std::vector<uint32_t>& batches, uint32_t max_seqs) {
  return check_row_sizes(batches, max_seqs, "batch", "batches");
}

std::string check_prefill_chunks(const std::vector<uint32_t>& chunks, uint32_t max_tokens) {
  return check_row_sizes(chunks, max_tokens, "chunk", "chunks");
}

StepProfile scale_step_profile(StepProfile p, double decode, double prefill) {
  for (double f : {decode, prefill})
    if (!(f > 0) || !std::isfinite(f))
      throw std::invalid_argument(fmt::format("step profile scale {} is not positive", f));
  for (ProfileRow& r : p.decode)
    for (double& ms : r.ms) ms *= decode;
  for (ProfileRow& r : p.prefill)
    for (double& ms : r.ms) ms *= prefill;
  p.decode_scale *= decode;
  p.prefill_scale *= prefill;
  return p;
}

SpeedProbe profile_speed(const StepProfile& measured, const StepProfile& reference) {
  SpeedProbe probe;
  double log_sum[2] = {}, n[2] = {};  // [prefill, decode]
  auto match = [&](const std::vector<ProfileRow>& mine, const std::vector<ProfileRow>& theirs,
                   bool decode) {
    for (const ProfileRow& r : mine) {
      auto t = std::find_if(theirs.begin(), theirs.end(),
                            [&](const ProfileRow& x) { return x.size == r.size; });
      for (size_t i = 0; t != theirs.end() && i < r.points.size(); ++i) {
        auto at = std::find(t->points.begin(), t->points.end(), r.points[i]);
        if (at == t->points.end()) continue;
        const double want = t->ms[size_t(at - t->points.begin())];
        if (!(want > 0) || !(r.ms[i] > 0)) continue;
        probe.points.push_back({decode, r.size, r.points[i], want, r.ms[i]});
        log_sum[decode] += std::log(r.ms[i] / want);
        n[decode] += 1;
      }
    }
  };
  match(measured.decode, reference.decode, true);
  match(measured.prefill, reference.prefill, false);
  if (n[1] > 0) probe.decode = std::exp(log_sum[1] / n[1]);
  if (n[0] > 0) probe.prefill = std::exp(log_sum[0] / n[0]);
  return probe;
}

ProfiledStepTime::ProfiledStepTime(StepProfile profile, std::shared_ptr<const StepProfile> graphs,
                                   std::vector<uint32_t> graph_sizes,
                                   std::vector<bool> rows_at_once)
    : p_(std::move(profile)),
      graphs_(std::move(graphs)),
      graph_sizes_(std::move(graph_sizes)),
      at_once_(std::move(rows_at_once)) {
  if (std::string why = check_step_profile(p_); !why.empty())
    throw std::invalid_argument("step profile: " + why);
  if (!at_once_.empty() && at_once_.size() != graph_sizes_.size())
    throw std::invalid_argument(fmt::format("{} rows-at-once flags for {} graph sizes",
                                            at_once_.size(), graph_sizes_.size()));
  if (!graphs_) graph_sizes_.clear();
  if (graph_sizes_.empty()) at_once_.clear();
  if (graphs_ && !graph_sizes_.empty()) {
    if (std::string why = check_step_profile(*graphs_); !why.empty())
      throw std::invalid_argument("graph step profile: " + why);
    if (graphs_->mode != "graphs")
      throw std::invalid_argument("graph step profile: mode is " + graphs_->mode + ", not graphs");
    if (!std::is_sorted(graph_sizes_.begin(), graph_sizes_.end()) || graph_sizes_.front() == 0)
      throw std::invalid_argument("graph sizes must be positive and ascending");
  }
}

std::string ProfiledStepTime::describe() const {
  std::string s = p_.gpu + "/" + p_.model + " (" + p_.mode;
  if (p_.kv_cache_dtype) s += fmt::format(", {} KV cache", to_string(*p_.kv_cache_dtype));
  if (p_.tensor_parallel > 1)
    s += fmt::format(", one rank of TP {}, {} all-reduce", p_.tensor_parallel, p_.all_reduce);
  if (graphs()) s += fmt::format("; decode as CUDA graphs of {} sizes", graph_sizes_.size());
  if (p_.decode_scale != 1 || p_.prefill_scale != 1)
    s +=
        fmt::format(", scaled: decode x{:.3f}, prefill x{:.3f}", p_.decode_scale, p_.prefill_scale);
  return s + ")";
}

SimTime ProfiledStepTime::step_time(const StepShape& s) const {
  if (s.new_tokens == 0 || s.num_seqs == 0) return 0;
  double ms = 0;
  const bool decode = s.new_tokens == s.num_seqs;
  if (decode && graphs() && s.num_seqs <= graph_sizes_.back()) {
    const auto i =
        static_cast<size_t>(std::lower_bound(graph_sizes_.begin(), graph_sizes_.end(), s.num_seqs) -
                            graph_sizes_.begin());
    const double bp = graph_sizes_[i];
    // The rows the KV spreads over: Bp, or the real sequences when each runs as a row at once.
    const double rows = !at_once_.empty() && at_once_[i] ? double(s.num_seqs) : bp;
    ms = grid_at(graphs_->decode, bp, static_cast<double>(s.kv_read_tokens) / rows);
  } else if (decode || p_.prefill.empty()) {
    const double b = s.num_seqs;
    ms = grid_at(p_.decode, b, static_cast<double>(s.kv_read_tokens) / b);
  } else {
    // One chunk of all t new tokens (their GEMMs) whose prefix gives the prefill sequences'
    // attention work: below one chunk's own t (t + 1) / 2 pairs (several shorter prompts) the
    // prefix is negative and each row falls from prefix 0 by its least-squares slope.
    const double t = static_cast<double>(s.new_tokens);
    const double pairs = std::max(0.0, s.attn_pairs - double(s.decode_kv_tokens));
    ms = grid_at(p_.prefill, t, (pairs - t * (t + 1) / 2) / t, Extend::kRowSlope);
    // The decodes' attention: their decode step less the same step at context 0 (the GEMM part
    // the chunk above already counts).
    if (s.decode_seqs) {
      const double d = s.decode_seqs;
      ms += std::max(0.0, grid_at(p_.decode, d, double(s.decode_kv_tokens) / d, Extend::kSegment) -
                              grid_at(p_.decode, d, 0, Extend::kSegment));
    }
    ms = std::max(ms, 0.0);
  }
  return static_cast<SimTime>(std::llround(ms * 1e6));
}

}  // namespace memsim
