#include "gpu/generate.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "service/stop_rule.h"

namespace troupe {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void validate_request(const ModelConfig& c, const GenerateRequest& req) {
  if (req.prompt.empty()) throw std::invalid_argument("the prompt is empty");
  if (int(req.prompt.size()) > c.max_seq_len)
    throw std::invalid_argument("the prompt has " + std::to_string(req.prompt.size()) +
                                " tokens, more than the model's context of " +
                                std::to_string(c.max_seq_len));
  for (int id : req.prompt)
    if (id < 0 || id >= c.vocab_size)
      throw std::invalid_argument("prompt token id " + std::to_string(id) +
                                  " is outside the vocabulary [0, " + std::to_string(c.vocab_size) +
                                  ")");
  if (req.max_tokens < 1)
    throw std::invalid_argument("max_tokens must be at least 1, got " +
                                std::to_string(req.max_tokens));
  if (req.prefill_chunk < 1) throw std::invalid_argument("prefill_chunk must be at least 1");
}

GenerateResult generate(StepEngine& engine, const ModelConfig& c, const GenerateRequest& req,
                        const std::function<bool(int)>& on_token) {
  validate_request(c, req);
  const int bt = engine.block_tokens();
  const int needed =
      (std::min(c.max_seq_len, int(req.prompt.size()) + req.max_tokens) + bt - 1) / bt;
  if (needed > engine.kv_blocks())
    throw std::invalid_argument("the engine's KV cache holds " +
                                std::to_string(engine.kv_blocks()) +
                                " blocks; this generation needs " + std::to_string(needed));
  const StopRule rule{c.eos_ids, c.max_seq_len};
  constexpr uint64_t kSeq = 1;
  GenerateResult res;
  StepItem it;
  it.seq = kSeq;
  it.sampling = req.sampling;
  it.blocks = contiguous_blocks(0, needed);
  int next = -1;
  try {
    auto t0 = std::chrono::steady_clock::now();
    for (size_t off = 0; off < req.prompt.size(); off += size_t(req.prefill_chunk)) {
      const size_t n = std::min(req.prompt.size() - off, size_t(req.prefill_chunk));
      it.tokens.assign(req.prompt.begin() + long(off), req.prompt.begin() + long(off + n));
      it.position = int(off);
      it.sample = off + n == req.prompt.size();
      if (it.sample && it.sampling.penalizes()) it.history = req.prompt;
      next = engine.step({it})[0];
    }
    it.history.clear();
    res.prefill_s = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    int fed = int(req.prompt.size());
    for (;;) {
      const auto outcome =
          rule.judge(next, int(res.ids.size()), req.max_tokens, fed, req.ignore_eos, req.sampling);
      if (!outcome.deliver) {
        res.finish_reason = *outcome.finish;
        break;
      }
      res.ids.push_back(next);
      if (on_token && !on_token(next)) break;
      if (outcome.finish) {
        res.finish_reason = *outcome.finish;
        break;
      }
      it.tokens = {next};
      it.position = fed;
      it.sample = true;
      it.generated = int(res.ids.size());
      next = engine.step({it})[0];
      ++fed;
    }
    res.decode_s = seconds_since(t0);
  } catch (...) {
    engine.release(kSeq);
    throw;
  }
  engine.release(kSeq);
  return res;
}

GenerateResult generate(const Model& model, int threads, const GenerateRequest& req,
                        const std::function<bool(int)>& on_token) {
  const ModelConfig& c = model.config();
  constexpr int kBlock = 16;
  // A one-device engine over the caller's model (not owned: the aliasing
  // pointer has no control block), with room for one full-context sequence.
  Engine engine(std::shared_ptr<const Model>(std::shared_ptr<const Model>(), &model),
                EngineOptions{threads, kBlock, (c.max_seq_len + kBlock - 1) / kBlock});
  return generate(engine, c, req, on_token);
}

}  // namespace troupe
