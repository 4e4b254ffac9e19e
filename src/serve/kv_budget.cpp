// KV-cache budget: the profile-run replay, the capture run and the subtraction, as error values.
#include "src/serve/kv_budget.h"

#include <fmt/format.h>
#include <algorithm>
#include <exception>
#include <map>
#include <optional>

#include "backends/sim/sim_backend.h"
#include "core/clock.h"
#include "core/metrics.h"
#include "src/alloc/device_segment_source.h"
#include "src/alloc/torch_caching.h"
#include "src/drivers/trace_recorder.h"
#include "workload/alloc_program.h"
#include "workload/tensor_parallel.h"

namespace memsim {

namespace {

// The first tensor of the program's head (the LM head's output).
const char* head_tensor(const KvBudgetInput& in) {
  return in.parallel.tensor > 1 ? "logits.partial" : "logits";
}

std::string gib(uint64_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1ull << 30));
}

// `in` with its model replaced by one rank's shard (of one pipeline stage's layers), and the
// program options of that rank.
struct RankInput {
  KvBudgetInput in;
  ProgramOptions program;
  uint32_t kv_head_replicas = 1;
  PipelineStage stage;
  uint64_t weights = 0;  // the rank's weights (its stage's)
};

Result<RankInput> rank_input(const KvBudgetInput& in) {
  RankInput r{in, {}, 1, {}, 0};
  ProgramOptions& o = r.program;
  o.mode = GraphMode::kFull;
  o.gemm_workspace_bytes = in.gemm_workspace_bytes;
  o.max_model_len = in.max_model_len;
  o.kv_block_size = in.kv_block_size;
  MEMSIM_ASSIGN_OR_RETURN(const std::vector<PipelineStage> stages,
                          split_pipeline(in.model.layers, in.parallel.pipeline));
  if (in.pipeline_stage >= stages.size())
    return make_error(ErrorCode::kInvalidArgument, fmt::format("kv budget: pipeline stage {} of {}",
                                                               in.pipeline_stage, stages.size()));
  r.stage = stages[in.pipeline_stage];
  ModelShape rank = in.model;
  if (in.parallel.tensor > 1) {
    MEMSIM_ASSIGN_OR_RETURN(const TensorParallelShard shard,
                            shard_tensor_parallel(in.model, in.parallel.tensor));
    rank = shard.rank;
    r.kv_head_replicas = shard.kv_head_replicas;
    o.tensor_parallel = in.parallel.tensor;
    o.vocab_padded = shard.vocab_padded;
    o.vocab = in.model.vocab;
  }
  r.weights = stage_weight_bytes(rank, r.stage);
  r.in.model = stage_model(rank, r.stage);
  o.first_stage = r.stage.first;
  o.last_stage = r.stage.last;
  return r;
}

// Replays the ops of `g` from op `from` up to (not including) op `to` through `alloc`, tracking
// live tensors by name, so that a free in one program may release a tensor allocated by another
// program of the same model (names are the same across batch sizes).
Status replay_ops(const GraphProgram& g, size_t from, size_t to, CachingAllocator& alloc,
                  StreamId stream, std::map<std::string, DevPtr>& live) {
  for (size_t i = from; i < to; ++i) {
    const ProgramOp& op = g.ops[i];
    const TensorSpec& t = g.tensors[op.tensor];
    if (op.kind == ProgramOp::Kind::kAlloc) {
      MEMSIM_ASSIGN_OR_RETURN(const DevPtr p, alloc.malloc(t.bytes, stream));
      live[t.name] = p;
      continue;
    }
    auto it = live.find(t.name);
    if (it == live.end())
      return make_error(
          ErrorCode::kInvalidState,
          fmt::format("profile run: {} frees '{}', which is not live", g.name, t.name));
    MEMSIM_TRY(alloc.free(it->second));
    live.erase(it);
  }
  return {};
}

size_t find_alloc(const GraphProgram& g, const std::string& name) {
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (g.ops[i].kind == ProgramOp::Kind::kAlloc && g.tensors[g.ops[i].tensor].name == name)
      return i;
  return g.ops.size();
}

struct ActivationPeak {
  uint64_t allocated = 0;
  uint64_t reserved = 0;
  std::string snapshot;  // the run as a PyTorch snapshot pickle, when asked for
};

