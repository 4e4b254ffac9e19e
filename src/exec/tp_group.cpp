// The NCCL tensor-parallel group (tp_group.h).
#include "src/exec/tp_group.h"

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

 private:
  Nccl& nccl_;
  uint32_t size_, rank_;
};

}  // namespace

std::unique_ptr<TpGroup> make_nccl_group(Nccl& nccl, uint32_t size, uint32_t rank) {
  return std::make_unique<NcclGroup>(nccl, size, rank);
}

}  // namespace memsim
