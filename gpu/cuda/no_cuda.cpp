// The CUDA backend of a build made without nvcc: no device, and factories
// that say why they cannot build an engine.
#include <stdexcept>

#include "gpu/cuda/cuda_engine.h"

namespace troupe {

namespace {
constexpr const char* kNoCuda =
    "this build has no CUDA backend (nvcc was not found when it was configured)";
}

bool cuda_device_available(std::string* why) {
  if (why) *why = kNoCuda;
  return false;
}

int cuda_device_count() {
  return 0;
}

std::unique_ptr<StepEngine> make_cuda_engine(const Checkpoint&, DType, CudaEngineOptions) {
  throw std::runtime_error(kNoCuda);
}

std::unique_ptr<StepEngine> make_cuda_parallel_engine(const Checkpoint&, DType,
                                                      ParallelEngineOptions, std::vector<int>,
                                                      CudaEngineOptions, DeviceLauncher) {
  throw std::runtime_error(kNoCuda);
}

}  // namespace troupe
