// Allocation programs: role and mode names, and the structural check of a graph's op list.
#include "workload/alloc_program.h"

#include <string>
#include <vector>

namespace memsim {

const char* to_string(TensorRole r) {
  switch (r) {
    case TensorRole::kInput:
      return "input";
    case TensorRole::kIntermediate:
      return "intermediate";
    case TensorRole::kOutput:
      return "output";
    case TensorRole::kWorkspace:
      return "workspace";
  }
  return "unknown";
}

const char* to_string(GraphMode m) {
  switch (m) {
    case GraphMode::kFull:
      return "full";
    case GraphMode::kPiecewise:
      return "piecewise";
  }
  return "unknown";
}

namespace {

enum class State : uint8_t { kNotAllocated, kLive, kFreed };

std::string describe(const GraphProgram& g, uint32_t tensor) {
  return "graph '" + g.name + "': tensor " + std::to_string(tensor) + " ('" +
         g.tensors[tensor].name + "', " + to_string(g.tensors[tensor].role) + ")";
}

}  // namespace

std::string validate(const GraphProgram& g) {
  for (uint32_t i = 0; i < g.tensors.size(); ++i) {
    if (g.tensors[i].role == TensorRole::kInput) {
      return describe(g, i) + " has role input; inputs are not part of a graph body";
    }
    if (g.tensors[i].bytes == 0) return describe(g, i) + " has zero bytes";
  }

  std::vector<State> state(g.tensors.size(), State::kNotAllocated);
  for (size_t k = 0; k < g.ops.size(); ++k) {
    const ProgramOp& op = g.ops[k];
    const std::string where = " (op " + std::to_string(k) + ")";
    if (op.tensor >= g.tensors.size()) {
      return "graph '" + g.name + "': op " + std::to_string(k) + " names tensor " +
             std::to_string(op.tensor) + " but the graph has " + std::to_string(g.tensors.size()) +
             " tensors";
    }
    State& s = state[op.tensor];
    if (op.kind == ProgramOp::Kind::kAlloc) {
      if (s != State::kNotAllocated) {
        return describe(g, op.tensor) + " is allocated more than once" + where;
      }
      s = State::kLive;
    } else {
      if (g.tensors[op.tensor].role != TensorRole::kIntermediate) {
        return describe(g, op.tensor) + " is freed, but only intermediates may be" + where;
      }
      if (s == State::kNotAllocated) {
        return describe(g, op.tensor) + " is freed before it is allocated" + where;
      }
      if (s == State::kFreed) return describe(g, op.tensor) + " is freed twice" + where;
      s = State::kFreed;
    }
  }

  for (uint32_t i = 0; i < g.tensors.size(); ++i) {
    if (state[i] == State::kNotAllocated) return describe(g, i) + " is never allocated";
    if (g.tensors[i].role == TensorRole::kIntermediate && state[i] != State::kFreed) {
      return describe(g, i) + " is never freed";
    }
  }
  return {};
}

}  // namespace memsim
