// The maps of a config file and the keys each accepts: one table per loader, read by its
// expect_keys calls and by the test that checks docs/config.md against the code.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace memsim {

// One map a loader reads and the keys it accepts.
struct MapKeys {
  // Where the map is: "" the file's top level; "dynamic"; "runs[]" every entry of a list;
  // "workloads[source: snapshot]" the entries of a list whose `source` is snapshot.
  std::string path;
  std::vector<std::string> keys;
  // A strategy map, `{impl: NAME, ...}`: besides `impl` and `keys` it takes the keys of the
  // implementation NAME in this registry ("graph_strategies()"); empty for a plain map.
  std::string registry{};
};

// Every map one loader reads, in the order of docs/config.md.
using ConfigKeys = std::vector<MapKeys>;

// The keys of the map at `path` in `table`; a path not in it is a bug of the caller.
inline const std::vector<std::string>& keys_at(const ConfigKeys& table, std::string_view path) {
  for (const MapKeys& m : table)
    if (m.path == path) return m.keys;
  throw std::logic_error("no config map '" + std::string(path) + "'");
}

}  // namespace memsim
