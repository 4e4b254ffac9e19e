// KvContentShadow: row writes through a sequence's table, copies mirrored range by range, and the
// read-back check.
#include "src/kv/kv_content.h"

#include <fmt/format.h>

#include <utility>

namespace memsim {

KvContentShadow::KvContentShadow(KvLayout layout, std::vector<uint32_t> layers)
    : layout_(std::move(layout)), layers_(std::move(layers)) {}

std::string KvContentShadow::beyond_table(SeqId seq, uint32_t end) const {
  const uint64_t held = layout_.paged          ? uint64_t{layout_.block_tokens} * table_.size()
                        : table_.empty()       ? 0
                        : layout_.block_tokens ? layout_.block_tokens
                                               : UINT64_MAX;  // contiguous, unknown slot size
  if (end <= held) return {};
  return fmt::format("seq {} position {} lies beyond its table ({} {} of {} tokens)", seq, held,
                     table_.size(), layout_.paged ? "blocks" : "slot", layout_.block_tokens);
}

std::string KvContentShadow::write(const KvCacheManager& kv, SeqId seq, const TokenContent& content,
                                   uint32_t from, uint32_t to, uint64_t stamp) {
  if (from >= to) return {};
  kv.seq_table(seq, &table_);
  if (std::string bad = beyond_table(seq, to); !bad.empty()) return "write: " + bad;
  for (uint32_t pos = from; pos < to; ++pos) {
    const Row r{content.token(pos), pos, seq, stamp};
    for (uint32_t layer : layers_)
      for (bool value : {false, true}) rows_[layout_.row(table_, value, layer, pos)] = r;
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
                                   uint32_t tokens) const {
  kv.seq_table(seq, &table_);
  if (table_.empty() && tokens > 0) return fmt::format("seq {} has no table", seq);
  if (std::string bad = beyond_table(seq, tokens); !bad.empty()) return bad;
  for (uint32_t pos = 0; pos < tokens; ++pos)
    for (uint32_t layer : layers_)
      for (bool value : {false, true}) {
        const DevPtr addr = layout_.row(table_, value, layer, pos);
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
  return {};
}

}  // namespace memsim
