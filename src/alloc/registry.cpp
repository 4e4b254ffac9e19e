// The caching-allocator registry: one line per implementation, and the parsers of their typed
// configs.
#include "src/alloc/registry.h"

#include <bit>

#include "src/alloc/cuda_async.h"
#include "src/alloc/device_segment_source.h"
#include "src/alloc/sma.h"
#include "src/alloc/torch_caching.h"

namespace memsim {
namespace {

// The torch_caching keys: max_split_size, roundup_power2_divisions (a number or PyTorch's list
// form), garbage_collection_threshold, memory_limit, expandable_segments.
TorchCachingConfig parse_torch_caching(const ConfigNode& node) {
  TorchCachingConfig c;
  if (auto v = node.find("max_split_size")) {
    c.max_split_size = v->as_bytes();
    // CUDAAllocatorConfig: max_split_size_mb must exceed kLargeBuffer / 1 MiB (20 MiB).
    if (c.max_split_size <= TorchCachingAllocator::kLargeBuffer)
      v->fail("must be above 20 MiB (PyTorch's max_split_size_mb lower bound)");
  }
  if (auto v = node.find("roundup_power2_divisions")) {
    auto divisions = [](const ConfigNode& n) {
      const uint64_t d = n.as_uint_in(0, 1u << 20);
      if (d > 1 && !std::has_single_bit(d)) n.fail("must be 0, 1 or a power of two");
      return static_cast<uint32_t>(d);
    };
    if (v->is_scalar()) {
      c.set_roundup_power2_divisions(divisions(*v));
    } else if (v->is_map()) {
      // PyTorch's list form [256:1,512:2,>:8]: sizes (powers of two, 1 MiB .. 32 GiB) to
      // divisions; the first entry also covers smaller sizes, ">" every interval after the last.
      int last = -1;
      for (const std::string& key : v->keys()) {
        const ConfigNode item = (*v)[key];
        const uint32_t d = divisions(item);
        if (key == ">") {
          for (size_t k = static_cast<size_t>(last + 1); k < c.roundup_power2_divisions.size(); ++k)
            c.roundup_power2_divisions[k] = d;
          continue;
        }
        const uint64_t bytes = ConfigNode::parse(key, item.file()).as_bytes();
        if (bytes < (1ull << 20) || !std::has_single_bit(bytes) || bytes > (32ull << 30))
          item.fail("the key must be a power-of-two size from 1MiB to 32GiB (or '>')");
        const int slot = std::countr_zero(bytes) - 20;
        if (slot <= last) item.fail("keys must be in increasing order");
        if (last < 0)
          for (int k = 0; k < slot; ++k) c.roundup_power2_divisions[static_cast<size_t>(k)] = d;
        c.roundup_power2_divisions[static_cast<size_t>(slot)] = d;
        last = slot;
      }
    } else {
      v->fail("expected a number or a map of sizes to divisions");
    }
  }
  if (auto v = node.find("garbage_collection_threshold")) {
    c.garbage_collection_threshold = v->as_double_in(0, 1);
    if (c.garbage_collection_threshold >= 1) v->fail("must be below 1 (PyTorch's bound)");
  }
  if (auto v = node.find("memory_limit")) c.memory_limit = v->as_bytes();
  if (auto v = node.find("expandable_segments")) c.expandable_segments = v->as_bool();
  return c;
}

// torch_caching's segments come from the device through a DeviceSegmentSource it owns.
AllocatorFactory torch_factory(const ConfigNode& node) {
  const TorchCachingConfig c = parse_torch_caching(node);
  return [c](Backend& b) {
    return std::make_unique<TorchCachingAllocator>(
        std::make_unique<DeviceSegmentSource>(b, "torch_caching"), c, &b);
  };
}

// SMAConfig's PYTORCH_NPU_ALLOC_CONF keys as byte sizes (max_split_size_mb -> max_split_size,
// base_addr_aligned_kb -> base_addr_aligned), like torch_caching's, plus the heap's region.
SmaConfig parse_sma(const ConfigNode& node) {
  SmaConfig c;
  if (auto v = node.find("region")) {
    c.region = v->as_choice({"vmm", "device_malloc"}) == "vmm" ? SmaConfig::Region::kVmm
                                                               : SmaConfig::Region::kDeviceMalloc;
  }
  if (auto v = node.find("heap_size")) {
    c.heap_size = v->as_bytes();
    if (c.heap_size > (1ull << 50)) v->fail("must be at most 1PiB (0 = the device capacity)");
  }
  if (auto v = node.find("max_split_size")) {
    c.max_split_size = v->as_bytes();
    // The bound of PyTorch's max_split_size_mb (above kLargeBuffer), which SMAConfig mirrors.
    if (c.max_split_size <= Sma::kLargeBuffer)
      v->fail("must be above 20 MiB (PyTorch's max_split_size_mb lower bound)");
  }
  if (auto v = node.find("cross_stream"))
    c.cross_stream = v->as_choice({"event", "sync"}) == "event" ? SmaConfig::CrossStream::kEvent
                                                                : SmaConfig::CrossStream::kSync;
  if (auto v = node.find("merge"))
    c.merge =
        v->as_choice({"gc", "eager"}) == "gc" ? SmaConfig::Merge::kGc : SmaConfig::Merge::kEager;
  if (auto v = node.find("garbage_collection_threshold")) {
    c.garbage_collection_threshold = v->as_double_in(0, 1);
    if (c.garbage_collection_threshold >= 1) v->fail("must be below 1 (0 = off)");
  }
  if (auto v = node.find("base_addr_aligned")) {
    c.base_addr_aligned = v->as_bytes();
    if (c.base_addr_aligned < Sma::kMinBlockSize || c.base_addr_aligned > (1ull << 30) ||
        !std::has_single_bit(c.base_addr_aligned))
      v->fail("must be a power of two from 512B to 1GiB");
  }
  return c;
}

CudaAsyncConfig parse_cuda_async(const ConfigNode& node) {
  CudaAsyncConfig c;
  if (auto v = node.find("chunk_bytes")) {
    c.chunk_bytes = v->as_bytes();
    if (c.chunk_bytes == 0 || c.chunk_bytes % (2ull << 20) != 0)
      v->fail("must be a positive multiple of 2 MiB (the VMM granularity)");
  }
  if (auto v = node.find("release_threshold")) {
    c.release_threshold = v->is_scalar() && v->as_string() == "max" ? UINT64_MAX : v->as_bytes();
  }
  if (auto v = node.find("alignment")) {
    c.alignment = v->as_bytes();
    if (c.alignment == 0 || (c.alignment & (c.alignment - 1)) != 0)
      v->fail("must be a power of two");
  }
  return c;
}

}  // namespace

const Registry<AllocatorEntry>& caching_allocators() {
  static const Registry<AllocatorEntry> kRegistry{
      "allocator",
      {
          {"torch_caching",
           "PyTorch's CUDACachingAllocator (cudaMalloc segments, best fit, splitting)",
           {"max_split_size", "roundup_power2_divisions", "garbage_collection_threshold",
            "memory_limit", "expandable_segments"},
           torch_factory,
           {.pytorch_alloc_conf = true}},
          {"sma",
           "zbccl's SMA: best-fit coalescing heap over one region (VMM or cudaMalloc) under a "
           "block cache with stream-aware reuse",
           {"region", "heap_size", "max_split_size", "garbage_collection_threshold",
            "base_addr_aligned", "cross_stream", "merge"},
           parse_into<Sma>(parse_sma)},
          {"cuda_async",
           "the driver's stream-ordered pool (cudaMallocAsync; PyTorch backend:cudaMallocAsync)",
           {"chunk_bytes", "release_threshold", "alignment"},
           parse_into<CudaAsyncAllocator>(parse_cuda_async)},
      }};
  return kRegistry;
}

}  // namespace memsim
