// A model step's host metadata, packed for one upload: the sequences in kernel order, token ids,
// positions, KV slots, block tables and the attention kernels' work lists (ModelStep's host side).
#pragma once

#include <cstdint>
#include <vector>

#include "backends/result.h"
#include "kernels/attention.h"
#include "src/exec/model_step.h"
#include "src/kv/kv_cache_manager.h"

namespace memsim {

// The packed metadata's sections start at 16-byte boundaries.
inline uint64_t align16(uint64_t v) {
  return (v + 15) / 16 * 16;
}

// A step's metadata, packed for one upload: [ids | positions | slot_mapping | indptr | kv_lens |
// tables | last_rows | prefill work | decode work | windowed prefill work | windowed decode
// work], each section 16-byte aligned (at[] its offsets; the windowed ones empty for a model
// without sliding-window layers). The sequences are reordered decodes first (order[i] = the
// caller's index of packed sequence i): the first D run the decode kernel (its work list planned
// over them), the rest the prefill kernel (indptr and prefill work are theirs, from their first
// query row), as vLLM orders a FlashInfer batch. The sliding-window layers read the same tables
// with their own work lists: decode chunks over each sequence's window only, prefill chunks (when
// split) over the window each query tile reads.
struct PackedStep {
  // at[]'s sections, in upload order.
  enum Section : size_t {
    kIds,
    kPositions,
    kSlots,
    kIndptr,
    kKvLens,
    kTables,
    kLastRows,
    kPrefillWork,
    kDecodeWork,
    kWindowPrefillWork,
    kWindowDecodeWork,
    kSections
  };
  std::vector<uint8_t> bytes;
  uint64_t at[kSections] = {};
  uint32_t T = 0, S = 0, D = 0, bt_stride = 1, max_kv = 0, num_tiles = 0;
  bool decode = true;         // D == S
  kernels::DecodePlan dplan;  // of the D decodes (a work list)
  // Of the prefills: their KV split (kv_chunk 0: unsplit) and its workspace.
  kernels::PrefillSplit psplit;
  uint64_t pworkspace_bytes = 0;
  // The sliding-window layers' (window 0: none): the decodes' plan over their windows, and the
  // prefills' tiles, KV split and its workspace.
  uint32_t window = 0, wnum_tiles = 0;
  kernels::DecodePlan wdplan;
  kernels::PrefillSplit wpsplit;
  uint64_t wpworkspace_bytes = 0;
  std::vector<uint32_t> order;
};

// What a step is checked against and planned for: the model's limits and the device's.
struct StepPackerConfig {
  uint32_t max_seqs = 0, max_tokens = 0;  // ModelStepConfig's
  uint32_t layers = 0;                    // layers run: the KV layout has at least these
  uint64_t row_bytes = 0;                 // bytes of one token's K (or V) row in a layer
  uint64_t vocab = 0;
  kernels::AttentionShape shape;
  kernels::DeviceLimits device;
  uint32_t window = 0;  // the model's sliding window (ModelShape::sliding_window; 0: none)
};

// Packs steps into PackedStep, keeping its host buffers from step to step: a graph of 256
// sequences at 32K has 2 MiB of block tables, and building them in fresh buffers each step took
// 5.2 ms of host time on the H100 at 256 x 1,024, a fifth of the step (memsim-model-bench's host
// wall column; most likely page faults: buffers this large are mapped from the OS and returned
// to it when freed).
class StepPacker {
 public:
  explicit StepPacker(StepPackerConfig config = {}) : c_(config) {}

  // `min_bt_stride`: the least table row length (a graph's, fixed at capture). `fixed`: a
  // captured graph's decode launches the step's work lists must fit (its PackedStep: dplan, and
  // wdplan for the windowed layers; null: eager). `listed`: the decode rows the work lists
  // cover, the first ones (a replay's padding rows past them compute nothing: their outputs are
  // never read, and the list's rows go to real ones). `out` keeps its buffers too: pass the same
  // one each step.
  Status pack(const KvLayout& kv, const std::vector<StepSeqInput>& seqs, uint32_t min_bt_stride,
              PackedStep* out, const PackedStep* fixed = nullptr, uint32_t listed = UINT32_MAX);
  // The decode launches of a captured graph of `batch` sequences up to max_context tokens
  // (plan_decode_graph): dplan and, for a model with a sliding window, wdplan.
  PackedStep graph_launch(uint32_t batch, uint32_t max_context) const;

 private:
  StepPackerConfig c_;
  struct Scratch {
    std::vector<int32_t> ids, positions, indptr, kv_lens, q_lens, pre_kv_lens, last_rows, tables;
    std::vector<int64_t> slot_mapping;
    std::vector<uint32_t> table_rows;  // paged: blocks of each row, whose entries `tables` holds
  } s_;
  // The scratch and the plans' work lists into p.bytes (section offsets in p.at).
  void write_sections(const KvLayout& kv, const kernels::PrefillPlan& pplan,
                      const kernels::DecodeWork& dwork, const kernels::PrefillPlan& wpplan,
                      const kernels::DecodeWork& wdwork, uint32_t S, uint32_t bt_stride,
                      PackedStep& p) const;
};

}  // namespace memsim
