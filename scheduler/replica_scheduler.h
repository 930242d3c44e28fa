#pragma once
// One replica's continuous batching as a plain class: the requests placed on
// the replica, the one book of its KV blocks, which sequences run in each
// step (scheduler/batch_policy.h), and what each step's sampled ids mean for
// the requests (service/stop_rule.h). The batcher actor drives it in the
// runtime; the simulator can drive the same object on a virtual clock.
//
// KV blocks: a sequence holds the blocks its cached and in-flight tokens
// need, allocated here when a step is planned and returned here when the
// sequence ends, is cancelled or is preempted. Engines only receive block
// tables; nothing else allocates.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "scheduler/batch_policy.h"
#include "scheduler/block_book.h"
#include "scheduler/replica_messages.h"
#include "service/step_item.h"
#include "service/stop_rule.h"

namespace troupe {

struct ReplicaSchedulerOptions {
  int replica = 0;
  uint64_t epoch = 0;  // stamped on every StepEvents
  int kv_blocks = 0;   // blocks each device of the replica holds
  int block_tokens = 16;
  BatchLimits limits;
  // Steps in flight at once, each over its own group of sequences: a
  // pipeline of P stages runs P, so that no stage waits for the tokens of
  // the step ahead of it. 1: one step at a time.
  int groups = 1;
  // Schedules one step ahead (one group only): step N+1 is planned and
  // launched while step N runs, so that the device does not wait for N's
  // answer to travel to the batcher and N+1 back. A sequence whose step N
  // samples is in N+1 too, fed {kSampledToken} (the worker substitutes N's
  // id); if N's token ends it (EOS, a stop), its N+1 result is dropped and
  // its blocks are returned once N+1 is answered. Only sequences that N's
  // token cannot end by length, and are not cancelled, are planned ahead.
  bool lookahead = false;
  // Keeps full KV blocks indexed by their tokens, so that a sequence
  // starting with a prefix computed before takes its blocks instead of
  // computing it again (scheduler/block_book.h). The same answers either way.
  bool prefix_caching = false;
  StopRule stop;
  int bos = 1;  // the probe step's token
};

struct PlannedStep {
  uint64_t id = 0;
  std::vector<StepItem> items;
};

class ReplicaScheduler {
 public:
  // Throws std::invalid_argument naming a bad limit.
  explicit ReplicaScheduler(ReplicaSchedulerOptions options);

  // A request placed here waits for a step. Throws std::logic_error for an
  // id already here (the request table places a request once at a time).
  void add(Assignment a);
  // The request ends as Cancelled before the next step, or once the step in
  // flight that holds it returns. Unknown ids are ignored.
  void cancel(uint64_t id);

  // True when fewer steps than groups are in flight (two with lookahead).
  bool can_launch() const;
  // Turns lookahead on or off from the next step planned (steps already
  // planned ahead finish as planned). Throws std::invalid_argument for on
  // with more than one group.
  void set_lookahead(bool on);
  bool lookahead() const { return lookahead_; }
  // With options.lookahead: an answered step's time (from its start, or the
  // answer before it, to its answer) keeps scheduling ahead on while steps
  // are short on average, off while long (see the .cpp). Without it, nothing.
  void observe_step_time(double seconds);
  // Ends cancelled sequences that no step holds (see take_ended), then plans
  // the next step over the sequences not in a step in flight: allocates the
  // blocks it needs, preempting the newest sequences if nothing fits.
  // Nothing when no group is free or nothing can run.
  std::optional<PlannedStep> next_step();
  // The same into `out` (false: nothing to launch), reusing its buffers.
  bool next_step(PlannedStep& out);
  // A launched step's sampled ids (one per item, -1 where not sampled): the
  // tokens delivered and the requests that ended, with the load after it.
  // Throws std::logic_error for a step that is not in flight. With
  // lookahead, steps are answered in the order they were planned.
  // `logprobs`: empty, or one per item, set where the item's sampling asked
  // for log-probabilities; they ride with the tokens delivered.
  // `prompt_logprobs`: empty, or one list per item (StepEngine::
  // last_prompt_logprobs); a sequence's lists are gathered over its prefill
  // and reported whole (StepEvents::prompts) by the step that samples its
  // first token.
  StepEvents finish_step(uint64_t step, const std::vector<int>& ids, double step_s,
                         const std::vector<std::optional<TokenLogprobs>>& logprobs = {},
                         const std::vector<std::vector<TokenLogprobs>>& prompt_logprobs = {});
  // The same into `ev`, reusing its buffers.
  void finish_step(uint64_t step, const std::vector<int>& ids, double step_s, StepEvents& ev,
                   const std::vector<std::optional<TokenLogprobs>>& logprobs = {},
                   const std::vector<std::vector<TokenLogprobs>>& prompt_logprobs = {});

  // The step that proves a new replica works before it is routed to: the
  // BOS token, greedy, in one block; finish_probe() returns the block.
  PlannedStep probe_step();
  void finish_probe(uint64_t step);

  // No step, nothing ended: only the replica's load (an answer to a probe).
  StepEvents load_report() const;
  // Requests that ended without a step (cancelled while idle), if any.
  std::optional<StepEvents> take_ended();
  // Sequences whose engine state (their sampler) may be dropped: ended or
  // preempted since the last call.
  std::vector<uint64_t> take_released();

