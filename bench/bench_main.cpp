// memsim-bench: throughput figures of the engine and the allocators (not a test; prints numbers).
#include <fmt/format.h>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "bench/bench_cli.h"
#include "core/event_queue.h"
#include "src/alloc/device_segment_source.h"
#include "src/alloc/torch_caching.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

memsim::GpuSpec bench_gpu() {
  memsim::GpuSpec g;
  g.name = "bench";
  g.capacity = 1ull << 50;
  g.granularity = 2ull << 20;
  g.va_space = 1ull << 52;
  return g;
}

// Events that schedule further events at random future times: a steady heap of `live` events.
void bench_events(uint64_t total, uint64_t live) {
  memsim::SimClock clock;
  memsim::EventQueue q(clock);
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<int64_t> gap(1, 1000000);
  uint64_t fired = 0;
  std::function<void()> tick = [&] {
    if (++fired + q.size() <= total) q.schedule_after(gap(rng), tick);
  };
  for (uint64_t i = 0; i < live; ++i) q.schedule(gap(rng), tick);
  const auto t0 = Clock::now();
  q.run();
  const double s = seconds_since(t0);
  fmt::print("engine: {} events ({} pending at a time) in {:.3f} s = {:.2f} M events/s\n",
             q.dispatched(), live, s, q.dispatched() / s / 1e6);
}

// Random malloc/free mix over the PyTorch-faithful caching allocator on the sim backend.
void bench_allocator(uint64_t ops) {
  memsim::SimClock clock;
  memsim::SimBackend backend(bench_gpu(), clock);
  memsim::DeviceSegmentSource source(backend, "bench");
  memsim::TorchCachingAllocator alloc(source);
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> size(11.0, 3.0);  // median ~60 KiB, long tail to GiBs
  std::vector<memsim::DevPtr> live;
  live.reserve(ops);
  const auto t0 = Clock::now();
  uint64_t done = 0;
  for (uint64_t i = 0; i < ops; ++i) {
    const bool do_free = !live.empty() && (live.size() > 4096 || (rng() & 1));
    if (do_free) {
      const size_t k = rng() % live.size();
      (void)alloc.free(live[k]);
      live[k] = live.back();
      live.pop_back();
    } else {
      const auto bytes = static_cast<uint64_t>(std::min(size(rng), 4e9)) + 1;
      auto p = alloc.malloc(bytes, memsim::StreamId{static_cast<uint32_t>(rng() % 2)});
      if (p.ok()) live.push_back(*p);
    }
    ++done;
  }
  const double s = seconds_since(t0);
  fmt::print(
      "torch_caching: {} malloc/free ops (<= 4096 live) in {:.3f} s = {:.2f} M ops/s; "
      "{} segments\n",
      done, s, done / s / 1e6, alloc.stats().segments);
}

const std::string kUsage =
    "usage: memsim-bench\n"
    "  Prints the event queue's and torch_caching's throughput (1M events, 1M malloc/free).\n";

}  // namespace

int main(int argc, char** argv) {
  return memsim::bench::guarded_main("memsim-bench", kUsage, argc, argv, [&] {
    if (argc > 1) throw memsim::bench::UsageError("takes no arguments");
    bench_events(1'000'000, 10'000);
    bench_events(1'000'000, 100);
    bench_allocator(1'000'000);
    return 0;
  });
}
