#pragma once
// Running a test's kernels under every instruction set this CPU has.
#include <vector>

#include "gpu/cpu/gemm.h"

namespace troupe::test {

// Puts the best instruction set back when a test is done forcing others.
struct IsaGuard {
  IsaGuard() = default;
  IsaGuard(const IsaGuard&) = delete;
  IsaGuard& operator=(const IsaGuard&) = delete;
  ~IsaGuard() { force_isa(best_isa()); }
};

// Every instruction set this CPU runs, Scalar first.
inline std::vector<Isa> supported_isas() {
  std::vector<Isa> out{Isa::Scalar};
  if (int(best_isa()) >= int(Isa::Avx2)) out.push_back(Isa::Avx2);
  if (best_isa() >= Isa::Avx512) out.push_back(Isa::Avx512);
  if (best_isa() >= Isa::Avx512Bf16) out.push_back(Isa::Avx512Bf16);
  return out;
}

// The vector kernels' builds (Scalar runs the AVX2 ones where a kernel has
// no scalar form).
inline std::vector<Isa> vector_isas() {
  std::vector<Isa> out{Isa::Avx2};
  if (best_isa() >= Isa::Avx512) out.push_back(Isa::Avx512);
  return out;
}

}  // namespace troupe::test
