// ConfigNode on its own: typed conversions, byte sizes, locations, lookups and --set overrides.
#include <catch2/catch.hpp>

#include <fmt/format.h>
#include <functional>
#include <string>
#include <vector>

#include "src/config/config_node.h"
#include "tests/temp_dir.h"

using namespace memsim;
using memsim::test::TempDir;

namespace {

ConfigNode value_node(const std::string& yaml_value) {
  return ConfigNode::parse("v: " + yaml_value, "<test>")["v"];
}

std::string node_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("expected a ConfigError");
  return {};
}

}  // namespace

TEST_CASE("ConfigNode::as_bytes", "[config_node]") {
  CHECK(value_node("2MiB").as_bytes() == 2097152u);
  CHECK(value_node("1.5GiB").as_bytes() == 1610612736u);
  CHECK(value_node("4096").as_bytes() == 4096u);
  CHECK(value_node("0").as_bytes() == 0u);
  CHECK(value_node("1e3").as_bytes() == 1000u);    // std::stod reads exponents
  CHECK(value_node("1 KiB").as_bytes() == 1024u);  // spaces before the unit are ignored
  CHECK(value_node("1KB").as_bytes() == 1000u);
  CHECK(value_node("3MB").as_bytes() == 3000000u);
  CHECK(value_node("2GB").as_bytes() == 2000000000u);
  CHECK(value_node("1TB").as_bytes() == 1000000000000u);
  CHECK(value_node("7B").as_bytes() == 7u);
  CHECK(value_node("128TiB").as_bytes() == 140737488355328u);
  CHECK(value_node("143771MiB").as_bytes() == 150754820096u);
  CHECK(node_error([] { value_node("2mib").as_bytes(); }) ==
        "<test>:1: v: unknown unit 'mib' in '2mib' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  CHECK(node_error([] { value_node("abc").as_bytes(); }) ==
        "<test>:1: v: expected a byte size like 4096, 2MiB or 1.5GiB, got 'abc'");
  CHECK(node_error([] { value_node("1.5B").as_bytes(); }) ==
        "<test>:1: v: '1.5B' is not a whole, non-negative number of bytes");
  CHECK(node_error([] { value_node("-4096").as_bytes(); }) ==
        "<test>:1: v: '-4096' is not a whole, non-negative number of bytes");
  CHECK(node_error([] { value_node("1e20").as_bytes(); }) ==
        "<test>:1: v: '1e20' is not a whole, non-negative number of bytes");
  CHECK(node_error([] { value_node("[1, 2]").as_bytes(); }) ==
        "<test>:1: v: expected a single value");
}

// Regression: plain integers must not go through a double (rounded above 2^53).
TEST_CASE("ConfigNode::as_bytes keeps large integers exact", "[config_node]") {
  CHECK(value_node("9007199254740993").as_bytes() == 9007199254740993ull);
}

TEST_CASE("ConfigNode integer, double, bool and choice conversions", "[config_node]") {
  CHECK(value_node("42").as_int() == 42);
  CHECK(value_node("-3").as_int() == -3);
  CHECK(value_node("0x10").as_int() == 16);  // std::stoll base 0 reads hex
  CHECK(value_node("42").as_uint() == 42u);
  CHECK(node_error([] { value_node("1.5").as_int(); }) ==
        "<test>:1: v: expected an integer, got '1.5'");
  CHECK(node_error([] { value_node("12abc").as_int(); }) ==
        "<test>:1: v: expected an integer, got '12abc'");
  CHECK(node_error([] { value_node("99999999999999999999").as_int(); }) ==
        "<test>:1: v: expected an integer, got '99999999999999999999'");
  CHECK(node_error([] { value_node("-1").as_uint(); }) ==
        "<test>:1: v: expected a non-negative integer, got -1");
  CHECK(value_node("1e3").as_double() == 1000.0);
  CHECK(value_node("0.25").as_double() == 0.25);
  CHECK(node_error([] { value_node("nan").as_double(); }) ==
        "<test>:1: v: expected a number, got 'nan'");
  CHECK(node_error([] { value_node("inf").as_double(); }) ==
        "<test>:1: v: expected a number, got 'inf'");
  for (const char* t : {"true", "yes", "on"}) CHECK(value_node(t).as_bool());
  for (const char* f : {"false", "no", "off"}) CHECK_FALSE(value_node(f).as_bool());
  CHECK(node_error([] { value_node("1").as_bool(); }) ==
        "<test>:1: v: expected true or false, got '1'");
  CHECK(value_node("b").as_choice({"a", "b"}) == "b");
  CHECK(node_error([] {
          value_node("bb").as_choice({"a", "b"});
        }) == "<test>:1: v: 'bb' is not one of: a, b (did you mean 'b'?)");
  CHECK(node_error([] {
          value_node("zzzzzz").as_choice({"a", "b"});
        }) == "<test>:1: v: 'zzzzzz' is not one of: a, b");
  CHECK(value_node("5").as_uint_in(5, 5) == 5u);
  CHECK(node_error([] { value_node("6").as_uint_in(1, 5); }) ==
        "<test>:1: v: 6 is out of range [1, 5]");
  CHECK(value_node("0.5").as_double_in(0, 1) == 0.5);
  CHECK(node_error([] { value_node("1.5").as_double_in(0, 1); }) ==
        "<test>:1: v: 1.5 is out of range [0, 1]");
}

