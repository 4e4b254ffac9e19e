// The graph-memory registry: one line per implementation, and the parsers of their typed configs.
#include "src/graph/registry.h"

#include "src/graph/global_pool.h"
#include "src/graph/graph_mem_nodes.h"
#include "src/graph/private_pools.h"
#include "src/graph/shared_pool.h"
#include "src/graph/vmm_alias.h"

namespace memsim {
namespace {

// The pools' caching allocator: max_split_size is its only key (without the allocator family's
// torch_caching bound of above 20 MiB).
TorchCachingConfig parse_pool_allocator(const ConfigNode& node) {
  TorchCachingConfig c;
  if (auto v = node.find("max_split_size")) c.max_split_size = v->as_bytes();
  return c;
}

VmmAliasConfig parse_vmm_alias(const ConfigNode& node) {
  VmmAliasConfig c;
  c.allocator = parse_pool_allocator(node);
  if (auto v = node.find("va_factor")) c.va_factor = v->as_double_in(0.01, 64);
  if (auto v = node.find("handles"))
    c.handle_per_extension = v->as_choice({"fixed", "per_extension"}) == "per_extension";
  if (auto v = node.find("set_access"))
    c.set_access_per_space = v->as_choice({"per_handle", "per_space"}) == "per_space";
  if (auto v = node.find("spaces")) c.reset_pointer = v->as_choice({"per_shape", "one"}) == "one";
  if (auto v = node.find("handle_bytes")) {
    c.handle_bytes = v->as_bytes();
    if (c.handle_bytes == 0) v->fail("must be positive (a multiple of the GPU's granularity)");
  }
  return c;
}

GraphMemNodesConfig parse_graph_mem_nodes(const ConfigNode& node) {
  GraphMemNodesConfig c;
  if (auto v = node.find("trim_at_teardown")) c.trim_at_teardown = v->as_bool();
  return c;
}

}  // namespace

const Registry<GraphEntry>& graph_strategies() {
  static const Registry<GraphEntry> kRegistry{
      "graph strategy",
      {
          {"private_pools",
           "a fresh caching-allocator pool per graph (PyTorch default)",
           {"max_split_size"},
           parse_into<PrivatePools>(parse_pool_allocator)},
          {"shared_pool",
           "one pool per graph runner, shared by its graphs (vLLM)",
           {"max_split_size"},
           parse_into<SharedPool>(parse_pool_allocator)},
          {"global_pool",
           "one pool for every graph runner of the process (SGLang)",
           {"max_split_size"},
           parse_into<GlobalPool>(parse_pool_allocator)},
          {"vmm_alias",
           "a new VA space per shape over shared physical handles (xLLM)",
           {"max_split_size", "handle_bytes", "handles", "va_factor", "set_access", "spaces"},
           parse_into<VmmAlias>(parse_vmm_alias)},
          {"graph_mem_nodes",
           "cudaMallocAsync graph memory nodes, driver-managed reuse",
           {"trim_at_teardown"},
           parse_into<GraphMemNodes>(parse_graph_mem_nodes),
           {.driver_managed_memory = true}},
      }};
  return kRegistry;
}

}  // namespace memsim
