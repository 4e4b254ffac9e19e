// The printed tables' column legends against the tables and against docs/tables.md: every
// column a table prints has a legend line (the header is built from the legend), every legend
// line names a printed column, and the doc's section for the table lists exactly those columns.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "src/app/allocator_reports.h"
#include "src/app/legend.h"
#include "src/app/rl_experiment.h"
#include "src/app/serving_writers.h"
#include "src/app/tp_memory_experiment.h"
#include "src/app/writers.h"
#include "src/serve/kv_budget.h"

using namespace memsim;

namespace {

std::string read_doc() {
  const char* r = std::getenv("MEMSIM_SOURCE_ROOT");
  std::ifstream f(std::string(r != nullptr ? r : ".") + "/docs/tables.md");
  REQUIRE(f.good());
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// GitHub's anchor of a heading: lower case, punctuation other than '-' dropped, spaces as '-'.
std::string slug(const std::string& heading) {
  std::string out;
  for (char ch : heading) {
    if (ch == ' ')
      out += '-';
    else if (ch == '-' || std::isalnum(static_cast<unsigned char>(ch)))
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  }
  return out;
}

// The names in the first cells of the tables of the doc's section `anchor` ("| `a`, `b` | ...").
std::set<std::string> doc_columns(const std::string& doc, std::string_view anchor) {
  static const std::regex kSpan("`([^`]+)`");
  std::istringstream in(doc);
  std::string line;
  bool inside = false, found = false;
  std::set<std::string> names;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) {
      inside = slug(line.substr(3)) == anchor;
      found = found || inside;
      continue;
    }
    if (!inside || line.rfind("| ", 0) != 0) continue;
    const std::string cell = line.substr(2, line.find(" |", 1) - 2);
    for (auto it = std::sregex_iterator(cell.begin(), cell.end(), kSpan);
         it != std::sregex_iterator(); ++it)
      names.insert((*it)[1].str());
  }
  INFO("docs/tables.md has no section #" << anchor);
  CHECK(found);
  return names;
}

std::set<std::string> legend_names(std::span<const ColumnDoc> cols) {
  std::set<std::string> out;
  for (const ColumnDoc& c : cols) out.insert(std::string(c.name));
  return out;
}

// The line of `text` that starts with `first` (the header row).
std::string line_starting(const std::string& text, const std::string& first) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(first, 0) == 0) return line;
  return "";
}

void check_header(const std::string& header, std::span<const ColumnDoc> cols) {
  INFO(header);
  REQUIRE(!header.empty());
  size_t at = 0;  // the names appear in order, each once
  for (const ColumnDoc& c : cols) {
    CAPTURE(c.name);
    const size_t pos = header.find(c.name, at);
    CHECK(pos != std::string::npos);
    if (pos != std::string::npos) at = pos + c.name.size();
    CHECK(!c.meaning.empty());
  }
}

}  // namespace

TEST_CASE("every printed column has a legend line and every legend line a printed column") {
  SECTION("shapes") {
    ShapesConfig c;
    c.capture_sizes = {1, 2};
    ShapesResults res;
    res.references.push_back({c.table, StandaloneRef{}});
    check_header(line_starting(format_shapes_table(c, res), "strategy"), shapes_columns());
  }
  SECTION("serving") {
    const std::string table = format_serving_table(ServingConfig{}, ServingResults{});
    check_header(line_starting(table, "run"), serving_columns());
    CHECK(table.find(" OOM ") == std::string::npos);  // preem alone counts preemptions
  }
  SECTION("KV budget") {
    const std::string text = format_kv_budget(KvBudget{});
    for (const ColumnDoc& c : kv_budget_lines()) {
      CAPTURE(c.name);
      CHECK(text.find("  " + std::string(c.name) + " ") != std::string::npos);
    }
  }
  SECTION("allocators and replay") {
    check_header(line_starting(format_allocator_table({}, true), "workload"), allocator_columns());
    const std::string replay = format_allocator_table({}, false);
    CHECK(line_starting(replay, "allocator").find("workload") == std::string::npos);
  }
  SECTION("TP memory") {
    TpMemoryResults res;
    res.points.emplace_back();
    const std::string table = format_tp_memory_table(TpMemoryConfig{}, res, false);
    check_header(line_starting(table, "model"), tp_memory_columns());
    CHECK(line_starting(table, "model").find(" PP ") == std::string::npos);
    TpMemoryConfig pp;
    pp.pipeline_parallel_sizes = {1, 2};
    check_header(line_starting(format_tp_memory_table(pp, res, false), "model"),
                 tp_memory_columns(true));
  }
  SECTION("RL") {
    RlResults res;
    res.runs.emplace_back();
    res.runs.back().model = "m";
    res.runs.back().label = "r";
    const std::string table = format_rl_table(RlConfig{}, res);
    check_header(line_starting(table, "  run"), rl_columns());
  }
}

TEST_CASE("docs/tables.md lists exactly the columns each table prints") {
  const std::string doc = read_doc();
  const std::pair<std::string_view, std::span<const ColumnDoc>> tables[] = {
      {kShapesAnchor, shapes_columns()},   {kKvBudgetAnchor, kv_budget_lines()},
      {kServingAnchor, serving_columns()}, {kAllocatorsAnchor, allocator_columns()},
      {kRlAnchor, rl_columns()},           {kTpMemoryAnchor, tp_memory_columns(true)},
  };
  for (const auto& [anchor, cols] : tables) {
    CAPTURE(anchor);
    CHECK(doc_columns(doc, anchor) == legend_names(cols));
  }
  CHECK(!doc_columns(doc, kCudaTablesAnchor).empty());
}

TEST_CASE("--explain prints one line per column; without it, one footer line") {
  const std::span<const ColumnDoc> cols = serving_columns();
  const std::string footer = table_legend(cols, kServingAnchor, false);
  CHECK(footer == "columns: add --explain, or see docs/tables.md#serving-and-kv-experiments\n");
  const std::string legend = table_legend(cols, kServingAnchor, true);
  CHECK(std::count(legend.begin(), legend.end(), '\n') == static_cast<long>(cols.size()) + 1);
  for (const ColumnDoc& c : cols) {
    CAPTURE(c.name);
    CHECK(legend.find("\n  " + std::string(c.name) + " ") != std::string::npos);
  }
  // A unit is named after its column: the RL table's two `rollout` columns differ by it.
  const std::string rl = table_legend(rl_columns(), kRlAnchor, true);
  CHECK(rl.find("  rollout [GiB]") != std::string::npos);
  CHECK(rl.find("  rollout [s]") != std::string::npos);
}
