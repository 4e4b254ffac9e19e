// radix_token_pool: SGLang's token-slot allocator, req_to_token table and radix prefix cache
// (allocator.py, memory_pool.py, radix_cache.py) behind the KvCacheManager role.
#include "src/kv/radix_token_pool.h"

#include <fmt/format.h>
#include <algorithm>

namespace memsim {
namespace {

// SGLang sizes req_to_token as [max_running_requests, context_len + 4] (extra_max_context_len).
constexpr uint64_t kReqToTokenExtraColumns = 4;

uint64_t round_up(uint64_t x, uint64_t unit) {
  return unit ? (x + unit - 1) / unit * unit : x;
}

}  // namespace

RadixTokenPool::RadixTokenPool(RadixTokenPoolConfig config)
    : config_(config), tree_(config.page_size, config.eviction) {}

Status RadixTokenPool::init(Backend& backend, const KvInit& init) {
  if (backend_) return make_error(ErrorCode::kInvalidState, "radix_token_pool: init called twice");
  if (init.layers == 0 || init.kv_bytes_per_token == 0)
    return make_error(ErrorCode::kInvalidArgument, "radix_token_pool: empty model geometry");
  if (page_size() == 0 || page_size() > RadixTokenPoolConfig::kMaxPageSize)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("radix_token_pool: page size {}", page_size()));
  page_bytes_ = uint64_t{page_size()} * init.kv_bytes_per_token;
  // Pages that fit, the padding page 0 included; at least one usable page besides it.
  const uint64_t fit = std::min<uint64_t>(init.budget_bytes / page_bytes_, UINT32_MAX - 1);
  if (fit < 2)
    return make_error(
        ErrorCode::kOutOfMemory,
        fmt::format("radix_token_pool: a budget of {} bytes holds {} pages of {} bytes (the "
                    "padding page and one usable page are needed)",
                    init.budget_bytes, fit, page_bytes_),
        2 * page_bytes_ - std::min(init.budget_bytes, 2 * page_bytes_));
  MEMSIM_ASSIGN_OR_RETURN(pool_, backend.device_malloc(fit * page_bytes_, "kv_cache"));
  backend_ = &backend;
  init_ = init;
  pool_bytes_ = round_up(fit * page_bytes_, backend.granularity());
  total_pages_ = static_cast<uint32_t>(fit - 1);
  free_.clear();
  for (uint32_t p = 1; p <= total_pages_; ++p) free_.push_back(p);
  tree_.clear();
  seqs_.clear();
  private_pages_ = private_tokens_ = cow_copies_ = evicted_ = 0;
  return {};
}

Status RadixTokenPool::shutdown() {
  if (!backend_) return {};
  const Status s = backend_->device_free(pool_);
  backend_ = nullptr;
  pool_ = 0;
  pool_bytes_ = 0;
  total_pages_ = 0;
  free_.clear();
  tree_.clear();
  seqs_.clear();
  private_pages_ = private_tokens_ = 0;
  return s;
}

Error RadixTokenPool::out_of_pages(uint64_t need, uint64_t available) const {
  return make_error(
      ErrorCode::kOutOfMemory,
      fmt::format("radix_token_pool: {} pages needed, {} free or evictable", need, available),
      (need - available) * page_bytes_);
}

void RadixTokenPool::make_free(uint64_t need) {
  if (free_.size() >= need) return;
  // SGLang evict_from_tree_cache: evict the shortfall, whole leaves, lowest priority first.
  evict(need - free_.size());
}

uint64_t RadixTokenPool::evict(uint64_t pages) {
  std::vector<uint32_t> freed;
  const uint64_t n = tree_.evict(pages, &freed);
  evicted_ += n;
  give_pages(freed.data(), freed.size());
  return n;
}

void RadixTokenPool::take_pages(uint64_t n, std::vector<uint32_t>* out) {
  for (uint64_t i = 0; i < n; ++i) {
    out->push_back(free_.front());
    free_.pop_front();
  }
}

void RadixTokenPool::give_pages(const uint32_t* first, size_t n) {
  if (n == 0) return;
  if (page_size() == 1) {  // TokenToKVPoolAllocator.free appends to free_pages
    free_.insert(free_.end(), first, first + n);
    return;
  }
  // PagedTokenToKVPoolAllocator.free prepends the freed pages, sorted (torch.unique).
  std::vector<uint32_t> batch(first, first + n);
  std::sort(batch.begin(), batch.end());
  free_.insert(free_.begin(), batch.begin(), batch.end());
}

