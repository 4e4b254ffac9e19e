// The progress line of long serving runs: its text, and that it is drawn only on a terminal,
// not before a second has passed, at most 4 times a second, and cleared when the runs end.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>

#include "src/app/run_progress.h"

namespace memsim {
namespace {

TEST_CASE("progress line: counts, simulated time, percentage and ETA") {
  ProgressView v;
  v.run = 1;
  v.runs = 6;
  v.label = "paged_block_pool block_size=16";
  v.finished = 812345;
  v.requests = 2000000;
  v.simulated_s = 80123.7;
  v.fraction = 0.45;
  v.elapsed_s = 9 * 0.45 / 0.55;  // 9 s left at this pace
  CHECK(format_progress_line(v) ==
        "run 2/6 paged_block_pool block_size=16: 812,345 of 2,000,000 requests finished, "
        "simulated 80,123 s, 45% of all runs, ETA 00:00:09");
  v.runs = 1;
  v.run = 0;
  v.fraction = 0;
  CHECK(format_progress_line(v) ==
        "run 1/1 paged_block_pool block_size=16: 812,345 of 2,000,000 requests finished, "
        "simulated 80,123 s, 0%, ETA --:--:--");
  CHECK(with_thousands(0) == "0");
  CHECK(with_thousands(999) == "999");
  CHECK(with_thousands(1000) == "1,000");
  CHECK(with_thousands(1234567890) == "1,234,567,890");
  CHECK(hms(3 * 3600 + 25 * 60 + 7.4) == "03:25:07");
}

ServingConfig two_runs(uint64_t requests) {
  ServingConfig c;
  RequestSet set;
  for (uint64_t i = 0; i < requests; ++i) set.requests.push_back(RequestSpec{i, 0, 1, 1});
  c.request_sets.push_back(set);
  c.runs.resize(2);
  c.runs[0].label = "first";
  c.runs[1].label = "second";
  return c;
}

TEST_CASE("progress is drawn only on a terminal") {
  std::ostringstream err;
  double now = 0;
  TerminalProgress off(two_runs(100), err, /*tty=*/false, [&] { return now; });
  CHECK(!off.hook());  // the engine then skips the callback altogether
  now = 10;
  off.update(0, {50, 100, 7'000'000'000});
  off.clear();
  CHECK(err.str().empty());
}

TEST_CASE("progress on a terminal: after a second, at most 4 times a second, then cleared") {
  std::ostringstream err;
  double now = 100;
  {
    TerminalProgress p(two_runs(100), err, /*tty=*/true, [&] { return now; });
    const auto hook = p.hook();
    REQUIRE(hook);
    now = 100.5;
    hook(0, {10, 100, 1'000'000'000});
    CHECK(err.str().empty());  // runs shorter than a second print nothing
    now = 101.0;
    hook(1, {30, 100, 2'000'000'000});
    CHECK(err.str() ==
          "\rrun 1/2 first: 10 of 100 requests finished, simulated 1 s, 20% of all runs, ETA "
          "00:00:04");
    const std::string first = err.str();
    now = 101.2;
    hook(0, {20, 100, 3'000'000'000});
    CHECK(err.str() == first);  // 0.2 s later: not redrawn
    now = 101.3;
    hook(0, {100, 100, 4'000'000'000});  // run 1 ended: run 2 is shown
    const std::string second = err.str().substr(first.size());
    CHECK(second.rfind("\rrun 2/2 second: 30 of 100 requests finished, simulated 2 s, 65%", 0) ==
          0);
    hook(1, {100, 100, 5'000'000'000});  // every run ended: the line is wiped
    const std::string wiped = err.str().substr(first.size() + second.size());
    CHECK(wiped == "\r" + std::string(second.size() - 1, ' ') + "\r");
  }
  CHECK(err.str().back() == '\r');  // nothing more from the destructor
}

}  // namespace
}  // namespace memsim
