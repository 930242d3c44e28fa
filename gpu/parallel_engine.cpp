#include "gpu/parallel_engine.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <latch>
#include <map>
#include <mutex>
#include <semaphore>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "gpu/device_queue.h"

namespace troupe {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

// A device: one shard, its cache and threads, and the queue of jobs its
// runner (a thread, or a shard actor) works through: the device's "stream".
struct ParallelEngine::Device {
  int stage = 0, rank = 0;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<InProcessCommunicator> comm;
  Workspace ws;
  std::vector<SequenceCache> caches;  // the current micro-batch's sequences
  std::vector<float> scratch;         // x_out of ranks other than 0
  // Written by the device's jobs, read by stats() while other steps may be
  // in flight.
  std::atomic<double> busy_s{0};
  std::shared_ptr<DeviceQueue> queue = std::make_shared<DeviceQueue>();
  std::unique_ptr<DeviceRunner> runner;
};

struct ParallelEngine::Impl {
  ModelConfig config;
  ParallelEngineOptions layout;
  std::vector<std::unique_ptr<Device>> devices;                     // stage-major
  std::vector<std::unique_ptr<std::counting_semaphore<>>> credits;  // per stage boundary
  SequenceSamplers samplers;
  // Per boundary: micro-batches produced and not yet consumed, and the most seen.
  std::vector<std::unique_ptr<std::atomic<int>>> in_flight;
  std::vector<int> max_in_flight;
  std::mutex in_flight_mu;
  std::map<uint64_t, std::shared_ptr<StepState>> launched;  // by ticket
  uint64_t next_ticket = 1;
  int active = 0;  // steps launched, not yet finished
  Clock::time_point active_since;
  uint64_t steps = 0;
  double wall_s = 0;  // time with at least one step in flight
  Device& device(int stage, int rank) { return *devices[size_t(stage * layout.tensor + rank)]; }
  size_t vocab_stride() {
    return size_t(device(layout.pipeline - 1, 0).model->dims().vocab_stride);
  }

