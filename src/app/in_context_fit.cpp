// In-context cost fit: calls.csv reader, per-primitive non-negative weighted least squares
// (Eigen) over the columns the base spec prices with, and the per-run comparison.
#include "src/app/in_context_fit.h"

#include <fmt/format.h>

#include <Eigen/Dense>
#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

namespace memsim {
namespace {

using P = Primitive;
// per call, per handle, per granule, per byte, per node, per log2(1 + live mappings / knee),
// first of its primitive since a launch
constexpr size_t kCols = 7;

std::array<double, kCols> features(const GpuSpec& g, const CallSample& s) {
  const double granules =
      g.granularity ? double((s.bytes + g.granularity - 1) / g.granularity) : 0.0;
  return {1.0,
          double(s.handles),
          granules,
          double(s.bytes),
          double(s.nodes),
          g.mappings_feature(s.mappings),
          s.first_after_launch ? 1.0 : 0.0};
}

// The knees tried for the mappings term (va_mappings_knee): 1 is log2(1 + mappings).
constexpr double kKnees[] = {1, 4, 16, 64, 256, 1024, 4096, 16384};

bool has_nodes(P p) {
  return p == P::kEndCapture || p == P::kLaunch;
}

// Non-negative least squares over the active columns: solve, drop the most negative, repeat.
// The per-call column (0) goes last: while it stays, the fitted total equals the measured one.
Eigen::VectorXd nnls(const Eigen::MatrixXd& a, const Eigen::VectorXd& y,
                     std::array<bool, kCols> active) {
  Eigen::VectorXd x = Eigen::VectorXd::Zero(kCols);
  while (true) {
    std::vector<Eigen::Index> cols;
    for (size_t j = 0; j < kCols; ++j)
      if (active[j] && a.col(Eigen::Index(j)).cwiseAbs().maxCoeff() > 0)
        cols.push_back(Eigen::Index(j));
    if (cols.empty()) return x;
    Eigen::MatrixXd sub(a.rows(), Eigen::Index(cols.size()));
    Eigen::VectorXd scale(Eigen::Index(cols.size()));
    for (size_t k = 0; k < cols.size(); ++k) {
      scale(Eigen::Index(k)) = a.col(cols[k]).cwiseAbs().maxCoeff();
      sub.col(Eigen::Index(k)) = a.col(cols[k]) / scale(Eigen::Index(k));
    }
    const Eigen::VectorXd sol = sub.colPivHouseholderQr().solve(y);
    Eigen::Index worst = -1;
    for (Eigen::Index k = 0; k < sol.size(); ++k)
      if (sol(k) < 0 && cols[size_t(k)] != 0 && (worst < 0 || sol(k) < sol(worst))) worst = k;
    if (worst < 0 && cols[0] == 0 && sol(0) < 0) worst = 0;  // only the per-call term is negative
    if (worst < 0) {
      x.setZero();
      for (size_t k = 0; k < cols.size(); ++k)
        x(cols[k]) = sol(Eigen::Index(k)) / scale(Eigen::Index(k));
      return x;
    }
    active[size_t(cols[size_t(worst)])] = false;
  }
}

}  // namespace

Result<std::vector<CallSample>> read_call_samples(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(ErrorCode::kInvalidArgument, fmt::format("{}: cannot open", path));
  std::vector<CallSample> out;
  // Per run, as the backend tracked it (the file lists every priced call of a run in order,
  // launches included).
  std::map<std::string, FirstAfterLaunch, std::less<>> since_launch;
  std::string line;
  for (uint64_t n = 1; std::getline(in, line); ++n) {
    if (n == 1) {
      if (line != "strategy,primitive,handles,bytes,nodes,mappings,measured_us")
        return make_error(
            ErrorCode::kInvalidArgument,
            fmt::format("{}:1: not a calls.csv header (strategy,primitive,handles,bytes,nodes,"
                        "mappings,measured_us){}",
                        path,
                        line == "strategy,primitive,handles,bytes,nodes,measured_us"
                            ? ": written by an older memsim, whose launch features (every node, "
                              "every launch) the fit no longer reads; run the shapes experiment "
                              "again"
                            : ""));
      continue;
    }
    if (line.empty()) continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
    auto bad = [&](const std::string& why) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("{}:{}: {}", path, n, why));
    };
    if (f.size() != 7) return bad(fmt::format("{} fields, expected 7", f.size()));
    CallSample s;
    s.run = f[0];
    s.p = primitive_named(f[1]);
    if (s.p == P::kCount) return bad(fmt::format("unknown primitive '{}'", f[1]));
    try {
      size_t used = 0;
      auto u = [&](const std::string& v) {
        const uint64_t r = std::stoull(v, &used);
        if (used != v.size() || v[0] == '-') throw std::invalid_argument(v);
        return r;
      };
      auto d = [&](const std::string& v) {
        const double r = std::stod(v, &used);
        if (used != v.size() || !std::isfinite(r) || r < 0) throw std::invalid_argument(v);
        return r;
      };
      s.handles = u(f[2]);
      s.bytes = u(f[3]);
      s.nodes = u(f[4]);
      s.mappings = u(f[5]);
      s.measured_us = d(f[6]);
    } catch (const std::exception&) {
      return bad(
          "handles, bytes, nodes, mappings must be whole numbers and measured_us a "
          "non-negative number");
    }
    s.first_after_launch = since_launch[s.run].note(s.p);
    out.push_back(std::move(s));
  }
  return out;
}

