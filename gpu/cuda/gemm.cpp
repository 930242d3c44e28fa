#include "gpu/cuda/gemm.h"

#include <stdexcept>
#include <string>

namespace troupe::cu {

namespace {

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": " + cublasLtGetStatusString(s));
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::F16:
      return CUDA_R_16F;
    case DType::BF16:
      return CUDA_R_16BF;
  }
  throw std::invalid_argument("unknown dtype");
}

std::string shape_name(int m, int n, int k, DType t) {
  return std::to_string(m) + "x" + std::to_string(k) + " . (" + std::to_string(n) + "x" +
         std::to_string(k) + ")^T in " + dtype_name(t);
}

constexpr int kHeuristics = 16;

}  // namespace

Gemm::Gemm(void* workspace, size_t workspace_bytes, bool deterministic, int max_rows)
    : workspace_(workspace),
      workspace_bytes_(workspace_bytes),
      deterministic_(deterministic),
      max_rows_(max_rows) {
  check_blas(cublasLtCreate(&lt_), "cublasLtCreate");
}

Gemm::~Gemm() {
  for (auto& [shape, p] : plans_) destroy(p);
  if (lt_) cublasLtDestroy(lt_);
}

void Gemm::destroy(Plan& p) {
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.c) cublasLtMatrixLayoutDestroy(p.c);
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  p = Plan{};
}

// Column-major view: y^T [n, m] = w [k, n]^T . x^T [k, m], so A = w
// transposed, B = x as is, C = D = y with leading dimension n.
Gemm::Plan Gemm::make_plan(int m, int n, int k, DType dtype) {
  Plan p;
  try {
    check_blas(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate");
    const cublasOperation_t trans = CUBLAS_OP_T;
    check_blas(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans),
        "cublasLtMatmulDescSetAttribute");
    const cudaDataType_t t = cuda_type(dtype);
    check_blas(cublasLtMatrixLayoutCreate(&p.a, t, uint64_t(k), uint64_t(n), int64_t(k)),
               "cublasLtMatrixLayoutCreate(A)");
    check_blas(cublasLtMatrixLayoutCreate(&p.b, t, uint64_t(k), uint64_t(m), int64_t(k)),
               "cublasLtMatrixLayoutCreate(B)");
    check_blas(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, uint64_t(n), uint64_t(m), int64_t(n)),
               "cublasLtMatrixLayoutCreate(C)");
  } catch (...) {
    destroy(p);
    throw;
  }
  return p;
}

cublasLtMatmulAlgo_t Gemm::fixed_algo(int n, int k, DType dtype) {
  const auto key = std::make_tuple(n, k, dtype);
  if (auto it = fixed_.find(key); it != fixed_.end()) return it->second;
  // Candidates for the largest step, without split-K; the first that also
  // runs the other row counts serves every one (a ragged batch has any
  // count). The check is on the host only; counts past the largest step's
  // are never run.
  Plan big = make_plan(max_rows_, n, k, dtype);
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t results[kHeuristics];
  int returned = 0;
  try {
    check_blas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    check_blas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes_, sizeof workspace_bytes_),
               "cublasLtMatmulPreferenceSetAttribute");
    const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
    check_blas(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                             &no_reduction, sizeof no_reduction),
        "cublasLtMatmulPreferenceSetAttribute");
    check_blas(cublasLtMatmulAlgoGetHeuristic(lt_, big.op, big.a, big.b, big.c, big.c, pref,
                                              kHeuristics, results, &returned),
               "cublasLtMatmulAlgoGetHeuristic");
  } catch (...) {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    destroy(big);
    throw;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  destroy(big);
  const auto runs_every_count = [&](const cublasLtMatmulAlgo_t& algo) {
    for (int m : {1, 2, 3, 5, 8, 17, 33, 64, 127, 256, 511}) {
      if (m >= max_rows_) break;
      Plan p = make_plan(m, n, k, dtype);
      cublasLtMatmulHeuristicResult_t check{};
      const bool ok = cublasLtMatmulAlgoCheck(lt_, p.op, p.a, p.b, p.c, p.c, &algo, &check) ==
                          CUBLAS_STATUS_SUCCESS &&
                      check.workspaceSize <= workspace_bytes_;
      destroy(p);
      if (!ok) return false;
    }
    return true;
  };
  for (int i = 0; i < returned; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    uint32_t split_k = 1;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                         &split_k, sizeof split_k, &written);
    if (split_k > 1 || !runs_every_count(results[i].algo)) continue;
    return fixed_[key] = results[i].algo;
  }
  throw std::runtime_error(
      "cuBLASLt has no algorithm without split-K that runs every row count "
      "from 1 to " +
      std::to_string(max_rows_) + " of " + shape_name(max_rows_, n, k, dtype) +
      " (deterministic mode)");
}

Gemm::Plan& Gemm::plan(int m, int n, int k, DType dtype) {
  const Shape shape{m, n, k, dtype};
  if (auto it = plans_.find(shape); it != plans_.end()) return it->second;
  Plan p = make_plan(m, n, k, dtype);
  try {
    if (deterministic_) {
      p.algo = fixed_algo(n, k, dtype);
    } else {
      cublasLtMatmulPreference_t pref = nullptr;
      check_blas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes_, sizeof workspace_bytes_);
      cublasLtMatmulHeuristicResult_t result{};
      int returned = 0;
      const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref,
                                                              1, &result, &returned);
      cublasLtMatmulPreferenceDestroy(pref);
      check_blas(s, "cublasLtMatmulAlgoGetHeuristic");
      if (returned < 1)
        throw std::runtime_error("cuBLASLt has no algorithm for " + shape_name(m, n, k, dtype));
      p.algo = result.algo;
    }
  } catch (...) {
    destroy(p);
    throw;
  }
  return plans_.emplace(shape, p).first->second;
}

void Gemm::run(const void* w, const void* x, float* y, int m, int n, int k, DType dtype,
               cudaStream_t stream) {
  if (m > max_rows_)
    throw std::invalid_argument("GEMM of " + std::to_string(m) + " rows exceeds the planned " +
                                std::to_string(max_rows_));
  Plan& p = plan(m, n, k, dtype);
  const float one = 1.0f, zero = 0.0f;
  check_blas(cublasLtMatmul(lt_, p.op, &one, w, p.a, x, p.b, &zero, y, p.c, y, p.c, &p.algo,
                            workspace_, workspace_bytes_, stream),
             "cublasLtMatmul");
}

}  // namespace troupe::cu
