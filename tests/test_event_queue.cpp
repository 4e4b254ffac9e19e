// Tests of EventQueue (time, sequence) ordering, clock movement, determinism, MetricsRecorder and
// its packed SampleLog.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/event_queue.h"
#include "core/metrics.h"

namespace memsim {
namespace {

using Trace = std::vector<std::pair<SimTime, int>>;

TEST_CASE("events at the same time run in scheduling order", "[event_queue]") {
  SimClock clock;
  EventQueue q(clock);
  Trace trace;
  // Interleave two times; the later time is scheduled first.
  for (int i = 0; i < 5; ++i) {
    q.schedule(200, [&, i] { trace.emplace_back(clock.now(), 100 + i); });
    q.schedule(100, [&, i] { trace.emplace_back(clock.now(), i); });
  }
  CHECK(q.size() == 10);
  CHECK(q.run() == 10);
  CHECK(q.empty());
  CHECK(q.dispatched() == 10);
  const Trace want = {{100, 0},   {100, 1},   {100, 2},   {100, 3},   {100, 4},
                      {200, 100}, {200, 101}, {200, 102}, {200, 103}, {200, 104}};
  CHECK(trace == want);
}

TEST_CASE("schedule returns increasing sequence numbers", "[event_queue]") {
  SimClock clock;
  EventQueue q(clock);
  const uint64_t a = q.schedule(50, [] {});
  const uint64_t b = q.schedule(10, [] {});
  const uint64_t c = q.schedule_after(0, [] {});
  CHECK(b == a + 1);
  CHECK(c == b + 1);
}

TEST_CASE("events scheduled in the past are clamped to now", "[event_queue]") {
  SimClock clock;
  clock.advance(1000);
  EventQueue q(clock);
  Trace trace;
  q.schedule(1000, [&] { trace.emplace_back(clock.now(), 1); });
  q.schedule(5, [&] { trace.emplace_back(clock.now(), 2); });  // past: runs at 1000, after #1
  q.schedule(-7, [&] { trace.emplace_back(clock.now(), 3); });
  q.schedule(999, [&] { trace.emplace_back(clock.now(), 4); });
  q.run();
  const Trace want = {{1000, 1}, {1000, 2}, {1000, 3}, {1000, 4}};
  CHECK(trace == want);
  CHECK(clock.now() == 1000);

  SECTION("an event that schedules in the past runs at the current time, after peers") {
    Trace t2;
    q.schedule(2000, [&] {
      t2.emplace_back(clock.now(), 10);
      q.schedule(10, [&] { t2.emplace_back(clock.now(), 12); });
    });
    q.schedule(2000, [&] { t2.emplace_back(clock.now(), 11); });
    q.run();
    const Trace want2 = {{2000, 10}, {2000, 11}, {2000, 12}};
    CHECK(t2 == want2);
  }
}

TEST_CASE("run(until) stops before later events and includes events at `until`", "[event_queue]") {
  SimClock clock;
  EventQueue q(clock);
  std::vector<int> ran;
  for (int t : {10, 20, 30, 30, 40}) q.schedule(t, [&ran, t] { ran.push_back(t); });

  CHECK(q.run(5) == 0);
  CHECK(clock.now() == 0);  // nothing ran, the clock did not move to `until`
  CHECK(q.run(30) == 4);
  CHECK(ran == std::vector<int>{10, 20, 30, 30});
  CHECK(clock.now() == 30);
  CHECK(q.size() == 1);
  CHECK(q.run(39) == 0);
  CHECK(clock.now() == 30);

  SECTION("events scheduled during run within the window are run too") {
    q.schedule(35, [&] {
      ran.push_back(35);
      q.schedule_after(3, [&] { ran.push_back(38); });   // at 38 <= 39
      q.schedule_after(10, [&] { ran.push_back(45); });  // at 45 > 39
    });
    CHECK(q.run(39) == 2);
    CHECK(ran == std::vector<int>{10, 20, 30, 30, 35, 38});
    CHECK(clock.now() == 38);
    CHECK(q.run() == 2);
    CHECK(ran == std::vector<int>{10, 20, 30, 30, 35, 38, 40, 45});
    CHECK(clock.now() == 45);
  }
}

TEST_CASE("run_next on an empty queue returns false and leaves the clock", "[event_queue]") {
  SimClock clock;
  clock.advance(42);
  EventQueue q(clock);
  CHECK_FALSE(q.run_next());
  CHECK(q.run() == 0);
  CHECK(clock.now() == 42);
  CHECK(q.dispatched() == 0);
}

TEST_CASE("the clock advances to event times and never backwards", "[event_queue][clock]") {
  SimClock clock;
  EventQueue q(clock);
  std::vector<SimTime> seen;
  q.schedule(100, [&] {
    seen.push_back(clock.now());
    clock.advance(250);  // work inside the event: the host thread is busy until 350
  });
  q.schedule(200, [&] { seen.push_back(clock.now()); });  // due at 200, runs at 350
  q.schedule(400, [&] { seen.push_back(clock.now()); });
  q.run();
  CHECK(seen == std::vector<SimTime>{100, 350, 400});
  CHECK(clock.now() == 400);

  clock.advance_to(10);
  CHECK(clock.now() == 400);
  clock.advance_to(401);
  CHECK(clock.now() == 401);
  clock.advance(0);
  CHECK(clock.now() == 401);
}

// A self-scheduling workload: every event records (now, id) and may schedule children at random
// delays (including zero and negative delays that clamp to now), and may burn clock time.
Trace random_workload(uint64_t seed, int roots, int max_events) {
  SimClock clock;
  EventQueue q(clock);
  std::mt19937_64 rng(seed);
  Trace trace;
  int next_id = 0;
  std::function<void(int)> body = [&](int id) {
    trace.emplace_back(clock.now(), id);
    const int kids = static_cast<int>(rng() % 3);
    for (int k = 0; k < kids && next_id < max_events; ++k) {
      const SimTime delay = static_cast<SimTime>(rng() % 50) - 10;  // -10 .. 39
      const int child = next_id++;
      q.schedule_after(delay, [&body, child] { body(child); });
    }
    if (rng() % 7 == 0) clock.advance(static_cast<SimTime>(rng() % 20));
  };
  for (int r = 0; r < roots; ++r) {
    const int id = next_id++;
    q.schedule(static_cast<SimTime>(rng() % 100), [&body, id] { body(id); });
  }
  SimTime last = 0;
  while (!q.empty()) {
    REQUIRE(q.run_next());
    REQUIRE(clock.now() >= last);
    last = clock.now();
  }
  REQUIRE(q.dispatched() == trace.size());
  return trace;
}

TEST_CASE("a seeded random workload is bit-reproducible", "[event_queue][determinism]") {
  const Trace a = random_workload(0xC0FFEE, 40, 20000);
  const Trace b = random_workload(0xC0FFEE, 40, 20000);
  REQUIRE(a.size() > 1000);
  CHECK(a.size() == b.size());
  CHECK(a == b);  // full (time, id) trace

  // The trace is ordered by time; clock never goes back.
  for (size_t i = 1; i < a.size(); ++i) REQUIRE(a[i].first >= a[i - 1].first);

  const Trace c = random_workload(0xBEEF, 40, 20000);
  CHECK(a != c);  // the seed matters (sanity check that the workload is random at all)
}

// ---- MetricsRecorder --------------------------------------------------------------------------

TEST_CASE("metrics record only on change", "[metrics]") {
  SimClock clock;
  MetricsRecorder m(clock);
  const auto s = m.series("physical_bytes");
  m.set(s, 5);
  m.set(s, 5);
  REQUIRE(m.samples().size() == 1);
  clock.advance(10);
  m.set(s, 7);
  m.set(s, 7);
  clock.advance(10);
  m.set(s, 5);
  REQUIRE(m.samples().size() == 3);
  CHECK(m.samples()[0].time == 0);
  CHECK(m.samples()[0].value == 5);
  CHECK(m.samples()[1].time == 10);
  CHECK(m.samples()[1].value == 7);
  CHECK(m.samples()[2].time == 20);
  CHECK(m.samples()[2].value == 5);
  for (const auto& smp : m.samples()) CHECK(smp.series == s);
  CHECK(m.last(s) == 5);
  CHECK(m.peak(s) == 7);
  CHECK(m.peak("physical_bytes") == 7);
}

TEST_CASE("metrics: first set of zero is recorded once", "[metrics]") {
  SimClock clock;
  MetricsRecorder m(clock);
  const auto s = m.series("z");
  m.set(s, 0);  // initial last() is 0 but the series was never seen: a sample is stored
  m.set(s, 0);
  CHECK(m.samples().size() == 1);
  CHECK(m.last(s) == 0);
  CHECK(m.peak(s) == 0);
}

TEST_CASE("metrics: series interning returns stable ids", "[metrics]") {
  SimClock clock;
  MetricsRecorder m(clock);
  const auto a = m.series("a");
  const auto b = m.series("b");
  CHECK(a != b);
  CHECK(m.series("a") == a);
  CHECK(m.series(std::string("b")) == b);
  CHECK(m.series_count() == 2);
  CHECK(m.name(a) == "a");
  CHECK(m.name(b) == "b");
  // Setting by name interns the same id and records on it.
  m.set("a", 3);
  m.set("c", 1);
  CHECK(m.series_count() == 3);
  CHECK(m.series("c") == 2);
  REQUIRE(m.samples().size() == 2);
  CHECK(m.samples()[0].series == a);
  CHECK(m.last(a) == 3);
  // Many more series do not disturb the old ids.
  for (int i = 0; i < 1000; ++i) m.series("s" + std::to_string(i));
  CHECK(m.series("a") == a);
  CHECK(m.series("b") == b);
  CHECK(m.name(a) == "a");
  CHECK(m.peak("never-set") == 0);
}

TEST_CASE("metrics: peak and last are tracked per series", "[metrics]") {
  SimClock clock;
  MetricsRecorder m(clock);
  const auto a = m.series("a");
  const auto b = m.series("b");
  for (double v : {1.0, 9.0, 4.0}) m.set(a, v);
  for (double v : {2.0, 3.0}) m.set(b, v);
  CHECK(m.peak(a) == 9);
  CHECK(m.last(a) == 4);
  CHECK(m.peak(b) == 3);
  CHECK(m.last(b) == 3);
  CHECK(m.samples().size() == 5);
}

// ---- SampleLog ----------------------------------------------------------------------------------

TEST_CASE("sample log: every value and time comes back bit for bit", "[metrics]") {
  std::vector<GaugeSample> in;
  std::mt19937_64 rng(5);
  const double specials[] = {0.0,
                             -0.0,
                             1.0,
                             -1.0,
                             0.5,
                             1e300,
                             -1e-300,
                             0x1p53,
                             0x1p53 - 1,
                             0x1p60,
                             123456789.0,
                             std::nan(""),
                             std::numeric_limits<double>::infinity()};
  SimTime t = 0;
  for (int i = 0; i < 20000; ++i) {
    // Mostly steps forward (often 0), some backwards, some far.
    const uint64_t r = rng();
    if (r % 7 == 0)
      t -= static_cast<SimTime>(r % 1000);
    else if (r % 11 == 0)
      t += static_cast<SimTime>(rng() >> 24);  // far, but 20,000 steps never overflow
    else if (r % 3 == 0)
      t += 100000000;
    double v;
    switch (rng() % 4) {
      case 0:
        v = static_cast<double>(rng() % 100000);
        break;
      case 1:
        v = specials[rng() % std::size(specials)];
        break;
      case 2:
        v = std::ldexp(static_cast<double>(rng() >> 11), -20);
        break;
      default:
        v = static_cast<double>(rng());
        break;
    }
    in.push_back(
        {i == 7 ? INT64_MIN : (i == 8 ? INT64_MAX : t), static_cast<uint32_t>(rng() % 40), v});
  }
  in.push_back({0, 0xffffffffu, -2.5});
  SampleLog log;
  for (const GaugeSample& s : in) log.push_back(s);
  REQUIRE(log.size() == in.size());
  const auto same = [](const GaugeSample& a, const GaugeSample& b) {
    return a.time == b.time && a.series == b.series &&
           std::bit_cast<uint64_t>(a.value) == std::bit_cast<uint64_t>(b.value);
  };
  size_t i = 0;
  for (const GaugeSample& s : log) CHECK(same(s, in[i++]));
  CHECK(i == in.size());
  for (size_t k :
       {size_t{0}, size_t{1}, size_t{255}, size_t{256}, size_t{257}, size_t{9999}, in.size() - 1})
    CHECK(same(log[k], in[k]));
  CHECK(same(log.back(), in.back()));
  const SampleLog copy = log;
  const std::vector<GaugeSample> out = copy.to_vector();
  REQUIRE(out.size() == in.size());
  for (size_t k = 0; k < in.size(); ++k) CHECK(same(out[k], in[k]));
}

TEST_CASE("sample log: a gauge sample costs a few bytes, not 24", "[metrics]") {
  SimClock clock;
  MetricsRecorder m(clock);
  const auto used = m.series("kv.used_blocks");
  const auto waiting = m.series("waiting");
  for (int k = 0; k < 100000; ++k) {
    clock.advance(100000000);  // sampled every 100 ms
    m.set(used, 1000 + k % 5000);
    m.set(waiting, k % 17);
  }
  REQUIRE(m.samples().size() == 200000);
  CHECK(m.samples().bytes() < 200000 * 6);  // 7 + 3 bytes a pair, 24 + 24 unpacked
  // Taking the samples leaves the recorder empty and recording.
  const SampleLog taken = m.take_samples();
  CHECK(taken.size() == 200000);
  CHECK(m.samples().empty());
  clock.advance(1);
  m.set(used, 1);
  REQUIRE(m.samples().size() == 1);
  CHECK(m.samples()[0].time == clock.now());
  CHECK(m.samples()[0].value == 1);
}

}  // namespace
}  // namespace memsim
