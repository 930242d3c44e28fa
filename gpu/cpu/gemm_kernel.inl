// The GEMM micro-kernel, written once over a vector-traits type V and
// compiled per ISA (gemm_avx2.cpp, gemm_avx512.cpp, gemm_avx512_bf16.cpp).
// Include inside an anonymous namespace.
//
// V provides: vec, kLanes, zero(), load(const float*), load_f16(const
// uint16_t*), set1(float), fma(a, b, c), add(a, b), mul(a, b),
// store, for quantized panels load_i8 and load_u4 (kLanes bytes as f32), and for bf16 weights (see
// packed_matrix.h) the kernel shape kPairRows x kPairPanels it wants, odd_half / even_half (a
// pair's halves as f32) and kNativeBf16: whether it has dot_pair(acc, x, w), the pair instruction.
//
// A k step is one element of k for f32 and f16 weights, one pair for bf16
// (32 bits a lane: the weights load as f32 vectors would, and x, packed into
// pairs by pack_pairs, broadcasts as an f32 would).

#ifndef TROUPE_PREFETCH_BYTES
#define TROUPE_PREFETCH_BYTES 2048
#endif
constexpr size_t kPrefetchBytes = TROUPE_PREFETCH_BYTES;

// Bytes of one weight lane in one k step.
template <DType WT>
constexpr size_t step_bytes() {
  return WT == DType::F16 ? 2 : 4;
}

// Weights of one k step as f32 (f16: widened; bf16: the raw pairs).
template <class V, DType WT>
inline typename V::vec load_w(const void* base, size_t index) {
  if constexpr (WT == DType::F16) {
    return V::load_f16(static_cast<const uint16_t*>(base) + index);
  } else {
    return V::load(static_cast<const float*>(base) + index);
  }
}

// One k step of one output vector's chain. A bf16 pair without the
// instruction: acc + x.odd * w.odd, then + x.even * w.even, vdpbf16ps's order
// and roundings in f32 FMAs (the products of two bf16 values are exact).
template <class V, DType WT>
inline typename V::vec step(typename V::vec acc, typename V::vec x, typename V::vec w) {
  if constexpr (WT == DType::BF16 && V::kNativeBf16) {
    return V::dot_pair(acc, x, w);
  } else if constexpr (WT == DType::BF16) {
    acc = V::fma(V::odd_half(x), V::odd_half(w), acc);
    return V::fma(V::even_half(x), V::even_half(w), acc);
  } else {
    return V::fma(x, w, acc);
  }
}

// R rows of x times NP consecutive panels (each K rows of kPanel weights),
// over k in [k0, k1). Element (m, k) of x is x[m * sm + k * sk], which serves
// both x as given (sm = ldx, sk = 1) and x packed by row block (sm = 1,
// sk = rows). The chains start from zero, or with `from` (row stride ldf)
// continue from exact f32 partial sums of earlier k blocks, so that blocked
// chains equal one unblocked chain. The result is stored to y, or with `add`
// added to what y holds (the next piece of a sum over pieces). `cuts` (n_cuts
// positions inside (k0, k1)) start new pieces within the call: each piece's
// chain starts from zero and is added to the sum of those before it in
// registers (with `add`, starting from y's), as a call per piece adding into
// y would.
template <class V, DType WT, int R, int NP>
void micro_kernel(const float* x, size_t sm, size_t sk, const void* panels, int K, int k0, int k1,
                  const float* from, int ldf, float* y, int ldy, int valid_cols, bool add,
                  bool prefetch, const int* cuts = nullptr, int n_cuts = 0) {
  constexpr int VPP = kPanel / V::kLanes;  // vectors per panel
  constexpr int NV = NP * VPP;
  constexpr int width = NP * kPanel;
  typename V::vec acc[R][NV];
  alignas(64) float tmp[width];
  // Rows of a tile (row stride ld) into vectors; columns past valid_cols as 0.
  auto load_tile = [&](const float* t, int ld, typename V::vec(&out)[R][NV]) {
    if (valid_cols >= width) {
#pragma GCC unroll 16
      for (int m = 0; m < R; ++m)
#pragma GCC unroll 16
        for (int j = 0; j < NV; ++j)
          out[m][j] = V::load(t + size_t(m) * size_t(ld) + size_t(j) * V::kLanes);
    } else {
      for (int m = 0; m < R; ++m) {
        for (int c = 0; c < width; ++c)
          tmp[c] = c < valid_cols ? t[size_t(m) * size_t(ld) + size_t(c)] : 0.0f;
        for (int j = 0; j < NV; ++j) out[m][j] = V::load(tmp + j * V::kLanes);
      }
    }
  };
  if (!from) {
#pragma GCC unroll 16
    for (int m = 0; m < R; ++m)
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j) acc[m][j] = V::zero();
  } else {
    load_tile(from, ldf, acc);
  }
  const size_t panel_stride = size_t(K) * kPanel;
  // The pieces before the current one: with `add` and cuts, y's sum first
  // (without cuts, y is added at the end, which keeps these registers free).
  const bool sum_from_y = add && n_cuts > 0;
  typename V::vec sum[R][NV];
  if (sum_from_y) {
    load_tile(y, ldy, sum);
  } else {
#pragma GCC unroll 16
    for (int m = 0; m < R; ++m)
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j) sum[m][j] = V::zero();
  }
  for (int seg = 0; seg <= n_cuts; ++seg) {
    const int kb = seg == 0 ? k0 : cuts[seg - 1], ke = seg == n_cuts ? k1 : cuts[seg];
    if (seg > 0) {
#pragma GCC unroll 16
      for (int m = 0; m < R; ++m)
#pragma GCC unroll 16
        for (int j = 0; j < NV; ++j) {
          sum[m][j] = seg == 1 && !sum_from_y ? acc[m][j] : V::add(sum[m][j], acc[m][j]);
          acc[m][j] = V::zero();
        }
    }
    for (int k = kb; k < ke; ++k) {
      typename V::vec w[NV];
#pragma GCC unroll 16
      for (int p = 0; p < NP; ++p)
#pragma GCC unroll 16
        for (int v = 0; v < VPP; ++v)
          w[p * VPP + v] = load_w<V, WT>(
              panels, size_t(p) * panel_stride + size_t(k) * kPanel + size_t(v) * V::kLanes);
      if constexpr (kPrefetchBytes > 0) {
        // The first pass over a block of weights streams it from DRAM: run
        // ahead of the hardware prefetcher, which tracks only a few streams
        // per page and falls behind at decode batch sizes. Later row blocks
        // find the block in L1 and skip this.
        constexpr size_t esz = step_bytes<WT>();
        if (prefetch && (size_t(k) * kPanel * esz) % 64 == 0)
#pragma GCC unroll 16
          for (int p = 0; p < NP; ++p)
            _mm_prefetch(static_cast<const char*>(panels) +
                             (size_t(p) * panel_stride + size_t(k) * kPanel) * esz + kPrefetchBytes,
                         _MM_HINT_T0);
      }
      const float* xk = x + size_t(k) * sk;
#pragma GCC unroll 16
      for (int m = 0; m < R; ++m) {
        const typename V::vec xb = V::set1(xk[size_t(m) * sm]);
#pragma GCC unroll 16
        for (int j = 0; j < NV; ++j) acc[m][j] = step<V, WT>(acc[m][j], xb, w[j]);
      }
    }
  }
  if (n_cuts > 0)
