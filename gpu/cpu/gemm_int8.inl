// Integer products of quantized panels (PanelsRef::int8, packed_matrix.h),
// written once over the vector traits of gemm_kernel.inl and compiled per
// ISA; gemm_kernel.inl includes it for its dispatch.
//
// V provides besides: ivec, izero(), load_q (kLanes * 4 bytes of q),
// low_nibbles / high_nibbles (of each byte), bcast4 (4 bytes of x to every
// 32-bit lane), dot4(acc, u, s) (acc plus, per 32-bit lane, the sum of its
// four unsigned bytes of u times the signed bytes of s: vpdpbusd), sub_i32
// and to_f32.
//
// An output's chain: per group of its piece, in order, with i the exact
// integer sum of q times x's q over the group, d x's scale there and b the
// sum of x's q there: acc = fma(float(i), s * d, acc), then with an offset
// acc = fma(o, d * float(b), acc). The sums are exact and each rounding is
// fixed, so the value is the same for any batch, thread split or ISA.

// x quantized per row (Int8Rows), kept per thread for calls with the same
// pack tag (see detail::GemmFn).
inline Int8Rows quantize_x(const float* x, int M, int ldx, const PanelsRef& w, uint64_t tag) {
  static thread_local PackBuffer buffer;
  static thread_local uint64_t packed_tag = 0;
  static thread_local Int8Rows rows{};
  if (tag != 0 && tag == packed_tag) return rows;
  packed_tag = tag;
  const int K = w.cols;
  const size_t per16 = size_t(M) * size_t(K / 16);
  float* base = buffer.get(2 * per16 + (size_t(M) * size_t(K) + 3) / 4);
  rows = Int8Rows{reinterpret_cast<int8_t*>(base + 2 * per16), base,
                  reinterpret_cast<int32_t*>(base + per16), K};
  for (int m = 0; m < M; ++m)
    quantize_int8_row(x + size_t(m) * size_t(ldx), w.x_piece_k, w.pieces, rows, m);
  return rows;
}

