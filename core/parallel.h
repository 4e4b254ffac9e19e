// Runs independent jobs on a few threads: each index once, in no particular order.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace memsim {

// Calls body(i) for every i in [0, n), on up to `threads` threads (0: one per hardware thread;
// 1: on the calling thread, in order). body must be safe to run concurrently for different i.
template <class Body>
void parallel_for(size_t n, size_t threads, Body&& body) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = std::min(threads, n);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < n; i = next++) body(i);
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

}  // namespace memsim
