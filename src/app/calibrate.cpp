// Calibration of the sim's cost model on a GPU: every Backend primitive timed call by call,
// medians per shape, non-negative fits of the cost terms (the YAML they are written to:
// calibration_yaml.cpp).
#include "src/app/calibrate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>

#include "backends/cuda/cuda_backend.h"
#include "core/clock.h"

namespace memsim {
namespace {

using P = Primitive;
constexpr uint64_t kKiB = 1ull << 10, kMiB = 1ull << 20, kGiB = 1ull << 30;
constexpr int kRounds = 7;        // repetitions of each measured batch
constexpr uint32_t kSmallN = 64;  // granule-sized handles per batch
constexpr uint32_t kBigN = 4;     // 1 GiB handles per batch
constexpr uint32_t kNodes1 = 20;  // graph sizes of the two-point graph fits
constexpr uint32_t kNodes2 = 200;
constexpr uint64_t kGraphMem = 256 * kMiB;  // graph memory node allocation
constexpr uint64_t kPinnedBig = 256 * kMiB;
constexpr const char* kTag = "calibrate";

struct Stats {
  double median = 0, p10 = 0, p90 = 0;
};

Stats stats(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const auto q = [&](double f) {
    const double pos = f * static_cast<double>(v.size() - 1);
    const auto i = static_cast<size_t>(pos);
    const size_t j = std::min(i + 1, v.size() - 1);
    return v[i] + (v[j] - v[i]) * (pos - static_cast<double>(i));
  };
  return Stats{q(0.5), q(0.1), q(0.9)};
}

double median(const std::vector<double>& v) {
  return stats(v).median;
}

// Non-negative least squares over the active columns of x: solves the normal equations (columns
// scaled to unit maximum), drops the most negative (or an unidentifiable) column, repeats.
using Row4 = std::array<double, 4>;
Row4 nnls(const std::vector<Row4>& x, const std::vector<double>& y, std::array<bool, 4> active) {
  Row4 scale{};
  for (const Row4& r : x)
    for (size_t j = 0; j < 4; ++j) scale[j] = std::max(scale[j], std::fabs(r[j]));
  for (size_t j = 0; j < 4; ++j) active[j] = active[j] && scale[j] > 0;
  while (true) {
    std::vector<size_t> cols;
    for (size_t j = 0; j < 4; ++j)
      if (active[j]) cols.push_back(j);
    const size_t k = cols.size();
    if (k == 0) return Row4{};
    double a[4][5] = {};
    for (size_t i = 0; i < x.size(); ++i)
      for (size_t r = 0; r < k; ++r) {
        const double xr = x[i][cols[r]] / scale[cols[r]];
        for (size_t s = 0; s < k; ++s) a[r][s] += xr * x[i][cols[s]] / scale[cols[s]];
        a[r][k] += xr * y[i];
      }
    size_t drop = k;  // column to drop: singular pivot or most negative coefficient
    for (size_t r = 0; r < k && drop == k; ++r) {
      size_t piv = r;
      for (size_t q = r + 1; q < k; ++q)
        if (std::fabs(a[q][r]) > std::fabs(a[piv][r])) piv = q;
      if (std::fabs(a[piv][r]) < 1e-12) drop = k - 1;
      std::swap(a[r], a[piv]);
      for (size_t q = r + 1; q < k && drop == k; ++q) {
        const double f = a[q][r] / a[r][r];
        for (size_t s = r; s <= k; ++s) a[q][s] -= f * a[r][s];
      }
    }
    double sol[4] = {};
    for (size_t r = k; drop == k && r-- > 0;) {
      double v = a[r][k];
      for (size_t s = r + 1; s < k; ++s) v -= a[r][s] * sol[s];
      sol[r] = v / a[r][r];
    }
    for (size_t r = 0; r < k && drop != k - 1; ++r)
      if (sol[r] < 0 && (drop == k || sol[r] < sol[drop])) drop = r;
    if (drop == k) {
      Row4 c{};
      for (size_t r = 0; r < k; ++r) c[cols[r]] = sol[r] / scale[cols[r]];
      return c;
    }
    active[cols[drop]] = false;
  }
}

// A measured shape: one call touching `handles` handles and `bytes` bytes took `us` (median).
struct Shape {
  double handles = 0;
  uint64_t bytes = 0;
  double us = 0;
};
enum Col : unsigned { kCall = 1, kHandle = 2, kGranule = 4, kBytes = 8 };

template <class T>
Result<T> keep(Result<T> r, std::vector<T>& out) {
  if (r.ok()) out.push_back(*r);
  return r;
}

class Calibrator {
 public:
  Calibrator(const CalibrationTarget& t, const GpuSpec& base, std::ostream& log)
      : t_(t), b_(*t.backend), log_(log), g_(b_.granularity()), big_(std::max(kGiB, g_)) {
    c_.base = base;
    c_.spec = base;
    c_.spec.granularity = g_;
    c_.spec.capacity = b_.capacity();
    c_.spec.context = t.context;
  }

