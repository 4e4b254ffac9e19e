// Column legends: header rows built from the column lists, the --explain legend, the footer.
#include "src/app/legend.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

namespace memsim {

namespace {

std::string cells(std::span<const ColumnDoc> columns, std::string_view indent,
                  const std::function<std::string_view(size_t)>& text_of) {
  std::string out(indent);
  for (size_t k = 0; k < columns.size(); ++k) {
    const ColumnDoc& c = columns[k];
    const std::string_view text = text_of(k);
    if (k > 0) out += c.width == 0 ? "  " : " ";
    if (c.width > 0)
      out += fmt::format("{:>{}}", text, c.width);
    else if (c.width < 0)
      out += fmt::format("{:<{}}", text, -c.width);
    else
      out += text;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out + "\n";
}

}  // namespace

std::string header_row(std::span<const ColumnDoc> columns, std::string_view indent) {
  return cells(columns, indent, [&](size_t k) { return columns[k].name; });
}

std::string unit_row(std::span<const ColumnDoc> columns, std::string_view indent) {
  return cells(columns, indent, [&](size_t k) { return columns[k].unit; });
}

std::string data_row(std::span<const ColumnDoc> columns, std::span<const std::string> values,
                     std::string_view indent) {
  return cells(columns, indent, [&](size_t k) -> std::string_view {
    return k < values.size() ? std::string_view(values[k]) : std::string_view();
  });
}

std::string table_legend(std::span<const ColumnDoc> columns, std::string_view anchor, bool explain,
                         std::string_view what) {
  if (!explain) return fmt::format("{}: add --explain, or see docs/tables.md#{}\n", what, anchor);
  auto label = [](const ColumnDoc& c) {
    return c.unit.empty() ? std::string(c.name) : fmt::format("{} [{}]", c.name, c.unit);
  };
  size_t w = 0;
  for (const ColumnDoc& c : columns) w = std::max(w, label(c).size());
  std::string out = fmt::format("{} (docs/tables.md#{}):\n", what, anchor);
  for (const ColumnDoc& c : columns) out += fmt::format("  {:<{}}  {}\n", label(c), w, c.meaning);
  return out;
}

std::string docs_footer(std::string_view anchor) {
  return fmt::format("columns: see docs/tables.md#{}\n", anchor);
}

}  // namespace memsim
