// cuBLASLt through dlopen: the entry points the model step uses, one matmul plan (descriptors,
// layouts, heuristic algorithm) per (dtype, m, n, k, bias) cached for the run.
#include "kernels/gemm.h"

#include <cublasLt.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace memsim::kernels {

struct LtGemm::Api {
  void* lib = nullptr;
  std::string path;
#define MEMSIM_LT_FN(name) decltype(&::name) name = nullptr;
  MEMSIM_LT_FN(cublasLtCreate)
  MEMSIM_LT_FN(cublasLtDestroy)
  MEMSIM_LT_FN(cublasLtMatmul)
  MEMSIM_LT_FN(cublasLtMatmulDescCreate)
  MEMSIM_LT_FN(cublasLtMatmulDescDestroy)
  MEMSIM_LT_FN(cublasLtMatmulDescSetAttribute)
  MEMSIM_LT_FN(cublasLtMatrixLayoutCreate)
  MEMSIM_LT_FN(cublasLtMatrixLayoutDestroy)
  MEMSIM_LT_FN(cublasLtMatmulPreferenceCreate)
  MEMSIM_LT_FN(cublasLtMatmulPreferenceDestroy)
  MEMSIM_LT_FN(cublasLtMatmulPreferenceSetAttribute)
  MEMSIM_LT_FN(cublasLtMatmulAlgoGetHeuristic)
#undef MEMSIM_LT_FN
  ~Api() {
    if (lib) dlclose(lib);
  }
};

struct LtGemm::Plan {
  const Api* api = nullptr;
  bool borrowed = false;  // the algorithm is the covering rows' plan's (not checked for m yet)
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a) api->cublasLtMatrixLayoutDestroy(a);
    if (b) api->cublasLtMatrixLayoutDestroy(b);
    if (c) api->cublasLtMatrixLayoutDestroy(c);
    if (op) api->cublasLtMatmulDescDestroy(op);
  }
};

namespace {

std::vector<std::string> candidates() {
  const std::string so = fmt::format("libcublasLt.so.{}", CUBLAS_VER_MAJOR);
  std::vector<std::string> c;
  if (const char* env = std::getenv("MEMSIM_CUBLASLT"); env && *env) c.push_back(env);
  c.push_back(so);  // the loader's search path (LD_LIBRARY_PATH, ld.so.cache)
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* root = std::getenv(var); root && *root)
      c.push_back(fmt::format("{}/lib64/{}", root, so));
  c.push_back("/usr/local/cuda/lib64/" + so);
  c.push_back("/usr/local/cuda/targets/x86_64-linux/lib/" + so);
  c.push_back(
      fmt::format("/usr/local/cuda-{}.0/targets/x86_64-linux/lib/{}", CUBLAS_VER_MAJOR, so));
  return c;
}

std::string status(cublasStatus_t s) {
  return fmt::format("cuBLASLt status {}", static_cast<int>(s));
}

}  // namespace

std::unique_ptr<LtGemm> LtGemm::open(uint64_t workspace, uint64_t workspace_bytes,
                                     std::string* why) {
  auto api = std::make_unique<Api>();
  std::string tried;
  for (const std::string& path : candidates()) {
    api->lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (api->lib) {
      api->path = path;
      break;
    }
    tried += (tried.empty() ? "" : ", ") + path;
  }
  if (!api->lib) {
    if (why) *why = "cannot load cuBLASLt (tried " + tried + "; set MEMSIM_CUBLASLT)";
    return nullptr;
  }
  bool ok = true;
  auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(api->lib, name));
    if (!fn) {
      ok = false;
      if (why) *why = fmt::format("{} has no {}", api->path, name);
    }
  };