  Calibration run() {
    const std::pair<const char*, std::function<Status()>> phases[] = {
        {"create_physical / release_physical",
         [&] {
           return alloc_free<PhysHandle>(
               P::kCreatePhysical, P::kReleasePhysical, {g_, big_}, {kSmallN, kBigN}, kRounds,
               kCall | kGranule, kCall | kGranule,
               [&](uint64_t n) { return b_.create_physical(n, kTag); },
               [&](PhysHandle h) { return b_.release_physical(h); });
         }},
        {"reserve_virtual / free_virtual",
         [&] {
           return alloc_free<DevPtr>(
               P::kReserveVirtual, P::kFreeVirtual, {kGiB, 64 * kGiB}, {kSmallN, 8}, kRounds, kCall,
               kCall, [&](uint64_t n) { return b_.reserve_virtual(n, g_); },
               [&](DevPtr va) { return b_.free_virtual(va); });
         }},
        {"map / set_access / unmap, first and alias mappings", [&] { return mapping(); }},
        {"device_malloc / device_free",
         [&] {
           return alloc_free<DevPtr>(
               P::kDeviceMalloc, P::kDeviceFree, {g_, big_}, {16, kBigN}, kRounds, kCall | kGranule,
               kCall | kGranule, [&](uint64_t n) { return b_.device_malloc(n, kTag); },
               [&](DevPtr p) { return b_.device_free(p); });
         }},
        {"malloc_async / free_async outside capture",
         [&] {
           return alloc_free<DevPtr>(
               P::kMallocAsync, P::kFreeAsync, {g_, 64 * kMiB}, {kSmallN, 8}, kRounds, kCall, kCall,
               [&](uint64_t n) { return b_.malloc_async(n, s0_); },
               [&](DevPtr p) { return b_.free_async(p, s0_); });
         }},
        {"fill / copy bandwidth", [&] { return work(); }},
        {"host_malloc_pinned / host_free_pinned",
         [&] {  // a 256 MiB pinned allocation takes tens of milliseconds: 3 rounds
           return alloc_free<DevPtr>(
               P::kHostMallocPinned, P::kHostFreePinned, {g_, kPinnedBig}, {4, 1}, 3,
               kCall | kBytes, kCall, [&](uint64_t n) { return b_.host_malloc_pinned(n); },
               [&](DevPtr p) { return b_.host_free_pinned(p); });
         }},
        {"graphs: capture, instantiate, launch, destroy", [&] { return graphs(); }},
        {"graph memory nodes", [&] { return graph_memory(); }},
    };
    for (const auto& [name, phase] : phases) {
      const auto t0 = std::chrono::steady_clock::now();
      log_ << fmt::format("  measuring {} ...", name) << std::flush;
      const Status s = phase();
      const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      log_ << fmt::format(" {} ({:.2f} s)\n", s.ok() ? "done" : "FAILED", dt.count());
      if (!s.ok()) c_.failures.push_back(fmt::format("{}: {}", name, s.error().message));
    }
    return std::move(c_);
  }

 private:
  GpuSpec& spec() { return c_.spec; }
  double price_us(P p, uint64_t handles, uint64_t bytes) const {
    return static_cast<double>(c_.spec.price(p, handles, bytes)) / 1000.0;
  }

  // Runs one primitive call; appends its measured microseconds to `s`. Exactly one real call of
  // `p` must have happened (otherwise the sample would not be that call's time).
  template <class F>
  auto timed(P p, std::vector<double>& s, F&& fn) -> decltype(fn()) {
    const SimTime t0 = t_.measured_ns(p);
    const uint64_t c0 = t_.measured_calls(p);
    auto r = fn();
    if (!r.ok()) return r;
    const uint64_t calls = t_.measured_calls(p) - c0;
    if (calls != 1)
      return make_error(
          ErrorCode::kInvalidState,
          fmt::format("{}: {} real calls measured for one call", to_string(p), calls));
    s.push_back(static_cast<double>(t_.measured_ns(p) - t0) / 1000.0);
    return r;
  }
  // n timed calls fn(i) (each returning a Status or a Result).
  template <class F>
  Status repeat(P p, size_t n, std::vector<double>& s, F&& fn) {
    for (size_t i = 0; i < n; ++i) MEMSIM_TRY(timed(p, s, [&] { return fn(i); }));
    return {};
  }

