// Graph input buffers: xLLM's persistent parameters, the program's inputs, and a replay's update.
#include "workload/graph_inputs.h"

#include <stdexcept>

namespace memsim {

const char* to_string(InputSet s) {
  return s == InputSet::kXllm ? "xllm" : "program";
}

std::vector<InputBufferSpec> xllm_persistent_inputs(const ModelShape& model, uint32_t max_model_len,
                                                    uint32_t block_size) {
  if (block_size == 0 || max_model_len == 0 || model.hidden == 0)
    throw std::invalid_argument("xllm inputs: max_model_len, block_size and hidden must be > 0");
  const uint64_t i32 = dtype_bytes(DType::kInt32);
  const uint64_t table_len = (uint64_t{max_model_len} + block_size - 1) / block_size + 1;
  return {
      {"tokens", i32, 0, true, true},
      {"positions", i32, 0, true, false},
      {"new_cache_slots", i32, 0, true, true},
      {"q_seq_lens", i32, i32, true, false},
      {"kv_seq_lens", i32, i32, true, false},
      {"block_tables", table_len * i32, 0, true, false},
      {"hidden_states", model.hidden * dtype_bytes(model.dtype), 0, false, false},
  };
}

std::vector<InputBufferSpec> program_input_buffers(const ShapeProgram& program) {
  std::vector<InputBufferSpec> out;
  for (const TensorSpec& t : program.inputs) {
    InputBufferSpec s;
    s.name = t.name;
    if (program.batch > 0 && t.bytes % program.batch == 0) {
      s.row_bytes = t.bytes / program.batch;
    } else {
      s.fixed_bytes = t.bytes;  // not per sequence: copied whole
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<InputUpdateOp> input_update_ops(const std::vector<InputBufferSpec>& specs,
                                            uint32_t actual, uint32_t padded) {
  std::vector<InputUpdateOp> ops;
  for (size_t i = 0; i < specs.size(); ++i) {
    const InputBufferSpec& s = specs[i];
    if (!s.updated) continue;
    ops.push_back({i, 0, s.bytes(actual), false});
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const InputBufferSpec& s = specs[i];
    if (!s.updated || !s.zero_padding || padded <= actual) continue;
    ops.push_back({i, s.bytes(actual), uint64_t{padded - actual} * s.row_bytes, true});
  }
  return ops;
}

}  // namespace memsim
