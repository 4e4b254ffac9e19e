// SimBackend implementation: exact accounting of handles, reservations, mappings, plain and
// stream-ordered allocations and graph memory; time charged from the GPU cost model.
#include "backends/sim/sim_backend.h"

#include <fmt/format.h>
#include <algorithm>
#include <cmath>

namespace memsim {
namespace {

constexpr uint64_t kDeviceVaBase = 0x7f0000000000ull >> 4;  // 0x7f000000000
constexpr uint64_t kHostVaBase = 0x100000000ull;
constexpr uint64_t kHostVaSize = 1ull << 44;

uint64_t round_up(uint64_t v, uint64_t m) {
  return (v + m - 1) / m * m;
}

std::string mib(uint64_t bytes) {
  return fmt::format("{:.1f} MiB", bytes / 1048576.0);
}

}  // namespace

SimBackend::SimBackend(GpuSpec gpu, SimClock& clock, MetricsRecorder* metrics,
                       std::vector<FaultInjection> faults)
    : gpu_(std::move(gpu)),
      clock_(clock),
      metrics_(metrics),
      faults_(std::move(faults)),
      va_(kDeviceVaBase, gpu_.va_space),
      host_va_(kHostVaBase, kHostVaSize),
      graph_mem_(gpu_.granularity, gpu_.graph_mem_chunk) {
  if (metrics_) {
    g_physical_ = metrics_->series("physical_bytes");
    g_reserved_ = metrics_->series("virtual_reserved");
    g_mapped_ = metrics_->series("virtual_mapped");
    g_graph_mem_ = metrics_->series("graph_mem_reserved");
  }
}

Status SimBackend::enter(Primitive p, uint64_t handles, uint64_t bytes, bool charge) {
  const auto i = static_cast<size_t>(p);
  const uint64_t call = ++calls_[i];
  // The first priced call of `p` since the last launch runs the driver's path cold.
  const bool first = charge && first_after_launch_.note(p);
  last_call_ = {p, handles, bytes, 0, mappings_, charge, first};
  const SimTime cost = charge ? gpu_.price(p, handles, bytes, mappings_, first) : 0;
  time_[i] += cost;
  clock_.advance(cost);
  for (const FaultInjection& f : faults_) {
    if (f.primitive == p && call >= f.call && call - f.call < f.repeat)
      return make_error(ErrorCode::kOutOfMemory,
                        fmt::format("{}: injected fault at call {}", to_string(p), call), bytes);
  }
  return {};
}

uint64_t SimBackend::host_side_bytes() const {
  return gpu_.unified.enabled ? gpu_.unified.host_reserved + pinned_ : 0;
}

Status SimBackend::charge_physical(uint64_t bytes, std::string_view what) {
  const uint64_t in_use =
      physical_ + graph_mem_.reserved() + held_elsewhere_ + host_side_bytes() + gpu_.context;
  if (bytes > gpu_.capacity || in_use > gpu_.capacity - bytes) {
    const uint64_t short_by = in_use + bytes - gpu_.capacity;
    const std::string context =
        gpu_.context > 0 ? fmt::format(", the CUDA context's {} included", mib(gpu_.context)) : "";
    return make_error(
        ErrorCode::kOutOfMemory,
        fmt::format("{}: {} requested, {} of {} in use{} ({} short)", what, mib(bytes), mib(in_use),
                    mib(gpu_.capacity), context, mib(short_by)),
        short_by);
  }
  return {};
}

void SimBackend::add_tag(std::string_view tag, int64_t delta) {
  auto it = per_tag_.find(tag);
  if (it == per_tag_.end()) {
    TagGauge g;
    if (metrics_) g.series = metrics_->series(fmt::format("tag.{}", tag));
    it = per_tag_.emplace(std::string(tag), g).first;
  }
  TagGauge& g = it->second;
  g.bytes = static_cast<uint64_t>(static_cast<int64_t>(g.bytes) + delta);
  if (metrics_) metrics_->set(g.series, static_cast<double>(g.bytes));
}

void SimBackend::publish() {
  if (!metrics_) return;
  metrics_->set(g_physical_, static_cast<double>(physical_ + graph_mem_.reserved()));
  metrics_->set(g_reserved_, static_cast<double>(virtual_reserved_));
  metrics_->set(g_mapped_, static_cast<double>(virtual_mapped_));
  metrics_->set(g_graph_mem_, static_cast<double>(graph_mem_.reserved()));
}

// ---- physical -------------------------------------------------------------------------------

Result<PhysHandle> SimBackend::create_physical(uint64_t bytes, std::string_view tag) {
  MEMSIM_TRY(enter(Primitive::kCreatePhysical, 1, bytes));
  if (bytes == 0 || bytes % gpu_.granularity != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("create_physical: {} bytes is not a non-zero multiple of the "
                                  "granularity ({} bytes)",
                                  bytes, gpu_.granularity));
  MEMSIM_TRY(charge_physical(bytes, "create_physical"));
  const uint64_t id = next_handle_++;
  handles_.emplace(id, HandleRec{bytes, std::string(tag)});
  physical_ += bytes;
  add_tag(tag, static_cast<int64_t>(bytes));
  publish();
  return PhysHandle{id};
}

void SimBackend::drop_handle(uint64_t id) {
  auto it = handles_.find(id);
  physical_ -= it->second.bytes;
  add_tag(it->second.tag, -static_cast<int64_t>(it->second.bytes));
  handles_.erase(it);
}

Status SimBackend::release_physical(PhysHandle h) {
  auto it = handles_.find(h.id);
  MEMSIM_TRY(enter(Primitive::kReleasePhysical, 1, it == handles_.end() ? 0 : it->second.bytes));
  if (it == handles_.end() || it->second.released)
    return make_error(
        ErrorCode::kInvalidState,
        fmt::format("release_physical: handle {} is not live (double release?)", h.id));
  // Like cuMemRelease: a handle still mapped is freed when its last mapping is unmapped.
  if (it->second.mappings > 0) {
    it->second.released = true;
    return {};
  }
  drop_handle(h.id);
  publish();
  return {};
}

// ---- virtual --------------------------------------------------------------------------------

Result<DevPtr> SimBackend::reserve_virtual(uint64_t bytes, uint64_t align) {
  MEMSIM_TRY(enter(Primitive::kReserveVirtual, 0, 0));
  if (bytes == 0 || bytes % gpu_.granularity != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("reserve_virtual: {} bytes is not a non-zero multiple of the "
                                  "granularity",
                                  bytes));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr va, va_.alloc(bytes, std::max(align, gpu_.granularity)));
  reservations_.emplace(va, Reservation{bytes, {}});
  virtual_reserved_ += bytes;
  publish();
  return va;
}

