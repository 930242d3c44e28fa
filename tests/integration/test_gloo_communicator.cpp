// The Gloo communicator over TCP on 127.0.0.1: every collective for P = 1..4
// ranks (threads, each with its own Gloo device and connections), bit for bit
// the same as the in-process communicator; failures that must throw
// CommError naming the cause instead of hanging: abort() from another
// thread, a peer that leaves, a join or call that times out, and processes
// that are SIGKILLed or SIGSTOPped in the middle of a collective.
//
// Rendezvous: threads share an InMemoryRendezvousStore; forked processes use
// FileStore below (test-only: a key is a file in a temporary directory).
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <limits>
#include <map>
#include <thread>
#include <vector>

#include "gpu/comm/gloo_communicator.h"
#include "gpu/comm/in_process_communicator.h"
#include "support/comm_support.h"
#include "support/test_support.h"
#include "util/rng.h"

namespace troupe {
namespace {

using namespace test::comm;
using test::contains;

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

const std::vector<std::string> kNames = {"node-a", "node-b", "node-c", "node-d"};

// A fresh group name per group: a rebuilt group never reads the old keys.
GlooOptions options(int p, std::chrono::milliseconds timeout = 10s) {
  static std::atomic<int> groups{0};
  GlooOptions o;
  o.group = "test-" + std::to_string(getpid()) + "-" + std::to_string(groups.fetch_add(1));
  o.timeout = timeout;
  o.peer_names.assign(kNames.begin(), kNames.begin() + p);
  return o;
}

// Runs fn(rank's communicator) for P ranks, each a thread that joins the
// group first; the communicators are destroyed only after every rank is
// done (destroying one makes its peers' later calls fail). Returns what each
// rank threw.
std::vector<std::exception_ptr> run_gloo(int p, const std::function<void(GlooCommunicator&)>& fn,
                                         GlooOptions o) {
  InMemoryRendezvousStore store;
  std::vector<std::unique_ptr<GlooCommunicator>> comms(static_cast<size_t>(p));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(p));
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r) {
    threads.emplace_back([&, r] {
      try {
        comms[size_t(r)] = std::make_unique<GlooCommunicator>(r, p, store, o);
        fn(*comms[size_t(r)]);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

std::vector<std::exception_ptr> run_gloo(int p, const std::function<void(GlooCommunicator&)>& fn) {
  return run_gloo(p, fn, options(p));
}

// What the in-process communicator makes of per-rank inputs under fn.
std::vector<std::vector<float>> in_process(int p, std::vector<std::vector<float>> data,
                                           const std::function<void(Communicator&, float*)>& fn) {
  InProcessGroupOptions o;
  o.timeout = 30s;
  auto comms = make_in_process_group(p, o);
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r) {
    threads.emplace_back([&, r] { fn(*comms[size_t(r)], data[size_t(r)].data()); });
  }
  for (auto& t : threads) t.join();
  return data;
}

class GlooRanks : public ::testing::TestWithParam<int> {};

TEST_P(GlooRanks, AllReduceIsBitIdenticalToTheInProcessCommunicator) {
  const int p = GetParam();
  // Sizes around the chunk boundaries: smaller than P, not divisible by P,
  // larger than a summation block.
  const std::vector<size_t> sizes = {0, 1, 2, 3, 7, 17, 1000, 5003, 12289};
  std::map<size_t, std::vector<std::vector<float>>> inputs, expected;
  for (size_t n : sizes) {
    for (int r = 0; r < p; ++r) inputs[n].push_back(rank_data(r, n, n));
    expected[n] =
        in_process(p, inputs[n], [n](Communicator& c, float* d) { c.all_reduce_sum(d, n); });
    ASSERT_TRUE(same_bits(expected[n][0], rank_order_sum(inputs[n]))) << "n=" << n;
  }
  auto data = inputs;
  expect_no_errors(run_gloo(p, [&](GlooCommunicator& c) {
    for (size_t n : sizes) c.all_reduce_sum(data[n][size_t(c.rank())].data(), n);
  }));
  for (size_t n : sizes) {
    for (int r = 0; r < p; ++r) {
      EXPECT_TRUE(same_bits(data[n][size_t(r)], expected[n][size_t(r)]))
          << "P=" << p << " n=" << n << " rank " << r;
    }
  }
}

TEST_P(GlooRanks, ReduceScatterIsBitIdenticalToTheInProcessCommunicatorAlsoInPlace) {
  const int p = GetParam();
  const size_t n = 1500;  // more than one summation block per rank
  std::vector<std::vector<float>> in;
  for (int r = 0; r < p; ++r) in.push_back(rank_data(r, n * size_t(p), 9));
  const auto expected = in_process(p, in, [&](Communicator& c, float* d) {
    std::vector<float> out(n);
    c.reduce_scatter_sum(d, n, out.data());
    std::copy(out.begin(), out.end(), d);
  });
  std::vector<std::vector<float>> out(static_cast<size_t>(p), std::vector<float>(n));
  auto in_place = in;
  expect_no_errors(run_gloo(p, [&](GlooCommunicator& c) {
    const size_t r = size_t(c.rank());
    c.reduce_scatter_sum(in[r].data(), n, out[r].data());
    c.reduce_scatter_sum(in_place[r].data(), n, in_place[r].data() + r * n);
  }));
  for (int r = 0; r < p; ++r) {
    const std::vector<float> want(expected[size_t(r)].begin(),
                                  expected[size_t(r)].begin() + long(n));
    EXPECT_TRUE(same_bits(out[size_t(r)], want)) << "rank " << r;
    const std::vector<float> got(in_place[size_t(r)].begin() + long(size_t(r) * n),
                                 in_place[size_t(r)].begin() + long(size_t(r + 1) * n));
    EXPECT_TRUE(same_bits(got, want)) << "rank " << r << " (in place)";
  }
}

TEST_P(GlooRanks, AllGatherIsRankMajorAlsoInPlace) {
  const int p = GetParam();
  const size_t n = 37;
  std::vector<float> expected;
  for (int r = 0; r < p; ++r) {
    const auto d = rank_data(r, n, 5);
    expected.insert(expected.end(), d.begin(), d.end());
  }
  std::vector<std::vector<float>> out(static_cast<size_t>(p),
                                      std::vector<float>(n * size_t(p), -1.f));
  auto in_place = out;
  expect_no_errors(run_gloo(p, [&](GlooCommunicator& c) {
    const size_t r = size_t(c.rank());
    const auto mine = rank_data(c.rank(), n, 5);
    c.all_gather(mine.data(), n, out[r].data());
    std::copy(mine.begin(), mine.end(), in_place[r].begin() + long(r * n));
    c.all_gather(in_place[r].data() + r * n, n, in_place[r].data());
  }));
  for (int r = 0; r < p; ++r) {
    EXPECT_TRUE(same_bits(out[size_t(r)], expected)) << "rank " << r;
    EXPECT_TRUE(same_bits(in_place[size_t(r)], expected)) << "rank " << r << " (in place)";
  }
}

TEST_P(GlooRanks, BroadcastFromEveryRoot) {
  const int p = GetParam();
  std::vector<std::vector<std::vector<float>>> data(static_cast<size_t>(p));  // [root][rank]
  for (int root = 0; root < p; ++root) {
    for (int r = 0; r < p; ++r) data[size_t(root)].push_back(rank_data(r, 300, 11));
  }
  expect_no_errors(run_gloo(p, [&](GlooCommunicator& c) {
    for (int root = 0; root < p; ++root) {
      c.broadcast(data[size_t(root)][size_t(c.rank())].data(), 300, root);
    }
  }));
  for (int root = 0; root < p; ++root) {
    for (int r = 0; r < p; ++r) {
      EXPECT_TRUE(same_bits(data[size_t(root)][size_t(r)], rank_data(root, 300, 11)))
          << "root " << root << " rank " << r;
    }
  }
}

TEST_P(GlooRanks, SendRecvAlongAPipelineAndBack) {
  const int p = GetParam();
  if (p == 1) GTEST_SKIP() << "no peer to send to";
  expect_no_errors(run_gloo(p, [&](GlooCommunicator& c) {
    const int r = c.rank();
    // Like pipeline stages: each adds its rank and passes the activations
    // on; the last stage returns them to the first.
    for (int step = 0; step < 50; ++step) {
      std::vector<float> act(size_t(64 + step));
      if (r == 0) {
        for (size_t i = 0; i < act.size(); ++i) act[i] = float(step * 100 + int(i));
      } else {
        c.recv(act.data(), act.size(), r - 1);
      }
      for (auto& x : act) x += float(r);
      c.send(act.data(), act.size(), (r + 1) % p);
      if (r == 0) {
        c.recv(act.data(), act.size(), p - 1);
        for (size_t i = 0; i < act.size(); ++i) {
          ASSERT_EQ(act[i], float(step * 100 + int(i) + p * (p - 1) / 2));
        }
      }
    }
  }));
}

TEST_P(GlooRanks, BarrierSeparatesPhases) {
  const int p = GetParam();
  std::atomic<int> arrived{0}, early{0};
  expect_no_errors(run_gloo(p, [&](GlooCommunicator& c) {
    for (int phase = 1; phase <= 50; ++phase) {
      arrived.fetch_add(1);
      c.barrier();
      if (arrived.load() < phase * p) early.fetch_add(1);
      c.barrier();
    }
  }));
  EXPECT_EQ(early.load(), 0);
}

TEST_P(GlooRanks, AllArgmaxTakesTheLargestAndTiesGoToTheLowestIndex) {
  const int p = GetParam();
  std::vector<ArgMax> tie(static_cast<size_t>(p)), distinct(static_cast<size_t>(p)),
      nan_and_empty(static_cast<size_t>(p));
  expect_no_errors(run_gloo(p, [&](GlooCommunicator& c) {
    const int r = c.rank();
    const size_t i = size_t(r);
    tie[i] = c.all_argmax(2.5f, 1000 - r);
    distinct[i] = c.all_argmax(float(r == p / 2 ? 9 : r), 10 * r);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    nan_and_empty[i] = c.all_argmax(r == 0 ? -1.f : (r == 1 ? nan : -5.f), r == 2 ? -1 : 7 + r);
  }));
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(tie[size_t(r)].index, 1000 - (p - 1));
    EXPECT_EQ(distinct[size_t(r)].index, 10 * (p / 2));
    EXPECT_EQ(nan_and_empty[size_t(r)].index, 7);
  }
}

TEST_P(GlooRanks, MixedCollectivesOfChangingSizes) {
  const int p = GetParam();
  std::atomic<int> wrong{0};
  expect_no_errors(run_gloo(p, [&](GlooCommunicator& c) {
    MixedBuffers b(p, 200);
    for (int it = 0; it < 200; ++it) {
      wrong.fetch_add(mixed_collectives_round(c, it, size_t(1 + (it * 37) % 200), b));
      wrong.fetch_add(ring_exchange_round(c, it));
    }
  }));
  EXPECT_EQ(wrong.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(P, GlooRanks, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "P" + std::to_string(info.param); });

TEST(InMemoryRendezvousStore, GetWaitsForASetAndTimesOutNamingTheKeys) {
  InMemoryRendezvousStore store;
  std::thread setter([&] {
    std::this_thread::sleep_for(20ms);
    store.set("g/1", {'a', 'b'});
  });
  EXPECT_EQ(store.get("g/1", 5s), (std::vector<char>{'a', 'b'}));
  setter.join();
  store.wait({"g/1"}, 0ms);
  try {
    store.wait({"g/1", "g/2", "g/3"}, 10ms);
    ADD_FAILURE() << "wait returned";
  } catch (const CommError& e) {
    EXPECT_EQ(std::string(e.what()),
              "rendezvous: timed out after 0.01 s waiting for key(s) 'g/2', 'g/3'");
  }
}

// ---- failures among threads ----

TEST(GlooCommunicator, AbortFromAnotherThreadUnblocksAWaitingRank) {
  std::atomic<bool> rank0_done{false};
  std::atomic<double> abort_latency_s{-1};
  std::string later_on_rank1;
  const auto errors = run_gloo(2, [&](GlooCommunicator& c) {
    if (c.rank() == 1) {
      // Never joins the all-reduce; once rank 0 has given up, its next call
      // fails too: rank 0 told it why.
      while (!rank0_done.load()) std::this_thread::sleep_for(1ms);
      try {
        c.barrier();
      } catch (const CommError& e) {
        later_on_rank1 = e.what();
      }
      return;
    }
    std::atomic<int64_t> aborted_at{0};
    std::thread aborter([&] {
      std::this_thread::sleep_for(200ms);  // rank 0 is asleep in its wait by now
      aborted_at.store(Clock::now().time_since_epoch().count());
      c.abort("shard 1 died");
    });
    std::vector<float> v(1000, 1.f);
    try {
      c.all_reduce_sum(v.data(), v.size());
    } catch (...) {
      abort_latency_s.store(double(Clock::now().time_since_epoch().count() - aborted_at.load()) *
                            1e-9);
      aborter.join();
      rank0_done.store(true);
      throw;
    }
    aborter.join();
    rank0_done.store(true);
  });
  EXPECT_EQ(comm_error_message(errors[0]), "shard 1 died");
  EXPECT_FALSE(errors[1]);
  EXPECT_GE(abort_latency_s.load(), 0);
  // Far below the group's 30 s timeout: the abort, not the timeout, ended
  // the wait (a generous bound: a loaded machine delays threads).
  EXPECT_LT(abort_latency_s.load(), 5.0) << "abort took " << abort_latency_s.load() << " s";
  std::printf("abort -> CommError in the waiting rank: %.2f ms\n", abort_latency_s.load() * 1e3);
  EXPECT_TRUE(contains(later_on_rank1, "rank 0 (node-a) aborted: shard 1 died")) << later_on_rank1;
}

TEST(GlooCommunicator, AbortUnblocksARankInRecvAndLaterCallsThrowAtOnce) {
  const auto errors = run_gloo(2, [&](GlooCommunicator& c) {
    if (c.rank() == 1) return;  // never sends
    std::thread aborter([&] {
      std::this_thread::sleep_for(100ms);
      c.abort("stop");
    });
    float x = 0;
    try {
      c.recv(&x, 1, 1);
    } catch (...) {
      aborter.join();
      const auto t0 = Clock::now();
      EXPECT_THROW(c.send(&x, 1, 1), CommError);
      EXPECT_LT(seconds_since(t0), 0.01);
      throw;
    }
    aborter.join();
  });
  EXPECT_EQ(comm_error_message(errors[0]), "stop");
}

TEST(GlooCommunicator, APeerThatLeavesMakesLaterCallsThrowNamingIt) {
  InMemoryRendezvousStore store;
  const GlooOptions o = options(2);
  std::unique_ptr<GlooCommunicator> c1;
  std::thread t([&] { c1 = std::make_unique<GlooCommunicator>(1, 2, store, o); });
  GlooCommunicator c0(0, 2, store, o);
  t.join();
  std::thread leaver([&] {
    std::this_thread::sleep_for(50ms);
    c1.reset();
  });
  const auto t0 = Clock::now();
  try {
    c0.barrier();  // rank 1 never arrives; it leaves instead
    ADD_FAILURE() << "barrier returned";
  } catch (const CommError& e) {
    EXPECT_TRUE(contains(e.what(), "rank 1 (node-b) left the group")) << e.what();
  }
  EXPECT_LT(seconds_since(t0), 2.0);
  leaver.join();
  EXPECT_TRUE(c0.failed());
  float x = 1;
  EXPECT_THROW(c0.all_reduce_sum(&x, 1), CommError);
}

TEST(GlooCommunicator, AJoinThatTimesOutNamesTheRanksThatDidNotCome) {
  InMemoryRendezvousStore store;
  const GlooOptions o = options(3, 300ms);
  const auto t0 = Clock::now();
  try {
    GlooCommunicator c(0, 3, store, o);  // ranks 1 and 2 never come
    ADD_FAILURE() << "joined alone";
  } catch (const CommError& e) {
    EXPECT_TRUE(contains(e.what(), "rank 0 (node-a): rank 1 (node-b)")) << e.what();
    EXPECT_TRUE(contains(e.what(), "did not join within 0.3 s")) << e.what();
  }
  EXPECT_LT(seconds_since(t0), 5.0);
}

// A store that cannot be reached (its answer lost on the way) is not ranks
// that did not join: the error says what happened, at once.
class UnreachableStore final : public RendezvousStore {
 public:
  void set(const std::string&, const std::vector<char>&) override {}
  std::vector<char> get(const std::string& key, std::chrono::milliseconds) override {
    throw CommError("rendezvous: the coordinator did not answer for key '" + key +
                    "': request_timeout");
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds t) override {
    get(keys.at(0), t);
  }
};

TEST(GlooCommunicator, AStoreThatDoesNotAnswerIsNotRanksThatDidNotJoin) {
  UnreachableStore store;
  try {
    GlooCommunicator c(0, 2, store, options(2, 30000ms));
    ADD_FAILURE() << "joined";
  } catch (const CommError& e) {
    EXPECT_TRUE(contains(e.what(), "the coordinator did not answer for key")) << e.what();
    EXPECT_FALSE(contains(e.what(), "did not join")) << e.what();
  }
}

TEST(GlooCommunicator, MismatchedSizesTimeOutOnEveryRankWithoutCorruptingMemory) {
  const auto t0 = Clock::now();
  const auto errors = run_gloo(
      2,
      [&](GlooCommunicator& c) {
        std::vector<float> v(20, 1.f);
        c.all_reduce_sum(v.data(), c.rank() == 0 ? 10 : 20);
      },
      options(2, 500ms));
  EXPECT_LT(seconds_since(t0), 5.0);
  for (int r = 0; r < 2; ++r) {
    const std::string m = comm_error_message(errors[size_t(r)]);
    EXPECT_TRUE(contains(m, "timed out")) << m;
  }
}

TEST(GlooCommunicator, ABadArgumentFailsTheGroupSoThePeerDoesNotWait) {
  const auto t0 = Clock::now();
  const auto errors = run_gloo(2, [&](GlooCommunicator& c) {
    float x = 0;
    if (c.rank() == 0) c.send(&x, 1, 0);  // to itself
    if (c.rank() == 1) c.recv(&x, 1, 0);
  });
  EXPECT_LT(seconds_since(t0), 5.0);
  ASSERT_TRUE(errors[0]);
  EXPECT_THROW(std::rethrow_exception(errors[0]), std::invalid_argument);
  const std::string m = comm_error_message(errors[1]);
  EXPECT_TRUE(contains(m, "rank 0 (node-a) failed: send")) << m;
}

TEST(GlooCommunicator, CountersFollowTheBusBandwidthConventionAlsoWhenACallThrows) {
  const int p = 4;
  std::vector<CommStats> stats(static_cast<size_t>(p));
  std::latch everyone_done(p);
  expect_no_errors(run_gloo(p, [&](GlooCommunicator& c) {
    std::vector<float> v(1000, 1.f), g(size_t(10 * p)), rs(10);
    c.all_reduce_sum(v.data(), 1000);               // 2 * 3/4 * 4000 = 6000
    c.all_gather(v.data(), 10, g.data());           // 3 * 40 = 120
    c.reduce_scatter_sum(g.data(), 10, rs.data());  // 120
    c.broadcast(v.data(), 100, 0);                  // 400
    c.barrier();                                    // 0
    if (c.rank() == 0) c.send(v.data(), 50, 1);     // 200
    if (c.rank() == 1) c.recv(v.data(), 50, 0);     // 200
    c.barrier();
    // Nobody aborts while a peer may still wait for its last message.
    everyone_done.arrive_and_wait();
    c.abort("done");
    EXPECT_THROW(c.barrier(), CommError);  // a call that throws: counted, no bytes
    stats[size_t(c.rank())] = c.stats();
  }));
  for (int r = 0; r < p; ++r) {
    const CommStats& s = stats[size_t(r)];
    const uint64_t p2p = r <= 1 ? 200 : 0;
    EXPECT_EQ(s.bytes, 6000u + 120 + 120 + 400 + p2p) << "rank " << r;
    EXPECT_EQ(s.calls, 7u + (r <= 1 ? 1 : 0)) << "rank " << r;
    EXPECT_GT(s.seconds, 0);
  }
}

// ---- failures among processes ----

// A test-only rendezvous store shared by forked processes: a key is a file,
// written whole by a rename; readers poll.
class FileStore final : public RendezvousStore {
 public:
  explicit FileStore(std::filesystem::path dir) : dir_(std::move(dir)) {}
  void set(const std::string& key, const std::vector<char>& value) override {
    const auto tmp = path(key + ".tmp" + std::to_string(getpid()));
    std::ofstream(tmp, std::ios::binary).write(value.data(), std::streamsize(value.size()));
    std::filesystem::rename(tmp, path(key));
  }
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    std::ifstream in(path(key), std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      std::vector<std::string> missing;
      for (const auto& k : keys) {
        if (!std::filesystem::exists(path(k))) missing.push_back(k);
      }
      if (missing.empty()) return;
      if (Clock::now() >= deadline)
        throw RendezvousTimeout(rendezvous_timeout_message(missing, timeout));
      std::this_thread::sleep_for(1ms);
    }
  }

 private:
  std::filesystem::path path(std::string key) const {
    for (auto& ch : key) {
      if (ch == '/') ch = '_';
    }
    return dir_ / key;
  }
  std::filesystem::path dir_;
};

// Forked ranks, each reporting on its own pipe; whatever is still running
// is SIGKILLed (and SIGCONTed) and every child reaped on destruction.
class Ranks {
 public:
  ~Ranks() {
    for (auto& c : children_) {
      if (c.pid > 0) {
        kill(c.pid, SIGKILL);
        kill(c.pid, SIGCONT);
        waitpid(c.pid, nullptr, 0);
      }
      close(c.fd);
    }
  }
  // Starts a process that runs body(report) and exits; report(line) writes
  // a line to the parent.
  void spawn(const std::function<void(const std::function<void(const std::string&)>&)>& body) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      const int out = fds[1];
      auto report = [out](const std::string& line) {
        const std::string l = line + "\n";
        (void)!write(out, l.data(), l.size());
      };
      try {
        body(report);
      } catch (const std::exception& e) {
        report(std::string("exception ") + e.what());
      }
      _exit(0);
    }
    close(fds[1]);
    children_.push_back({pid, fds[0], ""});
  }
  pid_t pid(int i) const { return children_[size_t(i)].pid; }
  // The next line from child i, or "" after the timeout (or at its exit).
  std::string line(int i, double timeout_s) {
    auto& c = children_[size_t(i)];
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      const auto nl = c.buf.find('\n');
      if (nl != std::string::npos) {
        std::string l = c.buf.substr(0, nl);
        c.buf.erase(0, nl + 1);
        return l;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return "";
      pollfd pfd{c.fd, POLLIN, 0};
      if (poll(&pfd, 1, int(left)) <= 0) continue;
      char chunk[4096];
      const ssize_t n = read(c.fd, chunk, sizeof chunk);
      if (n <= 0) return "";
      c.buf.append(chunk, size_t(n));
    }
  }
  // Waits up to timeout_s for child i to exit; true if it did.
  bool reap(int i, double timeout_s) {
    auto& c = children_[size_t(i)];
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (Clock::now() < deadline) {
      if (waitpid(c.pid, nullptr, WNOHANG) == c.pid) {
        c.pid = -1;
        return true;
      }
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }

 private:
  struct Child {
    pid_t pid;
    int fd;
    std::string buf;
  };
  std::vector<Child> children_;
};

// A rank process: joins, then all-reduces in a loop (checking every result
// against the rank-order sum) until the group fails; reports "ready" after
// the first call and "error <message>" at the end.
void all_reduce_until_failure(int rank, int p, const std::filesystem::path& dir,
                              const GlooOptions& o,
                              const std::function<void(const std::string&)>& report) {
  FileStore store(dir);
  GlooCommunicator c(rank, p, store, o);
  const size_t n = 768 * 16;
  std::vector<std::vector<float>> in;
  for (int r = 0; r < p; ++r) in.push_back(rank_data(r, n, 3));
  const std::vector<float> expected = rank_order_sum(in);
  const auto deadline = Clock::now() + 20s;
  try {
    for (int it = 0; Clock::now() < deadline; ++it) {
      std::vector<float> v = in[size_t(rank)];
      c.all_reduce_sum(v.data(), n);
      if (!same_bits(v, expected)) report("wrong result");
      if (it == 0) report("ready");
    }
    report("no failure within 20 s");
  } catch (const CommError& e) {
    report(std::string("error ") + e.what());
  }
}

// What a surviving rank reported, and how long after the signal.
struct Noticed {
  std::string line;
  double after_s;
};

// Forks 3 ranks that all-reduce in a loop, sends rank 2 `sig` once all are
// in the loop, and returns what ranks 0 and 1 report.
std::vector<Noticed> signal_rank_2(Ranks& ranks, const std::filesystem::path& dir, int sig,
                                   std::chrono::milliseconds timeout) {
  const int p = 3;
  const GlooOptions o = options(p, timeout);
  for (int r = 0; r < p; ++r) {
    ranks.spawn([&, r](const auto& report) { all_reduce_until_failure(r, p, dir, o, report); });
  }
  for (int r = 0; r < p; ++r) {
    const std::string l = ranks.line(r, 15);
    if (l != "ready") ADD_FAILURE() << "rank " << r << " did not start: " << l;
  }
  std::this_thread::sleep_for(50ms);  // well into the loop
  const auto t0 = Clock::now();
  EXPECT_EQ(kill(ranks.pid(2), sig), 0);
  std::vector<Noticed> noticed;
  for (int r = 0; r < 2; ++r) {
    noticed.push_back({ranks.line(r, 10), 0});
    noticed.back().after_s = seconds_since(t0);
    EXPECT_TRUE(contains(noticed.back().line, "error "))
        << "rank " << r << ": " << noticed.back().line;
    EXPECT_TRUE(contains(noticed.back().line, "rank 2 (node-c)"))
        << "rank " << r << ": " << noticed.back().line;
    std::printf("rank %d noticed signal %d after %.1f ms: %s\n", r, sig,
                noticed.back().after_s * 1e3, noticed.back().line.c_str());
  }
  return noticed;
}

TEST(GlooCommunicatorProcesses, AKilledPeerIsNamedAtOnce) {
  test::TempDir dir;
  Ranks ranks;
  for (const Noticed& n : signal_rank_2(ranks, dir.path(), SIGKILL, 5s)) {
    EXPECT_LT(n.after_s, 2.5) << n.line;  // a read error comes at once
  }
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(ranks.reap(r, 10)) << "rank " << r;
}

TEST(GlooCommunicatorProcesses, AStoppedPeerIsNamedAtTheTimeout) {
  test::TempDir dir;
  Ranks ranks;
  for (const Noticed& n : signal_rank_2(ranks, dir.path(), SIGSTOP, 1s)) {
    EXPECT_TRUE(contains(n.line, "timed out")) << n.line;
    EXPECT_GT(n.after_s, 0.5) << n.line;
    EXPECT_LT(n.after_s, 3.0) << n.line;
  }
  // Woken, the stopped rank finds its group failed too.
  ASSERT_EQ(kill(ranks.pid(2), SIGCONT), 0);
  const std::string l2 = ranks.line(2, 10);
  EXPECT_TRUE(contains(l2, "error ")) << l2;
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(ranks.reap(r, 10)) << "rank " << r;
}

}  // namespace
}  // namespace troupe
