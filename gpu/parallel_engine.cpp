#include "gpu/parallel_engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <latch>
#include <map>
#include <mutex>
#include <semaphore>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "gpu/comm/in_process_communicator.h"
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
  std::unique_ptr<Shard> shard;
  std::unique_ptr<Communicator> comm;  // its stage's tensor group
  // Boundaries between processes: (s, 0) sends its output to each other
  // host of stage s + 1 (in host order); the lowest rank of stage s here
  // receives the previous stage's when (s - 1, 0) is elsewhere.
  std::vector<std::unique_ptr<Communicator>> sends;
  std::unique_ptr<Communicator> receive;
  // x_out of ranks other than 0; on a last stage spanning processes, the
  // logits message to or from rank 0.
  std::vector<float> scratch;
  // The communicators whose time and bytes are this device's communication:
  // its tensor group and the channels it sends on.
  std::vector<const Communicator*> outgoing() const {
    std::vector<const Communicator*> out{comm.get()};
    for (const auto& c : sends) out.push_back(c.get());
    return out;
  }
  // Written by the device's jobs, read by stats() while other steps may be
  // in flight.
  std::atomic<double> busy_s{0};
  std::shared_ptr<DeviceQueue> queue = std::make_shared<DeviceQueue>();
  std::unique_ptr<DeviceRunner> runner;
};

struct ParallelEngine::Impl {
  ModelConfig config;
  ParallelEngineOptions layout;
  std::vector<std::unique_ptr<Device>> devices;  // stage-major; null where placed elsewhere
  // Where the devices run (placement.host, all 0 when empty) and what that
  // makes of each stage and boundary here.
  std::vector<int> host;
  int this_host = 0;
  std::vector<int> lead;             // per stage: its lowest rank here, -1 for none
  std::vector<char> spans;           // per stage: its tensor group spans processes
  std::vector<char> credited;        // per boundary: both (s, 0) and (s + 1, 0) here
  std::vector<ShardDims> last_dims;  // per rank of the last stage
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
  int host_of(int stage, int rank) const { return host[size_t(stage * layout.tensor + rank)]; }
  bool here(int stage, int rank) const { return host_of(stage, rank) == this_host; }
  bool sampler() const { return here(layout.pipeline - 1, 0); }
  size_t vocab_stride() const { return size_t(last_dims[0].vocab_stride); }
  // The hosts other than (b, 0)'s that hold ranks of stage b + 1, in order.
  std::vector<int> receivers(int b) const;
  // Whether this process takes stage b's output from another one.
  bool receives(int b) const { return !here(b, 0) && lead[size_t(b) + 1] >= 0; }

  // Checks the placement and derives lead, spans and credited.
  void place(const ProcessPlacement& placement);
  // Connects the cross-process communicators, in the order every process
  // follows (ProcessPlacement), and the in-process groups.
  void connect(const ProcessPlacement& placement);

  // A device that fails records the step's error, wakes everyone (peers
  // blocked in collectives, later stages waiting for its micro-batches,
  // earlier ones waiting for credits) and counts down its own remaining
  // micro-batches. True when its failure is the step's first.
  // A receiving device also releases the local ranks waiting for the
  // micro-batches it has not received (from `arrived` on).
  bool fail(StepState& st, const Device& d, int from_mb, int arrived, std::exception_ptr e,
            const std::string& why);
  // Stops every cross-process communicator here: peers that wait on this
  // process learn why at once.
  void abort_remote(const std::string& why);
  // Device (s, t)'s share of a step: its stage's layers for every
  // micro-batch, in order, waiting for the previous stage and for credits.
  void run_device(StepState& st, int s, int t);
  // Boundaries between processes: the receiving rank takes micro-batch mb
  // of the previous stage's output and releases the ranks beside it; (s, 0)
  // sends its own to every other host of the next stage.
  void receive_input(StepState& st, Device& d, int mb);
  void send_output(StepState& st, Device& d, int mb);
  // Last stage spanning processes: ranks outside the sampling process send
  // rank 0 what sample() needs of their vocabulary slices.
  void send_logits(StepState& st, Device& d, int mb);
  void receive_logits(StepState& st, Device& d, int mb);
  // Greedy items take the best of each rank's local argmax (a distributed
  // argmax, ties to the lowest id); others gather the slices and sample.
  std::vector<int> sample(const StepState& st, bool keep_logits, std::vector<float>& logits_out,
                          std::vector<std::optional<TokenLogprobs>>& last_logprobs);
  // Items that want their prompt's log-probabilities: from every row,
  // gathered from the ranks' slices.
  std::vector<std::vector<TokenLogprobs>> prompt_logprobs(const StepState& st) const;
  // Row `row` of the last-stage ranks' buffers (one per rank, vocab_stride
  // a row), their vocabulary slices put together into `full`.
  void gather_row(const std::vector<std::vector<float>>& per_rank, size_t row,
                  std::vector<float>& full) const;
};

