#pragma once
// A replica spanning processes, simulated in one: each "process" (host) is
// a ParallelEngine part built with the same layout and placement, and the
// cross-process communicators come from a CommMaker (Gloo on 127.0.0.1 in
// the integration tests and the benchmark, gloo_comms.h; in-process groups
// in unit tests). SplitReplica is itself a StepEngine that drives every part
// as the control plane will: the same items in the same order, cut as the
// sampling part cuts them; its finish() returns the sampling part's ids.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpu/comm/in_process_communicator.h"
#include "gpu/parallel_engine.h"

namespace troupe::test {

// A communicator of group `group` (a name unique to the group), as rank
// `rank` of `names.size()`; names[i] names rank i's process in messages.
using CommMaker = std::function<std::unique_ptr<Communicator>(
    const std::string& group, int rank, const std::vector<std::string>& names)>;

// Groups of in-process communicators, made on first use by name.
inline CommMaker in_process_comms() {
  struct Groups {
    std::mutex mu;
    std::map<std::string, std::shared_ptr<InProcessGroup>> by_name;
  };
  auto groups = std::make_shared<Groups>();
  return [groups](const std::string& group, int rank, const std::vector<std::string>& names) {
    std::shared_ptr<InProcessGroup> g;
    {
      std::lock_guard<std::mutex> l(groups->mu);
      auto& slot = groups->by_name[group];
      if (!slot) slot = InProcessGroup::create(int(names.size()));
      g = slot;
    }
    return std::unique_ptr<Communicator>(g->communicator(rank));
  };
}

inline std::string host_name(int host) {
  return "process " + std::to_string(host);
}

// The placement of part `this_host`, its factories naming every group
// after the replica (`replica`), the stage and the boundary.
inline ProcessPlacement placement_of(const std::vector<int>& host, int this_host, int tensor,
                                     const std::string& replica, const CommMaker& make) {
  ProcessPlacement p;
  p.host = host;
  p.this_host = this_host;
  p.tensor_group = [=](int stage, int rank) {
    std::vector<std::string> names;
    for (int t = 0; t < tensor; ++t) names.push_back(host_name(host[size_t(stage * tensor + t)]));
    return make(replica + "/tp" + std::to_string(stage), rank, names);
  };
  p.boundary_channel = [=](int stage, int to_host, int rank) {
    const std::vector<std::string> names = {host_name(host[size_t(stage * tensor)]),
                                            host_name(to_host)};
    return make(replica + "/b" + std::to_string(stage) + "-" + std::to_string(to_host), rank,
                names);
  };
  return p;
}

class SplitReplica : public StepEngine {
 public:
  // layout.placement.host says where each device goes; its factories are
  // filled in here. Every part is built on its own thread (a rendezvous
  // waits for the peers); throws the first part's error.
  SplitReplica(const Checkpoint& ck, DType dtype, ParallelEngineOptions layout,
               const CommMaker& make) {
    static std::atomic<int> replicas{0};
    const std::string name = "replica-" + std::to_string(replicas++);
    const std::vector<int> host = layout.placement.host;
    const int n = *std::max_element(host.begin(), host.end()) + 1;
    parts_.resize(size_t(n));
    std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int h = 0; h < n; ++h)
      threads.emplace_back([&, h] {
        try {
          ParallelEngineOptions mine = layout;
          mine.placement = placement_of(host, h, layout.tensor, name, make);
          parts_[size_t(h)] = std::make_unique<ParallelEngine>(ck, dtype, mine);
        } catch (...) {
          errors[size_t(h)] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    for (int h = 0; h < n; ++h)
      if (parts_[size_t(h)]->samples()) sampler_ = h;
  }

  int hosts() const { return int(parts_.size()); }
  int sampler() const { return sampler_; }
  ParallelEngine& part(int h) { return *parts_.at(size_t(h)); }
  // Destroys part h, as a process that dies (its peers' calls fail).
  void drop(int h) { parts_.at(size_t(h)).reset(); }

  const ModelConfig& config() const override { return lead().config(); }
  int kv_blocks() const override { return lead().kv_blocks(); }
  int block_tokens() const override { return lead().block_tokens(); }
  int stages() const override { return lead().stages(); }

  uint64_t launch(std::vector<StepItem> items, std::function<void()> on_done = {}) override {
    const int m = lead().microbatches_for(items.size());
    std::vector<uint64_t> tickets;
    try {
      for (int h = 0; h < hosts(); ++h) {
        auto& p = part(h);
        p.keep_logits(keep_logits_);
        tickets.push_back(p.launch_split(items, m, h == sampler_ ? on_done : nullptr));
      }
    } catch (...) {
      // The parts that took the step fail it too (the refusing part's
      // communicators are aborted); collect them before reporting.
      for (size_t h = 0; h < tickets.size(); ++h) try {
          parts_[h]->finish(tickets[h]);
        } catch (...) {
        }
      throw;
    }
    launched_[next_ticket_] = std::move(tickets);
    return next_ticket_++;
  }

  // Finishes every part's share; the first error (by host) is the step's.
  std::vector<int> finish(uint64_t ticket) override {
    auto node = launched_.extract(ticket);
    if (node.empty()) throw std::invalid_argument("finish: no step in flight with that ticket");
    std::vector<int> ids;
    std::exception_ptr error;
    for (int h = 0; h < hosts(); ++h) {
      try {
        auto got = part(h).finish(node.mapped()[size_t(h)]);
        if (h == sampler_) {
          ids = std::move(got);
          last_logits_ = part(h).last_logits();
          last_logprobs_ = part(h).last_logprobs();
          last_prompt_logprobs_ = part(h).last_prompt_logprobs();
        } else {
          for (int id : got)
            if (id != -1) throw std::logic_error(host_name(h) + " sampled, but it does not sample");
        }
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    return ids;
  }

  void release(uint64_t seq) override {
    for (auto& p : parts_) p->release(seq);
  }
  void set_microbatches(int m) override {
    for (auto& p : parts_) p->set_microbatches(m);
  }
  std::vector<StageSample> last_samples() const override { return lead().last_samples(); }

  // Every part's counters together: a stage's figures summed over the
  // parts holding its ranks.
  EngineStats stats() const override {
    EngineStats all = lead().stats();
    for (int h = 0; h < hosts(); ++h) {
      if (h == sampler_) continue;
      const EngineStats st = parts_[size_t(h)]->stats();
      all.wall_s = std::max(all.wall_s, st.wall_s);
      for (size_t s = 0; s < all.stages.size(); ++s) {
        all.stages[s].busy_s += st.stages[s].busy_s;
        all.stages[s].comm_s += st.stages[s].comm_s;
        all.stages[s].comm_bytes += st.stages[s].comm_bytes;
      }
      for (size_t d = 0; d < all.weight_bytes.size(); ++d) {
        all.weight_bytes[d] += st.weight_bytes[d];
        all.streamed_bytes[d] += st.streamed_bytes[d];
      }
    }
    return all;
  }

 private:
  const ParallelEngine& lead() const { return *parts_[size_t(sampler_)]; }

  std::vector<std::unique_ptr<ParallelEngine>> parts_;
  int sampler_ = 0;
  std::map<uint64_t, std::vector<uint64_t>> launched_;
  uint64_t next_ticket_ = 1;
};

}  // namespace troupe::test
