// Segment source backed by plain device allocations (cudaMalloc), as PyTorch's default.
#pragma once

#include <string>

#include "src/alloc/caching_allocator.h"

namespace memsim {

class DeviceSegmentSource final : public SegmentSource {
 public:
  DeviceSegmentSource(Backend& backend, std::string tag)
      : backend_(backend), tag_(std::move(tag)) {}
  Result<DevPtr> allocate_segment(uint64_t bytes, StreamId stream) override;
  Status release_segment(DevPtr p, uint64_t bytes) override;

 private:
  Backend& backend_;
  std::string tag_;
};

}  // namespace memsim