#pragma GCC unroll 16
    for (int m = 0; m < R; ++m)
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j) acc[m][j] = V::add(sum[m][j], acc[m][j]);
  if (add && !sum_from_y) {
    typename V::vec prev[R][NV];
    load_tile(y, ldy, prev);
#pragma GCC unroll 16
    for (int m = 0; m < R; ++m)
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j) acc[m][j] = V::add(prev[m][j], acc[m][j]);
  }
  if (valid_cols >= width) {
#pragma GCC unroll 16
    for (int m = 0; m < R; ++m)
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j)
        V::store(y + size_t(m) * size_t(ldy) + size_t(j) * V::kLanes, acc[m][j]);
  } else {
    for (int m = 0; m < R; ++m) {
      for (int j = 0; j < NV; ++j) V::store(tmp + j * V::kLanes, acc[m][j]);
      for (int c = 0; c < valid_cols; ++c) y[size_t(m) * size_t(ldy) + size_t(c)] = tmp[c];
    }
  }
}

// Calls the kernel instantiated for exactly `rows` (1..R) rows.
template <class V, DType WT, int R, int NP>
void rows_kernel(int rows, const float* x, size_t sm, size_t sk, const void* panels, int K, int k0,
                 int k1, const float* from, int ldf, float* y, int ldy, int valid_cols, bool add,
                 bool prefetch, const int* cuts = nullptr, int n_cuts = 0) {
  if constexpr (R > 0) {
    if (rows == R)
      micro_kernel<V, WT, R, NP>(x, sm, sk, panels, K, k0, k1, from, ldf, y, ldy, valid_cols, add,
                                 prefetch, cuts, n_cuts);
    else
      rows_kernel<V, WT, R - 1, NP>(rows, x, sm, sk, panels, K, k0, k1, from, ldf, y, ldy,
                                    valid_cols, add, prefetch, cuts, n_cuts);
  }
}

template <DType WT>
inline const void* panel_ptr(const PanelsRef& w, int p) {
  return static_cast<const char*>(w.data) + size_t(p) * size_t(w.cols) * kPanel * step_bytes<WT>();
}

// A per-thread scratch buffer for packed rows of x, reused across calls.
struct PackBuffer {
  float* data = nullptr;
  size_t capacity = 0;
  ~PackBuffer() { std::free(data); }
  float* get(size_t n) {
    if (n > capacity) {
      std::free(data);
      data = static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64));
      if (!data) std::abort();
      capacity = n;
    }
    return data;
  }
};

// Row block b of x (rows [b*MR, b*MR + rows)) becomes K groups of `rows`
// consecutive values, so the kernel's broadcasts read one sequential stream.
template <int MR>
const float* pack_rows(const float* x, int M, int ldx, int K, uint64_t tag) {
  static thread_local PackBuffer buffer;
  static thread_local uint64_t packed_tag = 0;
  if (tag != 0 && tag == packed_tag) return buffer.data;
  packed_tag = tag;
  const int blocks = (M + MR - 1) / MR;
  float* xp = buffer.get(size_t(blocks) * MR * size_t(K));
  for (int b = 0; b < blocks; ++b) {
    const int rows = M - b * MR < MR ? M - b * MR : MR;
    float* dst = xp + size_t(b) * MR * size_t(K);
    const float* src = x + size_t(b * MR) * size_t(ldx);
    // Sequential writes; the reads walk `rows` streams in step.
    for (int k = 0; k < K; ++k)
      for (int m = 0; m < rows; ++m) *dst++ = src[size_t(m) * size_t(ldx) + size_t(k)];
  }
  return xp;
}