  int replica() const { return options_.replica; }
  int running() const { return int(running_.size()); }
  int waiting() const { return int(waiting_.size()); }
  int in_flight() const { return int(in_flight_.size()); }
  int blocks_used() const { return blocks_.used_count(); }
  int blocks_free() const { return blocks_.free_count(); }
  // Of the used and free blocks, those indexed for reuse by prefix.
  int blocks_cached() const { return blocks_.cached_count(); }
  // Prompt (or resumed) tokens not yet in the KV cache.
  int queued_tokens() const { return queued_; }
  bool holds(uint64_t id) const { return index_.count(id) != 0; }

  // Fault injection: while refusing, the block pool looks empty to the batch
  // policy (nothing new is admitted, and a sequence that needs another block
  // is preempted, to resume when blocks come back). refusals() counts the
  // steps planned that the refusal changed (a sequence preempted, not
  // admitted, or left out for want of a block).
  void refuse_blocks(bool refuse) { refusing_ = refuse; }
  uint64_t refusals() const { return refusals_; }

 private:
  struct Sequence {
    Assignment a;             // a.tokens moved to `tokens`
    std::vector<int> tokens;  // prompt + generated so far
    int prefill_end = 0;      // tokens known at placement (prompt + delivered)
    int cached = 0;           // tokens in the KV cache
    int in_flight = 0;        // tokens fed to steps in flight (cached + in_flight: fed so far)
    std::vector<int> blocks;  // its block table
    // Prefix caching: its leading blocks that are indexed (its own or taken
    // by prefix); `indexing` is false once one could not be (the same
    // prefix computed by another sequence at the same time).
    int indexed = 0;
    bool indexing = true;
    std::vector<uint64_t> keys;  // chain keys of its first full blocks (BlockBook::chain_key)
    std::vector<int> hit;        // waiting: the cached blocks its tokens start with
    int prompt_hit = -1;         // prompt tokens found cached when first admitted (-1: not yet)
    uint64_t step = 0;           // the step in flight that holds it (0: none)
    uint64_t ahead = 0;          // lookahead: the step after `step` that holds it too (0: none)
    bool cancelled = false;
    bool draining = false;                       // ended while a step still holds its blocks
    bool used = false;                           // the slot holds a sequence
    std::vector<TokenLogprobs> prompt_logprobs;  // gathered over the prefill, when asked
  };
  // Sequences live in slots, found by id only for what comes from outside
  // (add, cancel, holds): a step plans and finishes by slot. The batch
  // policy sees slots as its sequences' ids.
  using Slot = uint32_t;

  // What finish_step needs of an item it launched (the engine has the rest).
  struct Launched {
    Slot slot;
    uint64_t seq;
    int position;
    int tokens;
    bool sample;
  };
  struct InFlight {
    uint64_t step = 0;
    std::vector<Launched> items;
  };

  void end(StepEvents& ev, Slot slot, FinishReason reason);
  void free_slot(Slot slot);
  // A sequence in a step in flight that the next step may feed too.
  bool plannable_ahead(const Sequence& q) const;
  // The batch policy's view of the sequences the next step may take (those
  // planned ahead too, if `ahead`); returns how many sequences run in steps
  // in flight and are not in the view.
  // exact_shares: count the blocks each holds with others (else all).
  int view_running(bool ahead, bool exact_shares);
  void fill_load(StepEvents& ev) const;
  void preempt(Slot slot);
  // Prefix caching: finds a waiting sequence's cached prefix (into q.hit);
  // returns its tokens.
  int match_prefix(Sequence& q);
  // Indexes the blocks of q that its computed tokens now fill.
  void index_filled(Sequence& q);
  // Computes q's chain keys up to its first `blocks` full blocks.
  void extend_keys(Sequence& q, int blocks) const;
  // Prompt (or resumed) tokens of q not yet in the KV cache.
  static int queued_of(const Sequence& q) { return std::max(0, q.prefill_end - q.cached); }
  InFlight& start_flight(uint64_t step);

  ReplicaSchedulerOptions options_;
  ContinuousBatchPolicy policy_;
  BlockBook blocks_;
  std::vector<Sequence> slots_;
  std::vector<Slot> free_slots_;
  std::unordered_map<uint64_t, Slot> index_;  // by request id
  std::vector<Slot> running_;                 // admission order
  std::deque<Slot> waiting_;
  std::vector<InFlight> in_flight_;  // at most `groups` (+ the probe)
  std::vector<InFlight> spare_;      // finished flights' buffers
  int queued_ = 0;                   // the sum of queued_of over the sequences
  int cancelled_ = 0;                // sequences marked cancelled, not yet ended
  // next_step's working buffers, kept for their capacity.
  std::vector<SeqView> running_view_, waiting_view_;
  BatchPlan plan_;
  BatchPlan unrefused_plan_;  // while refusing blocks: the step they would allow
  uint64_t next_step_ = 1;
  std::optional<StepEvents> ended_;
  std::vector<uint64_t> released_;
  std::vector<int> probe_blocks_;
  bool refusing_ = false;
  uint64_t refusals_ = 0;
  bool lookahead_ = false;
  double step_s_ = 0;  // steps' recent time, an exponential mean
  // Prompt tokens of the sequences admitted since the last step's events,
  // and how many of them were found cached.
  int prefix_queried_ = 0, prefix_hits_ = 0;
};

}  // namespace troupe
