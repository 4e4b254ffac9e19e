// SimBackend: exact byte accounting of every Backend primitive, time from the GPU cost model,
// and fault injection; no GPU needed.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "backends/sim/cost_model.h"
#include "backends/sim/graph_memory_model.h"
#include "backends/sim/page_set.h"
#include "backends/sim/va_space.h"
#include "core/clock.h"
#include "core/metrics.h"

namespace memsim {

// Makes calls call .. call+repeat-1 (1-based) of `primitive` fail with kOutOfMemory.
struct FaultInjection {
  Primitive primitive = Primitive::kCreatePhysical;
  uint64_t call = 0;
  uint64_t repeat = 1;
};

class SimBackend final : public Backend {
 public:
  // `metrics` may be null; when set, the backend records gauges physical_bytes, virtual_reserved,
  // virtual_mapped, graph_mem_reserved and tag.<tag> on every change.
  SimBackend(GpuSpec gpu, SimClock& clock, MetricsRecorder* metrics = nullptr,
             std::vector<FaultInjection> faults = {});
  ~SimBackend() override = default;

  std::string_view name() const override { return "sim"; }
  uint64_t granularity() const override { return gpu_.granularity; }
  uint64_t capacity() const override { return gpu_.capacity; }
  // Device memory held outside this backend's accounting (the model's weights while graphs are
  // captured): it counts against the capacity, never in usage(). Call before any allocation.
  void hold_elsewhere(uint64_t bytes) { held_elsewhere_ = bytes; }
  Result<PhysHandle> create_physical(uint64_t bytes, std::string_view tag) override;
  Status release_physical(PhysHandle h) override;
  Result<DevPtr> reserve_virtual(uint64_t bytes, uint64_t align) override;
  Status free_virtual(DevPtr va) override;
  Status map(DevPtr va, uint64_t bytes, PhysHandle h, uint64_t offset) override;
  Status unmap(DevPtr va, uint64_t bytes) override;
  Status set_access(DevPtr va, uint64_t bytes) override;
  Result<DevPtr> device_malloc(uint64_t bytes, std::string_view tag) override;
  Status device_free(DevPtr p) override;
  Result<DevPtr> malloc_async(uint64_t bytes, StreamId stream) override;
  Status free_async(DevPtr p, StreamId stream) override;
  Result<DevPtr> host_malloc_pinned(uint64_t bytes) override;
  Status host_free_pinned(DevPtr p) override;
  Result<StreamId> create_stream() override;
  Status fill(DevPtr p, uint64_t bytes, uint32_t pattern, StreamId stream) override;
  Status copy(DevPtr dst, DevPtr src, uint64_t bytes, StreamId stream) override;
  Status stream_wait(StreamId waiter, StreamId on) override;
  Status synchronize() override;
  Status begin_capture(StreamId stream) override;
  Result<GraphHandle> end_capture(StreamId stream, GraphOptions options = {}) override;
  Status launch(GraphHandle g, StreamId stream) override;
  Status upload(GraphHandle g, StreamId stream) override;
  Status destroy_graph(GraphHandle g) override;
  Status graph_mem_trim() override;
  Status add_captured_nodes(StreamId stream, uint64_t nodes) override;
  Usage usage() const override;
  SimTime now() const override { return clock_.now(); }
  SimTime time_in(Primitive p) const override { return time_[static_cast<size_t>(p)]; }
  uint64_t calls_of(Primitive p) const override { return calls_[static_cast<size_t>(p)]; }

  // Translates a device address to (handle, offset) when it lies in a VMM mapping.
  struct Resolved {
    PhysHandle handle;
    uint64_t offset;
  };
  std::optional<Resolved> resolve(DevPtr va) const;
  // Whether [va, va + bytes) lies in one reservation and is mapped throughout. A graph whose
  // captured fills or copies touched a reservation is checked with it at every launch: launching
  // after the memory was unmapped fails with kInvalidState, as the GPU would fault.
  bool range_mapped(DevPtr va, uint64_t bytes) const;
  // Verifies the accounting: counters equal sums over records, mapping counts match.
  bool check_invariants(std::string* why) const;
  // Called after every successful copy outside a capture, with its (dst, src, bytes): tools that
  // shadow memory contents (KvContentShadow) mirror the copies strategies make. Not a Backend
  // primitive: strategies do not know about it.
  using CopyObserver = std::function<void(DevPtr dst, DevPtr src, uint64_t bytes)>;
  void set_copy_observer(CopyObserver observer) { copy_observer_ = std::move(observer); }
  const GpuSpec& gpu() const { return gpu_; }
  // Nodes of the graph `stream` is capturing so far (0 when it is not capturing).
  uint64_t nodes_in_capture(StreamId stream) const { return graph_mem_.nodes_in_capture(stream); }
  // The stream whose capture `stream` belongs to (itself unless forked into another's), or
  // nullopt when it is not capturing.
  std::optional<StreamId> capture_origin(StreamId stream) const {
    if (!graph_mem_.capturing(stream)) return std::nullopt;
    return graph_mem_.origin_of(stream);
  }

