// KvContentShadow: a CPU record of which (token, position) each K/V row of a KV pool holds, so a
// simulation can check that every sequence's table reads its own tokens (the check the GPU
// validation makes on real attention output, here without a GPU).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/kv/kv_cache_manager.h"
#include "src/kv/token_content.h"

namespace memsim {

class KvContentShadow {
 public:
  // Tracks K and V rows of `layers` (e.g. the first and the last: per-layer offsets and the
  // table are then both exercised) of the pool `layout` describes.
  KvContentShadow(KvLayout layout, std::vector<uint32_t> layers);

  // The engine computed tokens [from, to) of `seq` and wrote their K/V through its tables
  // (each layer's group's; positions in blocks a sliding window freed are skipped);
  // `stamp` (e.g. the engine step) is reported with a row that a check finds wrong. Returns what
  // is wrong when a position lies beyond the sequence's table (nothing is written then).
  std::string write(const KvCacheManager& kv, SeqId seq, const TokenContent& content, uint32_t from,
                    uint32_t to, uint64_t stamp = 0);
  // Mirrors a device copy (copy-on-write, fork copies, swaps): rows of [src, src + bytes) now
  // also hold at dst + offset; rows not tracked in the source range are dropped at dst. Copies
  // start on a row (every strategy copies whole blocks, pages or token ranges of a slot).
  void copy(DevPtr dst, DevPtr src, uint64_t bytes);
  // Empty when every tracked row of positions [0, tokens) of `seq` holds (its token, that
  // position); else what the first mismatch reads. Each layer is read through its KV cache
  // group's table (KvLayout::layer_group); a layer of a sliding window (KvLayout::group_window)
  // only at the positions the queries from `first_query` on see (p - window < k <= p), and
  // each of those must lie in a block the window did not free.
  std::string check(const KvCacheManager& kv, SeqId seq, const TokenContent& content,
                    uint32_t tokens, uint32_t first_query = 0) const;

  size_t rows() const { return rows_.size(); }

 private:
  // Empty when positions [0, end) of a sequence with `table` lie inside it.
  std::string beyond_table(SeqId seq, uint32_t end, const std::vector<int32_t>& table) const;
  // The table `layer` reads (its group's), fetched once per write or check (fresh_).
  const std::vector<int32_t>& table_of(const KvCacheManager& kv, SeqId seq, uint32_t layer) const;
  bool freed(const std::vector<int32_t>& table, uint32_t pos) const;  // a window freed its block
  struct Row {
    uint32_t token, pos;
    SeqId writer;
    uint64_t stamp;
  };
  KvLayout layout_;
  std::vector<uint32_t> layers_;
  std::unordered_map<DevPtr, Row> rows_;              // row address -> what was written there
  mutable std::vector<std::vector<int32_t>> tables_;  // per KV cache group
  mutable std::vector<bool> fresh_;
};

}  // namespace memsim
