// Config loading: every bad input gives one ConfigError naming the file, the line and the key
// path (and the closest valid key for a typo). Each case writes a copy of experiments/shapes.yaml
// (or of a gpu/model file) with one defect to a temp folder and checks the exact message.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "src/app/shapes_experiment.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/drivers/capture_runner.h"
#include "src/graph/registry.h"
#include "tests/config_test_util.h"

using namespace memsim;
using namespace memsim::test;  // NOLINT(google-build-using-namespace)
namespace fs = std::filesystem;

// ------------------------------------------------------------------------------------------
// The valid configs load, with the values the files give.

TEST_CASE("the shipped experiment loads with bare gpu/model names", "[config]") {
  const std::string path = (fs::path(source_root()) / "experiments" / "shapes.yaml").string();
  const ShapesConfig c = load_shapes_config(path, {});
  CHECK(c.source == path);
  CHECK(c.experiment == "shapes");
  CHECK(c.gpu.name == "h200");
  CHECK(c.gpu.capacity == 146591680ull * 1024ull);  // calibrated: cudaMemGetInfo total
  CHECK(c.gpu.granularity == 2097152ull);
  CHECK(c.gpu.va_space == 128ull * 1099511627776ull);
  // Fitted in context: the knee of the mappings term, and first calls after a launch.
  CHECK(c.gpu.va_mappings_knee == 1024);
  CHECK(c.gpu.cost(Primitive::kDeviceMalloc).first_after_launch_us > 0);
  CHECK(c.gpu.cost(Primitive::kLaunch).first_after_launch_us == 0);
  CHECK(c.model.name == "llama-3.1-8b");
  CHECK(c.model.layers == 32u);
  CHECK(c.model.heads == 32u);
  CHECK(c.model.kv_heads == 8u);
  CHECK(c.max_num_seqs == 256u);
  CHECK(c.capture_sizes == vllm_capture_sizes(256));
  REQUIRE(c.capture_sizes.size() == 51u);
  CHECK(c.capture_sizes.front() == 1u);
  CHECK(c.capture_sizes.back() == 512u);
  CHECK(c.gemm_workspace_bytes == 32ull * 1048576ull);
  CHECK(c.max_model_len == 8192u);
  CHECK(c.kv_block_size == 16u);
  CHECK(c.seed == 1u);
  CHECK(c.dynamic.arrivals == 2000u);
  CHECK(c.dynamic.mean_interarrival_us == 20000.0);
  std::vector<std::string> variants;
  for (const Variant& v : c.variants) variants.push_back(v.name());
  CHECK(variants == std::vector<std::string>{
                        "strong/fixed/full/persistent", "strong/fixed/full/per_shape",
                        "weak/fixed/full/persistent", "weak/fixed/full/per_shape",
                        "strong/dynamic/full/persistent", "strong/dynamic/full/per_shape",
                        "weak/dynamic/full/persistent", "weak/dynamic/full/per_shape",
                        "strong/fixed/piecewise/persistent", "strong/fixed/piecewise/per_shape",
                        "weak/fixed/piecewise/persistent", "weak/fixed/piecewise/per_shape",
                        "strong/dynamic/piecewise/persistent", "strong/dynamic/piecewise/per_shape",
                        "weak/dynamic/piecewise/persistent", "weak/dynamic/piecewise/per_shape"});
  CHECK(c.table.name() == "weak/fixed/full/persistent");
  CHECK_FALSE(c.timeseries_all);
  CHECK(labels(c) == std::vector<std::string>{"private_pools", "shared_pool",
                                              "shared_pool/large_first", "global_pool/large_first",
                                              "vmm_alias", "vmm_alias/fast", "graph_mem_nodes"});
  CHECK(c.strategies[2].order == CaptureOrder::kLargeFirst);
  CHECK(c.strategies[1].order == CaptureOrder::kArrival);
}

TEST_CASE("a copy referencing gpu/model by absolute path loads the same", "[config]") {
  TempDir dir;
  const ShapesConfig c = load_shapes_config(dir.write("shapes.yaml", shapes_yaml()), {});
  CHECK(c.gpu.name == "h200");
  CHECK(c.model.name == "llama-3.1-8b");
  CHECK(c.capture_sizes.size() == 51u);
  CHECK(c.strategies.size() == 7u);
}

