// Graph memory node model: capture bookkeeping (addresses, pages, fork/join order), launch
// planning (sharing, concurrency, remaps), trim.
#include "backends/sim/graph_memory_model.h"

#include <algorithm>
#include <string>

namespace memsim {

namespace {

std::string stream_name(StreamId s) {
  return "stream " + std::to_string(s.id);
}

}  // namespace

// ---- arena ----------------------------------------------------------------------------------

bool GraphMemoryModel::Arena::visible(const Stamps& stamps, const Clock& seen) {
  for (const auto& [stream, tick] : stamps) {
    auto it = seen.find(stream);
    if (it == seen.end() || it->second < tick) return false;
  }
  return true;
}

uint64_t GraphMemoryModel::Arena::alloc(uint64_t size, const Clock& seen) {
  size = (size + unit_ - 1) / unit_ * unit_;
  const auto best_fit = [&] {
    auto fit = free_.lower_bound({size, 0});
    while (fit != free_.end() && !visible(blocks_.at(fit->second).stamps, seen)) ++fit;
    return fit;
  };
  auto fit = best_fit();
  if (fit == free_.end() && coalesce_visible(seen)) fit = best_fit();
  if (fit == free_.end()) {
    // A new chunk at the end, sized for the whole request.
    const uint64_t bytes = (size + chunk_ - 1) / chunk_ * chunk_;
    const uint64_t base = size_;
    size_ += bytes;
    auto fresh = blocks_.emplace(base, Block{bytes, true, {}}).first;
    if (merge_tail_ && fresh != blocks_.begin()) {
      auto prev = std::prev(fresh);
      if (prev->second.free && visible(prev->second.stamps, seen)) {
        // The physical arena: a free tail of the previous chunk coalesces with the new one.
        free_.erase({prev->second.size, prev->first});
        prev->second.size += bytes;
        blocks_.erase(fresh);
        fresh = prev;
      }
    }
    fit = free_.insert({fresh->second.size, fresh->first}).first;
  }
  const uint64_t offset = fit->second;
  Block& b = blocks_.at(offset);
  free_.erase(fit);
  if (b.size > size) {  // split: the remainder stays free after the allocation
    blocks_.emplace(offset + size, Block{b.size - size, true, b.stamps});
    free_.insert({b.size - size, offset + size});
    b.size = size;
  }
  b.free = false;
  b.stamps.clear();
  return offset;
}

void GraphMemoryModel::Arena::absorb(Block& into, const Block& from) {
  into.size += from.size;
  for (const auto& stamp :
       from.stamps) {  // (stream, tick); no structured binding: a lambda uses it
    auto same = std::find_if(into.stamps.begin(), into.stamps.end(),
                             [&](const auto& st) { return st.first == stamp.first; });
    if (same == into.stamps.end())
      into.stamps.push_back(stamp);
    else
      same->second = std::max(same->second, stamp.second);
  }
}

bool GraphMemoryModel::Arena::same_streams(const Stamps& a, const Stamps& b) {
  if (a.size() != b.size()) return false;
  for (const auto& stamp : a)
    if (std::none_of(b.begin(), b.end(), [&](const auto& st) { return st.first == stamp.first; }))
      return false;
  return true;
}

bool GraphMemoryModel::Arena::coalesce_visible(const Clock& seen) {
  bool merged = false;
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    auto next = std::next(it);
    if (next == blocks_.end()) break;
    if (it->second.free && next->second.free && visible(it->second.stamps, seen) &&
        visible(next->second.stamps, seen)) {
      free_.erase({it->second.size, it->first});
      free_.erase({next->second.size, next->first});
      absorb(it->second, next->second);
      blocks_.erase(next);
      free_.insert({it->second.size, it->first});
      merged = true;
    } else {
      it = next;
    }
  }
  return merged;
}

