// memsim-program-dump: prints a model's decode allocation program at a batch size as JSON, with
// the footprint memsim's torch_caching predicts for it in a fresh pool (for
// tools/torch_reference.py).
#include <fmt/format.h>
#include <cstdio>
#include <string>

#include "bench/bench_cli.h"
#include "workload/alloc_program.h"
#include "workload/model_shape.h"
#include "src/alloc/torch_caching.h"
#include "src/config/loaders.h"

using namespace memsim;

namespace {

// Hands out 2 MiB-aligned addresses and counts bytes, like cudaMalloc would.
class CountingSource final : public SegmentSource {
 public:
  Result<DevPtr> allocate_segment(uint64_t bytes, StreamId) override {
    const DevPtr p = next_;
    next_ += (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    return p;
  }
  Status release_segment(DevPtr, uint64_t) override { return {}; }

 private:
  DevPtr next_ = 1ull << 40;
};

const std::string kUsage =
    "usage: memsim-program-dump MODEL.yaml BATCH [full|piecewise]\n"
    "  Prints MODEL's decode allocation program at BATCH sequences as JSON, with the footprint\n"
    "  memsim's torch_caching predicts for it (for tools/torch_reference.py).\n";

int run(int argc, char** argv) {
  if (argc < 3 || argc > 4) throw bench::UsageError("expects MODEL.yaml BATCH [full|piecewise]");
  const std::string mode = argc > 3 ? argv[3] : "full";
  if (mode != "full" && mode != "piecewise")
    throw bench::UsageError(fmt::format("mode must be full or piecewise, got '{}'", mode));
  const ModelShape model = load_model_shape(ConfigNode::load_file(argv[1]));
  ProgramOptions o;
  o.mode = mode == "piecewise" ? GraphMode::kPiecewise : GraphMode::kFull;
  const auto batch = static_cast<uint32_t>(bench::parse_count(argv[2], "BATCH", 1, 1u << 20));
  const ShapeProgram prog = make_decode_program(model, batch, o);
  // One pool for all graphs of the shape (the tensors of one forward), outputs kept.
  CountingSource source;
  TorchCachingAllocator pool(source);
  std::string ops;
  for (size_t g = 0; g < prog.graphs.size(); ++g) {
    const GraphProgram& graph = prog.graphs[g];
    std::vector<DevPtr> ptr(graph.tensors.size());
    for (const ProgramOp& op : graph.ops) {
      const uint64_t id = g * 100000 + op.tensor;
      if (op.kind == ProgramOp::Kind::kAlloc) {
        ptr[op.tensor] = *pool.malloc(graph.tensors[op.tensor].bytes, StreamId{0});
        ops += fmt::format("{}[\"a\",{},{}]", ops.empty() ? "" : ",", id,
                           graph.tensors[op.tensor].bytes);
      } else {
        (void)pool.free(ptr[op.tensor]);
        ops += fmt::format(",[\"f\",{}]", id);
      }
    }
  }
  const AllocatorStats s = pool.stats();
  fmt::print(
      "{{\"model\":\"{}\",\"batch\":{},\"reserved\":{},\"peak_allocated\":{},\"ops\":[{}]}}\n",
      model.name, prog.batch, s.reserved_bytes, s.peak_allocated_bytes, ops);
  (void)pool.release_all();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::guarded_main("memsim-program-dump", kUsage, argc, argv,
                             [&] { return run(argc, argv); });
}