  // The last primitive call entered and what its price depends on (for per-call samples of the
  // CUDA backend, which fits the cost model in context): nodes of the graph for end_capture and
  // launch.
  struct CallFeatures {
    Primitive p = Primitive::kCount;
    uint64_t handles = 0, bytes = 0, nodes = 0;
    uint64_t mappings = 0;  // VA mappings live when the call was made
    bool priced = true;     // false: made while its stream captured (a node, priced at end_capture)
    bool first_after_launch = false;  // the first priced call of `p` since the last launch
  };
  const CallFeatures& last_call() const { return last_call_; }

 private:
  struct HandleRec {
    uint64_t bytes;
    std::string tag;
    uint32_t mappings = 0;
    bool released = false;  // cuMemRelease called while still mapped: freed at last unmap
  };
  struct MapRec {
    uint64_t bytes;
    uint64_t handle;
    uint64_t handle_offset;
  };
  struct Reservation {
    uint64_t size;
    std::map<uint64_t, MapRec> maps;  // offset in reservation -> mapping
  };
  enum class PlainKind : uint8_t { kDevice, kAsync, kPinned };
  struct PlainAlloc {
    uint64_t accounted;  // physical (or pinned host) bytes charged
    std::string tag;
    PlainKind kind;
    uint64_t va_bytes = 0;  // address space it spans (device allocations)
    PageSet touched;        // unified memory: pages written so far (accounted = pages x page)
  };

  // Counts the call, charges its cost, and returns an injected fault if one is due.
  // A call made while its stream captures is only recorded: its cost is the captured node's,
  // charged per node at end_capture (pass charge = false).
  Status enter(Primitive p, uint64_t handles, uint64_t bytes, bool charge = true);
  Status charge_physical(uint64_t bytes, std::string_view what);
  void add_tag(std::string_view tag, int64_t delta);
  void drop_handle(uint64_t id);
  Reservation* find_reservation(DevPtr va, uint64_t bytes, uint64_t* offset);
  const Reservation* find_reservation(DevPtr va, uint64_t bytes, uint64_t* offset) const;
  void publish();
  void note_captured_range(StreamId stream, DevPtr p, uint64_t bytes);
  // launch and upload: plan, check, charge and commit (upload_only: cudaGraphUpload).
  Status run_graph(GraphHandle g, StreamId stream, bool upload_only);
  void release_graph_window(DevPtr window);
  // Unified memory: a fill or copy writes [p, p + bytes); the pages of a device_malloc
  // allocation it touches for the first time become physical (kOutOfMemory when DRAM is full).
  Status touch(DevPtr p, uint64_t bytes, std::string_view what);
  // Bytes of the shared capacity taken besides device memory (unified memory: OS and pinned).
  uint64_t host_side_bytes() const;

  GpuSpec gpu_;
  CallFeatures last_call_;
  SimClock& clock_;
  MetricsRecorder* metrics_;
  std::vector<FaultInjection> faults_;
  VaSpace va_;
  VaSpace host_va_;
  GraphMemoryModel graph_mem_;

  std::unordered_map<uint64_t, HandleRec> handles_;
  std::map<DevPtr, Reservation> reservations_;
  std::unordered_map<DevPtr, PlainAlloc> plain_;
  std::map<DevPtr, uint64_t> pinned_ranges_;  // pinned host allocations: start -> bytes
  struct TagGauge {
    uint64_t bytes = 0;
    MetricsRecorder::SeriesId series = 0;
  };
  std::map<std::string, TagGauge, std::less<>> per_tag_;
  // Gauge ids, interned once (metrics_ may be null).
  MetricsRecorder::SeriesId g_physical_ = 0, g_reserved_ = 0, g_mapped_ = 0, g_graph_mem_ = 0;
  uint64_t next_handle_ = 1;
  uint32_t next_stream_ = 1;
  uint64_t physical_ = 0;        // handles + device/async plain allocations (not graph memory)
  uint64_t held_elsewhere_ = 0;  // see hold_elsewhere
  uint64_t virtual_reserved_ = 0;
  uint64_t virtual_mapped_ = 0;
  uint64_t mappings_ = 0;                // live (map calls not yet unmapped)
  FirstAfterLaunch first_after_launch_;  // priced calls only
  uint64_t pinned_ = 0;
  uint64_t untouched_ = 0;              // unified memory: see Usage::untouched_bytes
  std::map<DevPtr, uint64_t> unified_;  // unified memory: device allocations, base -> VA bytes
  std::array<SimTime, static_cast<size_t>(Primitive::kCount)> time_{};
  std::array<uint64_t, static_cast<size_t>(Primitive::kCount)> calls_{};
  CopyObserver copy_observer_;
  // VMM ranges touched by nodes of the capture in progress (per stream) and of each graph.
  std::unordered_map<uint32_t, std::vector<std::pair<DevPtr, uint64_t>>> capture_ranges_;
  std::unordered_map<uint64_t, std::vector<std::pair<DevPtr, uint64_t>>> graph_ranges_;
};

}  // namespace memsim