// x for bf16 weights: rows rounded to bf16 (bf16_for_product) and paired
// within each piece as the weights are (packed_matrix.h), the pair of
// elements k, k + 1 as one 32-bit word (k in the low half): row m's step s
// at xp[m * w.cols + s]. Rows stay whole (the kernel's broadcasts read
// `rows` streams) so that the conversion is one vectorised pass over x.
const float* pack_pairs(const float* x, int M, int ldx, const PanelsRef& w, uint64_t tag) {
  static thread_local PackBuffer buffer;
  static thread_local uint64_t packed_tag = 0;
  if (tag != 0 && tag == packed_tag) return buffer.data;
  packed_tag = tag;
  const int pieces = w.pieces > 0 ? w.pieces : 1;
  float* xp = buffer.get(size_t(M) * size_t(w.cols));
  for (int m = 0; m < M; ++m) {
    const float* src = x + size_t(m) * size_t(ldx);
    float* dst = xp + size_t(m) * size_t(w.cols);  // words, as the kernel reads them
    for (int p = 0; p < pieces; ++p) {
      const int kb = w.x_piece_k ? w.x_piece_k[p] : 0;
      const int ke = w.x_piece_k ? w.x_piece_k[p + 1] : w.x_cols;
      const int pairs = (ke - kb) / 2;
      const float* r = src + kb;
      for (int j = 0; j < pairs; ++j)
        dst[j] = __builtin_bit_cast(float, uint32_t(bf16_for_product(r[2 * j])) |
                                               uint32_t(bf16_for_product(r[2 * j + 1])) << 16);
      dst += pairs;
      if ((ke - kb) % 2)  // the odd half is zero
        *dst++ = __builtin_bit_cast(float, uint32_t(bf16_for_product(r[2 * pairs])));
    }
  }
  return xp;
}

// Rows [k0, k1) of NP panels of f16 weights, widened to f32 into dst
// (panel p at dst + p * (k1 - k0) * kPanel). Widening is exact, so the f32
// kernel over dst computes the same chains as the f16 kernel would.
template <class V, DType WT, int NP>
void widen_block(const void* panels, int K, int k0, int k1, float* dst) {
  constexpr int VPP = kPanel / V::kLanes;
  const size_t panel_stride = size_t(K) * kPanel;
  for (int p = 0; p < NP; ++p)
    for (int k = k0; k < k1; ++k)
#pragma GCC unroll 4
      for (int v = 0; v < VPP; ++v, dst += V::kLanes)
        V::store(dst, load_w<V, WT>(panels, size_t(p) * panel_stride + size_t(k) * kPanel +
                                                size_t(v) * V::kLanes));
}

// Steps [s0, s1) of NP panels of bf16 pairs split into f32 rows, for CPUs
// without the pair instruction: step s becomes row 2(s - s0), its odd half,
// then row 2(s - s0) + 1, its even half (the emulation's order), so that the
// f32 kernel over dst with x split alike (split_pairs_x) computes the same
// chains as step(). Panel p at dst + p * 2 * (s1 - s0) * kPanel.
template <class V, int NP>
void split_pairs_block(const void* panels, int S, int s0, int s1, float* dst) {
  constexpr int VPP = kPanel / V::kLanes;
  const size_t panel_stride = size_t(S) * kPanel;
  for (int p = 0; p < NP; ++p)
    for (int s = s0; s < s1; ++s, dst += 2 * kPanel)
#pragma GCC unroll 4
      for (int v = 0; v < VPP; ++v) {
        const typename V::vec w = load_w<V, DType::BF16>(
            panels, size_t(p) * panel_stride + size_t(s) * kPanel + size_t(v) * V::kLanes);
        V::store(dst + v * V::kLanes, V::odd_half(w));
        V::store(dst + kPanel + v * V::kLanes, V::even_half(w));
      }
}

// x packed by pack_pairs (M rows of S words), split as split_pairs_block
// splits the weights: row m's step s at xe[m * 2S + 2s] (odd) and + 1 (even).
const float* split_pairs_x(const float* xp, int M, int S, uint64_t tag) {
  static thread_local PackBuffer buffer;
  static thread_local uint64_t packed_tag = 0;
  if (tag != 0 && tag == packed_tag) return buffer.data;
  packed_tag = tag;
  float* xe = buffer.get(size_t(M) * 2 * size_t(S));
  for (size_t i = 0; i < size_t(M) * size_t(S); ++i) {
    const uint32_t word = __builtin_bit_cast(uint32_t, xp[i]);
    xe[2 * i] = __builtin_bit_cast(float, word & 0xffff0000u);
    xe[2 * i + 1] = __builtin_bit_cast(float, word << 16);
  }
  return xe;
}

// One thread's widened block of NP panels x KB rows.
template <int NP, int KB>
float* widen_buffer() {
  alignas(64) static thread_local float block[NP * KB * kPanel];
  return block;
}

// K is processed in blocks of KB while every row block of x passes over a
// panel group's block. Weights read as they are take large blocks (512 k
// steps: 128 KiB of a 4-panel group, in L2): the kernel is bound by its
// multiply-adds, so what costs is each block's round trip of the partial
// sums through y, and the x rows of a block stay in L2 up to a few hundred
// rows (measured with bench_kernels and troupe bench: 128 -> 512 gave 8-9%
// on f32 and bf16 products of 256 rows, 7% on 110m's 512-token prefill).
// Widened weights take blocks that stay in L1. With many row blocks (prefill),
// f16 weights are widened once per block rather than once per row block:
// widening costs two vector ops per load on the FMA ports, a quarter of the
// kernel's throughput. With few, writing the widened block costs more than
// it saves (measured with bench_kernels: the break-even is near 4 blocks).
constexpr int kWidenRowBlocks = 4;

