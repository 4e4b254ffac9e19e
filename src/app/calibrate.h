// `memsim calibrate`: measures the Backend primitives on hardware, fits the sim's cost terms and
// writes a GPU YAML (the schema of configs/gpus/*.yaml) that load_gpu_spec reads back.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/sim/cost_model.h"

namespace memsim {

// One measured shape: per-call times of `p` (microseconds, one sample per call) and what the
// fitted model prices one such call at (model_us < 0: informational, not a model term).
struct CalibrationRow {
  std::string what;  // the shape, e.g. "2MiB" or "1 call over 64 x 2MiB"
  Primitive p = Primitive::kCount;
  uint64_t samples = 0;
  double median_us = 0, p10_us = 0, p90_us = 0;
  double model_us = -1;
};

struct Calibration {
  GpuSpec base;  // the spec the calibration started from
  GpuSpec spec;  // base spec with every measured term replaced
  std::vector<CalibrationRow> rows;
  std::vector<std::string> findings;  // printed and written as YAML comments
  std::vector<std::string> failures;  // phases that failed (their terms keep the base values)
  // Per primitive, the comment of its cost line where no row here measured it (a re-fit carries
  // the base file's: the term is the base's too).
  std::map<Primitive, std::string> cost_notes;
};

// What calibrate() measures through: a backend plus its measured time and call count per
// primitive class (CudaBackend: measured_time_in / measured_calls_of; a SimBackend: time_in /
// calls_of, which makes the fit checkable without a GPU: it must return the sim's own terms).
struct CalibrationTarget {
  Backend* backend = nullptr;
  std::function<SimTime(Primitive)> measured_ns;
  std::function<uint64_t(Primitive)> measured_calls;
  std::function<Result<uint64_t>()> graph_mem_reserved;  // device's graph pool; may be empty
  uint64_t context = 0;  // device bytes not free before the backend's first allocation
};

// Runs every measurement phase (each releases what it creates) and fits the cost terms into a
// copy of `base` (capacity, granularity and context become the backend's). Progress goes to `log`.
Result<Calibration> calibrate(const CalibrationTarget& target, const GpuSpec& base,
                              std::ostream& log);

// The table of measurements (median, p10-p90, fitted model, deviation) and the findings.
std::string format_calibration_table(const Calibration& c);
// The GPU YAML of c.spec, with `header`, c's findings and failures, and each term's measured
// medians as comments.
std::string format_gpu_yaml(const Calibration& c, const std::vector<std::string>& header);

struct CalibrateOptions {
  std::string backend = "cuda";
  std::string gpu_path = "configs/gpus/h200.yaml";
  std::string out_path;  // empty: configs/gpus/<name>.calibrated.yaml
  int device = 0;
  // Fit the cost terms to these per-call samples (calls.csv of `--backend cuda` runs) instead of
  // measuring; needs no GPU.
  std::vector<std::string> in_context;
  // Compare the calls of these calls.csv files with the base spec's prices (a held-out check);
  // fits nothing, writes nothing.
  std::vector<std::string> check;
};

// The subcommand: CudaBackend (sync_for_timing) on `device`, calibrate(), print the table, write
// the YAML, parse it back with load_gpu_spec and compare. Returns 0 on success, 1 when a
// measurement or the read-back failed, 2 for bad options or when no GPU can be used.
int run_calibrate(const CalibrateOptions& options, std::ostream& out, std::ostream& err);

// Writes format_gpu_yaml(c, header) to out_path and reads it back with load_gpu_spec: it must
// hold c.spec's values. Prints "wrote ..." to `out`, or the problem to `err` (false).
bool write_gpu_yaml(const Calibration& c, const std::vector<std::string>& header,
                    const std::string& out_path, std::ostream& out, std::ostream& err);

// A byte count as the GPU YAML writes it: "2MiB" where a unit divides it, else the number.
std::string yaml_bytes(uint64_t b);

// The base GPU YAML of a calibration; a config error goes to `err` (nullopt).
std::optional<GpuSpec> load_base_gpu(const std::string& path, std::ostream& err);

// `memsim calibrate --in-context CALLS.csv...`: fit_in_context over the base spec (--gpu), print
// measured against base and fitted time per call for each run and primitive, write the YAML.
// Returns 0, 1 when the YAML cannot be written, 2 for bad input.
int run_calibrate_in_context(const CalibrateOptions& options, std::ostream& out, std::ostream& err);

// `memsim calibrate --check CALLS.csv...`: per file, measured against the base spec's time per
// call for each run and primitive, and how many classes of the --backend cuda table (more than
// 10 calls) lie within 25%; with several files, the files as runs of one workload
// (compare_runs: their spread, classes beyond any model's reach, calls pooled). Returns 0, or 2
// for bad input.
int run_calibrate_check(const CalibrateOptions& options, std::ostream& out, std::ostream& err);

}  // namespace memsim
