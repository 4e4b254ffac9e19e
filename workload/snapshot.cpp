// Snapshot reader and writer: PickleDoc <-> Snapshot, with errors that name the field path.
//
// Field names follow torch/csrc/cuda/Module.cpp (memorySnapshot) as PyTorch 2.x writes them;
// keys added in later versions (is_expandable, segment_pool_id, allocator_settings, block
// address) are optional so that older snapshots still read.
#include "workload/snapshot.h"

#include <bit>
#include <filesystem>
#include <fstream>
#include <new>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "core/host_memory.h"
#include "workload/input_file.h"
#include "workload/pickle.h"

namespace memsim {

const char* to_string(TraceAction a) {
  switch (a) {
    case TraceAction::kAlloc:
      return "alloc";
    case TraceAction::kFreeRequested:
      return "free_requested";
    case TraceAction::kFreeCompleted:
      return "free_completed";
    case TraceAction::kSegmentAlloc:
      return "segment_alloc";
    case TraceAction::kSegmentFree:
      return "segment_free";
    case TraceAction::kSegmentMap:
      return "segment_map";
    case TraceAction::kSegmentUnmap:
      return "segment_unmap";
    case TraceAction::kSnapshot:
      return "snapshot";
    case TraceAction::kOom:
      return "oom";
  }
  return "?";
}

namespace {

using T = PickleDoc::Type;
using Ref = PickleDoc::Ref;

// Thrown inside the reader only and turned into an Error at its boundary.
struct FieldError {
  std::string message;
};

class Walker {
 public:
  explicit Walker(const PickleDoc& doc) : doc_(doc) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw FieldError{path.empty() ? what : path + ": " + what};
  }
  const PickleDoc::Node& expect(Ref r, T type, const std::string& path) const {
    const auto& n = doc_.node(r);
    if (n.type != type && !(type == T::kList && n.type == T::kTuple))
      fail(path, fmt::format("expected a {}, found a {}", PickleDoc::type_name(type),
                             PickleDoc::type_name(n.type)));
    return n;
  }
  std::optional<Ref> opt(Ref dict, std::string_view key) const { return doc_.get(dict, key); }
  Ref req(Ref dict, std::string_view key, const std::string& path) const {
    auto r = doc_.get(dict, key);
    if (!r) fail(path, fmt::format("key '{}' missing", key));
    return *r;
  }
  int64_t int_of(Ref r, const std::string& path) const {
    const auto& n = doc_.node(r);
    if (n.type == T::kBool || n.type == T::kInt) return n.i;
    fail(path, fmt::format("expected an int, found a {}", PickleDoc::type_name(n.type)));
  }
  uint64_t uint_of(Ref r, const std::string& path) const {
    const int64_t v = int_of(r, path);
    if (v < 0) fail(path, fmt::format("must not be negative (is {})", v));
    return static_cast<uint64_t>(v);
  }
  uint64_t req_uint(Ref dict, std::string_view key, const std::string& path) const {
    return uint_of(req(dict, key, path), path + "." + std::string(key));
  }
  std::string str_of(Ref r, const std::string& path) const { return expect(r, T::kStr, path).s; }
  bool bool_of(Ref r, const std::string& path) const {
    const auto& n = doc_.node(r);
    if (n.type == T::kBool || n.type == T::kInt) return n.i != 0;
    fail(path, fmt::format("expected a bool, found a {}", PickleDoc::type_name(n.type)));
  }
  double num_of(Ref r, const std::string& path) const {
    const auto& n = doc_.node(r);
    if (n.type == T::kFloat) return n.f;
    return static_cast<double>(int_of(r, path));
  }
  const std::vector<Ref>& list_of(Ref r, const std::string& path) const {
    return expect(r, T::kList, path).items;
  }
  std::vector<SnapshotFrame> frames(Ref dict, const std::string& path) const {
    std::vector<SnapshotFrame> out;
    auto f = opt(dict, "frames");
    if (!f) return out;
    const std::string fp = path + ".frames";
    const auto& items = list_of(*f, fp);
    for (size_t k = 0; k < items.size(); ++k) {
      const std::string p = fmt::format("{}[{}]", fp, k);
      expect(items[k], T::kDict, p);
      SnapshotFrame fr;
      if (auto v = opt(items[k], "name")) fr.name = str_of(*v, p + ".name");
      if (auto v = opt(items[k], "filename")) fr.filename = str_of(*v, p + ".filename");
      if (auto v = opt(items[k], "line")) fr.line = int_of(*v, p + ".line");
      out.push_back(std::move(fr));
    }
    return out;
  }

  Snapshot read() const;

