#include "gpu/engine.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace troupe {

double EngineStats::bubble_fraction(int stage) const {
  if (wall_s <= 0 || stage < 0 || size_t(stage) >= stages.size()) return 0;
  return std::max(0.0, 1.0 - stages[size_t(stage)].busy_s / wall_s);
}

double EngineStats::comm_share() const {
  double busy = 0, comm = 0;
  for (const auto& s : stages) {
    busy += s.busy_s;
    comm += s.comm_s;
  }
  return busy > 0 ? comm / busy : 0;
}

uint64_t EngineStats::comm_bytes() const {
  uint64_t b = 0;
  for (const auto& s : stages) b += s.comm_bytes;
  return b;
}

EngineStats EngineStats::since(const EngineStats& before) const {
  EngineStats d = *this;
  d.steps -= before.steps;
  d.wall_s -= before.wall_s;
  for (size_t s = 0; s < d.stages.size() && s < before.stages.size(); ++s) {
    d.stages[s].busy_s -= before.stages[s].busy_s;
    d.stages[s].comm_s -= before.stages[s].comm_s;
    d.stages[s].comm_bytes -= before.stages[s].comm_bytes;
  }
  return d;
}

std::vector<int> StepEngine::step(std::vector<StepItem> items) {
  return finish(launch(std::move(items)));
}

std::vector<StepInput> step_inputs(std::span<const StepItem> items,
                                   std::vector<SequenceCache>& caches) {
  caches.resize(items.size());
  std::vector<StepInput> inputs;
  inputs.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    SequenceCache& c = caches[i];
    c.blocks = items[i].blocks;
    c.length = items[i].position;
    inputs.push_back({&c, items[i].tokens, items[i].sample, items[i].wants_prompt_logprobs()});
  }
  return inputs;
}

Engine::Engine(std::shared_ptr<const Model> model, EngineOptions o)
    : model_(std::move(model)),
      options_(o),
      cache_(model_->make_cache(o.block_tokens, o.blocks, o.kv_dtype)),
      pool_(o.threads) {
  samplers_.set_eos_ids(model_->config().eos_ids);
}

std::vector<int> Engine::run(const std::vector<StepItem>& items, int tokens, Result& r) {
  std::vector<SequenceCache> caches;
  const std::vector<StepInput> inputs = step_inputs(items, caches);
  const size_t vocab = size_t(model_->config().vocab_size);
  if (logits_.size() < items.size() * vocab) logits_.resize(items.size() * vocab);
  size_t rows = 0;
  for (const auto& in : inputs) rows += in.all_logits ? in.tokens.size() : 0;
  if (row_logits_.size() < rows * vocab) row_logits_.resize(rows * vocab);
  const auto way = pool_.size() > 1 ? choice_.choose(tokens) : ThreadChoice::Way::Pool;
  const auto t0 = std::chrono::steady_clock::now();
  model_->forward(inputs, cache_, way == ThreadChoice::Way::Pool ? pool_ : serial_, ws_,
                  logits_.data(), rows > 0 ? row_logits_.data() : nullptr);
  pool_.rest();
  choice_.observe(tokens, way,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::vector<int> out(items.size(), -1);
  r.logprobs.assign(items.size(), std::nullopt);
  r.prompt_logprobs.assign(items.size(), {});
  last_logits_.clear();
  size_t first_row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (inputs[i].all_logits) {
      r.prompt_logprobs[i] = prompt_token_logprobs(items[i], [&](int j) {
        return std::span<const float>(row_logits_.data() + (first_row + size_t(j)) * vocab, vocab);
      });
      first_row += items[i].tokens.size();
    }
    if (!items[i].sample) continue;
    const std::span<const float> row{logits_.data() + i * vocab, vocab};
    if (keep_logits_) last_logits_.insert(last_logits_.end(), row.begin(), row.end());
    out[i] = samplers_.sample(items[i], row, &r.logprobs[i]);
  }
  return out;
}

uint64_t Engine::launch(std::vector<StepItem> items, std::function<void()> on_done) {
  if (items.empty()) throw std::invalid_argument("launch: a step needs at least one item");
  const uint64_t ticket = next_ticket_++;
  Result& r = results_[ticket];
  size_t tokens = 0;
  for (const auto& it : items) tokens += it.tokens.size();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    r.ids = run(items, int(tokens), r);
  } catch (...) {
    r.error = std::current_exception();
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  busy_s_ += took;
  ++steps_;
  last_samples_ = {StageSample{0, tokens, took}};
  if (on_done) on_done();
  return ticket;
}

std::vector<int> Engine::finish(uint64_t ticket) {
  auto node = results_.extract(ticket);
  if (node.empty()) throw std::invalid_argument("finish: no step in flight with that ticket");
  if (node.mapped().error) std::rethrow_exception(node.mapped().error);
  last_logprobs_ = std::move(node.mapped().logprobs);
  last_prompt_logprobs_ = std::move(node.mapped().prompt_logprobs);
  return std::move(node.mapped().ids);
}

EngineStats Engine::stats() const {
  EngineStats s;
  s.steps = steps_;
  s.wall_s = busy_s_;  // one device: busy whenever a step is in flight
  s.stages = {StageStats{busy_s_, 0, 0}};
  s.weight_bytes = {model_->weight_bytes()};
  s.streamed_bytes = {model_->weight_bytes_per_step()};
  return s;
}

}  // namespace troupe
