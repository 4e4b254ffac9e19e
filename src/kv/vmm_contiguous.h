// vmm_contiguous: vAttention (Prabhu et al., ASPLOS'25) — each request's KV stays virtually
// contiguous in per-layer K and V tensors while physical pages are mapped on demand (CUDA VMM).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "src/kv/kv_cache_manager.h"

namespace memsim {

struct VmmContiguousConfig {
  // Physical page size; 0 = the backend's granularity (2 MiB on H200). Must be a multiple of the
  // granularity: vAttention's 64/128/256 KiB pages need its modified NVIDIA driver.
  uint64_t page_size = 0;
  // reserved (vAttention's reserve_physical_pages, called by its Sarathi-Serve cache engine):
  // every page of the budget is created at init and kept in a free list, so mapping a page is
  // cuMemMap + cuMemSetAccess and unmapping returns it to the list. on_demand: pages are
  // created when mapped and released when unmapped (the pool holds only what is mapped).
  bool reserved_physical = true;
  // deferred (vAttention's default, deferred_reclaim = true): a finished request's pages stay
  // mapped in its slot for the next request there and are reclaimed only when another slot
  // needs pages and none is free. eager: they are unmapped at release (sync allocation) or one
  // page group per step by the background thread when no step needs a page (async).
  bool deferred_reclaim = true;
  // async (vAttention's step_async, its recommended mode): a background thread maps the pages
  // the next step needs, and eagerly those of the next eager_steps - 1 steps up to
  // eager_groups page groups, while the current step computes; only a step's own shortfall
  // (a prefill, or what the thread could not map) is mapped on the critical path. sync
  // (vAttention's "_sync" backends): every mapping is on the critical path.
  bool async = true;
  uint32_t eager_steps = 10;  // vAttention's EAGER_NUM_STEPS
  uint32_t eager_groups = 2;  // vAttention's EAGER_NUM_KVBLOCKS
};

// Layout: for each layer, K and V are each one reserved virtual tensor
// [max_num_seqs, stride] where stride = max_model_len x K bytes per token per layer, rounded up to
// the page size; request slot i owns sub-range i of all 2 x layers tensors. A "block" is a page
// group: one page in each of the 2 x layers tensors, mapped together (map + set_access per page,
// after create_physical when pages are created on demand; tag "kv_cache") when a request's length
// crosses a page boundary, so a group holds page_size / (per-layer K bytes per token) tokens. The
// physical budget bounds the groups: total_blocks = min(budget / (2 x layers x page_size),
// max_num_seqs x groups per slot); reserved physical pages are exactly total_blocks x 2 x layers.
// Unmapping (release, reclaim, rollback, shutdown) takes one unmap per tensor over the slot's
// contiguous range of dropped groups, then returns each page (to the reserved list, or
// release_physical when pages are created on demand).
//
// Stats: used_blocks = groups a live request needs (ceil(tokens x K bytes / page_size));
// cached_blocks = groups mapped but not needed: deferred pages of free slots, pages a new request
// in such a slot has not grown into yet, and pages mapped ahead of need by the background step;
// they are reclaimed (unmapped, in least-recently-released order, free slots first) when the
// budget has no free group left, and count as evicted_blocks then. pool_bytes = physical bytes
// held: total_blocks x block_bytes when reserved, (used + cached) x block_bytes on demand.
// Where vAttention differs: it picks a new request's slot by best fit over free slots' mapped
// pages (alloc_new_batch_idx) and reclaims from the highest slot id down; memsim takes the most
// recently released slot with pages and reclaims least recently released first (O(1) each).
// Operations are O(pages mapped or unmapped) plus O(1) bookkeeping (hash map, intrusive lists);
// check_invariants is O(slots).
class VmmContiguous final : public KvCacheManager {
 public:
  explicit VmmContiguous(const VmmContiguousConfig& config) : config_(config) {}
  ~VmmContiguous() override = default;

  std::string_view name() const override { return "vmm_contiguous"; }
  Status init(Backend& backend, const KvInit& init) override;
  Status shutdown() override;

  uint32_t lookup_prefix(const TokenContent& content) const override;
  Status grow(SeqId seq, const TokenContent& content, uint32_t num_tokens,
              uint32_t prefix_tokens) override;
  Status fork(SeqId parent, SeqId child) override;
  void release(SeqId seq, const TokenContent& content) override;

  uint32_t seq_tokens(SeqId seq) const override;
  uint64_t seq_bytes(SeqId seq) const override;
  // Tokens of the groups the request needs (its used_blocks), capped at max_model_len. Deferred
  // excess groups mapped in its slot do not count: another request's grow may reclaim them.
  uint32_t seq_capacity(SeqId seq) const override;
  uint64_t free_token_capacity() const override;

  bool has_background() const override { return config_.async; }
  // vAttention's do_kvcache_memory_management, one call per step: the groups every sequence
  // needs one token later (all or nothing: if free plus reclaimable groups cannot cover them,
  // nothing is mapped), reclaiming cached groups of other slots when no group is free; then
  // eagerly, in step order, the groups they need up to eager_steps - 1 tokens later until
  // eager_groups groups were mapped in this call; with eager reclamation and nothing needed,
  // one cached group of a free slot is unmapped. O(sequences x eager_steps).
  void background_step(const std::vector<SeqLength>& after_step) override;

