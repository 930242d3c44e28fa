#pragma once
// A replica's life in miniature, for comparing engines: sequences that join
// at different steps, prompts fed in chunks beside other sequences' decode
// steps, greedy and seeded-sampled sequences in the same steps.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "gpu/engine.h"
#include "support/engine_driver.h"

namespace troupe::test {

struct MixedRun {
  std::vector<std::vector<int>> ids;       // per sequence
  std::vector<std::vector<float>> logits;  // per step: its sampled items' logits (keep_logits)
  // Per sequence, per sampled token: its log-probabilities (with `logprobs`).
  std::vector<std::vector<std::optional<TokenLogprobs>>> logprobs;
  // Per sequence: its prompt's (with `logprobs`), gathered over its chunks.
  std::vector<std::vector<TokenLogprobs>> prompt_logprobs;
};

// Five sequences; sequence s joins at step s with a prompt of 2 + 4s tokens
// fed 3 at a time, then generates 6 tokens. With `sampled`, odd sequences
// sample (temperature 0.8, top_p 0.9, seed 100 + s), even ones are greedy.
// With `logprobs` >= 0, all but every third sequence ask for that many
// alternatives, for their prompts' tokens too.
inline MixedRun run_mixed(StepEngine& engine, bool keep_logits, bool sampled, int logprobs = -1) {
  const int S = 5, extra = 6, vocab = engine.config().vocab_size;
  SlotBook book(engine.kv_blocks() / S);
  engine.keep_logits(keep_logits);
  std::vector<std::vector<int>> prompts(S);
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < 2 + 4 * s; ++i)
      prompts[size_t(s)].push_back(1 + (i * 41 + s * 7) % (vocab - 1));
  std::vector<size_t> fed(S, 0);
  MixedRun run;
  run.ids.resize(S);
  run.logprobs.resize(S);
  run.prompt_logprobs.resize(S);
  for (int step = 0; step < 60; ++step) {
    std::vector<StepItem> items;
    std::vector<int> who;
    for (int s = 0; s < S; ++s) {
      auto& prompt = prompts[size_t(s)];
      if (s > step || int(run.ids[size_t(s)].size()) >= extra) continue;
      const bool sampling = sampled && s % 2 == 1;
      std::vector<int> tokens = {run.ids[size_t(s)].empty() ? 0 : run.ids[size_t(s)].back()};
      const bool prefill = fed[size_t(s)] < prompt.size();
      if (prefill) {
        const size_t n = std::min<size_t>(3, prompt.size() - fed[size_t(s)]);
        tokens.assign(prompt.begin() + long(fed[size_t(s)]),
                      prompt.begin() + long(fed[size_t(s)] + n));
        fed[size_t(s)] += n;
      }
      StepItem it =
          book.next(uint64_t(s), tokens, fed[size_t(s)] == prompt.size(), sampling ? 0.8f : 0.0f);
      it.sampling.top_p = sampling ? 0.9f : 1.0f;
      it.sampling.seed = uint64_t(100 + s);
      it.sampling.logprobs = s % 3 == 2 ? -1 : logprobs;
      it.sampling.prompt_logprobs = it.sampling.logprobs;
      if (prefill && it.sampling.prompt_logprobs >= 0) it.history = prompt;
      items.push_back(std::move(it));
      who.push_back(s);
    }
    if (items.empty()) break;
    const auto out = engine.step(items);
    const auto& lps = engine.last_logprobs();
    const auto& prompt_lps = engine.last_prompt_logprobs();
    for (size_t i = 0; i < items.size(); ++i) {
      if (i < prompt_lps.size())
        run.prompt_logprobs[size_t(who[i])].insert(run.prompt_logprobs[size_t(who[i])].end(),
                                                   prompt_lps[i].begin(), prompt_lps[i].end());
      if (!items[i].sample) continue;
      run.ids[size_t(who[i])].push_back(out[i]);
      run.logprobs[size_t(who[i])].push_back(i < lps.size() ? lps[i] : std::nullopt);
    }
    if (keep_logits) run.logits.push_back(engine.last_logits());
  }
  for (int s = 0; s < S; ++s) engine.release(uint64_t(s));
  return run;
}

// Decoding in groups, as a pipeline's worker does: sequence s (a prompt of
// 2 + s tokens) belongs to group s % G; a group's next step is launched as
// soon as its previous one is finished, while the other groups' steps are in
// flight, cut into 2 micro-batches when nothing else is in flight and into 1
// otherwise. Returns each sequence's `steps` greedy ids.
inline std::vector<std::vector<int>> decode_in_groups(StepEngine& engine, int sequences, int G,
                                                      int steps) {
  const int vocab = engine.config().vocab_size;
  SlotBook book(engine.kv_blocks() / sequences);
  std::vector<std::vector<StepItem>> group(static_cast<size_t>(G));
  for (int s = 0; s < sequences; ++s) {
    std::vector<int> prompt;
    for (int i = 0; i < 2 + s; ++i) prompt.push_back(1 + (i * 29 + s * 13) % (vocab - 1));
    group[size_t(s % G)].push_back(book.next(uint64_t(s), prompt));
  }
  std::vector<std::vector<int>> ids(static_cast<size_t>(sequences));
  std::deque<std::pair<int, uint64_t>> flight;  // (group, ticket), oldest first
  std::vector<int> done(static_cast<size_t>(G), 0);
  auto launch = [&](int g) {
    engine.set_microbatches(flight.empty() ? 2 : 1);
    flight.emplace_back(g, engine.launch(group[size_t(g)]));
  };
  for (int g = 0; g < G; ++g) launch(g);
  while (!flight.empty()) {
    const auto [g, ticket] = flight.front();
    flight.pop_front();
    const std::vector<int> out = engine.finish(ticket);
    for (size_t i = 0; i < out.size(); ++i) {
      StepItem& it = group[size_t(g)][i];
      ids[it.seq].push_back(out[i]);
      it = book.next(it.seq, {out[i]});
    }
    if (++done[size_t(g)] < steps) launch(g);
  }
  for (int s = 0; s < sequences; ++s) engine.release(uint64_t(s));
  return ids;
}

// The largest difference between two runs' logits; infinity when their
// shapes differ.
inline float max_logit_diff(const MixedRun& a, const MixedRun& b) {
  if (a.logits.size() != b.logits.size()) return INFINITY;
  float worst = 0;
  for (size_t k = 0; k < a.logits.size(); ++k) {
    if (a.logits[k].size() != b.logits[k].size()) return INFINITY;
    for (size_t i = 0; i < a.logits[k].size(); ++i)
      worst = std::max(worst, std::fabs(a.logits[k][i] - b.logits[k][i]));
  }
  return worst;
}

}  // namespace troupe::test
