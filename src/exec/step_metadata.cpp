// StepPacker: a step's sequences into the packed metadata ModelStep uploads (step_metadata.h).
#include "src/exec/step_metadata.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace memsim {

using namespace kernels;

// One upload: [ids | positions | slot_mapping | indptr | kv_lens | tables | last_rows | prefill
// work | decode work | windowed prefill work | windowed decode work], from the scratch vectors
// pack() filled.
void StepPacker::write_sections(const KvLayout& kv, const PrefillPlan& pplan,
                                const DecodeWork& dwork, const PrefillPlan& wpplan,
                                const DecodeWork& wdwork, uint32_t S, uint32_t bt_stride,
                                PackedStep& p) const {
  const Scratch& b = s_;
  struct Section {
    const void* data;
    uint64_t bytes;
    uint64_t at = 0;
  };
  std::vector<Section> sec = {{b.ids.data(), b.ids.size() * 4},
                              {b.positions.data(), b.positions.size() * 4},
                              {b.slot_mapping.data(), b.slot_mapping.size() * 8},
                              {b.indptr.data(), b.indptr.size() * 4},
                              {b.kv_lens.data(), b.kv_lens.size() * 4},
                              {kv.paged ? nullptr : b.tables.data(),
                               (kv.paged ? uint64_t{S} * bt_stride : b.tables.size()) * 4},
                              {b.last_rows.data(), b.last_rows.size() * 4},
                              {pplan.work.data(), pplan.work.size() * 4},
                              {dwork.words.data(), dwork.words.size() * 4},
                              {wpplan.work.data(), wpplan.work.size() * 4},
                              {wdwork.words.data(), wdwork.words.size() * 4}};
  static_assert(PackedStep::kWindowDecodeWork + 1 == PackedStep::kSections, "a section each");
  uint64_t meta_bytes = 0;
  for (Section& x : sec) {
    x.at = meta_bytes;
    meta_bytes += align16(x.bytes);
  }
  // Written section by section, the alignment padding and each table row's unused tail zeroed,
  // into a buffer kept from the last step (a graph's tables are mostly tail: rows of 2,048
  // entries at 32K).
  p.bytes.resize(meta_bytes);
  uint8_t* const dst = p.bytes.data();
  for (size_t i = 0; i < sec.size(); ++i) {
    p.at[i] = sec[i].at;
    if (sec[i].data && sec[i].bytes) std::memcpy(dst + sec[i].at, sec[i].data, sec[i].bytes);
    std::memset(dst + sec[i].at + sec[i].bytes, 0, align16(sec[i].bytes) - sec[i].bytes);
  }
  if (kv.paged) {
    auto* row = reinterpret_cast<int32_t*>(dst + sec[PackedStep::kTables].at);
    const int32_t* from = b.tables.data();
    for (const uint32_t n : b.table_rows) {
      std::copy(from, from + n, row);
      std::fill(row + n, row + bt_stride, 0);
      from += n;
      row += bt_stride;
    }
  }
}

PackedStep StepPacker::graph_launch(uint32_t batch, uint32_t max_context) const {
  PackedStep p;
  p.dplan = plan_decode_graph(c_.shape, batch, max_context, c_.device);
  p.window = c_.window;
  if (c_.window) p.wdplan = plan_decode_graph(c_.shape, batch, max_context, c_.device, c_.window);
  return p;
}

