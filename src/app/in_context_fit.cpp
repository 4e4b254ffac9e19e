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
#include <sstream>

namespace memsim {
namespace {

using P = Primitive;
// per call, per handle, per granule, per byte, per node, per log2(1 + live mappings)
constexpr size_t kCols = 6;

std::array<double, kCols> features(const GpuSpec& g, const CallSample& s) {
  const double granules =
      g.granularity ? double((s.bytes + g.granularity - 1) / g.granularity) : 0.0;
  return {1.0,
          double(s.handles),
          granules,
          double(s.bytes),
          double(s.nodes),
          std::log2(1.0 + double(s.mappings))};
}

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
  std::map<std::string, P> names;
  for (size_t i = 0; i < size_t(P::kCount); ++i) names[to_string(P(i))] = P(i);
  std::vector<CallSample> out;
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
    const auto it = names.find(f[1]);
    if (it == names.end()) return bad(fmt::format("unknown primitive '{}'", f[1]));
    s.p = it->second;
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
    out.push_back(std::move(s));
  }
  return out;
}

double price_sample_us(const GpuSpec& g, const CallSample& s) {
  if (s.p == P::kLaunch)  // priced on the nodes it uploads and the graph memory it maps
    return double(g.price(s.p, 0, 0, s.mappings)) / 1000.0 +
           g.launch_extra_us(s.nodes, g.granularity ? s.bytes / g.granularity : 0, 0);
  double us = double(g.price(s.p, s.handles, s.bytes, s.mappings)) / 1000.0;
  if (s.p == P::kEndCapture) us += g.end_capture_extra_us(s.nodes);
  return us;
}

InContextFit fit_in_context(const std::vector<CallSample>& samples, const GpuSpec& base,
                            uint64_t min_samples) {
  InContextFit fit;
  fit.spec = base;
  std::map<P, std::vector<const CallSample*>> by_p;
  for (const CallSample& s : samples) by_p[s.p].push_back(&s);
  for (auto& [p, all] : by_p) {
    if (all.size() < std::max<uint64_t>(min_samples, 1)) continue;
    // Fills and copies keep their synchronized terms: in context they return once enqueued, and
    // the model prices their bandwidth (swaps, copy-on-write) as a synchronized call.
    if (p == P::kFill || p == P::kCopy) continue;
    const std::vector<const CallSample*>& v = all;
    const CostTerm& t = base.cost(p);
    // A launch: per call (a replay), per node uploaded and per granule of graph memory mapped
    // (first launches); other primitives: the terms the base prices them with.
    const bool launch = p == P::kLaunch;
    const std::array<bool, kCols> active = {launch || t.per_call_us > 0,
                                            !launch && t.per_handle_us > 0,
                                            launch || t.per_granule_us > 0,
                                            !launch && t.bytes_per_us > 0,
                                            has_nodes(p),
                                            true};
    Eigen::MatrixXd a(Eigen::Index(v.size()), Eigen::Index(kCols));
    Eigen::VectorXd y(Eigen::Index(v.size()));
    for (size_t i = 0; i < v.size(); ++i) {
      const CallSample& s = *v[i];
      const auto f = features(base, s);
      for (size_t j = 0; j < kCols; ++j) a(Eigen::Index(i), Eigen::Index(j)) = f[j];
      y(Eigen::Index(i)) = s.measured_us;
    }
    const Eigen::VectorXd c = nnls(a, y, active);
    CostTerm& out = fit.spec.cost(p);
    out.per_call_us = c(0);
    out.per_handle_us = c(1);
    out.per_granule_us = launch ? t.per_granule_us : c(2);
    out.bytes_per_us = c(3) > 0 ? 1.0 / c(3) : 0.0;
    out.per_log2_mappings_us = c(5);
    if (launch && a.col(2).cwiseAbs().maxCoeff() > 0) fit.spec.graph_mem_map_per_granule_us = c(2);
    if (p == P::kEndCapture) {  // capture and instantiate keep the base's split of a node
      const double sum = base.capture_per_node_us + base.instantiate_per_node_us;
      const double share = sum > 0 ? base.capture_per_node_us / sum : 0.5;
      fit.spec.capture_per_node_us = c(4) * share;
      fit.spec.instantiate_per_node_us = c(4) * (1 - share);
    }
    if (launch) fit.spec.upload_per_node_us = c(4);
    fit.notes.push_back(fmt::format(
        "{}: {} calls: per_call {:.3f} us, per_handle {:.3f} us, "
        "per_granule {:.4f} us, per_log2_mappings {:.4f} us, {}{}",
        to_string(p), v.size(), c(0), c(1), c(2), c(5),
        c(3) > 0 ? fmt::format("{:.0f} B/us", 1.0 / c(3)) : "no per-byte term",
        has_nodes(p) ? fmt::format(", per node{} {:.3f} us", launch ? " uploaded" : "", c(4))
                     : ""));
  }
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

}  // namespace memsim