// Whether a bf16 product of M rows splits its pairs into f32 per k block
// (split_pairs_block): on CPUs without the pair instruction, with as many row
// blocks as make widening f16 worth it.
template <class V, int MR>
bool splits_pairs(int M) {
  return !V::kNativeBf16 && M >= kWidenRowBlocks * MR;
}

// Up to this many rows a kernel keeps a sum over pieces in registers next to
// the accumulators (twice the registers); more would spill.
constexpr int kPiecesInRegisters = 3;

// Where the pieces of a product go (see PanelsRef::piece_k): with stride 0
// their chains are summed into y in piece order, else piece p's chain is
// stored at y + p * stride. A piece's chain that spans several k blocks
// keeps its partial sums in y when nothing else is there yet, otherwise in
// a scratch tile of its own.
struct PieceOut {
  float* y;
  int ldy;
  size_t stride;
  float* scratch;  // rows x panel-group width
  int ld_scratch;
  float* out(int p) const { return y + size_t(p) * stride; }
  bool adds(int p) const { return stride == 0 && p > 0; }
};

inline int piece_begin(const PanelsRef& w, int p) {
  return w.pieces > 0 ? w.piece_k[p] : 0;
}
inline int piece_end(const PanelsRef& w, int p) {
  return w.pieces > 0 ? w.piece_k[p + 1] : w.cols;
}

// One row block over k block [k0, k1) of piece p, the block's weights at
// `panels` (K rows each, of which [wk0, wk0 + span) are this block's: k1 - k0,
// or twice that for bf16 pairs split into f32 rows).
template <class V, DType WT, int MR, int NP>
void piece_block(int rows, const float* xb, size_t sm, size_t sk, const void* panels, int K,
                 int wk0, int span, int k0, int k1, int p, const PanelsRef& w, const PieceOut& o,
                 int m0, int valid, bool prefetch) {
  const bool first = k0 == piece_begin(w, p), last = k1 == piece_end(w, p);
  float* dst = o.out(p) + size_t(m0) * size_t(o.ldy);
  // Partial sums of this piece: in its output unless that holds earlier pieces.
  float* part = o.adds(p) ? o.scratch + size_t(m0) * size_t(o.ld_scratch) : dst;
  const int ldp = o.adds(p) ? o.ld_scratch : o.ldy;
  rows_kernel<V, WT, MR, NP>(rows, xb, sm, sk, panels, K, wk0, wk0 + span, first ? nullptr : part,
                             ldp, last ? dst : part, last ? o.ldy : ldp, valid, last && o.adds(p),
                             prefetch);
}

// Pieces of at most this many k steps on average (a head's 64 columns) are
// summed in registers when there are many rows: a call per piece costs its
// start and end, a quarter of 32 steps' work (measured with bench_kernels:
// 768 x 768 in 12 pieces, +10-18% for bf16, +5% for f32), while for longer
// pieces the 3-row kernel's lower reuse costs more than that saves (768 x
// 2048 in 12 pieces, -4% bf16 and -9% f32).
constexpr int kShortPieceSteps = 64;

// A sum over pieces (y = p0 + p1 + ..., in order) of many rows, packed (xp:
// pack_pairs rows, or pack_rows blocks), each piece's chain in registers
// beside the running sum: groups of kPiecesInRegisters rows, over runs of
// whole pieces of up to KB k steps (a longer piece is a run of its own); a
// run after the first starts from the sum in y. Small pieces (a head's
// columns) would otherwise cost a round trip of the tile through y each.
template <class V, DType WT, int MR, int NP, int KB>
void pieces_in_registers(int M, const float* xp, const PanelsRef& w, const void* panels, int valid,
                         const PieceOut& o) {
  constexpr int RR = kPiecesInRegisters;
  const int K = w.cols;
  for (int pa = 0, pb; pa < w.pieces; pa = pb) {
    pb = pa + 1;
    while (pb < w.pieces && piece_end(w, pb) - piece_begin(w, pa) <= KB) ++pb;
    const int k0 = piece_begin(w, pa), k1 = piece_end(w, pb - 1);
    for (int m0 = 0; m0 < M; m0 += RR) {
      const int rows = M - m0 < RR ? M - m0 : RR;
      // bf16: rows of pairs; otherwise the MR-row block holding m0 (m0 is a
      // multiple of RR, which divides MR), k-major.
      const int block = m0 / MR * MR, in_block = M - block < MR ? M - block : MR;
      const float* xr = WT == DType::BF16 ? xp + size_t(m0) * size_t(K)
                                          : xp + size_t(block) * size_t(K) + size_t(m0 - block);
      const size_t sm = WT == DType::BF16 ? size_t(K) : 1;
      const size_t sk = WT == DType::BF16 ? 1 : size_t(in_block);
      rows_kernel<V, WT, RR, NP>(rows, xr, sm, sk, panels, K, k0, k1, nullptr, 0,
                                 o.y + size_t(m0) * size_t(o.ldy), o.ldy, valid, pa > 0, m0 == 0,
                                 w.piece_k + pa + 1, pb - pa - 1);
    }
  }
}