ParallelEngine::ParallelEngine(const Checkpoint& ckpt, DType dtype, ParallelEngineOptions layout,
                               DeviceLauncher launcher)
    : impl_(std::make_unique<Impl>()) {
  if (!launcher) launcher = launch_device_thread;
  Impl& m = *impl_;
  m.config = ckpt.config;
  m.samplers.set_eos_ids(ckpt.config.eos_ids);
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
  m.place(layout.placement);
  const auto [last_begin, last_end] = layout.stage_layers.back();
  for (int t = 0; t < T; ++t)
    m.last_dims.push_back(shard_dims(ckpt.config, ShardSpec{t, T, last_begin, last_end}));
  const ShardFactory make_shard = layout.shards
                                      ? layout.shards
                                      : cpu_shards(ckpt, dtype, layout.threads, layout.block_tokens,
                                                   layout.blocks, layout.kv_dtype);
  m.devices.resize(size_t(P * T));
  for (int s = 0; s < P; ++s)
    for (int t = 0; t < T; ++t) {
      if (!m.here(s, t)) continue;
      auto d = std::make_unique<Device>();
      d->stage = s;
      d->rank = t;
      const ShardSpec spec{t, T, layout.stage_layers[size_t(s)].first,
                           layout.stage_layers[size_t(s)].second};
      d->shard = make_shard(spec, s * T + t);
      m.devices[size_t(s * T + t)] = std::move(d);
    }
  m.connect(layout.placement);
  // The factories may refer to what only lives while the engine is built
  // (the checkpoint).
  m.layout.shards = nullptr;
  m.layout.local_group = nullptr;
  for (auto& d : m.devices)
    if (d) d->runner = launcher(d->stage, d->rank, d->queue);
  for (int s = 0; s + 1 < P; ++s) {
    m.credits.push_back(std::make_unique<std::counting_semaphore<>>(layout.credits));
    m.in_flight.push_back(std::make_unique<std::atomic<int>>(0));
    m.max_in_flight.push_back(0);
  }
}

void ParallelEngine::Impl::place(const ProcessPlacement& placement) {
  const int P = layout.pipeline, T = layout.tensor;
  host = placement.host;
  this_host = placement.this_host;
  if (host.empty()) {
    host.assign(size_t(P * T), 0);
    this_host = 0;
  }
  if (host.size() != size_t(P * T))
    throw std::invalid_argument("placement: " + std::to_string(host.size()) + " hosts for " +
                                std::to_string(P * T) + " devices (pipeline x tensor)");
  if (std::find(host.begin(), host.end(), this_host) == host.end())
    throw std::invalid_argument("placement: host " + std::to_string(this_host) +
                                " holds none of the replica's devices");
  for (int s = 0; s < P; ++s) {
    int first_here = -1;
    bool mixed = false;
    for (int t = 0; t < T; ++t) {
      if (here(s, t) && first_here < 0) first_here = t;
      mixed = mixed || host_of(s, t) != host_of(s, 0);
    }
    lead.push_back(first_here);
    spans.push_back(mixed);
    if (mixed && first_here >= 0 && !placement.tensor_group)
      throw std::invalid_argument("placement: stage " + std::to_string(s) +
                                  "'s tensor group spans processes; give tensor_group");
  }
  for (int b = 0; b + 1 < P; ++b) {
    credited.push_back(here(b, 0) && here(b + 1, 0));
    const bool crosses = (here(b, 0) && !receivers(b).empty()) || receives(b);
    if (crosses && !placement.boundary_channel)
      throw std::invalid_argument("placement: the boundary after stage " + std::to_string(b) +
                                  " joins processes; give boundary_channel");
  }
}

