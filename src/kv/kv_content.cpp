// KvContentShadow: row writes through a sequence's table, copies mirrored range by range, and the
// read-back check.
#include "src/kv/kv_content.h"

#include <fmt/format.h>

#include <utility>

namespace memsim {

KvContentShadow::KvContentShadow(KvLayout layout, std::vector<uint32_t> layers)
    : layout_(std::move(layout)), layers_(std::move(layers)) {}

void KvContentShadow::write(const KvCacheManager& kv, SeqId seq, const TokenContent& content,
                            uint32_t from, uint32_t to) {
  if (from >= to) return;
  kv.seq_table(seq, &table_);
  for (uint32_t pos = from; pos < to; ++pos) {
    const Row r{content.token(pos), pos};
    for (uint32_t layer : layers_)
      for (bool value : {false, true}) rows_[layout_.row(table_, value, layer, pos)] = r;
  }
}

void KvContentShadow::copy(DevPtr dst, DevPtr src, uint64_t bytes) {
  std::vector<std::pair<DevPtr, Row>> moved;
  for (auto it = rows_.lower_bound(src); it != rows_.end() && it->first < src + bytes; ++it)
    moved.emplace_back(dst + (it->first - src), it->second);
  rows_.erase(rows_.lower_bound(dst), rows_.lower_bound(dst + bytes));
  for (const auto& [addr, row] : moved) rows_[addr] = row;
}

std::string KvContentShadow::check(const KvCacheManager& kv, SeqId seq, const TokenContent& content,
                                   uint32_t tokens) const {
  kv.seq_table(seq, &table_);
  if (table_.empty() && tokens > 0) return fmt::format("seq {} has no table", seq);
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
              "seq {} position {} layer {} {}: row {:#x} holds token {:#x} of position {}, not "
              "token {:#x}",
              seq, pos, layer, value ? 'V' : 'K', addr, it->second.token, it->second.pos, want);
      }
  return {};
}

}  // namespace memsim
