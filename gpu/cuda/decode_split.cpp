#include "gpu/cuda/decode_split.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace troupe::cu {

namespace {

int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}

int round_up(int a, int b) {
  return ceil_div(a, b) * b;
}

}  // namespace

DecodeSplit plan_decode_split(const DecodeSplitInputs& in) {
  if (in.sequences < 1 || in.kv_heads < 1 || in.max_context < 1 || in.sm_count < 1)
    throw std::invalid_argument(
        "decode split needs positive sequences, KV heads, context and multiprocessors (got " +
        std::to_string(in.sequences) + ", " + std::to_string(in.kv_heads) + ", " +
        std::to_string(in.max_context) + ", " + std::to_string(in.sm_count) + ")");
  DecodeSplit s;
  if (in.deterministic) {
    s.partition_tokens = kFixedPartitionTokens;
  } else {
    const long base = long(in.sequences) * in.kv_heads;
    const int target = decode_target_blocks(in.sm_count);
    int parts = 1;
    if (base < target && in.max_context > kMinPartitionTokens)
      parts =
          std::min(int(ceil_div(target, int(base))), ceil_div(in.max_context, kMinPartitionTokens));
    s.partition_tokens = round_up(ceil_div(in.max_context, parts), kDecodeChunk);
  }
  s.partitions = ceil_div(in.max_context, s.partition_tokens);
  return s;
}

}  // namespace troupe::cu
