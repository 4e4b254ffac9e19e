// steps.csv read back, and the sequences of a step rebuilt from its shape's sums.
#include "workload/measured_steps.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string_view>
#include <type_traits>

#include "workload/input_file.h"

namespace memsim {
namespace {

// One CSV line's fields: commas outside double quotes end a field; "" inside quotes is one ".
std::optional<std::vector<std::string>> csv_fields(std::string_view line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c != '"')
        out.back() += c;
      else if (i + 1 < line.size() && line[i + 1] == '"')
        out.back() += '"', ++i;
      else
        quoted = false;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else if (c != '\r') {
      out.back() += c;
    }
  }
  if (quoted) return std::nullopt;
  return out;
}

enum Column : size_t {
  kRun,
  kStep,
  kNumSeqs,
  kNewTokens,
  kDecodeSeqs,
  kDecodeKv,
  kDecodeMaxKv,
  kKvRead,
  kAttnPairs,
  kMeasured,
  kPredicted,
  kGpu,
  kColumns
};
constexpr std::array<std::string_view, kColumns> kNames = {
    "run",           "step",           "num_seqs",
    "new_tokens",    "decode_seqs",    "decode_kv_tokens",
    "decode_max_kv", "kv_read_tokens", "attn_pairs",
    "measured_ms",   "predicted_ms",   "gpu_ms"};

template <typename T>
bool parse_number(const std::string& s, T* v) {
  const char* end = s.data() + s.size();
  const auto [p, ec] = std::from_chars(s.data(), end, *v);
  if constexpr (std::is_floating_point_v<T>)
    return ec == std::errc() && p == end && std::isfinite(*v) && *v >= 0;
  else
    return ec == std::errc() && p == end;
}

// Shares `total` among `n` (the first ones one more where it does not divide).
uint64_t share(uint64_t total, uint64_t n, uint64_t i) {
  return total / n + (i < total % n ? 1 : 0);
}

}  // namespace

Result<std::vector<MeasuredStepRow>> read_steps_csv(const std::string& path) {
  const auto fail = [&](uint64_t line, const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, line ? fmt::format("{}:{}: {}", path, line, what)
                                                        : fmt::format("{}: {}", path, what));
  };
  if (std::string why = special_file_error(path); !why.empty()) return fail(0, why);
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(0, "cannot open");
  std::array<std::optional<size_t>, kColumns> at{};
  size_t width = 0;
  std::vector<MeasuredStepRow> rows;
  std::string text;
  for (uint64_t line = 1; std::getline(in, text); ++line) {
    const auto fields = csv_fields(text);
    if (!fields) return fail(line, "a quoted field is not closed");
    if (line == 1) {
      for (size_t i = 0; i < fields->size(); ++i)
        for (size_t c = 0; c < kColumns; ++c)
          if ((*fields)[i] == kNames[c]) at[c] = i;
      for (size_t c = 0; c < kGpu; ++c)
        if (!at[c])
          return fail(line, fmt::format("no column '{}' (a steps.csv of serving_measured "
                                        "--backend cuda names it)",
                                        kNames[c]));
      width = fields->size();
      continue;
    }
    if (fields->size() == 1 && (*fields)[0].empty()) continue;  // a blank line
    if (fields->size() != width)
      return fail(line, fmt::format("{} fields, the header has {}", fields->size(), width));
    MeasuredStepRow r;
    r.run = (*fields)[*at[kRun]];
    const auto field = [&](Column c) -> const std::string& { return (*fields)[*at[c]]; };
    const auto bad = [&](Column c) {
      return fail(line, fmt::format("{}: '{}' is not a non-negative number", kNames[c], field(c)));
    };
    StepShape& s = r.shape;
    if (!parse_number(field(kStep), &r.step)) return bad(kStep);
    if (!parse_number(field(kNumSeqs), &s.num_seqs)) return bad(kNumSeqs);
    if (!parse_number(field(kNewTokens), &s.new_tokens)) return bad(kNewTokens);
    if (!parse_number(field(kDecodeSeqs), &s.decode_seqs)) return bad(kDecodeSeqs);
    if (!parse_number(field(kDecodeKv), &s.decode_kv_tokens)) return bad(kDecodeKv);
    if (!parse_number(field(kDecodeMaxKv), &s.decode_max_kv)) return bad(kDecodeMaxKv);
    if (!parse_number(field(kKvRead), &s.kv_read_tokens)) return bad(kKvRead);
    if (!parse_number(field(kAttnPairs), &s.attn_pairs)) return bad(kAttnPairs);
    if (!parse_number(field(kMeasured), &r.measured_ms)) return bad(kMeasured);
    if (!parse_number(field(kPredicted), &r.predicted_ms)) return bad(kPredicted);
    if (at[kGpu] && !parse_number(field(kGpu), &r.gpu_ms)) return bad(kGpu);
    rows.push_back(std::move(r));
  }
  if (in.bad()) return fail(0, "read error");
  if (width == 0) return fail(0, "empty");
  return rows;
}

Result<std::vector<SeqWork>> sequences_of(const StepShape& s) {
  const auto bad = [&](const std::string& what) {
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("step of {} sequences, {} new tokens: {}", s.num_seqs, s.new_tokens, what));
  };
  const uint64_t d = s.decode_seqs, p = s.num_seqs - uint64_t{std::min(s.decode_seqs, s.num_seqs)};
  if (s.num_seqs == 0) return bad("no sequence");
  if (d > s.num_seqs) return bad("more decodes than sequences");
  if (s.new_tokens < d + p) return bad("fewer new tokens than one a sequence");
  if (s.decode_kv_tokens > s.kv_read_tokens) return bad("decodes read more KV than the step");
  if (d && (s.decode_max_kv == 0 || s.decode_max_kv > s.decode_kv_tokens ||
            s.decode_kv_tokens - s.decode_max_kv < d - 1 ||
            (d > 1 && s.decode_max_kv * (d - 1) < s.decode_kv_tokens - s.decode_max_kv)))
    return bad(fmt::format("decode_max_kv {} does not fit {} decodes of {} KV tokens in all",
                           s.decode_max_kv, d, s.decode_kv_tokens));
  const uint64_t prefill_new = s.new_tokens - d;
  const uint64_t prefill_kv = s.kv_read_tokens - s.decode_kv_tokens;
  if (p == 0 ? prefill_kv != 0 : prefill_kv < prefill_new)
    return bad(p == 0 ? "KV tokens beyond the decodes' with no prefill sequence"
                      : "the prefills' KV tokens do not hold their new tokens");
  if (p && (prefill_kv + p - 1) / p > UINT32_MAX)
    return bad("a prefill sequence of more than 2^32 tokens");
  std::vector<SeqWork> seqs;
  const auto add = [&](uint64_t cached, uint64_t tokens) {
    seqs.push_back({static_cast<uint32_t>(cached), static_cast<uint32_t>(tokens)});
  };
  if (d) add(s.decode_max_kv - 1, 1);
  for (uint64_t i = 0; i + 1 < d; ++i)
    add(share(s.decode_kv_tokens - s.decode_max_kv, d - 1, i) - 1, 1);
  for (uint64_t i = 0; i < p; ++i)
    add(share(prefill_kv - prefill_new, p, i), share(prefill_new, p, i));
  return seqs;
}

}  // namespace memsim
