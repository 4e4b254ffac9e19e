// Tests of the pickle reader/writer, PyTorch snapshot import, and torch_caching replaying real
// snapshots recorded with PyTorch on an H200 (tests/data/snapshots, tools/record_snapshots.py).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "backends/sim/sim_backend.h"
#include "core/clock.h"
#include "src/drivers/trace_recorder.h"
#include "src/drivers/trace_replay.h"
#include "workload/alloc_trace.h"
#include "workload/pickle.h"
#include "workload/snapshot.h"
#include "src/alloc/registry.h"
#include "src/app/allocators_experiment.h"
#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "tests/host_memory_test_util.h"

using namespace memsim;

namespace {

std::string source_root() {
  const char* r = std::getenv("MEMSIM_SOURCE_ROOT");
  return r != nullptr ? r : ".";
}

std::string fixture(const std::string& name) {
  return source_root() + "/tests/data/snapshots/" + name;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One integer field of a fixture's .json sidecar (what PyTorch itself reported).
uint64_t recorded(const std::string& name, const std::string& key) {
  const std::string text = slurp(fixture(name + ".json"));
  std::smatch m;
  const std::regex re("\"" + key + "\": ([0-9]+)");
  REQUIRE(std::regex_search(text, m, re));
  return std::stoull(m[1]);
}

GpuSpec test_gpu() {
  return load_gpu_spec(ConfigNode::load_file(source_root() + "/configs/gpus/h200.yaml"));
}

AllocatorFactory torch_factory_for(const SnapshotSettings& s, uint64_t memory_limit = 0) {
  std::string yaml = torch_caching_yaml(s);
  if (memory_limit != 0)
    yaml.insert(1, "memory_limit: " + std::to_string(memory_limit) + (yaml == "{}" ? "" : ", "));
  const ConfigNode node = ConfigNode::parse(yaml, "test");
  return caching_allocators().find("torch_caching")->parse(node);
}

}  // namespace

TEST_CASE("pickle: plain values round-trip through the writer and the reader", "[pickle]") {
  PickleDoc d;
  const auto root = d.add_list(PickleDoc::Type::kDict);
  const auto list = d.add_list();
  for (int64_t v : {int64_t{0}, int64_t{255}, int64_t{256}, int64_t{65535}, int64_t{65536},
                    int64_t{-1}, int64_t{-129}, int64_t{INT32_MIN}, int64_t{INT32_MAX},
                    int64_t{1} << 40, int64_t{0x7f0000000000}, INT64_MIN, INT64_MAX})
    d.append(list, d.add_int(v));
  d.set(root, d.add_str("ints"), list);
  d.set(root, d.add_str("pi"), d.add_float(3.25));
  d.set(root, d.add_str("t"), d.add_bool(true));
  d.set(root, d.add_str("none"), d.add_none());
  d.set(root, d.add_str(std::string(300, 'x')), d.add_str("long key"));
  const auto tup = d.add_list(PickleDoc::Type::kTuple);
  d.append(tup, d.add_int(0));
  d.append(tup, d.add_int(0));
  d.set(root, d.add_str("pool"), tup);
  d.set_root(root);
  const auto bytes = d.serialize();
  REQUIRE(bytes.ok());
  const auto back = PickleDoc::parse(*bytes);
  REQUIRE(back.ok());
  const auto& r = *back;
  const auto ints = r.node(*r.get(r.root(), "ints")).items;
  REQUIRE(ints.size() == 13);
  CHECK(r.node(ints[5]).i == -1);
  CHECK(r.node(ints[6]).i == -129);
  CHECK(r.node(ints[10]).i == 0x7f0000000000);
  CHECK(r.node(ints[11]).i == INT64_MIN);
  CHECK(r.node(ints[12]).i == INT64_MAX);
  CHECK(r.node(*r.get(r.root(), "pi")).f == 3.25);
  CHECK(r.node(*r.get(r.root(), "t")).i == 1);
  CHECK(r.node(*r.get(r.root(), "none")).type == PickleDoc::Type::kNone);
  CHECK(r.node(*r.get(r.root(), std::string(300, 'x'))).s == "long key");
  CHECK(r.node(*r.get(r.root(), "pool")).type == PickleDoc::Type::kTuple);
  // Writing what was read gives the same bytes.
  CHECK(*r.serialize() == *bytes);
}

TEST_CASE("pickle: code, truncation and other pickles are clear errors", "[pickle]") {
  // pickle.dumps(os.system) at protocol 4 starts with STACK_GLOBAL material; a minimal GLOBAL:
  const std::string global = std::string(
      "\x80\x02"
      "cos\nsystem\nq\x00.",
      15);
  auto r = PickleDoc::parse(global);
  REQUIRE(!r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("GLOBAL") && Catch::Contains("never executes"));
  const std::string reduce = std::string(
      "\x80\x04"
      "N)R.",
      6);
  r = PickleDoc::parse(reduce);
  REQUIRE(!r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("REDUCE"));
  CHECK_THAT(PickleDoc::parse("").error().message, Catch::Contains("empty"));
  CHECK_THAT(PickleDoc::parse("hello").error().message, Catch::Contains("not a binary pickle"));
  CHECK_THAT(PickleDoc::parse(std::string("\x80\x04K", 3)).error().message,
             Catch::Contains("runs past the end"));
  CHECK_THAT(PickleDoc::parse(std::string("\x80\x04K\x01", 4)).error().message,
             Catch::Contains("truncated"));
  CHECK_THAT(PickleDoc::parse(std::string("\x80\x04h\x05.", 5)).error().message,
             Catch::Contains("never stored"));
  CHECK_THAT(PickleDoc::parse(std::string("\x80\x04"
                                          "e.",
                                          4))
                 .error()
                 .message,
             Catch::Contains("no MARK"));
  // Every prefix of a real snapshot is an error, never a crash.
  const std::string snap = slurp(fixture("frames_default.pickle"));
  REQUIRE(snap.size() > 1000);
  for (size_t n = 0; n < snap.size(); n += 7) CHECK(!PickleDoc::parse(snap.substr(0, n)).ok());
  // A pickle that is not a snapshot.
  PickleDoc d;
  d.set_root(d.add_list());
  auto not_snap = parse_snapshot(*d.serialize(), "x.pickle");
  REQUIRE(!not_snap.ok());
  CHECK_THAT(not_snap.error().message, Catch::Contains("x.pickle") && Catch::Contains("list"));
}

TEST_CASE("snapshot: fields of a recorded snapshot, errors name the field", "[snapshot]") {
  auto s = read_snapshot_file(fixture("frames_default.pickle"));
  REQUIRE(s.ok());
  REQUIRE(s->device_traces.size() >= 1);
  const auto& trace = s->device_traces[0];
  REQUIRE(!trace.empty());
  CHECK(trace.front().action == TraceAction::kSegmentAlloc);
  CHECK(!trace.front().frames.empty());  // recorded with context="all"
  CHECK(s->settings.present);
  CHECK(s->settings.max_split_size == UINT64_MAX);
  // Writing the snapshot and reading it back gives the same trace and segments.
  auto bytes = serialize_snapshot(*s);
  REQUIRE(bytes.ok());
  auto back = parse_snapshot(*bytes, "roundtrip");
  REQUIRE(back.ok());
  REQUIRE(back->device_traces[0].size() == trace.size());
  for (size_t k = 0; k < trace.size(); ++k) {
    CHECK(back->device_traces[0][k].action == trace[k].action);
    CHECK(back->device_traces[0][k].addr == trace[k].addr);
    CHECK(back->device_traces[0][k].size == trace[k].size);
    CHECK(back->device_traces[0][k].frames.size() == trace[k].frames.size());
  }
  REQUIRE(back->segments.size() == s->segments.size());
  CHECK(*serialize_snapshot(*back) == *bytes);

  auto missing = read_snapshot_file(fixture("nope.pickle"));
  REQUIRE(!missing.ok());
  CHECK_THAT(missing.error().message, Catch::Contains("cannot open"));
}

TEST_CASE("snapshot: special files are refused before anything is read", "[snapshot]") {
  // /dev/zero and /dev/urandom never end (reading them whole exhausted memory); a FIFO blocks.
  for (const std::string dev : {"/dev/zero", "/dev/urandom"}) {
    auto s = read_snapshot_file(dev);
    REQUIRE(!s.ok());
    CHECK(s.error().message == dev + " is not a regular file (a character device)");
  }
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("memsim_snapshot_fifo_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string fifo = dir + "/snap.pickle";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto f = read_snapshot_file(fifo);
  auto d = read_snapshot_file(dir);
  std::filesystem::remove_all(dir);
  REQUIRE(!f.ok());
  CHECK(f.error().message == fifo + " is not a regular file (a FIFO)");
  REQUIRE(!d.ok());
  CHECK(d.error().message == dir + " is not a regular file (a directory)");
}

TEST_CASE("snapshot: a pickle too large for host memory is refused up front", "[snapshot]") {
  const std::string path = std::filesystem::temp_directory_path() /
                           ("memsim_snapshot_big_" + std::to_string(::getpid()) + ".pickle");
  std::ofstream(path) << "\x80\x04";  // a pickle's start; the rest a hole of zeros
  std::filesystem::resize_file(path, 4ull << 30);
  const std::string said = memsim::test::host_memory_error_in_child(
      256ull << 20, [&] { (void)read_snapshot_file(path); });
  std::filesystem::remove(path);
  CHECK_THAT(said, Catch::StartsWith("memsim: reading the snapshot " + path +
                                     " (4.0 GiB) needs at least 32.0 GiB of host memory, but "
                                     "only "));
}

TEST_CASE("snapshot: torch_caching replays PyTorch's own reserved bytes exactly", "[snapshot]") {
  // Every fixture recorded with settings torch_caching models (default, max_split_size,
  // roundup_power2_divisions): reserved bytes after every op equal what the recording's
  // segment events say, and peak / final reserved equal what PyTorch reported.
  for (const std::string name :
       {"steps_default", "prestate_default", "streams_default", "frames_default", "steps_maxsplit",
        "steps_roundup4", "steps_gc"}) {
    INFO(name);
    // steps_gc ran under set_per_process_memory_fraction: its byte limit is in the sidecar.
    const uint64_t limit = name == "steps_gc" ? recorded(name, "memory_limit") : 0;
    auto s = read_snapshot_file(fixture(name + ".pickle"));
    REQUIRE(s.ok());
    auto t = trace_from_snapshot(*s, 0, name);
    REQUIRE(t.ok());
    CHECK(validate(*t).empty());
    SimClock clock;
    SimBackend backend(test_gpu(), clock);
    auto alloc = torch_factory_for(s->settings, limit)(backend);
    ReplayOptions opt;
    opt.check_invariants = true;
    auto r = replay_trace(*t, *alloc, backend, opt);
    REQUIRE(r.ok());
    CHECK(r->error == "");
    REQUIRE(r->series.size() == t->ops.size());
    if (r->first_mismatch) {
      const uint32_t k = *r->first_mismatch;
      INFO("op " << k << " recorded " << t->recorded_reserved[k] << " replayed "
                 << r->series[k].reserved);
      CHECK(false);
    }
    CHECK(r->peak_reserved == recorded(name, "max_memory_reserved"));
    CHECK(r->series.back().reserved == recorded(name, "memory_reserved"));
    CHECK(r->stats.reserved_bytes == recorded(name, "memory_reserved"));
    CHECK(r->stats.allocated_bytes == recorded(name, "memory_allocated"));
    CHECK(r->peak_allocated == recorded(name, "max_memory_allocated"));
  }
}

TEST_CASE("snapshot: the recorded settings matter (defaults do not reproduce them)", "[snapshot]") {
  for (const std::string name :
       {"steps_maxsplit", "steps_roundup4", "steps_gc", "steps_expandable"}) {
    INFO(name);
    auto s = read_snapshot_file(fixture(name + ".pickle"));
    REQUIRE(s.ok());
    auto t = trace_from_snapshot(*s, 0, name);
    REQUIRE(t.ok());
    SimClock clock;
    SimBackend backend(test_gpu(), clock);
    auto alloc = torch_factory_for(SnapshotSettings{})(backend);
    auto r = replay_trace(*t, *alloc, backend);
    REQUIRE(r.ok());
    CHECK(r->first_mismatch.has_value());
  }
}

TEST_CASE("snapshot: export, import, identical program", "[snapshot]") {
  for (const std::string name : {"steps_default", "streams_default", "steps_gc"}) {
    INFO(name);
    auto s = read_snapshot_file(fixture(name + ".pickle"));
    REQUIRE(s.ok());
    auto t = trace_from_snapshot(*s, 0, name);
    REQUIRE(t.ok());
    REQUIRE(t->initial.empty());
    auto bytes = export_replay_snapshot(*t, torch_factory_for(SnapshotSettings{}), test_gpu());
    REQUIRE(bytes.ok());
    auto back = parse_snapshot(*bytes, "exported");
    REQUIRE(back.ok());
    auto t2 = trace_from_snapshot(*back, 0, "exported");
    REQUIRE(t2.ok());
    REQUIRE(t2->ops.size() == t->ops.size());
    CHECK(t2->blocks == t->blocks);
    CHECK(t2->streams == t->streams);
    for (size_t k = 0; k < t->ops.size(); ++k) {
      const TraceOp& a = t->ops[k];
      const TraceOp& b = t2->ops[k];
      INFO("op " << k);
      REQUIRE(a.kind == b.kind);
      REQUIRE(a.id == b.id);
      REQUIRE(a.bytes == b.bytes);
      REQUIRE(a.stream == b.stream);
    }
    // The exported segments are the state at the end of the replay: the blocks live then.
    uint64_t live = 0;
    for (const auto& seg : back->segments)
      for (const auto& b : seg.blocks)
        if (b.state == SnapshotBlock::State::kActiveAllocated) live += b.size;
    SimClock clock;
    SimBackend backend(test_gpu(), clock);
    auto alloc = torch_factory_for(SnapshotSettings{})(backend);
    auto r = replay_trace(*t, *alloc, backend);
    REQUIRE(r.ok());
    CHECK(live == r->stats.allocated_bytes);
  }
}

TEST_CASE("generated serving traces: valid, seeded, fragmenting", "[snapshot]") {
  const ModelShape model =
      load_model_shape(ConfigNode::load_file(source_root() + "/configs/models/llama-3.1-8b.yaml"));
  GeneratedServing g;
  g.steps = 60;
  const AllocTrace a = generate_serving_trace(model, g, 7, "a");
  const AllocTrace b = generate_serving_trace(model, g, 7, "b");
  const AllocTrace c = generate_serving_trace(model, g, 8, "c");
  CHECK(validate(a).empty());
  CHECK(!a.recorded);
  REQUIRE(a.ops.size() == b.ops.size());
  for (size_t k = 0; k < a.ops.size(); ++k) CHECK(a.ops[k].bytes == b.ops[k].bytes);
  bool differs = a.ops.size() != c.ops.size();
  for (size_t k = 0; !differs && k < a.ops.size(); ++k) differs = a.ops[k].bytes != c.ops[k].bytes;
  CHECK(differs);
  // Everything allocated is freed by the end.
  uint64_t allocs = 0, frees = 0;
  for (const TraceOp& op : a.ops) (op.kind == TraceOp::Kind::kAlloc ? allocs : frees) += 1;
  CHECK(allocs == frees);
  CHECK(allocs == a.blocks);
  // Varying shapes fragment torch_caching: reserved well above allocated at its peak.
  SimClock clock;
  SimBackend backend(test_gpu(), clock);
  auto alloc = torch_factory_for(SnapshotSettings{})(backend);
  auto r = replay_trace(a, *alloc, backend);
  REQUIRE(r.ok());
  CHECK(r->error.empty());
  CHECK(r->fragmentation_at_peak() > 0.2);
  CHECK(r->stats.allocated_bytes == 0);
}

TEST_CASE("snapshot: a missing or bad field is named by its path", "[snapshot]") {
  auto build = [](bool with_size, const char* action, int64_t addr = 1 << 21) {
    PickleDoc d;
    auto dict = [&]() { return d.add_list(PickleDoc::Type::kDict); };
    auto set = [&](PickleDoc::Ref m, const char* k, PickleDoc::Ref v) {
      d.set(m, d.add_str(k), v);
    };
    const auto root = dict();
    const auto segs = d.add_list();
    const auto seg = dict();
    set(seg, "address", d.add_int(1 << 21));
    set(seg, "total_size", d.add_int(2 << 20));
    set(seg, "stream", d.add_int(0));
    set(seg, "segment_type", d.add_str("small"));
    const auto blocks = d.add_list();
    const auto block = dict();
    if (with_size) set(block, "size", d.add_int(2 << 20));
    set(block, "state", d.add_str("inactive"));
    d.append(blocks, block);
    set(seg, "blocks", blocks);
    d.append(segs, seg);
    set(root, "segments", segs);
    const auto traces = d.add_list();
    const auto trace = d.add_list();
    const auto e = dict();
    set(e, "action", d.add_str(action));
    set(e, "addr", d.add_int(addr));
    set(e, "size", d.add_int(512));
    d.append(trace, e);
    d.append(traces, trace);
    set(root, "device_traces", traces);
    d.set_root(root);
    return *d.serialize();
  };
  auto ok = parse_snapshot(build(true, "alloc"), "s.pickle");
  REQUIRE(ok.ok());
  CHECK(ok->segments[0].blocks[0].address == (1u << 21));  // no address key: laid out in order
  auto no_size = parse_snapshot(build(false, "alloc"), "s.pickle");
  REQUIRE(!no_size.ok());
  CHECK(no_size.error().message == "s.pickle: segments[0].blocks[0]: key 'size' missing");
  auto bad_action = parse_snapshot(build(true, "allocate"), "s.pickle");
  REQUIRE(!bad_action.ok());
  CHECK(bad_action.error().message ==
        "s.pickle: device_traces[0][0].action: unknown action 'allocate'");
  // A block freed in the trace without an alloc was live when recording began: it must lie in
  // a segment of that time.
  auto inside = parse_snapshot(build(true, "free_completed"), "s.pickle");
  REQUIRE(inside.ok());
  auto t = trace_from_snapshot(*inside, 0, "s.pickle");
  REQUIRE(t.ok());
  REQUIRE(t->initial.size() == 1);
  CHECK(t->initial[0].blocks.size() == 1);
  auto outside = parse_snapshot(build(true, "free_completed", 1 << 30), "s.pickle");
  REQUIRE(outside.ok());
  auto bad = trace_from_snapshot(*outside, 0, "s.pickle");
  REQUIRE(!bad.ok());
  CHECK_THAT(bad.error().message, Catch::Contains("0x40000000 was live when recording began but "
                                                  "lies in no segment"));
}