Status SimBackend::free_virtual(DevPtr va) {
  MEMSIM_TRY(enter(Primitive::kFreeVirtual, 0, 0));
  auto it = reservations_.find(va);
  if (it == reservations_.end())
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("free_virtual: {:#x} is not a reservation", va));
  if (!it->second.maps.empty())
    return make_error(ErrorCode::kInvalidState,
                      fmt::format("free_virtual: reservation {:#x} still has {} mapping(s)", va,
                                  it->second.maps.size()));
  virtual_reserved_ -= it->second.size;
  reservations_.erase(it);
  (void)va_.free(va);
  publish();
  return {};
}

SimBackend::Reservation* SimBackend::find_reservation(DevPtr va, uint64_t bytes, uint64_t* offset) {
  return const_cast<Reservation*>(std::as_const(*this).find_reservation(va, bytes, offset));
}

const SimBackend::Reservation* SimBackend::find_reservation(DevPtr va, uint64_t bytes,
                                                            uint64_t* offset) const {
  auto it = reservations_.upper_bound(va);
  if (it == reservations_.begin()) return nullptr;
  --it;
  const uint64_t off = va - it->first;
  if (off >= it->second.size || bytes > it->second.size - off) return nullptr;
  *offset = va - it->first;
  return &it->second;
}

// ---- mapping --------------------------------------------------------------------------------