#define MEMSIM_LT_BIND(name) bind(api->name, #name);
  MEMSIM_LT_BIND(cublasLtCreate)
  MEMSIM_LT_BIND(cublasLtDestroy)
  MEMSIM_LT_BIND(cublasLtMatmul)
  MEMSIM_LT_BIND(cublasLtMatmulDescCreate)
  MEMSIM_LT_BIND(cublasLtMatmulDescDestroy)
  MEMSIM_LT_BIND(cublasLtMatmulDescSetAttribute)
  MEMSIM_LT_BIND(cublasLtMatrixLayoutCreate)
  MEMSIM_LT_BIND(cublasLtMatrixLayoutDestroy)
  MEMSIM_LT_BIND(cublasLtMatmulPreferenceCreate)
  MEMSIM_LT_BIND(cublasLtMatmulPreferenceDestroy)
  MEMSIM_LT_BIND(cublasLtMatmulPreferenceSetAttribute)
  MEMSIM_LT_BIND(cublasLtMatmulAlgoGetHeuristic)
#undef MEMSIM_LT_BIND
  if (!ok) return nullptr;
  std::unique_ptr<LtGemm> g(new LtGemm());
  cublasLtHandle_t h = nullptr;
  if (cublasStatus_t s = api->cublasLtCreate(&h); s != CUBLAS_STATUS_SUCCESS) {
    if (why) *why = "cublasLtCreate: " + status(s);
    return nullptr;
  }
  g->api_ = std::move(api);
  g->handle_ = h;
  g->workspace_ = workspace;
  g->workspace_bytes_ = workspace_bytes;
  return g;
}

LtGemm::~LtGemm() {
  plans_.clear();
  if (handle_) api_->cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

std::string LtGemm::library() const {
  return api_ ? api_->path : std::string();
}

std::vector<uint32_t> LtGemm::plan_rows(uint32_t most) {
  std::vector<uint32_t> v;
  for (uint32_t t = 1; t <= most; t += t < 64 ? 1 : 8) v.push_back(t);
  if (most && v.back() != most) v.push_back(most);
  return v;
}

namespace {

// The smallest of plan_rows' counts >= m, but for `most` (which the rows cover by itself).
uint32_t covering_rows(uint32_t m) {
  return m <= 64 ? m : (m + 7) / 8 * 8;
}

}  // namespace

std::string LtGemm::plan(KvDtype dtype, uint64_t bias, uint32_t m, uint32_t n, uint32_t k,
                         Plan** out, bool exact) {
  const Api& api = *api_;
  const auto key = std::make_tuple(static_cast<int>(dtype), m, n, k, bias != 0);
  auto it = plans_.find(key);
  if (it != plans_.end() && exact && it->second->borrowed) {
    plans_.erase(it);
    it = plans_.end();
  }
  if (it == plans_.end()) {
    // Column-major view: D[n, m] = W^T[n, k] x X[k, m], where W (row-major [n, k]) is the
    // column-major [k, n] matrix A (transposed) and X (row-major [m, k]) the column-major
    // [k, m] matrix B; D is Y row-major [m, n]. The bias epilogue adds bias[row] = bias[n].
    auto plan = std::make_unique<Plan>();
    plan->api = &api;
    const cudaDataType_t t = dtype == KvDtype::kBf16 ? CUDA_R_16BF : CUDA_R_16F;
    cublasStatus_t s = api.cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    if (s == CUBLAS_STATUS_SUCCESS)
      s = api.cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                             sizeof(ta));
    if (s == CUBLAS_STATUS_SUCCESS)
      s = api.cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                             sizeof(tb));
    if (s == CUBLAS_STATUS_SUCCESS && bias) {
      const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
      s = api.cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e,
                                             sizeof(e));
      if (s == CUBLAS_STATUS_SUCCESS)
        s = api.cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t,
                                               sizeof(t));
      const void* b = reinterpret_cast<const void*>(bias);  // its alignment guides the heuristic
      if (s == CUBLAS_STATUS_SUCCESS)
        s = api.cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b,
                                               sizeof(b));
    }
    if (s == CUBLAS_STATUS_SUCCESS) s = api.cublasLtMatrixLayoutCreate(&plan->a, t, k, n, k);
    if (s == CUBLAS_STATUS_SUCCESS) s = api.cublasLtMatrixLayoutCreate(&plan->b, t, k, m, k);
    if (s == CUBLAS_STATUS_SUCCESS) s = api.cublasLtMatrixLayoutCreate(&plan->c, t, n, m, n);
    if (s != CUBLAS_STATUS_SUCCESS) return "matmul descriptors: " + status(s);
    const auto cover =
        plans_.find(std::make_tuple(static_cast<int>(dtype), covering_rows(m), n, k, bias != 0));
    if (!exact && cover != plans_.end() && covering_rows(m) != m) {
      plan->algo = cover->second->algo;
      plan->borrowed = true;
      *out = plans_.emplace(key, std::move(plan)).first->second.get();
      return {};
    }
    cublasLtMatmulPreference_t pref = nullptr;
    s = api.cublasLtMatmulPreferenceCreate(&pref);
    const uint64_t ws = workspace_bytes_;
    if (s == CUBLAS_STATUS_SUCCESS)
      s = api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &ws, sizeof(ws));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
      s = api.cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), plan->op,
                                             plan->a, plan->b, plan->c, plan->c, pref, 1, &result,
                                             &found);
    if (pref) api.cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0)
      return fmt::format("no cuBLASLt algorithm for m {} n {} k {}: {}", m, n, k, status(s));
    plan->algo = result.algo;
    it = plans_.emplace(key, std::move(plan)).first;
  }
  *out = it->second.get();
  return {};
}

