// Registry of memory savers: YAML `impl:` name -> typed config parser -> factory.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/config/registry.h"
#include "src/saver/memory_saver.h"

namespace memsim {

using SaverFactory = std::function<std::unique_ptr<MemorySaver>(Backend&)>;

// What the RL experiment needs to know of a saver beyond the role interface.
struct SaverTraits {
  // The tags the system it models puts in its pausable pool, unless a run lists its own.
  std::vector<std::string> default_tags;
};

using SaverEntry = RegistryEntry<SaverFactory, SaverTraits>;

const Registry<SaverEntry>& memory_savers();

}  // namespace memsim