Status SimBackend::map(DevPtr va, uint64_t bytes, PhysHandle h, uint64_t offset) {
  MEMSIM_TRY(enter(Primitive::kMap, 1, bytes));
  const uint64_t g = gpu_.granularity;
  if (bytes == 0 || va % g || bytes % g || offset % g)
    return make_error(ErrorCode::kInvalidArgument,
                      "map: address, size and offset must be granularity-aligned and non-zero");
  auto hit = handles_.find(h.id);
  if (hit == handles_.end() || hit->second.released)
    return make_error(ErrorCode::kInvalidArgument, fmt::format("map: unknown handle {}", h.id));
  if (bytes > hit->second.bytes || offset > hit->second.bytes - bytes)
    return make_error(ErrorCode::kInvalidArgument, "map: range exceeds the handle's size");
  uint64_t off = 0;
  Reservation* r = find_reservation(va, bytes, &off);
  if (!r)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("map: {:#x}+{} is not inside one reservation", va, bytes));
  auto next = r->maps.lower_bound(off);
  if (next != r->maps.end() && next->first < off + bytes)
    return make_error(ErrorCode::kInvalidState, "map: range overlaps an existing mapping");
  if (next != r->maps.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.bytes > off)
      return make_error(ErrorCode::kInvalidState, "map: range overlaps an existing mapping");
  }
  // cuMemMap maps a whole handle from offset 0 (the driver answers "operation not supported"
  // otherwise; measured on H200 with driver 580).
  if (offset != 0 || bytes != hit->second.bytes)
    return make_error(ErrorCode::kNotSupported,
                      "map: only whole handles from offset 0 can be mapped (cuMemMap)");
  r->maps.emplace(off, MapRec{bytes, h.id, offset});
  ++mappings_;
  ++hit->second.mappings;
  virtual_mapped_ += bytes;
  publish();
  return {};
}

Status SimBackend::unmap(DevPtr va, uint64_t bytes) {
  const uint64_t g = gpu_.granularity;
  if (bytes == 0 || va % g || bytes % g) {
    MEMSIM_TRY(enter(Primitive::kUnmap, 0, 0));
    return make_error(ErrorCode::kInvalidArgument,
                      "unmap: address and size must be granularity-aligned and non-zero");
  }
  uint64_t off = 0;
  Reservation* r = find_reservation(va, bytes, &off);
  // Count the handles the range touches: unmap is priced per handle (DEVICE.md).
  std::vector<std::map<uint64_t, MapRec>::iterator> victims;
  bool whole = r != nullptr && bytes > 0;
  if (whole) {
    uint64_t cursor = off;
    for (auto it = r->maps.lower_bound(off); it != r->maps.end() && it->first < off + bytes; ++it) {
      if (it->first != cursor || it->first + it->second.bytes > off + bytes) {
        whole = false;
        break;
      }
      cursor += it->second.bytes;
      victims.push_back(it);
    }
    whole = whole && cursor == off + bytes;
  }
  MEMSIM_TRY(enter(Primitive::kUnmap, victims.size(), bytes));
  if (!whole)
    return make_error(
        ErrorCode::kInvalidState,
        fmt::format("unmap: {:#x}+{} is not exactly covered by whole mappings", va, bytes));
  for (auto it : victims) {
    HandleRec& h = handles_.at(it->second.handle);
    --h.mappings;
    virtual_mapped_ -= it->second.bytes;
    const uint64_t id = it->second.handle;
    r->maps.erase(it);
    --mappings_;
    if (h.released && h.mappings == 0) drop_handle(id);
  }
  publish();
  return {};
}

Status SimBackend::set_access(DevPtr va, uint64_t bytes) {
  const uint64_t g = gpu_.granularity;
  if (bytes == 0 || va % g || bytes % g) {
    MEMSIM_TRY(enter(Primitive::kSetAccess, 0, 0));
    return make_error(ErrorCode::kInvalidArgument,
                      "set_access: address and size must be granularity-aligned and non-zero");
  }
  uint64_t off = 0;
  const Reservation* r = find_reservation(va, bytes, &off);
  // The range must be mapped without holes; it may start or end inside a mapping. Priced per
  // handle touched (DEVICE.md).
  uint64_t handles = 0;
  bool covered = r != nullptr;
  if (covered) {
    auto it = r->maps.upper_bound(off);
    if (it != r->maps.begin() && std::prev(it)->first + std::prev(it)->second.bytes > off) --it;
    uint64_t cursor = off;
    for (; it != r->maps.end() && cursor < off + bytes; ++it) {
      if (it->first > cursor) break;  // a hole
      ++handles;
      cursor = it->first + it->second.bytes;
    }
    covered = cursor >= off + bytes;
  }
  MEMSIM_TRY(enter(Primitive::kSetAccess, handles, bytes));
  if (!covered)
    return make_error(ErrorCode::kInvalidState,
                      fmt::format("set_access: {:#x}+{} is not fully mapped", va, bytes));
  return {};
}