// One row block (M <= MR) reads x at (sm, sk) strides; more read xp, x packed
// (pack_rows, pack_pairs, split_pairs_x).
template <class V, DType WT, int MR, int NP, int KB>
void gemm_panel_group(const float* x, size_t sm, size_t sk, int M, const float* xp,
                      const PanelsRef& w, int pg, PieceOut o) {
  const int K = w.cols;
  const int left = w.rows - pg * kPanel;
  const int valid = left < NP * kPanel ? left : NP * kPanel;
  const void* panels = panel_ptr<WT>(w, pg);
  const int pieces = w.pieces > 0 ? w.pieces : 1;
  o.y += size_t(pg) * kPanel;
  if (M <= MR) {  // one row block: nothing to reuse, no k blocking
    if (pieces > 1 && o.stride == 0 && M <= kPiecesInRegisters) {
      // The pieces' sum in registers: one call, however small the pieces.
      rows_kernel<V, WT, MR, NP>(M, x, sm, sk, panels, K, 0, K, nullptr, 0, o.y, o.ldy, valid,
                                 false, true, w.piece_k + 1, pieces - 1);
      return;
    }
    for (int p = 0; p < pieces; ++p) {
      const int k0 = piece_begin(w, p), k1 = piece_end(w, p);
      rows_kernel<V, WT, MR, NP>(M, x, sm, sk, panels, K, k0, k1, nullptr, 0, o.out(p), o.ldy,
                                 valid, o.adds(p), true);
    }
    return;
  }
  if constexpr (WT == DType::BF16 && !V::kNativeBf16) {
    if (splits_pairs<V, MR>(M)) {
      // Split once per k block instead of in the inner loop, where it costs
      // two vector ops per weight vector on the FMA ports; KB / 2 steps fill
      // KB f32 rows. xp is x split alike (gemm_typed).
      constexpr int KBS = KB / 2;
      float* wide = widen_buffer<NP, KB>();
      for (int p = 0; p < pieces; ++p)
        for (int s0 = piece_begin(w, p); s0 < piece_end(w, p); s0 += KBS) {
          const int s1 = s0 + KBS < piece_end(w, p) ? s0 + KBS : piece_end(w, p);
          split_pairs_block<V, NP>(panels, K, s0, s1, wide);
          for (int m0 = 0; m0 < M; m0 += MR) {
            const int rows = M - m0 < MR ? M - m0 : MR;
            piece_block<V, DType::F32, MR, NP>(
                rows, xp + size_t(m0) * 2 * size_t(K) + 2 * size_t(s0), 2 * size_t(K), 1, wide,
                2 * (s1 - s0), 0, 2 * (s1 - s0), s0, s1, p, w, o, m0, valid, false);
          }
        }
      return;
    }
  }
  if constexpr (WT == DType::F16) {
    if (M >= kWidenRowBlocks * MR) {
      // A widened block takes twice the bytes: half the rows keep it in L1.
      constexpr int KBW = KB / 2;
      float* wide = widen_buffer<NP, KBW>();
      for (int p = 0; p < pieces; ++p)
        for (int k0 = piece_begin(w, p); k0 < piece_end(w, p); k0 += KBW) {
          const int k1 = k0 + KBW < piece_end(w, p) ? k0 + KBW : piece_end(w, p);
          widen_block<V, WT, NP>(panels, K, k0, k1, wide);
          for (int m0 = 0; m0 < M; m0 += MR) {
            const int rows = M - m0 < MR ? M - m0 : MR;
            piece_block<V, DType::F32, MR, NP>(
                rows, xp + size_t(m0) * size_t(K) + size_t(k0) * size_t(rows), 1, size_t(rows),
                wide, k1 - k0, 0, k1 - k0, k0, k1, p, w, o, m0, valid, false);
          }
        }
      return;
    }
  }
  if (pieces > 1 && o.stride == 0 && K <= kShortPieceSteps * pieces) {
    pieces_in_registers<V, WT, MR, NP, KB>(M, xp, w, panels, valid, o);
    return;
  }
  for (int p = 0; p < pieces; ++p)
    for (int k0 = piece_begin(w, p); k0 < piece_end(w, p); k0 += KB) {
      const int k1 = k0 + KB < piece_end(w, p) ? k0 + KB : piece_end(w, p);
      for (int m0 = 0; m0 < M; m0 += MR) {
        const int rows = M - m0 < MR ? M - m0 : MR;
        // x packed by pack_pairs (row-major) or pack_rows (k-major blocks).
        const size_t sm = WT == DType::BF16 ? size_t(K) : 1;
        const size_t sk = WT == DType::BF16 ? 1 : size_t(rows);
        piece_block<V, WT, MR, NP>(rows, xp + size_t(m0) * size_t(K), sm, sk, panels, K, k0,
                                   k1 - k0, k0, k1, p, w, o, m0, valid, m0 == 0);
      }
    }
}

// A per-thread scratch tile for pieces whose chains span several k blocks.
template <int NP>
float* piece_scratch(int M) {
  static thread_local PackBuffer buffer;
  return buffer.get(size_t(M) * NP * kPanel);
}

// Panels [p, p1) in groups of NP, and what is left as one narrower group:
// a task's share of a product that is not a multiple of NP panels costs one
// pass over x, not a pass per panel.
template <class V, DType WT, int MR, int NP, int KB>
void panel_groups(const float* x, size_t sm, size_t sk, int M, const float* xp, const PanelsRef& w,
                  int p, int p1, const PieceOut& o) {
  for (; p + NP <= p1; p += NP) gemm_panel_group<V, WT, MR, NP, KB>(x, sm, sk, M, xp, w, p, o);
  if constexpr (NP > 1)
    if (p < p1) panel_groups<V, WT, MR, NP - 1, KB>(x, sm, sk, M, xp, w, p, p1, o);
}

