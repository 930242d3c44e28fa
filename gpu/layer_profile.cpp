#include "gpu/layer_profile.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "gpu/model.h"

namespace troupe {

LayerProfile profile_layers(const Checkpoint& ckpt, DType dtype, const LayerProfileOptions& o) {
  if (o.batch < 1 || o.context < 1 || o.repeats < 1 || o.threads < 1)
    throw std::invalid_argument("layer profile: batch, context, repeats and threads must be >= 1");
  const ModelConfig& c = ckpt.config;
  const int context = std::min(o.context, c.max_seq_len - o.repeats - 1);
  if (context < 1)
    throw std::invalid_argument("layer profile: the model's context is too short to time decode");
  constexpr int kBlockTokens = 16;
  const int blocks_per_seq = (context + o.repeats + 1 + kBlockTokens - 1) / kBlockTokens;
  ThreadPool pool(o.threads);
  LayerProfile out;
  for (int l = 0; l < c.n_layers; ++l) {
    const Model m(ckpt, dtype, ShardSpec{0, 1, l, l + 1});
    const ShardDims& d = m.dims();
    KvCache cache = m.make_cache(kBlockTokens, o.batch * blocks_per_seq);
    Workspace ws;
    std::vector<SequenceCache> seqs(static_cast<size_t>(o.batch));
    std::vector<float> x_in, x_out, logits(size_t(o.batch) * size_t(d.vocab_stride));
    // One step in which every sequence appends `n` tokens.
    auto step = [&](int n) {
      std::vector<std::vector<int>> tokens(seqs.size());
      std::vector<StepInput> inputs;
      for (size_t s = 0; s < seqs.size(); ++s) {
        for (int i = 0; i < n; ++i)
          tokens[s].push_back(1 + int(s * 31 + size_t(i) * 7) % (c.vocab_size - 1));
        inputs.push_back({&seqs[s], tokens[s], true});
      }
      const size_t rows = seqs.size() * size_t(n) * size_t(c.dim);
      x_in.resize(rows);
      for (size_t i = 0; i < rows; ++i) x_in[i] = 0.1f * std::sin(float(i % 977));
      x_out.resize(rows);
      ShardIo io;
      if (!d.first) io.x_in = x_in.data();
      if (!d.last) io.x_out = x_out.data();
      if (d.last) io.logits = logits.data();
      m.forward_shard(inputs, cache, pool, ws, io);
    };
    step(context);
    step(1);  // warm-up: caches, page faults
    std::vector<double> times;
    for (int r = 0; r < o.repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      step(1);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::nth_element(times.begin(), times.begin() + long(times.size() / 2), times.end());
    out.seconds.push_back(times[times.size() / 2]);
    out.weight_bytes.push_back(m.weight_bytes());
    for (auto& s : seqs) cache.release(s);
  }
  return out;
}

}  // namespace troupe
