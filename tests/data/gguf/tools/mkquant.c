// Writes a GGUF holding, for each block-quantized type, a tensor quantized by
// ggml ("q4_K") and ggml's own dequantization of it ("q4_K.expected", f32).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "ggml.h"
#include "ggml-cpu.h"
#include "gguf.h"
static uint64_t s = 88172645463325252ull;
static double uni(void) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return (s >> 11) * (1.0 / 9007199254740992.0); }
static float normal(void) { double u = uni() + 1e-12, v = uni(); return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v)); }
int main(int argc, char** argv) {
  const int ncols = 512, nrows = 6;
  enum ggml_type types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
                            GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
                            GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_F16, GGML_TYPE_BF16};
  const int nt = sizeof types / sizeof types[0];
  struct ggml_init_params ip = {64 << 20, NULL, false};
  struct ggml_context* ctx = ggml_init(ip);
  struct gguf_context* g = gguf_init_empty();
  gguf_set_val_str(g, "general.architecture", "dequant-test");
  float src[6 * 512], deq[6 * 512];
  for (int t = 0; t < nt; ++t) {
    // Rows of different scales, a few outliers, a row with a constant.
    for (int r = 0; r < nrows; ++r)
      for (int c = 0; c < ncols; ++c) {
        float x = normal() * (r == 0 ? 0.02f : r == 1 ? 1.0f : r == 2 ? 30.0f : 0.3f);
        if (r == 3 && c % 97 == 0) x *= 40;
        if (r == 4) x = fabsf(x) + 0.1f;
        if (r == 5 && c < 64) x = 0.25f;
        src[r * ncols + c] = x;
      }
    ggml_quantize_init(types[t]);
    struct ggml_tensor* q = ggml_new_tensor_2d(ctx, types[t], ncols, nrows);
    ggml_set_name(q, ggml_type_name(types[t]));
    if (types[t] == GGML_TYPE_F16 || types[t] == GGML_TYPE_BF16) {
      const struct ggml_type_traits_cpu* tc = ggml_get_type_traits_cpu(types[t]);
      tc->from_float(src, q->data, nrows * ncols);
    } else {
      ggml_quantize_chunk(types[t], src, q->data, 0, nrows, ncols, NULL);
    }
    ggml_get_type_traits(types[t])->to_float(q->data, deq, nrows * ncols);
    struct ggml_tensor* e = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, ncols, nrows);
    char name[64];
    snprintf(name, sizeof name, "%s.expected", ggml_type_name(types[t]));
    ggml_set_name(e, name);
    memcpy(e->data, deq, sizeof deq);
    gguf_add_tensor(g, q);
    gguf_add_tensor(g, e);
  }
  gguf_write_to_file(g, argv[1], false);
  printf("wrote %s\n", argv[1]);
  return 0;
}
