// ModelStep as the capture runner's graph body (the shapes experiment's graph_body: executor on
// the CUDA backend): each graph-memory strategy captures the executor's real decode step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "src/drivers/capture_runner.h"
#include "src/exec/model_step.h"

namespace memsim {

class ExecutorGraphBody final : public GraphBody {
 public:
  // Builds the model on `exec_backend` (random weights, a one-block KV pool: the template steps
  // read block 0 and write no KV) and warms up the decode step of every size in `sizes` on its
  // own allocator (cuBLASLt plans), then returns the cached activations, so the strategies' runs
  // start from a device holding only the model.
  static Result<std::unique_ptr<ExecutorGraphBody>> create(const ModelShape& model,
                                                           uint32_t max_context,
                                                           uint32_t block_size,
                                                           const std::vector<uint32_t>& sizes,
                                                           Backend& exec_backend);
  ~ExecutorGraphBody() override;

  // The backend of the strategy run that captures next (its streams are the capture streams).
  void attach(CudaBackend* capture) { capture_ = capture; }

  // Uploads the template metadata of `batch` into the shape's step_metadata input, with every
  // sequence one token long (replays read one KV token; the plan stays max_context's).
  Status prepare(uint32_t batch, const std::vector<CheckedTensor>& inputs,
                 StreamId stream) override;
  // Enqueues the decode step; returns the nodes it added to the graph (kernels and the copy of
  // the next tokens: what the real graph gained beyond the strategy's memory nodes).
  Result<uint64_t> capture(uint32_t batch, const GraphProgram& graph, TensorAllocator& mem,
                           StreamId stream) override;

  uint64_t weight_bytes() const { return step_->weight_bytes(); }

 private:
  ExecutorGraphBody(Backend& b) : backend_(b) {}
  Backend& backend_;
  std::unique_ptr<ModelStep> step_;
  KvLayout kv_;
  DevPtr kv_base_ = 0;
  uint32_t max_context_ = 0;
  CudaBackend* capture_ = nullptr;
  std::vector<uint8_t> staged_;  // host copy of the last upload
  DevPtr meta_ = 0;              // the step_metadata input of the shape being captured
};

}  // namespace memsim
