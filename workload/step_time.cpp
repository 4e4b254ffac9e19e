// Roofline step-time model: parameter and byte counts from the model shape, rates from the GPU.
#include "workload/step_time.h"

#include "workload/collectives.h"
#include "workload/pipeline_parallel.h"
#include "workload/step_profile.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace memsim {

const char* to_string(StepBound b) {
  return b == StepBound::kCompute ? "compute" : "memory";
}

namespace {

constexpr double kNsPerS = 1e9;

SimTime seconds_to_ns(double s) {
  return static_cast<SimTime>(std::llround(s * kNsPerS));
}

void require_positive(double v, const char* what) {
  if (!(v > 0))
    throw std::invalid_argument(std::string("step time model: gpu compute.") + what +
                                " must be > 0");
}

}  // namespace

StepTimeModel::StepTimeModel(const ModelShape& model, const GpuSpec& gpu,
                             std::shared_ptr<const ProfiledStepTime> profile)
    : profile_(std::move(profile)) {
  const ComputeSpec& c = gpu.compute;
  require_positive(c.peak_flops, "peak_flops");
  require_positive(c.hbm_bytes_per_s, "hbm_bytes_per_s");
  require_positive(c.pcie_bytes_per_s, "pcie_bytes_per_s");
  require_positive(c.flops_efficiency, "flops_efficiency");
  require_positive(c.bandwidth_efficiency, "bandwidth_efficiency");
  if (c.step_overhead_us < 0)
    throw std::invalid_argument("step time model: gpu compute.step_overhead_us must be >= 0");

  // The GEMM weights of one layer (see ModelShape::weight_bytes for the full parameter list).
  const uint64_t q_width = uint64_t{model.heads} * model.head_dim;
  const uint64_t kv_width = uint64_t{model.kv_heads} * model.head_dim;
  const uint64_t per_layer = model.hidden * q_width                    // q_proj
                             + 2 * model.hidden * kv_width             // k_proj, v_proj
                             + q_width * model.hidden                  // o_proj
                             + 3 * model.hidden * model.intermediate;  // gate, up, down
  body_params_ = uint64_t{model.layers} * per_layer;
  lm_head_params_ = model.vocab * model.hidden;

  const uint64_t dt = dtype_bytes(model.dtype);
  const uint64_t embed_table = model.vocab * model.hidden * dt;
  static_weight_bytes_ = model.weight_bytes() - (model.tie_embeddings ? 0 : embed_table);
  embed_row_bytes_ = model.tie_embeddings ? 0 : model.hidden * dt;
  kv_bytes_per_token_ = model.kv_bytes_per_token();
  attn_flops_per_pair_ = 4.0 * model.layers * static_cast<double>(q_width);

  flops_per_s_ = c.peak_flops * c.flops_efficiency;
  bytes_per_s_ = c.hbm_bytes_per_s * c.bandwidth_efficiency;
  pcie_bytes_per_s_ = c.pcie_bytes_per_s;
  overhead_ns_ = static_cast<SimTime>(std::llround(c.step_overhead_us * 1000.0));
}

StepTimeModel::StepTimeModel(const ModelShape& model, const GpuSpec& gpu,
                             std::shared_ptr<const CollectiveTime> collectives)
    : StepTimeModel(model, gpu, std::shared_ptr<const ProfiledStepTime>()) {
  collectives_ = std::move(collectives);
  const uint64_t dt = dtype_bytes(model.dtype);
  hidden_row_bytes_ = model.hidden * dt;
  logits_row_bytes_ = model.vocab * dt;
  all_reduces_ = 2 * model.layers + 1;
}

StepTimeModel::StepTimeModel(const ModelShape& rank, const GpuSpec& gpu, const PipelineStage& stage,
                             std::shared_ptr<const CollectiveTime> collectives)
    : StepTimeModel(stage_model(rank, stage), gpu, std::shared_ptr<const ProfiledStepTime>()) {
  const uint64_t dt = dtype_bytes(rank.dtype);
  const uint64_t table = rank.embedding_weight_bytes();
  lm_head_params_ = stage.last ? rank.vocab * rank.hidden : 0;
  last_stage_ = stage.last;
  // The first stage looks its tokens' rows up, unless the table it holds is also the last
  // stage's LM head (tied, one stage), which reads it whole.
  const bool rows_only = stage.first && !(stage.last && rank.tie_embeddings);
  static_weight_bytes_ = stage_weight_bytes(rank, stage) - (rows_only ? table : 0);
  embed_row_bytes_ = rows_only ? rank.hidden * dt : 0;
  if (collectives) {
    collectives_ = std::move(collectives);
    hidden_row_bytes_ = rank.hidden * dt;
    logits_row_bytes_ = rank.vocab * dt;
    all_reduces_ = 2 * stage.layers + (stage.first ? 1 : 0);
  }
}

SimTime StepTimeModel::step_time(const StepShape& s) const {
  return profile_ ? profile_->step_time(s) : breakdown(s).total_ns;
}

std::string StepTimeModel::source() const {
  if (!profile_)
    return collectives_ && collectives_->ranks() > 1
               ? "roofline + collectives (" + collectives_->source() + ")"
               : "roofline";
  return "profile " + profile_->describe();
}

StepBreakdown StepTimeModel::breakdown(const StepShape& s) const {
  StepBreakdown b;
  if (s.new_tokens == 0) return b;
  const auto tokens = static_cast<double>(s.new_tokens);
  b.flops = 2.0 * static_cast<double>(body_params_) * tokens +
            2.0 * static_cast<double>(lm_head_params_) * s.num_seqs +
            attn_flops_per_pair_ * s.attn_pairs;
  b.bytes = static_weight_bytes_ + s.new_tokens * embed_row_bytes_ +
            (s.kv_read_tokens + s.new_tokens) * kv_bytes_per_token_;
  b.compute_ns = seconds_to_ns(b.flops / flops_per_s_);
  b.memory_ns = seconds_to_ns(static_cast<double>(b.bytes) / bytes_per_s_);
  b.overhead_ns = overhead_ns_;
  b.bound = b.compute_ns > b.memory_ns ? StepBound::kCompute : StepBound::kMemory;
  if (collectives_) {
    b.collective_ns = all_reduces_ * collectives_->all_reduce(s.new_tokens * hidden_row_bytes_);
    if (last_stage_)
      b.collective_ns += collectives_->all_gather(uint64_t{s.num_seqs} * logits_row_bytes_);
  }
  b.total_ns = overhead_ns_ + std::max(b.compute_ns, b.memory_ns) + b.collective_ns;
  return b;
}

SimTime StepTimeModel::attention_time(const StepShape& s) const {
  if (s.new_tokens == 0) return 0;
  const double flops = attn_flops_per_pair_ * s.attn_pairs;
  const double bytes = static_cast<double>((s.kv_read_tokens + s.new_tokens) * kv_bytes_per_token_);
  return std::max(seconds_to_ns(flops / flops_per_s_), seconds_to_ns(bytes / bytes_per_s_));
}

SimTime StepTimeModel::pcie_transfer(uint64_t bytes) const {
  return seconds_to_ns(static_cast<double>(bytes) / pcie_bytes_per_s_);
}

}  // namespace memsim