TEST_CASE("bare gpu/model names resolve under MEMSIM_ROOT", "[config]") {
  TempDir dir;
  const std::string path = dir.write("bare.yaml", shapes_yaml_bare());
  ScopedEnv env("MEMSIM_ROOT", source_root());
  const ShapesConfig c = load_shapes_config(path, {});
  CHECK(c.gpu.name == "h200");
  CHECK(c.model.name == "llama-3.1-8b");
  CHECK(c.model.kv_heads == 8u);
}

TEST_CASE("explicit capture_sizes, order lists and labels load", "[config]") {
  TempDir dir;
  std::string t = shapes_yaml();
  t = replace_once(t, "\nmax_num_seqs: 256", "\ncapture_sizes: [1, 2, 4, 8]");
  t = replace_once(t, "  - impl: graph_mem_nodes\n",
                   "  - impl: graph_mem_nodes\n    order: list\n    order_list: [8, 1, 4, 2]\n"
                   "  - impl: private_pools\n    label: private_again\n");
  const ShapesConfig c = load_shapes_config(dir.write("ok.yaml", t), {});
  CHECK(c.capture_sizes == std::vector<uint32_t>{1, 2, 4, 8});
  CHECK(c.max_num_seqs == 0u);
  REQUIRE(c.strategies.size() == 8u);
  CHECK(c.strategies[6].label == "graph_mem_nodes/list");
  CHECK(c.strategies[6].order == CaptureOrder::kList);
  CHECK(c.strategies[6].order_list == std::vector<uint32_t>{8, 1, 4, 2});
  CHECK(c.strategies[7].label == "private_again");
  CHECK(c.strategies[7].impl == "private_pools");
}

// ------------------------------------------------------------------------------------------
// Unknown keys: the closest valid key is named.

TEST_CASE("a typo'd top-level key names the closest valid key", "[config][errors]") {
  TempDir dir;
  const std::string t = replace_once(shapes_yaml(), "\nmax_num_seqs: 256", "\nmax_num_seq: 256");
  expect_error(dir, "typo_top.yaml", t, line_of(t, "max_num_seq:"), "max_num_seq",
               "unknown key 'max_num_seq' (did you mean 'max_num_seqs'?)");
}

TEST_CASE("a typo'd key inside sweep has the key path sweep.output", "[config][errors]") {
  TempDir dir;
  const std::string t =
      replace_once(shapes_yaml(), "\n  outputs: [strong, weak]", "\n  output: [strong, weak]");
  expect_error(dir, "typo_sweep.yaml", t, line_of(t, "  output:"), "sweep.output",
               "unknown key 'output' (did you mean 'outputs'?)");
}

TEST_CASE("a typo'd strategy parameter names the strategy's own keys", "[config][errors]") {
  TempDir dir;
  const std::string t =
      replace_once(shapes_yaml(), "    handle_bytes: 2MiB", "    handle_byte: 2MiB");
  expect_error(dir, "typo_param.yaml", t, line_of(t, "    handle_byte:"),
               "strategies[4].handle_byte",
               "unknown key 'handle_byte' (did you mean 'handle_bytes'?)");
}

TEST_CASE("a parameter of another implementation is an unknown key", "[config][errors]") {
  TempDir dir;
  // trim_at_teardown belongs to graph_mem_nodes, not to private_pools.
  const std::string t = replace_once(shapes_yaml(), "  - impl: private_pools\n",
                                     "  - impl: private_pools\n    trim_at_teardown: true\n");
  expect_error(dir, "foreign_param.yaml", t, line_of(t, "    trim_at_teardown:"),
               "strategies[0].trim_at_teardown",
               "unknown key 'trim_at_teardown' (valid keys: impl, label, order, order_list, "
               "max_split_size)");
}

TEST_CASE("an unknown impl names the closest implementation", "[config][errors]") {
  TempDir dir;
  const std::string t = replace_once(shapes_yaml(), "  - impl: vmm_alias\n    handle_bytes",
                                     "  - impl: vmm_alais\n    handle_bytes");
  expect_error(dir, "impl.yaml", t, line_of(t, "  - impl: vmm_alais"), "strategies[4].impl",
               fmt::format("'vmm_alais' is not one of: {} (did you mean 'vmm_alias'?)",
                           fmt::join(graph_strategies().names(), ", ")));
}

