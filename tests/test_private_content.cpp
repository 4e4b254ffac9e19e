// Private content (TokenContent::private_from): the paged pool's deferred block hashes change no
// lookup, table or counter. A hinted pool and an unhinted twin run the same random operations
// side by side; the serving engine runs the same workloads with and without the hints.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "src/kv/paged_block_pool.h"
#include "src/serve/engine.h"
#include "tests/kv_test_util.h"

namespace memsim::test {
namespace {

KvInit small_pool(uint32_t blocks) {
  KvInit i;
  i.layers = 2;
  i.kv_bytes_per_token = 1024;
  i.budget_bytes = uint64_t{blocks} * 16 * 1024;
  i.max_num_seqs = 64;
  i.max_model_len = 1024;
  return i;
}

void require_same(const KvStats& a, const KvStats& b) {
  REQUIRE(a.used_blocks == b.used_blocks);
  REQUIRE(a.cached_blocks == b.cached_blocks);
  REQUIRE(a.free_blocks == b.free_blocks);
  REQUIRE(a.slots_allocated == b.slots_allocated);
  REQUIRE(a.tokens_stored == b.tokens_stored);
  REQUIRE(a.cow_copies == b.cow_copies);
  REQUIRE(a.evicted_blocks == b.evicted_blocks);
}

// One pool driven with hinted contents, its twin with the same contents unhinted.
struct Twins {
  KvRig hinted, plain;
  Twins(const std::string& yaml, const KvInit& init) : hinted(yaml, init), plain(yaml, init) {}

