// Tensor-parallel sharding of a model, as vLLM shards it: one rank's shape and what it replicates.
#pragma once

#include <cstdint>

#include "backends/result.h"
#include "workload/model_shape.h"

namespace memsim {

// vLLM's DEFAULT_VOCAB_PADDING_SIZE (vocab_parallel_embedding.py): the embedding and LM head
// have pad_vocab_size(vocab, 64) rows, split evenly over the TP ranks.
inline constexpr uint64_t kVocabPadding = 64;

// One rank of a model under tensor parallelism of `tp` ranks. Every rank holds the same shape
// (the vocabulary is padded so that it splits evenly), so one simulated rank stands for all.
struct TensorParallelShard {
  uint32_t tp = 1;
  // The rank's own model: heads, kv_heads, intermediate and vocab are per rank; hidden, layers
  // and head_dim are whole. weight_bytes() and kv_bytes_per_token() of it are one rank's.
  ModelShape rank;
  uint64_t vocab_padded = 0;      // rows of the embedding (and LM head) over all ranks
  uint32_t kv_head_replicas = 1;  // ranks holding each KV head (tp / kv_heads when tp > kv_heads)
  // Parameters every rank holds whole (RMSNorm weights), whose bytes do not shrink with tp.
  uint64_t replicated_weight_bytes = 0;
};

// vLLM's rules (linear.py, vocab_parallel_embedding.py): QKVParallelLinear splits the query
// heads (heads % tp == 0) and the KV heads (kv_heads % tp == 0, or, with fewer KV heads than
// ranks, tp % kv_heads == 0 and each rank holds one KV head, replicated tp / kv_heads times);
// MergedColumnParallelLinear / RowParallelLinear split the MLP (intermediate % tp == 0);
// VocabParallelEmbedding and ParallelLMHead split the padded vocabulary (padded % tp == 0);
// RMSNorm weights are replicated. A shape that does not divide is an error naming the field.
Result<TensorParallelShard> shard_tensor_parallel(const ModelShape& model, uint32_t tp);

}  // namespace memsim
