#pragma once
// Shared by the GPU tests: a fixture that skips (with the reason) when no
// CUDA device answers, device buffers, NaN poisoning, random data.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/cuda_engine.h"
#include "gpu/cuda/kernels.h"
#include "gpu/dtype.h"
#include "util/rng.h"

namespace troupe::test {

// A file of the repository: under $TROUPE_SOURCE_DIR when set (a build
// carried to a GPU machine, where the checkout lives elsewhere), else under
// the source directory compiled in.
inline std::filesystem::path repo_file(const std::filesystem::path& relative) {
  const char* root = std::getenv("TROUPE_SOURCE_DIR");
  return std::filesystem::path(root && *root ? root : TROUPE_SOURCE_DIR) / relative;
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_device_available(&why)) GTEST_SKIP() << why;
    cu::check(cudaSetDevice(0), "cudaSetDevice");
    // Kernel tests may run before (or without) any engine, which is what
    // otherwise raises the prefill kernels' shared-memory limit.
    cu::configure_kernels();
  }
};

// Device memory holding n elements of T, freed on destruction.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    cu::check(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T)),
              "cudaMalloc (test)");
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    cu::check(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              "upload (test)");
  }
  std::vector<T> download() const {
    cu::check(cudaDeviceSynchronize(), "kernel (test)");
    std::vector<T> host(n_);
    cu::check(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost),
              "download (test)");
    return host;
  }
  // Every byte 0xff: NaN in f32, f16 and bf16, so anything a kernel fails to
  // write shows up.
  void poison() { cu::check(cudaMemset(p_, 0xff, n_ * sizeof(T)), "poison (test)"); }

 private:
  T* p_ = nullptr;
  size_t n_;
};

inline std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  Xoshiro256 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(rng.next_double() * 2 - 1) * scale;
  return v;
}

// Values of `dtype`'s storage (as uint16 for 16-bit types) from f32, and back.
inline std::vector<uint16_t> to_16bit(const std::vector<float>& v, DType dtype) {
  std::vector<uint16_t> out(v.size());
  convert_from_f32(v.data(), dtype, out.data(), v.size());
  return out;
}
inline std::vector<float> from_16bit(const std::vector<uint16_t>& v, DType dtype) {
  std::vector<float> out(v.size());
  convert_to_f32(v.data(), dtype, out.data(), v.size());
  return out;
}

// |a - b| <= atol + rtol |b| everywhere, and no NaN; the first failure is
// reported with its index.
inline ::testing::AssertionResult all_near(const std::vector<float>& got,
                                           const std::vector<float>& want, float atol, float rtol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const float tol = atol + rtol * std::abs(want[i]);
    if (!(std::abs(got[i] - want[i]) <= tol))
      return ::testing::AssertionFailure() << "at " << i << ": got " << got[i] << ", want "
                                           << want[i] << " (tolerance " << tol << ")";
  }
  return ::testing::AssertionSuccess();
}

// Greedy ids of GPU and CPU from logits within `tol` of each other: the
// GPU's pick may differ only where the CPU's own choice does not lead it by
// more than the tolerance (a near-tie that rounding can flip).
inline ::testing::AssertionResult ids_agree(const std::vector<float>& cpu_logits, size_t vocab,
                                            const std::vector<int>& want,
                                            const std::vector<int>& got, float tol) {
  if (want.size() != got.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] == want[i]) continue;
    const float lead =
        cpu_logits[i * vocab + size_t(want[i])] - cpu_logits[i * vocab + size_t(got[i])];
    if (lead > tol)
      return ::testing::AssertionFailure()
             << "row " << i << ": the CPU's " << want[i] << " leads the GPU's " << got[i] << " by "
             << lead << " (tolerance " << tol << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace troupe::test