  KvLayout layout() const override;
  void seq_table(SeqId seq, std::vector<int32_t>* out) const override;
  KvStats stats() const override;
  bool check_invariants(std::string* why) const override;

  uint64_t page_size() const { return page_; }
  uint64_t slot_stride() const { return stride_; }  // bytes per slot in each K/V tensor
  uint32_t groups_per_slot() const { return groups_per_slot_; }
  // Base of tensor b (2l = K of layer l, 2l+1 = V of layer l).
  DevPtr tensor_base(uint32_t b) const { return bases_[b]; }
  // Page groups mapped in the slot of live `seq` (deferred excess included); -1 when not live.
  int64_t seq_mapped_groups(SeqId seq) const;

 private:
  static constexpr uint32_t kNil = UINT32_MAX;
  enum class Where : uint8_t { kEmptyFree, kDeferredFree, kLive };
  struct Slot {
    std::vector<PhysHandle> pages;  // group-major: pages[g * buffers + b]
    uint32_t mapped = 0;            // page groups mapped
    uint32_t needed = 0;            // groups the live request needs (0 when free)
    Where where = Where::kEmptyFree;
    bool listed = false;  // in deferred_ (free) or excess_ (live)
    uint32_t prev = kNil, next = kNil;
  };
  struct List {
    uint32_t head = kNil, tail = kNil;
    uint32_t size = 0;
  };
  struct Seq {
    uint32_t slot;
    uint32_t tokens;
  };

  uint32_t buffers() const { return 2 * init_.layers; }
  uint32_t groups_for(uint32_t tokens) const;
  uint64_t tokens_in(uint64_t groups) const;  // token slots of `groups` groups in one slot
  DevPtr page_va(uint32_t b, uint32_t slot, uint32_t group) const;

  void list_push(List& l, uint32_t slot);
  void list_remove(List& l, uint32_t slot);
  // Picks the slot a new request gets: the most recently released one with deferred pages,
  // else an empty one; kNil when none is free.
  uint32_t peek_free_slot() const;
  void acquire(uint32_t slot);    // free -> live (needed 0), counters unchanged
  void make_free(uint32_t slot);  // live (needed 0) -> free, into the right structure
  // Counter contributions of a live slot, and its excess-list membership.
  void detach(uint32_t slot);
  void attach(uint32_t slot);

  Status map_group(uint32_t slot);  // appends one group; rolls its own partial work back
  // Maps groups of live `slot` until `mapped` groups are (needed unchanged: the new groups are
  // cached excess), reclaiming other slots' cached groups when none is free. Keeps the groups
  // it mapped when a later one fails.
  Status map_ahead(uint32_t slot, uint32_t mapped);
  Result<PhysHandle> take_page();  // a reserved page, or a newly created one
  Status give_page(PhysHandle h);  // back to the reserved list, or released
  // Drops the top `count` groups: one unmap per tensor, one release per page (best effort,
  // returns the first error).
  Status unmap_groups(uint32_t slot, uint32_t count);
  // Unmaps `count` cached (mapped, not needed) groups of a free or excess-listed slot, keeping the
  // counters and the slot lists right.
  Status drop_cached(uint32_t slot, uint32_t count);
  Status reclaim(uint64_t groups);  // unmaps cached groups of other slots (evictions)
  // Makes live slot `slot` need `target` groups (>= its current need). All-or-nothing for the
  // slot; on failure the slot is as before (reclaimed cached groups of other slots stay freed).
  Status extend(uint32_t slot, uint32_t target);
  // Shrinks live slot `slot` back to `mapped` groups and `needed` (undoes a fork's extend).
  void shrink(uint32_t slot, uint32_t mapped, uint32_t needed);
  Status validate_grow(SeqId seq, const TokenContent& content, uint32_t num_tokens,
                       uint32_t prefix_tokens) const;

  VmmContiguousConfig config_;
  Backend* backend_ = nullptr;
  KvInit init_;
  uint64_t k_bytes_ = 0;  // K (= V) bytes per token per layer
  uint64_t page_ = 0;
  uint64_t stride_ = 0;
  uint32_t groups_per_slot_ = 0;
  uint64_t total_groups_ = 0;
  std::vector<DevPtr> bases_;           // 2 x layers reserved tensors
  std::vector<PhysHandle> free_pages_;  // reserved pages not mapped (reserved_physical)
  std::vector<Slot> slots_;
  std::vector<uint32_t> empty_free_;  // free slots with no pages (stack)
  List deferred_;                     // free slots with pages, least recently released first
  List excess_;                       // live slots with mapped > needed
  std::unordered_map<SeqId, Seq> seqs_;

  uint64_t free_groups_ = 0;    // total - mapped
  uint64_t used_groups_ = 0;    // sum of needed over live slots
  uint64_t cached_groups_ = 0;  // sum of mapped - needed over all slots
  uint64_t slots_allocated_ = 0;
  uint64_t tokens_stored_ = 0;
  uint64_t cow_copies_ = 0;
  uint64_t cow_bytes_ = 0;
  uint64_t evicted_groups_ = 0;
};

}  // namespace memsim
