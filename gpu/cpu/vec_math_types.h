#pragma once
// The per-ISA row kernels of vec_math.inl, as plain function pointers: like
// attention_types.h, what files compiled with wider ISA flags share with the
// baseline without inline library code.

namespace troupe::kernels::detail {

struct RowFns {
  void (*softmax)(float* x, int n);
  void (*silu_mul)(const float* gate, const float* up, float* out, int n);
  void (*gelu_tanh_mul)(const float* gate, const float* up, float* out, int n);
};
RowFns row_fns_avx512();

}  // namespace troupe::kernels::detail
