// Helpers of the GPU test programs: Result/Status checks, and the main() that skips (exit 77)
// where no CUDA device is present.
#pragma once

#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <utility>

#include "backends/cuda/cuda_backend.h"
#include "core/clock.h"

namespace memsim {

template <class T>
T take(Result<T> r) {
  INFO((r.ok() ? std::string() : r.error().message));
  REQUIRE(r.ok());
  return std::move(r).value();
}

inline void ok(const Status& s) {
  INFO((s.ok() ? std::string() : s.error().message));
  REQUIRE(s.ok());
}

// Runs the Catch session when a CudaBackend can be created on `spec`; exits 77 (Meson's
// "skipped") when the build or the machine has no CUDA device, 1 on any other failure.
inline int run_on_gpu(const char* program, const GpuSpec& spec, int argc, char** argv) {
  {
    SimClock clock;
    auto probe = CudaBackend::create(spec, clock, nullptr);
    if (!probe.ok()) {
      std::fprintf(stderr, "%s: %s\n", program, probe.error().message.c_str());
      return probe.error().code == ErrorCode::kNotSupported ? 77 : 1;
    }
  }
  return Catch::Session().run(argc, argv);
}

}  // namespace memsim
