// Registry of caching allocators: YAML `impl:` name -> typed config parser -> factory.
#pragma once

#include <functional>
#include <memory>

#include "src/alloc/caching_allocator.h"
#include "src/config/registry.h"

namespace memsim {

// Makes a fresh allocator (owning its segment source) over a backend.
using AllocatorFactory = std::function<std::unique_ptr<CachingAllocator>(Backend&)>;

// What drivers need to know of an allocator beyond the role interface.
struct AllocatorTraits {
  // Its keys are PyTorch's CUDA caching-allocator settings (PYTORCH_CUDA_ALLOC_CONF): memsim
  // replay configures it from a snapshot's recorded allocator_settings and exports its replay.
  bool pytorch_alloc_conf = false;
};

using AllocatorEntry = RegistryEntry<AllocatorFactory, AllocatorTraits>;

const Registry<AllocatorEntry>& caching_allocators();

}  // namespace memsim