double price_sample_us(const GpuSpec& g, const CallSample& s) {
  if (s.p == P::kLaunch)  // priced on the nodes it uploads and the graph memory it maps
    return double(g.price(s.p, 0, 0, s.mappings, s.first_after_launch)) / 1000.0 +
           g.launch_extra_us(s.nodes, g.granularity ? s.bytes / g.granularity : 0, 0);
  double us = double(g.price(s.p, s.handles, s.bytes, s.mappings, s.first_after_launch)) / 1000.0;
  if (s.p == P::kEndCapture) us += g.end_capture_extra_us(s.nodes);
  return us;
}

namespace {

// The fit of every primitive with at least `min_samples` samples at one knee of the mappings
// term, and its score: the sum over primitives of the share of their variance left unexplained.
struct KneeFit {
  GpuSpec spec;
  std::vector<std::string> notes;
  double score = 0;
};

KneeFit fit_at_knee(const std::map<P, std::vector<const CallSample*>>& by_p, const GpuSpec& base,
                    double knee, uint64_t min_samples) {
  KneeFit fit;
  fit.spec = base;
  fit.spec.va_mappings_knee = knee;
  for (const auto& [p, v] : by_p) {
    if (v.size() < std::max<uint64_t>(min_samples, 1)) continue;
    // Fills and copies keep their synchronized terms: in context they return once enqueued, and
    // the model prices their bandwidth (swaps, copy-on-write) as a synchronized call.
    if (p == P::kFill || p == P::kCopy) continue;
    const CostTerm& t = base.cost(p);
    Eigen::MatrixXd a(Eigen::Index(v.size()), Eigen::Index(kCols));
    Eigen::VectorXd y(Eigen::Index(v.size()));
    size_t first = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const CallSample& s = *v[i];
      const auto f = features(fit.spec, s);
      for (size_t j = 0; j < kCols; ++j) a(Eigen::Index(i), Eigen::Index(j)) = f[j];
      y(Eigen::Index(i)) = s.measured_us;
      first += s.first_after_launch;
    }
    // A launch: per call (a replay), per node uploaded and per granule of graph memory mapped
    // (first launches). Other primitives: the terms the base prices them with, and a per-call
    // term unless one of those is the same for every call (set_access of one handle at a time:
    // per call under another name, kept as the base names it). Every primitive: the mappings
    // term, and the first-after-launch term where both kinds of call were measured (when every
    // call is a first, as begin_capture's are in a shapes run, it is the per-call term).
    const bool launch = p == P::kLaunch;
    std::array<bool, kCols> active = {true,
                                      !launch && t.per_handle_us > 0,
                                      launch || t.per_granule_us > 0,
                                      !launch && t.bytes_per_us > 0,
                                      has_nodes(p),
                                      true,
                                      first > 0 && first < v.size()};
    for (size_t j = 1; j <= 3 && !launch; ++j) {
      const auto col = a.col(Eigen::Index(j));
      if (active[j] && col.minCoeff() == col.maxCoeff() && col.maxCoeff() > 0)
        active[0] = t.per_call_us > 0;
    }
    Eigen::VectorXd c = nnls(a, y, active);
    // Round-off left in a term the calls do not need (1e-15 us where the calls are exact): a
    // GPU YAML could not write it back, and it prices nothing. The per-byte term is kept down
    // to 1e-12 us per byte (a million bytes per ns).
    for (Eigen::Index j = 0; j < c.size(); ++j)
      if (c(j) < (j == 3 ? 1e-12 : 1e-9)) c(j) = 0;
    const double sst = (y.array() - y.mean()).square().sum();
    if (sst > 0) fit.score += (y - a * c).squaredNorm() / sst;
    CostTerm& out = fit.spec.cost(p);
    out.per_call_us = c(0);
    out.per_handle_us = c(1);
    out.per_granule_us = launch ? t.per_granule_us : c(2);
    out.bytes_per_us = c(3) > 0 ? 1.0 / c(3) : 0.0;
    out.per_log2_mappings_us = c(5);
    out.first_after_launch_us = c(6);
    if (launch && a.col(2).cwiseAbs().maxCoeff() > 0) fit.spec.graph_mem_map_per_granule_us = c(2);
    if (p == P::kEndCapture) {  // capture and instantiate keep the base's split of a node
      const double sum = base.capture_per_node_us + base.instantiate_per_node_us;
      const double share = sum > 0 ? base.capture_per_node_us / sum : 0.5;
      fit.spec.capture_per_node_us = c(4) * share;
      fit.spec.instantiate_per_node_us = c(4) * (1 - share);
    }
    if (launch) fit.spec.upload_per_node_us = c(4);
    fit.notes.push_back(fmt::format(
        "{}: {} calls ({} first after a launch): per_call {:.3f} us, per_handle {:.3f} us, "
        "per_granule {:.4f} us, per_log2_mappings {:.4f} us, first_after_launch {:.3f} us, {}{}",
        to_string(p), v.size(), first, c(0), c(1), c(2), c(5), c(6),
        c(3) > 0 ? fmt::format("{:.0f} B/us", 1.0 / c(3)) : "no per-byte term",
        has_nodes(p) ? fmt::format(", per node{} {:.3f} us", launch ? " uploaded" : "", c(4))
                     : ""));
  }
  return fit;
}

}  // namespace