// Regression: a leading zero is decimal, as in YAML 1.2 ("010" is 10, not octal 8).
TEST_CASE("ConfigNode::as_int reads leading zeros as decimal", "[config_node]") {
  CHECK(value_node("010").as_int() == 10);
  CHECK(value_node("08192").as_int() == 8192);
}

TEST_CASE("ConfigNode locations, keys and lookups", "[config_node]") {
  const ConfigNode root = ConfigNode::parse(
      "# comment\n"
      "alpha: 1\n"
      "beta:\n"
      "  gamma: [10, 20]\n"
      "  delta: x\n"
      "empty:\n",
      "cfg.yaml");
  CHECK(root.file() == "cfg.yaml");
  CHECK(root.path().empty());
  CHECK(root.line() == 2);
  CHECK(root.where() == "cfg.yaml:2");
  CHECK(root.keys() == std::vector<std::string>{"alpha", "beta", "empty"});
  CHECK(root.has("beta"));
  CHECK_FALSE(root.has("zeta"));
  CHECK_FALSE(root.find("zeta").has_value());
  const ConfigNode beta = root["beta"];
  CHECK(beta.is_map());
  CHECK(beta.path() == "beta");
  const std::vector<ConfigNode> items = beta["gamma"].items();
  REQUIRE(items.size() == 2u);
  CHECK(items[1].path() == "beta.gamma[1]");
  CHECK(items[1].line() == 4);
  CHECK(items[1].where() == "cfg.yaml:4: beta.gamma[1]");
  CHECK(items[1].as_uint() == 20u);
  CHECK(beta["delta"].where() == "cfg.yaml:5: beta.delta");
  CHECK(node_error([&] { root["zeta"]; }) == "cfg.yaml:2: missing required key 'zeta'");
  CHECK(node_error([&] { beta["zeta"]; }) == "cfg.yaml:4: beta: missing required key 'zeta'");
  CHECK_THAT(node_error([&] { root["empty"]; }), Catch::EndsWith(" empty: has no value"));
  CHECK(node_error([&] { root["alpha"].items(); }) == "cfg.yaml:2: alpha: expected a list");
  CHECK(node_error([&] { root["alpha"].keys(); }) == "cfg.yaml:2: alpha: expected a map of keys");
  CHECK(node_error([&] { beta.as_string(); }) == "cfg.yaml:4: beta: expected a single value");
  CHECK(node_error([&] { beta["delta"].fail("custom"); }) == "cfg.yaml:5: beta.delta: custom");
  CHECK_NOTHROW(beta.expect_keys({"gamma", "delta"}));
  CHECK(node_error([&] {
          beta.expect_keys({"gamma", "delta_x"});
        }) == "cfg.yaml:5: beta.delta: unknown key 'delta' (did you mean 'delta_x'?)");
  CHECK(node_error([&] { beta.expect_keys({"gamma"}); }) ==
        "cfg.yaml:5: beta.delta: unknown key 'delta' (valid keys: gamma)");
  CHECK(node_error([&] { root["alpha"].expect_keys({"x"}); }) ==
        "cfg.yaml:2: alpha: expected a map of keys");
}

// Regression: an empty value is located at its key's line, not the next token's.
TEST_CASE("ConfigNode locates an empty value at its key", "[config_node]") {
  const ConfigNode root = ConfigNode::parse("a: 1\nempty:\nb: 2\n", "cfg.yaml");
  CHECK(node_error([&] { root["empty"]; }) == "cfg.yaml:2: empty: has no value");
}

