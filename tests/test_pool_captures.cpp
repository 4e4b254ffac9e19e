// Shared graph pools against PyTorch's own: 51 captures recorded on an H200 into one pool in three
// orders, outputs held and dropped (tests/data/pool_captures), reproduced to the byte.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "src/app/shapes_experiment.h"

using namespace memsim;

namespace {

std::string source_root() {
  const char* root = std::getenv("MEMSIM_SOURCE_ROOT");
  return root ? root : ".";
}

std::string data_dir() {
  return source_root() + "/tests/data/pool_captures";
}

// The bytes of the shared pool PyTorch held after the last capture (segments of the pool).
uint64_t torch_pool_bytes(const std::string& order, const std::string& outputs) {
  std::ifstream in(data_dir() + "/shared_" + order + "_" + outputs + ".json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in).at("pool_bytes").get<uint64_t>();
}

TEST_CASE("shared pools from recorded captures hold PyTorch's pool bytes exactly",
          "[regression][pool_captures]") {
  // The GPU and model files by path: the test runs from the build folder.
  const ShapesConfig config =
      load_shapes_config(data_dir() + "/shapes.yaml",
                         {"gpu=" + source_root() + "/configs/gpus/h200.yaml",
                          "model=" + source_root() + "/configs/models/llama-3.1-8b.yaml"});
  const ShapesResults results = run_shapes(config);
  const std::map<std::string, std::string> lifetime = {{"strong", "held"}, {"weak", "dropped"}};
  int checked = 0;
  for (const RunRecord& r : results.runs) {
    const std::string outputs = r.variant.name().substr(0, r.variant.name().find('/'));
    INFO(r.strategy->label << " " << r.variant.name());
    REQUIRE(r.result.ok);
    CHECK(r.result.peak_physical == torch_pool_bytes(r.strategy->label, lifetime.at(outputs)));
    ++checked;
  }
  CHECK(checked == 6);  // three orders x two output lifetimes
}

}  // namespace
