// Names of error codes and primitive classes, for messages and reports.
#include "backends/result.h"
#include "backends/backend.h"

namespace memsim {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOutOfMemory:
      return "out of memory";
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kInvalidState:
      return "invalid state";
    case ErrorCode::kNotSupported:
      return "not supported";
    case ErrorCode::kDriverError:
      return "driver error";
  }
  return "unknown error";
}

const char* to_string(Primitive p) {
  switch (p) {
    case Primitive::kCreatePhysical:
      return "create_physical";
    case Primitive::kReleasePhysical:
      return "release_physical";
    case Primitive::kReserveVirtual:
      return "reserve_virtual";
    case Primitive::kFreeVirtual:
      return "free_virtual";
    case Primitive::kMap:
      return "map";
    case Primitive::kUnmap:
      return "unmap";
    case Primitive::kSetAccess:
      return "set_access";
    case Primitive::kDeviceMalloc:
      return "device_malloc";
    case Primitive::kDeviceFree:
      return "device_free";
    case Primitive::kMallocAsync:
      return "malloc_async";
    case Primitive::kFreeAsync:
      return "free_async";
    case Primitive::kHostMallocPinned:
      return "host_malloc_pinned";
    case Primitive::kHostFreePinned:
      return "host_free_pinned";
    case Primitive::kFill:
      return "fill";
    case Primitive::kCopy:
      return "copy";
    case Primitive::kBeginCapture:
      return "begin_capture";
    case Primitive::kEndCapture:
      return "end_capture";
    case Primitive::kLaunch:
      return "launch";
    case Primitive::kDestroyGraph:
      return "destroy_graph";
    case Primitive::kGraphMemTrim:
      return "graph_mem_trim";
    case Primitive::kUpload:
      return "upload";
    case Primitive::kStreamWait:
      return "stream_wait";
    case Primitive::kSynchronize:
      return "synchronize";
    case Primitive::kCount:
      break;
  }
  return "unknown";
}

Primitive primitive_named(std::string_view name) {
  for (size_t i = 0; i < static_cast<size_t>(Primitive::kCount); ++i)
    if (name == to_string(static_cast<Primitive>(i))) return static_cast<Primitive>(i);
  return Primitive::kCount;
}

}  // namespace memsim
