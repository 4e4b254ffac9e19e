// KV stress: 1M seeded ops per strategy and variant, each checked against invariants and a model.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/kv/kv_content.h"
#include "tests/kv_test_util.h"

namespace memsim::test {
namespace {

// Operations per variant (MEMSIM_KV_STRESS_OPS overrides it, e.g. to reproduce quickly).
constexpr uint64_t kOpsPerVariant = 1'000'000;

// A small geometry keeps each operation cheap: 2 layers, 128 KiB of K (and of V) per token per
// layer, so a 2 MiB VMM page holds 16 tokens and a vmm page group matches a 16-token block.
constexpr uint32_t kLayers = 2;
constexpr uint64_t kKvBytesPerToken = 2 * kLayers * 128 * kKiB;
constexpr uint32_t kMaxModelLen = 256;
constexpr uint32_t kMaxNumSeqs = 16;
constexpr uint32_t kMaxLive = kMaxNumSeqs + 2;  // slot strategies see "no free slot" too
constexpr uint32_t kMaxPrompt = 192;
constexpr uint64_t kPrefixStreams = 4;  // shared prompt prefixes (stream ids 1..4)
constexpr uint64_t kFirstUniqueStream = 1'000'000;
constexpr size_t kRecentContents = 16;  // released contents that prefix-hit ops reuse
constexpr size_t kMaxPreempted = 32;

struct Variant {
  std::string name;
  std::string yaml;
  uint32_t pool_tokens;  // the budget, in tokens of KV
  bool expect_hits;      // prefix caching: lookups must hit sometimes (else never)
};

// The registry's defaults (paged block_size 16 with a null block, radix page_size 1, static,
// vmm as vAttention runs it: reserved pages, deferred reclamation, async) plus the parameter
// variants whose code paths differ.
std::vector<Variant> variants() {
  std::vector<Variant> v;
  for (const KvEntry& s : kv_strategies())
    v.push_back({s.name, "{impl: " + s.name + "}", 1024, s.defaults()()->caches_prefixes()});
  const std::string paged = "{impl: paged_block_pool, ";
  v.push_back({"paged block_size 1", paged + "block_size: 1}", 512, true});
  v.push_back({"paged per_layer", paged + "layout: per_layer}", 1024, true});
  v.push_back({"paged prefix_caching off", paged + "prefix_caching: false}", 1024, false});
  v.push_back({"paged copy_on_write off", paged + "copy_on_write: false}", 1024, true});
  v.push_back({"paged free_list lifo", paged + "free_list: lifo}", 1024, true});
  v.push_back({"paged growing lifo", paged + "initial_blocks: 2, free_list: lifo}", 1024, true});
  const std::string radix = "{impl: radix_token_pool, ";
  v.push_back({"radix page_size 16", radix + "page_size: 16}", 1024, true});
  v.push_back({"radix page_size 4 lfu", radix + "page_size: 4, eviction: lfu}", 1024, true});
  v.push_back({"radix disable_radix_cache", radix + "disable_radix_cache: true}", 1024, false});
  const std::string vmm = "{impl: vmm_contiguous, ";
  v.push_back({"vmm async eager", vmm + "reclaim: eager}", 1024, false});
  v.push_back({"vmm on_demand eager sync",
               vmm + "physical: on_demand, reclaim: eager, allocation: sync}", 1024, false});
  v.push_back({"vmm on_demand deferred", vmm + "physical: on_demand}", 1024, false});
  return v;
}

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

bool same_stats(const KvStats& a, const KvStats& b) {
  return a.block_tokens == b.block_tokens && a.block_bytes == b.block_bytes &&
         a.total_blocks == b.total_blocks && a.used_blocks == b.used_blocks &&
         a.cached_blocks == b.cached_blocks && a.free_blocks == b.free_blocks &&
         a.slots_allocated == b.slots_allocated && a.tokens_stored == b.tokens_stored &&
         a.pool_bytes == b.pool_bytes && a.metadata_bytes == b.metadata_bytes &&
         a.cow_copies == b.cow_copies && a.cow_bytes == b.cow_bytes &&
         a.evicted_blocks == b.evicted_blocks;
}

std::string describe(const KvStats& s) {
  std::ostringstream o;
  o << "{used " << s.used_blocks << ", cached " << s.cached_blocks << ", free " << s.free_blocks
    << "/" << s.total_blocks << ", slots " << s.slots_allocated << ", stored " << s.tokens_stored
    << ", pool " << s.pool_bytes << ", cow " << s.cow_copies << ", evicted " << s.evicted_blocks
    << "}";
  return o.str();
}

// Fails the test with the variant, seed and operation that broke the expectation. Catch2 is
// only involved on failure: a million REQUIREs per variant would dominate the run time.
#define STRESS_CHECK(cond, msg)                                   \
  do {                                                            \
    if (!(cond)) FAIL(where() << ": " << #cond << " -- " << msg); \
  } while (0)

// With `track_content`, a KvContentShadow records what every row of layers 0 and 1 holds (the
// engine's writes of computed tokens, the strategy's own copies through the backend) and each
// sequence an operation touched must read its own tokens back through its table; every live
// sequence is checked every kContentSweep operations.
constexpr uint64_t kContentSweep = 256;

class Stress {
 public:
  Stress(const Variant& v, uint64_t seed, bool track_content = false)
      : variant_(v), seed_(seed), rng_(seed), rig_(v.yaml, init_for(v)) {
    used_at_init_ = kv().stats().used_blocks;
    if (track_content) {
      content_.emplace(kv().layout(), std::vector<uint32_t>{0, kLayers - 1});
      rig_.backend.set_copy_observer(
          [this](DevPtr dst, DevPtr src, uint64_t bytes) { content_->copy(dst, src, bytes); });
    }
  }

  void run(uint64_t ops) {
    check_all();
    for (op_ = 0; op_ < ops; ++op_) {
      touched_.clear();
      step();
      check_all();
      check_content(op_ % kContentSweep == 0);
    }
    finish();
  }

  // Counters for the summary line and the end-of-run expectations.
  uint64_t ooms = 0, grows = 0, deferred = 0, forks = 0, releases = 0, preempts = 0;
  uint64_t backgrounds = 0, front_frees = 0;
  uint64_t prefix_hit_tokens = 0;

 private:
  struct Seq {
    TokenContent content;  // kMaxModelLen tokens
    uint32_t tokens = 0;   // what the strategy holds: seq_tokens()
    uint32_t want = 0;     // what the engine has computed; want - tokens are deferred grows
    uint32_t written = 0;  // rows [0, written) hold this sequence's tokens (content tracking)
  };
  struct Preempted {
    SeqId id;
    TokenContent content;
    uint32_t tokens;
  };
  // What an operation must leave untouched when it fails (or only looks).
  struct Snapshot {
    KvStats stats;
    uint64_t physical, reserved, mapped, calls;
  };

  static KvInit init_for(const Variant& v) {
    KvInit i;
    i.layers = kLayers;
    i.kv_bytes_per_token = kKvBytesPerToken;
    i.budget_bytes = uint64_t{v.pool_tokens} * kKvBytesPerToken;
    i.max_num_seqs = kMaxNumSeqs;
    i.max_model_len = kMaxModelLen;
    return i;
  }

  KvCacheManager& kv() { return *rig_.kv; }
  std::string where() const {
    std::ostringstream o;
    o << "[" << variant_.name << "] seed " << seed_ << ", op " << op_ << " (" << op_name_ << ")";
    return o.str();
  }
  uint32_t rnd(uint32_t lo, uint32_t hi) {  // inclusive
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng_);
  }
  bool chance(uint32_t percent) { return rnd(0, 99) < percent; }

  Snapshot snap() const {
    const Usage u = rig_.backend.usage();
    uint64_t calls = 0;
    for (size_t p = 0; p < static_cast<size_t>(Primitive::kCount); ++p)
      calls += rig_.backend.calls_of(static_cast<Primitive>(p));
    return {rig_.kv->stats(), u.physical_bytes, u.virtual_reserved, u.virtual_mapped, calls};
  }
  void check_unchanged(const Snapshot& before, const char* what) {
    const Snapshot now = snap();
    STRESS_CHECK(
        same_stats(before.stats, now.stats),
        what << " changed the stats: " << describe(before.stats) << " -> " << describe(now.stats));
    STRESS_CHECK(before.physical == now.physical && before.reserved == now.reserved &&
                     before.mapped == now.mapped,
                 what << " changed the backend's memory");
    STRESS_CHECK(before.calls == now.calls,
                 what << " called the backend " << now.calls - before.calls << " time(s)");
  }
  // Blocks (in stats units) that n tokens take, of which `prefix` are shared.
  uint64_t blocks_for(uint32_t n, uint32_t prefix) const {
    const KvStats s = rig_.kv->stats();
    const uint64_t per_logical = s.block_tokens * kKvBytesPerToken / s.block_bytes;
    return ((n + s.block_tokens - 1) / s.block_tokens - prefix / s.block_tokens) * per_logical;
  }

  TokenContent fresh_content(TokenContent head) {
    head.append(next_stream_++, kMaxModelLen - head.size());
    return head;
  }
  SeqId pick_live() { return live_[rnd(0, static_cast<uint32_t>(live_.size() - 1))]; }
  void forget(SeqId id) {
    live_.erase(std::find(live_.begin(), live_.end(), id));
    seqs_.erase(id);
  }

  // ---- operations ---------------------------------------------------------------------------

  void step() {
    enum Op { kNew, kPrefixHit, kAppend, kLazy, kSync, kFork, kRelease, kPreempt, kResume, kBurst };
    static constexpr uint32_t kWeights[] = {13, 6, 18, 30, 5, 5, 10, 4, 6, 3};
    uint32_t r = rnd(0, 99), op = 0;
    while (r >= kWeights[op]) r -= kWeights[op++];
    const bool room = live_.size() < kMaxLive;
    if (live_.empty() && op != kResume) op = kNew;
    if (!room && (op == kNew || op == kPrefixHit || op == kFork || op == kResume)) op = kRelease;
    switch (op) {
      case kNew: {
        op_name_ = "new";
        const uint32_t shared = rnd(0, 160);
        TokenContent c = fresh_content(TokenContent(rnd(1, kPrefixStreams), shared));
        start(next_id_++, c, rnd(1, kMaxPrompt));
        break;
      }
      case kPrefixHit: {
        op_name_ = "prefix hit";
        if (recent_.empty()) break;
        const TokenContent& old = recent_[rnd(0, static_cast<uint32_t>(recent_.size() - 1))];
        const uint32_t keep = rnd(1, old.size());
        const TokenContent c = fresh_content(old.slice(0, keep));
        start(next_id_++, c, std::min(kMaxPrompt, keep + rnd(0, 32)));
        break;
      }
      case kAppend: {
        op_name_ = "append";
        const SeqId id = pick_live();
        const Seq& s = seqs_.at(id);
        const uint32_t k = chance(10) ? rnd(1, 128) : rnd(1, 40);
        const uint32_t n = std::min(kMaxModelLen, s.want + k);
        if (n > s.tokens && !grow(id, n)) on_oom();
        break;
      }
      case kLazy: {
        op_name_ = "lazy append";
        lazy_append(pick_live(), rnd(1, 4));
        break;
      }
      case kSync: {
        op_name_ = "sync";
        sync(pick_live());
        break;
      }
      case kFork: {
        op_name_ = "fork";
        fork(pick_live());
        break;
      }
      case kRelease: {
        op_name_ = "release";
        release(pick_live(), false);
        break;
      }
      case kPreempt: {
        op_name_ = "preempt";
        release(pick_live(), true);
        break;
      }
      case kResume: {
        op_name_ = "resume";
        if (preempted_.empty()) break;
        const size_t i = rnd(0, static_cast<uint32_t>(preempted_.size() - 1));
        const Preempted p = preempted_[i];
        if (start(p.id, p.content, p.tokens)) preempted_.erase(preempted_.begin() + i);
        break;
      }
      case kBurst: {
        op_name_ = "burst to max_model_len";
        const SeqId id = pick_live();
        if (seqs_.at(id).tokens < kMaxModelLen && !grow(id, kMaxModelLen)) on_oom();
        break;
      }
    }
    // Strategies with background work get a background step after a third of the operations
    // (others draw nothing more, so their operation stream is unchanged).
    if (kv().has_background() && chance(33)) background();
    // Strategies that free a sequence's earliest blocks get that after 4% of the operations.
    if (kv().frees_front() && !live_.empty() && chance(4)) front_free(pick_live());
  }

  // Preemption by free_front and the readmission: the sequence's leading blocks go (enough for
  // a random need, within a random cap), then its grow to the same length takes them back and
  // the engine recomputes their rows. A restore that finds no memory drops the sequence.
  void front_free(SeqId id) {
    op_name_ = "release_front and restore";
    sync(id);
    const Seq& s = seqs_.at(id);
    const KvStats before = kv().stats();
    const uint64_t bytes = uint64_t{rnd(1, 8)} * before.block_bytes * before.block_tokens;
    const uint32_t gap = kv().release_front(id, bytes, rnd(0, s.tokens));
    std::string why;
    STRESS_CHECK(kv().check_invariants(&why), why);
    STRESS_CHECK(
        gap % before.block_tokens == 0 && gap < std::max(s.tokens, 1u) && kv().front_gap(id) == gap,
        "release_front left a gap of " << gap << " of " << s.tokens << " tokens");
    if (gap == 0) return;
    STRESS_CHECK(kv().seq_capacity(id) == 0 && kv().seq_tokens(id) == s.tokens,
                 "a sequence with a front gap has capacity or lost tokens");
    const Status st = kv().grow(id, s.content, s.tokens, 0);
    if (!st.ok()) {
      STRESS_CHECK(st.error().code == ErrorCode::kOutOfMemory, st.error().message);
      ++ooms;
      release(id, true);
      return;
    }
    STRESS_CHECK(kv().front_gap(id) == 0, "the grow left a front gap");
    if (content_) {
      const std::string bad = content_->write(kv(), id, s.content, 0, gap);
      STRESS_CHECK(bad.empty(), bad);
    }
    touched_.push_back(id);
    ++front_frees;
  }

  // The engine's background step over the live sequences' computed lengths: it may map or
  // unmap memory, but no sequence's tokens, capacity or table may change.
  void background() {
    op_name_ = "background step";
    std::vector<SeqLength> lengths;
    std::vector<std::vector<int32_t>> tables(live_.size());
    std::vector<uint32_t> capacity(live_.size());
    for (size_t i = 0; i < live_.size(); ++i) {
      lengths.push_back({live_[i], seqs_.at(live_[i]).want});
      kv().seq_table(live_[i], &tables[i]);
      capacity[i] = kv().seq_capacity(live_[i]);
    }
    kv().background_step(lengths);
    ++backgrounds;
    std::vector<int32_t> now;
    for (size_t i = 0; i < live_.size(); ++i) {
      const SeqId id = live_[i];
      kv().seq_table(id, &now);
      STRESS_CHECK(now == tables[i], "the background step changed seq " << id << "'s table");
      STRESS_CHECK(
          kv().seq_capacity(id) == capacity[i] && kv().seq_tokens(id) == seqs_.at(id).tokens,
          "the background step changed seq " << id << "'s tokens or capacity");
    }
  }

  // A new sequence (or a resumed one) with a prompt of n tokens, from its cached prefix.
  bool start(SeqId id, const TokenContent& content, uint32_t n) {
    const TokenContent prompt = content.slice(0, n);
    const Snapshot before = snap();
    const uint32_t prefix = kv().lookup_prefix(prompt);
    check_unchanged(before, "lookup_prefix");
    STRESS_CHECK(prefix < n && prefix % before.stats.block_tokens == 0,
                 "lookup_prefix returned " << prefix << " of a " << n << "-token prompt");
    const uint64_t room = kv().free_token_capacity();
    const Status st = kv().grow(id, prompt, n, prefix);
    ++grows;
    if (!st.ok()) {
      STRESS_CHECK(st.error().code == ErrorCode::kOutOfMemory,
                   "grow of a new sequence failed: " << st.error().message);
      ++ooms;
      check_unchanged(before, "a failed grow of a new sequence");
      STRESS_CHECK(kv().seq_tokens(id) == 0, "a failed new sequence is live");
      STRESS_CHECK(n > room, n << " tokens did not fit in free_token_capacity " << room);
      return false;
    }
    STRESS_CHECK(prefix != 0 || n <= room,
                 n << " tokens fit though free_token_capacity was " << room);
    const KvStats after = kv().stats();
    const uint64_t need = blocks_for(n, prefix);
    STRESS_CHECK(before.stats.free_blocks <= after.free_blocks + need,
                 "a " << n << "-token sequence with a " << prefix << "-token prefix took "
                      << before.stats.free_blocks - after.free_blocks << " free blocks");
    STRESS_CHECK(after.used_blocks <= before.stats.used_blocks + blocks_for(n, 0),
                 "a new sequence took too many blocks");
    prefix_hit_tokens += prefix;
    seqs_[id] = Seq{content, n, n, prefix};
    live_.push_back(id);
    write_computed(id);
    return true;
  }

  // grow(id, n) of a live sequence. Within seq_capacity it must succeed and change only the
  // token counters; beyond, it may fail with kOutOfMemory having changed nothing.
  bool grow(SeqId id, uint32_t n) {
    Seq& s = seqs_.at(id);
    const uint32_t capacity = kv().seq_capacity(id);
    const Snapshot before = snap();
    const Status st = kv().grow(id, s.content, n, 0);
    ++grows;
    if (!st.ok()) {
      STRESS_CHECK(st.error().code == ErrorCode::kOutOfMemory,
                   "grow of seq " << id << " to " << n << " failed: " << st.error().message);
      ++ooms;
      STRESS_CHECK(n > capacity, "grow to " << n << " within capacity " << capacity << " failed");
      check_unchanged(before, "a failed grow");
      return false;
    }
    if (n <= capacity) {
      KvStats want = before.stats;
      want.tokens_stored += n - s.tokens;
      Snapshot expected = before;
      expected.stats = want;
      check_unchanged(expected, "a grow within seq_capacity");
      STRESS_CHECK(kv().seq_capacity(id) == capacity, "a grow within capacity changed it");
    }
    s.tokens = n;
    s.want = std::max(s.want, n);
    write_computed(id);
    return true;
  }

  // The engine's decode step: grow only past seq_capacity, otherwise defer (and maybe sync).
  void lazy_append(SeqId id, uint32_t k) {
    Seq& s = seqs_.at(id);
    const uint32_t old = s.want;
    s.want = std::min(kMaxModelLen, s.want + k);
    if (s.want > kv().seq_capacity(id)) {
      if (!grow(id, s.want)) {
        seqs_.at(id).want = old;
        on_oom();
      }
      return;
    }
    ++deferred;
    write_computed(id);
    if (chance(30)) sync(id);
  }

  void sync(SeqId id) {
    const Seq& s = seqs_.at(id);
    if (s.want > s.tokens) STRESS_CHECK(grow(id, s.want), "sync failed");
  }

  void fork(SeqId parent) {
    sync(parent);
    const Seq p = seqs_.at(parent);
    const SeqId child = next_id_++;
    const Snapshot before = snap();
    const Status st = kv().fork(parent, child);
    if (!st.ok()) {
      STRESS_CHECK(st.error().code == ErrorCode::kOutOfMemory,
                   "fork failed: " << st.error().message);
      ++ooms;
      check_unchanged(before, "a failed fork");
      STRESS_CHECK(kv().seq_tokens(child) == 0, "a failed fork left the child live");
      return;
    }
    ++forks;
    // The child shares the parent's rows: nothing is written.
    seqs_[child] = Seq{fresh_content(p.content.slice(0, p.tokens)), p.tokens, p.tokens, p.tokens};
    live_.push_back(child);
    touched_.push_back(parent);
    touched_.push_back(child);
  }

  void release(SeqId id, bool preempt) {
    sync(id);
    const Seq s = seqs_.at(id);
    kv().release(id, s.content);
    forget(id);
    STRESS_CHECK(kv().seq_tokens(id) == 0 && kv().seq_bytes(id) == 0 && kv().seq_capacity(id) == 0,
                 "released seq " << id << " still holds something");
    if (recent_.size() < kRecentContents)
      recent_.push_back(s.content.slice(0, s.tokens));
    else
      recent_[rnd(0, kRecentContents - 1)] = s.content.slice(0, s.tokens);
    if (!preempt) {
      ++releases;
      return;
    }
    ++preempts;  // recomputed from scratch later under the same id
    if (preempted_.size() == kMaxPreempted) preempted_.erase(preempted_.begin());
    preempted_.push_back({id, s.content, s.tokens});
  }

  // Out of memory: as an engine would, sometimes preempt a running sequence.
  void on_oom() {
    if (!live_.empty() && chance(40)) release(pick_live(), true);
  }

  // The engine writes the K/V of the tokens it computed through the sequence's current table.
  void write_computed(SeqId id) {
    Seq& s = seqs_.at(id);
    if (content_) {
      const std::string bad = content_->write(kv(), id, s.content, s.written, s.want);
      STRESS_CHECK(bad.empty(), bad);
    }
    s.written = s.want;
    touched_.push_back(id);
  }

  // ---- checks -------------------------------------------------------------------------------

  void check_content(bool every_live) {
    if (!content_) return;
    const std::vector<SeqId>& which = every_live ? live_ : touched_;
    for (SeqId id : which) {
      const auto it = seqs_.find(id);
      if (it == seqs_.end()) continue;  // released by the operation
      const std::string bad = content_->check(kv(), id, it->second.content, it->second.want);
      STRESS_CHECK(bad.empty(), bad);
    }
  }

  void check_all() {
    std::string why;
    STRESS_CHECK(kv().check_invariants(&why), why);
    const KvStats s = kv().stats();
    STRESS_CHECK(s.used_blocks + s.cached_blocks + s.free_blocks == s.total_blocks, describe(s));
    const uint64_t g = rig_.backend.granularity();
    STRESS_CHECK(rig_.backend.usage().physical_bytes == (s.pool_bytes + g - 1) / g * g,
                 "backend holds " << rig_.backend.usage().physical_bytes << " bytes for a pool of "
                                  << s.pool_bytes);
    STRESS_CHECK(s.evicted_blocks >= last_.evicted_blocks && s.cow_copies >= last_.cow_copies,
                 "eviction or CoW counters went down");
    last_ = s;
    uint64_t tokens = 0;
    for (SeqId id : live_) {
      const Seq& q = seqs_.at(id);
      const uint32_t have = kv().seq_tokens(id), capacity = kv().seq_capacity(id);
      STRESS_CHECK(have == q.tokens,
                   "seq " << id << " holds " << have << " tokens, the model " << q.tokens);
      STRESS_CHECK(q.want <= capacity && capacity <= kMaxModelLen,
                   "seq " << id << " capacity " << capacity << " but " << q.want
                          << " tokens are computed (" << q.tokens << " grown)");
      STRESS_CHECK(kv().seq_bytes(id) > 0, "live seq " << id << " holds no bytes");
      tokens += q.tokens;
    }
    STRESS_CHECK(s.tokens_stored <= tokens && s.tokens_stored <= s.slots_allocated,
                 describe(s) << " for " << tokens << " live tokens");
  }

  void finish() {
    op_name_ = "release all";
    while (!live_.empty()) {
      release(live_.back(), false);
      check_all();
    }
    const KvStats s = kv().stats();
    STRESS_CHECK(
        s.used_blocks == used_at_init_ && s.tokens_stored == 0 && s.slots_allocated == 0,
        "after releasing everything: " << describe(s) << ", " << used_at_init_ << " used at init");
    op_name_ = "shutdown";
    const Status st = kv().shutdown();
    STRESS_CHECK(st.ok(), "shutdown: " << st.error().message);
    const Usage u = rig_.backend.usage();
    STRESS_CHECK(u.physical_bytes == 0 && u.virtual_reserved == 0 && u.virtual_mapped == 0,
                 "after shutdown the backend holds " << u.physical_bytes << " physical, "
                                                     << u.virtual_reserved << " reserved bytes");
    std::string why;
    STRESS_CHECK(rig_.backend.check_invariants(&why), why);
  }

  Variant variant_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  KvRig rig_;
  uint64_t used_at_init_ = 0;
  uint64_t op_ = 0;
  const char* op_name_ = "init";
  KvStats last_;
  SeqId next_id_ = 1;
  uint64_t next_stream_ = kFirstUniqueStream;
  std::vector<SeqId> live_;
  std::unordered_map<SeqId, Seq> seqs_;
  std::vector<TokenContent> recent_;
  std::vector<Preempted> preempted_;
  std::optional<KvContentShadow> content_;
  std::vector<SeqId> touched_;  // sequences the current operation wrote or forked
};

TEST_CASE("KV stress: 1M random operations per strategy and variant, checked after each") {
  const uint64_t ops = env_or("MEMSIM_KV_STRESS_OPS", kOpsPerVariant);
  const std::vector<Variant> all = variants();
  for (size_t i = 0; i < all.size(); ++i) {
    DYNAMIC_SECTION(all[i].name) {
      const uint64_t seed = env_or("MEMSIM_KV_STRESS_SEED", 0x6b76737472657373ull + i);
      const auto t0 = std::chrono::steady_clock::now();
      Stress stress(all[i], seed);
      stress.run(ops);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf(
          "%-28s %.2f s: %llu grows (%llu OOM), %llu deferred, %llu forks, %llu releases, "
          "%llu preemptions, %llu prefix-hit tokens, %llu background steps, %llu front "
          "frees\n",
          all[i].name.c_str(), secs, static_cast<unsigned long long>(stress.grows),
          static_cast<unsigned long long>(stress.ooms),
          static_cast<unsigned long long>(stress.deferred),
          static_cast<unsigned long long>(stress.forks),
          static_cast<unsigned long long>(stress.releases),
          static_cast<unsigned long long>(stress.preempts),
          static_cast<unsigned long long>(stress.prefix_hit_tokens),
          static_cast<unsigned long long>(stress.backgrounds),
          static_cast<unsigned long long>(stress.front_frees));
      if (all[i].yaml.find("vmm_contiguous") != std::string::npos &&
          all[i].yaml.find("sync") == std::string::npos)
        CHECK(stress.backgrounds > ops / 10);  // async vmm: background steps ran
      // The pool is small: out-of-memory must be a common outcome, not a corner case.
      CHECK(stress.ooms * 50 > ops);
      if (all[i].expect_hits) CHECK(stress.prefix_hit_tokens > 0);
      if (!all[i].expect_hits) CHECK(stress.prefix_hit_tokens == 0);
      if (make_kv(all[i].yaml)->frees_front()) CHECK(stress.front_frees > ops / 100);
    }
  }
}

TEST_CASE("KV content: every sequence reads its own tokens through its table") {
  // Fewer operations than the stress test: each one also writes and reads rows of the shadow.
  const uint64_t ops = env_or("MEMSIM_KV_CONTENT_OPS", 100'000);
  const std::vector<Variant> all = variants();
  for (size_t i = 0; i < all.size(); ++i) {
    DYNAMIC_SECTION(all[i].name) {
      Stress stress(all[i], env_or("MEMSIM_KV_STRESS_SEED", 0x636f6e74656e74ull + i), true);
      stress.run(ops);
      CHECK(stress.forks > 0);
      if (all[i].expect_hits) CHECK(stress.prefix_hit_tokens > 0);
      if (!all[i].expect_hits) CHECK(stress.prefix_hit_tokens == 0);
    }
  }
}

}  // namespace
}  // namespace memsim::test