// vLLM's profile run: a forward of `tokens` rows, then the sampler on `rows` rows.
Result<ActivationPeak> profile_run(const RankInput& rank, const GpuSpec& gpu, uint32_t tokens,
                                   uint32_t rows) {
  const KvBudgetInput& in = rank.in;
  ShapeProgram body, head;
  try {
    body = make_decode_program(in.model, tokens, rank.program);
    head = rows == tokens || !rank.stage.last ? body
                                              : make_decode_program(in.model, rows, rank.program);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kInvalidArgument, e.what());
  }
  SimClock clock;
  SimBackend backend(gpu, clock);
  MEMSIM_ASSIGN_OR_RETURN(const StreamId stream, backend.create_stream());
  DeviceSegmentSource source(backend, "profile_run");
  TorchCachingAllocator torch(source);
  std::optional<RecordingAllocator> recording;
  if (in.export_profile_snapshot) recording.emplace(torch);
  CachingAllocator& alloc = recording ? static_cast<CachingAllocator&>(*recording) : torch;
  std::map<std::string, DevPtr> live;
  Status status = [&]() -> Status {
    for (const TensorSpec& t : body.inputs) {
      MEMSIM_ASSIGN_OR_RETURN(const DevPtr p, alloc.malloc(t.bytes, stream));
      live["input." + t.name] = p;
    }
    const GraphProgram& b = body.graphs.front();
    const GraphProgram& h = head.graphs.front();
    const size_t cut = find_alloc(b, head_tensor(in));
    MEMSIM_TRY(replay_ops(b, 0, cut, alloc, stream, live));
    if (cut < b.ops.size())
      MEMSIM_TRY(replay_ops(h, find_alloc(h, head_tensor(in)), h.ops.size(), alloc, stream, live));
    return {};
  }();
  const AllocatorStats stats = alloc.stats();
  std::string snapshot;
  if (recording) {
    Result<std::string> bytes = serialize_snapshot(recording->snapshot());
    if (bytes.ok()) snapshot = std::move(*bytes);
  }
  const Status released = alloc.release_all();
  if (!status.ok()) {
    Error e = status.error();
    e.message = fmt::format("profile run ({} tokens) on {} free after weights: {}", tokens,
                            gib(gpu.capacity), e.message);
    return e;
  }
  MEMSIM_TRY(released);
  return ActivationPeak{stats.peak_allocated_bytes, stats.peak_reserved_bytes, std::move(snapshot)};
}

CaptureRunConfig capture_config(const RankInput& rank, const std::vector<uint32_t>& sizes) {
  const KvBudgetInput& in = rank.in;
  CaptureRunConfig rc;
  rc.model = in.model;
  rc.gemm_workspace_bytes = in.gemm_workspace_bytes;
  rc.max_model_len = in.max_model_len;
  rc.kv_block_size = in.kv_block_size;
  rc.tensor_parallel = rank.program.tensor_parallel;
  rc.vocab_padded = rank.program.vocab_padded;
  rc.vocab = rank.program.vocab;
  rc.first_stage = rank.stage.first;
  rc.last_stage = rank.stage.last;
  rc.capture_sizes = sizes;
  rc.order = in.capture_order;
  rc.arrival = Arrival::kFixed;
  rc.inputs = InputBuffers::kPersistent;
  rc.outputs = in.outputs;
  rc.runners = in.graphs;
  return rc;
}

Result<uint64_t> graph_memory(const RankInput& rank, const GpuSpec& gpu,
                              const std::vector<uint32_t>& sizes) {
  const KvBudgetInput& in = rank.in;
  GraphStrategyFactory factory = in.graph_factory;
  if (!factory) {
    const GraphEntry* info = graph_strategies().find(in.graph_strategy);
    if (info == nullptr)
      return make_error(ErrorCode::kInvalidArgument,
                        "kv budget: " + graph_strategies().unknown(in.graph_strategy));
    try {
      factory = info->defaults();
    } catch (const std::exception& e) {
      return make_error(ErrorCode::kInvalidArgument, e.what());
    }
  }
  const CaptureRunConfig rc = capture_config(rank, sizes);
  SimClock clock;
  MetricsRecorder metrics(clock);
  const CaptureRunResult r = run_captures_on_sim(rc, gpu, factory, clock, metrics);
  if (!r.ok)
    return make_error(r.out_of_memory ? ErrorCode::kOutOfMemory : ErrorCode::kInvalidState,
                      fmt::format("graph capture ({}) at b={} on {} free after weights: {}",
                                  in.graph_strategy, r.failed_batch, gib(gpu.capacity), r.failure),
                      r.bytes_short);
  if (!r.invariant_violation.empty())
    return make_error(
        ErrorCode::kInvalidState,
        fmt::format("graph capture ({}): {}", in.graph_strategy, r.invariant_violation));
  return r.peak_strategy_reserved;
}

}  // namespace

