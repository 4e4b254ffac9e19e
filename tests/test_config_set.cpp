// --set overrides: applied before validation, named in errors, rejected when malformed.
#include <catch2/catch.hpp>

#include "src/app/shapes_experiment.h"
#include "src/graph/registry.h"
#include "tests/config_test_util.h"

using namespace memsim;
using namespace memsim::test;  // NOLINT(google-build-using-namespace)

TEST_CASE("--set overrides are applied before validation", "[config][set]") {
  TempDir dir;
  const std::string path = dir.write("shapes.yaml", shapes_yaml());
  SECTION("max_num_seqs=8 gives vLLM's sizes up to 2 x 8") {
    const ShapesConfig c = load_shapes_config(path, {"max_num_seqs=8"});
    CHECK(c.max_num_seqs == 8u);
    CHECK(c.capture_sizes == std::vector<uint32_t>{1, 2, 4, 8, 16});
  }
  SECTION("seed=7") {
    CHECK(load_shapes_config(path, {"seed=7"}).seed == 7u);
  }
  SECTION("later overrides win") {
    CHECK(load_shapes_config(path, {"seed=7", "seed=9"}).seed == 9u);
  }
  SECTION("a nested key") {
    const ShapesConfig c = load_shapes_config(path, {"dynamic.arrivals=10"});
    CHECK(c.dynamic.arrivals == 10u);
    CHECK(c.dynamic.mean_interarrival_us == 20000.0);
  }
  SECTION("a list value parsed as YAML") {
    const ShapesConfig c = load_shapes_config(path, {"sweep.outputs=[weak]", "timeseries=all"});
    CHECK(c.variants.size() == 4u);
    CHECK(c.timeseries_all);
  }
  SECTION("a byte size") {
    CHECK(load_shapes_config(path, {"gemm_workspace=1GiB"}).gemm_workspace_bytes == 1073741824u);
  }
}

TEST_CASE("a --set of an unknown key fails naming the key", "[config][set][errors]") {
  TempDir dir;
  const std::string path = dir.write("shapes.yaml", shapes_yaml());
  // The message names the file, the key path and the problem; how the --set is shown between
  // them is left open.
  SECTION("a typo") {
    const std::string got = load_error(path, {"max_num_seq=8"});
    CHECK_THAT(got, Catch::StartsWith(path));
    CHECK_THAT(got, Catch::Contains("max_num_seq"));
    CHECK_THAT(got, Catch::EndsWith(": unknown key 'max_num_seq' (did you mean 'max_num_seqs'?)"));
  }
  SECTION("far from every key") {
    const std::string got = load_error(path, {"nope=3"});
    CHECK_THAT(got, Catch::StartsWith(path));
    CHECK_THAT(got, Catch::Contains(": unknown key 'nope' (valid keys: experiment, gpu, model,"));
  }
  SECTION("nested") {
    const std::string got = load_error(path, {"dynamic.arival=10"});
    CHECK_THAT(got, Catch::StartsWith(path));
    CHECK_THAT(got, Catch::Contains("dynamic.arival"));
    CHECK_THAT(got, Catch::EndsWith(": unknown key 'arival' (did you mean 'arrivals'?)"));
  }
}

TEST_CASE("malformed --set assignments", "[config][set][errors]") {
  TempDir dir;
  const std::string path = dir.write("shapes.yaml", shapes_yaml());
  CHECK(load_error(path, {"foo"}) == "--set foo: expected key.path=value");
  CHECK(load_error(path, {"=3"}) == "--set =3: expected key.path=value");
  CHECK(load_error(path, {"a..b=1"}) == "--set a..b=1: empty key in path");
  CHECK(load_error(path, {"seed=[1"}) ==
        "--set seed=[1: value is not valid YAML: end of sequence flow not found");
}

// Regression: "seed.x.y=1" must name 'seed' (the scalar), not the key after it.
TEST_CASE("a --set through a scalar names the scalar key", "[config][set][errors]") {
  TempDir dir;
  const std::string path = dir.write("shapes.yaml", shapes_yaml());
  CHECK(load_error(path, {"seed.x.y=1"}) == "--set seed.x.y=1: 'seed' is not a map");
}

TEST_CASE("a bad --set value is rejected by the typed loader", "[config][set][errors]") {
  TempDir dir;
  const std::string path = dir.write("shapes.yaml", shapes_yaml());
  auto check = [&](const std::string& assignment, const std::string& key,
                   const std::string& message) {
    const std::string got = load_error(path, {assignment});
    CHECK_THAT(got, Catch::StartsWith(path));
    CHECK_THAT(got, Catch::Contains(key));
    CHECK_THAT(got, Catch::EndsWith(": " + message));
  };
  check("kv_block_size=0", "kv_block_size", "0 is out of range [1, 65536]");
  check("seed=abc", "seed", "expected an integer, got 'abc'");
  check("strategies=[]", "strategies", "must list at least one strategy");
  check("experiment=graphs", "experiment", "'graphs' is not one of: shapes");
  check("gemm_workspace=3 parsecs", "gemm_workspace",
        "unknown unit 'parsecs' in '3 parsecs' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
}

// Regression: indexing a scalar (seed.x=1) made yaml-cpp throw BadSubscript and the CLI abort.
TEST_CASE("a --set through a scalar value is a ConfigError", "[config][set][errors]") {
  TempDir dir;
  const std::string path = dir.write("shapes.yaml", shapes_yaml());
  REQUIRE_THROWS_AS(load_shapes_config(path, {"seed.x=1"}), ConfigError);
  REQUIRE_THROWS_AS(load_shapes_config(path, {"seed.=1"}), ConfigError);
}

// Regression: an error in a --set value was located at "<file>:1:", an unrelated line.
TEST_CASE("an error in a --set value names the --set", "[config][set][errors]") {
  TempDir dir;
  const std::string path = dir.write("shapes.yaml", shapes_yaml());
  const std::string got = load_error(path, {"kv_block_size=0"});
  CHECK_THAT(got, Catch::Contains("--set"));
  CHECK_THAT(got, !Catch::StartsWith(path + ":1:"));
}

// Regression: yaml-cpp keeps both entries of a repeated key; lookups used to take the first.
TEST_CASE("a repeated key is an error", "[config][errors]") {
  TempDir dir;
  const std::string t = shapes_yaml() + "seed: 5\n";
  const std::string path = dir.write("dupkey.yaml", t);
  bool threw = false;
  try {
    const ShapesConfig c = load_shapes_config(path, {});
    INFO("loaded with seed " << c.seed);
  } catch (const ConfigError& e) {
    threw = true;
    CHECK_THAT(std::string(e.what()), Catch::Contains("seed"));
  }
  CHECK(threw);
}
