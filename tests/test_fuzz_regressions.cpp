// Replays the inputs the fuzzers found crashes with (tests/data/fuzz/<target>/), in every build:
// each must now be handled as its target's contract says (fuzz/targets.h).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "fuzz/targets.h"

namespace fs = std::filesystem;

namespace {

std::string root() {
  const char* r = std::getenv("MEMSIM_SOURCE_ROOT");
  return r != nullptr ? r : ".";
}

template <class Target>
size_t replay(const std::string& target, Target run) {
  setenv("MEMSIM_ROOT", root().c_str(), 0);
  size_t n = 0;
  const fs::path dir = fs::path(root()) / "tests" / "data" / "fuzz" / target;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream f(e.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << f.rdbuf();
    INFO(e.path().string());
    CHECK(run(bytes.str()) == "");
    ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("config crashers: keys that are lists or maps are config errors, not yaml-cpp's") {
  CHECK(replay("config", memsim::fuzz::config_target) >= 9);
}

TEST_CASE("snapshot crashers: a MARK whose items were popped is an error value") {
  CHECK(replay("snapshot", memsim::fuzz::snapshot_target) >= 3);
}

TEST_CASE("a non-scalar key gets a located config error") {
  const std::string problem = memsim::fuzz::config_target("experiment: x\n? [a, b]\n: 3\n");
  CHECK(problem == "");
}