template <class V, DType WT, int MR, int NP, int KB>
void gemm_typed(const float* x, int M, int ldx, const PanelsRef& w, int p0, int p1, float* y,
                int ldy, uint64_t pack_tag, size_t piece_stride) {
  const float* xp = nullptr;
  size_t sm = size_t(ldx), sk = 1;  // x as given
  if constexpr (WT == DType::BF16) {
    xp = pack_pairs(x, M, ldx, w, pack_tag);
    if (M <= MR) x = xp, sm = size_t(w.cols);
    if (splits_pairs<V, MR>(M)) xp = split_pairs_x(xp, M, w.cols, pack_tag);
  } else if (M > MR) {
    xp = pack_rows<MR>(x, M, ldx, w.cols, pack_tag);
  }
  PieceOut o{y, ldy, piece_stride, nullptr, NP * kPanel};
  if (M > MR && w.pieces > 1 && piece_stride == 0) o.scratch = piece_scratch<NP>(M);
  panel_groups<V, WT, MR, NP, KB>(x, sm, sk, M, xp, w, p0, p1, o);
}

// Weights [in, in + count) of the group of a quantized panel (QuantPanel)
// at gp, as f32: q * s + o, one rounding (q * s is exact, ggml_quants.h),
// the values the products must be of. f(j, v, w) gets vector v of the
// panel's weights at the group's k = in + j; a pair's even k comes before
// its odd k. in and count are even.
template <class V, int BITS, bool OFFSET, class F>
inline void decode_group(const uint8_t* gp, int in, int count, F&& f) {
  constexpr int VPP = kPanel / V::kLanes;
  typename V::vec s[VPP], o[VPP];
  const auto* so = reinterpret_cast<const float*>(gp);
#pragma GCC unroll 4
  for (int v = 0; v < VPP; ++v) {
    s[v] = V::load(so + v * V::kLanes);
    o[v] = OFFSET ? V::load(so + kPanel + v * V::kLanes) : V::zero();
  }
  auto value = [&](typename V::vec q, int v) {
    if constexpr (OFFSET)
      return V::fma(q, s[v], o[v]);
    else
      return V::mul(q, s[v]);
  };
  const uint8_t* qs = gp + kPanel * 4 * (OFFSET ? 2 : 1) + size_t(BITS == 4 ? in / 2 : in) * kPanel;
#pragma GCC unroll 8
  for (int j = 0; j < count; j += 2) {
    if constexpr (BITS == 4) {
#pragma GCC unroll 4
      for (int v = 0; v < VPP; ++v) {
        typename V::vec lo, hi;
        V::load_u4(qs + v * V::kLanes, lo, hi);
        f(j, v, value(lo, v));
        f(j + 1, v, value(hi, v));
      }
      qs += kPanel;
    } else {
#pragma GCC unroll 4
      for (int v = 0; v < VPP; ++v) f(j, v, value(V::load_i8(qs + v * V::kLanes), v));
#pragma GCC unroll 4
      for (int v = 0; v < VPP; ++v) f(j + 1, v, value(V::load_i8(qs + kPanel + v * V::kLanes), v));
      qs += 2 * kPanel;
    }
  }
}

// decode_group for a panel's form; gp: its group holding `in`.
template <class V, class F>
inline void decode(const QuantPanel& qp, const uint8_t* gp, int in, int count, F&& f) {
  if (qp.bits == 4) {
    if (qp.offset)
      decode_group<V, 4, true>(gp, in, count, f);
    else
      decode_group<V, 4, false>(gp, in, count, f);
  } else {
    if (qp.offset)
      decode_group<V, 8, true>(gp, in, count, f);
    else
      decode_group<V, 8, false>(gp, in, count, f);
  }
}

// Panel p's group holding k, and a prefetch of the group kPrefetchBytes
// ahead where k starts it: each panel is a stream from DRAM (see
// micro_kernel).
inline const uint8_t* quant_group(const PanelsRef& w, int p, int k) {
  const QuantPanel& qp = w.quant[p];
  const size_t bytes = qp.group_bytes();
  // Groups are of 16 or 32: a shift, not a division, in the kernels' loops.
  const int g = qp.group == 32 ? k >> 5 : k >> 4;
  const uint8_t* gp = static_cast<const uint8_t*>(w.data) + qp.at + size_t(g) * bytes;
  if constexpr (kPrefetchBytes > 0)
    if ((k & (qp.group - 1)) == 0)
      for (size_t b = 0; b < bytes; b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(gp) + kPrefetchBytes + b, _MM_HINT_T0);
  return gp;
}

// NP quantized panels from pg as f32, laid out as an f32 PackedMatrix's
// panels at dst.
template <class V, int NP>
void dequant_panels(const PanelsRef& w, int pg, float* dst) {
  for (int p = 0; p < NP; ++p) {
    const QuantPanel& qp = w.quant[pg + p];
    float* out = dst + size_t(p) * size_t(w.cols) * kPanel;
    for (int k = 0; k < w.cols; k += qp.group, out += size_t(qp.group) * kPanel)
      decode<V>(qp, quant_group(w, pg + p, k), 0, qp.group, [&](int j, int v, typename V::vec wv) {
        V::store(out + size_t(j) * kPanel + size_t(v) * V::kLanes, wv);
      });
  }
}

// Lane i's weights at an even k and the next odd k as one bf16 pair (the
// even k low), rounded as bf16_for_product rounds: V::pair where the CPU has
// the instruction, else one lane at a time.
template <class V>
inline typename V::vec bf16_pair(typename V::vec even, typename V::vec odd) {
  if constexpr (V::kNativeBf16) {
    return V::pair(even, odd);
  } else {
    alignas(64) float e[V::kLanes], o[V::kLanes];
    V::store(e, even);
    V::store(o, odd);
    for (int l = 0; l < V::kLanes; ++l)
      e[l] = __builtin_bit_cast(
          float, uint32_t(bf16_for_product(e[l])) | uint32_t(bf16_for_product(o[l])) << 16);
    return V::load(e);
  }
}

