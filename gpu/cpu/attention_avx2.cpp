// The attention tile kernels on 8-lane vectors (the baseline ISA).
#include <immintrin.h>

#include "gpu/cpu/attention_types.h"

namespace troupe::kernels {
namespace {

#include "gpu/cpu/attention_kernel.inl"

template <class T>
struct Avx2 {
  static void scores(const HeadTile& t, int hd, float scale, const PagedKv& kv, size_t head_off,
                     float* scratch) {
    // 2 queries x 4 keys = 8 accumulators of 16 ymm registers.
    scores_tile<Ymm, 2, T>(t, hd, scale, kv, head_off, scratch);
  }
  static void values(const HeadTile& t, int hd, const PagedKv& kv, size_t head_off) {
    // 2 queries x 32 elements = 8 accumulators.
    values_tile<Ymm, 2, 4, T>(t, hd, kv, head_off);
  }
};

}  // namespace

namespace detail {
TileFns attention_avx2(KvType type) {
  return tile_fns_for<Avx2>(type);
}
}  // namespace detail
}  // namespace troupe::kernels
