// KvContentShadow: row writes through a sequence's table, copies mirrored range by range, and the
// read-back check.
#include "src/kv/kv_content.h"

#include <fmt/format.h>

#include <utility>

namespace memsim {

KvContentShadow::KvContentShadow(KvLayout layout, std::vector<uint32_t> layers)
    : layout_(std::move(layout)), layers_(std::move(layers)) {}

std::string KvContentShadow::beyond_table(SeqId seq, uint32_t end,
                                          const std::vector<int32_t>& table) const {
  const uint64_t held = layout_.paged          ? uint64_t{layout_.block_tokens} * table.size()
                        : table.empty()        ? 0
                        : layout_.block_tokens ? layout_.block_tokens
                                               : UINT64_MAX;  // contiguous, unknown slot size
  if (end <= held) return {};
  return fmt::format("seq {} position {} lies beyond its table ({} {} of {} tokens)", seq, held,
                     table.size(), layout_.paged ? "blocks" : "slot", layout_.block_tokens);
}

const std::vector<int32_t>& KvContentShadow::table_of(const KvCacheManager& kv, SeqId seq,
                                                      uint32_t layer) const {
  const uint32_t g = layout_.group_of(layer);
  if (tables_.size() <= g) tables_.resize(g + 1);
  if (fresh_.size() <= g) fresh_.resize(g + 1, false);
  if (!fresh_[g]) kv.seq_group_table(seq, g, &tables_[g]);
  fresh_[g] = true;
  return tables_[g];
}

bool KvContentShadow::freed(const std::vector<int32_t>& table, uint32_t pos) const {
  return layout_.paged && table[pos / layout_.block_tokens] < 0;
}

std::string KvContentShadow::write(const KvCacheManager& kv, SeqId seq, const TokenContent& content,
                                   uint32_t from, uint32_t to, uint64_t stamp) {
  if (from >= to) return {};
  fresh_.assign(layout_.group_window.size() + 1, false);
  for (uint32_t layer : layers_) {
    const std::vector<int32_t>& table = table_of(kv, seq, layer);
    if (std::string bad = beyond_table(seq, to, table); !bad.empty()) return "write: " + bad;
    for (uint32_t pos = from; pos < to; ++pos) {
      if (freed(table, pos)) {
        // A swap-in rewrites a sequence whose window freed its front: those rows are gone.
        if (layout_.window_of(layer)) continue;
        return fmt::format("write: seq {} position {} layer {}: its block was freed", seq, pos,
                           layer);
      }
      const Row r{content.token(pos), pos, seq, stamp};
      for (bool value : {false, true}) rows_[layout_.row(table, value, layer, pos)] = r;
    }
  }
  return {};
}

void KvContentShadow::copy(DevPtr dst, DevPtr src, uint64_t bytes) {
  std::vector<std::pair<DevPtr, Row>> moved;
  for (uint64_t off = 0; off < bytes; off += layout_.row_bytes)
    if (const auto it = rows_.find(src + off); it != rows_.end())
      moved.emplace_back(dst + off, it->second);
  for (uint64_t off = 0; off < bytes; off += layout_.row_bytes) rows_.erase(dst + off);
  for (const auto& [addr, row] : moved) rows_[addr] = row;
}

std::string KvContentShadow::check(const KvCacheManager& kv, SeqId seq, const TokenContent& content,
                                   uint32_t tokens, uint32_t first_query) const {
  fresh_.assign(layout_.group_window.size() + 1, false);
  for (uint32_t layer : layers_) {
    const std::vector<int32_t>& table = table_of(kv, seq, layer);
    if (table.empty() && tokens > 0) return fmt::format("seq {} has no table", seq);
    if (std::string bad = beyond_table(seq, tokens, table); !bad.empty()) return bad;
    // A sliding window's layer reads keys p - window < k <= p for queries p >= first_query.
    const uint32_t window = layout_.window_of(layer);
    const uint32_t from = window && first_query + 1 > window ? first_query + 1 - window : 0;
    for (uint32_t pos = from; pos < tokens; ++pos) {
      if (freed(table, pos))
        return fmt::format(
            "seq {} position {} layer {} (window {}): its block was freed, yet "
            "a query from position {} reads it",
            seq, pos, layer, window, first_query);
      for (bool value : {false, true}) {
        const DevPtr addr = layout_.row(table, value, layer, pos);
        const auto it = rows_.find(addr);
        const uint32_t want = content.token(pos);
        if (it == rows_.end())
          return fmt::format("seq {} position {} layer {} {}: row {:#x} was never written", seq,
                             pos, layer, value ? 'V' : 'K', addr);
        if (it->second.token != want || it->second.pos != pos)
          return fmt::format(
              "seq {} position {} layer {} {}: row {:#x} holds token {:#x} of position {} "
              "(written by seq {} at {}), not token {:#x}",
              seq, pos, layer, value ? 'V' : 'K', addr, it->second.token, it->second.pos,
              it->second.writer, it->second.stamp, want);
      }
    }
  }
  return {};
}

}  // namespace memsim
