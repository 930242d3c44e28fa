#pragma once
// Device helpers shared by the kernels: element conversions, 16-byte vector
// loads of 8 elements, warp reductions, and the DType -> C++ type dispatch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>

#include "gpu/dtype.h"

namespace troupe::cu {

__device__ __forceinline__ float to_f32(float v) {
  return v;
}
__device__ __forceinline__ float to_f32(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Eight consecutive elements at p (16-byte aligned for 16-bit types, 32 for
// f32) as f32.
template <class T>
__device__ __forceinline__ void load8(const T* p, float (&out)[8]) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = to_f32(e[i]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// exp(a - b) for a <= b, exactly 1 when they are equal (so a merge of one
// partition reproduces the unsplit result bit for bit) and 0 for a = -inf.
__device__ __forceinline__ float exp_diff(float a, float b) {
  if (a == b) return 1.0f;
  if (a == -INFINITY) return 0.0f;
  return expf(a - b);
}

// Calls fn(T{}) with T the C++ element type of `dtype`.
template <class Fn>
void dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32:
      fn(float{});
      return;
    case DType::F16:
      fn(__half{});
      return;
    case DType::BF16:
      fn(__nv_bfloat16{});
      return;
  }
  throw std::invalid_argument("unsupported element type for a CUDA kernel");
}

inline int ceil_div(long a, long b) {
  return int((a + b - 1) / b);
}

}  // namespace troupe::cu
