#include "chaos/workload.h"

#include <array>
#include <nlohmann/json.hpp>
#include <random>

namespace troupe::chaos {

namespace {

// Plain words, so that prompts tokenize like text a user sends.
constexpr std::array<const char*, 64> kWords = {
    "the",    "a",       "little", "old",    "house",  "on",     "hill",   "river",
    "moon",   "said",    "always", "never",  "friend", "stone",  "light",  "dark",
    "garden", "morning", "night",  "king",   "cat",    "dog",    "road",   "sea",
    "wind",   "quiet",   "story",  "begins", "when",   "after",  "before", "under",
    "bright", "cold",    "warm",   "green",  "blue",   "door",   "window", "bread",
    "fire",   "snow",    "rain",   "song",   "book",   "letter", "city",   "forest",
    "mountain", "happy", "slow",   "fast",   "deep",   "tall",   "small",  "wise",
    "fortune", "luck",   "time",   "money",  "love",   "tomorrow", "today", "yesterday"};

int uniform(std::mt19937_64& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

bool chance(std::mt19937_64& rng, double p) {
  return std::uniform_real_distribution<double>(0, 1)(rng) < p;
}

}  // namespace

Workload make_workload(const WorkloadPlan& plan, uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  Workload w;
  w.pool.reserve(size_t(plan.distinct));
  for (int i = 0; i < plan.distinct; ++i) {
    DistinctRequest r;
    const int words = uniform(rng, plan.min_words, plan.max_words);
    for (int k = 0; k < words; ++k) {
      if (k) r.prompt += ' ';
      r.prompt += kWords[size_t(uniform(rng, 0, int(kWords.size()) - 1))];
    }
    r.max_tokens = uniform(rng, plan.min_tokens, plan.max_tokens);
    if (chance(rng, plan.sampled)) {
      r.temperature = 0.8;
      r.seed = rng() >> 12;  // JSON-exact
    }
    w.pool.push_back(std::move(r));
  }
  w.requests.reserve(size_t(plan.requests));
  for (int i = 0; i < plan.requests; ++i) {
    RequestSpec s;
    s.index = size_t(i);
    // Each distinct request once first, then repeats drawn at random.
    s.distinct = i < plan.distinct ? size_t(i) : size_t(uniform(rng, 0, plan.distinct - 1));
    s.stream = chance(rng, plan.stream);
    if (s.stream && chance(rng, plan.cancel))
      s.cancel_after = uniform(rng, 0, std::max(0, w.pool[s.distinct].max_tokens / 2));
    w.requests.push_back(s);
  }
  return w;
}

std::string request_body(const DistinctRequest& r, bool stream, const std::string& model) {
  nlohmann::json j = {{"prompt", r.prompt},
                      {"max_tokens", r.max_tokens},
                      {"temperature", r.temperature},
                      {"stream", stream},
                      {"return_token_ids", true}};
  if (!model.empty()) j["model"] = model;
  if (r.temperature > 0) {
    j["seed"] = r.seed;
    j["top_p"] = 0.95;
  }
  return j.dump();
}

}  // namespace troupe::chaos
