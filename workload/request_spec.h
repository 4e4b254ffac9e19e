// RequestSpec: one request of a serving workload (arrival, token counts, prefix group, n/beams).
#pragma once

#include <cstdint>

#include "backends/backend.h"

namespace memsim {

// One request of a serving workload.
struct RequestSpec {
  uint64_t id = 0;             // 0..N-1 in arrival order
  SimTime arrival = 0;         // simulated ns
  uint32_t prompt_tokens = 0;  // >= 1
  uint32_t output_tokens = 0;  // >= 1 (tokens to generate per sample/beam)
  // -1: none; else the requests of a group share one token sequence, of which each request's
  // first prefix_tokens prompt tokens are a copy (1 <= prefix_tokens < prompt_tokens).
  int32_t prefix_group = -1;
  uint32_t prefix_tokens = 0;  // 0 when prefix_group == -1
  uint32_t n = 1;              // parallel samples (fork after prefill)
  uint32_t beam_width = 1;     // beam search width (n == 1 when beam_width > 1)

  friend bool operator==(const RequestSpec&, const RequestSpec&) = default;
};

// The largest token count a length distribution, a clamp or a trace row may give.
inline constexpr uint32_t kMaxRequestTokens = 1u << 30;

}  // namespace memsim
