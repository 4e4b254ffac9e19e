// Pipeline-parallel step time: stage shares of the roofline, sends priced from the GPU file.
#include "workload/pipeline_time.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "workload/pipeline_parallel.h"

namespace memsim {

Result<PipelineTime> PipelineTime::make(const ModelShape& rank, const GpuSpec& gpu, uint32_t pp,
                                        uint32_t tp,
                                        std::shared_ptr<const CollectiveTime> tp_group) {
  auto split = split_pipeline(rank.layers, pp);
  if (!split.ok()) return split.error();
  auto link = CollectiveTime::make(gpu, 2);
  if (!link.ok()) return link.error();
  PipelineTime t;
  for (const PipelineStage& s : *split) t.stages_.emplace_back(rank, gpu, s, tp_group);
  t.link_ = std::make_shared<const CollectiveTime>(std::move(link).value());
  if (tp > 1) t.tp_group_ = std::move(tp_group);
  t.slice_row_bytes_ = rank.hidden * dtype_bytes(rank.dtype) / std::max<uint32_t>(1, tp);
  std::string layers;
  for (const PipelineStage& s : *split)
    layers += fmt::format("{}{}", layers.empty() ? "" : "+", s.layers);
  t.source_ = fmt::format("{} stages of {} layers, sends {} ({})", pp, layers,
                          t.link_->send_recv_measured() ? "from the measured NCCL send/recv"
                                                        : "priced as 2-rank all-gathers",
                          t.link_->source());
  return t;
}

SimTime PipelineTime::send_time(uint64_t new_tokens) const {
  const uint64_t part = new_tokens * slice_row_bytes_;
  SimTime t = 2 * link_->send_recv(part);  // hidden_states and residual
  if (tp_group_) t += 2 * tp_group_->all_gather(part);
  return t;
}

void PipelineTime::stage_times(const StepShape& s, SimTime gpu, std::vector<SimTime>* out) const {
  out->resize(stages_.size());
  double total = 0;
  for (size_t j = 0; j < stages_.size(); ++j) {
    const StepBreakdown b = stages_[j].breakdown(s);
    const double own = double(std::max(b.compute_ns, b.memory_ns) + b.collective_ns);
    (*out)[j] = static_cast<SimTime>(own);
    total += own;
  }
  const SimTime send = send_time(s.new_tokens);
  for (size_t j = 0; j < stages_.size(); ++j) {
    const double share = total > 0 ? double((*out)[j]) / total : 1.0 / double(stages_.size());
    (*out)[j] = static_cast<SimTime>(std::llround(double(gpu) * share)) +
                (j + 1 < stages_.size() ? send : 0);
  }
}

}  // namespace memsim