void GraphMemoryModel::Arena::free(uint64_t offset, const Stamps& stamps) {
  auto it = blocks_.find(offset);
  it->second.free = true;
  it->second.stamps = stamps;
  // Free neighbours merge when freed on the same streams (a merged range is reusable once every
  // free that made it is ordered before the reuse); ranges freed on unordered branches stay
  // apart until an allocation that sees both needs them together (coalesce_visible).
  auto next = std::next(it);
  if (next != blocks_.end() && next->second.free &&
      same_streams(it->second.stamps, next->second.stamps)) {
    free_.erase({next->second.size, next->first});
    absorb(it->second, next->second);
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free && same_streams(prev->second.stamps, it->second.stamps)) {
      free_.erase({prev->second.size, prev->first});
      absorb(prev->second, it->second);
      blocks_.erase(it);
      it = prev;
    }
  }
  free_.insert({it->second.size, it->first});
}

// ---- capture --------------------------------------------------------------------------------

Status GraphMemoryModel::begin(StreamId s, DevPtr window, uint64_t window_bytes) {
  if (capturing(s))
    return make_error(ErrorCode::kInvalidState,
                      "begin_capture: " + stream_name(s) + " is already capturing");
  Capture& c =
      captures_.emplace(s, Capture(granularity_, chunk_, window, window_bytes)).first->second;
  member_of_.emplace(s, s);
  tick(c, s);
  return {};
}

Status GraphMemoryModel::stream_wait(StreamId waiter, StreamId on) {
  if (waiter == on) return {};
  if (capturing(on)) {
    const StreamId origin = origin_of(on);
    Capture& c = captures_.at(origin);
    if (capturing(waiter) && origin_of(waiter) != origin)
      return make_error(ErrorCode::kInvalidState, "stream_wait: " + stream_name(waiter) + " and " +
                                                      stream_name(on) +
                                                      " belong to different captures");
    Clock& mine = c.clocks[waiter];
    for (const auto& [stream, t] : c.clocks.at(on)) mine[stream] = std::max(mine[stream], t);
    member_of_.emplace(waiter, origin);  // a fork when waiter was not capturing yet
    tick(c, waiter);
    return {};
  }
  if (capturing(waiter))
    return make_error(ErrorCode::kInvalidState, "stream_wait: capturing " + stream_name(waiter) +
                                                    " cannot wait on " + stream_name(on) +
                                                    ", which is outside its capture");
  // Outside captures the driver does not look at events when it shares pages: a graph ordered
  // after another by an event still gets pages of its own while the other runs (H200).
  return {};
}

void GraphMemoryModel::add_node(StreamId s, uint64_t n) {
  Capture& c = capture_of(s);
  c.graph.nodes += n;
  tick(c, s);
}

uint64_t GraphMemoryModel::nodes_in_capture(StreamId s) const {
  auto m = member_of_.find(s);
  return m == member_of_.end() ? 0 : captures_.at(m->second).graph.nodes;
}

Result<DevPtr> GraphMemoryModel::add_alloc(StreamId s, uint64_t bytes) {
  Capture& c = capture_of(s);
  tick(c, s);
  const Clock& seen = c.clocks.at(s);
  const uint64_t offset = c.addresses.alloc(bytes, seen);
  if (offset + bytes > c.window_bytes) {
    c.addresses.free(offset, {});
    return make_error(ErrorCode::kOutOfMemory,
                      "malloc_async in a capture: the graph's addresses exceed the device", bytes);
  }
  const DevPtr va = c.window + offset;
  c.live.emplace(va, c.graph.allocs.size());
  c.graph.allocs.push_back(Alloc{va, pages(bytes)});
  c.page_slot.emplace(va, c.pages.alloc(pages(bytes), seen));
  c.graph.peak = c.pages.size();
  ++c.graph.nodes;
  ++c.graph.mem_nodes;
  return va;
}

Status GraphMemoryModel::add_free(StreamId s, DevPtr va) {
  Capture& c = capture_of(s);
  auto it = c.live.find(va);
  if (it == c.live.end()) {
    // A free node for another graph's allocation: it runs when this graph is launched.
    if (!is_graph_alloc(va))
      return make_error(ErrorCode::kInvalidArgument,
                        "free_async during capture of a pointer that is no live graph allocation");
    c.graph.frees_of_others.push_back(va);
    ++c.graph.nodes;
    ++c.graph.mem_nodes;
    tick(c, s);
    return {};
  }
  c.graph.allocs[it->second].freed_in_graph = true;
  const Stamps stamps{{s, tick(c, s)}};
  c.addresses.free(va - c.window, stamps);
  c.pages.free(c.page_slot.at(va), stamps);
  c.page_slot.erase(va);
  c.live.erase(it);
  ++c.graph.nodes;
  ++c.graph.mem_nodes;
  return {};
}

