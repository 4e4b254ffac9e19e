// Graph memory node model: capture bookkeeping, launch planning, trim.
#include "backends/sim/graph_memory_model.h"

#include <algorithm>
#include <string>

namespace memsim {

uint64_t GraphMemoryModel::Arena::alloc(uint64_t size) {
  auto fit = free_.lower_bound({size, 0});
  if (fit == free_.end()) {
    // A new chunk, appended after the others (a free tail is not grown: the new chunk is
    // sized for the whole request).
    const uint64_t bytes = (size + chunk_ - 1) / chunk_ * chunk_;
    const uint64_t base = next_base_;
    next_base_ += bytes;
    size_ += bytes;
    blocks_.emplace(base, Block{bytes, true});
    auto fresh = blocks_.find(base);
    if (fresh != blocks_.begin() && std::prev(fresh)->second.free) {
      // Merge with a free tail of the previous chunk (adjacent chunks coalesce once free).
      auto prev = std::prev(fresh);
      free_.erase({prev->second.size, prev->first});
      prev->second.size += bytes;
      blocks_.erase(fresh);
      fresh = prev;
    }
    fit = free_.insert({fresh->second.size, fresh->first}).first;
    if (fit->first < size) fit = free_.lower_bound({size, 0});
  }
  const uint64_t offset = fit->second;
  Block& b = blocks_.at(offset);
  free_.erase(fit);
  if (b.size > size) {  // split: the remainder stays free after the allocation
    blocks_.emplace(offset + size, Block{b.size - size, true});
    free_.insert({b.size - size, offset + size});
    b.size = size;
  }
  b.free = false;
  return offset;
}

void GraphMemoryModel::Arena::free(uint64_t offset) {
  auto it = blocks_.find(offset);
  it->second.free = true;
  auto next = std::next(it);
  if (next != blocks_.end() && next->second.free) {
    free_.erase({next->second.size, next->first});
    it->second.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free) {
      free_.erase({prev->second.size, prev->first});
      prev->second.size += it->second.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  free_.insert({it->second.size, it->first});
}

Status GraphMemoryModel::begin(StreamId s) {
  if (capturing(s))
    return make_error(ErrorCode::kInvalidState,
                      "begin_capture: stream " + std::to_string(s.id) + " is already capturing");
  captures_.emplace(s, Capture(chunk_));
  return {};
}

void GraphMemoryModel::add_node(StreamId s, uint64_t n) {
  captures_.at(s).graph.nodes += n;
}

uint64_t GraphMemoryModel::nodes_in_capture(StreamId s) const {
  auto it = captures_.find(s);
  return it == captures_.end() ? 0 : it->second.graph.nodes;
}

void GraphMemoryModel::add_alloc(StreamId s, DevPtr va, uint64_t bytes) {
  Capture& c = captures_.at(s);
  c.index.emplace(va, c.graph.allocs.size());
  c.graph.allocs.push_back(Alloc{va, pages(bytes)});
  c.slot.emplace(va, c.arena.alloc(pages(bytes)));
  c.graph.peak = c.arena.size();
  ++c.graph.nodes;
  ++c.graph.mem_nodes;
}

Status GraphMemoryModel::add_free(StreamId s, DevPtr va) {
  Capture& c = captures_.at(s);
  auto it = c.index.find(va);
  if (it == c.index.end()) {
    // A free node for another graph's allocation: it runs when this graph is launched.
    if (!alloc_owner_.count(va))
      return make_error(ErrorCode::kInvalidArgument,
                        "free_async during capture of a pointer that is no graph allocation");
    c.graph.frees_of_others.push_back(va);
    ++c.graph.nodes;
    ++c.graph.mem_nodes;
    return {};
  }
  Alloc& a = c.graph.allocs[it->second];
  if (a.freed_in_graph) return make_error(ErrorCode::kInvalidState, "free_async: double free");
  a.freed_in_graph = true;
  c.arena.free(c.slot.at(va));
  ++c.graph.nodes;
  ++c.graph.mem_nodes;
  return {};
}

Result<GraphMemoryModel::Ended> GraphMemoryModel::end(StreamId s) {
  auto it = captures_.find(s);
  if (it == captures_.end())
    return make_error(ErrorCode::kInvalidState,
                      "end_capture: stream " + std::to_string(s.id) + " is not capturing");
  Graph g = std::move(it->second.graph);
  captures_.erase(it);
  const uint64_t id = next_graph_++;
  for (const Alloc& a : g.allocs) alloc_owner_.emplace(a.va, id);
  const uint64_t nodes = g.nodes;
  graphs_.emplace(id, std::move(g));
  return Ended{id, nodes};
}

uint64_t GraphMemoryModel::live_bytes_of(const Graph& g) const {
  uint64_t sum = 0;
  for (const Alloc& a : g.allocs)
    if (a.live_outside) sum += a.pages;
  return sum;
}

GraphMemoryModel::Alloc* GraphMemoryModel::find_alloc(DevPtr va, uint64_t* graph_id) {
  auto owner = alloc_owner_.find(va);
  if (owner == alloc_owner_.end()) return nullptr;
  auto g = graphs_.find(owner->second);
  if (g == graphs_.end()) return nullptr;
  *graph_id = owner->second;
  for (Alloc& a : g->second.allocs)
    if (a.va == va) return &a;
  return nullptr;
}

Result<GraphMemoryModel::LaunchPlan> GraphMemoryModel::plan_launch(uint64_t graph_id,
                                                                   StreamId s) const {
  auto it = graphs_.find(graph_id);
  if (it == graphs_.end() || it->second.destroyed)
    return make_error(ErrorCode::kInvalidArgument, "launch of an unknown or destroyed graph");
  const Graph& g = it->second;
  LaunchPlan plan;
  plan.nodes = g.nodes;
  if (!g.uploaded) plan.upload_nodes = g.nodes - g.mem_nodes;
  // While g runs, the pool holds g's peak (its own outputs included) and the live outputs of
  // every other graph (their pages cannot be reused).
  const uint64_t others = live_outputs_ - live_bytes_of(g);  // g's own are auto-freed on launch
  plan.reserved_after = std::max(reserved_, g.peak + others);
  if (!g.mapped)
    plan.map_granules = g.peak / granularity_;
  else if (g.last_stream && *g.last_stream != s)
    plan.remap_granules = g.peak / granularity_;
  return plan;
}

void GraphMemoryModel::commit_launch(uint64_t graph_id, StreamId s, const LaunchPlan& plan) {
  Graph& g = graphs_.at(graph_id);
  reserved_ = plan.reserved_after;
  for (Alloc& a : g.allocs) {
    if (a.freed_in_graph || a.live_outside) continue;  // live ones: auto-freed, re-allocated
    a.live_outside = true;
    a.freed_outside = false;
    live_outputs_ += a.pages;
  }
  g.mapped = true;
  g.uploaded = true;
  g.last_stream = s;
  const std::vector<DevPtr> frees = g.frees_of_others;
  for (DevPtr va : frees) {
    uint64_t owner = 0;
    Alloc* a = find_alloc(va, &owner);
    if (a == nullptr || !a->live_outside) continue;  // freeing a dead allocation: a no-op here
    a->live_outside = false;
    a->freed_outside = true;
    live_outputs_ -= a->pages;
  }
}

Result<std::optional<DevPtr>> GraphMemoryModel::free_outside(DevPtr va) {
  uint64_t owner = 0;
  Alloc* a = find_alloc(va, &owner);
  if (a == nullptr) return make_error(ErrorCode::kInvalidArgument, "not a graph allocation");
  if (!a->live_outside)
    return make_error(ErrorCode::kInvalidState,
                      "free of a graph allocation that is not live (never launched or freed)");
  a->live_outside = false;
  a->freed_outside = true;
  live_outputs_ -= a->pages;
  Graph& g = graphs_.at(owner);
  if (!g.destroyed) return std::optional<DevPtr>();
  alloc_owner_.erase(va);
  if (live_bytes_of(g) == 0) graphs_.erase(owner);
  return std::optional<DevPtr>(va);
}

Result<std::vector<DevPtr>> GraphMemoryModel::destroy(uint64_t graph_id) {
  auto it = graphs_.find(graph_id);
  if (it == graphs_.end() || it->second.destroyed)
    return make_error(ErrorCode::kInvalidArgument, "destroy of an unknown or destroyed graph");
  Graph& g = it->second;
  g.destroyed = true;
  std::vector<DevPtr> release;
  for (const Alloc& a : g.allocs) {
    // A live output outlives its graph (the guide: destruction frees nothing that is live).
    if (a.live_outside) continue;
    // An output never launched is never allocated; its VA goes with the graph.
    release.push_back(a.va);
    alloc_owner_.erase(a.va);
  }
  if (live_bytes_of(g) == 0) graphs_.erase(it);
  return release;
}

void GraphMemoryModel::trim() {
  reserved_ = live_outputs_;
  for (auto& [id, g] : graphs_) g.mapped = live_bytes_of(g) > 0;
}

std::vector<DevPtr> GraphMemoryModel::all_alloc_vas() const {
  std::vector<DevPtr> out;
  for (const auto& [va, id] : alloc_owner_) out.push_back(va);
  for (const auto& [s, c] : captures_)
    for (const Alloc& a : c.graph.allocs) out.push_back(a.va);
  return out;
}

}  // namespace memsim
