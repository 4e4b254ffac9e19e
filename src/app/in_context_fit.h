// Fits the sim's primitive cost terms to per-call times measured in context: every real driver
// call of a `--backend cuda` run (calls.csv) with what the shadow priced it on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/sim/cost_model.h"

namespace memsim {

// One real call: the run (strategy) it came from, its primitive, the shadow's price inputs and
// its measured host wall time.
struct CallSample {
  std::string run;
  Primitive p = Primitive::kCount;
  uint64_t handles = 0, bytes = 0, nodes = 0;
  uint64_t mappings = 0;  // VA mappings live at the call
  // The first call of its primitive in its run since the run's last launch (derived from the
  // order of calls.csv, which lists every priced call of a run in order).
  bool first_after_launch = false;
  double measured_us = 0;
};

// Reads calls.csv (strategy,primitive,handles,bytes,nodes,mappings,measured_us). Errors name the
// file and line.
Result<std::vector<CallSample>> read_call_samples(const std::string& path);

// The modelled time of one sample under `spec`, in microseconds: the primitive's cost term, plus
// per node (end_capture: capture + instantiate); a launch's sample carries the nodes it uploads
// (a graph's first launch) and the graph-memory bytes it maps.
double price_sample_us(const GpuSpec& spec, const CallSample& s);

// Per (run, primitive): calls and mean time per call, measured and under the fitted spec.
struct InContextClass {
  std::string run;
  Primitive p = Primitive::kCount;
  uint64_t calls = 0;
  double measured_us = 0, base_us = 0, fitted_us = 0;
};

struct InContextFit {
  GpuSpec spec;                         // `base` with every fitted term replaced
  std::vector<InContextClass> classes;  // in order of first appearance
  std::vector<std::string> notes;       // per fitted primitive: samples, terms, trimmed
};

// For each primitive with at least `min_samples` samples, a non-negative least-squares fit of
// the terms `base` prices it with (per call, per handle, per granule, per byte; per node for
// end_capture; per call, per node uploaded and per granule mapped for launch), per log2(1 + live
// VA mappings / knee) and per first call since a launch for every primitive (zero where the calls
// show no such cost), to the calls as measured: with a per-call term the fitted total equals the
// measured total, slow tails included (launches that wait for a full launch queue, first calls
// that load driver state), which is what a run's simulated time adds up. The knee
// (va_mappings_knee) is the one of 1, 4, ..., 16384 whose fit leaves the least variance
// unexplained. Other primitives keep their base terms, and so do fill and copy (measured in
// context they return once enqueued; the model prices them synchronized, bandwidth included).
InContextFit fit_in_context(const std::vector<CallSample>& samples, const GpuSpec& base,
                            uint64_t min_samples = 10);

// Per (run, primitive) of `samples`, in order of first appearance: calls and mean time per call,
// measured, under `base` and under `fitted`.
std::vector<InContextClass> compare_classes(const std::vector<CallSample>& samples,
                                            const GpuSpec& base, const GpuSpec& fitted);

// The primitives the per-call table of `--backend cuda` lists (each with more than 10 calls in a
// run counts toward its "within 25%"); `memsim calibrate --check` counts the same classes.
inline constexpr Primitive kPerCallTable[] = {
    Primitive::kCreatePhysical,  Primitive::kMap,
    Primitive::kSetAccess,       Primitive::kUnmap,
    Primitive::kReleasePhysical, Primitive::kReserveVirtual,
    Primitive::kDeviceMalloc,    Primitive::kBeginCapture,
    Primitive::kEndCapture,      Primitive::kLaunch};
bool in_per_call_table(Primitive p);

// Several runs' per-call tables against one model (`calibrate --check` of several calls.csv).
// A class is a (run label, primitive) of the table with more than 10 calls; runs are compared
// class by class where both have it.
struct PerCallRuns {
  size_t classes = 0;          // classes counted in the first run
  std::vector<size_t> within;  // per run: classes within 25% of the model
  // Per run: classes within 25% of their own median over the runs, which is what a model fitted
  // to these very runs (one time per class) would count: the spread of the runs, not the model.
  std::vector<size_t> within_median;
  // Classes whose slowest run took more than 1.25 / 0.75 = 5/3 of their fastest (mean per call):
  // no model, however fitted, puts such a class within 25% of every run. "label primitive spread".
  std::vector<std::string> beyond_reach;
  size_t pooled_within = 0;             // classes within 25% with their calls pooled over all runs
  std::vector<std::string> pooled_out;  // "label primitive ratio" of the pooled classes outside
};
PerCallRuns compare_runs(const std::vector<std::vector<InContextClass>>& runs);

// A per-call table's summary of run-wide drift, for `ratios` (measured / modelled, one per class
// counted): their geometric mean, and how many are within 25% once it is divided out. A host
// busy with other work slows every call of a run alike (H200 runs back to back on one machine:
// geometric means 0.98 to 1.28), which no per-call model can price; the second count is the
// model's shape without it. One line, newline-terminated; empty when `ratios` is.
std::string common_factor_line(const std::vector<double>& ratios);

}  // namespace memsim
