// DeviceSegmentSource: segments from Backend::device_malloc / device_free.
#include "src/alloc/device_segment_source.h"

namespace memsim {

Result<DevPtr> DeviceSegmentSource::allocate_segment(uint64_t bytes, StreamId /*stream*/) {
  return backend_.device_malloc(bytes, tag_);
}

Status DeviceSegmentSource::release_segment(DevPtr p, uint64_t /*bytes*/) {
  return backend_.device_free(p);
}

}  // namespace memsim