// R rows of x8 from row m0 times NP quantized panels from pg, all of one
// form (q of BITS bits, groups of G, OFFSET), over k in [k0, k1), a piece
// (whole groups), or pieces: `cuts` (n_cuts positions inside (k0, k1))
// start new ones, each piece's chain added to the sum of those before it in
// registers, as a call per piece adding into y would. y gets the chains (or
// their sum).
template <class V, int R, int NP, int BITS, int G, bool OFFSET>
void int8_micro_kernel(const Int8Rows& x8, int m0, const PanelsRef& w, int pg, int k0, int k1,
                       float* y, int ldy, int valid_cols, const int* cuts, int n_cuts) {
  constexpr int VPP = kPanel / V::kLanes;
  constexpr int NV = NP * VPP;
  constexpr size_t kChunk = 64;  // bytes of q per chunk (gemm_types.h)
  constexpr size_t kHead = size_t(kPanel) * (OFFSET ? 2 : 1);  // a[16], b[16]
  constexpr size_t kGroupBytes = kHead + size_t(G) * kPanel * BITS / 8;
  typename V::vec acc[R][NV], sum[R][NV];
  typename V::ivec isum[R][NV];
#pragma GCC unroll 16
  for (int m = 0; m < R; ++m)
#pragma GCC unroll 16
    for (int j = 0; j < NV; ++j) acc[m][j] = sum[m][j] = V::zero();
  const int8_t* xq[R];
  const float* xd[R];
  const int32_t* xs[R];
  for (int m = 0; m < R; ++m) {
    xq[m] = x8.q + size_t(m0 + m) * size_t(x8.K);
    xd[m] = x8.d + size_t(m0 + m) * size_t(x8.K / 16);
    xs[m] = x8.sum + size_t(m0 + m) * size_t(x8.K / 16);
  }
  const uint8_t* base[NP];
  for (int p = 0; p < NP; ++p) base[p] = static_cast<const uint8_t*>(w.data) + w.quant[pg + p].at;
  for (int seg = 0, k = k0; seg <= n_cuts; ++seg) {
    const int ke = seg == n_cuts ? k1 : cuts[seg];
    if (seg > 0) {
#pragma GCC unroll 16
      for (int m = 0; m < R; ++m)
#pragma GCC unroll 16
        for (int j = 0; j < NV; ++j) {
          sum[m][j] = seg == 1 ? acc[m][j] : V::add(sum[m][j], acc[m][j]);
          acc[m][j] = V::zero();
        }
    }
    for (; k < ke; k += G) {
#pragma GCC unroll 16
      for (int m = 0; m < R; ++m)
#pragma GCC unroll 16
        for (int j = 0; j < NV; ++j) isum[m][j] = V::izero();
      const uint8_t *fp[NP], *gps[NP];  // the block's factors, the group
#pragma GCC unroll 8
      for (int p = 0; p < NP; ++p) {
        fp[p] = base[p] + w.quant[pg + p].factors_at(k / G);
        gps[p] = base[p] + w.quant[pg + p].int_group_at(k / G);
        const uint8_t* gp = gps[p];
        if constexpr (kPrefetchBytes > 0)
#pragma GCC unroll 16
          for (size_t b = 0; b < kGroupBytes; b += 64)
            _mm_prefetch(reinterpret_cast<const char*>(gp) + kPrefetchBytes + b, _MM_HINT_T0);
        const uint8_t* qs = gp + kHead;
        if constexpr (BITS == 4) {
#pragma GCC unroll 4
          for (int c = 0; c < G / 8; ++c)
#pragma GCC unroll 4
            for (int v = 0; v < VPP; ++v) {
              const typename V::ivec b = V::load_q(qs + c * kChunk + size_t(v) * V::kLanes * 4);
              const typename V::ivec lo = V::low_nibbles(b), hi = V::high_nibbles(b);
#pragma GCC unroll 16
              for (int m = 0; m < R; ++m) {
                typename V::ivec& s = isum[m][p * VPP + v];
                s = V::dot4(s, lo, V::bcast4(xq[m] + k + 8 * c));
                s = V::dot4(s, hi, V::bcast4(xq[m] + k + 8 * c + 4));
              }
            }
        } else {
#pragma GCC unroll 8
          for (int c = 0; c < G / 4; ++c)
#pragma GCC unroll 4
            for (int v = 0; v < VPP; ++v) {
              const typename V::ivec b = V::load_q(qs + c * kChunk + size_t(v) * V::kLanes * 4);
#pragma GCC unroll 16
              for (int m = 0; m < R; ++m)
                isum[m][p * VPP + v] =
                    V::dot4(isum[m][p * VPP + v], b, V::bcast4(xq[m] + k + 4 * c));
            }
        }
      }
      // The groups end: their integer sums into the chains. s = d * a and
      // o = e * b are exact (ggml_quants.h).
      typename V::vec sv[NV], ov[NV];
#pragma GCC unroll 8
      for (int p = 0; p < NP; ++p)
#pragma GCC unroll 4
        for (int v = 0; v < VPP; ++v) {
          const auto* f16 = reinterpret_cast<const uint16_t*>(fp[p]) + v * V::kLanes;
          sv[p * VPP + v] = V::mul(V::load_i8(gps[p] + v * V::kLanes), V::load_f16(f16));
          if constexpr (OFFSET)
            ov[p * VPP + v] =
                V::mul(V::load_i8(gps[p] + kPanel + v * V::kLanes), V::load_f16(f16 + kPanel));
        }
      const int g16 = k / 16;
#pragma GCC unroll 16
      for (int m = 0; m < R; ++m) {
        const float d = xd[m][g16];
        const int32_t b = G == 32 ? xs[m][g16] + xs[m][g16 + 1] : xs[m][g16];
        const typename V::vec dv = V::set1(d), db = V::set1(d * float(b));
#pragma GCC unroll 16
        for (int j = 0; j < NV; ++j) {
          const typename V::ivec s = isum[m][j];
          // 8-bit q are stored plus 128: take 128 times x's sum back out.
          const typename V::ivec i = BITS == 8 ? V::sub_i32(s, 128 * b) : s;
          acc[m][j] = V::fma(V::to_f32(i), V::mul(sv[j], dv), acc[m][j]);
          if constexpr (OFFSET) acc[m][j] = V::fma(ov[j], db, acc[m][j]);
        }
      }
    }
  }
  if (n_cuts > 0)
#pragma GCC unroll 16
    for (int m = 0; m < R; ++m)
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j) acc[m][j] = V::add(sum[m][j], acc[m][j]);
  store_rows<V, R, NP>(acc, y, ldy, valid_cols, false);
}

// The kernel for R rows and NP panels of one form.
template <class V, int R, int NP>
void int8_form_kernel(const QuantPanel& form, const Int8Rows& x8, int m0, const PanelsRef& w,
                      int pg, int k0, int k1, float* y, int ldy, int valid_cols, const int* cuts,
                      int n_cuts) {
  auto run = [&](auto bits, auto group, auto offset) {
    int8_micro_kernel<V, R, NP, decltype(bits)::value, decltype(group)::value,
                      decltype(offset)::value>(x8, m0, w, pg, k0, k1, y, ldy, valid_cols, cuts,
                                               n_cuts);
  };
  using B4 = std::integral_constant<int, 4>;
  using B8 = std::integral_constant<int, 8>;
  using G16 = std::integral_constant<int, 16>;
  using G32 = std::integral_constant<int, 32>;
  using On = std::true_type;
  using Off = std::false_type;
  const int which = (form.bits == 8 ? 4 : 0) + (form.group == 32 ? 2 : 0) + (form.offset ? 1 : 0);
  switch (which) {
    case 0:
      return run(B4{}, G16{}, Off{});
    case 1:
      return run(B4{}, G16{}, On{});
    case 2:
      return run(B4{}, G32{}, Off{});
    case 3:
      return run(B4{}, G32{}, On{});
    case 4:
      return run(B8{}, G16{}, Off{});
    case 5:
      return run(B8{}, G16{}, On{});
    case 6:
      return run(B8{}, G32{}, Off{});
    default:
      return run(B8{}, G32{}, On{});
  }
}