Result<GraphMemoryModel::Ended> GraphMemoryModel::end(StreamId s, bool auto_free_on_launch) {
  auto it = captures_.find(s);
  if (it == captures_.end())
    return make_error(
        ErrorCode::kInvalidState,
        "end_capture: " + stream_name(s) +
            (capturing(s) ? " was forked into another stream's capture" : " is not capturing"));
  Capture& c = it->second;
  const Clock& origin = c.clocks.at(s);
  for (const auto& [stream, clock] : c.clocks) {
    auto seen = origin.find(stream);
    if (stream != s && (seen == origin.end() || seen->second < clock.at(stream)))
      return make_error(ErrorCode::kInvalidState,
                        "end_capture: " + stream_name(stream) + " forked into the capture on " +
                            stream_name(s) +
                            " was not joined back (cudaErrorStreamCaptureUnjoined)");
  }
  Graph g = std::move(c.graph);
  g.auto_free = auto_free_on_launch;
  for (size_t i = 0; i < g.allocs.size(); ++i)
    if (!g.allocs[i].freed_in_graph) g.outputs.emplace(g.allocs[i].va, i);
  const uint64_t extent = c.addresses.size();
  const DevPtr c_window = c.window;
  for (const auto& [stream, clock] : c.clocks) member_of_.erase(stream);
  captures_.erase(it);
  const uint64_t id = next_graph_++;
  const Ended ended{id, g.nodes, c_window, extent};
  if (extent > 0) {  // a graph without allocations keeps no window (0)
    g.window = c_window;
    window_owner_.emplace(g.window, id);
    windows_.emplace(g.window, pages(extent));
  }
  graphs_.emplace(id, std::move(g));
  return ended;
}

// ---- launches -------------------------------------------------------------------------------

uint64_t GraphMemoryModel::live_bytes_of(const Graph& g) const {
  uint64_t sum = 0;
  for (const Alloc& a : g.allocs)
    if (a.live_outside) sum += a.pages;
  return sum;
}

Result<GraphMemoryModel::LaunchPlan> GraphMemoryModel::plan_launch(uint64_t graph_id, StreamId s,
                                                                   bool upload_only) const {
  auto it = graphs_.find(graph_id);
  if (it == graphs_.end() || it->second.destroyed)
    return make_error(ErrorCode::kInvalidArgument, "launch of an unknown or destroyed graph");
  const Graph& g = it->second;
  const uint64_t own_live = live_bytes_of(g);
  if (!upload_only && !g.auto_free && own_live > 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "launch: graph " + std::to_string(graph_id) +
                          " still has unfreed allocations and was instantiated without "
                          "AutoFreeOnLaunch (the driver refuses: cudaErrorInvalidValue)");
  LaunchPlan plan;
  plan.upload_only = upload_only;
  plan.nodes = g.nodes;
  if (!g.uploaded) plan.upload_nodes = g.nodes - g.mem_nodes;
  // While g runs, the pool holds g's peak (its own outputs included: a launch frees and
  // re-allocates them), the live outputs of every other graph, and the pages of graphs that
  // may still run on other streams.
  // Graphs of one other stream run one after another: they share pages among themselves.
  std::map<StreamId, uint64_t> beside;  // other stream -> the largest graph that may run there
  for (const auto& [stream, ids] : running_) {
    if (stream == s) continue;  // one stream runs its work in order
    for (uint64_t id : ids) {
      if (id == graph_id) continue;
      const Graph& h = graphs_.at(id);
      beside[stream] = std::max(beside[stream], h.peak - live_bytes_of(h));
    }
  }
  uint64_t need = g.peak + live_outputs_ - own_live;
  for (const auto& [stream, bytes] : beside) need += bytes;
  plan.reserved_after = std::max(reserved_, need);
  if (!g.mapped)
    plan.map_granules = g.peak / granularity_;
  else if (need > reserved_)
    plan.remap_granules = g.peak / granularity_;  // others hold some of its pages now
  return plan;
}