Status RadixTokenPool::copy_page(uint32_t dst, uint32_t src) {
  MEMSIM_TRY(backend_->copy(pool_ + dst * page_bytes_, pool_ + src * page_bytes_, page_bytes_,
                            StreamId{}));
  ++cow_copies_;
  return {};
}

uint32_t RadixTokenPool::lookup_prefix(const TokenContent& content) const {
  if (!backend_ || config_.disable_radix_cache || content.begin() != 0 || content.size() < 2)
    return 0;
  return tree_.match(content, content.size() - 1).tokens;
}

KvCacheManager::PrefixMatch RadixTokenPool::match_prefix(const TokenContent& content) const {
  PrefixMatch m;
  if (!backend_ || config_.disable_radix_cache || content.begin() != 0 || content.size() < 2)
    return m;
  const RadixTree::Match t = tree_.match(content, content.size() - 1);
  m.tokens = t.tokens;
  m.evictable_tokens = t.unlocked_pages * page_size();
  for (uint32_t n = t.node; n != RadixTree::kRoot; n = tree_.parent_of(n)) m.path.push_back(n);
  std::reverse(m.path.begin(), m.path.end());
  return m;
}

Status RadixTokenPool::grow(SeqId seq, const TokenContent& content, uint32_t num_tokens,
                            uint32_t prefix_tokens) {
  if (!backend_) return make_error(ErrorCode::kInvalidState, "radix_token_pool: not initialized");
  if (content.begin() != 0 || num_tokens > content.size() || num_tokens > init_.max_model_len)
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("radix_token_pool: grow to {} tokens (content [{}, {}), max_model_len {})",
                    num_tokens, content.begin(), content.size(), init_.max_model_len));
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    if (prefix_tokens % page_size() || prefix_tokens > num_tokens ||
        (prefix_tokens && config_.disable_radix_cache))
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("radix_token_pool: prefix of {} tokens", prefix_tokens));
    RadixTree::Match m;
    if (prefix_tokens) {
      m = tree_.match(content, prefix_tokens);
      if (m.tokens < prefix_tokens)
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("radix_token_pool: only {} of the {} prefix tokens are "
                                      "cached (lookup_prefix and grow must run back to back)",
                                      m.tokens, prefix_tokens));
    }
    // The matched path is locked before anything is evicted, so it never counts as evictable.
    const uint64_t need = pages_for(num_tokens) - prefix_tokens / page_size();
    const uint64_t available = available_pages() - m.unlocked_pages;
    if (need > available) return out_of_pages(need, available);
    Seq s;
    s.tokens = num_tokens;
    s.cached = prefix_tokens;
    s.content = content;
    if (prefix_tokens) {  // SGLang match_prefix (access times, split) + inc_lock_ref
      tree_.begin_op();
      s.node = tree_.descend(content, prefix_tokens, false).node;
      tree_.lock(s.node);
    }
    make_free(need);
    take_pages(need, &s.pages);
    private_pages_ += need;
    private_tokens_ += num_tokens - prefix_tokens;
    seqs_.emplace(seq, std::move(s));
    return {};
  }
  Seq& s = it->second;
  if (prefix_tokens)
    return make_error(ErrorCode::kInvalidArgument, "radix_token_pool: prefix for a live sequence");
  if (num_tokens < s.tokens)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("radix_token_pool: sequence {} holds {} tokens, grow to {}", seq,
                                  s.tokens, num_tokens));
  const uint64_t need = pages_for(num_tokens - s.cached) - s.pages.size();
  const uint64_t available = available_pages();
  if (need > available) return out_of_pages(need, available);
  make_free(need);
  take_pages(need, &s.pages);
  private_pages_ += need;
  private_tokens_ += num_tokens - s.tokens;
  s.tokens = num_tokens;
  s.content = content;
  return {};
}