Result<CaptureRunConfig> kv_budget_capture_config(const KvBudgetInput& in) {
  MEMSIM_ASSIGN_OR_RETURN(const RankInput rank, rank_input(in));
  return capture_config(rank, kv_budget_capture_sizes(in));
}

std::vector<uint32_t> kv_budget_capture_sizes(const KvBudgetInput& in) {
  if (in.enforce_eager) return {};
  std::vector<uint32_t> sizes =
      in.capture_sizes.empty() ? vllm_capture_sizes(in.max_num_seqs) : in.capture_sizes;
  std::erase_if(sizes, [&](uint32_t s) { return s == 0 || s > in.max_num_batched_tokens; });
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

Result<KvBudget> compute_kv_budget(const KvBudgetInput& in) {
  if (!(in.gpu_memory_utilization > 0 && in.gpu_memory_utilization <= 1))
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("kv budget: gpu_memory_utilization {} is not in (0, 1]",
                                  in.gpu_memory_utilization));
  if (in.max_num_batched_tokens == 0 || in.max_num_seqs == 0 || in.kv_block_size == 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "kv budget: max_num_batched_tokens, max_num_seqs and kv_block_size must "
                      "be > 0");
  MEMSIM_ASSIGN_OR_RETURN(const RankInput rank, rank_input(in));
  const ModelShape& model = rank.in.model;
  KvBudget b;
  b.capacity = in.gpu.capacity;
  b.context = in.gpu.context;
  b.usable =
      static_cast<uint64_t>(in.gpu_memory_utilization * static_cast<double>(in.gpu.capacity));
  b.weights = rank.weights;
  b.kv_bytes_per_token = model.kv_bytes_per_token();
  b.tensor_parallel = in.parallel.tensor;
  b.kv_head_replicas = rank.kv_head_replicas;
  b.pipeline_parallel = in.parallel.pipeline;
  b.stage = rank.stage;
  MEMSIM_ASSIGN_OR_RETURN(b.comm, comm_memory(in.gpu, in.parallel, in.comm));
  // What the device has free once the CUDA context, NCCL and the custom all-reduce hold theirs
  // (vLLM's init snapshot; SGLang's total_gpu_memory).
  const uint64_t free_at_start = free_on_startup(in.gpu, b.comm);
  const bool sglang = in.mem_fraction_static > 0;
  if (sglang) {
    if (!(in.mem_fraction_static < 1))
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("kv budget: mem_fraction_static {} is not in (0, 1)",
                                    in.mem_fraction_static));
    b.usable = static_cast<uint64_t>(in.mem_fraction_static * static_cast<double>(free_at_start));
    b.mem_fraction_static = in.mem_fraction_static;
  }
  if (!sglang && free_at_start < b.usable)
    return make_error(
        ErrorCode::kOutOfMemory,
        fmt::format("kv budget: free memory on startup ({} of {}, after the CUDA context {}, NCCL "
                    "{} and the custom all-reduce {}) is less than gpu_memory_utilization {} x "
                    "capacity ({}), as vLLM refuses to start",
                    gib(free_at_start), gib(b.capacity), gib(in.gpu.context), gib(b.comm.nccl()),
                    gib(b.comm.custom()), in.gpu_memory_utilization, gib(b.usable)),
        b.usable - free_at_start);
  b.kv_block_size = in.kv_block_size;
  b.gpu_memory_utilization = in.gpu_memory_utilization;
  b.profile_tokens = in.max_num_batched_tokens;
  // vLLM's profile run samples on the last pipeline rank only.
  b.sampler_rows = rank.stage.last ? std::min(in.max_num_seqs, in.max_num_batched_tokens) : 0;
  b.capture_sizes = kv_budget_capture_sizes(in);
  b.graph_strategy = in.enforce_eager ? "none (enforce_eager)" : in.graph_strategy;
  if (!in.enforce_eager && b.capture_sizes.empty())
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("kv budget: no capture size <= max_num_batched_tokens {}",
                                  in.max_num_batched_tokens));
  if (b.weights >= b.capacity)
    return make_error(ErrorCode::kOutOfMemory,
                      fmt::format("kv budget: the weights ({}) do not fit the {} of {}",
                                  gib(b.weights), gib(b.capacity), in.gpu.name),
                      b.weights - b.capacity);

  // The profile run and the captures happen with the weights loaded.
  GpuSpec after_weights = in.gpu;
  after_weights.capacity =
      b.capacity - b.weights - std::min(b.capacity - b.weights, b.comm.total());
  MEMSIM_ASSIGN_OR_RETURN(
      const ActivationPeak act,
      profile_run(rank, after_weights, in.max_num_batched_tokens, b.sampler_rows));
  b.activation_peak = act.allocated;
  b.activation_reserved_peak = act.reserved;
  b.profile_snapshot = act.snapshot;
  if (!in.enforce_eager) {
    MEMSIM_ASSIGN_OR_RETURN(b.graph_memory, graph_memory(rank, after_weights, b.capture_sizes));
  }

  const uint64_t needed =
      b.weights + (sglang ? 0 : b.activation_peak + b.graph_memory);  // SGLang: in the reserve
  // A block holds kv_block_size tokens of every layer, or with KV cache groups (sliding-window
  // layers under the hybrid manager) of the group size's layers (vLLM
  // get_kv_cache_config_from_groups: available_memory // page_size // group_size blocks).
  b.kv_groups = kv_cache_groups(model.layer_windows(), in.hybrid_kv_cache);
  b.kv_group_layers = kv_group_size(b.kv_groups);
  const uint64_t block_bytes = uint64_t{in.kv_block_size} * b.kv_bytes_per_token / model.layers *
                               std::max<uint32_t>(1, b.kv_group_layers);
  b.kv_block_bytes = block_bytes;
  if (b.usable < needed + block_bytes)
    return make_error(
        ErrorCode::kOutOfMemory,
        sglang ? fmt::format("kv budget: no memory for the KV cache: mem_fraction_static {:.3f} x "
                             "{} free = {}, but the weights ({}) leave less than one KV block "
                             "({} B); short by {} B",
                             in.mem_fraction_static, gib(free_at_start), gib(b.usable),
                             gib(b.weights), block_bytes, needed + block_bytes - b.usable)
               : fmt::format("kv budget: no memory for the KV cache: {:.3f} x {} = {} usable, but "
                             "weights {} + activations {} + graphs {} = {} leave less than one KV "
                             "block ({} B); short by {} B",
                             in.gpu_memory_utilization, gib(b.capacity), gib(b.usable),
                             gib(b.weights), gib(b.activation_peak), gib(b.graph_memory),
                             gib(needed), block_bytes, needed + block_bytes - b.usable),
        needed + block_bytes - b.usable);
  b.kv_bytes = b.usable - needed;
  b.kv_tokens = b.kv_bytes_per_token ? b.kv_bytes / b.kv_bytes_per_token : 0;
  b.kv_blocks = block_bytes ? b.kv_bytes / block_bytes : 0;
  // Several groups: every token takes a slot in each group's table (vLLM's "GPU KV cache size":
  // num_blocks // groups x block_size).
  if (b.kv_groups.size() > 1) b.kv_tokens = b.kv_blocks / b.kv_groups.size() * in.kv_block_size;
  b.kv_max_blocks_per_request = max_blocks_per_request(b.kv_groups, in.kv_block_size,
                                                       in.max_model_len, in.max_num_batched_tokens);
  return b;
}

