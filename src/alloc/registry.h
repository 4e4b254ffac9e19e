// Registry of caching allocators: YAML `impl:` name -> typed config parser -> factory.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/alloc/caching_allocator.h"
#include "src/alloc/torch_caching.h"
#include "src/config/config_node.h"

namespace memsim {

// Makes a fresh allocator (owning its segment source) over a backend.
using AllocatorFactory = std::function<std::unique_ptr<CachingAllocator>(Backend&)>;

struct AllocatorInfo {
  std::string name;
  std::string summary;
  std::vector<std::string> params;  // YAML keys this implementation accepts
  // Validates this implementation's keys of `node` (at load time) and returns a factory.
  std::function<AllocatorFactory(const ConfigNode& node)> parse;
};

const std::vector<AllocatorInfo>& caching_allocators();
const AllocatorInfo* find_caching_allocator(std::string_view name);
std::vector<std::string> caching_allocator_names();

// The torch_caching keys of `node` (max_split_size, roundup_power2_divisions,
// garbage_collection_threshold, memory_limit, expandable_segments) over `base`; shared with the
// graph-memory pools.
TorchCachingConfig parse_torch_caching(const ConfigNode& node, TorchCachingConfig base = {});

}  // namespace memsim
