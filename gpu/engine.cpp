#include "gpu/engine.h"

namespace troupe {

Engine::Engine(std::shared_ptr<const Model> model, EngineOptions o)
    : model_(std::move(model)),
      cache_(model_->make_cache(o.block_tokens, o.blocks)),
      pool_(o.threads) {}

std::vector<int> Engine::step(const std::vector<EngineItem>& items) {
  std::vector<StepInput> inputs;
  inputs.reserve(items.size());
  for (const auto& it : items) inputs.push_back({&seqs_[it.seq].cache, it.tokens, it.sample});
  const size_t vocab = size_t(model_->config().vocab_size);
  if (logits_.size() < items.size() * vocab) logits_.resize(items.size() * vocab);
  model_->forward(inputs, cache_, pool_, ws_, logits_.data());
  std::vector<int> out(items.size(), -1);
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].sample) continue;
    Seq& s = seqs_[items[i].seq];
    if (!s.sampler) {
      s.sampler = Sampler::resumed(items[i].sampling, uint64_t(items[i].generated));
    }
    out[i] = s.sampler->sample({logits_.data() + i * vocab, vocab});
  }
  return out;
}

void Engine::release(uint64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  cache_.release(it->second.cache);
  seqs_.erase(it);
}

}  // namespace troupe