InContextFit fit_in_context(const std::vector<CallSample>& samples, const GpuSpec& base,
                            uint64_t min_samples) {
  std::map<P, std::vector<const CallSample*>> by_p;
  for (const CallSample& s : samples) by_p[s.p].push_back(&s);
  // The knee of the mappings term: the one whose fit leaves the least variance unexplained.
  std::optional<KneeFit> best;
  std::vector<std::string> tried;
  for (const double knee : kKnees) {
    KneeFit k = fit_at_knee(by_p, base, knee, min_samples);
    tried.push_back(fmt::format("{:g}: {:.4f}", knee, k.score));
    if (!best || k.score < best->score - 1e-12) best = std::move(k);
  }
  InContextFit fit;
  fit.spec = best->spec;
  fit.notes = std::move(best->notes);
  fit.notes.push_back(fmt::format(
      "va_mappings_knee {:g}: of the knees tried, the least variance left unexplained (sum over "
      "primitives of residual / total sum of squares; {})",
      fit.spec.va_mappings_knee, fmt::join(tried, ", ")));
  fit.classes = compare_classes(samples, base, fit.spec);
  return fit;
}

std::vector<InContextClass> compare_classes(const std::vector<CallSample>& samples,
                                            const GpuSpec& base, const GpuSpec& fitted) {
  std::vector<InContextClass> classes;
  std::map<std::pair<std::string, P>, size_t> at;
  for (const CallSample& s : samples) {
    const auto key = std::make_pair(s.run, s.p);
    auto it = at.find(key);
    if (it == at.end()) {
      it = at.emplace(key, classes.size()).first;
      classes.push_back({s.run, s.p, 0, 0, 0, 0});
    }
    InContextClass& k = classes[it->second];
    ++k.calls;
    k.measured_us += s.measured_us;
    k.base_us += price_sample_us(base, s);
    k.fitted_us += price_sample_us(fitted, s);
  }
  for (InContextClass& k : classes) {
    k.measured_us /= double(k.calls);
    k.base_us /= double(k.calls);
    k.fitted_us /= double(k.calls);
  }
  return classes;
}

