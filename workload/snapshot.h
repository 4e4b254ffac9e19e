// PyTorch memory snapshots (torch.cuda.memory._dump_snapshot pickles) as plain C++ data: read
// with the safe pickle reader, validated field by field, and written back for memory_viz.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backends/result.h"

namespace memsim {

// `allocator_settings` of the snapshot (PyTorch's PYTORCH_CUDA_ALLOC_CONF as parsed).
struct SnapshotSettings {
  bool present = false;  // false: an older snapshot without the key (defaults apply)
  std::string conf;      // the PYTORCH_CUDA_ALLOC_CONF string
  uint64_t max_split_size = UINT64_MAX;  // -1 in the pickle = unlimited
  double garbage_collection_threshold = 0;
  bool expandable_segments = false;
  // roundup_power2_divisions per power-of-two interval: slot k covers sizes [2^(20+k), 2^(21+k))
  // (slot 0 also every size below 1 MiB), as CUDAAllocatorConfig keeps them.
  std::array<uint32_t, 16> roundup_power2_divisions{};
};

struct SnapshotFrame {
  std::string name, filename;
  int64_t line = 0;
};

struct SnapshotBlock {
  enum class State : uint8_t { kActiveAllocated, kActivePendingFree, kInactive };
  uint64_t address = 0;
  uint64_t size = 0;
  uint64_t requested_size = 0;
  State state = State::kInactive;
  std::vector<SnapshotFrame> frames;
};

struct SnapshotSegment {
  int64_t device = 0;
  uint64_t address = 0;
  uint64_t total_size = 0;
  uint64_t stream = 0;  // the cudaStream_t value; 0 is the default stream
  bool small = false;   // segment_type "small" (else "large")
  bool expandable = false;
  int64_t pool_id[2] = {0, 0};  // segment_pool_id; (0, 0) is the default pool
  std::vector<SnapshotBlock> blocks;
};

enum class TraceAction : uint8_t {
  kAlloc,
  kFreeRequested,
  kFreeCompleted,
  kSegmentAlloc,
  kSegmentFree,
  kSegmentMap,
  kSegmentUnmap,
  kSnapshot,
  kOom,
};
const char* to_string(TraceAction a);

struct TraceEntry {
  TraceAction action = TraceAction::kAlloc;
  uint64_t addr = 0;  // for kOom: the free device memory PyTorch saw (key device_free)
  uint64_t size =
      0;  // alloc/free_*: the requested bytes; segment_*: the segment's or range's bytes
  uint64_t stream = 0;
  int64_t time_us = 0;
  std::vector<SnapshotFrame> frames;
};

struct Snapshot {
  std::vector<SnapshotSegment> segments;               // the state when it was dumped
  std::vector<std::vector<TraceEntry>> device_traces;  // one list per device, oldest first
  SnapshotSettings settings;
};

// Host bytes reading a snapshot surely takes per byte of its file (the file, the parsed pickle
// and the Snapshot): a file needing more than the host has is refused before it is read. Real
// snapshots take more (1.2M trace events with a frame each: an 83 MB file, 1.67 GB at the peak,
// 21x); those run until they exhaust memory, which is a HostMemoryError too.
inline constexpr uint64_t kSnapshotBytesPerFileByte = 8;

// Reads a snapshot pickle. Errors name the file and the field path ("segments[3].blocks[0]:
// key 'size' missing"), and say so when the file is not a pickle or is another pickle, or is no
// regular file ("/dev/zero is not a regular file (a character device)", refused unread). A file
// whose size times kSnapshotBytesPerFileByte exceeds the host memory available, or running out
// of host memory while reading it, throws HostMemoryError (core/host_memory.h).
Result<Snapshot> read_snapshot_file(const std::string& path);
Result<Snapshot> parse_snapshot(std::string_view bytes, const std::string& origin);

// The snapshot as a pickle that torch.cuda.memory._snapshot() could have written (protocol 4),
// for pytorch.org/memory_viz; read_snapshot_file() reads it back unchanged.
Result<std::string> serialize_snapshot(const Snapshot& s);

}  // namespace memsim