std::optional<SimBackend::Resolved> SimBackend::resolve(DevPtr va) const {
  uint64_t off = 0;
  const Reservation* r = find_reservation(va, 1, &off);
  if (!r) return std::nullopt;
  auto it = r->maps.upper_bound(off);
  if (it == r->maps.begin()) return std::nullopt;
  --it;
  if (off >= it->first + it->second.bytes) return std::nullopt;
  return Resolved{PhysHandle{it->second.handle}, it->second.handle_offset + (off - it->first)};
}

// ---- plain and stream-ordered allocations ---------------------------------------------------

Result<DevPtr> SimBackend::device_malloc(uint64_t bytes, std::string_view tag) {
  if (bytes > gpu_.capacity) {  // (also keeps the rounding below from wrapping)
    MEMSIM_TRY(enter(Primitive::kDeviceMalloc, 1, 0));
    return charge_physical(bytes, "device_malloc").error();
  }
  // cudaMalloc backs allocations with whole pages of the VMM granularity.
  const uint64_t accounted = round_up(bytes, gpu_.granularity);
  MEMSIM_TRY(enter(Primitive::kDeviceMalloc, 1, accounted));
  if (bytes == 0) return make_error(ErrorCode::kInvalidArgument, "device_malloc: 0 bytes");
  if (gpu_.unified.enabled) {
    // Over-commit: address space now, physical pages at first touch (touch()).
    MEMSIM_ASSIGN_OR_RETURN(DevPtr p, va_.alloc(accounted, gpu_.granularity));
    plain_.emplace(p, PlainAlloc{0, std::string(tag), PlainKind::kDevice, accounted, {}});
    unified_.emplace(p, accounted);
    untouched_ += accounted;
    virtual_mapped_ += accounted;
    publish();
    return p;
  }
  MEMSIM_TRY(charge_physical(accounted, "device_malloc"));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr p, va_.alloc(accounted, gpu_.granularity));
  plain_.emplace(p, PlainAlloc{accounted, std::string(tag), PlainKind::kDevice, accounted, {}});
  physical_ += accounted;
  virtual_mapped_ += accounted;
  add_tag(tag, static_cast<int64_t>(accounted));
  publish();
  return p;
}

Status SimBackend::touch(DevPtr p, uint64_t bytes, std::string_view what) {
  auto it = unified_.upper_bound(p);
  if (it == unified_.begin()) return {};
  --it;
  const DevPtr base = it->first;
  if (p - base >= it->second) return {};  // not in a device_malloc allocation
  const uint64_t page = gpu_.unified.first_touch_page;
  const uint64_t end = std::min(p + bytes, base + it->second);
  PlainAlloc& a = plain_.at(base);
  PageSet trial = a.touched;
  const uint64_t fresh = trial.touch((p - base) / page, round_up(end - base, page) / page) * page;
  if (fresh == 0) return {};
  MEMSIM_TRY(charge_physical(fresh, fmt::format("{} (first touch)", what)));
  a.touched = std::move(trial);
  a.accounted += fresh;
  physical_ += fresh;
  untouched_ -= fresh;
  add_tag(a.tag, static_cast<int64_t>(fresh));
  publish();
  return {};
}

Status SimBackend::device_free(DevPtr p) {
  auto it = plain_.find(p);
  MEMSIM_TRY(enter(Primitive::kDeviceFree, 1, it == plain_.end() ? 0 : it->second.accounted));
  if (it == plain_.end() || it->second.kind == PlainKind::kPinned)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("device_free: {:#x} is not a live device allocation", p));
  physical_ -= it->second.accounted;
  virtual_mapped_ -= it->second.va_bytes;
  if (unified_.erase(p) > 0) untouched_ -= it->second.va_bytes - it->second.accounted;
  if (it->second.accounted > 0)
    add_tag(it->second.tag, -static_cast<int64_t>(it->second.accounted));
  (void)va_.free(p);
  plain_.erase(it);
  graph_mem_.synchronize();  // cudaFree waits for the device: no graph runs any more
  publish();
  return {};
}