TEST_CASE("an unknown key far from every valid one lists the valid keys", "[config][errors]") {
  TempDir dir;
  const std::string t = replace_once(shapes_yaml(), "\nseed: 1", "\nseed: 1\nzzz: 3");
  expect_error(dir, "far.yaml", t, line_of(t, "zzz:"), "zzz",
               "unknown key 'zzz' (valid keys: experiment, gpu, model, max_num_seqs, "
               "capture_sizes, gemm_workspace, max_model_len, kv_block_size, seed, dynamic, "
               "sweep, table, timeseries, strategies, graph_body, input_set, program, "
               "export_snapshots, validation_rounds, grid)");
}

TEST_CASE("input_set: xllm is refused with the executor's graph body", "[config][errors]") {
  TempDir dir;
  const std::string t = replace_once(
      replace_once(shapes_yaml(), "\ninput_set: xllm", "\ngraph_body: executor\ninput_set: xllm"),
      "graphs: [full, piecewise]", "graphs: full");
  expect_error(dir, "xllm.yaml", t, line_of(t, "input_set: xllm"), "input_set",
               "input_set: xllm needs graph_body: fill (the executor writes its own inputs); set "
               "input_set: program");
}

// ------------------------------------------------------------------------------------------
// Bad enum values.

TEST_CASE("a bad enum value in a sweep list names its index", "[config][errors]") {
  TempDir dir;
  const std::string t =
      replace_once(shapes_yaml(), "arrival: [fixed, dynamic]", "arrival: [fixed, dynamc]");
  expect_error(dir, "enum_sweep.yaml", t, line_of(t, "  arrival: [fixed, dynamc]"),
               "sweep.arrival[1]",
               "'dynamc' is not one of: fixed, dynamic (did you mean 'dynamic'?)");
}

TEST_CASE("a bad enum value in the table slice", "[config][errors]") {
  TempDir dir;
  const std::string t = replace_once(shapes_yaml(), "\n  outputs: weak\n", "\n  outputs: waek\n");
  expect_error(dir, "enum_table.yaml", t, line_of(t, "  outputs: waek"), "table.outputs",
               "'waek' is not one of: strong, weak (did you mean 'weak'?)");
}

TEST_CASE("a bad capture order and a bad timeseries choice", "[config][errors]") {
  TempDir dir;
  SECTION("order") {
    const std::string t =
        replace_once(shapes_yaml(), "    order: arrival\n", "    order: large_frist\n");
    expect_error(dir, "order.yaml", t, line_of(t, "    order: large_frist"), "strategies[1].order",
                 "'large_frist' is not one of: arrival, large_first, list (did you mean "
                 "'large_first'?)");
  }
  SECTION("timeseries") {
    const std::string t = replace_once(shapes_yaml(), "\ntimeseries: table", "\ntimeseries: tabel");
    expect_error(dir, "timeseries.yaml", t, line_of(t, "timeseries:"), "timeseries",
                 "'tabel' is not one of: table, all (did you mean 'table'?)");
  }
  SECTION("experiment") {
    const std::string t =
        replace_once(shapes_yaml(), "\nexperiment: shapes", "\nexperiment: graphs");
    expect_error(dir, "experiment.yaml", t, line_of(t, "experiment:"), "experiment",
                 "'graphs' is not one of: shapes");
  }
}

// ------------------------------------------------------------------------------------------
// Wrong types, out-of-range values, bad byte sizes.

TEST_CASE("a wrong type: seed: abc", "[config][errors]") {
  TempDir dir;
  const std::string t = replace_once(shapes_yaml(), "\nseed: 1", "\nseed: abc");
  expect_error(dir, "seed.yaml", t, line_of(t, "seed:"), "seed", "expected an integer, got 'abc'");
}