bool in_per_call_table(Primitive p) {
  return std::find(std::begin(kPerCallTable), std::end(kPerCallTable), p) !=
         std::end(kPerCallTable);
}

PerCallRuns compare_runs(const std::vector<std::vector<InContextClass>>& runs) {
  PerCallRuns r;
  if (runs.empty()) return r;
  auto within = [](double measured, double model) {
    return model > 0 && measured / model >= 0.75 && measured / model <= 1.25;
  };
  // The classes: the first run's counted ones, looked up in every run by (label, primitive).
  std::vector<std::map<std::pair<std::string, Primitive>, const InContextClass*>> at(runs.size());
  for (size_t i = 0; i < runs.size(); ++i)
    for (const InContextClass& k : runs[i])
      if (k.calls > 10 && in_per_call_table(k.p)) at[i][{k.run, k.p}] = &k;
  r.within.assign(runs.size(), 0);
  r.within_median.assign(runs.size(), 0);
  for (const auto& entry : at[0]) {
    const auto& key = entry.first;
    ++r.classes;
    std::vector<const InContextClass*> of(runs.size(), nullptr);  // the class in each run
    std::vector<double> sorted;                                   // its times, ascending
    double calls = 0, measured = 0, model = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      const auto it = at[i].find(key);
      if (it == at[i].end()) continue;
      const InContextClass& k = *(of[i] = it->second);
      sorted.push_back(k.measured_us);
      r.within[i] += within(k.measured_us, k.base_us);
      calls += double(k.calls);
      measured += double(k.calls) * k.measured_us;
      model += double(k.calls) * k.base_us;
    }
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    for (size_t i = 0; i < runs.size(); ++i)
      if (of[i]) r.within_median[i] += within(of[i]->measured_us, median);
    if (sorted.front() > 0 && sorted.back() / sorted.front() > 1.25 / 0.75)
      r.beyond_reach.push_back(fmt::format("{} {} {:.2f}", key.first, to_string(key.second),
                                           sorted.back() / sorted.front()));
    if (within(measured / calls, model / calls))
      ++r.pooled_within;
    else
      r.pooled_out.push_back(fmt::format("{} {} {:.2f}", key.first, to_string(key.second),
                                         model > 0 ? measured / model : 0.0));
  }
  return r;
}

std::string common_factor_line(const std::vector<double>& ratios) {
  double log_sum = 0;
  size_t n = 0;
  for (const double r : ratios)
    if (r > 0) {
      log_sum += std::log(r);
      ++n;
    }
  if (n == 0) return "";
  const double g = std::exp(log_sum / double(n));
  size_t in = 0;
  for (const double r : ratios) in += r / g >= 0.75 && r / g <= 1.25;
  return fmt::format(
      "run-wide factor (geometric mean of the ratios): {:.2f}; with it divided out, {} of {} "
      "within 25%\n",
      g, in, ratios.size());
}

}  // namespace memsim
