#pragma once
// CUDA runtime errors as exceptions whose message names the call that failed.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace troupe::cu {

class CudaError : public std::runtime_error {
 public:
  CudaError(cudaError_t code, const std::string& what)
      : std::runtime_error(what + ": " + cudaGetErrorName(code) + " (" + cudaGetErrorString(code) +
                           ")"),
        code_(code) {}
  cudaError_t code() const { return code_; }

 private:
  cudaError_t code_;
};

inline void check(cudaError_t code, const char* what) {
  if (code != cudaSuccess) throw CudaError(code, what);
}

// Page-locked host memory for `count` T (asynchronous copies need it).
template <class T>
T* pinned(size_t count, const char* what) {
  void* p = nullptr;
  check(cudaHostAlloc(&p, count * sizeof(T), cudaHostAllocDefault), what);
  return static_cast<T*>(p);
}

// After a kernel launch: a bad launch configuration shows up here.
inline void check_launch(const char* kernel) {
  check(cudaGetLastError(), kernel);
}

}  // namespace troupe::cu