void RadixTokenPool::insert_into_tree(Seq& s, uint32_t computed) {
  // [0, cached) is in the tree already (and computed); the rest up to `computed` joins it.
  const uint32_t aligned =
      std::max(s.cached, std::min(s.tokens, computed) / page_size() * page_size());
  if (aligned == 0) return;
  tree_.begin_op();
  const RadixTree::Descent d = tree_.descend(s.content, aligned, true);
  // The sequence's own locked path matches, so d.tokens >= s.cached.
  const size_t dup = (d.tokens - s.cached) / page_size();
  uint32_t node = d.node, end = d.tokens;
  if (d.tokens < aligned && !d.blocked) {
    const size_t last = (aligned - s.cached) / page_size();
    node = tree_.add_leaf(d.node, s.content, aligned,
                          std::vector<uint32_t>(s.pages.begin() + dup, s.pages.begin() + last));
    end = aligned;
  }
  give_pages(s.pages.data(), dup);  // duplicates of pages the tree already held
  const size_t moved = (end - s.cached) / page_size();
  s.pages.erase(s.pages.begin(), s.pages.begin() + moved);
  private_pages_ -= moved;
  private_tokens_ -= end - s.cached;
  tree_.lock(node);
  tree_.unlock(s.node);
  s.node = node;
  s.cached = end;
}

Status RadixTokenPool::fork(SeqId parent, SeqId child) {
  if (!backend_) return make_error(ErrorCode::kInvalidState, "radix_token_pool: not initialized");
  auto p = seqs_.find(parent);
  if (p == seqs_.end() || parent == child || seqs_.count(child))
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("radix_token_pool: fork {} -> {}", parent, child));
  Seq& ps = p->second;
  if (!config_.disable_radix_cache) {
    // Check first that the child's copy of the partial page fits once the parent's full pages
    // are in the tree: its private duplicates come free, evictable pages on its path lock.
    const uint32_t aligned = ps.tokens / page_size() * page_size();
    const RadixTree::Match m = tree_.match(ps.content, aligned);
    const uint64_t dup = m.tokens > ps.cached ? (m.tokens - ps.cached) / page_size() : 0;
    const uint64_t need = ps.tokens % page_size() ? 1 : 0;
    const uint64_t available = available_pages() + dup - m.unlocked_pages;
    if (need > available) return out_of_pages(need, available);
    insert_into_tree(ps, ps.tokens);  // SGLang cache_unfinished_req
  }
  // The child shares the parent's tree path and copies its private pages (the partial tail).
  const uint64_t copies = ps.pages.size();
  if (copies > available_pages()) return out_of_pages(copies, available_pages());
  make_free(copies);
  Seq c;
  c.tokens = ps.tokens;
  c.cached = ps.cached;
  c.node = ps.node;
  c.content = ps.content;
  take_pages(copies, &c.pages);
  for (size_t i = 0; i < copies; ++i) {
    const Status copied = copy_page(c.pages[i], ps.pages[i]);
    if (!copied.ok()) {
      give_pages(c.pages.data(), c.pages.size());
      return copied;
    }
  }
  tree_.lock(c.node);
  private_pages_ += copies;
  private_tokens_ += c.tokens - c.cached;
  seqs_.emplace(child, std::move(c));
  return {};
}

void RadixTokenPool::release(SeqId seq, const TokenContent& content) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  Seq& s = it->second;
  if (!config_.disable_radix_cache) {  // SGLang cache_finished_req
    // Only the KV the caller computed, [0, content.size()) (SGLang inserts kv_committed_len
    // tokens); its pages past that, allocated for a step that never ran, are freed below.
    insert_into_tree(s, content.size());
    tree_.unlock(s.node);
  }
  give_pages(s.pages.data(), s.pages.size());  // the unaligned tail (or everything, disabled)
  private_pages_ -= s.pages.size();
  private_tokens_ -= s.tokens - s.cached;
  seqs_.erase(it);
}

uint32_t RadixTokenPool::seq_tokens(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.tokens;
}

uint32_t RadixTokenPool::seq_cached_tokens(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.cached;
}

uint64_t RadixTokenPool::seq_bytes(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  return (it->second.cached / page_size() + it->second.pages.size()) * page_bytes_;
}

uint32_t RadixTokenPool::seq_capacity(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  // A grow up to here needs no page (grow's need is 0): only counters and the content change.
  const Seq& s = it->second;
  const uint64_t slots = s.cached + s.pages.size() * uint64_t{page_size()};
  return static_cast<uint32_t>(std::min<uint64_t>(slots, init_.max_model_len));
}

uint64_t RadixTokenPool::free_token_capacity() const {
  return available_pages() * page_size();
}

std::vector<uint32_t> RadixTokenPool::page_table(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return {};
  std::vector<uint32_t> out;
  std::vector<uint32_t> path;
  for (uint32_t n = it->second.node; n != RadixTree::kRoot; n = tree_.parent_of(n))
    path.push_back(n);
  for (auto n = path.rbegin(); n != path.rend(); ++n) {
    const auto& pages = tree_.pages_of(*n);
    out.insert(out.end(), pages.begin(), pages.end());
  }
  out.insert(out.end(), it->second.pages.begin(), it->second.pages.end());
  return out;
}