  // A device that fails records the step's error, wakes everyone (peers
  // blocked in collectives, later stages waiting for its micro-batches,
  // earlier ones waiting for credits) and counts down its own remaining
  // micro-batches. True when its failure is the step's first.
  bool fail(StepState& st, int stage, int from_mb, std::exception_ptr e, const std::string& why);
  // Device (s, t)'s share of a step: its stage's layers for every
  // micro-batch, in order, waiting for the previous stage and for credits.
  void run_device(StepState& st, int s, int t);
  // Greedy items take the best of each rank's local argmax (a distributed
  // argmax, ties to the lowest id); others gather the slices and sample.
  std::vector<int> sample(const StepState& st, bool keep_logits, std::vector<float>& logits_out);
};

ParallelEngine::ParallelEngine(const Checkpoint& ckpt, DType dtype, ParallelEngineOptions layout,
                               DeviceLauncher launcher)
    : impl_(std::make_unique<Impl>()) {
  if (!launcher) launcher = launch_device_thread;
  Impl& m = *impl_;
  m.config = ckpt.config;
  const int P = layout.pipeline, T = layout.tensor, L = ckpt.config.n_layers;
  if (P < 1 || T < 1)
    throw std::invalid_argument("parallel.pipeline and parallel.tensor must be >= 1");
  if (P > L)
    throw std::invalid_argument("parallel.pipeline = " + std::to_string(P) +
                                " is more than the model's " + std::to_string(L) + " layers");
  if (layout.stage_layers.empty()) {
    for (int s = 0; s < P; ++s) {
      const int b = s * (L / P) + std::min(s, L % P);
      layout.stage_layers.emplace_back(b, b + L / P + (s < L % P ? 1 : 0));
    }
  }
  if (int(layout.stage_layers.size()) != P || layout.stage_layers.front().first != 0 ||
      layout.stage_layers.back().second != L)
    throw std::invalid_argument("stage layer ranges must cover the model's layers in order");
  if (layout.threads.empty()) layout.threads = {1};
  if (layout.credits < 1) throw std::invalid_argument("pipeline credits must be >= 1");
  m.layout = layout;
  for (int s = 0; s < P; ++s) {
    auto group = make_in_process_group(T);
    for (int t = 0; t < T; ++t) {
      auto d = std::make_unique<Device>();
      d->stage = s;
      d->rank = t;
      ShardSpec spec{t, T, layout.stage_layers[size_t(s)].first,
                     layout.stage_layers[size_t(s)].second};
      d->model = std::make_unique<Model>(ckpt, dtype, spec);
      d->cache =
          std::make_unique<KvCache>(d->model->make_cache(layout.block_tokens, layout.blocks));
      const size_t di = size_t(s * T + t);
      d->pool = std::make_unique<ThreadPool>(layout.threads.size() == 1 ? layout.threads[0]
                                                                        : layout.threads.at(di));
      d->comm = std::move(group[size_t(t)]);
      d->runner = launcher(s, t, d->queue);
      m.devices.push_back(std::move(d));
    }
  }
  for (int s = 0; s + 1 < P; ++s) {
    m.credits.push_back(std::make_unique<std::counting_semaphore<>>(layout.credits));
    m.in_flight.push_back(std::make_unique<std::atomic<int>>(0));
    m.max_in_flight.push_back(0);
  }
}

ParallelEngine::~ParallelEngine() {
  // Runners first: their jobs use the devices' models and caches.
  for (auto& d : impl_->devices) d->runner.reset();
}

const ModelConfig& ParallelEngine::config() const {
  return impl_->config;
}
int ParallelEngine::kv_blocks() const {
  return impl_->layout.blocks;
}
int ParallelEngine::block_tokens() const {
  return impl_->layout.block_tokens;
}
int ParallelEngine::stages() const {
  return impl_->layout.pipeline;
}
void ParallelEngine::set_microbatches(int m) {
  impl_->layout.microbatches = std::max(0, m);
}

// One launched step: its buffers, latches and error live until the last
// device job lets go (a latch's count_down may still be waking the waiter
// when it returns, so they must not die with finish()'s frame).
struct ParallelEngine::StepState {
  std::vector<StepItem> items;
  int M = 1;
  std::vector<int> first;      // micro-batch mb: items [first[mb], first[mb+1])
  std::vector<size_t> tokens;  // per micro-batch
  std::vector<std::vector<std::vector<float>>> act;            // [stage boundary][mb] activations
  std::vector<std::vector<float>> logits;                      // per last-stage rank
  std::vector<std::vector<std::unique_ptr<std::latch>>> done;  // [stage][mb]
  std::mutex err_mu;
  std::exception_ptr error;
  std::vector<std::vector<double>> mb_seconds;  // [stage][mb], rank 0
  std::atomic<int> jobs_left{0};
  std::function<void()> on_done;
  // Called once by every device job, however it ends; the last one reports.
  void job_over() {
    if (--jobs_left == 0 && on_done) on_done();
  }
};

bool ParallelEngine::Impl::fail(StepState& st, int s, int from_mb, std::exception_ptr e,
                                const std::string& why) {
  bool first = false;
  {
    std::lock_guard<std::mutex> l(st.err_mu);
    first = !st.error;
    if (first) st.error = e;
  }
  for (auto& dev : devices) dev->comm->group().abort(why);
  for (int mb = from_mb; mb < st.M; ++mb) st.done[size_t(s)][size_t(mb)]->count_down();
  for (auto& c : credits) c->release(st.M);
  return first;
}

void ParallelEngine::Impl::run_device(StepState& st, int s, int t) {
  const int P = layout.pipeline, T = layout.tensor;
  Device& d = device(s, t);
  const size_t dim = size_t(config.dim);
  const size_t stride = vocab_stride();
  int mb = 0;
  try {
    for (; mb < st.M; ++mb) {
      if (s > 0) st.done[size_t(s - 1)][size_t(mb)]->wait();
      {
        std::lock_guard<std::mutex> l(st.err_mu);
        if (st.error) throw std::runtime_error("step aborted");
      }
      if (s + 1 < P && t == 0) credits[size_t(s)]->acquire();
      const auto t0 = Clock::now();
      const std::vector<StepInput> inputs = step_inputs(
          st.items, d.caches, size_t(st.first[size_t(mb)]), size_t(st.first[size_t(mb) + 1]));
      ShardIo io;
      io.tp = T > 1 ? d.comm.get() : nullptr;
      if (s > 0) io.x_in = st.act[size_t(s - 1)][size_t(mb)].data();
      if (s + 1 < P) {
        if (t == 0) {
          io.x_out = st.act[size_t(s)][size_t(mb)].data();
        } else {
          d.scratch.resize(st.tokens[size_t(mb)] * dim);
          io.x_out = d.scratch.data();
        }
      } else {
        io.logits = st.logits[size_t(t)].data() + size_t(st.first[size_t(mb)]) * stride;
      }
      d.model->forward_shard(inputs, *d.cache, *d.pool, d.ws, io);
      if (size_t(s) < layout.stage_delay_s.size() && layout.stage_delay_s[size_t(s)] > 0)
        std::this_thread::sleep_for(std::chrono::duration<double>(layout.stage_delay_s[size_t(s)]));
      const double took = seconds_since(t0);
      d.busy_s += took;
      if (t == 0) st.mb_seconds[size_t(s)][size_t(mb)] = took;
      if (t == 0 && s + 1 < P) {
        const int now = ++*in_flight[size_t(s)];
        std::lock_guard<std::mutex> l(in_flight_mu);
        max_in_flight[size_t(s)] = std::max(max_in_flight[size_t(s)], now);
      }
      // The previous stage's buffer for this micro-batch is consumed.
      if (s > 0 && t == 0) {
        --*in_flight[size_t(s - 1)];
        credits[size_t(s - 1)]->release();
      }
      st.done[size_t(s)][size_t(mb)]->count_down();
    }
  } catch (const std::exception& e) {
    // The shard whose failure started it dies ("let it crash"); peers that
    // were only woken by the abort live on until the group is rebuilt.
    const std::string why = "shard (stage " + std::to_string(s) + ", rank " + std::to_string(t) +
                            ") failed: " + e.what();
    const bool first = fail(st, s, mb, std::current_exception(), why);
    st.job_over();
    if (first) throw;
    return;
  } catch (...) {
    const bool first =
        fail(st, s, mb, std::current_exception(), "a shard failed: unknown exception");
    st.job_over();
    if (first) throw;
    return;
  }
  st.job_over();
}

uint64_t ParallelEngine::launch(std::vector<StepItem> items, std::function<void()> on_done) {
  Impl& m = *impl_;
  const int P = m.layout.pipeline, T = m.layout.tensor, n = int(items.size());
  if (n == 0) throw std::invalid_argument("launch: a step needs at least one item");
  // A dead shard leaves its group unable to step (its KV cache slice is
  // gone): report it, and let supervision rebuild the group.
  for (const auto& d : m.devices)
    if (d->queue->closed())
      throw std::runtime_error("shard (stage " + std::to_string(d->stage) + ", rank " +
                               std::to_string(d->rank) + ") is down: " + d->queue->close_reason());
  auto state = std::make_shared<StepState>();
  StepState& st = *state;
  st.items = std::move(items);
  st.on_done = std::move(on_done);
  const int M = std::max(1, std::min(n, m.layout.microbatches > 0 ? m.layout.microbatches : P));
  st.M = M;
  st.first.assign(size_t(M) + 1, 0);
  for (int mb = 0; mb < M; ++mb)
    st.first[size_t(mb) + 1] = st.first[size_t(mb)] + n / M + (mb < n % M ? 1 : 0);
  st.tokens.assign(size_t(M), 0);
  for (int mb = 0; mb < M; ++mb)
    for (int i = st.first[size_t(mb)]; i < st.first[size_t(mb) + 1]; ++i)
      st.tokens[size_t(mb)] += st.items[size_t(i)].tokens.size();
  const size_t dim = size_t(m.config.dim);
  st.act.resize(size_t(std::max(0, P - 1)));
  for (auto& a : st.act) {
    a.resize(size_t(M));
    for (int mb = 0; mb < M; ++mb) a[size_t(mb)].resize(st.tokens[size_t(mb)] * dim);
  }
  st.logits.assign(size_t(T), std::vector<float>(size_t(n) * m.vocab_stride()));
  st.done.resize(size_t(P));
  for (auto& v : st.done)
    for (int mb = 0; mb < M; ++mb) v.push_back(std::make_unique<std::latch>(T));
  st.mb_seconds.assign(size_t(P), std::vector<double>(size_t(M), 0.0));
  st.jobs_left = P * T;
  if (m.active++ == 0) m.active_since = Clock::now();

  for (int s = 0; s < P; ++s)
    for (int t = 0; t < T; ++t) {
      DeviceJob job;
      job.abandon = [&m, state, s](const std::string& why) {
        m.fail(*state, s, 0, std::make_exception_ptr(std::runtime_error(why)), why);
        state->job_over();
      };
      job.run = [&m, state, s, t] { m.run_device(*state, s, t); };
      m.device(s, t).queue->post(std::move(job));
    }
  const uint64_t ticket = m.next_ticket++;
  m.launched.emplace(ticket, std::move(state));
  return ticket;
}

std::vector<int> ParallelEngine::Impl::sample(const StepState& st, bool keep_logits,
                                              std::vector<float>& logits_out) {
  const int P = layout.pipeline, T = layout.tensor, n = int(st.items.size());
  const size_t stride = vocab_stride();
  std::vector<int> out(size_t(n), -1);
  logits_out.clear();
  // The full row is gathered only where it is used: sampling, or tests.
  std::vector<float> full;
  auto gather = [&](int i) {
    full.resize(size_t(config.vocab_size));
    for (int t = 0; t < T; ++t) {
      const auto& dm = device(P - 1, t).model->dims();
      std::copy_n(st.logits[size_t(t)].data() + size_t(i) * stride, dm.vocab,
                  full.data() + dm.vocab_begin);
    }
  };
  for (int i = 0; i < n; ++i) {
    const StepItem& it = st.items[size_t(i)];
    if (!it.sample) continue;
    if (keep_logits) {
      gather(i);
      logits_out.insert(logits_out.end(), full.begin(), full.end());
    }
    if (it.sampling.temperature <= 0) {
      float best = -std::numeric_limits<float>::infinity();
      int best_id = -1;
      for (int t = 0; t < T; ++t) {
        const auto& dm = device(P - 1, t).model->dims();
        const float* row = st.logits[size_t(t)].data() + size_t(i) * stride;
        const int local = argmax({row, size_t(dm.vocab)});
        if (best_id < 0 || row[local] > best) {
          best = row[local];
          best_id = dm.vocab_begin + local;
        }
      }
      out[size_t(i)] = best_id;
      continue;
    }
    if (!keep_logits) gather(i);
    out[size_t(i)] = samplers.sample(it, full);
  }
  return out;
}

std::vector<int> ParallelEngine::finish(uint64_t ticket) {
  Impl& m = *impl_;
  auto node = m.launched.extract(ticket);
  if (node.empty()) throw std::invalid_argument("finish: no step in flight with that ticket");
  const std::shared_ptr<StepState> state = std::move(node.mapped());
  StepState& st = *state;
  const int P = m.layout.pipeline, M = st.M;
  // Every device has finished this step's jobs once every stage has.
  for (int s = P - 1; s >= 0; --s)
    for (int mb = 0; mb < M; ++mb) st.done[size_t(s)][size_t(mb)]->wait();
  if (--m.active == 0) m.wall_s += seconds_since(m.active_since);
  if (st.error) std::rethrow_exception(st.error);
  last_samples_.clear();
  for (int s = 0; s < P; ++s)
    for (int mb = 0; mb < M; ++mb)
      last_samples_.push_back({s, st.tokens[size_t(mb)], st.mb_seconds[size_t(s)][size_t(mb)]});
  std::vector<int> out = m.sample(st, keep_logits_, last_logits_);
  ++m.steps;
  return out;
}

void ParallelEngine::release(uint64_t seq) {
  impl_->samplers.release(seq);
}

EngineStats ParallelEngine::stats() const {
  const Impl& m = *impl_;
  EngineStats st;
  st.steps = m.steps;
  st.wall_s = m.wall_s;
  for (int s = 0; s < m.layout.pipeline; ++s) {
    const Device& d = *m.devices[size_t(s * m.layout.tensor)];
    const CommStats c = d.comm->stats();
    st.stages.push_back({d.busy_s.load(), c.seconds, c.bytes});
  }
  for (const auto& d : m.devices) {
    st.weight_bytes.push_back(d->model->weight_bytes());
    st.streamed_bytes.push_back(d->model->weight_bytes_per_step());
  }
  {
    std::lock_guard<std::mutex> l(const_cast<std::mutex&>(m.in_flight_mu));
    st.max_in_flight = m.max_in_flight;
  }
  return st;
}

}  // namespace troupe
