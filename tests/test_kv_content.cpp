// KvLayout / seq_table of every strategy and KvContentShadow: rows land where the layout says,
// copies move contents, and the read-back check catches a wrong block table and a missed
// copy-on-write (a strategy wrapper whose seq_table lies).
#include <catch2/catch.hpp>

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "src/kv/kv_content.h"
#include "tests/kv_test_util.h"

namespace memsim::test {
namespace {

// 2 layers of 8 KiB rows (K of one token of one layer), 16 tokens per 2 MiB vmm page group.
constexpr uint32_t kLayers = 2;
constexpr uint64_t kRow = 128 * kKiB;
constexpr uint64_t kKvPerToken = 2 * kLayers * kRow;

KvInit small_init(uint64_t budget_tokens = 1024) {
  KvInit i;
  i.layers = kLayers;
  i.kv_bytes_per_token = kKvPerToken;
  i.budget_bytes = budget_tokens * kKvPerToken;
  i.max_num_seqs = 8;
  i.max_model_len = 256;
  return i;
}

// A strategy wrapped in LyingTable, its backend and a content shadow of both layers.
struct Bench {
  SimClock clock;
  SimBackend backend{kv_test_gpu(), clock};
  LyingTable kv;
  std::unique_ptr<KvContentShadow> shadow;
  explicit Bench(const std::string& yaml, KvInit init = small_init()) : kv(make_kv(yaml)) {
    REQUIRE(kv.init(backend, init).ok());
    shadow = std::make_unique<KvContentShadow>(kv.layout(), std::vector<uint32_t>{0, 1});
    backend.set_copy_observer(
        [this](DevPtr dst, DevPtr src, uint64_t bytes) { shadow->copy(dst, src, bytes); });
  }
  // grow to n and write the tokens computed since `from`.
  void compute(SeqId s, const TokenContent& c, uint32_t from, uint32_t n, uint32_t prefix = 0) {
    REQUIRE(kv.grow(s, c, n, prefix).ok());
    const std::string bad = shadow->write(kv, s, c, from, n);
    INFO(bad);
    REQUIRE(bad.empty());
  }
  std::string check(SeqId s, const TokenContent& c) const {
    return shadow->check(kv, s, c, kv.seq_tokens(s));
  }
};

TEST_CASE("every strategy's rows of live sequences lie inside its pool and never collide") {
  for (const KvEntry& info : kv_strategies()) {
    CAPTURE(info.name);
    Bench b("{impl: " + info.name + "}");
    const KvLayout l = b.kv.layout();
    // A strategy with a vLLM-style block table addresses its KV through it.
    if (const uint32_t tokens = b.kv.block_table_tokens()) {
      CHECK(l.paged);
      CHECK(l.block_tokens == tokens);
    }
    REQUIRE(l.k.size() == kLayers);
    REQUIRE(l.v.size() == kLayers);
    CHECK(l.row_bytes == kRow);
    const TokenContent a(1, 256), c(2, 256);
    b.compute(1, a, 0, 70);
    b.compute(2, c, 0, 33);
    // Distinct contents: every row of both sequences is distinct.
    std::set<DevPtr> rows;
    std::vector<int32_t> table;
    for (SeqId s : {1u, 2u}) {
      b.kv.seq_table(s, &table);
      REQUIRE(!table.empty());
      for (int32_t id : table) CHECK(static_cast<uint64_t>(id) < l.blocks);
      for (uint32_t pos = 0; pos < b.kv.seq_tokens(s); ++pos)
        for (uint32_t layer = 0; layer < kLayers; ++layer)
          for (bool value : {false, true})
            CHECK(rows.insert(l.row(table, value, layer, pos)).second);
    }
    CHECK(b.check(1, a).empty());
    CHECK(b.check(2, c).empty());
    // A fork shares or copies, then both diverge: each still reads its own tokens.
    REQUIRE(b.kv.fork(1, 3).ok());
    TokenContent child = a.slice(0, 70);
    child.append(9, 100);
    b.compute(1, a, 70, 90);
    b.compute(3, child, 70, 85);
    CHECK(b.check(1, a).empty());
    CHECK(b.check(3, child).empty());
    CHECK(b.shadow->rows() > 0);
  }
}

TEST_CASE("a prefix hit reads the rows an earlier sequence wrote") {
  for (const char* yaml : {"{impl: paged_block_pool}", "{impl: radix_token_pool, page_size: 4}"}) {
    CAPTURE(yaml);
    Bench b(yaml);
    TokenContent first(5, 40);
    first.append(6, 60);
    b.compute(1, first, 0, 100);
    b.kv.release(1, first);
    TokenContent second = first.slice(0, 64);
    second.append(7, 100);
    const uint32_t prefix = b.kv.lookup_prefix(second.slice(0, 80));
    REQUIRE(prefix >= 48);
    b.compute(2, second, prefix, 80, prefix);
    CHECK(b.check(2, second).empty());
  }
}

TEST_CASE("the content check catches a wrong block table") {
  Bench b("{impl: paged_block_pool}");
  const TokenContent a(1, 256);
  b.compute(1, a, 0, 40);  // 3 blocks
  b.kv.lie = [](SeqId, std::vector<int32_t>* t) { std::swap((*t)[0], (*t)[1]); };
  const std::string bad = b.check(1, a);
  CHECK(bad.rfind("seq 1 position 0 layer 0 K:", 0) == 0);
  CHECK(bad.find("position 16") != std::string::npos);  // it reads the row of position 16
}

TEST_CASE("the content check catches a missed copy-on-write") {
  Bench b("{impl: paged_block_pool}");
  const TokenContent parent(1, 256);
  b.compute(1, parent, 0, 21);  // blocks 0-15, 16-20 (partial)
  REQUIRE(b.kv.fork(1, 2).ok());
  TokenContent child = parent.slice(0, 21);
  child.append(2, 100);
  // The child grows first: the strategy copies the shared partial block (copy-on-write) and the
  // shadow mirrors the copy. A strategy that forgot would leave the child on the parent's block:
  std::vector<int32_t> parent_table;
  b.kv.seq_table(1, &parent_table);
  b.kv.lie = [&](SeqId s, std::vector<int32_t>* t) {
    if (s == 2) t->back() = parent_table.back();
  };
  b.compute(2, child, 21, 22);
  b.compute(1, parent, 21, 22);  // the parent's token 21 lands in the same row
  CHECK(b.check(1, parent).empty());
  const std::string bad = b.check(2, child);
  CHECK(bad.rfind("seq 2 position 21 layer 0 K:", 0) == 0);
  // Told the truth, the same sequence of operations is consistent.
  b.kv.lie = nullptr;
  b.compute(2, child, 21, 22);
  CHECK(b.check(2, child).empty());
}

TEST_CASE("a token computed past the last allocated block is caught (the seed's section 15)") {
  Bench b("{impl: paged_block_pool}");
  const TokenContent a(1, 256);
  b.compute(1, a, 0, 16);  // exactly one block: position 16 needs a second one
  CHECK(b.shadow->write(b.kv, 1, a, 16, 17) ==
        "write: seq 1 position 16 lies beyond its table (1 blocks of 16 tokens)");
  CHECK(b.shadow->check(b.kv, 1, a, 17) ==
        "seq 1 position 16 lies beyond its table (1 blocks of 16 tokens)");
  b.compute(1, a, 16, 17);  // grown first, as the engine must
  CHECK(b.check(1, a).empty());
}

TEST_CASE("KvContentShadow copies move rows and overwrite the destination range") {
  Bench b("{impl: paged_block_pool}");
  const TokenContent a(1, 256), c(2, 256);
  b.compute(1, a, 0, 16);  // exactly one block
  b.compute(2, c, 0, 16);
  std::vector<int32_t> t1, t2;
  b.kv.seq_table(1, &t1);
  b.kv.seq_table(2, &t2);
  const KvLayout l = b.kv.layout();
  const DevPtr unit1 = l.k[0] + uint64_t(t1[0]) * l.block_stride;
  const DevPtr unit2 = l.k[0] + uint64_t(t2[0]) * l.block_stride;
  REQUIRE(b.backend.copy(unit2, unit1, l.block_stride, StreamId{}).ok());  // block 1 over 2
  CHECK(b.check(1, a).empty());
  CHECK(b.check(2, c).rfind("seq 2 position 0 layer 0 K", 0) == 0);  // c's rows were replaced
  CHECK(b.check(2, a).empty());  // seq 2's rows now hold a's tokens, all layers, K and V
}

}  // namespace
}  // namespace memsim::test
