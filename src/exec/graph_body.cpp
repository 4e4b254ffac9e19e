// ExecutorGraphBody: template decode steps of ModelStep captured through a strategy's allocator.
#include "src/exec/graph_body.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

namespace memsim {
namespace {

Status cu(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return make_error(ErrorCode::kDriverError, fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

// Nodes of the graph `stream` is capturing so far.
Result<uint64_t> nodes_captured(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  MEMSIM_TRY(cu(cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph), "capture info"));
  if (status != cudaStreamCaptureStatusActive || !graph)
    return make_error(ErrorCode::kInvalidState, "executor body: the stream is not capturing");
  size_t n = 0;
  MEMSIM_TRY(cu(cudaGraphGetNodes(graph, nullptr, &n), "graph nodes"));
  return uint64_t{n};
}

}  // namespace

Result<std::unique_ptr<ExecutorGraphBody>> ExecutorGraphBody::create(
    const ModelShape& model, uint32_t max_context, uint32_t block_size,
    const std::vector<uint32_t>& sizes, Backend& exec_backend) {
  std::unique_ptr<ExecutorGraphBody> body(new ExecutorGraphBody(exec_backend));
  body->max_context_ = max_context;
  ModelStepConfig mc;
  mc.model = model;
  for (uint32_t b : sizes) mc.max_seqs = std::max(mc.max_seqs, b);
  mc.max_tokens = std::max(mc.max_tokens, mc.max_seqs);
  MEMSIM_ASSIGN_OR_RETURN(body->step_, ModelStep::create(mc, exec_backend));
  KvInit init;
  init.layers = model.layers;
  init.kv_bytes_per_token = model.kv_bytes_per_token();
  const uint64_t block_bytes = uint64_t{block_size} * model.kv_bytes_per_token();
  MEMSIM_ASSIGN_OR_RETURN(body->kv_base_, exec_backend.device_malloc(block_bytes, "kv_cache"));
  MEMSIM_TRY(cu(cudaMemset(reinterpret_cast<void*>(body->kv_base_), 0, block_bytes), "KV clear"));
  body->kv_ = block_major_layout(body->kv_base_, init, block_size, block_bytes, 1);
  // Warm-up: each size's step once, eagerly, on the step's own stream and allocator.
  const auto own = reinterpret_cast<cudaStream_t>(body->step_->stream());
  for (uint32_t b : sizes) {
    MEMSIM_ASSIGN_OR_RETURN(std::vector<uint8_t> meta,
                            body->step_->decode_template(body->kv_, b, max_context, 1));
    MEMSIM_ASSIGN_OR_RETURN(DevPtr d, exec_backend.device_malloc(meta.size(), "activations"));
    Status st =
        cu(cudaMemcpy(reinterpret_cast<void*>(d), meta.data(), meta.size(), cudaMemcpyHostToDevice),
           "metadata upload");
    if (st.ok())
      st = body->step_->enqueue_decode(body->kv_, b, max_context, d,
                                       reinterpret_cast<uint64_t>(own), nullptr);
    if (st.ok()) st = cu(cudaStreamSynchronize(own), "warm-up");
    (void)exec_backend.device_free(d);
    MEMSIM_TRY(st);
  }
  MEMSIM_TRY(body->step_->release_cached());
  return body;
}

ExecutorGraphBody::~ExecutorGraphBody() {
  step_.reset();
  if (kv_base_) (void)backend_.device_free(kv_base_);
}

Status ExecutorGraphBody::prepare(uint32_t batch, const std::vector<CheckedTensor>& inputs,
                                  StreamId stream) {
  if (!capture_) return make_error(ErrorCode::kInvalidState, "executor body: no capture backend");
  if (inputs.size() != 1)
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("executor body: expects one input (step_metadata), got {}", inputs.size()));
  MEMSIM_ASSIGN_OR_RETURN(staged_, step_->decode_template(kv_, batch, max_context_, 1));
  if (staged_.size() > inputs[0].bytes)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("executor body: b={} needs {} bytes of metadata, the input "
                                  "holds {}",
                                  batch, staged_.size(), inputs[0].bytes));
  MEMSIM_ASSIGN_OR_RETURN(uint64_t s, capture_->native_stream(stream));
  const auto cs = reinterpret_cast<cudaStream_t>(s);
  meta_ = inputs[0].ptr;
  MEMSIM_TRY(cu(cudaMemcpyAsync(reinterpret_cast<void*>(meta_), staged_.data(), staged_.size(),
                                cudaMemcpyHostToDevice, cs),
                "metadata upload"));
  return cu(cudaStreamSynchronize(cs), "metadata upload");
}

Result<uint64_t> ExecutorGraphBody::capture(uint32_t batch, const GraphProgram& /*graph*/,
                                            TensorAllocator& mem, StreamId stream) {
  if (!capture_ || !meta_)
    return make_error(ErrorCode::kInvalidState, "executor body: capture before prepare");
  MEMSIM_ASSIGN_OR_RETURN(uint64_t s, capture_->native_stream(stream));
  const auto cs = reinterpret_cast<cudaStream_t>(s);
  // The step's own nodes: what the real graph gained, less the nodes the strategy's backend
  // calls made (graph memory nodes), which the shadow already counts.
  MEMSIM_ASSIGN_OR_RETURN(const uint64_t real_before, nodes_captured(cs));
  const uint64_t shadow_before = capture_->shadow().nodes_in_capture(stream);
  MEMSIM_TRY(step_->enqueue_decode(kv_, batch, max_context_, meta_, s, &mem));
  MEMSIM_ASSIGN_OR_RETURN(const uint64_t real_after, nodes_captured(cs));
  const uint64_t backend_nodes = capture_->shadow().nodes_in_capture(stream) - shadow_before;
  return real_after - real_before - backend_nodes;
}

}  // namespace memsim