TEST_CASE("wrong container types", "[config][errors]") {
  TempDir dir;
  SECTION("a map where a value is expected") {
    const std::string t = replace_once(shapes_yaml(), "\nseed: 1", "\nseed: {a: 1}");
    expect_error(dir, "seed_map.yaml", t, line_of(t, "seed:"), "seed", "expected a single value");
  }
  SECTION("a scalar where a list is expected") {
    const std::string t = replace_once(shapes_yaml(), "\nmax_num_seqs: 256", "\ncapture_sizes: 8");
    expect_error(dir, "sizes_scalar.yaml", t, line_of(t, "capture_sizes:"), "capture_sizes",
                 "expected a list");
  }
  SECTION("a scalar where a map is expected") {
    std::string t = shapes_yaml();
    const size_t from = t.find("\nsweep:");
    const size_t to = t.find("\ntable:");
    t = t.substr(0, from) + "\nsweep: 3" + t.substr(to);
    expect_error(dir, "sweep_scalar.yaml", t, line_of(t, "sweep:"), "sweep",
                 "expected a map of keys");
  }
  SECTION("a strategy that is not a map") {
    const std::string t =
        replace_once(shapes_yaml(), "  - impl: private_pools\n", "  - private_pools\n");
    expect_error(dir, "strategy_scalar.yaml", t, line_of(t, "  - private_pools"), "strategies[0]",
                 "each strategy is a map with at least 'impl'");
  }
  SECTION("a bool that is not a bool") {
    const std::string t = replace_once(shapes_yaml(), "  - impl: graph_mem_nodes\n",
                                       "  - impl: graph_mem_nodes\n    trim_at_teardown: maybe\n");
    expect_error(dir, "bool.yaml", t, line_of(t, "    trim_at_teardown:"),
                 "strategies[6].trim_at_teardown", "expected true or false, got 'maybe'");
  }
}

TEST_CASE("an out-of-range value: kv_block_size: 0", "[config][errors]") {
  TempDir dir;
  const std::string t = replace_once(shapes_yaml(), "\nkv_block_size: 16", "\nkv_block_size: 0");
  expect_error(dir, "kv.yaml", t, line_of(t, "kv_block_size:"), "kv_block_size",
               "0 is out of range [1, 65536]");
}

TEST_CASE("more out-of-range values", "[config][errors]") {
  TempDir dir;
  SECTION("max_num_seqs") {
    const std::string t =
        replace_once(shapes_yaml(), "\nmax_num_seqs: 256", "\nmax_num_seqs: 100000");
    expect_error(dir, "mns.yaml", t, line_of(t, "max_num_seqs:"), "max_num_seqs",
                 "100000 is out of range [1, 65536]");
  }
  SECTION("a negative integer") {
    const std::string t = replace_once(shapes_yaml(), "\nseed: 1", "\nseed: -1");
    expect_error(dir, "neg.yaml", t, line_of(t, "seed:"), "seed",
                 "expected a non-negative integer, got -1");
  }
  SECTION("a double") {
    const std::string t =
        replace_once(shapes_yaml(), "  mean_interarrival_us: 20000", "  mean_interarrival_us: 0");
    expect_error(dir, "mean.yaml", t, line_of(t, "  mean_interarrival_us:"),
                 "dynamic.mean_interarrival_us",
                 fmt::format("0 is out of range [{}, {}]", 1e-3, 1e12));
  }
  SECTION("va_factor") {
    const std::string t =
        replace_once(shapes_yaml(), "    handle_bytes: 2MiB", "    va_factor: 100");
    expect_error(dir, "va.yaml", t, line_of(t, "    va_factor:"), "strategies[4].va_factor",
                 fmt::format("100 is out of range [{}, {}]", 0.01, 64.0));
  }
  SECTION("a capture size of 0") {
    const std::string t =
        replace_once(shapes_yaml(), "\nmax_num_seqs: 256", "\ncapture_sizes: [4, 0]");
    expect_error(dir, "size0.yaml", t, line_of(t, "capture_sizes:"), "capture_sizes[1]",
                 "0 is out of range [1, 65536]");
  }
  SECTION("handle_bytes: 0") {
    const std::string t =
        replace_once(shapes_yaml(), "    handle_bytes: 2MiB", "    handle_bytes: 0");
    expect_error(dir, "hb0.yaml", t, line_of(t, "    handle_bytes:"), "strategies[4].handle_bytes",
                 "must be positive (a multiple of the GPU's granularity)");
  }
}