Status StepPacker::pack(const KvLayout& kv, const std::vector<StepSeqInput>& seqs,
                        uint32_t min_bt_stride, PackedStep* out, const PackedStep* fixed,
                        uint32_t listed) {
  const uint32_t S = static_cast<uint32_t>(seqs.size());
  if (S == 0) return make_error(ErrorCode::kInvalidArgument, "a step needs a sequence");
  if (S > c_.max_seqs)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("step of {} sequences exceeds max_seqs {}", S, c_.max_seqs));
  if (kv.k.size() < c_.layers || kv.v.size() < c_.layers || kv.row_bytes != c_.row_bytes ||
      kv.block_tokens == 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "KV layout does not match the model (layers, row bytes or block tokens)");

  // ---- host metadata -----------------------------------------------------------------------
  Scratch& b = s_;
  auto& [ids, positions, indptr, kv_lens, q_lens, pre_kv_lens, last_rows, tables, slot_mapping,
         table_rows] = b;
  for (auto* v : {&ids, &positions, &indptr, &kv_lens, &q_lens, &pre_kv_lens, &last_rows, &tables})
    v->clear();
  slot_mapping.clear();
  table_rows.clear();
  indptr.push_back(0);
  uint32_t bt_stride = std::max<uint32_t>(1, min_bt_stride), max_kv = 0;
  std::vector<uint32_t>& order = out->order;  // decodes first, each kind in the caller's order
  order.clear();
  for (int pass = 0; pass < 2; ++pass)
    for (uint32_t i = 0; i < S; ++i)
      if ((seqs[i].tokens.size() == 1) == (pass == 0)) order.push_back(i);
  uint32_t D = 0;
  for (const StepSeqInput& s : seqs) {
    if (s.tokens.empty()) return make_error(ErrorCode::kInvalidArgument, "a sequence has no token");
    const uint32_t len = s.cached + static_cast<uint32_t>(s.tokens.size());
    if (kv.paged) {
      const uint64_t need = (uint64_t{len} + kv.block_tokens - 1) / kv.block_tokens;
      if (s.table.size() < need)
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("a table of {} blocks for {} tokens", s.table.size(), len));
      bt_stride = std::max<uint32_t>(bt_stride, static_cast<uint32_t>(need));
    } else if (s.table.size() != 1 || len > kv.block_tokens) {
      return make_error(ErrorCode::kInvalidArgument, "contiguous layouts take one slot a sequence");
    }
    if (s.tokens.size() == 1) ++D;
    max_kv = std::max(max_kv, len);
  }
  for (const uint32_t i : order) {
    const StepSeqInput& s = seqs[i];
    for (uint32_t i = 0; i < s.tokens.size(); ++i) {
      const uint32_t pos = s.cached + i;
      if (s.tokens[i] < 0 || static_cast<uint64_t>(s.tokens[i]) >= c_.vocab)
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("token {} outside the vocab", s.tokens[i]));
      ids.push_back(s.tokens[i]);
      positions.push_back(static_cast<int32_t>(pos));
      slot_mapping.push_back(kv.paged ? int64_t{s.table[pos / kv.block_tokens]} * kv.block_tokens +
                                            pos % kv.block_tokens
                                      : int64_t{s.table[0]} * kv.block_tokens + pos);
    }
    const uint32_t len = s.cached + static_cast<uint32_t>(s.tokens.size());
    if (s.tokens.size() > 1) {  // the prefill kernel's rows count from the first prefill row
      indptr.push_back(static_cast<int32_t>(ids.size() - D));
      q_lens.push_back(static_cast<int32_t>(s.tokens.size()));
      pre_kv_lens.push_back(static_cast<int32_t>(len));
    }
    last_rows.push_back(static_cast<int32_t>(ids.size()) - 1);
    kv_lens.push_back(static_cast<int32_t>(len));
    if (kv.paged) {  // the blocks it uses, written into its bt_stride row below
      const uint64_t need = (uint64_t{len} + kv.block_tokens - 1) / kv.block_tokens;
      tables.insert(tables.end(), s.table.begin(), s.table.begin() + static_cast<int64_t>(need));
      table_rows.push_back(static_cast<uint32_t>(need));
    } else {
      tables.push_back(s.table[0]);
    }
  }
  const uint32_t T = static_cast<uint32_t>(ids.size());
  if (T > c_.max_tokens)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("step of {} tokens exceeds max_tokens {}", T, c_.max_tokens));
  DecodeWork dwork, wdwork;
  PrefillPlan pplan, wpplan;
  if (D) {
    const std::vector<int32_t> dlens(kv_lens.begin(), kv_lens.begin() + std::min(D, listed));
    dwork = plan_decode_work(c_.shape, dlens, c_.device, fixed ? &fixed->dplan : nullptr);
    if (c_.window)
      wdwork =
          plan_decode_work(c_.shape, dlens, c_.device, fixed ? &fixed->wdplan : nullptr, c_.window);
    if (dwork.words.empty() || (c_.window && wdwork.words.empty()))
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("{} decodes exceed the graph's batch", D));
  }
  // Eager prefills may split their KV (a short chunk over a long prefix, FlashInfer's split
  // prefill; the windowed layers' over the window their tiles read); the workspace is the
  // step's, sized by the plans. Captured steps are decode-only.
  if (D < S) {
    pplan = plan_prefill(c_.shape, q_lens, pre_kv_lens, &c_.device);
    if (c_.window)
      wpplan = plan_prefill(c_.shape, q_lens, pre_kv_lens, &c_.device, 0, 0, c_.window);
  }

  PackedStep& p = *out;
  write_sections(kv, pplan, dwork, wpplan, wdwork, S, bt_stride, p);
  p.T = T;
  p.S = S;
  p.bt_stride = bt_stride;
  p.max_kv = max_kv;
  p.D = D;
  p.decode = D == S;
  p.dplan = dwork.plan;
  p.num_tiles = pplan.num_tiles;
  p.psplit = pplan.split;
  p.pworkspace_bytes = pplan.workspace_bytes;
  p.window = c_.window;
  p.wdplan = wdwork.plan;
  p.wnum_tiles = wpplan.num_tiles;
  p.wpsplit = wpplan.split;
  p.wpworkspace_bytes = wpplan.workspace_bytes;
  return {};
}

}  // namespace memsim