Result<EngineKvBudget> compute_engine_kv_budget(const KvBudgetInput& in) {
  MEMSIM_ASSIGN_OR_RETURN(const std::vector<PipelineStage> stages,
                          split_pipeline(in.model.layers, in.parallel.pipeline));
  EngineKvBudget e;
  for (const PipelineStage& stage : stages) {
    // A stage shaped like an earlier one has its budget (only where it sits differs).
    const auto same = std::find_if(e.stages.begin(), e.stages.end(),
                                   [&](const KvBudget& b) { return b.stage.same_shape(stage); });
    if (same != e.stages.end()) {
      e.stages.push_back(*same);
      e.stages.back().stage = stage;
      continue;
    }
    KvBudgetInput one = in;
    one.pipeline_stage = stage.index;
    Result<KvBudget> b = compute_kv_budget(one);
    if (!b.ok()) {
      Error err = b.error();
      if (stages.size() > 1)
        err.message =
            fmt::format("pipeline stage {} (layers {}..{}): {}", stage.index, stage.first_layer,
                        stage.first_layer + stage.layers - 1, err.message);
      return err;
    }
    e.stages.push_back(std::move(*b));
  }
  // vLLM's get_kv_cache_configs: every worker gets the smallest worker's block count.
  for (size_t s = 0; s < e.stages.size(); ++s)
    if (s == 0 || e.stages[s].kv_blocks < e.kv_blocks_min) {
      e.kv_blocks_min = e.stages[s].kv_blocks;
      e.min_stage = static_cast<uint32_t>(s);
    }
  return e;
}