// R rows times NP panels: in one kernel where the panels share a form,
// else a panel at a time (an output's chain does not depend on its
// neighbours').
template <class V, int R, int NP>
void int8_tile(const Int8Rows& x8, int m0, const PanelsRef& w, int pg, int k0, int k1, float* y,
               int ldy, int valid_cols, const int* cuts, int n_cuts) {
  const QuantPanel& first = w.quant[pg];
  bool same = true;
  for (int p = 1; p < NP; ++p) {
    const QuantPanel& q = w.quant[pg + p];
    same = same && q.bits == first.bits && q.group == first.group && q.offset == first.offset;
  }
  if (same || NP == 1)
    return int8_form_kernel<V, R, NP>(first, x8, m0, w, pg, k0, k1, y, ldy, valid_cols, cuts,
                                      n_cuts);
  for (int p = 0; p < NP && valid_cols > p * kPanel; ++p)
    int8_form_kernel<V, R, 1>(w.quant[pg + p], x8, m0, w, pg + p, k0, k1, y + p * kPanel, ldy,
                              valid_cols - p * kPanel, cuts, n_cuts);
}

// int8_tile instantiated for exactly `rows` (1..R) rows.
template <class V, int R, int NP>
void int8_rows_kernel(int rows, const Int8Rows& x8, int m0, const PanelsRef& w, int pg, int k0,
                      int k1, float* y, int ldy, int valid_cols, const int* cuts = nullptr,
                      int n_cuts = 0) {
  if constexpr (R > 0) {
    if (rows == R)
      int8_tile<V, R, NP>(x8, m0, w, pg, k0, k1, y, ldy, valid_cols, cuts, n_cuts);
    else
      int8_rows_kernel<V, R - 1, NP>(rows, x8, m0, w, pg, k0, k1, y, ldy, valid_cols, cuts, n_cuts);
  }
}

// Panels [p, p1) in groups of NP (what is left as one narrower group), each
// over every row block of MR rows: a group's weights (a few hundred KiB at
// most) stay in L2 across the row blocks. A sum over pieces runs as one
// call with its cuts (a head's piece is only two groups long); pieces
// written apart, a call each.
template <class V, int MR, int NP>
void int8_panel_groups(const Int8Rows& x8, int M, const PanelsRef& w, int p, int p1,
                       const PieceOut& o) {
  const int pieces = w.pieces > 0 ? w.pieces : 1;
  const bool summed = o.stride == 0;
  for (; p + NP <= p1; p += NP) {
    const int left = w.rows - p * kPanel;
    const int valid = left < NP * kPanel ? left : NP * kPanel;
    for (int m0 = 0; m0 < M; m0 += MR) {
      const int rows = M - m0 < MR ? M - m0 : MR;
      const size_t at = size_t(m0) * size_t(o.ldy) + size_t(p) * kPanel;
      if (summed) {
        int8_rows_kernel<V, MR, NP>(rows, x8, m0, w, p, 0, w.cols, o.y + at, o.ldy, valid,
                                    pieces > 1 ? w.piece_k + 1 : nullptr, pieces - 1);
        continue;
      }
      for (int piece = 0; piece < pieces; ++piece)
        int8_rows_kernel<V, MR, NP>(rows, x8, m0, w, p, piece_begin(w, piece), piece_end(w, piece),
                                    o.out(piece) + at, o.ldy, valid);
    }
  }
  if constexpr (NP > 1)
    if (p < p1) int8_panel_groups<V, MR, NP - 1>(x8, M, w, p, p1, o);
}

// Rows x panels of the kernel: an integer sum and an f32 chain per output
// vector, within the vector registers (32 zmm, 16 ymm).
template <class V>
constexpr int kInt8Rows = V::kLanes == 16 ? 4 : 2;
template <class V>
constexpr int kInt8Panels = V::kLanes == 16 ? 2 : 1;

template <class V, int MR, int NP>
void gemm_int8(const float* x, int M, int ldx, const PanelsRef& w, int p0, int p1, float* y,
               int ldy, uint64_t pack_tag, size_t piece_stride) {
  const Int8Rows x8 = quantize_x(x, M, ldx, w, pack_tag);
  int8_panel_groups<V, MR, NP>(x8, M, w, p0, p1, PieceOut{y, ldy, piece_stride, nullptr, 0});
}