  CostTerm fit(const std::vector<Shape>& shapes, unsigned cols) const {
    std::vector<Row4> x;
    std::vector<double> y;
    for (const Shape& s : shapes) {
      x.push_back({1.0, s.handles, static_cast<double>((s.bytes + g_ - 1) / g_),
                   static_cast<double>(s.bytes)});
      y.push_back(s.us);
    }
    Row4 c = nnls(
        x, y,
        {(cols & kCall) != 0, (cols & kHandle) != 0, (cols & kGranule) != 0, (cols & kBytes) != 0});
    for (size_t j = 0; j < 3; ++j) c[j] = c[j] < 1e-6 ? 0.0 : c[j];  // below a picosecond
    return CostTerm{c[0], c[1], c[2], c[3] > 0 ? 1.0 / c[3] : 0.0};
  }
  // The two-size fit: per_call plus a granule (or byte) term from `small` and `big` samples.
  CostTerm fit2(uint64_t small_bytes, const std::vector<double>& small, uint64_t big_bytes,
                const std::vector<double>& big, unsigned cols, double handles = 1) const {
    return fit({{handles, small_bytes, median(small)}, {handles, big_bytes, median(big)}}, cols);
  }

  void row(P p, std::string what, const std::vector<double>& s, double model_us = -1) {
    const Stats st = stats(s);
    c_.rows.push_back({std::move(what), p, s.size(), st.median, st.p10, st.p90, model_us});
  }
  // A row priced by the fitted term of p.
  void priced(P p, std::string what, const std::vector<double>& s, uint64_t handles,
              uint64_t bytes) {
    row(p, std::move(what), s, price_us(p, handles, bytes));
  }

  // kRounds x (n[0] allocations of size[0], then their frees; the same for size[1] in the first
  // big_rounds rounds), every call timed. Fits `pa` and `pf` over the two sizes with `cols` /
  // `free_cols` (kCall alone: the median of all calls, as the sim has no size term there).
  template <class T, class A, class F>
  Status alloc_free(P pa, P pf, std::array<uint64_t, 2> size, std::array<uint32_t, 2> n,
                    int big_rounds, unsigned cols, unsigned free_cols, A&& alloc, F&& release) {
    std::array<std::vector<double>, 2> ta, tf;
    for (int round = 0; round < kRounds; ++round)
      for (size_t k = 0; k < (round < big_rounds ? 2u : 1u); ++k) {
        std::vector<T> v;
        MEMSIM_TRY(repeat(pa, n[k], ta[k], [&](size_t) { return keep(alloc(size[k]), v); }));
        MEMSIM_TRY(repeat(pf, v.size(), tf[k], [&](size_t i) { return release(v[i]); }));
      }
    const auto by_size = [&](const std::array<std::vector<double>, 2>& t, unsigned c) {
      if (c != kCall) return fit2(size[0], t[0], size[1], t[1], c);
      std::vector<double> all = t[0];
      all.insert(all.end(), t[1].begin(), t[1].end());
      return CostTerm{median(all), 0, 0, 0};
    };
    spec().cost(pa) = by_size(ta, cols);
    spec().cost(pf) = by_size(tf, free_cols);
    for (size_t k = 0; k < 2; ++k) {
      priced(pa, yaml_bytes(size[k]), ta[k], 1, size[k]);
      priced(pf, yaml_bytes(size[k]), tf[k], 1, size[k]);
    }
    return {};
  }
  Status mapping();
  Status work();
  Status graphs();
  Status graph_memory();