 private:
  SnapshotSettings settings(Ref r) const;
  SnapshotSegment segment(Ref r, const std::string& path) const;
  TraceEntry entry(Ref r, const std::string& path) const;

  const PickleDoc& doc_;
};

SnapshotSettings Walker::settings(Ref r) const {
  const std::string path = "allocator_settings";
  expect(r, T::kDict, path);
  SnapshotSettings s;
  s.present = true;
  if (auto v = opt(r, "PYTORCH_CUDA_ALLOC_CONF")) {
    if (doc_.node(*v).type == T::kStr) s.conf = doc_.node(*v).s;
  }
  if (auto v = opt(r, "max_split_size")) {
    const int64_t m = int_of(*v, path + ".max_split_size");
    s.max_split_size = m < 0 ? UINT64_MAX : static_cast<uint64_t>(m);
  }
  if (auto v = opt(r, "garbage_collection_threshold"))
    s.garbage_collection_threshold = num_of(*v, path + ".garbage_collection_threshold");
  if (auto v = opt(r, "expandable_segments"))
    s.expandable_segments = bool_of(*v, path + ".expandable_segments");
  if (auto v = opt(r, "roundup_power2_divisions")) {
    const std::string rp = path + ".roundup_power2_divisions";
    const auto& d = expect(*v, T::kDict, rp);
    for (size_t k = 0; k + 1 < d.items.size(); k += 2) {
      const std::string key = str_of(d.items[k], rp);  // "1", "2", ..., "32768" (MiB)
      uint64_t mib = 0;
      for (char c : key) {
        if (c < '0' || c > '9' || mib > (1u << 20)) fail(rp, "key '" + key + "' is not a size");
        mib = mib * 10 + static_cast<uint64_t>(c - '0');
      }
      if (mib == 0 || (mib & (mib - 1)) != 0) fail(rp, "key '" + key + "' is not a power of two");
      const int slot = std::countr_zero(mib);
      if (slot >= 16) fail(rp, "key '" + key + "' is above 32768 MiB");
      s.roundup_power2_divisions[static_cast<size_t>(slot)] =
          static_cast<uint32_t>(uint_of(d.items[k + 1], rp + "." + key));
    }
  }
  return s;
}

SnapshotSegment Walker::segment(Ref r, const std::string& path) const {
  expect(r, T::kDict, path);
  SnapshotSegment seg;
  if (auto v = opt(r, "device")) seg.device = int_of(*v, path + ".device");
  seg.address = req_uint(r, "address", path);
  seg.total_size = req_uint(r, "total_size", path);
  seg.stream = req_uint(r, "stream", path);
  const std::string type = str_of(req(r, "segment_type", path), path + ".segment_type");
  if (type != "small" && type != "large")
    fail(path + ".segment_type", "'" + type + "' is neither 'small' nor 'large'");
  seg.small = type == "small";
  if (auto v = opt(r, "is_expandable")) seg.expandable = bool_of(*v, path + ".is_expandable");
  if (auto v = opt(r, "segment_pool_id")) {
    const auto& items = list_of(*v, path + ".segment_pool_id");
    if (items.size() != 2) fail(path + ".segment_pool_id", "expected 2 ints");
    seg.pool_id[0] = int_of(items[0], path + ".segment_pool_id[0]");
    seg.pool_id[1] = int_of(items[1], path + ".segment_pool_id[1]");
  }
  const std::string bp = path + ".blocks";
  const auto& blocks = list_of(req(r, "blocks", path), bp);
  uint64_t cursor = seg.address;
  for (size_t k = 0; k < blocks.size(); ++k) {
    const std::string p = fmt::format("{}[{}]", bp, k);
    expect(blocks[k], T::kDict, p);
    SnapshotBlock b;
    b.size = req_uint(blocks[k], "size", p);
    b.address = cursor;  // older snapshots give no address: blocks tile the segment in order
    if (auto v = opt(blocks[k], "address")) b.address = uint_of(*v, p + ".address");
    b.requested_size = b.size;
    if (auto v = opt(blocks[k], "requested_size"))
      b.requested_size = uint_of(*v, p + ".requested_size");
    const std::string st = str_of(req(blocks[k], "state", p), p + ".state");
    if (st == "active_allocated") {
      b.state = SnapshotBlock::State::kActiveAllocated;
    } else if (st == "active_pending_free") {
      b.state = SnapshotBlock::State::kActivePendingFree;
    } else if (st == "inactive") {
      b.state = SnapshotBlock::State::kInactive;
    } else {
      fail(p + ".state", "'" + st + "' is not active_allocated, active_pending_free or inactive");
    }
    if (b.address < seg.address || b.address - seg.address > seg.total_size ||
        b.size > seg.total_size - (b.address - seg.address))
      fail(p, "block lies outside its segment");
    cursor = b.address + b.size;
    b.frames = frames(blocks[k], p);
    seg.blocks.push_back(std::move(b));
  }
  return seg;
}

TraceEntry Walker::entry(Ref r, const std::string& path) const {
  expect(r, T::kDict, path);
  TraceEntry e;
  const std::string a = str_of(req(r, "action", path), path + ".action");
  static constexpr TraceAction kAll[] = {
      TraceAction::kAlloc,        TraceAction::kFreeRequested, TraceAction::kFreeCompleted,
      TraceAction::kSegmentAlloc, TraceAction::kSegmentFree,   TraceAction::kSegmentMap,
      TraceAction::kSegmentUnmap, TraceAction::kSnapshot,      TraceAction::kOom};
  bool known = false;
  for (TraceAction t : kAll) {
    if (a == to_string(t)) {
      e.action = t;
      known = true;
    }
  }
  if (!known) fail(path + ".action", "unknown action '" + a + "'");
  e.addr = req_uint(r, e.action == TraceAction::kOom ? "device_free" : "addr", path);
  e.size = req_uint(r, "size", path);
  if (auto v = opt(r, "stream")) e.stream = uint_of(*v, path + ".stream");
  if (auto v = opt(r, "time_us")) e.time_us = int_of(*v, path + ".time_us");
  e.frames = frames(r, path);
  return e;
}

Snapshot Walker::read() const {
  const Ref root = doc_.root();
  if (doc_.node(root).type != T::kDict)
    fail("", fmt::format("a pickle of a {}, not a memory snapshot (a dict with 'segments' and "
                         "'device_traces')",
                         PickleDoc::type_name(doc_.node(root).type)));
  if (!opt(root, "segments") || !opt(root, "device_traces"))
    fail("",
         "a pickled dict without 'segments' and 'device_traces': not a memory snapshot "
         "(record one with torch.cuda.memory._record_memory_history(), then "
         "torch.cuda.memory._dump_snapshot(path))");
  Snapshot s;
  const auto& segs = list_of(*opt(root, "segments"), "segments");
  for (size_t k = 0; k < segs.size(); ++k)
    s.segments.push_back(segment(segs[k], fmt::format("segments[{}]", k)));
  const auto& devs = list_of(*opt(root, "device_traces"), "device_traces");
  for (size_t d = 0; d < devs.size(); ++d) {
    const std::string dp = fmt::format("device_traces[{}]", d);
    const auto& entries = list_of(devs[d], dp);
    std::vector<TraceEntry> trace;
    trace.reserve(entries.size());
    for (size_t k = 0; k < entries.size(); ++k)
      trace.push_back(entry(entries[k], fmt::format("{}[{}]", dp, k)));
    s.device_traces.push_back(std::move(trace));
  }
  if (auto v = opt(root, "allocator_settings")) s.settings = settings(*v);
  return s;
}

// Writer helpers.
class Builder {
 public:
  Ref str(std::string s) { return doc.add_str(std::move(s)); }
  Ref integer(int64_t v) { return doc.add_int(v); }
  Ref dict() { return doc.add_list(T::kDict); }
  Ref list() { return doc.add_list(T::kList); }
  void set(Ref d, const char* key, Ref v) { doc.set(d, str(key), v); }
  Ref frames(const std::vector<SnapshotFrame>& fs) {
    const Ref l = list();
    for (const auto& f : fs) {
      const Ref d = dict();
      set(d, "name", str(f.name));
      set(d, "filename", str(f.filename));
      set(d, "line", integer(f.line));
      doc.append(l, d);
    }
    return l;
  }
  PickleDoc doc;
};

const char* state_name(SnapshotBlock::State s) {
  switch (s) {
    case SnapshotBlock::State::kActiveAllocated:
      return "active_allocated";
    case SnapshotBlock::State::kActivePendingFree:
      return "active_pending_free";
    case SnapshotBlock::State::kInactive:
      return "inactive";
  }
  return "inactive";
}

int64_t as_int(uint64_t v) {
  return static_cast<int64_t>(v);  // addresses and sizes are below 2^63
}

}  // namespace

