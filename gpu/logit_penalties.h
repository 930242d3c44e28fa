#pragma once
// What a sequence's sampling does to a row of logits before the draw:
// OpenAI's logit_bias, presence and frequency penalties and vLLM's repetition
// penalty, in vLLM's order (SamplingParams). Each touches only the ids it
// names or that the sequence holds, one f32 operation after another, so the
// adjusted row is the same in any layout and on any machine. The state is
// rebuilt from the sequence's tokens (StepItem::history), so a sequence
// resumed on another replica, or recomputed after preemption, continues
// exactly as if it had not stopped.
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "service/request.h"
#include "service/step_item.h"

namespace troupe {

class LogitPenalties {
 public:
  // eos_ids: the model's end-of-sequence ids, which with the request's
  // stop_token_ids are not drawn while fewer than min_tokens tokens have
  // been generated (`generated` so far: a sequence resumed elsewhere).
  explicit LogitPenalties(const SamplingParams& params, std::span<const int> eos_ids = {},
                          int generated = 0);

  // The sequence so far replaces what was recorded: `tokens` is the prompt
  // followed by `generated` output tokens. Throws std::invalid_argument when
  // generated is negative or more than the tokens.
  void reset(std::span<const int> tokens, int generated);
  // A sampled id joins the output.
  void record(int id);
  // `logits` adjusted, into `out` (resized to match). Ids outside the row
  // are skipped: the front end refuses them before a request gets here.
  void apply(std::span<const float> logits, std::vector<float>& out) const;

  int output_count(int id) const;

 private:
  SamplingParams params_;
  std::vector<int> ends_;  // ids that end the sequence: -inf before min_tokens
  int generated_ = 0;
  // The output's last ids, as many as the longest bad word has before its
  // last (oldest first).
  std::vector<int> recent_;
  size_t recent_kept_ = 0;
  std::unordered_map<int, int> output_;  // id -> occurrences in the output
  std::vector<int> seen_;                // ids in the prompt or the output, ascending
};

// An engine's penalties, per sequence: made at a sequence's first sampled
// step, rebuilt wherever an item carries the sequence's history, dropped on
// release.
class SequencePenalties {
 public:
  // The model's end-of-sequence ids (min_tokens keeps them from being drawn).
  void set_eos_ids(std::vector<int> ids) { eos_ids_ = std::move(ids); }
  // The row the item's sequence draws from: `logits` adjusted by its
  // penalties, or `logits` itself when its sampling adjusts nothing. The
  // adjusted row lives until the next call.
  std::span<const float> adjust(const StepItem& item, std::span<const float> logits);
  // The id the item's sequence drew joins its output (nothing for a
  // sequence whose sampling adjusts nothing).
  void record(uint64_t seq, int id);
  void release(uint64_t seq) { seqs_.erase(seq); }
  size_t size() const { return seqs_.size(); }

 private:
  std::unordered_map<uint64_t, LogitPenalties> seqs_;
  std::vector<float> row_;
  std::vector<int> eos_ids_;
};

}  // namespace troupe