Result<DevPtr> SimBackend::malloc_async(uint64_t bytes, StreamId stream) {
  if (bytes > gpu_.capacity) {
    MEMSIM_TRY(enter(Primitive::kMallocAsync, 1, 0));
    return charge_physical(bytes, "malloc_async").error();
  }
  const uint64_t pages = round_up(bytes, gpu_.granularity);
  MEMSIM_TRY(enter(Primitive::kMallocAsync, 1, pages, !graph_mem_.capturing(stream)));
  if (bytes == 0) return make_error(ErrorCode::kInvalidArgument, "malloc_async: 0 bytes");
  if (graph_mem_.capturing(stream)) {
    // A graph memory node: an address in the graph's window now, physical memory at launch.
    return graph_mem_.add_alloc(stream, bytes);
  }
  MEMSIM_TRY(charge_physical(pages, "malloc_async"));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr p, va_.alloc(pages, gpu_.granularity));
  plain_.emplace(p, PlainAlloc{pages, "stream_ordered", PlainKind::kAsync, pages, {}});
  physical_ += pages;
  virtual_mapped_ += pages;
  add_tag("stream_ordered", static_cast<int64_t>(pages));
  publish();
  return p;
}

Status SimBackend::free_async(DevPtr p, StreamId stream) {
  MEMSIM_TRY(enter(Primitive::kFreeAsync, 1, 0, !graph_mem_.capturing(stream)));
  if (graph_mem_.capturing(stream)) return graph_mem_.add_free(stream, p);
  if (graph_mem_.is_graph_alloc(p)) {
    MEMSIM_ASSIGN_OR_RETURN(std::optional<DevPtr> release, graph_mem_.free_outside(p));
    if (release) release_graph_window(*release);
    publish();
    return {};
  }
  auto it = plain_.find(p);
  if (it == plain_.end() || it->second.kind != PlainKind::kAsync)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("free_async: {:#x} is not a live stream-ordered allocation", p));
  physical_ -= it->second.accounted;
  virtual_mapped_ -= it->second.accounted;
  add_tag(it->second.tag, -static_cast<int64_t>(it->second.accounted));
  (void)va_.free(p);
  plain_.erase(it);
  publish();
  return {};
}

Result<DevPtr> SimBackend::host_malloc_pinned(uint64_t bytes) {
  MEMSIM_TRY(enter(Primitive::kHostMallocPinned, 1, bytes));
  if (bytes == 0) return make_error(ErrorCode::kInvalidArgument, "host_malloc_pinned: 0 bytes");
  // Unified memory: pinned host memory is the same DRAM the GPU allocates from.
  if (gpu_.unified.enabled) MEMSIM_TRY(charge_physical(bytes, "host_malloc_pinned"));
  MEMSIM_ASSIGN_OR_RETURN(DevPtr p, host_va_.alloc(round_up(bytes, 4096), 4096));
  plain_.emplace(p, PlainAlloc{bytes, "pinned_host", PlainKind::kPinned, 0, {}});
  pinned_ranges_.emplace(p, bytes);
  pinned_ += bytes;
  return p;
}

Status SimBackend::host_free_pinned(DevPtr p) {
  // Unpinning is priced per byte too (cudaFreeHost of a large buffer takes ~0.1 s per GB).
  auto it = plain_.find(p);
  const bool pinned = it != plain_.end() && it->second.kind == PlainKind::kPinned;
  MEMSIM_TRY(enter(Primitive::kHostFreePinned, 1, pinned ? it->second.accounted : 0));
  if (!pinned)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("host_free_pinned: {:#x} is not pinned host memory", p));
  pinned_ -= it->second.accounted;
  (void)host_va_.free(p);
  graph_mem_.synchronize();  // cudaFreeHost waits for the device too
  plain_.erase(it);
  pinned_ranges_.erase(p);
  return {};
}

// ---- streams and work -----------------------------------------------------------------------