std::vector<int> ParallelEngine::Impl::receivers(int b) const {
  std::vector<int> out;
  for (int t = 0; t < layout.tensor; ++t) {
    const int h = host_of(b + 1, t);
    if (h != host_of(b, 0) && std::find(out.begin(), out.end(), h) == out.end()) out.push_back(h);
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// A factory's communicator, checked to be the one asked for.
std::unique_ptr<Communicator> checked(std::unique_ptr<Communicator> c, int rank, int size,
                                      const std::string& what) {
  if (!c || c->rank() != rank || c->size() != size)
    throw std::invalid_argument("placement: " + what + " did not return rank " +
                                std::to_string(rank) + " of a group of " + std::to_string(size));
  return c;
}

}  // namespace

void ParallelEngine::Impl::connect(const ProcessPlacement& placement) {
  const int P = layout.pipeline, T = layout.tensor;
  for (int s = 0; s < P; ++s) {
    if (lead[size_t(s)] < 0) {
      // Nothing of this stage here.
    } else if (!spans[size_t(s)]) {
      std::vector<std::unique_ptr<Communicator>> group =
          layout.local_group ? layout.local_group(s, T) : make_in_process_communicators(T);
      if (int(group.size()) != T)
        throw std::invalid_argument("local_group(stage " + std::to_string(s) + ") returned " +
                                    std::to_string(group.size()) + " ranks for " +
                                    std::to_string(T));
      for (int t = 0; t < T; ++t)
        device(s, t).comm = checked(std::move(group[size_t(t)]), t, T,
                                    "local_group(stage " + std::to_string(s) + ")");
    } else {
      std::vector<int> ranks;
      for (int t = 0; t < T; ++t)
        if (here(s, t)) ranks.push_back(t);
      auto comms = join_at_once(ranks, [&](int t) {
        return checked(
            placement.tensor_group(s, t), t, T,
            "tensor_group(stage " + std::to_string(s) + ", rank " + std::to_string(t) + ")");
      });
      for (size_t i = 0; i < ranks.size(); ++i) device(s, ranks[i]).comm = std::move(comms[i]);
    }
    if (s + 1 == P) continue;
    auto channel = [&](int to_host, int rank) {
      return checked(placement.boundary_channel(s, to_host, rank), rank, 2,
                     "boundary_channel(stage " + std::to_string(s) + ", to host " +
                         std::to_string(to_host) + ")");
    };
    if (here(s, 0)) {
      for (int h : receivers(s)) device(s, 0).sends.push_back(channel(h, 0));
    } else if (receives(s)) {
      device(s + 1, lead[size_t(s) + 1]).receive = channel(this_host, 1);
    }
  }
}

ParallelEngine::~ParallelEngine() {
  // Peers in other processes must not wait for this part's devices; then
  // the runners, whose jobs use the devices' models and caches.
  impl_->abort_remote("the replica's part on host " + std::to_string(impl_->this_host) +
                      " was shut down");
  for (auto& d : impl_->devices)
    if (d) d->runner.reset();
}

void ParallelEngine::abort_peers(const std::string& why) {
  impl_->abort_remote(why);
}

void ParallelEngine::Impl::abort_remote(const std::string& why) {
  for (auto& d : devices) {
    if (!d) continue;
    if (spans[size_t(d->stage)]) d->comm->abort(why);
    for (auto& c : d->sends) c->abort(why);
    if (d->receive) d->receive->abort(why);
  }
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
  bool keep_logits = false;
  std::vector<int> first;      // micro-batch mb: items [first[mb], first[mb+1])
  std::vector<size_t> tokens;  // per micro-batch
  std::vector<std::vector<std::vector<float>>> act;  // [stage boundary][mb] activations
  std::vector<std::vector<float>> logits;            // per last-stage rank
  // Items that want every row's logits (StepItem::wants_prompt_logprobs):
  // item i's rows start at row_first[i] (n + 1 entries), in row_logits of
  // each last-stage rank, when any item wants them.
  std::vector<size_t> row_first;
  std::vector<std::vector<float>> row_logits;
  // Last stage spanning processes, in the sampling process: the greedy
  // candidate of each rank outside it, [rank * items + item].
  std::vector<ArgMax> remote_best;
  // [stage][mb]: the stage's ranks here are done with the micro-batch, and
  // its output has arrived here when it was computed elsewhere.
  std::vector<std::vector<std::unique_ptr<std::latch>>> done;
  std::mutex err_mu;
  std::exception_ptr error;
  std::vector<std::vector<double>> mb_seconds;  // [stage][mb], the stage's lead rank here
  std::atomic<int> jobs_left{0};
  std::function<void()> on_done;
  // Called once by every device job, however it ends; the last one reports.
  void job_over() {
    if (--jobs_left == 0 && on_done) on_done();
  }
};

bool ParallelEngine::Impl::fail(StepState& st, const Device& d, int from_mb, int arrived,
                                std::exception_ptr e, const std::string& why) {
  bool first = false;
  {
    std::lock_guard<std::mutex> l(st.err_mu);
    first = !st.error;
    if (first) st.error = e;
  }
  for (auto& dev : devices)
    if (dev) dev->comm->abort(why);
  abort_remote(why);
  const int s = d.stage;
  for (int mb = from_mb; mb < st.M; ++mb) st.done[size_t(s)][size_t(mb)]->count_down();
  if (d.receive)
    for (int mb = arrived; mb < st.M; ++mb) st.done[size_t(s - 1)][size_t(mb)]->count_down();
  for (auto& c : credits) c->release(st.M);
  return first;
}

void ParallelEngine::Impl::run_device(StepState& st, int s, int t) {
  const int P = layout.pipeline, T = layout.tensor;
  Device& d = device(s, t);
  const size_t dim = size_t(config.dim);
  const size_t stride = vocab_stride();
  const bool gathers = s + 1 == P && spans[size_t(s)];
  int mb = 0, arrived = 0;
  try {
    for (; mb < st.M; ++mb) {
      if (d.receive) {
        receive_input(st, d, mb);
        ++arrived;
      }
      if (s > 0) st.done[size_t(s - 1)][size_t(mb)]->wait();
      {
        std::lock_guard<std::mutex> l(st.err_mu);
        if (st.error) throw std::runtime_error("step aborted");
      }
      if (s + 1 < P && t == 0 && credited[size_t(s)]) credits[size_t(s)]->acquire();
      const auto t0 = Clock::now();
      const std::span<const StepItem> items(
          st.items.data() + st.first[size_t(mb)],
          size_t(st.first[size_t(mb) + 1] - st.first[size_t(mb)]));
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
        if (!st.row_logits.empty())
          io.row_logits =
              st.row_logits[size_t(t)].data() + st.row_first[size_t(st.first[size_t(mb)])] * stride;
      }
      d.shard->forward(items, io);
      if (size_t(s) < layout.stage_delay_s.size() && layout.stage_delay_s[size_t(s)] > 0)
        std::this_thread::sleep_for(std::chrono::duration<double>(layout.stage_delay_s[size_t(s)]));
      if (!d.sends.empty()) send_output(st, d, mb);
      if (gathers && t == 0) receive_logits(st, d, mb);
      if (gathers && !here(s, 0)) send_logits(st, d, mb);
      const double took = seconds_since(t0);
      d.busy_s += took;
      if (t == lead[size_t(s)]) st.mb_seconds[size_t(s)][size_t(mb)] = took;
      if (t == 0 && s + 1 < P && credited[size_t(s)]) {
        const int now = ++*in_flight[size_t(s)];
        std::lock_guard<std::mutex> l(in_flight_mu);
        max_in_flight[size_t(s)] = std::max(max_in_flight[size_t(s)], now);
      }
      // The previous stage's buffer for this micro-batch is consumed.
      if (s > 0 && t == 0 && credited[size_t(s - 1)]) {
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
    const bool first = fail(st, d, mb, arrived, std::current_exception(), why);
    // Dead before the step is over: once finish() has the error, the next
    // launch must find this device down (its runner would close the queue
    // only after the rethrow, when a launch may already have gone through).
    if (first) d.queue->close(device_death(s, t, e.what()));
    st.job_over();
    if (first) throw;
    return;
  } catch (...) {
    const bool first =
        fail(st, d, mb, arrived, std::current_exception(), "a shard failed: unknown exception");
    if (first) d.queue->close(device_death(s, t, "unknown exception"));
    st.job_over();
    if (first) throw;
    return;
  }
  st.job_over();
}

void ParallelEngine::Impl::receive_input(StepState& st, Device& d, int mb) {
  const int b = d.stage - 1;
  auto& x = st.act[size_t(b)][size_t(mb)];
  d.receive->recv(x.data(), x.size(), 0);
  st.done[size_t(b)][size_t(mb)]->count_down();
}

void ParallelEngine::Impl::send_output(StepState& st, Device& d, int mb) {
  const auto& x = st.act[size_t(d.stage)][size_t(mb)];
  for (auto& channel : d.sends) channel->send(x.data(), x.size(), 1);
}

namespace {

// Which of a micro-batch's items a rank outside the sampling process
// reports to rank 0, and how: its greedy candidate (value, then the id's
// bits) or its whole slice of the row; then its slices of every row of the
// items that want them (prompt log-probabilities). Every rank derives the
// same from the items, so the message sizes agree.
struct LogitsMessage {
  std::vector<int> best, rows;  // item indices
  size_t first_prompt_row = 0, prompt_rows = 0;
  size_t floats(size_t stride) const {
    return 2 * best.size() + (rows.size() + prompt_rows) * stride;
  }
};

LogitsMessage logits_message(const std::vector<StepItem>& items,
                             const std::vector<size_t>& row_first, int begin, int end,
                             bool keep_logits) {
  LogitsMessage m;
  if (!row_first.empty()) {
    m.first_prompt_row = row_first[size_t(begin)];
    m.prompt_rows = row_first[size_t(end)] - m.first_prompt_row;
  }
  for (int i = begin; i < end; ++i) {
    const StepItem& it = items[size_t(i)];
    if (!it.sample) continue;
    // Log-probabilities need the whole row, as sampling and penalties do.
    const bool candidate =
        it.sampling.temperature <= 0 && it.sampling.logprobs < 0 && !it.sampling.adjusts_logits();
    (candidate && !keep_logits ? m.best : m.rows).push_back(i);
  }
  return m;
}

}  // namespace

void ParallelEngine::Impl::send_logits(StepState& st, Device& d, int mb) {
  const auto msg = logits_message(st.items, st.row_first, st.first[size_t(mb)],
                                  st.first[size_t(mb) + 1], st.keep_logits);
  const size_t stride = vocab_stride();
  if (msg.floats(stride) == 0) return;
  const ShardDims& dims = last_dims[size_t(d.rank)];
  const float* logits = st.logits[size_t(d.rank)].data();
  d.scratch.resize(msg.floats(stride));
  float* out = d.scratch.data();
  for (int i : msg.best) {
    const float* row = logits + size_t(i) * stride;
    const int local = argmax({row, size_t(dims.vocab)});
    const int id = dims.vocab_begin + local;
    out[0] = row[local];
    std::memcpy(out + 1, &id, sizeof id);
    out += 2;
  }
  for (int i : msg.rows) out = std::copy_n(logits + size_t(i) * stride, stride, out);
  if (msg.prompt_rows > 0)
    std::copy_n(st.row_logits[size_t(d.rank)].data() + msg.first_prompt_row * stride,
                msg.prompt_rows * stride, out);
  d.comm->send(d.scratch.data(), d.scratch.size(), 0);
}

void ParallelEngine::Impl::receive_logits(StepState& st, Device& d, int mb) {
  const auto msg = logits_message(st.items, st.row_first, st.first[size_t(mb)],
                                  st.first[size_t(mb) + 1], st.keep_logits);
  const size_t stride = vocab_stride(), n = st.items.size();
  if (msg.floats(stride) == 0) return;
  const int P = layout.pipeline;
  for (int r = 1; r < layout.tensor; ++r) {
    if (here(P - 1, r)) continue;
    d.scratch.resize(msg.floats(stride));
    d.comm->recv(d.scratch.data(), d.scratch.size(), r);
    const float* in = d.scratch.data();
    for (int i : msg.best) {
      ArgMax& c = st.remote_best[size_t(r) * n + size_t(i)];
      c.value = in[0];
      std::memcpy(&c.index, in + 1, sizeof c.index);
      in += 2;
    }
    for (int i : msg.rows) {
      std::copy_n(in, stride, st.logits[size_t(r)].data() + size_t(i) * stride);
      in += stride;
    }
    if (msg.prompt_rows > 0)
      std::copy_n(in, msg.prompt_rows * stride,
                  st.row_logits[size_t(r)].data() + msg.first_prompt_row * stride);
  }
}

int ParallelEngine::microbatches_for(size_t items) const {
  const ParallelEngineOptions& l = impl_->layout;
  return std::max(1, std::min(int(items), l.microbatches > 0 ? l.microbatches : l.pipeline));
}

bool ParallelEngine::samples() const {
  return impl_->sampler();
}

uint64_t ParallelEngine::launch(std::vector<StepItem> items, std::function<void()> on_done) {
  const int M = microbatches_for(items.size());
  return launch_split(std::move(items), M, std::move(on_done));
}

uint64_t ParallelEngine::launch_split(std::vector<StepItem> items, int microbatches,
                                      std::function<void()> on_done) {
  Impl& m = *impl_;
  const int P = m.layout.pipeline, T = m.layout.tensor, n = int(items.size());
  if (n == 0) throw std::invalid_argument("launch: a step needs at least one item");
  if (microbatches < 1) throw std::invalid_argument("launch: a step needs >= 1 micro-batch");
  // A dead shard leaves its group unable to step (its KV cache slice is
  // gone): report it, and let supervision rebuild the group.
  for (const auto& d : m.devices)
    if (d && d->queue->closed())
      throw std::runtime_error("shard (stage " + std::to_string(d->stage) + ", rank " +
                               std::to_string(d->rank) + ") is down: " + d->queue->close_reason());
  auto state = std::make_shared<StepState>();
  StepState& st = *state;
  st.items = std::move(items);
  st.on_done = std::move(on_done);
  st.keep_logits = keep_logits_;
  const int M = std::min(n, microbatches);
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
  if (m.lead[size_t(P - 1)] >= 0)
    st.logits.assign(size_t(T), std::vector<float>(size_t(n) * m.vocab_stride()));
  size_t rows = 0;
  for (const StepItem& it : st.items) rows += it.wants_prompt_logprobs() ? it.tokens.size() : 0;
  if (rows > 0) {
    st.row_first.assign(1, 0);
    for (const StepItem& it : st.items)
      st.row_first.push_back(st.row_first.back() +
                             (it.wants_prompt_logprobs() ? it.tokens.size() : 0));
    if (m.lead[size_t(P - 1)] >= 0)
      st.row_logits.assign(size_t(T), std::vector<float>(rows * m.vocab_stride()));
  }
  if (m.spans[size_t(P - 1)] && m.sampler()) st.remote_best.resize(size_t(T * n));
  st.done.resize(size_t(P));
  int jobs = 0;
  for (int s = 0; s < P; ++s) {
    int here = 0;
    for (int t = 0; t < T; ++t) here += m.here(s, t) ? 1 : 0;
    jobs += here;
    const int count = here + (s + 1 < P && m.receives(s) ? 1 : 0);
    for (int mb = 0; mb < M; ++mb)
      st.done[size_t(s)].push_back(std::make_unique<std::latch>(count));
  }
  st.mb_seconds.assign(size_t(P), std::vector<double>(size_t(M), 0.0));
  st.jobs_left = jobs;
  if (m.active++ == 0) m.active_since = Clock::now();

  for (auto& d : m.devices) {
    if (!d) continue;
    const int s = d->stage, t = d->rank;
    DeviceJob job;
    job.abandon = [&m, state, s, t](const std::string& why) {
      m.fail(*state, m.device(s, t), 0, 0, std::make_exception_ptr(std::runtime_error(why)), why);
      state->job_over();
    };
    job.run = [&m, state, s, t] { m.run_device(*state, s, t); };
    d->queue->post(std::move(job));
  }
  const uint64_t ticket = m.next_ticket++;
  m.launched.emplace(ticket, std::move(state));
  return ticket;
}

std::vector<int> ParallelEngine::Impl::sample(
    const StepState& st, bool keep_logits, std::vector<float>& logits_out,
    std::vector<std::optional<TokenLogprobs>>& last_logprobs) {
  const int T = layout.tensor, n = int(st.items.size());
  const size_t stride = vocab_stride();
  std::vector<int> out(size_t(n), -1);
  logits_out.clear();
  last_logprobs.assign(size_t(n), std::nullopt);
  // The full row is gathered only where it is used: sampling, or tests.
  std::vector<float> full;
  auto gather = [&](int i) { gather_row(st.logits, size_t(i), full); };
  for (int i = 0; i < n; ++i) {
    const StepItem& it = st.items[size_t(i)];
    if (!it.sample) continue;
    const bool wants_logprobs = it.sampling.logprobs >= 0;
    if (keep_logits || wants_logprobs) gather(i);
    if (keep_logits) {
      logits_out.insert(logits_out.end(), full.begin(), full.end());
    }
    // Greedy takes the best of the ranks' argmaxes; over logits a bias or
    // penalty changes, the sampler picks from the adjusted row.
    if (it.sampling.temperature <= 0 && !it.sampling.adjusts_logits()) {
      float best = -std::numeric_limits<float>::infinity();
      int best_id = -1;
      for (int t = 0; t < T; ++t) {
        ArgMax c;
        if (!st.remote_best.empty() && !keep_logits && !wants_logprobs &&
            !here(layout.pipeline - 1, t)) {
          c = st.remote_best[size_t(t) * size_t(n) + size_t(i)];
        } else {
          const ShardDims& dm = last_dims[size_t(t)];
          const float* row = st.logits[size_t(t)].data() + size_t(i) * stride;
          const int local = argmax({row, size_t(dm.vocab)});
          c = {row[local], dm.vocab_begin + local};
        }
        if (best_id < 0 || c.value > best) {
          best = c.value;
          best_id = c.index;
        }
      }
      out[size_t(i)] = best_id;
      if (wants_logprobs)
        last_logprobs[size_t(i)] = token_logprobs(full, best_id, it.sampling.logprobs);
      continue;
    }
    if (!keep_logits && !wants_logprobs) gather(i);
    out[size_t(i)] = samplers.sample(it, full, &last_logprobs[size_t(i)]);
  }
  return out;
}

void ParallelEngine::Impl::gather_row(const std::vector<std::vector<float>>& per_rank, size_t row,
                                      std::vector<float>& full) const {
  full.resize(size_t(config.vocab_size));
  for (int t = 0; t < layout.tensor; ++t) {
    const ShardDims& dm = last_dims[size_t(t)];
    std::copy_n(per_rank[size_t(t)].data() + row * vocab_stride(), dm.vocab,
                full.data() + dm.vocab_begin);
  }
}

std::vector<std::vector<TokenLogprobs>> ParallelEngine::Impl::prompt_logprobs(
    const StepState& st) const {
  std::vector<std::vector<TokenLogprobs>> out(st.items.size());
  if (st.row_logits.empty()) return out;
  std::vector<float> full;
  for (size_t i = 0; i < st.items.size(); ++i) {
    if (!st.items[i].wants_prompt_logprobs()) continue;
    out[i] = prompt_token_logprobs(st.items[i], [&](int j) {
      gather_row(st.row_logits, st.row_first[i] + size_t(j), full);
      return std::span<const float>(full);
    });
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
  // Every device here has finished this step's jobs once every stage has.
  for (int s = P - 1; s >= 0; --s)
    for (int mb = 0; mb < M; ++mb) st.done[size_t(s)][size_t(mb)]->wait();
  if (--m.active == 0) m.wall_s += seconds_since(m.active_since);
  if (st.error) std::rethrow_exception(st.error);
  last_samples_.clear();
  for (int s = 0; s < P; ++s) {
    if (m.lead[size_t(s)] < 0) continue;
    for (int mb = 0; mb < M; ++mb)
      last_samples_.push_back({s, st.tokens[size_t(mb)], st.mb_seconds[size_t(s)][size_t(mb)]});
  }
  ++m.steps;
  if (!m.sampler()) {
    last_logits_.clear();
    last_logprobs_.assign(st.items.size(), std::nullopt);
    last_prompt_logprobs_.assign(st.items.size(), {});
    return std::vector<int>(st.items.size(), -1);
  }
  last_prompt_logprobs_ = m.prompt_logprobs(st);
  return m.sample(st, st.keep_logits, last_logits_, last_logprobs_);
}

void ParallelEngine::release(uint64_t seq) {
  impl_->samplers.release(seq);
}

void ParallelEngine::set_vocabulary(VocabularySource source) {
  impl_->samplers.set_vocabulary(std::move(source));
}

EngineStats ParallelEngine::stats() const {
  const Impl& m = *impl_;
  EngineStats st;
  st.steps = m.steps;
  st.wall_s = m.wall_s;
  // Per stage, its lead rank here: its collectives and the activations it
  // sends to other processes (a receive is waiting for the previous stage,
  // idle as the in-process hand-over is). Stages with no rank here: zeros.
  for (int s = 0; s < m.layout.pipeline; ++s) {
    StageStats stage;
    if (m.lead[size_t(s)] >= 0) {
      const Device& d = *m.devices[size_t(s * m.layout.tensor + m.lead[size_t(s)])];
      stage.busy_s = d.busy_s.load();
      for (const Communicator* c : d.outgoing()) {
        const CommStats cs = c->stats();
        stage.comm_s += cs.seconds;
        stage.comm_bytes += cs.bytes;
      }
    }
    st.stages.push_back(stage);
  }
  for (const auto& d : m.devices) {
    st.weight_bytes.push_back(d ? d->shard->weight_bytes() : 0);
    st.streamed_bytes.push_back(d ? d->shard->streamed_bytes() : 0);
  }
  {
    std::lock_guard<std::mutex> l(const_cast<std::mutex&>(m.in_flight_mu));
    st.max_in_flight = m.max_in_flight;
  }
  return st;
}

}  // namespace troupe
