// libFuzzer entry point of the config target (fuzz/targets.h): a finding aborts.
#include <cstdio>
#include <cstdlib>

#include "fuzz/targets.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("MEMSIM_ROOT", MEMSIM_FUZZ_SOURCE_ROOT, 0);  // configs resolve gpu: / model: names
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string problem =
      memsim::fuzz::config_target(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!problem.empty()) {
    std::fprintf(stderr, "fuzz_config: %s\n", problem.c_str());
    std::abort();
  }
  return 0;
}