Result<StreamId> SimBackend::create_stream() {
  return StreamId{next_stream_++};
}

Status SimBackend::fill(DevPtr p, uint64_t bytes, uint32_t /*pattern*/, StreamId stream) {
  const bool captured = graph_mem_.capturing(stream);
  MEMSIM_TRY(enter(Primitive::kFill, 0, bytes, !captured));
  if (p == 0 || bytes == 0) return make_error(ErrorCode::kInvalidArgument, "fill: empty range");
  if (captured) {
    graph_mem_.add_node(stream);
    note_captured_range(stream, p, bytes);
    return {};
  }
  return gpu_.unified.enabled ? touch(p, bytes, "fill") : Status{};
}

Status SimBackend::copy(DevPtr dst, DevPtr src, uint64_t bytes, StreamId stream) {
  const bool captured = graph_mem_.capturing(stream);
  // A copy to or from (anywhere inside) a pinned host allocation crosses PCIe: priced at
  // compute.pcie_gbps, not at the device copy rate (bytes read + written at HBM speed).
  auto is_host = [&](DevPtr p) {
    auto it = pinned_ranges_.upper_bound(p);
    if (it == pinned_ranges_.begin()) return false;
    --it;
    return p < it->first + it->second;
  };
  const bool pcie = (is_host(dst) || is_host(src)) && gpu_.compute.pcie_bytes_per_s > 0;
  MEMSIM_TRY(enter(Primitive::kCopy, 0, 2 * bytes, !captured && !pcie));
  if (pcie && !captured) {
    const auto cost =
        static_cast<SimTime>(static_cast<double>(bytes) * 1e9 / gpu_.compute.pcie_bytes_per_s);
    time_[static_cast<size_t>(Primitive::kCopy)] += cost;
    clock_.advance(cost);
  }
  if (dst == 0 || src == 0 || bytes == 0)
    return make_error(ErrorCode::kInvalidArgument, "copy: empty range");
  if (captured) {
    graph_mem_.add_node(stream);
    note_captured_range(stream, dst, bytes);
    note_captured_range(stream, src, bytes);
    return {};
  }
  if (gpu_.unified.enabled) MEMSIM_TRY(touch(dst, bytes, "copy"));
  if (copy_observer_) copy_observer_(dst, src, bytes);
  return {};
}

Status SimBackend::stream_wait(StreamId waiter, StreamId on) {
  MEMSIM_TRY(enter(Primitive::kStreamWait, 0, 0));
  return graph_mem_.stream_wait(waiter, on);
}

Status SimBackend::synchronize() {
  MEMSIM_TRY(enter(Primitive::kSynchronize, 0, 0));
  if (graph_mem_.any_capturing())
    return make_error(ErrorCode::kInvalidState, "synchronize during a stream capture");
  graph_mem_.synchronize();
  return {};
}

// ---- graphs ---------------------------------------------------------------------------------

Status SimBackend::begin_capture(StreamId stream) {
  MEMSIM_TRY(enter(Primitive::kBeginCapture, 0, 0));
  if (graph_mem_.capturing(stream))
    return make_error(ErrorCode::kInvalidState,
                      fmt::format("begin_capture: stream {} is already capturing", stream.id));
  // The graph's allocations get addresses in a window as large as the device; end_capture
  // gives back what they did not use.
  const uint64_t window_bytes = round_up(gpu_.capacity, gpu_.granularity);
  MEMSIM_ASSIGN_OR_RETURN(DevPtr window, va_.alloc(window_bytes, gpu_.granularity));
  if (const Status s = graph_mem_.begin(stream, window, window_bytes); !s.ok()) {
    (void)va_.free(window);
    return s;
  }
  capture_ranges_[stream.id].clear();
  return {};
}

void SimBackend::release_graph_window(DevPtr window) {
  virtual_mapped_ -= va_.size_of(window);
  (void)va_.free(window);
}

void SimBackend::note_captured_range(StreamId stream, DevPtr p, uint64_t bytes) {
  uint64_t off = 0;
  if (find_reservation(p, bytes, &off) != nullptr)
    capture_ranges_[graph_mem_.origin_of(stream).id].push_back({p, bytes});
}

