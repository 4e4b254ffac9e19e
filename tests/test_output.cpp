// Checked, atomic outputs (src/app/output.h): failed writes are errors naming the file and the
// OS's reason, results appear whole or not at all, and a folder being written is locked.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "src/app/output.h"
#include "src/config/config_node.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using memsim::OutputDir;
using memsim::OutputError;
using memsim::test::TempDir;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const OutputError& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("write_file reports a full device at the final flush, naming the file") {
  if (!fs::exists("/dev/full")) return;
  // Less than one buffer: nothing reaches the device before close, as with a small summary.json.
  const std::string e = error_of([] { memsim::write_file("/dev/full", "{\"runs\": []}\n"); });
  CHECK(e == "cannot write /dev/full: No space left on device");
  CHECK(fs::is_character_file("/dev/full"));
}

TEST_CASE("write_file names the path and the reason when the file cannot be created") {
  TempDir t;
  const std::string p = (t.path() / "no" / "such" / "summary.json").string();
  CHECK(error_of([&] { memsim::write_file(p, "x"); }) ==
        "cannot write " + p + ": No such file or directory");
}

TEST_CASE("write_file_atomically keeps the old file when the check refuses the new text") {
  TempDir t;
  const std::string p = t.write("gpu.yaml", "old\n");
  const std::string e = error_of([&] {
    memsim::write_file_atomically(p, "new\n", [](std::string_view) { return "does not load"; });
  });
  CHECK(e == p + " was not written (what was there is unchanged): does not load");
  CHECK(slurp(p) == "old\n");
  memsim::write_file_atomically(p, "new\n", [](std::string_view t) {
    return t == "new\n" ? std::string() : std::string("unexpected");
  });
  CHECK(slurp(p) == "new\n");
  size_t files = 0;
  for ([[maybe_unused]] const auto& e2 : fs::directory_iterator(t.path())) ++files;
  CHECK(files == 1);  // no temporary file left beside it
}

TEST_CASE("write_file_atomically writes a device in place instead of replacing it") {
  if (!fs::exists("/dev/full")) return;
  CHECK(error_of([] { memsim::write_file_atomically("/dev/full", "x"); }) ==
        "cannot write /dev/full: No space left on device");
  CHECK(fs::is_character_file("/dev/full"));
}

TEST_CASE("write_file_atomically replaces the file a link names, not the link") {
  TempDir t;
  const std::string target = t.write("real.csv", "old\n");
  fs::create_symlink(target, t.path() / "link.csv");
  memsim::write_file_atomically((t.path() / "link.csv").string(), "new\n");
  CHECK(fs::is_symlink(t.path() / "link.csv"));
  CHECK(slurp(target) == "new\n");
}

TEST_CASE("OutputDir: results appear whole at commit, replacing the previous ones") {
  TempDir t;
  const std::string root = (t.path() / "results").string();
  {
    OutputDir d(root, "exp");
    d.write("summary.json", "one\n");
    d.write("stale.csv", "from the first run\n");
    CHECK(!fs::exists(d.path()));  // nothing in place before commit
    d.commit();
    CHECK(d.report() == "wrote " + root + "/exp/summary.json, stale.csv\n");
  }
  {
    OutputDir d(root, "exp");
    d.write("summary.json", "two\n");
    CHECK(slurp(fs::path(root) / "exp" / "summary.json") == "one\n");
    d.commit();
  }
  CHECK(slurp(fs::path(root) / "exp" / "summary.json") == "two\n");
  CHECK(!fs::exists(fs::path(root) / "exp" / "stale.csv"));  // the folder is replaced whole
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(root)) ++entries;
  CHECK(entries == 1);  // no lock file, no staging folder
}

TEST_CASE("OutputDir: an uncommitted folder leaves nothing, the previous results stay") {
  TempDir t;
  const std::string root = t.path().string();
  {
    OutputDir d(root, "exp");
    d.write("summary.json", "kept\n");
    d.commit();
  }
  {
    OutputDir d(root, "exp");
    d.write("summary.json", "lost\n");
  }  // e.g. a later write threw
  CHECK(slurp(t.path() / "exp" / "summary.json") == "kept\n");
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(root)) ++entries;
  CHECK(entries == 1);
}

TEST_CASE("OutputDir: a second writer of the same folder is refused; others are not") {
  TempDir t;
  const std::string root = t.path().string();
  OutputDir first(root, "exp");
  const std::string e = error_of([&] { OutputDir second(root, "exp"); });
  CHECK(e.find(root + "/exp is being written by another memsim run (pid ") == 0);
  CHECK_NOTHROW(OutputDir(root, "other"));
}

TEST_CASE("OutputDir: a write error names the file where it was going, not the staging folder") {
  TempDir t;
  OutputDir d(t.path().string(), "exp");
  const std::string e = error_of([&] { d.write("sub/x.csv", "x"); });
  CHECK(e == "cannot write " + (t.path() / "exp" / "sub" / "x.csv").string() +
                 ": No such file or directory");
}

TEST_CASE("OutputDir refuses a name that is not a plain file name") {
  TempDir t;
  for (const char* bad : {"..", ".hidden", "a/b", "x'; touch y; echo '", ""})
    CHECK(!error_of([&] { OutputDir d(t.path().string(), bad); }).empty());
}

TEST_CASE("csv_cell quotes what needs quoting (RFC 4180)") {
  CHECK(memsim::csv_cell("plain") == "plain");
  CHECK(memsim::csv_cell("a,b") == "\"a,b\"");
  CHECK(memsim::csv_cell("has \"quotes\"") == "\"has \"\"quotes\"\"\"");
  CHECK(memsim::csv_cell("two\nlines") == "\"two\nlines\"");
  CHECK(memsim::csv_cell("cr\r") == "\"cr\r\"");
  CHECK(memsim::csv_quoted("plain") == "\"plain\"");
}

TEST_CASE("check_plain_name accepts file names and nothing else") {
  for (const char* ok : {"shapes", "kv_strategies", "run-2.v1", "A1"})
    CHECK(memsim::check_plain_name(ok).empty());
  for (const char* bad : {"", ".", "..", ".x", "a/b", "/abs", "a b", "a'b", "a\nb"})
    CHECK(!memsim::check_plain_name(bad).empty());
  CHECK(!memsim::check_plain_name(std::string(129, 'a')).empty());
}