TEST_CASE("ConfigNode::parse and load_file report syntax errors and missing files",
          "[config_node]") {
  CHECK(node_error([] { ConfigNode::parse("a: 1\nb: [1, 2\nc: 3\n", "x.yaml"); }) ==
        "x.yaml:3: YAML syntax error: end of sequence flow not found");
  CHECK(node_error([] { ConfigNode::parse("a: 1\nb: 1: 2\n", "x.yaml"); }) ==
        "x.yaml:2: YAML syntax error: illegal map value");
  TempDir dir;
  const std::string absent = (dir.path() / "absent.yaml").string();
  CHECK(node_error([&] { ConfigNode::load_file(absent); }) == absent + ": cannot open file");
  const std::string present = dir.write("present.yaml", "a:\n  b: 3\n");
  const ConfigNode n = ConfigNode::load_file(present);
  CHECK(n.file() == present);
  CHECK(n["a"]["b"].where() == present + ":2: a.b");
}

TEST_CASE("ConfigNode::apply_override", "[config_node]") {
  ConfigNode root = ConfigNode::parse("a: 1\nm:\n  x: 2\n", "o.yaml");
  root.apply_override("a=5");
  root.apply_override("m.y=[1, 2]");
  root.apply_override("new=hi");
  CHECK(root["a"].as_int() == 5);
  CHECK(root["m"]["x"].as_int() == 2);
  REQUIRE(root["m"]["y"].items().size() == 2u);
  CHECK(root["m"]["y"].items()[1].as_int() == 2);
  CHECK(root["new"].as_string() == "hi");
  root.apply_override("fresh.key=1");  // one missing map is created
  CHECK(root["fresh"]["key"].as_int() == 1);
  CHECK(root.keys() == std::vector<std::string>{"a", "m", "new", "fresh"});
  CHECK(node_error([&] { root.apply_override("noequals"); }) ==
        "--set noequals: expected key.path=value");
  CHECK(node_error([&] { root.apply_override("=1"); }) == "--set =1: expected key.path=value");
  CHECK(node_error([&] { root.apply_override(".a=1"); }) == "--set .a=1: empty key in path");
  CHECK_THAT(node_error([&] { root.apply_override("a.b.c=1"); }),
             Catch::StartsWith("--set a.b.c=1: '") && Catch::EndsWith("' is not a map"));
  CHECK(node_error([&] { root.apply_override("a={"); }) ==
        "--set a={: value is not valid YAML: end of map flow not found");
}

// Regression: every missing map along the path is created, not only the first.
TEST_CASE("ConfigNode::apply_override creates every missing map", "[config_node]") {
  ConfigNode root = ConfigNode::parse("a: 1\n", "o.yaml");
  root.apply_override("new.deep.key=hi");
  CHECK(root["new"]["deep"]["key"].as_string() == "hi");
}

TEST_CASE("edit_distance", "[config_node]") {
  CHECK(edit_distance("", "") == 0u);
  CHECK(edit_distance("abc", "") == 3u);
  CHECK(edit_distance("", "abc") == 3u);
  CHECK(edit_distance("same", "same") == 0u);
  CHECK(edit_distance("kitten", "sitting") == 3u);
  CHECK(edit_distance("sitting", "kitten") == 3u);
  CHECK(edit_distance("flaw", "lawn") == 2u);
  CHECK(edit_distance("max_num_seq", "max_num_seqs") == 1u);
  CHECK(edit_distance("vmm_alais", "vmm_alias") == 2u);  // a swap is two edits
  CHECK(edit_distance("handle_byte", "handle_bytes") == 1u);
  CHECK(edit_distance("abc", "xyz") == 3u);
}

TEST_CASE("closest_match", "[config_node]") {
  const std::vector<std::string> keys = {"experiment",    "gpu",  "model", "max_num_seqs",
                                         "capture_sizes", "seed", "sweep", "strategies"};
  CHECK(closest_match("max_num_seq", keys) == "max_num_seqs");
  CHECK(closest_match("strategy", keys) == "strategies");  // 3 edits, limit 10/3 = 3
  CHECK(closest_match("gpus", keys) == "gpu");
  CHECK(closest_match("nope", keys).empty());
  CHECK(closest_match("anything", {}).empty());
  CHECK(closest_match("x", {"x"}) == "x");
  // The limit is a third of the longer word, but never less than 2 edits.
  CHECK(closest_match("ab", {"xy"}) == "xy");
  CHECK(closest_match("abc", {"xyz"}).empty());
  CHECK(closest_match("abcdefghijkl", {"abcdefghwxyz"}) == "abcdefghwxyz");  // 4 <= 12/3
  CHECK(closest_match("abcdefghijkl", {"abcdefgvwxyz"}).empty());            // 5 > 12/3
  // Ties go to the first candidate.
  CHECK(closest_match("ac", {"ab", "cc"}) == "ab");
  CHECK(closest_match("ac", {"cc", "ab"}) == "cc");
}