bool SimBackend::range_mapped(DevPtr va, uint64_t bytes) const {
  uint64_t off = 0;
  const Reservation* r = find_reservation(va, bytes, &off);
  if (r == nullptr) return false;
  auto it = r->maps.upper_bound(off);
  if (it == r->maps.begin()) return false;
  --it;  // the mapping at or before off
  uint64_t cursor = off;
  for (; it != r->maps.end() && cursor < off + bytes; ++it) {
    if (it->first > cursor || it->first + it->second.bytes <= cursor) return false;
    cursor = it->first + it->second.bytes;
  }
  return cursor >= off + bytes;
}

Status SimBackend::add_captured_nodes(StreamId stream, uint64_t nodes) {
  if (!graph_mem_.capturing(stream))
    return make_error(ErrorCode::kInvalidState,
                      fmt::format("add_captured_nodes: stream {} is not capturing", stream.id));
  graph_mem_.add_node(stream, nodes);
  return {};
}

Result<GraphHandle> SimBackend::end_capture(StreamId stream, GraphOptions options) {
  const uint64_t nodes = graph_mem_.nodes_in_capture(stream);
  MEMSIM_TRY(enter(Primitive::kEndCapture, 0, 0));
  last_call_.nodes = nodes;
  // Capturing a node and instantiating it are charged here, per node.
  const auto extra = static_cast<SimTime>(std::llround(gpu_.end_capture_extra_us(nodes) * 1000.0));
  clock_.advance(extra);
  time_[static_cast<size_t>(Primitive::kEndCapture)] += extra;
  MEMSIM_ASSIGN_OR_RETURN(auto ended, graph_mem_.end(stream, options.auto_free_on_launch));
  if (ended.extent == 0) {
    (void)va_.free(ended.window);
  } else {
    (void)va_.shrink(ended.window, round_up(ended.extent, gpu_.granularity));
    virtual_mapped_ += round_up(ended.extent, gpu_.granularity);
    publish();
  }
  auto ranges = capture_ranges_.find(stream.id);
  if (ranges != capture_ranges_.end()) {
    if (!ranges->second.empty()) graph_ranges_[ended.graph_id] = std::move(ranges->second);
    capture_ranges_.erase(ranges);
  }
  return GraphHandle{ended.graph_id};
}

Status SimBackend::launch(GraphHandle g, StreamId stream) {
  MEMSIM_TRY(enter(Primitive::kLaunch, 0, 0));
  return run_graph(g, stream, false);
}

Status SimBackend::upload(GraphHandle g, StreamId stream) {
  MEMSIM_TRY(enter(Primitive::kUpload, 0, 0));
  return run_graph(g, stream, true);
}

Status SimBackend::run_graph(GraphHandle g, StreamId stream, bool upload_only) {
  const char* what = upload_only ? "upload" : "launch";
  if (graph_mem_.capturing(stream))
    return make_error(ErrorCode::kInvalidState, fmt::format("{} into a capturing stream", what));
  MEMSIM_ASSIGN_OR_RETURN(auto plan, graph_mem_.plan_launch(g.id, stream, upload_only));
  // A node that touches VMM memory no longer mapped would fault on the GPU (an illegal address):
  // the graph is no longer valid to replay.
  if (auto ranges = graph_ranges_.find(g.id); !upload_only && ranges != graph_ranges_.end())
    for (const auto& [va, bytes] : ranges->second)
      if (!range_mapped(va, bytes))
        return make_error(ErrorCode::kInvalidState,
                          fmt::format("launch: graph {} touches {:#x}+{}, which is not mapped "
                                      "(an illegal address on the GPU)",
                                      g.id, va, bytes));
  const uint64_t growth = plan.reserved_after - graph_mem_.reserved();
  if (growth > 0) MEMSIM_TRY(charge_physical(growth, fmt::format("{} (graph memory)", what)));
  const double us = gpu_.launch_extra_us(plan.upload_nodes, plan.map_granules, plan.remap_granules);
  const auto extra = static_cast<SimTime>(std::llround(us * 1000.0));
  // What this call was priced on (calls.csv, the in-context fit): nodes uploaded and
  // graph-memory bytes mapped. Remaps (others hold the graph's pages) are not a feature.
  last_call_.nodes = plan.upload_nodes;
  last_call_.bytes = plan.map_granules * gpu_.granularity;
  clock_.advance(extra);
  time_[static_cast<size_t>(upload_only ? Primitive::kUpload : Primitive::kLaunch)] += extra;
  const uint64_t before = graph_mem_.reserved();
  for (DevPtr window : graph_mem_.commit_launch(g.id, stream, plan)) release_graph_window(window);
  if (graph_mem_.reserved() != before)
    add_tag("graph_mem", static_cast<int64_t>(graph_mem_.reserved() - before));
  publish();
  return {};
}

