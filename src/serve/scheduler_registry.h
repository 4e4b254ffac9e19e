// Registry of schedulers: YAML `scheduler: {impl: ...}` name -> options parser and factory.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/config/registry.h"
#include "src/serve/scheduler.h"

namespace memsim {

using SchedulerFactory = std::function<std::unique_ptr<Scheduler>()>;

// A scheduler's typed config is the ServeOptions every scheduler reads (the engine holds them),
// so its parser reads a `scheduler:` map over the options the experiment set so far.
struct SchedulerEntry {
  std::string name;
  std::string summary;
  std::vector<std::string> keys;  // ServeOptions keys this scheduler accepts (besides impl)
  // Reads the keys of a map whose keys were checked (Registry::select / check_keys) over `base`.
  std::function<ServeOptions(const ConfigNode& node, ServeOptions base)> parse;
  SchedulerFactory make;
};

const Registry<SchedulerEntry>& schedulers();

}  // namespace memsim