std::vector<DevPtr> GraphMemoryModel::commit_launch(uint64_t graph_id, StreamId s,
                                                    const LaunchPlan& plan) {
  Graph& g = graphs_.at(graph_id);
  reserved_ = plan.reserved_after;
  g.mapped = true;
  g.uploaded = true;
  if (plan.upload_only) return {};
  for (Alloc& a : g.allocs) {
    if (a.freed_in_graph || a.live_outside) continue;  // live ones: auto-freed, re-allocated
    a.live_outside = true;
    live_outputs_ += a.pages;
  }
  for (auto& [stream, ids] : running_)
    if (stream != s) ids.erase(graph_id);  // its earlier launch on another stream is ordered before
  running_[s].insert(graph_id);
  std::vector<DevPtr> released;
  for (DevPtr va : g.frees_of_others) {
    const auto at = output_at(va);
    if (!at) continue;  // freeing a dead allocation: a no-op here
    Graph& owner = graphs_.at(at->first);
    Alloc& a = owner.allocs[at->second];
    if (!a.live_outside) continue;
    a.live_outside = false;
    live_outputs_ -= a.pages;
    if (owner.destroyed && live_bytes_of(owner) == 0)
      if (auto w = drop_graph(at->first)) released.push_back(*w);
  }
  return released;
}

// ---- outside captures -----------------------------------------------------------------------

std::optional<std::pair<uint64_t, size_t>> GraphMemoryModel::output_at(DevPtr va) const {
  auto w = window_owner_.upper_bound(va);
  if (w == window_owner_.begin()) return std::nullopt;
  --w;
  auto g = graphs_.find(w->second);
  if (g == graphs_.end()) return std::nullopt;
  auto o = g->second.outputs.find(va);
  if (o == g->second.outputs.end()) return std::nullopt;
  return std::pair{w->second, o->second};
}

std::optional<DevPtr> GraphMemoryModel::drop_graph(uint64_t graph_id) {
  const DevPtr w = graphs_.at(graph_id).window;
  graphs_.erase(graph_id);
  if (w == 0) return std::nullopt;  // no allocation: no window kept
  window_owner_.erase(w);
  windows_.erase(w);
  return w;
}

bool GraphMemoryModel::is_graph_alloc(DevPtr va) const {
  return output_at(va).has_value();
}

Result<std::optional<DevPtr>> GraphMemoryModel::free_outside(DevPtr va) {
  const auto at = output_at(va);
  if (!at) return make_error(ErrorCode::kInvalidArgument, "not a graph allocation");
  Graph& g = graphs_.at(at->first);
  Alloc& a = g.allocs[at->second];
  if (!a.live_outside)
    return make_error(ErrorCode::kInvalidState,
                      "free of a graph allocation that is not live (never launched or freed)");
  a.live_outside = false;
  live_outputs_ -= a.pages;
  if (!g.destroyed || live_bytes_of(g) > 0) return std::optional<DevPtr>();
  return drop_graph(at->first);
}

Result<std::optional<DevPtr>> GraphMemoryModel::destroy(uint64_t graph_id) {
  auto it = graphs_.find(graph_id);
  if (it == graphs_.end() || it->second.destroyed)
    return make_error(ErrorCode::kInvalidArgument, "destroy of an unknown or destroyed graph");
  Graph& g = it->second;
  g.destroyed = true;
  for (auto& [stream, ids] : running_) ids.erase(graph_id);
  // A live output outlives its graph (the guide: destruction frees nothing that is live); the
  // window goes with the last of them.
  if (live_bytes_of(g) > 0) return std::optional<DevPtr>();
  return drop_graph(graph_id);
}

void GraphMemoryModel::trim() {
  reserved_ = live_outputs_;
  for (auto& [id, g] : graphs_) g.mapped = live_bytes_of(g) > 0;
}

}  // namespace memsim
