// A small Llama-shaped model (4 layers, hidden 1024, GQA 8/2) for tests that capture graphs: the
// suites run it in well under a second.
#pragma once

#include "workload/model_shape.h"

namespace memsim::test {

inline ModelShape tiny_llama() {
  ModelShape m;
  m.name = "tiny";
  m.layers = 4;
  m.hidden = 1024;
  m.heads = 8;
  m.kv_heads = 2;
  m.head_dim = 128;
  m.intermediate = 2816;
  m.vocab = 32000;
  return m;  // bf16
}

}  // namespace memsim::test
