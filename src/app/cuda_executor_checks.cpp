// CudaExecutor's content checks (each sampled step's attention output against the same kernels
// over K/V regenerated from the sequences' tokens, with each layer's window) and swaps (rows
// through pinned memory with copy_blocks).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "kernels/synth.h"
#include "src/app/cuda_executor.h"

namespace memsim::cuda_exec {

using namespace kernels;

// The same kernels over K/V regenerated from each sequence's tokens in a packed token-slot layout
// (block size 1, the table built here), with the step's split and the layer's window: the outputs
// must be identical. Positions before a query chunk's first window hold other rows in the
// reference (a token's complement): a kernel that read them, or a freed block, would differ.
Status CudaExecutor::check_part(const StepWork& w, Part& p, uint32_t layer) {
  const uint64_t qe = q_row_elems();
  const uint32_t lane = layer_lane_[layer], window = lanes_[lane].window;
  size_t first = 0;
  while (first < p.seqs.size()) {
    size_t last = first;
    uint64_t tokens = 0;
    uint32_t max_len = 0;
    while (last < p.seqs.size() &&
           (last == first || tokens + uint64_t(p.lens[last]) <= kRefChunkTokens)) {
      tokens += uint64_t(p.lens[last]);
      max_len = std::max<uint32_t>(max_len, p.lens[last]);
      ++last;
    }
    const auto c = static_cast<uint32_t>(last - first);
    std::vector<uint32_t> ra, rb, qa, qb;
    std::vector<int32_t> tables(uint64_t{c} * max_len, 0), lens, indptr{0};
    for (uint32_t i = 0; i < c; ++i) {
      const StepSeq& s = *p.seqs[first + i];
      const auto len = static_cast<uint32_t>(p.lens[first + i]);
      for (uint32_t pos = 0; pos < len; ++pos) {
        tables[uint64_t{i} * max_len + pos] = static_cast<int32_t>(ra.size());
        const bool unseen = window && uint64_t{pos} + window <= s.computed;
        ra.push_back(unseen ? ~s.content->token(pos) : s.content->token(pos));
        rb.push_back(pos);
      }
      lens.push_back(static_cast<int32_t>(len));
      indptr.push_back(indptr.back() + static_cast<int32_t>(s.new_tokens));
    }
    const uint64_t q0 = static_cast<uint64_t>(p.indptr[first]);
    const uint64_t q_rows = static_cast<uint64_t>(p.indptr[last]) - q0;
    qa.assign(p.qa.begin() + q0, p.qa.begin() + q0 + q_rows);
    qb.assign(p.qb.begin() + q0, p.qb.begin() + q0 + q_rows);
    MEMSIM_TRY(upload(ref_a_, ra, stream_));
    MEMSIM_TRY(upload(ref_b_, rb, stream_));
    MEMSIM_TRY(upload(ref_qa_, qa, stream_));
    MEMSIM_TRY(upload(ref_qb_, qb, stream_));
    MEMSIM_TRY(upload(ref_tables_, tables, stream_));
    MEMSIM_TRY(upload(ref_lens_, lens, stream_));
    MEMSIM_TRY(upload(ref_indptr_, indptr, stream_));
    const auto re = static_cast<uint32_t>(row_elems());
    MEMSIM_TRY(ref_q_.reserve(q_rows * qe * elem()));
    MEMSIM_TRY(ref_o_.reserve(q_rows * qe * elem()));
    MEMSIM_TRY(synth_ref_kv(layer, static_cast<uint32_t>(ra.size())));
    MEMSIM_CU(synth_rows(c_.shape.dtype, ref_q_.addr(), static_cast<uint32_t>(q_rows),
                         static_cast<uint32_t>(qe), ref_qa_.as<uint32_t>(), ref_qb_.as<uint32_t>(),
                         synth_salt_q(layer), stream_));
    LayerAttentionArgs a;
    a.q = ref_q_.addr();
    a.o = ref_o_.addr();
    a.cache = {ref_k_.addr(), ref_v_.addr(), static_cast<int64_t>(re), 1, KvAddressing::kPaged};
    a.seqs = {ref_lens_.as<int32_t>(), ref_tables_.as<int32_t>(), max_len, nullptr, nullptr};
    a.window = window;
    if (p.decode) {
      a.dplan =
          p.lanes[plan_lane_[lane]]->dplan;  // the step's split: identical arithmetic per sequence
      a.dplan.max_batch = c;
      a.dplan.workspace_bytes = a.dplan.num_splits > 1
                                    ? uint64_t{c} * a.dplan.num_splits * c_.shape.q_heads *
                                          (c_.shape.head_dim + 1) * sizeof(float)
                                    : 0;
      MEMSIM_TRY(ref_ws_.reserve(a.dplan.workspace_bytes));
    } else {
      // The step's KV chunk (if it split), so these sequences are cut as the step cut them.
      std::vector<int32_t> q_lens;
      for (size_t i = first; i < last; ++i) q_lens.push_back(int32_t(p.seqs[i]->new_tokens));
      const uint32_t chunk = p.lanes[plan_lane_[lane]]->pplan.split.kv_chunk;
      const PrefillPlan plan =
          plan_prefill(c_.shape, q_lens, lens, chunk ? &limits_ : nullptr, 0, chunk, window);
      MEMSIM_TRY(upload(ref_work_, plan.work, stream_));
      MEMSIM_TRY(ref_ws_.reserve(plan.workspace_bytes));
      a.qo_indptr = ref_indptr_.as<int32_t>();
      a.work = ref_work_.as<int32_t>();
      a.num_tiles = plan.num_tiles;
      a.psplit = plan.split;
    }
    a.workspace = ref_ws_.addr();
    MEMSIM_TRY(attend(p, a));
    MEMSIM_TRY(compare(w, p, layer, first, indptr, q0, q_rows));
    first = last;
  }
  return {};
}

Status CudaExecutor::synth_ref_kv(uint32_t layer, uint32_t rows) {
  const auto re = static_cast<uint32_t>(row_elems());
  MEMSIM_TRY(ref_k_.reserve(uint64_t{rows} * re * kv_elem()));
  MEMSIM_TRY(ref_v_.reserve(uint64_t{rows} * re * kv_elem()));
  if (!c_.shape.kv_fp8()) {
    MEMSIM_CU(synth_rows(c_.shape.dtype, ref_k_.addr(), rows, re, ref_a_.as<uint32_t>(),
                         ref_b_.as<uint32_t>(), synth_salt_k(layer), stream_));
    MEMSIM_CU(synth_rows(c_.shape.dtype, ref_v_.addr(), rows, re, ref_a_.as<uint32_t>(),
                         ref_b_.as<uint32_t>(), synth_salt_v(layer), stream_));
    return {};
  }
  // fp8: the step's rows in the model's dtype, max_tokens at a time, then the KV write's
  // quantization (the pool's rows went through the same).
  for (uint32_t r0 = 0; r0 < rows; r0 += c_.max_tokens) {
    const uint32_t n = std::min(c_.max_tokens, rows - r0);
    MEMSIM_CU(synth_rows(c_.shape.dtype, k_new_.addr(), n, re, ref_a_.as<uint32_t>() + r0,
                         ref_b_.as<uint32_t>() + r0, synth_salt_k(layer), stream_));
    MEMSIM_CU(synth_rows(c_.shape.dtype, v_new_.addr(), n, re, ref_a_.as<uint32_t>() + r0,
                         ref_b_.as<uint32_t>() + r0, synth_salt_v(layer), stream_));
    KvWriteArgs a;
    a.k_new = k_new_.addr();
    a.v_new = v_new_.addr();
    a.slot_mapping = ref_slots_.as<int64_t>();
    a.num_tokens = n;
    a.cache = {ref_k_.addr() + uint64_t{r0} * re, ref_v_.addr() + uint64_t{r0} * re,
               static_cast<int64_t>(re), 1, KvAddressing::kPaged};
    a.slot_tokens = 1;
    a.kv_scales = c_.kv_scales;
    MEMSIM_CU(paged_kv_write(c_.shape, a, stream_));
  }
  return {};
}

Status CudaExecutor::compare(const StepWork& w, const Part& p, uint32_t layer, size_t first,
                             const std::vector<int32_t>& indptr, uint64_t q0, uint64_t q_rows) {
  const uint64_t qe = q_row_elems();
  std::vector<uint16_t>& got = got_;
  std::vector<uint16_t>& want = want_;
  got.resize(q_rows * qe);
  want.resize(q_rows * qe);
  MEMSIM_CU(cudaMemcpyAsync(got.data(), p.o.as<uint16_t>() + q0 * qe, got.size() * 2,
                            cudaMemcpyDeviceToHost, stream_));
  MEMSIM_CU(
      cudaMemcpyAsync(want.data(), ref_o_.as(), want.size() * 2, cudaMemcpyDeviceToHost, stream_));
  MEMSIM_CU(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i + 1 < indptr.size(); ++i) {
    const StepSeq& s = *p.seqs[first + i];
    const uint64_t r0 = static_cast<uint64_t>(indptr[i]), r1 = static_cast<uint64_t>(indptr[i + 1]);
    for (uint64_t x = r0 * qe; x < r1 * qe; ++x) {
      if (got[x] == want[x]) continue;
      const uint64_t row = x / qe, head = (x % qe) / c_.shape.head_dim;
      return fail(s, w.step,
                  fmt::format("layer {} (checked after {}): attention output of position {} "
                              "head {} differs from the reference over its own tokens (element "
                              "{}: {:#06x}, reference {:#06x})",
                              layer, w.reason, s.computed + (row - r0), head, x % c_.shape.head_dim,
                              got[x], want[x]));
    }
    ++report_.checked_seqs;
  }
  return {};
}

// Chunk u of a sequence: rows [u C, u C + C) of every region (K and V of each layer). In the
// pool a paged chunk is block table[u]; a contiguous chunk lies at slot base + u C rows. In host
// memory slot h holds [region][C rows] at swap_space + h x 2 layers x chunk bytes.
Status CudaExecutor::swap_copy(const std::vector<int32_t>& table, uint32_t tokens,
                               const std::vector<uint32_t>& slots, bool out) {
  const uint32_t chunks = (tokens + chunk_tokens() - 1) / chunk_tokens();
  std::vector<int64_t> pairs;
  for (uint32_t u = 0; u < chunks; ++u) {
    const int64_t pool = layout_.paged ? table[u] : u;
    pairs.push_back(out ? pool : slots[u]);
    pairs.push_back(out ? slots[u] : pool);
  }
  const uint32_t regions = 2 * c_.layers;
  const uint64_t* pool_regions = pool_regions_.as<uint64_t>();
  if (!layout_.paged) {  // the sequence's slot: regions start at its rows
    std::vector<uint64_t> bases;
    for (uint32_t l = 0; l < c_.layers; ++l)
      for (DevPtr b : {layout_.k[l], layout_.v[l]})
        bases.push_back(b + static_cast<uint64_t>(table[0]) * layout_.block_stride);
    MEMSIM_TRY(upload(host_regions_, bases, stream_));
    pool_regions = host_regions_.as<uint64_t>();
  }
  const uint64_t pool_stride = layout_.paged ? layout_.block_stride : chunk_bytes();
  const uint64_t host_stride = regions * chunk_bytes();
  MEMSIM_TRY(upload(d_pairs_, pairs, stream_));
  BlockCopyArgs a;
  a.src_regions = out ? pool_regions : nullptr;
  a.dst_regions = out ? nullptr : pool_regions;
  a.src = out ? 0 : swap_space_;
  a.dst = out ? swap_space_ : 0;
  a.src_region_stride = out ? 0 : chunk_bytes();
  a.dst_region_stride = out ? chunk_bytes() : 0;
  a.src_block_stride = out ? pool_stride : host_stride;
  a.dst_block_stride = out ? host_stride : pool_stride;
  a.block_bytes = chunk_bytes();
  a.regions = regions;
  a.pairs = d_pairs_.as<int64_t>();
  a.num_pairs = chunks;
  MEMSIM_CU(copy_blocks(a, stream_));
  MEMSIM_CU(cudaStreamSynchronize(stream_));
  return {};
}

Status CudaExecutor::save(SeqId source, uint32_t tokens) {
  if (const auto it = swapped_.find(source); it != swapped_.end()) {
    if (it->second.tokens != tokens)
      return make_error(ErrorCode::kInvalidState,
                        fmt::format("swap-out of seq {}: saved with {} tokens, now {}", source,
                                    it->second.tokens, tokens));
    return {};
  }
  const uint32_t chunks = (tokens + chunk_tokens() - 1) / chunk_tokens();
  if (chunks > free_slots_.size())
    return make_error(ErrorCode::kOutOfMemory,
                      fmt::format("swap-out of seq {}: {} chunks, {} free slots in the pinned "
                                  "swap space",
                                  source, chunks, free_slots_.size()));
  auto slots = std::make_shared<std::vector<uint32_t>>();
  for (uint32_t u = 0; u < chunks; ++u) {
    slots->push_back(free_slots_.back());
    free_slots_.pop_back();
  }
  swapped_[source] = {slots, tokens};
  kv_->seq_table(source, &table_);
  return swap_copy(table_, tokens, *slots, true);
}

// A sample not yet forked in the pool (source != seq) holds its parent's rows: it shares the
// parent's saved slots instead of a copy of its own, as the engine counts swap space.
Status CudaExecutor::swap_out(SeqId seq, SeqId source, const TokenContent&, uint32_t tokens) {
  if (groups_ > 1 || !layout_.group_window.empty())  // swap_copy moves group 0's blocks
    return make_error(ErrorCode::kNotSupported,
                      fmt::format("swap-out of seq {}: swapping a pool of sliding-window KV cache "
                                  "groups is not modelled on the GPU (preempt by recompute)",
                                  seq));
  MEMSIM_CU(cudaDeviceSynchronize());
  MEMSIM_TRY(save(source, tokens));
  if (seq != source) {
    if (swapped_.count(seq))
      return make_error(ErrorCode::kInvalidState,
                        fmt::format("swap-out of seq {}: already swapped out", seq));
    swapped_[seq] = swapped_.at(source);
  }
  return {};
}

void CudaExecutor::forget(SeqId seq) {
  const auto it = swapped_.find(seq);
  std::shared_ptr<std::vector<uint32_t>> slots = std::move(it->second.slots);
  swapped_.erase(it);
  if (slots.use_count() == 1) free_slots_.insert(free_slots_.end(), slots->begin(), slots->end());
}

Status CudaExecutor::swap_in(SeqId seq, const TokenContent&, uint32_t tokens) {
  const auto it = swapped_.find(seq);
  if (it == swapped_.end() || it->second.tokens != tokens)
    return make_error(ErrorCode::kInvalidState,
                      fmt::format("swap-in of seq {} that was not swapped out", seq));
  kv_->seq_table(seq, &table_);
  MEMSIM_TRY(swap_copy(table_, tokens, *it->second.slots, false));
  forget(seq);
  ++report_.swaps;
  return {};
}

Status CudaExecutor::swap_drop(SeqId seq) {
  if (!swapped_.count(seq))
    return make_error(ErrorCode::kInvalidState,
                      fmt::format("swap drop of seq {} that was not swapped out", seq));
  forget(seq);
  return {};
}

}  // namespace memsim::cuda_exec
