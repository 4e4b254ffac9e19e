// steps.csv read back (columns by name, quoted labels, located errors) and a step's sequences
// rebuilt from its shape's sums: exact for one prefill sequence, sums kept for any valid shape,
// inconsistent sums refused.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "tests/temp_dir.h"
#include "workload/measured_steps.h"

using namespace memsim;
using namespace memsim::test;

namespace {

StepShape shape(uint32_t seqs, uint64_t new_tokens, uint32_t decodes, uint64_t decode_kv,
                uint32_t decode_max, uint64_t kv_read) {
  StepShape s;
  s.num_seqs = seqs;
  s.new_tokens = new_tokens;
  s.decode_seqs = decodes;
  s.decode_kv_tokens = decode_kv;
  s.decode_max_kv = decode_max;
  s.kv_read_tokens = kv_read;
  return s;
}

std::vector<std::pair<uint32_t, uint32_t>> pairs(const std::vector<SeqWork>& v) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (const SeqWork& s : v) out.emplace_back(s.cached, s.tokens);
  return out;
}

}  // namespace

TEST_CASE("sequences_of rebuilds a step's sequences from its sums") {
  using P = std::vector<std::pair<uint32_t, uint32_t>>;
  SECTION("one prefill chunk over a prefix: exact") {
    auto s = sequences_of(shape(1, 256, 0, 0, 0, 4352));
    REQUIRE(s.ok());
    CHECK(pairs(*s) == P{{4096, 256}});
  }
  SECTION("a decode beside two prompts (a steps.csv row of serving_measured)") {
    auto s = sequences_of(shape(3, 3291, 1, 4809, 4809, 8099));
    REQUIRE(s.ok());
    CHECK(pairs(*s) == P{{4808, 1}, {0, 1645}, {0, 1645}});
  }
  SECTION("decodes: the longest, then the rest shared, the first ones one more") {
    auto s = sequences_of(shape(3, 3, 3, 301, 150, 301));
    REQUIRE(s.ok());
    CHECK(pairs(*s) == P{{149, 1}, {75, 1}, {74, 1}});
  }
  SECTION("a chunk beside decodes, and uneven prompts") {
    auto s = sequences_of(shape(4, 1027, 2, 3000, 2000, 3000 + 1025 + 10));
    REQUIRE(s.ok());
    CHECK(pairs(*s) == P{{1999, 1}, {999, 1}, {5, 513}, {5, 512}});
  }
}

TEST_CASE("sequences_of keeps every sum of random valid shapes") {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 2000; ++i) {
    std::vector<SeqWork> truth;
    const uint32_t d = rng() % 6, p = rng() % 4 + (d == 0);
    StepShape s;
    for (uint32_t k = 0; k < d; ++k) truth.push_back({uint32_t(rng() % 5000), 1});
    for (uint32_t k = 0; k < p; ++k)
      truth.push_back({uint32_t(rng() % 9000), uint32_t(rng() % 900 + 2)});
    for (const SeqWork& w : truth) {
      s.num_seqs += 1;
      s.new_tokens += w.tokens;
      s.kv_read_tokens += w.cached + w.tokens;
      if (w.tokens == 1) {
        s.decode_seqs += 1;
        s.decode_kv_tokens += w.cached + 1;
        s.decode_max_kv = std::max<uint32_t>(s.decode_max_kv, w.cached + 1);
      }
    }
    auto got = sequences_of(s);
    REQUIRE(got.ok());
    REQUIRE(got->size() == s.num_seqs);
    uint64_t tokens = 0, kv = 0, dkv = 0, dmax = 0;
    for (size_t k = 0; k < got->size(); ++k) {
      const SeqWork& w = (*got)[k];
      tokens += w.tokens;
      kv += uint64_t{w.cached} + w.tokens;
      if (k < d) {
        REQUIRE(w.tokens == 1);
        dkv += w.cached + 1;
        dmax = std::max<uint64_t>(dmax, w.cached + 1);
      } else {
        REQUIRE(w.tokens >= 1);
      }
    }
    CHECK(tokens == s.new_tokens);
    CHECK(kv == s.kv_read_tokens);
    CHECK(dkv == s.decode_kv_tokens);
    CHECK(dmax == s.decode_max_kv);
  }
}

