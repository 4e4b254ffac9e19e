// --set overrides: applied before validation, named in errors, rejected when malformed.
#include <catch2/catch.hpp>

#include "src/app/shapes_experiment.h"
#include "src/graph/registry.h"
#include "src/serve/serving_experiment.h"
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
    CHECK(c.variants.size() == 8u);  // arrival x graphs x inputs
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

namespace {

// A serving experiment of two runs: `a` sets its own kv and scheduler.max_num_seqs, `b` its kv.
std::string two_runs_yaml() {
  return "experiment: two_runs\ngpu: " + gpu_file() + "\nmodel: " + model_file() +
         "\nrequests: {source: synthetic, count: 4, seed: 1, arrival: {process: poisson, rate: "
         "5}, prompt: {dist: fixed, value: 100}, output: {dist: fixed, value: 20}}\n"
         "scheduler: {impl: continuous_batching, max_num_seqs: 64}\n"
         "runs:\n"
         "  - {label: a, kv: {impl: paged_block_pool}, scheduler: {max_num_seqs: 16}}\n"
         "  - {label: b, kv: {impl: radix_token_pool}}\n";
}

std::string serving_error(const std::string& path, const std::vector<std::string>& sets,
                          const std::vector<std::string>& unsets = {}) {
  try {
    ConfigNode root = ConfigNode::load_file(path);
    for (const std::string& u : unsets) root.apply_unset(u);
    for (const std::string& s : sets) root.apply_override(s);
    (void)load_serving_config(root);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("--set reaches an entry of a list by its index", "[config][set]") {
  TempDir dir;
  const std::string path = dir.write("two_runs.yaml", two_runs_yaml());
  const ServingConfig c = load_serving_config(path, {"runs.1.kv.impl=static_contiguous"});
  REQUIRE(c.runs.size() == 2u);
  CHECK(c.runs[0].kv_impl == "paged_block_pool");
  CHECK(c.runs[1].kv_impl == "static_contiguous");
  CHECK(load_serving_config(path, {"runs.0.scheduler.max_num_seqs=8"}).runs[0].serve.max_num_seqs ==
        8u);
  CHECK(serving_error(path, {"runs.2.kv.impl=x"}) ==
        "--set runs.2.kv.impl=x: 'runs' has 2 entries (indexes from 0)");
  CHECK(serving_error(path, {"runs.kv.impl=x"}) ==
        "--set runs.kv.impl=x: 'runs' is a list: give an entry's index (e.g. runs.0.kv)");
  // An error inside an entry set from the command line names the flag.
  CHECK_THAT(serving_error(path, {"runs.0.kv.block_size=3x"}),
             Catch::Contains("(--set runs[0].kv.block_size)"));
}

TEST_CASE("--set of a key every run sets for itself is an error naming the runs",
          "[config][set][errors]") {
  TempDir dir;
  const std::string path = dir.write("two_runs.yaml", two_runs_yaml());
  CHECK(serving_error(path, {"kv.impl=static_contiguous"}) ==
        "--set kv.impl: every run sets its own kv (" + path + ":7: runs[0].kv; " + path +
            ":8: runs[1].kv), so it changes nothing; set it per run (--set runs.N.kv.impl=...)");
  // Only run a sets scheduler.max_num_seqs: b takes the top level's, so the --set applies.
  const ServingConfig c = load_serving_config(path, {"scheduler.max_num_seqs=8"});
  CHECK(c.runs[0].serve.max_num_seqs == 16u);
  CHECK(c.runs[1].serve.max_num_seqs == 8u);
  CHECK_THAT(serving_error(path, {"runs.1.scheduler.max_num_seqs=32", "scheduler.max_num_seqs=8"}),
             Catch::StartsWith("--set scheduler.max_num_seqs: every run sets its own "
                               "scheduler.max_num_seqs ("));
}

TEST_CASE("--unset removes a key, or names the closest one", "[config][set]") {
  TempDir dir;
  const std::string path = dir.write("two_runs.yaml", two_runs_yaml());
  ConfigNode root = ConfigNode::load_file(path);
  root.apply_unset("runs.0.scheduler");
  CHECK(load_serving_config(root).runs[0].serve.max_num_seqs == 64u);
  CHECK(serving_error(path, {}, {"scheduler.max_num_seq"}) ==
        "--unset scheduler.max_num_seq: no key 'max_num_seq' to remove (did you mean "
        "'max_num_seqs'?)");
  CHECK(serving_error(path, {}, {"runs.0"}) ==
        "--unset runs.0: a list entry cannot be removed; --set the whole list");
}
