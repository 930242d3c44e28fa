// Whether a CUDA device answers. Any error is "no GPU": without a driver the
// runtime says cudaErrorInsufficientDriver (35), not cudaErrorNoDevice.
#include <cuda_runtime_api.h>

#include <string>

#include "gpu/cuda/cuda_engine.h"

namespace troupe {

bool cuda_device_available(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    if (why)
      *why = std::string("no usable CUDA device: cudaGetDeviceCount failed with ") +
             cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
    cudaGetLastError();  // clear it, so later calls do not see it
    return false;
  }
  if (count < 1) {
    if (why) *why = "no CUDA device found";
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = "CUDA device 0 did not answer cudaGetDeviceProperties";
    return false;
  }
  if (why)
    *why = std::to_string(count) + " CUDA device(s); device 0: " + prop.name + ", compute " +
           std::to_string(prop.major) + "." + std::to_string(prop.minor) + ", " +
           std::to_string(prop.totalGlobalMem >> 20) + " MiB";
  return true;
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

}  // namespace troupe
