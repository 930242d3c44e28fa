#pragma once
// The projections: y = x . w^T through cuBLASLt, weights and inputs in the
// weights' dtype, output and accumulation f32. In deterministic mode every
// weight shape uses one algorithm, chosen once without split-K, for every
// row count: a token's row then gets the same reduction order whatever else
// is in the step (cuBLAS's heuristic otherwise picks per row count, and
// split-K changes the order of the sums).
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <map>
#include <tuple>

#include "gpu/dtype.h"

namespace troupe::cu {

class Gemm {
 public:
  // `workspace` (device, `workspace_bytes`) is the one scratch every call
  // uses; max_rows is the largest m any call will pass.
  Gemm(void* workspace, size_t workspace_bytes, bool deterministic, int max_rows);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y [m, n] (f32, row-major) = x [m, k] . w [n, k]^T, both row-major in
  // `dtype`. Queued on `stream`. A shape's plan is made on its first call
  // (host work only, so a graph capture may make it).
  void run(const void* w, const void* x, float* y, int m, int n, int k, DType dtype,
           cudaStream_t stream);

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  using Shape = std::tuple<int, int, int, DType>;  // m, n, k, dtype
  Plan& plan(int m, int n, int k, DType dtype);
  Plan make_plan(int m, int n, int k, DType dtype);
  cublasLtMatmulAlgo_t fixed_algo(int n, int k, DType dtype);
  static void destroy(Plan& p);

  cublasLtHandle_t lt_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;
  bool deterministic_;
  int max_rows_;
  std::map<Shape, Plan> plans_;
  std::map<std::tuple<int, int, DType>, cublasLtMatmulAlgo_t> fixed_;
};

}  // namespace troupe::cu