Result<Snapshot> parse_snapshot(std::string_view bytes, const std::string& origin) {
  Result<PickleDoc> doc = PickleDoc::parse(bytes);
  if (!doc.ok())
    return make_error(ErrorCode::kInvalidArgument, origin + ": " + doc.error().message);
  try {
    return Walker(*doc).read();
  } catch (const FieldError& e) {
    return make_error(ErrorCode::kInvalidArgument, origin + ": " + e.message);
  }
}

Result<Snapshot> read_snapshot_file(const std::string& path) {
  if (std::string e = special_file_error(path); !e.empty())
    return make_error(ErrorCode::kInvalidArgument, e);
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kInvalidArgument, path + ": cannot open the file");
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  const std::string what = fmt::format("the snapshot {} ({})", path, format_host_bytes(size));
  require_host_memory(size * kSnapshotBytesPerFileByte, "reading " + what);
  try {
    std::string bytes(size, '\0');
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    bytes.resize(static_cast<size_t>(in.gcount()));  // it may have shrunk meanwhile
    return parse_snapshot(bytes, path);
  } catch (const std::bad_alloc&) {
    throw HostMemoryError(fmt::format("memsim: out of host memory while reading {}", what));
  }
}

Result<std::string> serialize_snapshot(const Snapshot& s) {
  Builder b;
  const Ref root = b.dict();
  const Ref segs = b.list();
  for (const auto& seg : s.segments) {
    const Ref d = b.dict();
    uint64_t allocated = 0, active = 0, requested = 0;
    const Ref blocks = b.list();
    for (const auto& blk : seg.blocks) {
      const bool live = blk.state != SnapshotBlock::State::kInactive;
      if (blk.state == SnapshotBlock::State::kActiveAllocated) allocated += blk.size;
      if (live) {
        active += blk.size;
        requested += blk.requested_size;
      }
      const Ref bd = b.dict();
      b.set(bd, "address", b.integer(as_int(blk.address)));
      b.set(bd, "size", b.integer(as_int(blk.size)));
      b.set(bd, "requested_size", b.integer(as_int(blk.requested_size)));
      b.set(bd, "state", b.str(state_name(blk.state)));
      b.set(bd, "frames", b.frames(blk.frames));
      b.doc.append(blocks, bd);
    }
    b.set(d, "device", b.integer(seg.device));
    b.set(d, "address", b.integer(as_int(seg.address)));
    b.set(d, "total_size", b.integer(as_int(seg.total_size)));
    b.set(d, "allocated_size", b.integer(as_int(allocated)));
    b.set(d, "active_size", b.integer(as_int(active)));
    b.set(d, "requested_size", b.integer(as_int(requested)));
    b.set(d, "stream", b.integer(as_int(seg.stream)));
    b.set(d, "segment_type", b.str(seg.small ? "small" : "large"));
    const Ref pool = b.doc.add_list(T::kTuple);
    b.doc.append(pool, b.integer(seg.pool_id[0]));
    b.doc.append(pool, b.integer(seg.pool_id[1]));
    b.set(d, "segment_pool_id", pool);
    b.set(d, "is_expandable", b.doc.add_bool(seg.expandable));
    b.set(d, "frames", b.list());
    b.set(d, "blocks", blocks);
    b.doc.append(segs, d);
  }
  b.set(root, "segments", segs);
  const Ref traces = b.list();
  for (const auto& trace : s.device_traces) {
    const Ref l = b.list();
    for (const auto& e : trace) {
      const Ref d = b.dict();
      b.set(d, "action", b.str(to_string(e.action)));
      b.set(d, e.action == TraceAction::kOom ? "device_free" : "addr", b.integer(as_int(e.addr)));
      b.set(d, "size", b.integer(as_int(e.size)));
      b.set(d, "stream", b.integer(as_int(e.stream)));
      b.set(d, "time_us", b.integer(e.time_us));
      b.set(d, "frames", b.frames(e.frames));
      b.doc.append(l, d);
    }
    b.doc.append(traces, l);
  }
  b.set(root, "device_traces", traces);
  if (s.settings.present) {
    const auto& st = s.settings;
    const Ref d = b.dict();
    b.set(d, "PYTORCH_CUDA_ALLOC_CONF", b.str(st.conf));
    b.set(d, "max_split_size",
          b.integer(st.max_split_size == UINT64_MAX ? -1 : as_int(st.max_split_size)));
    b.set(d, "garbage_collection_threshold", b.doc.add_float(st.garbage_collection_threshold));
    b.set(d, "expandable_segments", b.doc.add_bool(st.expandable_segments));
    const Ref rd = b.dict();
    for (size_t k = 0; k < st.roundup_power2_divisions.size(); ++k)
      b.set(rd, std::to_string(1u << k).c_str(), b.integer(st.roundup_power2_divisions[k]));
    b.set(d, "roundup_power2_divisions", rd);
    b.set(root, "allocator_settings", d);
  }
  b.doc.set_root(root);
  return b.doc.serialize();
}

}  // namespace memsim
