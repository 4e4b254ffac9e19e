// The model step's GEMMs through cuBLASLt, loaded at run time (dlopen of the toolkit's
// libcublasLt.so.<major>), so memsim binaries start on machines without it and only the model
// executor needs it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention_types.h"

namespace memsim::kernels {

// Y[m, n] = X[m, k] x W[n, k]^T (+ bias[n]): PyTorch Linear on row-major tensors, bf16 or fp16
// in and out, fp32 accumulation, cuBLASLt's heuristic algorithm for the shape (cached).
class LtGemm {
 public:
  // Loads cuBLASLt and creates a handle. `workspace` (device memory, may be 0 with 0 bytes) is
  // the scratch cuBLASLt may use; 32 MiB is what PyTorch gives it on Hopper. Null with *why set
  // when the library is missing or fails; MEMSIM_CUBLASLT names the library file to try first.
  static std::unique_ptr<LtGemm> open(uint64_t workspace, uint64_t workspace_bytes,
                                      std::string* why);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Empty on success, else what failed (and the cuBLASLt status).
  std::string matmul(KvDtype dtype, uint64_t x, uint64_t w, uint64_t bias, uint64_t y, uint32_t m,
                     uint32_t n, uint32_t k, cudaStream_t stream);
  std::string library() const;  // the file that was loaded

  // The row counts whose plans cover every m in 1..most: each m up to 64, then every multiple of
  // 8, and `most`. A shape first seen at m takes the algorithm of the smallest of these >= m
  // when its plan exists (warm_up over these rows makes them all), instead of asking cuBLASLt's
  // heuristic during that step, which a short eager step's kernels wait for: on an H200, served
  // steps of at most 256 prefill tokens at a row count not planned ran a median 0.8-1.1 ms
  // longer than the same steps in isolation, those at a planned one did not (a step makes five
  // GEMM shapes). cuBLASLt checks the borrowed algorithm at the matmul; one it refuses is
  // replaced by the heuristic's for m.
  static std::vector<uint32_t> plan_rows(uint32_t most);

  // Loads, before they are needed, the kernels cuBLASLt picks for the GEMM of each m in `ms`:
  // the plan of every m is made (and cached), and one matmul runs for each algorithm not seen
  // at an earlier m. With CUDA's lazy module loading a kernel's first launch loads it (about
  // 2 ms on an H200), which a serving engine's first step of a new size would otherwise pay.
  // x and y must hold max(ms) rows; *launched counts the matmuls run.
  std::string warm_up(KvDtype dtype, uint64_t x, uint64_t w, uint64_t bias, uint64_t y, uint32_t n,
                      uint32_t k, const std::vector<uint32_t>& ms, cudaStream_t stream,
                      uint32_t* launched);

 private:
  struct Api;
  struct Plan;
  LtGemm() = default;
  // The cached plan of the shape (descriptors and an algorithm), made on first use: the
  // algorithm of the covering rows' plan (plan_rows) when it exists and `exact` is false, else
  // the heuristic's for m.
  std::string plan(KvDtype dtype, uint64_t bias, uint32_t m, uint32_t n, uint32_t k, Plan** out,
                   bool exact = false);
  // The plan's matmul on the stream; the cuBLASLt status.
  int launch(const Plan& p, uint64_t x, uint64_t w, uint64_t bias, uint64_t y, cudaStream_t stream);
  std::unique_ptr<Api> api_;
  void* handle_ = nullptr;  // cublasLtHandle_t
  uint64_t workspace_ = 0, workspace_bytes_ = 0;
  std::map<std::tuple<int, uint32_t, uint32_t, uint32_t, bool>, std::unique_ptr<Plan>> plans_;
};

}  // namespace memsim::kernels