Status SimBackend::destroy_graph(GraphHandle g) {
  MEMSIM_TRY(enter(Primitive::kDestroyGraph, 0, 0));
  MEMSIM_ASSIGN_OR_RETURN(std::optional<DevPtr> release, graph_mem_.destroy(g.id));
  graph_ranges_.erase(g.id);
  if (release) release_graph_window(*release);
  publish();
  return {};
}

Status SimBackend::graph_mem_trim() {
  MEMSIM_TRY(enter(Primitive::kGraphMemTrim, 0, 0));
  const uint64_t before = graph_mem_.reserved();
  graph_mem_.trim();
  add_tag("graph_mem", -static_cast<int64_t>(before - graph_mem_.reserved()));
  publish();
  return {};
}

// ---- observe --------------------------------------------------------------------------------

Usage SimBackend::usage() const {
  Usage u;
  u.physical_bytes = physical_ + graph_mem_.reserved();
  u.virtual_reserved = virtual_reserved_;
  u.virtual_mapped = virtual_mapped_;
  u.graph_mem_reserved = graph_mem_.reserved();
  u.graph_mem_used = graph_mem_.used();
  u.pinned_host_bytes = pinned_;
  u.untouched_bytes = untouched_;
  for (const auto& [tag, g] : per_tag_)
    if (g.bytes) u.per_tag.emplace(tag, g.bytes);
  return u;
}

bool SimBackend::check_invariants(std::string* why) const {
  auto fail = [&](std::string m) {
    if (why) *why = std::move(m);
    return false;
  };
  uint64_t phys = 0;
  std::unordered_map<uint64_t, uint32_t> maps_per_handle;
  for (const auto& [id, h] : handles_) phys += h.bytes;
  uint64_t mapped = 0, reserved = 0;
  for (const auto& [base, r] : reservations_) {
    reserved += r.size;
    uint64_t end = 0;
    for (const auto& [off, m] : r.maps) {
      if (off < end) return fail("overlapping mappings");
      end = off + m.bytes;
      if (end > r.size) return fail("mapping exceeds its reservation");
      mapped += m.bytes;
      ++maps_per_handle[m.handle];
    }
  }
  for (const auto& [id, h] : handles_)
    if (maps_per_handle[id] != h.mappings) return fail("handle mapping count mismatch");
  uint64_t plain_dev = 0, plain_va = 0, untouched = 0;
  for (const auto& [p, a] : plain_) {
    if (a.kind == PlainKind::kPinned) continue;
    plain_dev += a.accounted;
    plain_va += a.va_bytes;
    if (unified_.count(p) > 0) {
      if (a.accounted != a.touched.pages() * gpu_.unified.first_touch_page)
        return fail("touched pages and accounted bytes disagree");
      untouched += a.va_bytes - a.accounted;
    }
  }
  if (phys + plain_dev != physical_) return fail("physical byte counter mismatch");
  if (untouched != untouched_) return fail("untouched byte counter mismatch");
  if (reserved != virtual_reserved_) return fail("reserved VA counter mismatch");
  uint64_t graph_va = 0;
  for (const auto& [window, bytes] : graph_mem_.windows()) {
    if (va_.size_of(window) != bytes) return fail("graph window VA mismatch");
    graph_va += bytes;
  }
  if (mapped + plain_va + graph_va != virtual_mapped_) return fail("mapped VA counter mismatch");
  if (physical_ + graph_mem_.reserved() + held_elsewhere_ + host_side_bytes() + gpu_.context >
      gpu_.capacity)
    return fail("over capacity");
  return true;
}

}  // namespace memsim
