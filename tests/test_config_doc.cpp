// docs/config.md against the code: every map each loader reads is documented with exactly the
// keys it accepts, every registry's implementations with exactly their keys, and the doc names
// no map, implementation or key the code does not have (the doc's conventions are at its top).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "src/alloc/registry.h"
#include "src/app/allocators_experiment.h"
#include "src/app/rl_experiment.h"
#include "src/app/shapes_experiment.h"
#include "src/app/tp_memory_experiment.h"
#include "src/config/config_keys.h"
#include "src/config/loaders.h"
#include "src/config/requests_loader.h"
#include "src/config/step_profile_loader.h"
#include "src/graph/registry.h"
#include "src/kv/registry.h"
#include "src/saver/registry.h"
#include "src/serve/scheduler_registry.h"
#include "src/serve/serving_experiment.h"

using namespace memsim;

namespace {

std::string root() {
  const char* r = std::getenv("MEMSIM_SOURCE_ROOT");
  return r != nullptr ? r : ".";
}

// The backticked spans of a line of markdown, in order.
std::vector<std::string> spans(const std::string& line) {
  static const std::regex kSpan("`([^`]+)`");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(line.begin(), line.end(), kSpan);
       it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1].str());
  return out;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t") - a + 1);
}

// One heading of the doc and the text up to the next heading (its own body, without its
// subsections'): the keys it lists are the first cells of its tables' rows and the spans of
// its paragraphs that start with "Keys:".
struct Section {
  int line = 0;
  int level = 0;
  std::vector<std::string> ids;  // the heading's backticked spans
  std::set<std::string> keys;
  std::vector<std::string> bad_rows;  // table rows whose first cell is not one new `key`
  std::string text;
};

// The sections of the markdown file `path`; lines inside ``` fences are body text only.
std::vector<Section> read_sections(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::vector<Section> out(1);  // [0]: the text before the first heading
  std::string line;
  bool fenced = false;
  int table_row = 0;  // rows of the current table so far (0: not in a table)
  bool keys_paragraph = false;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.rfind("```", 0) == 0) fenced = !fenced;
    if (!fenced && line.rfind('#', 0) == 0) {
      Section s;
      s.line = n;
      s.level = static_cast<int>(line.find_first_not_of('#'));
      s.ids = spans(line);
      out.push_back(std::move(s));
      table_row = 0;
      keys_paragraph = false;
      continue;
    }
    Section& s = out.back();
    s.text += line + "\n";
    if (fenced) continue;
    // A paragraph that starts with "Keys:" lists keys to its end (a blank line).
    if (line.rfind("Keys:", 0) == 0) keys_paragraph = true;
    if (trim(line).empty()) keys_paragraph = false;
    if (keys_paragraph)
      for (const std::string& k : spans(line)) s.keys.insert(k);
    if (line.rfind('|', 0) != 0) {
      table_row = 0;
      continue;
    }
    // Row 1 is the header, row 2 the separator; the body's first cells are keys.
    if (++table_row <= 2) continue;
    const std::string first = trim(line.substr(1, line.find('|', 1) - 1));
    const std::vector<std::string> cell = spans(first);
    if (cell.size() != 1 || first != "`" + cell[0] + "`" || !s.keys.insert(cell[0]).second)
      s.bad_rows.push_back(fmt::format("line {}: {}", n, line));
  }
  return out;
}

const std::vector<Section>& doc() {
  static const std::vector<Section> kDoc = read_sections(root() + "/docs/config.md");
  return kDoc;
}

// The loaders' tables, by the name their sections carry in the doc (`kind` for the top level,
// `kind.path` for a map inside).
struct Kind {
  std::string name;
  const ConfigKeys& maps;
};
const std::vector<Kind>& kinds() {
  static const std::vector<Kind> kKinds = {
      {"shapes", shapes_config_keys()},
      {"serving", serving_config_keys()},
      {"allocators", allocators_config_keys()},
      {"rl", rl_config_keys()},
      {"tp_memory", tp_memory_config_keys()},
      {"requests", requests_keys()},
      {"gpu", gpu_file_keys()},
      {"model", model_file_keys()},
      {"step_profile", step_profile_keys()},
  };
  return kKinds;
}

std::string doc_id(const Kind& k, const MapKeys& m) {
  return m.path.empty() ? k.name : k.name + "." + m.path;
}

// A heading id that names a loader's map: a kind's name, or one followed by '.'.
bool names_a_map(const std::string& id) {
  for (const Kind& k : kinds())
    if (id == k.name || id.rfind(k.name + ".", 0) == 0) return true;
  return false;
}

// The sections whose heading carries `id`.
std::vector<const Section*> sections_with(const std::string& id) {
  std::vector<const Section*> out;
  for (const Section& s : doc())
    if (std::find(s.ids.begin(), s.ids.end(), id) != s.ids.end()) out.push_back(&s);
  return out;
}

// "only in the code: a, b; only in the doc: c" for two key sets (`a` and `b` name them), empty
// when they are equal.
std::string difference(const std::set<std::string>& code, const std::set<std::string>& docs,
                       const std::string& a = "the code", const std::string& b = "the doc") {
  std::vector<std::string> missing, extra;
  std::set_difference(code.begin(), code.end(), docs.begin(), docs.end(),
                      std::back_inserter(missing));
  std::set_difference(docs.begin(), docs.end(), code.begin(), code.end(),
                      std::back_inserter(extra));
  std::string out;
  if (!missing.empty()) out += fmt::format("only in {}: {}", a, fmt::join(missing, ", "));
  if (!extra.empty())
    out += fmt::format("{}only in {}: {}", out.empty() ? "" : "; ", b, fmt::join(extra, ", "));
  return out;
}