  const CalibrationTarget& t_;
  Backend& b_;
  std::ostream& log_;
  const uint64_t g_;    // granularity: the small shape
  const uint64_t big_;  // 1 GiB: the large shape
  Calibration c_;
  std::vector<double> x_;  // timings of set-up calls, not used
  const StreamId s0_{0};
};

Status Calibrator::mapping() {
  std::vector<PhysHandle> sm, lg;
  std::vector<DevPtr> vas;
  const uint64_t span_s = kSmallN * g_, span_b = kBigN * big_;
  MEMSIM_TRY(repeat(P::kCreatePhysical, kSmallN, x_,
                    [&](size_t) { return keep(b_.create_physical(g_, kTag), sm); }));
  MEMSIM_TRY(repeat(P::kCreatePhysical, kBigN, x_,
                    [&](size_t) { return keep(b_.create_physical(big_, kTag), lg); }));
  MEMSIM_TRY(repeat(P::kReserveVirtual, 4, x_, [&](size_t i) {
    return keep(b_.reserve_virtual(i < 2 ? span_s : span_b, g_), vas);
  }));
  const DevPtr vs = vas[0], vs2 = vas[1], vb = vas[2], vb2 = vas[3];
  std::vector<double> map_s, map_b, fresh_s, fresh_b, sa_one, sa_range, sa_big, um_one, um_range,
      um_big, al_s, al_s_noacc, al_b, al_sa_range, al_sa_big, al_um_range, nv_s, nv_sa, nv_al,
      nv_al_sa;
  const auto map_all = [&](DevPtr va, bool is_big, std::vector<double>& s) {
    const auto& hs = is_big ? lg : sm;
    const uint64_t sz = is_big ? big_ : g_;
    return repeat(P::kMap, hs.size(), s,
                  [&](size_t i) { return b_.map(va + i * sz, sz, hs[i], 0); });
  };
  // set_access or unmap: one call per handle (`per_handle`) or one call over the whole span.
  const auto each = [&](P p, DevPtr va, bool is_big, bool per_handle, std::vector<double>& s) {
    const uint64_t sz = is_big ? big_ : g_, n = is_big ? kBigN : kSmallN;
    const uint64_t len = per_handle ? sz : n * sz;
    return repeat(p, per_handle ? n : 1, s, [&](size_t i) {
      return p == P::kSetAccess ? b_.set_access(va + i * sz, len) : b_.unmap(va + i * sz, len);
    });
  };
  for (int round = 0; round < kRounds; ++round) {
    // First mappings (nothing else maps the handles): 1 handle per call, one call over 64
    // handles, 1 GiB handles; round 0 maps handles never mapped before.
    MEMSIM_TRY(map_all(vs, false, map_s));
    if (round == 0) fresh_s.assign(map_s.end() - kSmallN, map_s.end());
    MEMSIM_TRY(each(P::kSetAccess, vs, false, true, sa_one));
    MEMSIM_TRY(each(P::kUnmap, vs, false, true, um_one));
    MEMSIM_TRY(map_all(vs, false, map_s));
    MEMSIM_TRY(each(P::kSetAccess, vs, false, false, sa_range));
    MEMSIM_TRY(each(P::kUnmap, vs, false, false, um_range));
    MEMSIM_TRY(map_all(vb, true, map_b));
    if (round == 0) fresh_b.assign(map_b.end() - kBigN, map_b.end());
    MEMSIM_TRY(each(P::kSetAccess, vb, true, true, sa_big));
    MEMSIM_TRY(each(P::kUnmap, vb, true, true, um_big));
    // Aliases: the same handles mapped into a second range while the first mapping exists,
    // before and after access was set on the first.
    MEMSIM_TRY(map_all(vs, false, x_));
    MEMSIM_TRY(map_all(vs2, false, al_s_noacc));
    MEMSIM_TRY(each(P::kUnmap, vs2, false, false, x_));
    MEMSIM_TRY(each(P::kSetAccess, vs, false, false, x_));
    MEMSIM_TRY(map_all(vs2, false, al_s));
    MEMSIM_TRY(each(P::kSetAccess, vs2, false, false, al_sa_range));
    MEMSIM_TRY(each(P::kUnmap, vs2, false, false, al_um_range));
    // Into VA ranges reserved just now: a first mapping, then an alias of it.
    std::vector<DevPtr> nv;
    MEMSIM_TRY(repeat(P::kReserveVirtual, 2, x_,
                      [&](size_t) { return keep(b_.reserve_virtual(span_s, g_), nv); }));
    MEMSIM_TRY(each(P::kUnmap, vs, false, false, x_));
    MEMSIM_TRY(map_all(nv[0], false, nv_s));
    MEMSIM_TRY(each(P::kSetAccess, nv[0], false, false, nv_sa));
    MEMSIM_TRY(map_all(nv[1], false, nv_al));
    MEMSIM_TRY(each(P::kSetAccess, nv[1], false, false, nv_al_sa));
    for (DevPtr va : nv) MEMSIM_TRY(each(P::kUnmap, va, false, false, x_));
    for (DevPtr va : nv) MEMSIM_TRY(b_.free_virtual(va));
    // Aliases of 1 GiB handles.
    MEMSIM_TRY(map_all(vb, true, x_));
    MEMSIM_TRY(each(P::kSetAccess, vb, true, true, x_));
    MEMSIM_TRY(map_all(vb2, true, al_b));
    MEMSIM_TRY(each(P::kSetAccess, vb2, true, true, al_sa_big));
    MEMSIM_TRY(each(P::kUnmap, vb2, true, false, x_));
    MEMSIM_TRY(each(P::kUnmap, vb, true, false, x_));
  }
  for (PhysHandle h : sm) MEMSIM_TRY(b_.release_physical(h));
  for (PhysHandle h : lg) MEMSIM_TRY(b_.release_physical(h));
  for (DevPtr va : vas) MEMSIM_TRY(b_.free_virtual(va));

  spec().cost(P::kMap) = fit2(g_, map_s, big_, map_b, kCall | kGranule);
  for (auto [p, one, all, large] : {std::tuple{P::kSetAccess, &sa_one, &sa_range, &sa_big},
                                    std::tuple{P::kUnmap, &um_one, &um_range, &um_big}})
    spec().cost(p) =
        fit({{1, g_, median(*one)}, {kSmallN, span_s, median(*all)}, {1, big_, median(*large)}},
            kCall | kHandle | kGranule);
  const std::string sg = yaml_bytes(g_), sb = yaml_bytes(big_);
  const std::string range = fmt::format("1 call over {} x {}", kSmallN, sg);
  priced(P::kMap, sg, map_s, 1, g_);
  priced(P::kMap, sb, map_b, 1, big_);
  row(P::kMap, sg + " handle never mapped before", fresh_s);
  row(P::kMap, sb + " handle never mapped before", fresh_b);
  row(P::kMap, sg + " into a new VA range", nv_s);
  row(P::kMap, sg + " ALIAS (first mapping has access)", al_s);
  row(P::kMap, sg + " ALIAS (first mapping, no access)", al_s_noacc);
  row(P::kMap, sg + " ALIAS into a new VA range", nv_al);
  row(P::kMap, sb + " ALIAS (first mapping has access)", al_b);
  for (auto [p, one, all, large, alias] :
       {std::tuple{P::kSetAccess, &sa_one, &sa_range, &sa_big, &al_sa_range},
        std::tuple{P::kUnmap, &um_one, &um_range, &um_big, &al_um_range}}) {
    priced(p, sg + " (1 handle per call)", *one, 1, g_);
    priced(p, range, *all, kSmallN, span_s);
    priced(p, sb + " (1 handle)", *large, 1, big_);
    row(p, range + " ALIAS", *alias);
  }
  row(P::kSetAccess, range + ", new VA range", nv_sa);
  row(P::kSetAccess, range + ", ALIAS, new VA", nv_al_sa);
  row(P::kSetAccess, sb + " ALIAS", al_sa_big);
  const auto ratio = [](const std::vector<double>& a, const std::vector<double>& b) {
    return median(a) / std::max(median(b), 1e-9);
  };
  c_.findings.push_back(fmt::format(
      "alias mapping (a handle already mapped elsewhere, mapped into a second VA range): map "
      "{:.2f} us per {} handle vs {:.2f} us for a first mapping ({:.1f}x); {:.2f} us while the "
      "first mapping has no access yet; into a VA range reserved just before: first {:.2f} us, "
      "alias {:.2f} us; {} handle {:.2f} us vs {:.2f} us ({:.1f}x). set_access over {} aliased "
      "handles {:.1f} us vs {:.1f} us ({:.1f}x), unmap {:.1f} us vs {:.1f} us. The sim prices an "
      "alias like a first mapping.",
      median(al_s), sg, median(map_s), ratio(al_s, map_s), median(al_s_noacc), median(nv_s),
      median(nv_al), sb, median(al_b), median(map_b), ratio(al_b, map_b), kSmallN,
      median(al_sa_range), median(sa_range), ratio(al_sa_range, sa_range), median(al_um_range),
      median(um_range)));
  return {};
}

Status Calibrator::work() {
  MEMSIM_ASSIGN_OR_RETURN(DevPtr a, b_.device_malloc(big_, kTag));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr b, b_.device_malloc(big_, kTag));
  std::vector<double> fs, fb, cs, cb;
  // Warm-up (module loading, first launches), not recorded.
  MEMSIM_TRY(b_.fill(a, big_, 1, s0_));
  MEMSIM_TRY(b_.fill(b, big_, 2, s0_));
  MEMSIM_TRY(b_.copy(b, a, big_, s0_));
  for (int round = 0; round < kRounds; ++round) {
    MEMSIM_TRY(timed(P::kFill, fs, [&] { return b_.fill(a, g_, 3, s0_); }));
    MEMSIM_TRY(timed(P::kFill, fb, [&] { return b_.fill(a, big_, 4, s0_); }));
    MEMSIM_TRY(timed(P::kCopy, cs, [&] { return b_.copy(b, a, g_, s0_); }));
    MEMSIM_TRY(timed(P::kCopy, cb, [&] { return b_.copy(b, a, big_, s0_); }));
  }
  MEMSIM_TRY(b_.device_free(a));
  MEMSIM_TRY(b_.device_free(b));
  // The sim prices a copy as 2 x bytes (read + write) against bytes_per_us.
  spec().cost(P::kFill) = fit2(g_, fs, big_, fb, kCall | kBytes, 0);
  spec().cost(P::kCopy) = fit2(2 * g_, cs, 2 * big_, cb, kCall | kBytes, 0);
  for (P p : {P::kFill, P::kCopy}) {
    const uint64_t k = p == P::kCopy ? 2 : 1;
    priced(p, yaml_bytes(g_) + ", synchronized", p == P::kFill ? fs : cs, 0, k * g_);
    priced(p, yaml_bytes(big_) + ", synchronized", p == P::kFill ? fb : cb, 0, k * big_);
    if (spec().cost(p).bytes_per_us <= 0)
      c_.findings.push_back(
          fmt::format("WARNING: {}: no bandwidth term could be fitted ({} not "
                      "slower than {})",
                      to_string(p), yaml_bytes(big_), yaml_bytes(g_)));
  }
  return {};
}

Status Calibrator::graphs() {
  constexpr uint64_t kChunk = 4 * kKiB;
  MEMSIM_ASSIGN_OR_RETURN(DevPtr buf, b_.device_malloc(g_, kTag));
  std::vector<double> begin, destroy, cap1, cap2, end1, end2, first1, first2, replays, c, e;
  // Captures n fills of kChunk; records begin, the captured fill time per node and end.
  const auto build = [&](uint32_t n, std::vector<double>& cap, std::vector<double>& end,
                         std::vector<double>& beg) -> Result<GraphHandle> {
    MEMSIM_TRY(timed(P::kBeginCapture, beg, [&] { return b_.begin_capture(s0_); }));
    std::vector<double> fills;
    MEMSIM_TRY(repeat(P::kFill, n, fills, [&](size_t i) {
      return b_.fill(buf + (i % (g_ / kChunk)) * kChunk, kChunk, static_cast<uint32_t>(i), s0_);
    }));
    double sum = 0;
    for (double v : fills) sum += v;
    cap.push_back(sum / n);
    return timed(P::kEndCapture, end, [&] { return b_.end_capture(s0_); });
  };
  // A graph's first launch (it uploads the graph), then 9 replays.
  const auto launches = [&](GraphHandle g, std::vector<double>& first,
                            std::vector<double>& s) -> Status {
    MEMSIM_TRY(timed(P::kLaunch, first, [&] { return b_.launch(g, s0_); }));
    return repeat(P::kLaunch, 9, s, [&](size_t) { return b_.launch(g, s0_); });
  };
  {  // warm-up, not recorded
    MEMSIM_ASSIGN_OR_RETURN(GraphHandle g, build(kNodes1, c, e, x_));
    MEMSIM_TRY(launches(g, x_, x_));
    MEMSIM_TRY(b_.destroy_graph(g));
  }
  for (int round = 0; round < kRounds; ++round) {
    MEMSIM_ASSIGN_OR_RETURN(GraphHandle g1, build(kNodes1, cap1, end1, begin));
    MEMSIM_ASSIGN_OR_RETURN(GraphHandle g2, build(kNodes2, cap2, end2, begin));
    MEMSIM_TRY(launches(g1, first1, replays));
    MEMSIM_TRY(launches(g2, first2, replays));
    MEMSIM_TRY(timed(P::kDestroyGraph, destroy, [&] { return b_.destroy_graph(g1); }));
    MEMSIM_TRY(timed(P::kDestroyGraph, destroy, [&] { return b_.destroy_graph(g2); }));
  }
  MEMSIM_TRY(b_.device_free(buf));
  // Two-point fits over the node count (the "handles" column stands for nodes here).
  const CostTerm end =
      fit({{kNodes1, 0, median(end1)}, {kNodes2, 0, median(end2)}}, kCall | kHandle);
  const CostTerm first =
      fit({{kNodes1, 0, median(first1)}, {kNodes2, 0, median(first2)}}, kCall | kHandle);
  spec().cost(P::kBeginCapture) = CostTerm{median(begin), 0, 0, 0};
  spec().cost(P::kEndCapture) = CostTerm{end.per_call_us, 0, 0, 0};
  spec().cost(P::kLaunch) = CostTerm{median(replays), 0, 0, 0};
  spec().cost(P::kDestroyGraph) = CostTerm{median(destroy), 0, 0, 0};
  spec().capture_per_node_us = median(cap2);
  spec().instantiate_per_node_us = end.per_handle_us;
  spec().upload_per_node_us = first.per_handle_us;
  priced(P::kBeginCapture, "per call", begin, 0, 0);
  for (auto [n, cap, en, l] :
       {std::tuple{kNodes1, &cap1, &end1, &first1}, std::tuple{kNodes2, &cap2, &end2, &first2}}) {
    row(P::kFill, fmt::format("captured, per node ({} nodes)", n), *cap,
        spec().capture_per_node_us);
    row(P::kEndCapture, fmt::format("end + instantiate, {} nodes", n), *en,
        end.per_call_us + end.per_handle_us * n);
    row(P::kLaunch, fmt::format("first (uploads), synchronized, {} nodes", n), *l,
        median(replays) + spec().upload_per_node_us * n);
  }
  row(P::kLaunch, fmt::format("later, synchronized, {} and {} nodes", kNodes1, kNodes2), replays,
      median(replays));
  priced(P::kDestroyGraph, fmt::format("{} and {} nodes", kNodes1, kNodes2), destroy, 0, 0);
  const double fill_call = spec().cost(P::kFill).per_call_us;
  c_.findings.push_back(fmt::format(
      "graphs: the sim also charges fill.per_call_us ({:.2f} us, from synchronized eager fills) "
      "for every captured fill, on top of capture_per_node_us ({:.2f} us, measured in capture): "
      "a captured node costs {:.2f} us in the sim vs {:.2f} us measured "
      "(backends/sim/sim_backend.cpp fill()).",
      fill_call, spec().capture_per_node_us, fill_call + spec().capture_per_node_us,
      spec().capture_per_node_us));
  return {};
}

Status Calibrator::graph_memory() {
  MEMSIM_ASSIGN_OR_RETURN(StreamId s1, b_.create_stream());
  MEMSIM_TRY(b_.begin_capture(s0_));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr p, b_.malloc_async(kGraphMem, s0_));
  MEMSIM_TRY(b_.fill(p, kMiB, 7, s0_));
  MEMSIM_TRY(b_.free_async(p, s0_));
  MEMSIM_ASSIGN_OR_RETURN(GraphHandle g, b_.end_capture(s0_));
  // A graph whose output outlives it: launched after g, the output takes g's pages, and g's
  // next launch is remapped.
  MEMSIM_TRY(b_.begin_capture(s0_));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr out, b_.malloc_async(kGraphMem, s0_));
  MEMSIM_TRY(b_.fill(out, kMiB, 7, s0_));
  MEMSIM_ASSIGN_OR_RETURN(GraphHandle holder, b_.end_capture(s0_));
  std::vector<double> trim, first, normal, moved, remapped, uploads, waits, syncs;
  std::vector<std::string> reserved;
  const auto note_reserved = [&](const char* when) {
    if (!t_.graph_mem_reserved) return;
    auto r = t_.graph_mem_reserved();
    reserved.push_back(fmt::format("{} {}", r.ok() ? yaml_bytes(*r) : r.error().message, when));
  };
  for (int round = 0; round < kRounds; ++round) {
    MEMSIM_TRY(timed(P::kGraphMemTrim, trim, [&] { return b_.graph_mem_trim(); }));
    MEMSIM_TRY(timed(P::kLaunch, first, [&] { return b_.launch(g, s0_); }));
    if (round == 0) note_reserved("after the first launch");
    MEMSIM_TRY(repeat(P::kLaunch, 3, normal, [&](size_t) { return b_.launch(g, s0_); }));
    MEMSIM_TRY(repeat(P::kUpload, 3, uploads, [&](size_t) { return b_.upload(g, s0_); }));
    MEMSIM_TRY(repeat(P::kStreamWait, 3, waits, [&](size_t) { return b_.stream_wait(s1, s0_); }));
    MEMSIM_TRY(repeat(P::kSynchronize, 3, syncs, [&](size_t) { return b_.synchronize(); }));
    MEMSIM_TRY(repeat(P::kLaunch, 4, moved, [&](size_t i) -> Status {
      MEMSIM_TRY(b_.synchronize());  // the other stream is idle: no remap
      return b_.launch(g, i % 2 == 0 ? s1 : s0_);
    }));
    if (round == 0) note_reserved("after launches alternating between two idle streams");
    MEMSIM_TRY(b_.launch(holder, s0_));
    MEMSIM_TRY(timed(P::kLaunch, remapped, [&] { return b_.launch(g, s0_); }));
    if (round == 0) note_reserved("after a launch while another graph's output holds its pages");
    MEMSIM_TRY(b_.free_async(out, s0_));
    MEMSIM_TRY(b_.synchronize());
  }
  MEMSIM_TRY(b_.destroy_graph(g));
  MEMSIM_TRY(b_.destroy_graph(holder));
  note_reserved("after destroying the graphs");
  MEMSIM_TRY(timed(P::kGraphMemTrim, trim, [&] { return b_.graph_mem_trim(); }));
  note_reserved("after graph_mem_trim");
  const double granules = static_cast<double>(kGraphMem / g_);
  spec().graph_mem_map_per_granule_us = std::max(0.0, median(first) - median(normal)) / granules;
  spec().graph_mem_remap_per_granule_us =
      std::max(0.0, median(remapped) - median(normal)) / granules;
  spec().cost(P::kGraphMemTrim) = CostTerm{median(trim), 0, 0, 0};
  spec().cost(P::kUpload) = CostTerm{median(uploads), 0, 0, 0};
  spec().cost(P::kStreamWait) = CostTerm{median(waits), 0, 0, 0};
  spec().cost(P::kSynchronize) = CostTerm{median(syncs), 0, 0, 0};
  priced(P::kUpload, "of a mapped, uploaded graph", uploads, 0, 0);
  priced(P::kStreamWait, "event record + wait, idle streams", waits, 0, 0);
  priced(P::kSynchronize, "idle device", syncs, 0, 0);
  const double plain = price_us(P::kLaunch, 0, 0);  // uploaded at its first launch, before
  const std::string what = yaml_bytes(kGraphMem) + " mem node: ";
  row(P::kLaunch, what + "first launch after trim", first,
      plain + spec().graph_mem_map_per_granule_us * granules);
  row(P::kLaunch, what + "later launches", normal, plain);
  row(P::kLaunch, what + "launch into another idle stream (no remap)", moved, plain);
  row(P::kLaunch, what + "launch while another graph's output holds its pages (remap)", remapped,
      plain + spec().graph_mem_remap_per_granule_us * granules);
  priced(P::kGraphMemTrim, "after launches (frees the pool)", trim, 0, 0);
  if (!reserved.empty())
    c_.findings.push_back(
        fmt::format("graph memory pool (cudaGraphMemAttrReservedMemCurrent) "
                    "with {} graphs: {}",
                    yaml_bytes(kGraphMem), fmt::join(reserved, "; ")));
  return {};
}

}  // namespace