TEST_CASE("sequences_of refuses inconsistent sums") {
  CHECK(!sequences_of(shape(0, 0, 0, 0, 0, 0)).ok());
  CHECK(!sequences_of(shape(2, 2, 3, 10, 5, 10)).ok());         // more decodes than sequences
  CHECK(!sequences_of(shape(2, 1, 1, 10, 10, 10)).ok());        // a prefill with no token
  CHECK(!sequences_of(shape(1, 1, 1, 10, 11, 10)).ok());        // longest over the sum
  CHECK(!sequences_of(shape(3, 3, 3, 100, 10, 100)).ok());      // others longer than the longest
  CHECK(!sequences_of(shape(1, 500, 0, 0, 0, 400)).ok());       // KV below the new tokens
  CHECK(!sequences_of(shape(2, 3, 1, 50, 50, 40)).ok());        // decodes over the step's KV
  CHECK(!sequences_of(shape(1, 1, 1, 10, 10, 30)).ok());        // KV of no sequence
  CHECK(!sequences_of(shape(1, 5, 0, 0, 0, 1ull << 33)).ok());  // beyond 32 bits
  auto e = sequences_of(shape(1, 1, 1, 10, 11, 10));
  CHECK_THAT(e.error().message, Catch::Contains("decode_max_kv 11"));
}

TEST_CASE("read_steps_csv reads serving_measured's steps.csv") {
  TempDir dir;
  const std::string header = kStepsCsvHeader;
  const std::string path =
      dir.write("steps.csv",
                header + "\n" +
                    "\"code 1x\",1,3,3291,1,4809,4809,8099,5068704,80.0855,82.1598,17.5,79.9528\n"
                    "\"a, \"\"quoted\"\" label\",2,1,1,1,100,100,100,100,4.5,4.4,17.6,4.3\n");
  auto rows = read_steps_csv(path);
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 2);
  const MeasuredStepRow& r = (*rows)[0];
  CHECK(r.run == "code 1x");
  CHECK(r.step == 1);
  CHECK(r.shape.num_seqs == 3);
  CHECK(r.shape.new_tokens == 3291);
  CHECK(r.shape.decode_seqs == 1);
  CHECK(r.shape.decode_kv_tokens == 4809);
  CHECK(r.shape.decode_max_kv == 4809);
  CHECK(r.shape.kv_read_tokens == 8099);
  CHECK(r.shape.attn_pairs == 5068704);
  CHECK(r.measured_ms == Approx(80.0855));
  CHECK(r.predicted_ms == Approx(82.1598));
  CHECK(r.gpu_ms == Approx(79.9528));
  CHECK((*rows)[1].run == "a, \"quoted\" label");

  SECTION("columns in another order, gpu_ms absent") {
    auto two = read_steps_csv(dir.write(
        "b.csv",
        "predicted_ms,measured_ms,attn_pairs,kv_read_tokens,decode_max_kv,decode_kv_tokens,"
        "decode_seqs,new_tokens,num_seqs,step,run\n2,3,10,10,0,0,0,4,1,0,x\n"));
    REQUIRE(two.ok());
    CHECK((*two)[0].shape.new_tokens == 4);
    CHECK((*two)[0].gpu_ms == 0);
    CHECK((*two)[0].predicted_ms == 2);
  }
  SECTION("errors name the file, the line and the column") {
    auto missing = read_steps_csv(dir.write("m.csv", "run,step,num_seqs\nx,1,1\n"));
    REQUIRE(!missing.ok());
    CHECK_THAT(missing.error().message, Catch::Contains("m.csv:1: no column 'new_tokens'"));
    auto bad = read_steps_csv(
        dir.write("n.csv", header + "\nx,1,1,abc,1,100,100,100,100,4.5,4.4,17.6,4.3\n"));
    REQUIRE(!bad.ok());
    CHECK_THAT(bad.error().message, Catch::Contains("n.csv:2: new_tokens: 'abc'"));
    auto neg = read_steps_csv(
        dir.write("g.csv", header + "\nx,1,1,1,1,100,100,100,100,-4.5,4.4,17.6,4.3\n"));
    REQUIRE(!neg.ok());
    CHECK_THAT(neg.error().message, Catch::Contains("measured_ms"));
    auto width = read_steps_csv(dir.write("w.csv", header + "\nx,1,1\n"));
    REQUIRE(!width.ok());
    CHECK_THAT(width.error().message, Catch::Contains("w.csv:2: 3 fields, the header has 13"));
    auto open = read_steps_csv(dir.write("q.csv", header + "\n\"x,1\n"));
    REQUIRE(!open.ok());
    CHECK_THAT(open.error().message, Catch::Contains("q.csv:2: a quoted field is not closed"));
    CHECK(!read_steps_csv((dir.path() / "none.csv").string()).ok());
    CHECK(!read_steps_csv(dir.path().string()).ok());  // a folder
    CHECK(!read_steps_csv(dir.write("e.csv", "")).ok());
  }
}