std::string squash(const std::string& s) {
  std::string out;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) out += c;
  return out;
}

// One implementation as the doc must show it.
struct Impl {
  std::string name, summary;
  std::vector<std::string> keys;
};
struct Family {
  std::string id;  // the heading id of its section: the registry function
  std::vector<Impl> impls;
};
template <class R>
Family family(const std::string& id, const R& registry) {
  Family f{id, {}};
  for (const auto& e : registry) f.impls.push_back({e.name, e.summary, e.keys});
  return f;
}
std::vector<Family> families() {
  return {family("graph_strategies()", graph_strategies()),
          family("kv_strategies()", kv_strategies()),
          family("caching_allocators()", caching_allocators()),
          family("memory_savers()", memory_savers()), family("schedulers()", schedulers())};
}

// The subsections one level below section `s` (an index into doc()).
std::vector<const Section*> children(size_t s) {
  std::vector<const Section*> out;
  for (size_t i = s + 1; i < doc().size() && doc()[i].level > doc()[s].level; ++i)
    if (doc()[i].level == doc()[s].level + 1) out.push_back(&doc()[i]);
  return out;
}

}  // namespace

TEST_CASE("every map each loader reads is documented with exactly its keys") {
  for (const Kind& k : kinds()) {
    for (const MapKeys& m : k.maps) {
      const std::string id = doc_id(k, m);
      INFO("docs/config.md, the section `" << id << "`");
      const std::vector<const Section*> found = sections_with(id);
      REQUIRE(found.size() == 1);
      std::set<std::string> code(m.keys.begin(), m.keys.end());
      if (!m.registry.empty()) {
        code.insert("impl");
        INFO("a strategy map: its section names `" << m.registry << "`");
        CHECK(found[0]->text.find("`" + m.registry + "`") != std::string::npos);
      }
      CHECK(difference(code, found[0]->keys) == "");
    }
  }
}

TEST_CASE("the doc documents no map the loaders do not read, and its key tables are well formed") {
  std::set<std::string> known;
  for (const Kind& k : kinds())
    for (const MapKeys& m : k.maps) known.insert(doc_id(k, m));
  for (const Family& f : families()) known.insert(f.id);
  for (const Section& s : doc()) {
    bool checked = false;
    for (const std::string& id : s.ids) {
      if (!names_a_map(id) && id.find("()") == std::string::npos) continue;
      checked = true;
      INFO("docs/config.md:" << s.line << ": `" << id << "` names no map a loader reads");
      CHECK(known.count(id) == 1);
    }
    if (checked) {
      INFO("docs/config.md:" << s.line << ": rows whose first cell is not one `key`");
      CHECK(fmt::format("{}", fmt::join(s.bad_rows, "\n")) == "");
    }
  }
}

TEST_CASE("every registry's implementations are documented with their summaries and keys") {
  for (const Family& f : families()) {
    INFO("docs/config.md, the section `" << f.id << "`");
    size_t at = 0;
    size_t sections = 0;
    for (size_t i = 0; i < doc().size(); ++i)
      if (std::find(doc()[i].ids.begin(), doc()[i].ids.end(), f.id) != doc()[i].ids.end()) {
        at = i;
        ++sections;
      }
    REQUIRE(sections == 1);
    std::set<std::string> code_names, doc_names;
    for (const Impl& e : f.impls) code_names.insert(e.name);
    for (const Section* c : children(at))
      if (!c->ids.empty()) doc_names.insert(c->ids.front());
    CHECK(difference(code_names, doc_names) == "");
    for (const Impl& e : f.impls) {
      INFO("its subsection `" << e.name << "`");
      const Section* sub = nullptr;
      for (const Section* c : children(at))
        if (!c->ids.empty() && c->ids.front() == e.name) sub = c;
      if (sub == nullptr) continue;  // reported above
      CHECK(difference({e.keys.begin(), e.keys.end()}, sub->keys) == "");
      CHECK(fmt::format("{}", fmt::join(sub->bad_rows, "\n")) == "");
      INFO("the registry's summary: " << e.summary);
      CHECK(squash(sub->text).find(squash(e.summary)) != std::string::npos);
    }
  }
}

// The RL loader checks its keys with lists of its own (src/app/rl_experiment.cpp is left as it
// is); an unknown key in each of its plain maps of experiments/rl_colocation.yaml must be
// answered with exactly the keys rl_config_keys() lists.
TEST_CASE("the RL loader accepts exactly the keys rl_config_keys() lists") {
  const std::string probe = "qzqzqzqzqzqzqzqzqzqzqzqz";  // close to no key: all are listed
  for (const MapKeys& m : rl_config_keys()) {
    if (!m.registry.empty()) continue;
    std::string at = m.path;
    for (size_t p; (p = at.find("[]")) != std::string::npos;) at.replace(p, 2, ".0");
    INFO("rl." << m.path);
    ConfigNode config = ConfigNode::load_file(root() + "/experiments/rl_colocation.yaml");
    config.apply_override((at.empty() ? "" : at + ".") + probe + "=1");
    std::string message;
    try {
      load_rl_config(config);
    } catch (const ConfigError& e) {
      message = e.what();
    }
    const std::string head = "(valid keys: ";
    const size_t a = message.find(head);
    INFO(message);
    REQUIRE(a != std::string::npos);
    std::set<std::string> listed;
    std::stringstream list(message.substr(a + head.size(), message.rfind(')') - a - head.size()));
    for (std::string key; std::getline(list, key, ',');) listed.insert(trim(key));
    CHECK(difference({m.keys.begin(), m.keys.end()}, listed, "rl_config_keys()",
                     "the loader's check") == "");
  }
}