  static TokenContent unhinted(TokenContent c) {
    c.set_private_from(TokenContent::kShared);
    return c;
  }
  uint32_t lookup(const TokenContent& c) {
    const uint32_t h = hinted.kv->lookup_prefix(c);
    REQUIRE(plain.kv->lookup_prefix(unhinted(c)) == h);
    return h;
  }
  bool grow(SeqId s, const TokenContent& c, uint32_t n, uint32_t prefix) {
    const Status a = hinted.kv->grow(s, c, n, prefix);
    const Status b = plain.kv->grow(s, unhinted(c), n, prefix);
    REQUIRE(a.ok() == b.ok());
    return a.ok();
  }
  bool fork(SeqId p, SeqId c) {
    const Status a = hinted.kv->fork(p, c), b = plain.kv->fork(p, c);
    REQUIRE(a.ok() == b.ok());
    return a.ok();
  }
  void publish(SeqId s, const TokenContent& c) {
    hinted.kv->publish(s, c);
    plain.kv->publish(s, unhinted(c));
  }
  void release(SeqId s, const TokenContent& c) {
    hinted.kv->release(s, c);
    plain.kv->release(s, unhinted(c));
  }
  void compare(const std::map<SeqId, TokenContent>& live) {
    hinted.check();
    plain.check();
    require_same(hinted.kv->stats(), plain.kv->stats());
    std::vector<int32_t> ta, tb;
    for (const auto& [id, content] : live) {
      hinted.kv->seq_table(id, &ta);
      plain.kv->seq_table(id, &tb);
      REQUIRE(ta == tb);
    }
  }
};

// Requests as the engine builds them: a shared prefix (one of 3 streams) or none, the request's
// own prompt stream, then its output stream; forks copy a prefix of their parent and append a
// stream of their own. Preempted requests are published, released and later readmitted by a
// prefix lookup of their whole content (shared from then on).
void random_twins(const std::string& yaml, uint32_t pool_blocks, uint64_t seed, int ops) {
  INFO(yaml << " seed " << seed);
  Twins t(yaml, small_pool(pool_blocks));
  std::mt19937_64 rng(seed);
  auto pick = [&](uint32_t lo, uint32_t hi) {
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
  };
  std::map<SeqId, TokenContent> live, preempted;
  std::map<SeqId, uint32_t> length;  // tokens the sequence holds
  SeqId next = 1;
  uint64_t next_stream = 100;
  uint64_t hits = 0, publishes = 0;
  for (int op = 0; op < ops; ++op) {
    const uint32_t kind = pick(0, 9);
    if (kind <= 2 || live.empty()) {  // admit a new request, or readmit a preempted one
      TokenContent c;
      SeqId id;
      if (!preempted.empty() && pick(0, 2) == 0) {
        auto it = std::next(preempted.begin(), pick(0, uint32_t(preempted.size() - 1)));
        id = it->first;
        c = it->second;  // published: no private part any more
        preempted.erase(it);
      } else {
        id = next++;
        const uint32_t prefix = pick(0, 1) ? pick(1, 80) : 0;
        if (prefix) c.append(pick(1, 3), prefix);
        c.append(next_stream++, pick(1, 120));
        c.append(next_stream++, pick(1, 200));
        c.set_private_from(prefix);
      }
      const uint32_t known = std::min<uint32_t>(c.size(), pick(1, 160));
      const uint32_t hit = t.lookup(c.slice(0, known));
      hits += hit;
      if (t.grow(id, c, known, hit)) {
        live[id] = c;
        length[id] = known;
      } else if (c.private_from() == TokenContent::kShared) {
        preempted[id] = c;  // wait for memory
      }
    } else if (kind <= 5) {  // grow by one token (decode) or a chunk
      auto it = std::next(live.begin(), pick(0, uint32_t(live.size() - 1)));
      const uint32_t cur = length[it->first];
      const uint32_t to = std::min<uint32_t>(it->second.size(), cur + (pick(0, 3) ? 1 : 40));
      if (to > cur && t.grow(it->first, it->second, to, 0)) length[it->first] = to;
    } else if (kind == 6) {  // fork: the child continues on a stream of its own
      auto it = std::next(live.begin(), pick(0, uint32_t(live.size() - 1)));
      const SeqId child = next++;
      const uint32_t at = length[it->first];
      if (t.fork(it->first, child)) {
        TokenContent c = it->second.slice(0, at);
        c.append(next_stream++, pick(1, 100));
        live[child] = c;
        length[child] = at;
      }
    } else if (kind == 7) {  // preempt: publish, release what was computed, readmit later
      auto it = std::next(live.begin(), pick(0, uint32_t(live.size() - 1)));
      TokenContent c = it->second;
      c.set_private_from(TokenContent::kShared);
      t.publish(it->first, c);
      publishes += it->second.private_from() != TokenContent::kShared;
      // Its KV may end before its grown length (grown for a step that never ran).
      const uint32_t grown = length[it->first];
      t.release(it->first, c.slice(0, grown - std::min(grown, pick(0, 1) * pick(1, 40))));
      preempted[it->first] = c;
      length.erase(it->first);
      live.erase(it);
    } else {  // finish (or truncate before a step ran): the private content ends here
      auto it = std::next(live.begin(), pick(0, uint32_t(live.size() - 1)));
      const uint32_t grown = length[it->first];
      t.release(it->first, it->second.slice(0, grown - std::min(grown, pick(0, 3) / 3 * 10)));
      length.erase(it->first);
      live.erase(it);
    }
    t.compare(live);
  }
  // Readmit everything preempted: each lookup must see what the unhinted pool sees.
  for (auto& [id, c] : preempted) {
    if (live.count(id)) continue;
    hits += t.lookup(c);
  }
  CHECK(publishes > 0);
  if (yaml.find("prefix_caching: false") != std::string::npos) return;
  CHECK(hits > 0);
  // The pool cycled: evictions of deferred blocks were compared.
  CHECK(t.hinted.kv->stats().evicted_blocks > 0);
}

TEST_CASE("paged pool: hinted contents give exactly the unhinted pool's lookups and counters") {
  for (const char* yaml : {"{impl: paged_block_pool}", "{impl: paged_block_pool, block_size: 1}",
                           "{impl: paged_block_pool, block_size: 8, layout: per_layer}",
                           "{impl: paged_block_pool, copy_on_write: false}",
                           "{impl: paged_block_pool, prefix_caching: false}"}) {
    for (uint64_t seed : {1, 2, 3}) random_twins(yaml, 200, seed, 4000);
  }
}

TEST_CASE("paged pool: deferred blocks are cached when freed and hashed when published") {
  KvRig rig("{impl: paged_block_pool}", small_pool(8));  // 7 usable blocks + the null block
  auto& pool = dynamic_cast<PagedBlockPool&>(*rig.kv);
  TokenContent a(1, 16);  // one shared block, then 24 private tokens
  a.append(2, 24);
  a.set_private_from(16);
  REQUIRE(pool.grow(1, a, 40, 0).ok());
  rig.check();
  pool.release(1, a);
  KvStats s = pool.stats();
  CHECK(s.cached_blocks == 2);  // the shared block and the deferred one; the partial one is free
  CHECK(s.free_blocks == 5);
  TokenContent shared = a;
  shared.set_private_from(TokenContent::kShared);
  CHECK(pool.lookup_prefix(shared) == 16);  // the deferred block is not in the index

  // Another request with the same first block, published before its release: its private full
  // block is hashed then, and found again.
  TokenContent c(1, 16);
  c.append(4, 24);
  c.set_private_from(16);
  REQUIRE(pool.grow(2, c, 40, 0).ok());  // its first block duplicates the cached one
  TokenContent published = c;
  published.set_private_from(TokenContent::kShared);
  pool.publish(2, published);
  rig.check();
  pool.release(2, published);
  CHECK(pool.lookup_prefix(published) == 32);
  s = pool.stats();
  CHECK(s.cached_blocks == 3);  // a's two, c's second (c's first was a duplicate)
  rig.check();

  // Deferred blocks are evicted like registered ones: a request of 7 blocks takes the pool.
  TokenContent b(3, 112);
  b.set_private_from(0);
  REQUIRE(pool.grow(3, b, 112, 0).ok());
  CHECK(pool.stats().evicted_blocks == 3);
  CHECK(pool.stats().cached_blocks == 0);
  CHECK(pool.lookup_prefix(published) == 0);
  rig.check();
}

GpuSpec h200() {
  return gpu_from_configs("h200");
}

TEST_CASE("serving: deferred private hashes give exactly the reference results") {
  struct Case {
    const char* kv;
    uint64_t budget;
    Preemption preemption;
    uint64_t swap_space;
    uint32_t n, beam;
  };
  const Case cases[] = {
      {"{impl: paged_block_pool}", 24 * kGiB, Preemption::kRecompute, 4 * kGiB, 1, 1},
      {"{impl: paged_block_pool}", 2 * kGiB, Preemption::kRecompute, 4 * kGiB, 1, 1},
      {"{impl: paged_block_pool, block_size: 1}", 2 * kGiB, Preemption::kSwap, 4 * kGiB, 1, 1},
      {"{impl: paged_block_pool}", 3 * kGiB, Preemption::kRecompute, 4 * kGiB, 3, 1},
      {"{impl: paged_block_pool}", 3 * kGiB, Preemption::kRecompute, 0, 3, 1},  // restarts
      {"{impl: paged_block_pool, copy_on_write: false}", 3 * kGiB, Preemption::kSwap, 4 * kGiB, 2,
       1},
      {"{impl: paged_block_pool, layout: per_layer}", 3 * kGiB, Preemption::kRecompute, 1 * kGiB, 1,
       3},  // beams
  };
  for (const Case& c : cases) {
    SyntheticRequestsConfig s;
    s.count = 250;
    s.seed = 11;
    s.arrival.rate = 40;
    s.prompt = {LengthDist::kLognormal, 0, 16, 2048, 400, 0.8};
    s.output = {LengthDist::kUniform, 0, 4, 300, 0, 0};
    s.prefix = {4, 128, 0.7};
    s.n = c.n;
    s.beam_width = c.beam;
    const auto reqs = generate_requests(s);
    EngineConfig e;
    e.model = model_from_configs("llama-3.1-8b");
    e.gpu = h200();
    const ConfigNode node = ConfigNode::parse(c.kv, "test.yaml");
    e.kv_impl = "paged_block_pool";
    e.kv_factory = kv_strategies().find(e.kv_impl)->parse(node);
    e.kv_budget_bytes = c.budget;
    e.serve.max_model_len = 4096;
    e.serve.preemption = c.preemption;
    e.serve.swap_space = c.swap_space;
    e.sample_interval = 50'000'000;
    e.defer_private_hashes = false;
    const ServingResult ref = run_serving(e, reqs);
    e.defer_private_hashes = true;
    const ServingResult lazy = run_serving(e, reqs);
    INFO(c.kv << " budget " << c.budget << " n " << c.n << " beam " << c.beam);
    REQUIRE(ref.error.empty());
    REQUIRE(lazy.error.empty());
    CHECK(ref.finished == reqs.size());
    CHECK(lazy.sim_time == ref.sim_time);
    CHECK(lazy.steps == ref.steps);
    CHECK(lazy.output_tokens == ref.output_tokens);
    CHECK(lazy.ttft_ms.p99 == ref.ttft_ms.p99);
    CHECK(lazy.tpot_ms.p50 == ref.tpot_ms.p50);
    CHECK(lazy.e2e_ms.mean == ref.e2e_ms.mean);
    CHECK(lazy.counters.preemptions == ref.counters.preemptions);
    CHECK(lazy.counters.swap_outs == ref.counters.swap_outs);
    CHECK(lazy.counters.restarts == ref.counters.restarts);
    CHECK(lazy.counters.prefix_hit_tokens == ref.counters.prefix_hit_tokens);
    CHECK(lazy.peak_used_blocks == ref.peak_used_blocks);
    require_same(lazy.kv, ref.kv);
    REQUIRE(lazy.samples.size() == ref.samples.size());
    for (size_t i = 0; i < ref.samples.size(); ++i) {
      INFO("sample " << i << " " << ref.series[ref.samples[i].series]);
      REQUIRE(lazy.samples[i].time == ref.samples[i].time);
      REQUIRE(lazy.samples[i].value == ref.samples[i].value);
    }
  }
}

}  // namespace
}  // namespace memsim::test