// NP quantized panels from pg as bf16 pairs, laid out as a bf16
// PackedMatrix's panels (packed_matrix.h) of K / 2 steps at dst.
template <class V, int NP>
void dequant_pairs(const PanelsRef& w, int pg, float* dst) {
  constexpr int VPP = kPanel / V::kLanes;
  const int K = 2 * w.cols;
  typename V::vec even[VPP];
  for (int p = 0; p < NP; ++p) {
    const QuantPanel& qp = w.quant[pg + p];
    float* out = dst + size_t(p) * size_t(w.cols) * kPanel;
    for (int k = 0; k < K; k += qp.group)
      decode<V>(qp, quant_group(w, pg + p, k), 0, qp.group, [&](int j, int v, typename V::vec wv) {
        if (j % 2 == 0) {
          even[v] = wv;
          return;
        }
        V::store(out + size_t(k + j) / 2 * kPanel + size_t(v) * V::kLanes,
                 bf16_pair<V>(even[v], wv));
      });
  }
}

// Quantized k steps handled at a time by quant_micro_kernel: the smallest
// group, so that no step crosses one.
constexpr int kQuantStep = 16;

// A tile's accumulators (R rows of NP panels) into y (row stride ldy), or
// with `add` onto what y holds; columns from valid_cols on are not written.
template <class V, int R, int NP>
inline void store_rows(const typename V::vec (&acc)[R][NP * kPanel / V::kLanes], float* y, int ldy,
                       int valid_cols, bool add) {
  constexpr int NV = NP * kPanel / V::kLanes;
  alignas(64) float tmp[NP * kPanel];
  for (int m = 0; m < R; ++m) {
    float* row = y + size_t(m) * size_t(ldy);
    if (valid_cols >= NP * kPanel) {
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j)
        V::store(row + j * V::kLanes,
                 add ? V::add(V::load(row + j * V::kLanes), acc[m][j]) : acc[m][j]);
    } else {
      for (int j = 0; j < NV; ++j) V::store(tmp + j * V::kLanes, acc[m][j]);
      for (int c = 0; c < valid_cols; ++c) row[c] = add ? row[c] + tmp[c] : tmp[c];
    }
  }
}

// R rows of x (row stride sm) times NP quantized panels from pg over k in
// [k0, k1) (whole steps), the weights dequantized in registers: one row
// block reads each weight once, so writing it out and back
// (dequant_panels, dequant_pairs) would only add work. The weights and each
// output's chain are the other path's: f32 FMAs, or with PAIRS the pair
// instruction over x packed by pack_pairs (word k / 2 of a row). y gets the
// chains, or with `add` y plus them.
template <class V, int R, int NP, bool PAIRS>
void quant_micro_kernel(const float* x, size_t sm, const PanelsRef& w, int pg, int k0, int k1,
                        float* y, int ldy, int valid_cols, bool add) {
  constexpr int VPP = kPanel / V::kLanes;
  constexpr int NV = NP * VPP;
  typename V::vec acc[R][NV], even[VPP];
#pragma GCC unroll 16
  for (int m = 0; m < R; ++m)
#pragma GCC unroll 16
    for (int j = 0; j < NV; ++j) acc[m][j] = V::zero();
  for (int k = k0; k < k1; k += kQuantStep) {
#pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) {
      const QuantPanel& qp = w.quant[pg + p];
      decode<V>(qp, quant_group(w, pg + p, k), k & (qp.group - 1), kQuantStep,
                [&](int j, int v, typename V::vec wv) {
                  if constexpr (PAIRS) {
                    if (j % 2 == 0) {
                      even[v] = wv;
                      return;
                    }
                    const typename V::vec pair = V::pair(even[v], wv);
#pragma GCC unroll 16
                    for (int m = 0; m < R; ++m)
                      acc[m][p * VPP + v] =
                          V::dot_pair(acc[m][p * VPP + v],
                                      V::set1(x[size_t(m) * sm + size_t(k + j) / 2]), pair);
                  } else {
#pragma GCC unroll 16
                    for (int m = 0; m < R; ++m)
                      acc[m][p * VPP + v] = V::fma(V::set1(x[size_t(m) * sm + size_t(k + j)]), wv,
                                                   acc[m][p * VPP + v]);
                  }
                });
    }
  }
  store_rows<V, R, NP>(acc, y, ldy, valid_cols, add);
}

// quant_micro_kernel instantiated for exactly `rows` (1..R) rows.
template <class V, int R, int NP, bool PAIRS>
void quant_rows_kernel(int rows, const float* x, size_t sm, const PanelsRef& w, int pg, int k0,
                       int k1, float* y, int ldy, int valid_cols, bool add) {
  if constexpr (R > 0) {
    if (rows == R)
      quant_micro_kernel<V, R, NP, PAIRS>(x, sm, w, pg, k0, k1, y, ldy, valid_cols, add);
    else
      quant_rows_kernel<V, R - 1, NP, PAIRS>(rows, x, sm, w, pg, k0, k1, y, ldy, valid_cols, add);
  }
}

