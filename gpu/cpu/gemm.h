#pragma once
// y = x W^T over packed weights. Every output element is the same sequential
// FMA chain over k whatever the ISA, batch size or thread split (see
// packed_matrix.h), so the scalar reference matches the SIMD kernels exactly.
// bf16 weights take the chain of bf16 pair products (packed_matrix.h): one
// vdpbf16ps a pair with AVX512_BF16, emulated in f32 FMAs elsewhere.
#include "gpu/cpu/packed_matrix.h"
#include "gpu/cpu/thread_pool.h"

namespace troupe {

// Avx512Bf16: Avx512 with AVX512_BF16, used only where the instruction gives
// what its emulation gives (checked once at start-up).
enum class Isa { Scalar, Avx2, Avx512, Avx512Bf16 };
const char* isa_name(Isa isa);
Isa best_isa();           // what this CPU supports
Isa active_isa();         // what the kernels use now (best_isa() unless forced)
void force_isa(Isa isa);  // for tests and benchmarks; throws if unsupported
// Whether integer products (PackedMatrix::int8) use AVX512_VNNI's vpdpbusd
// now: where the CPU has it, at its best ISA; else an exact emulation.
bool uses_vnni();

// Rows m < M of x (row stride ldx) times panels [p0, p1) of w, written to the
// matching columns of y (row stride ldy). Columns past w.rows() are not written.
// A matrix cut into pieces of k (PackedMatrix::set_pieces) sums its pieces'
// chains in order, or with piece_stride > 0 writes piece p at y + p *
// piece_stride. pack_tag: see detail::GemmFn (0: no reuse).
void gemm_panels(const float* x, int M, int ldx, const PackedMatrix& w, int p0, int p1, float* y,
                 int ldy, uint64_t pack_tag = 0, size_t piece_stride = 0);
void gemm_panels_scalar(const float* x, int M, int ldx, const PackedMatrix& w, int p0, int p1,
                        float* y, int ldy, size_t piece_stride = 0);

// The whole product, split over the pool's threads by panels.
void matmul(ThreadPool& pool, const float* x, int M, int ldx, const PackedMatrix& w, float* y,
            int ldy, size_t piece_stride = 0);

}  // namespace troupe
