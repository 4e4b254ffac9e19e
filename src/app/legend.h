// Column legends of the printed tables: each table's columns with one-sentence meanings (as
// docs/tables.md defines them), the header row built from them, and what follows a table:
// the legend under --explain, else one footer line that points to it and to the docs.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace memsim {

// One column of a printed table. width: its cells' width, > 0 right-aligned, < 0 left-aligned,
// 0 the last column (free width, two spaces after the one before). unit: the cell of a second
// header line (the RL table's), empty for none.
struct ColumnDoc {
  std::string_view name;
  std::string_view meaning;
  int width = 0;
  std::string_view unit = {};
};

// The header line: `indent`, then the names at their widths, one space apart.
std::string header_row(std::span<const ColumnDoc> columns, std::string_view indent = "");
// The units line, built the same way from the units (trailing blanks trimmed).
std::string unit_row(std::span<const ColumnDoc> columns, std::string_view indent = "");
// A data line, built the same way from `values` (one per column; missing ones blank).
std::string data_row(std::span<const ColumnDoc> columns, std::span<const std::string> values,
                     std::string_view indent = "");

// What follows a table. With `explain`: "WHAT (docs/tables.md#ANCHOR):" and one line per column,
// "  name  meaning" (the unit in brackets after the name where there is one). Without: one line,
// "WHAT: add --explain, or see docs/tables.md#ANCHOR".
std::string table_legend(std::span<const ColumnDoc> columns, std::string_view anchor, bool explain,
                         std::string_view what = "columns");

// The footer of a table without a legend here (the --backend cuda tables): "columns: see
// docs/tables.md#ANCHOR".
std::string docs_footer(std::string_view anchor);
inline constexpr std::string_view kCudaTablesAnchor = "--backend-cuda-tables";

}  // namespace memsim
