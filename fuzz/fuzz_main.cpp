// libFuzzer entry point of one target of fuzz/targets.h, chosen at build time by
// MEMSIM_FUZZ_TARGET (fuzz/meson.build builds it once per target): a finding aborts.
#include <cstdio>
#include <cstdlib>

#include "fuzz/targets.h"

#define MEMSIM_FUZZ_STR2(x) #x
#define MEMSIM_FUZZ_STR(x) MEMSIM_FUZZ_STR2(x)
#define MEMSIM_FUZZ_CAT2(a, b) a##b
#define MEMSIM_FUZZ_CAT(a, b) MEMSIM_FUZZ_CAT2(a, b)

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("MEMSIM_ROOT", MEMSIM_FUZZ_SOURCE_ROOT, 0);  // configs resolve gpu: / model: names
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string problem = memsim::fuzz::MEMSIM_FUZZ_CAT(
      MEMSIM_FUZZ_TARGET, _target)(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!problem.empty()) {
    std::fprintf(stderr, "fuzz_%s: %s\n", MEMSIM_FUZZ_STR(MEMSIM_FUZZ_TARGET), problem.c_str());
    std::abort();
  }
  return 0;
}