TEST_CASE("a bad byte size: gemm_workspace: 3 parsecs", "[config][errors]") {
  TempDir dir;
  const std::string t =
      replace_once(shapes_yaml(), "\ngemm_workspace: 32MiB", "\ngemm_workspace: 3 parsecs");
  expect_error(dir, "bytes.yaml", t, line_of(t, "gemm_workspace:"), "gemm_workspace",
               "unknown unit 'parsecs' in '3 parsecs' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
}

TEST_CASE("more bad byte sizes", "[config][errors]") {
  TempDir dir;
  SECTION("no number") {
    const std::string t =
        replace_once(shapes_yaml(), "\ngemm_workspace: 32MiB", "\ngemm_workspace: lots");
    expect_error(dir, "b1.yaml", t, line_of(t, "gemm_workspace:"), "gemm_workspace",
                 "expected a byte size like 4096, 2MiB or 1.5GiB, got 'lots'");
  }
  SECTION("a fraction of a byte") {
    const std::string t =
        replace_once(shapes_yaml(), "\ngemm_workspace: 32MiB", "\ngemm_workspace: 0.5B");
    expect_error(dir, "b2.yaml", t, line_of(t, "gemm_workspace:"), "gemm_workspace",
                 "'0.5B' is not a whole, non-negative number of bytes");
  }
  SECTION("negative") {
    const std::string t =
        replace_once(shapes_yaml(), "\ngemm_workspace: 32MiB", "\ngemm_workspace: -1MiB");
    expect_error(dir, "b3.yaml", t, line_of(t, "gemm_workspace:"), "gemm_workspace",
                 "'-1MiB' is not a whole, non-negative number of bytes");
  }
  SECTION("a strategy's byte size") {
    const std::string t =
        replace_once(shapes_yaml(), "    handle_bytes: 2MiB", "    handle_bytes: 2 mib");
    expect_error(dir, "b4.yaml", t, line_of(t, "    handle_bytes:"), "strategies[4].handle_bytes",
                 "unknown unit 'mib' in '2 mib' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  }
}

// ------------------------------------------------------------------------------------------
// Missing keys and cross-key rules.

TEST_CASE("a missing required key: strategies removed", "[config][errors]") {
  TempDir dir;
  std::string t = shapes_yaml();
  t = t.substr(0, t.find("\nstrategies:") + 1);
  const std::string path = dir.write("nostrat.yaml", t);
  const std::string got = load_error(path);
  CHECK_THAT(got, Catch::Contains("missing required key 'strategies'"));
  // The root map has no key path; the line is where the map starts.
  CHECK(got == fmt::format("{}:{}: missing required key 'strategies'", path, first_key_line(t)));
}

// Regression: yaml-cpp marks an empty value at the next token; the error must name the key's line.
TEST_CASE("a key with no value", "[config][errors]") {
  TempDir dir;
  const std::string t = replace_once(shapes_yaml(), "  - impl: private_pools\n", "  - impl:\n");
  expect_error(dir, "noval.yaml", t, line_of(t, "  - impl:"), "strategies[0].impl", "has no value");
}

TEST_CASE("neither max_num_seqs nor capture_sizes", "[config][errors]") {
  TempDir dir;
  std::string t = replace_once(shapes_yaml(), "\nmax_num_seqs: 256", "");
  const std::string path = dir.write("nosizes.yaml", t);
  CHECK(load_error(path) ==
        fmt::format("{}:{}: missing required key 'max_num_seqs'", path, first_key_line(t)));
}

TEST_CASE("both capture_sizes and max_num_seqs", "[config][errors]") {
  TempDir dir;
  const std::string t = replace_once(shapes_yaml(), "\nmax_num_seqs: 256",
                                     "\nmax_num_seqs: 256\ncapture_sizes: [1, 2, 4]");
  expect_error(dir, "both.yaml", t, line_of(t, "capture_sizes:"), "capture_sizes",
               "give either capture_sizes or max_num_seqs, not both");
}

TEST_CASE("repeated capture sizes", "[config][errors]") {
  TempDir dir;
  const std::string t =
      replace_once(shapes_yaml(), "\nmax_num_seqs: 256", "\ncapture_sizes: [1, 2, 2]");
  expect_error(dir, "repeat.yaml", t, line_of(t, "capture_sizes:"), "capture_sizes",
               "capture sizes must be distinct");
}

TEST_CASE("order_list rules", "[config][errors]") {
  TempDir dir;
  SECTION("not a permutation of the capture sizes") {
    const std::string t =
        replace_once(shapes_yaml(), "  - impl: graph_mem_nodes\n",
                     "  - impl: graph_mem_nodes\n    order: list\n    order_list: [1, 2, 4]\n");
    expect_error(dir, "perm.yaml", t, line_of(t, "    order_list:"), "strategies[6].order_list",
                 "must be a permutation of the capture sizes");
  }
  SECTION("a permutation with a repeat") {
    std::string t =
        replace_once(shapes_yaml(), "\nmax_num_seqs: 256", "\ncapture_sizes: [1, 2, 4]");
    t = replace_once(t, "  - impl: graph_mem_nodes\n",
                     "  - impl: graph_mem_nodes\n    order: list\n    order_list: [4, 2, 2]\n");
    expect_error(dir, "perm2.yaml", t, line_of(t, "    order_list:"), "strategies[6].order_list",
                 "must be a permutation of the capture sizes");
  }
  SECTION("order_list without order: list") {
    const std::string t = replace_once(shapes_yaml(), "  - impl: graph_mem_nodes\n",
                                       "  - impl: graph_mem_nodes\n    order_list: [1, 2, 4]\n");
    expect_error(dir, "nolist.yaml", t, line_of(t, "    order_list:"), "strategies[6].order_list",
                 "order_list needs 'order: list'");
  }
  SECTION("order: list without order_list") {
    const std::string t = replace_once(shapes_yaml(), "  - impl: graph_mem_nodes\n",
                                       "  - impl: graph_mem_nodes\n    order: list\n");
    expect_error(dir, "nolist2.yaml", t, line_of(t, "  - impl: graph_mem_nodes"), "strategies[6]",
                 "'order: list' needs an 'order_list'");
  }
}

TEST_CASE("duplicate strategy labels", "[config][errors]") {
  TempDir dir;
  SECTION("the same impl twice") {
    const std::string t = shapes_yaml() + "  - impl: private_pools\n";
    const int line = static_cast<int>(std::count(t.begin(), t.end(), '\n'));  // the last line
    expect_error(dir, "dup.yaml", t, line, "strategies[7]",
                 "duplicate strategy label 'private_pools' (set 'label' to tell them apart)");
  }
  SECTION("an explicit label equal to a derived one") {
    const std::string t = shapes_yaml() + "  - impl: shared_pool\n    label: graph_mem_nodes\n";
    expect_error(dir, "dup2.yaml", t, line_of(t, "    label: graph_mem_nodes") - 1, "strategies[7]",
                 "duplicate strategy label 'graph_mem_nodes' (set 'label' to tell them apart)");
  }
}

TEST_CASE("a table slice that is not in the sweep", "[config][errors]") {
  TempDir dir;
  const std::string t = replace_once(shapes_yaml(), "\n  graphs: full\n", "\n  graphs: both\n");
  // A block map is located at its first entry, the line after "table:".
  expect_error(dir, "table.yaml", t, line_of(t, "table:") + 1, "table",
               "the table slice weak/fixed/both/persistent is not part of the sweep");
}

TEST_CASE("an empty sweep axis and an empty strategy list", "[config][errors]") {
  TempDir dir;
  SECTION("axis") {
    const std::string t =
        replace_once(shapes_yaml(), "  inputs: [persistent, per_shape]", "  inputs: []");
    expect_error(dir, "axis.yaml", t, line_of(t, "  inputs: []"), "sweep.inputs",
                 "must list at least one value");
  }
  SECTION("strategies") {
    std::string t = shapes_yaml();
    t = t.substr(0, t.find("\nstrategies:")) + "\nstrategies: []\n";
    expect_error(dir, "nostrats.yaml", t, line_of(t, "strategies:"), "strategies",
                 "must list at least one strategy");
  }
}

// ------------------------------------------------------------------------------------------
// YAML syntax errors and unreadable files.

TEST_CASE("a YAML syntax error reports its line", "[config][errors]") {
  TempDir dir;
  const std::string t = replace_once(shapes_yaml(), "\nseed: 1", "\nseed: 1: 2");
  const std::string path = dir.write("syntax.yaml", t);
  CHECK(load_error(path) ==
        fmt::format("{}:{}: YAML syntax error: illegal map value", path, line_of(t, "seed:")));
}

TEST_CASE("an unclosed flow list is a syntax error with a line", "[config][errors]") {
  TempDir dir;
  const std::string t = replace_once(shapes_yaml(), "\nkv_block_size: 16", "\nkv_block_size: [16");
  const std::string path = dir.write("syntax2.yaml", t);
  const std::string got = load_error(path);
  // yaml-cpp notices the missing ']' on the line after.
  CHECK(got == fmt::format("{}:{}: YAML syntax error: end of sequence flow not found", path,
                           line_of(t, "kv_block_size:") + 1));
}

TEST_CASE("an empty or non-map experiment file", "[config][errors]") {
  TempDir dir;
  SECTION("empty") {
    const std::string path = dir.write("empty.yaml", "");
    CHECK(load_error(path) ==
          path + ": no YAML content (only comments or blank lines); expected a map of keys");
  }
  SECTION("only comments") {
    const std::string path = dir.write("comments.yaml", "# a comment\n\n  # another\n");
    CHECK(load_error(path) ==
          path + ": no YAML content (only comments or blank lines); expected a map of keys");
  }
  SECTION("a list") {
    const std::string path = dir.write("list.yaml", "- a\n- b\n");
    CHECK(load_error(path) == path + ":1: expected a map of keys");
  }
}

TEST_CASE("an experiment file that does not exist", "[config][errors]") {
  TempDir dir;
  const std::string path = (dir.path() / "absent.yaml").string();
  CHECK(load_error(path) == path + ": cannot open file");
}

// ------------------------------------------------------------------------------------------
// Referenced gpu/model files: missing, and their own errors.

TEST_CASE("a referenced model file that does not exist", "[config][errors]") {
  TempDir dir;
  SECTION("by path") {
    const std::string absent = (dir.path() / "nomodel.yaml").string();
    const std::string t =
        replace_once(shapes_yaml(), "\nmodel: " + model_file(), "\nmodel: " + absent);
    expect_error(dir, "m.yaml", t, line_of(t, "model:"), "model",
                 fmt::format("cannot find models config '{}' (looked in {})", absent, absent));
  }
  SECTION("by bare name under MEMSIM_ROOT: the known names, the closest first") {
    ScopedEnv env("MEMSIM_ROOT", source_root());
    const std::string t =
        replace_once(shapes_yaml(), "\nmodel: " + model_file(), "\nmodel: llama-9-9b");
    const std::string path = dir.write("m2.yaml", t);
    const std::string got = load_error(path, {});
    const std::string known = (fs::path(source_root()) / "configs" / "models").lexically_normal();
    CHECK_THAT(got, Catch::StartsWith(fmt::format(
                        "{}:{}: model: unknown models config 'llama-9-9b' (did you mean "
                        "'llama-3.1-8b'?); known in {}: ",
                        path, line_of(t, "model:"), known)));
    CHECK_THAT(got, Catch::Contains("llama-3.1-70b, llama-3.1-8b"));
  }
  SECTION("a gpu by bare name") {
    ScopedEnv env("MEMSIM_ROOT", source_root());
    const std::string t = replace_once(shapes_yaml(), "\ngpu: " + gpu_file(), "\ngpu: h201");
    const std::string path = dir.write("g.yaml", t);
    const std::string known = (fs::path(source_root()) / "configs" / "gpus").lexically_normal();
    CHECK_THAT(load_error(path, {}),
               Catch::StartsWith(fmt::format("{}:{}: gpu: unknown gpus config 'h201' (did you "
                                             "mean 'h200'?); known in {}: h100, h200",
                                             path, line_of(t, "gpu:"), known)));
  }
  SECTION("a name longer than the OS allows (found by fuzz_config)") {
    ScopedEnv env("MEMSIM_ROOT", source_root());
    const std::string name(300, 'x');
    const std::string t =
        replace_once(shapes_yaml(), "\nmodel: " + model_file(), "\nmodel: " + name);
    const std::string path = dir.write("long.yaml", t);
    const std::string got = load_error(path, {});
    CHECK_THAT(got,
               Catch::StartsWith(fmt::format("{}:{}: model: unknown models config '{}'; known in ",
                                             path, line_of(t, "model:"), name)));
    CHECK_THAT(got, Catch::EndsWith(": File name too long"));
  }
}

TEST_CASE("a model file's own errors name the model file", "[config][errors]") {
  TempDir dir;
  const std::string model = read_text(model_file());
  auto check = [&](const std::string& bad_model, const std::string& prefix,
                   const std::string& key_path, const std::string& message) {
    const std::string mpath = dir.write("bad_model.yaml", bad_model);
    const std::string t =
        replace_once(shapes_yaml(), "\nmodel: " + model_file(), "\nmodel: " + mpath);
    const std::string got = load_error(dir.write("uses_bad_model.yaml", t));
    const int line = prefix.empty() ? first_key_line(bad_model) : line_of(bad_model, prefix);
    if (key_path.empty())
      CHECK(got == fmt::format("{}:{}: {}", mpath, line, message));
    else
      CHECK(got == located(mpath, line, key_path, message));
  };
  SECTION("kv_heads must divide heads") {
    check(replace_once(model, "\nkv_heads: 8", "\nkv_heads: 7"), "kv_heads:", "kv_heads",
          "must divide heads");
  }
  SECTION("a typo") {
    check(replace_once(model, "\nhead_dim: 128", "\nhead_dm: 128"), "head_dm:", "head_dm",
          "unknown key 'head_dm' (did you mean 'head_dim'?)");
  }
  SECTION("a bad dtype") {
    check(replace_once(model, "\ndtype: bf16", "\ndtype: bf61"), "dtype:", "dtype",
          "'bf61' is not one of: bf16, fp16, fp32, fp8 (did you mean 'bf16'?)");
  }
  SECTION("a missing key") {
    check(replace_once(model, "\nvocab: 128256", ""), "", "", "missing required key 'vocab'");
  }
  SECTION("a wrong type") {
    check(replace_once(model, "\nqkv_bias: false", "\nqkv_bias: 0"), "qkv_bias:", "qkv_bias",
          "expected true or false, got '0'");
  }
}

TEST_CASE("a gpu file's own errors name the gpu file", "[config][errors]") {
  TempDir dir;
  const std::string gpu = read_text(gpu_file());
  auto check = [&](const std::string& bad_gpu, const std::string& prefix,
                   const std::string& key_path, const std::string& message) {
    const std::string gpath = dir.write("bad_gpu.yaml", bad_gpu);
    const std::string t = replace_once(shapes_yaml(), "\ngpu: " + gpu_file(), "\ngpu: " + gpath);
    const std::string got = load_error(dir.write("uses_bad_gpu.yaml", t));
    CHECK(got == located(gpath, line_of(bad_gpu, prefix), key_path, message));
  };
  SECTION("granularity not a power of two") {
    check(replace_once(gpu, "\ngranularity: 2MiB", "\ngranularity: 3MiB"),
          "granularity:", "granularity", "must be a power of two");
  }
  SECTION("va_space below capacity") {
    check(replace_once(gpu, "\nva_space: 128TiB", "\nva_space: 1GiB"), "va_space:", "va_space",
          "must be at least the capacity");
  }
  SECTION("a knee out of range") {
    check(replace_once(gpu, "\nva_mappings_knee: 1024.0", "\nva_mappings_knee: 0"),
          "va_mappings_knee:", "va_mappings_knee", "0 is out of range [0.001, 1000000000]");
  }
  SECTION("a typo'd primitive") {
    check(replace_once(gpu, "\n  map: {", "\n  mapp: {"), "  mapp:", "costs.mapp",
          "unknown key 'mapp' (did you mean 'map'?)");
  }
  SECTION("a typo'd cost term") {
    check(replace_once(gpu, "  launch: {per_call_us:", "  launch: {per_cal_us:"),
          "  launch:", "costs.launch.per_cal_us",
          "unknown key 'per_cal_us' (did you mean 'per_call_us'?)");
  }
  SECTION("a bad capacity") {
    check(replace_once(gpu, "\ncapacity: 146591680KiB", "\ncapacity: 143771 MiBs"),
          "capacity:", "capacity",
          "unknown unit 'MiBs' in '143771 MiBs' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  }
  SECTION("a missing graphs key") {
    std::string bad = gpu;
    const size_t from = bad.find("\n  upload_per_node_us:");
    bad.erase(from, bad.find('\n', from + 1) - from);
    // A block map is located at its first entry.
    check(bad, "  capture_per_node_us:", "graphs", "missing required key 'upload_per_node_us'");
  }
}
