#pragma once
// A CompletionSink that records what a request's client saw, for tests of
// the request table (single-threaded) and of the runtime (tokens arrive on
// runtime threads: everything is locked, and waits are bounded).
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <vector>

#include "service/completion_service.h"

namespace troupe::test {

class RecordingSink : public CompletionSink {
 public:
  void on_token(int id, const TokenLogprobs* logprobs) override {
    std::lock_guard<std::mutex> l(mu_);
    if (finished_) ++violations_;
    tokens_.push_back(id);
    logprobs_.push_back(logprobs ? std::optional<TokenLogprobs>(*logprobs) : std::nullopt);
    cv_.notify_all();
  }
  void on_prompt_logprobs(const std::vector<TokenLogprobs>& entries) override {
    std::lock_guard<std::mutex> l(mu_);
    if (finished_ || !tokens_.empty()) ++violations_;  // once, before the first token
    prompt_logprobs_.push_back(entries);
    cv_.notify_all();
  }
  void on_done(FinishReason r, int prompt, int completion, int cached) override {
    std::lock_guard<std::mutex> l(mu_);
    if (finished_) ++violations_;
    finished_ = true;
    reason_ = r;
    prompt_tokens_ = prompt;
    completion_tokens_ = completion;
    cached_tokens_ = cached;
    cv_.notify_all();
  }
  void on_error(const ServiceError& e) override {
    std::lock_guard<std::mutex> l(mu_);
    if (finished_) ++violations_;
    finished_ = true;
    error_ = e;
    cv_.notify_all();
  }
  // Waits until the request ended; false on timeout.
  bool wait(double timeout_s = 60) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, std::chrono::duration<double>(timeout_s), [&] { return finished_; });
  }
  bool wait_tokens(size_t n, double timeout_s = 60) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, std::chrono::duration<double>(timeout_s),
                        [&] { return tokens_.size() >= n || finished_; });
  }
  bool finished() {
    std::lock_guard<std::mutex> l(mu_);
    return finished_;
  }
  // Every on_prompt_logprobs call's entries.
  std::vector<std::vector<TokenLogprobs>> prompt_logprobs() {
    std::lock_guard<std::mutex> l(mu_);
    return prompt_logprobs_;
  }
  // Per token: what came with it (set when the request asked for them).
  std::vector<std::optional<TokenLogprobs>> logprobs() {
    std::lock_guard<std::mutex> l(mu_);
    return logprobs_;
  }
  std::vector<int> tokens() {
    std::lock_guard<std::mutex> l(mu_);
    return tokens_;
  }
  std::optional<ServiceError> error() {
    std::lock_guard<std::mutex> l(mu_);
    return error_;
  }
  FinishReason reason() {
    std::lock_guard<std::mutex> l(mu_);
    return reason_;
  }
  int prompt_tokens() {
    std::lock_guard<std::mutex> l(mu_);
    return prompt_tokens_;
  }
  int cached_tokens() {
    std::lock_guard<std::mutex> l(mu_);
    return cached_tokens_;
  }
  int completion_tokens() {
    std::lock_guard<std::mutex> l(mu_);
    return completion_tokens_;
  }
  // Calls after the request ended (each one breaks the sink's contract).
  int violations() {
    std::lock_guard<std::mutex> l(mu_);
    return violations_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> tokens_;
  std::vector<std::vector<TokenLogprobs>> prompt_logprobs_;
  std::vector<std::optional<TokenLogprobs>> logprobs_;
  bool finished_ = false;
  FinishReason reason_ = FinishReason::Stop;
  int prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0, violations_ = 0;
  std::optional<ServiceError> error_;
};

}  // namespace troupe::test
