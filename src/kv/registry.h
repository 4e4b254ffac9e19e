// Registry of KV-cache strategies: YAML `impl:` name -> typed config parser -> factory.
#pragma once

#include <functional>
#include <memory>

#include "src/config/registry.h"
#include "src/kv/kv_cache_manager.h"

namespace memsim {

using KvFactory = std::function<std::unique_ptr<KvCacheManager>()>;
// What the engine needs to know of a KV strategy beyond the role interface is asked of the
// strategy itself (KvCacheManager::caches_prefixes, block_table_tokens): it depends on the config.
using KvEntry = RegistryEntry<KvFactory>;

const Registry<KvEntry>& kv_strategies();

}  // namespace memsim