std::string format_kv_budget(const KvBudget& b) {
  auto line = [](const char* what, uint64_t bytes, const std::string& note) {
    return fmt::format("  {:<18} {:>11} {:>17} B{}\n", what, gib(bytes), bytes,
                       note.empty() ? "" : "  " + note);
  };
  std::string sizes = "none";
  if (!b.capture_sizes.empty())
    sizes = fmt::format("{} sizes {}..{}", b.capture_sizes.size(), b.capture_sizes.front(),
                        b.capture_sizes.back());
  std::string out;
  out += line("capacity", b.capacity, "");
  if (b.context > 0)
    out += line("  CUDA context", b.context, "held before the engine starts (not free at startup)");
  const bool sglang = b.mem_fraction_static > 0;
  out += line("usable", b.usable,
              sglang ? fmt::format("mem_fraction_static {} x the memory free before the weights "
                                   "(SGLang)",
                                   b.mem_fraction_static)
                     : fmt::format("gpu_memory_utilization {}", b.gpu_memory_utilization));
  out += line("- weights", b.weights, "");
  // SGLang sizes its pool without them: they come out of the rest.
  out += line(sglang ? "  activation peak" : "- activation peak", b.activation_peak,
              fmt::format("profile run: {} tokens, {}; allocator reserved {}", b.profile_tokens,
                          b.stage.last ? fmt::format("sampler on {} rows", b.sampler_rows)
                                       : std::string("no sampler (not the last stage)"),
                          gib(b.activation_reserved_peak)));
  out += line(sglang ? "  graph memory" : "- graph memory", b.graph_memory,
              b.capture_sizes.empty()
                  ? b.graph_strategy
                  : fmt::format("{}, captures: {} largest first (the GEMM workspace apart)",
                                b.graph_strategy, sizes));
  out += line("= kv cache", b.kv_bytes,
              fmt::format("{} tokens at {} B/token, {} blocks of {}", b.kv_tokens,
                          b.kv_bytes_per_token, b.kv_blocks, b.kv_block_size));
  if (any_window(b.kv_groups))
    out +=
        fmt::format("  KV cache groups: {}; blocks of {} B; a request holds at most {} blocks\n",
                    describe_kv_groups(b.kv_groups), b.kv_block_bytes, b.kv_max_blocks_per_request);
  if (sglang) {
    const uint64_t free = b.capacity - std::min(b.capacity, b.context + b.comm.total());
    const uint64_t reserve = free - std::min(free, b.usable);
    const uint64_t wanted = b.activation_peak + b.graph_memory;
    out += fmt::format("  the rest ({}) holds the activation peak and graph memory ({}){}\n",
                       gib(reserve), gib(wanted),
                       wanted > reserve
                           ? ": it does not, and SGLang would run out of memory in the first "
                             "large prefill or at graph capture"
                           : "");
  }
  if (b.pipeline_parallel > 1)
    out += fmt::format("  pipeline stage {} of {}: layers {}..{}{}{}\n", b.stage.index,
                       b.pipeline_parallel, b.stage.first_layer,
                       b.stage.first_layer + b.stage.layers - 1,
                       b.stage.first ? ", the embedding" : "",
                       b.stage.last ? ", the final norm, LM head and sampler" : "");
  if (b.tensor_parallel > 1 || b.pipeline_parallel > 1) {
    out += b.tensor_parallel > 1
               ? fmt::format(
                     "  every term is one rank's of {} (tensor parallel; ranks alike, each "
                     "KV head on {} rank(s)); outside the budget:\n",
                     b.tensor_parallel, b.kv_head_replicas)
               : std::string("  every term is the stage's rank's; outside the budget:\n");
    std::string by_rank;
    for (uint32_t r = 0; r < b.comm.nccl_by_rank.size(); ++r)
      by_rank += fmt::format("{}{:.0f}", r ? " / " : "", double(b.comm.nccl_of(r)) / 1048576.0);
    out += line("  NCCL", b.comm.nccl(),
                by_rank.empty()
                    ? "communicator + first collective's buffers"
                    : "the largest rank's; by rank " + by_rank + " MiB (measured rank by rank)");
    out += line("  custom AR", b.comm.custom(),
                b.comm.custom_all_reduce
                    ? "vLLM's custom all-reduce: IPC meta + data buffers, rank_data, peer handles"
                    : "no custom all-reduce");
    out += line("  free", b.free_bytes(),
                by_rank.empty()
                    ? "capacity - context - usable - NCCL - custom all-reduce"
                    : "capacity - context - usable - NCCL - custom all-reduce, on that rank");
    if (!b.comm.nccl_note.empty()) out += "  note: " + b.comm.nccl_note + "\n";
    if (!b.comm.pp_note.empty()) out += "  note: " + b.comm.pp_note + "\n";
  }
  return out;
}

}  // namespace memsim