KvStats RadixTokenPool::stats() const {
  KvStats s;
  s.block_tokens = page_size();
  s.block_bytes = page_bytes_;
  s.total_blocks = total_pages_;
  s.used_blocks = tree_.protected_pages() + private_pages_;
  s.cached_blocks = tree_.evictable_pages();
  s.free_blocks = free_.size();
  s.slots_allocated = s.used_blocks * page_size();
  s.tokens_stored = tree_.protected_pages() * page_size() + private_tokens_;
  s.pool_bytes = pool_bytes_;
  if (backend_)
    s.metadata_bytes = uint64_t{init_.max_num_seqs} *
                       (init_.max_model_len + kReqToTokenExtraColumns) * sizeof(int32_t);
  s.cow_copies = cow_copies_;
  s.cow_bytes = cow_copies_ * page_bytes_;
  s.evicted_blocks = evicted_;
  return s;
}

bool RadixTokenPool::check_invariants(std::string* why) const {
  auto fail = [&](std::string msg) {
    if (why) *why = "radix_token_pool: " + std::move(msg);
    return false;
  };
  std::vector<uint8_t> owners(uint64_t{total_pages_} + 1, 0);
  uint32_t bad_page = 0;
  auto own = [&](uint32_t page) {
    if (page == 0 || page > total_pages_ || owners[page]++) bad_page = page ? page : UINT32_MAX;
  };
  for (uint32_t page : free_) own(page);
  if (bad_page) return fail(fmt::format("free list holds page {} twice or out of range", bad_page));
  std::vector<uint32_t> locks(tree_.capacity(), 0);
  uint64_t private_pages = 0, private_tokens = 0;
  for (const auto& [id, s] : seqs_) {
    if (!tree_.is_live(s.node) || tree_.end_of(s.node) != s.cached || s.cached % page_size() ||
        s.cached > s.tokens || (config_.disable_radix_cache && s.node != RadixTree::kRoot))
      return fail(fmt::format("seq {} holds {} tokens through node {} ending at {}", id, s.cached,
                              s.node, tree_.is_live(s.node) ? tree_.end_of(s.node) : 0));
    if (s.pages.size() != pages_for(s.tokens - s.cached) || s.content.size() < s.tokens)
      return fail(fmt::format("seq {} has {} private pages for tokens [{}, {})", id, s.pages.size(),
                              s.cached, s.tokens));
    for (uint32_t n = s.node; n != RadixTree::kRoot; n = tree_.parent_of(n)) ++locks[n];
    for (uint32_t page : s.pages) own(page);
    if (bad_page) return fail(fmt::format("seq {} holds page {} owned elsewhere", id, bad_page));
    private_pages += s.pages.size();
    private_tokens += s.tokens - s.cached;
  }
  if (private_pages != private_pages_ || private_tokens != private_tokens_)
    return fail(fmt::format("private pages {} / {}, tokens {} / {}", private_pages, private_pages_,
                            private_tokens, private_tokens_));
  if (!tree_.check(
          why, [&](uint32_t node) { return locks[node]; }, own))
    return false;
  if (bad_page) return fail(fmt::format("the tree holds page {} owned elsewhere", bad_page));
  for (uint32_t page = 1; page <= total_pages_; ++page)
    if (owners[page] != 1) return fail(fmt::format("page {} is lost", page));
  const uint64_t tree_pages = tree_.evictable_pages() + tree_.protected_pages();
  if (free_.size() + tree_pages + private_pages_ != total_pages_)
    return fail(fmt::format("pages not conserved: {} free + {} tree + {} private != {}",
                            free_.size(), tree_pages, private_pages_, total_pages_));
  if (config_.disable_radix_cache && tree_.node_count() != 1)
    return fail("the radix cache is disabled but the tree holds nodes");
  return true;
}

KvLayout RadixTokenPool::layout() const {
  // Page p holds every layer's K and V of its page_size token slots; page 0 is the padding page.
  return block_major_layout(pool_, init_, page_size(), page_bytes_, uint64_t{total_pages_} + 1);
}

void RadixTokenPool::seq_table(SeqId seq, std::vector<int32_t>* out) const {
  out->clear();
  for (uint32_t page : page_table(seq)) out->push_back(static_cast<int32_t>(page));
}

}  // namespace memsim
