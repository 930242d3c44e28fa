#include "gpu/layer_profile.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "gpu/model.h"

namespace troupe {

std::vector<uint64_t> layer_weight_bytes(const ModelConfig& c, DType dtype) {
  const uint64_t esz = dtype_size(dtype), dim = uint64_t(c.dim);
  const uint64_t matrices = 2 * uint64_t(c.q_dim()) * dim + 2 * uint64_t(c.kv_dim()) * dim +
                            3 * dim * uint64_t(c.hidden_dim);
  std::vector<uint64_t> out(size_t(c.n_layers), matrices * esz + 2 * dim * sizeof(float));
  const uint64_t vocab = uint64_t(c.vocab_size) * dim * esz;
  out.front() += vocab;
  out.back() += vocab + dim * sizeof(float);
  return out;
}

LayerProfile profile_layers(const Checkpoint& ckpt, DType dtype, const LayerProfileOptions& o) {
  if (o.batch < 1 || o.context < 1 || o.repeats < 1 || o.threads < 1)
    throw std::invalid_argument("layer profile: batch, context, repeats and threads must be >= 1");
  const ModelConfig& c = ckpt.config;
  const int context = std::min(o.context, c.max_seq_len - o.repeats - 1);
  if (context < 1)
    throw std::invalid_argument("layer profile: the model's context is too short to time decode");
  // The whole model at once, timed layer by layer inside real decode steps:
  // every layer then runs with the others streaming through the caches as
  // they will in service (a layer timed alone sits in cache and looks
  // cheaper than it is). The engine's shards are built after this model is
  // gone, so peak memory does not grow.
  const Model m(ckpt, dtype);
  constexpr int kBlockTokens = 16;
  const int blocks_per_seq = (context + o.repeats + 1 + kBlockTokens - 1) / kBlockTokens;
  KvCache cache = m.make_cache(kBlockTokens, o.batch * blocks_per_seq);
  ThreadPool pool(o.threads);
  Workspace ws;
  std::vector<SequenceCache> seqs(static_cast<size_t>(o.batch));
  for (size_t s = 0; s < seqs.size(); ++s)
    seqs[s].blocks = contiguous_blocks(int(s) * blocks_per_seq, blocks_per_seq);
  std::vector<float> logits(seqs.size() * size_t(m.dims().vocab_stride));
  const size_t L = size_t(c.n_layers);
  // One step in which every sequence appends `n` tokens; returns its per-layer times.
  auto step = [&](int n) {
    std::vector<std::vector<int>> tokens(seqs.size());
    std::vector<StepInput> inputs;
    for (size_t s = 0; s < seqs.size(); ++s) {
      for (int i = 0; i < n; ++i)
        tokens[s].push_back(1 + int(s * 31 + size_t(i) * 7) % (c.vocab_size - 1));
      inputs.push_back({&seqs[s], tokens[s], true});
    }
    std::vector<double> seconds(L, 0.0);
    ShardIo io;
    io.logits = logits.data();
    io.layer_seconds = seconds.data();
    m.forward_shard(inputs, cache, pool, ws, io);
    return seconds;
  };
  step(context);
  step(1);  // warm-up
  std::vector<std::vector<double>> runs;
  for (int r = 0; r < o.repeats; ++r) runs.push_back(step(1));
  LayerProfile out;
  for (size_t l = 0; l < L; ++l) {
    std::vector<double> t;
    for (const auto& r : runs) t.push_back(r[l]);
    std::nth_element(t.begin(), t.begin() + long(t.size() / 2), t.end());
    out.seconds.push_back(t[t.size() / 2]);
  }
  out.weight_bytes = layer_weight_bytes(c, dtype);
  return out;
}

}  // namespace troupe
