// Shared by the serving-engine tests: requests by hand, a step profile of fixed step time, and a
// random workload with shared prefixes that preempts in a small pool.
#pragma once

#include <cstdint>
#include <memory>

#include "core/clock.h"
#include "workload/requests.h"
#include "workload/step_profile.h"

namespace memsim::test {

inline RequestSpec serve_request(uint64_t id, uint32_t prompt, uint32_t output,
                                 SimTime arrival = 0) {
  RequestSpec q;
  q.id = id;
  q.prompt_tokens = prompt;
  q.output_tokens = output;
  q.arrival = arrival;
  return q;
}

// Every step takes `ms` (one decode and one prefill row of one point each: flat), all of it GPU
// time (a profile has no host share). Llama-3.1-8B on the H200, which the tests run.
inline std::shared_ptr<const ProfiledStepTime> flat_step_profile(double ms) {
  StepProfile p;
  p.gpu = "h200";
  p.model = "llama-3.1-8b";
  p.decode = {{1, {1}, {ms}}};
  p.prefill = {{1, {0}, {ms}}};
  return std::make_shared<ProfiledStepTime>(p);
}

// `count` Poisson requests at `rate`: lognormal prompts (mean 400, 16..2,000) and outputs (mean
// `mean_output`, 1..`max_output`), half of them in 4 prefix groups of 200 tokens.
inline RequestSet prefix_workload(uint64_t count, uint64_t seed, double rate, double mean_output,
                                  uint32_t max_output) {
  SyntheticRequestsConfig q;
  q.count = count;
  q.seed = seed;
  q.arrival.rate = rate;
  q.prompt = {LengthDist::kLognormal, 1, 16, 2000, 400, 1.0};
  q.output = {LengthDist::kLognormal, 1, 1, max_output, mean_output, 1.0};
  q.prefix = {4, 200, 0.5};
  return generate_request_set(q);
}

}  // namespace memsim::test