std::string LtGemm::matmul(KvDtype dtype, uint64_t x, uint64_t w, uint64_t bias, uint64_t y,
                           uint32_t m, uint32_t n, uint32_t k, cudaStream_t stream) {
  if (m == 0) return {};
  if (!x || !w || !y || n == 0 || k == 0) return "matmul: null operand or empty shape";
  Plan* found = nullptr;
  if (std::string why = plan(dtype, bias, m, n, k, &found); !why.empty()) return why;
  auto s = static_cast<cublasStatus_t>(launch(*found, x, w, bias, y, stream));
  if (s != CUBLAS_STATUS_SUCCESS && found->borrowed) {
    // cuBLASLt refused the covering rows' algorithm for m (before launching anything): the
    // heuristic's own, from now on.
    if (std::string why = plan(dtype, bias, m, n, k, &found, true); !why.empty()) return why;
    s = static_cast<cublasStatus_t>(launch(*found, x, w, bias, y, stream));
  }
  if (s != CUBLAS_STATUS_SUCCESS)
    return fmt::format("cublasLtMatmul m {} n {} k {}: {}", m, n, k, status(s));
  found->borrowed = false;  // checked: cuBLASLt ran it for m
  return {};
}

int LtGemm::launch(const Plan& p, uint64_t x, uint64_t w, uint64_t bias, uint64_t y,
                   cudaStream_t stream) {
  const Api& api = *api_;
  if (bias) {
    const void* b = reinterpret_cast<const void*>(bias);
    if (cublasStatus_t s = api.cublasLtMatmulDescSetAttribute(
            p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof(b));
        s != CUBLAS_STATUS_SUCCESS)
      return s;
  }
  const float alpha = 1.0f, beta = 0.0f;
  return api.cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.op, &alpha,
                            reinterpret_cast<const void*>(w), p.a, reinterpret_cast<const void*>(x),
                            p.b, &beta, reinterpret_cast<void*>(y), p.c, reinterpret_cast<void*>(y),
                            p.c, &p.algo, reinterpret_cast<void*>(workspace_), workspace_bytes_,
                            stream);
}

std::string LtGemm::warm_up(KvDtype dtype, uint64_t x, uint64_t w, uint64_t bias, uint64_t y,
                            uint32_t n, uint32_t k, const std::vector<uint32_t>& ms,
                            cudaStream_t stream, uint32_t* launched) {
  std::vector<cublasLtMatmulAlgo_t> seen;
  for (uint32_t m : ms) {
    if (m == 0) continue;
    Plan* p = nullptr;
    if (std::string why = plan(dtype, bias, m, n, k, &p); !why.empty()) return why;
    const auto same = [&](const cublasLtMatmulAlgo_t& a) {
      return std::memcmp(&a, &p->algo, sizeof a) == 0;
    };
    if (std::any_of(seen.begin(), seen.end(), same)) continue;
    seen.push_back(p->algo);
    if (std::string why = matmul(dtype, x, w, bias, y, m, n, k, stream); !why.empty()) return why;
    if (launched) ++*launched;
  }
  return {};
}

}  // namespace memsim::kernels
