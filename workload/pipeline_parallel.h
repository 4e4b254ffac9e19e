// Pipeline-parallel split of a model, as vLLM splits it: which layers each stage holds, and which
// stage holds the embedding, the final norm and the LM head.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/result.h"
#include "workload/model_shape.h"

namespace memsim {

// One pipeline stage (vLLM's pp_rank): layers [first_layer, first_layer + layers).
struct PipelineStage {
  uint32_t index = 0;
  uint32_t first_layer = 0;
  uint32_t layers = 0;
  bool first = true;  // holds the embedding (is_first_rank)
  bool last = true;   // holds the final norm, the LM head, the logits and the sampler
  // The embedding is on the first stage, and also on the last one when the LM head is tied to it
  // (vLLM's LlamaModel / Qwen2Model build embed_tokens when is_first_rank or (tie_word_embeddings
  // and is_last_rank); PPMissingLayer elsewhere).
  bool has_embedding(const ModelShape& m) const { return first || (m.tie_embeddings && last); }
  // Same memory, programs and KV geometry (stages in the middle of a long pipeline often are).
  bool same_shape(const PipelineStage& o) const {
    return layers == o.layers && first == o.first && last == o.last;
  }
};

// vLLM's get_pp_indices (vllm/distributed/utils.py) without VLLM_PP_LAYER_PARTITION: layers / pp
// each, and the remainder r added one layer each to the r stages before the last
// (partitions[-i] += 1 for i in 2..r+1); the last stage, which holds the norm and the LM head,
// gets none. 80 layers over 3 stages: 27, 27, 26. Errors (kInvalidArgument): pp of 0, or more
// stages than layers (a stage without a layer).
Result<std::vector<PipelineStage>> split_pipeline(uint32_t layers, uint32_t pp);

// The weights a stage holds of `rank` (the whole model, or one tensor-parallel rank's shard):
// its layers, the embedding where has_embedding, and on the last stage the final norm and the
// LM head unless tied. With one stage: ModelShape::weight_bytes().
uint64_t stage_weight_bytes(const ModelShape& rank, const PipelineStage& stage);

// `rank` cut to the stage's layers (weight_bytes() of it is not the stage's: use
// stage_weight_bytes; kv_bytes_per_token() of it is).
ModelShape stage_model(const ModelShape& rank, const PipelineStage& stage);

}  // namespace memsim