// NP quantized panels from pg, with f32 products or (PAIRS) bf16 pair
// products. One row block (M <= MR) dequantizes in registers, a piece at a
// time (pairs: with the instruction only). Otherwise the group's panels are
// dequantized whole into a per-thread buffer (4 panels of 2048 k: 512 KiB in
// f32, 256 KiB in pairs; in L2), and the plain kernel runs over it as over
// an f32 or bf16 PackedMatrix's panels, with its k blocking (KB), its split
// of pairs on CPUs without the instruction and its sums of short pieces in
// registers. x: as the plain kernel's one row block reads it (row stride
// sm); xp: its packed rows.
template <class V, int MR, int NP, int KB, bool PAIRS>
void quant_panel_group(const float* x, size_t sm, int M, const float* xp, const PanelsRef& w,
                       int pg, PieceOut o) {
  o.y += size_t(pg) * kPanel;
  if constexpr (!PAIRS || V::kNativeBf16) {
    if (M <= MR) {
      const int left = w.rows - pg * kPanel;
      const int valid = left < NP * kPanel ? left : NP * kPanel;
      constexpr int k_per_step = PAIRS ? 2 : 1;
      for (int p = 0; p < (w.pieces > 0 ? w.pieces : 1); ++p)
        quant_rows_kernel<V, MR, NP, PAIRS>(M, x, sm, w, pg, k_per_step * piece_begin(w, p),
                                            k_per_step * piece_end(w, p), o.out(p), o.ldy, valid,
                                            o.adds(p));
      return;
    }
  }
  static thread_local PackBuffer buffer;
  float* weights = buffer.get(size_t(NP) * size_t(w.cols) * kPanel);
  if constexpr (PAIRS)
    dequant_pairs<V, NP>(w, pg, weights);
  else
    dequant_panels<V, NP>(w, pg, weights);
  PanelsRef plain = w;
  plain.data = weights;
  plain.rows = w.rows - pg * kPanel;
  plain.quant = nullptr;
  gemm_panel_group<V, PAIRS ? DType::BF16 : DType::F32, MR, NP, KB>(x, sm, 1, M, xp, plain, 0, o);
}

template <class V, int MR, int NP, int KB, bool PAIRS>
void quant_panel_groups(const float* x, size_t sm, int M, const float* xp, const PanelsRef& w,
                        int p, int p1, const PieceOut& o) {
  for (; p + NP <= p1; p += NP) quant_panel_group<V, MR, NP, KB, PAIRS>(x, sm, M, xp, w, p, o);
  if constexpr (NP > 1)
    if (p < p1) quant_panel_groups<V, MR, NP - 1, KB, PAIRS>(x, sm, M, xp, w, p, p1, o);
}

template <class V, int MR, int NP, int KB>
void gemm_quant(const float* x, int M, int ldx, const PanelsRef& w, int p0, int p1, float* y,
                int ldy, uint64_t pack_tag, size_t piece_stride) {
  const float* xp = M > MR ? pack_rows<MR>(x, M, ldx, w.cols, pack_tag) : nullptr;
  PieceOut o{y, ldy, piece_stride, nullptr, NP * kPanel};
  if (M > MR && w.pieces > 1 && piece_stride == 0) o.scratch = piece_scratch<NP>(M);
  quant_panel_groups<V, MR, NP, KB, false>(x, size_t(ldx), M, xp, w, p0, p1, o);
}

// Quantized panels with bf16 products (w.dtype BF16, w.cols in pairs): x
// packed as for bf16 panels (gemm_typed).
template <class V, int MR, int NP, int KB>
void gemm_quant_pairs(const float* x, int M, int ldx, const PanelsRef& w, int p0, int p1, float* y,
                      int ldy, uint64_t pack_tag, size_t piece_stride) {
  // Pieces cut no group, so each is of even length and starts at an even
  // k: x pairs up along its whole rows.
  PanelsRef whole = w;
  whole.pieces = 0;
  whole.piece_k = nullptr;
  whole.x_piece_k = nullptr;
  const float* xp = pack_pairs(x, M, ldx, whole, pack_tag);
  const float* xr = xp;  // one row block reads the pairs as they are
  if (splits_pairs<V, MR>(M)) xp = split_pairs_x(xp, M, w.cols, pack_tag);
  PieceOut o{y, ldy, piece_stride, nullptr, NP * kPanel};
  if (M > MR && w.pieces > 1 && piece_stride == 0) o.scratch = piece_scratch<NP>(M);
  quant_panel_groups<V, MR, NP, KB, true>(xr, size_t(w.cols), M, xp, w, p0, p1, o);
}

#include "gpu/cpu/gemm_int8.inl"

// KB: k steps per block for weights the kernel reads as they are (f32,
// native bf16 pairs); KBW: for those widened into a per-thread block first
// (f16, bf16 pairs split on CPUs without the pair instruction).
template <class V, int MR, int NP, int KB, int KBW>
void gemm_dispatch(const float* x, int M, int ldx, const PanelsRef& w, int p0, int p1, float* y,
                   int ldy, uint64_t pack_tag, size_t piece_stride) {
  if (w.int8)
    return gemm_int8<V, kInt8Rows<V>, kInt8Panels<V>>(x, M, ldx, w, p0, p1, y, ldy, pack_tag,
                                                      piece_stride);
  if (w.quant && w.dtype == DType::BF16)
    return gemm_quant_pairs<V, V::kPairRows, V::kPairPanels, KBW>(x, M, ldx, w, p0, p1, y, ldy,
                                                                  pack_tag, piece_stride);
  if (w.quant)
    return gemm_quant<V, MR, NP, KB>(x, M, ldx, w, p0, p1, y, ldy, pack_tag, piece_stride);
  switch (w.dtype) {
    case DType::F32:
      return gemm_typed<V, DType::F32, MR, NP, KB>(x, M, ldx, w, p0, p1, y, ldy, pack_tag,
                                                   piece_stride);
    case DType::BF16:
      return gemm_typed<V, DType::BF16, V::kPairRows, V::kPairPanels, KBW>(
          x, M, ldx, w, p0, p1, y, ldy, pack_tag, piece_stride);
    case DType::F16:
      return gemm_typed<V, DType::F16, MR, NP, KBW>(x, M, ldx, w, p0, p1, y, ldy, pack_tag,
                                                    piece_stride);
  }
}
