// Pipeline-parallel split of a model (vLLM's get_pp_indices; see pipeline_parallel.h).
#include "workload/pipeline_parallel.h"

#include <fmt/format.h>

namespace memsim {

Result<std::vector<PipelineStage>> split_pipeline(uint32_t layers, uint32_t pp) {
  if (pp == 0)
    return make_error(ErrorCode::kInvalidArgument, "pipeline_parallel_size must be >= 1");
  if (pp > layers)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("pipeline_parallel_size {} exceeds the model's {} layers (a "
                                  "stage would hold none)",
                                  pp, layers));
  std::vector<uint32_t> counts(pp, layers / pp);
  const uint32_t remaining = layers % pp;
  // vLLM: for i in range(2, remaining_layers + 2): partitions[-i] += 1
  for (uint32_t i = 2; i < remaining + 2; ++i) ++counts[pp - i];
  std::vector<PipelineStage> stages(pp);
  uint32_t start = 0;
  for (uint32_t s = 0; s < pp; ++s) {
    stages[s] = PipelineStage{s, start, counts[s], s == 0, s + 1 == pp};
    start += counts[s];
  }
  return stages;
}

uint64_t stage_weight_bytes(const ModelShape& rank, const PipelineStage& stage) {
  uint64_t bytes = uint64_t{stage.layers} * rank.layer_weight_bytes();
  if (stage.has_embedding(rank)) bytes += rank.embedding_weight_bytes();
  if (stage.last) {
    bytes += rank.hidden * dtype_bytes(rank.dtype);                    // final norm
    if (!rank.tie_embeddings) bytes += rank.embedding_weight_bytes();  // lm_head
  }
  return bytes;
}

ModelShape stage_model(const ModelShape& rank, const PipelineStage& stage) {
  ModelShape m = rank;
  m.layers = stage.layers;
  m.first_layer = rank.first_layer + stage.first_layer;  // where a sliding-window pattern starts
  return m;
}

}  // namespace memsim
