// The NCCL tensor-parallel group (tp_group.h).
#include "src/exec/tp_group.h"

#include <cuda_runtime_api.h>

#include "backends/cuda/nccl.h"

namespace memsim {
namespace {

class NcclGroup final : public TpGroup {
 public:
  NcclGroup(Nccl& nccl, uint32_t size, uint32_t rank) : nccl_(nccl), size_(size), rank_(rank) {}
  uint32_t size() const override { return size_; }
  uint32_t rank() const override { return rank_; }
  Status all_reduce(kernels::KvDtype dtype, DevPtr in, DevPtr out, uint64_t elems,
                    uint64_t stream) override {
    const NcclType type =
        dtype == kernels::KvDtype::kFp16 ? NcclType::kFloat16 : NcclType::kBfloat16;
    return nccl_.all_reduce(in, out, elems, type, NcclOp::kSum, stream);
  }
  Status all_gather(DevPtr in, DevPtr out, uint64_t bytes, uint64_t stream) override {
    return nccl_.all_gather(in, out, bytes, stream);
  }
  Result<uint64_t> host_max(uint64_t value) override { return host_reduce(value, NcclOp::kMax); }
  Result<uint64_t> host_min(uint64_t value) override { return host_reduce(value, NcclOp::kMin); }
  const char* all_reduce_kind() const override { return "nccl"; }
  ~NcclGroup() override {
    if (scratch_) cudaFree(scratch_);
  }

 private:
  // One double through a device word of this group's, on the default stream.
  Result<uint64_t> host_reduce(uint64_t value, NcclOp op) {
    if (!scratch_ && cudaMalloc(&scratch_, 8) != cudaSuccess) {
      scratch_ = nullptr;
      return make_error(ErrorCode::kDriverError, "cudaMalloc of the group's word failed");
    }
    const double v = static_cast<double>(value);
    double r = 0;
    const auto p = reinterpret_cast<uint64_t>(scratch_);
    if (cudaMemcpy(scratch_, &v, 8, cudaMemcpyHostToDevice) != cudaSuccess)
      return make_error(ErrorCode::kDriverError, "cudaMemcpy to the group's word failed");
    MEMSIM_TRY(nccl_.all_reduce(p, p, 1, NcclType::kFloat64, op, 0));
    if (cudaMemcpy(&r, scratch_, 8, cudaMemcpyDeviceToHost) != cudaSuccess)
      return make_error(ErrorCode::kDriverError, "cudaMemcpy from the group's word failed");
    return static_cast<uint64_t>(r);
  }
  Nccl& nccl_;
  uint32_t size_, rank_;
  void* scratch_ = nullptr;
};

}  // namespace

std::unique_ptr<TpGroup> make_nccl_group(Nccl& nccl, uint32_t size, uint32_t rank) {
  return std::make_unique<NcclGroup>(nccl, size, rank);
}

}  // namespace memsim
