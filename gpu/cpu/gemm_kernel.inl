// The GEMM micro-kernel, written once over a vector-traits type V and
// compiled per ISA (gemm_avx2.cpp, gemm_avx512.cpp). Include inside an
// anonymous namespace.
//
// V provides: vec, kLanes, zero(), load(const float*), load_bf16(const
// uint16_t*), load_f16(const uint16_t*), set1(float), fma(a, b, c), store.

template <class V, DType WT>
inline typename V::vec load_w(const void* base, size_t index) {
  if constexpr (WT == DType::F32) {
    return V::load(static_cast<const float*>(base) + index);
  } else if constexpr (WT == DType::BF16) {
    return V::load_bf16(static_cast<const uint16_t*>(base) + index);
  } else {
    return V::load_f16(static_cast<const uint16_t*>(base) + index);
  }
}

// MR rows of x times NP consecutive panels, over k in [k0, k1). The first
// k block starts from zero; later blocks continue the chains from y, which
// holds exact f32 partial sums, so the result equals one unblocked chain.
template <class V, DType WT, int MR, int NP>
void micro_kernel(const float* x, int ldx, const void* panels, int K, int k0, int k1, float* y,
                  int ldy, int valid_cols) {
  constexpr int VPP = kPanel / V::kLanes;  // vectors per panel
  constexpr int NV = NP * VPP;
  constexpr int width = NP * kPanel;
  typename V::vec acc[MR][NV];
  alignas(64) float tmp[width];
  if (k0 == 0) {
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j) acc[m][j] = V::zero();
  } else if (valid_cols >= width) {
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j)
        acc[m][j] = V::load(y + size_t(m) * size_t(ldy) + size_t(j) * V::kLanes);
  } else {
    for (int m = 0; m < MR; ++m) {
      for (int c = 0; c < width; ++c) tmp[c] = c < valid_cols ? y[size_t(m) * size_t(ldy) + size_t(c)] : 0.0f;
      for (int j = 0; j < NV; ++j) acc[m][j] = V::load(tmp + j * V::kLanes);
    }
  }
  const size_t panel_stride = size_t(K) * kPanel;
  for (int k = k0; k < k1; ++k) {
    typename V::vec w[NV];
#pragma GCC unroll 16
    for (int p = 0; p < NP; ++p)
#pragma GCC unroll 16
      for (int v = 0; v < VPP; ++v)
        w[p * VPP + v] = load_w<V, WT>(
            panels, size_t(p) * panel_stride + size_t(k) * kPanel + size_t(v) * V::kLanes);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const typename V::vec xb = V::set1(x[size_t(m) * size_t(ldx) + size_t(k)]);
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j) acc[m][j] = V::fma(xb, w[j], acc[m][j]);
    }
  }
  if (valid_cols >= width) {
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j)
        V::store(y + size_t(m) * size_t(ldy) + size_t(j) * V::kLanes, acc[m][j]);
  } else {
    for (int m = 0; m < MR; ++m) {
      for (int j = 0; j < NV; ++j) V::store(tmp + j * V::kLanes, acc[m][j]);
      for (int c = 0; c < valid_cols; ++c) y[size_t(m) * size_t(ldy) + size_t(c)] = tmp[c];
    }
  }
}

template <class V, DType WT, int MR, int NP>
void row_block(const float* x, int M, int ldx, const void* panels, int K, int k0, int k1, float* y,
               int ldy, int valid_cols) {
  int m = 0;
  for (; m + MR <= M; m += MR)
    micro_kernel<V, WT, MR, NP>(x + size_t(m) * size_t(ldx), ldx, panels, K, k0, k1,
                                y + size_t(m) * size_t(ldy), ldy, valid_cols);
  const int rest = M - m;
  if (rest == 0) return;
  // Tail rows: the same per-element chain, fewer rows per call.
  if constexpr (MR > 1)
    row_block<V, WT, MR / 2, NP>(x + size_t(m) * size_t(ldx), rest, ldx, panels, K, k0, k1,
                                 y + size_t(m) * size_t(ldy), ldy, valid_cols);
}

template <DType WT>
inline const void* panel_ptr(const PanelsRef& w, int p) {
  constexpr size_t esz = WT == DType::F32 ? 4 : 2;
  return static_cast<const char*>(w.data) + size_t(p) * size_t(w.cols) * kPanel * esz;
}

// K is processed in blocks of KB so that a panel group's block stays in L1
// while every row block of x passes over it.
template <class V, DType WT, int MR, int NP, int KB>
void gemm_typed(const float* x, int M, int ldx, const PanelsRef& w, int p0, int p1, float* y,
                int ldy) {
  const int K = w.cols;
  const int kb = M > MR ? KB : K;  // one row block: nothing to reuse, no blocking
  int p = p0;
  for (; p + NP <= p1; p += NP) {
    const int left = w.rows - p * kPanel;
    const int valid = left < NP * kPanel ? left : NP * kPanel;
    for (int k0 = 0; k0 < K; k0 += kb)
      row_block<V, WT, MR, NP>(x, M, ldx, panel_ptr<WT>(w, p), K, k0, k0 + kb < K ? k0 + kb : K,
                               y + size_t(p) * kPanel, ldy, valid);
  }
  for (; p < p1; ++p) {
    const int left = w.rows - p * kPanel;
    const int valid = left < kPanel ? left : kPanel;
    for (int k0 = 0; k0 < K; k0 += kb)
      row_block<V, WT, MR, 1>(x, M, ldx, panel_ptr<WT>(w, p), K, k0, k0 + kb < K ? k0 + kb : K,
                              y + size_t(p) * kPanel, ldy, valid);
  }
}

template <class V, int MR, int NP, int KB>
void gemm_dispatch(const float* x, int M, int ldx, const PanelsRef& w, int p0, int p1, float* y,
                   int ldy) {
  switch (w.dtype) {
    case DType::F32: return gemm_typed<V, DType::F32, MR, NP, KB>(x, M, ldx, w, p0, p1, y, ldy);
    case DType::BF16: return gemm_typed<V, DType::BF16, MR, NP, KB>(x, M, ldx, w, p0, p1, y, ldy);
    case DType::F16: return gemm_typed<V, DType::F16, MR, NP, KB>(x, M, ldx, w, p0, p1, y, ldy);
  }
}
