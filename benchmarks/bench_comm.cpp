// all_reduce_sum between two ranks: Gloo over TCP loopback against the
// in-process communicator, on a decode step's vector (768 x 16 floats) and a
// prefill's (768 x 256). The two ranks are the benchmark's two threads; each
// Gloo rank has its own device and connections, as two processes would.
// For reference, Gloo's own ring all-reduce on the same vectors (it adds in
// ring order, which the contract does not allow; see gloo_communicator.h).
// Google Benchmark sums the iterations of both threads, so its time column
// is half a call; p50_us is the median call itself.
// Run: build/bench_comm --benchmark_min_time=1 --benchmark_repetitions=5
#include <benchmark/benchmark.h>
#include <gloo/allreduce_ring.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "gpu/comm/gloo_communicator.h"
#include "gpu/comm/in_process_communicator.h"

namespace {

using namespace troupe;

using Group = std::vector<std::unique_ptr<Communicator>>;

Group& gloo_group() {
  static Group group = [] {
    InMemoryRendezvousStore store;
    GlooOptions options;
    options.group = "bench";
    Group g(2);
    std::thread peer([&] { g[1] = std::make_unique<GlooCommunicator>(1, 2, store, options); });
    g[0] = std::make_unique<GlooCommunicator>(0, 2, store, options);
    peer.join();
    return g;
  }();
  return group;
}

Group& in_process_group() {
  static Group group = [] {
    Group g;
    for (auto& c : make_in_process_group(2)) g.push_back(std::move(c));
    return g;
  }();
  return group;
}

// Two ranks of plain Gloo contexts over loopback, for its ring all-reduce.
std::vector<std::shared_ptr<gloo::Context>>& gloo_ring_contexts() {
  static std::vector<std::shared_ptr<gloo::Context>> contexts = [] {
    gloo::rendezvous::HashStore store;
    std::vector<std::shared_ptr<gloo::Context>> c(2);
    auto join = [&](int rank) {
      gloo::transport::tcp::attr attr;
      attr.hostname = "127.0.0.1";
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, 2);
      ctx->connectFullMesh(store, device);
      c[size_t(rank)] = ctx;
    };
    std::thread peer(join, 1);
    join(0);
    peer.join();
    return c;
  }();
  return contexts;
}

// Runs call() once per iteration on each of the two threads (both run the
// same number of iterations, so every call has its peer). Besides the mean,
// reports the median call on thread 0: on a shared machine, descheduled
// threads put a long tail on the mean.
template <class Call>
void run_calls(benchmark::State& state, size_t n, Call call) {
  std::vector<double> us;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n * sizeof(float)));
  if (state.thread_index() == 0 && !us.empty()) {
    std::nth_element(us.begin(), us.begin() + long(us.size() / 2), us.end());
    state.counters["p50_us"] = us[us.size() / 2];
  }
}

void BM_GlooRingAllReduce(benchmark::State& state) {
  auto ctx = gloo_ring_contexts()[size_t(state.thread_index())];
  std::vector<float> v(size_t(state.range(0)), 1.f);
  gloo::AllreduceRing<float> ring(ctx, {v.data()}, int(v.size()));
  run_calls(state, v.size(), [&] { ring.run(); });
}

void BM_AllReduce(benchmark::State& state, Group& (*group)()) {
  Communicator& comm = *group()[size_t(state.thread_index())];
  std::vector<float> v(size_t(state.range(0)), 1.f);
  run_calls(state, v.size(), [&] { comm.all_reduce_sum(v.data(), v.size()); });
}

BENCHMARK_CAPTURE(BM_AllReduce, gloo, gloo_group)
    ->Arg(768 * 16)
    ->Arg(768 * 256)
    ->Threads(2)
    ->UseRealTime();
BENCHMARK(BM_GlooRingAllReduce)->Arg(768 * 16)->Arg(768 * 256)->Threads(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_AllReduce, in_process, in_process_group)
    ->Arg(768 * 16)
    ->Arg(768 * 256)
    ->Threads(2)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