Result<Calibration> calibrate(const CalibrationTarget& target, const GpuSpec& base,
                              std::ostream& log) {
  if (target.backend == nullptr || !target.measured_ns || !target.measured_calls)
    return make_error(ErrorCode::kInvalidArgument, "calibrate: incomplete target");
  const uint64_t g = target.backend->granularity();
  if (g == 0 || kGiB % g != 0)
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("calibrate: granularity {} does not divide 1 GiB", g));
  return Calibrator(target, base, log).run();
}

int run_calibrate(const CalibrateOptions& o, std::ostream& out, std::ostream& err) {
  if (o.backend != "cuda") {
    err << "memsim calibrate: --backend " << o.backend
        << ": calibration measures hardware; use --backend cuda\n";
    return 2;
  }
  const std::optional<GpuSpec> loaded = load_base_gpu(o.gpu_path, err);
  if (!loaded) return 2;
  const GpuSpec& base = *loaded;
  const std::string out_path =
      o.out_path.empty() ? fmt::format("configs/gpus/{}.calibrated.yaml", base.name) : o.out_path;
  SimClock clock;
  auto created = CudaBackend::create(base, clock, nullptr, o.device, /*sync_for_timing=*/true);
  if (!created.ok()) {
    const bool no_gpu = created.error().code == ErrorCode::kNotSupported;
    err << "memsim calibrate: --backend cuda: " << (no_gpu ? "no usable GPU: " : "")
        << created.error().message << "\n";
    return no_gpu ? 2 : 1;
  }
  CudaBackend& cuda = **created;
  CalibrationTarget target;
  target.backend = &cuda;
  target.measured_ns = [&](P p) { return cuda.measured_time_in(p); };
  target.measured_calls = [&](P p) { return cuda.measured_calls_of(p); };
  target.context = cuda.context();
  target.graph_mem_reserved = [&]() -> Result<uint64_t> {
    MEMSIM_ASSIGN_OR_RETURN(CudaBackend::DeviceObservation ob, cuda.observe());
    return ob.graph_reserved_current;
  };
  out << fmt::format(
      "memsim calibrate: CUDA device {}, {} of memory, VMM granularity {}; base "
      "spec {}\n",
      o.device, yaml_bytes(cuda.capacity()), yaml_bytes(cuda.granularity()), o.gpu_path);
  auto cal = calibrate(target, base, out);
  const Status released = cuda.release_everything();
  if (!cal.ok()) {
    err << "memsim calibrate: " << cal.error().message << "\n";
    return 1;
  }
  out << "\n" << format_calibration_table(*cal);
  if (!released.ok())
    err << "memsim calibrate: release_everything: " << released.error().message << "\n";

  char date[32] = "";
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  const std::vector<std::string> header = {
      fmt::format("{} calibrated by `memsim calibrate --backend cuda --gpu {}` on CUDA device {}, "
                  "{}. Every term below was measured; name and va_space come from {}.",
                  base.name, o.gpu_path, o.device, date, o.gpu_path)};
  if (!write_gpu_yaml(*cal, header, out_path, out, err)) return 1;
  if (!cal->failures.empty()) {
    err << fmt::format("memsim calibrate: {} phase(s) failed; their terms keep the values of {}\n",
                       cal->failures.size(), o.gpu_path);
    return 1;
  }
  return released.ok() ? 0 : 1;
}

}  // namespace memsim
