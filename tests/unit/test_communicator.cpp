// The in-process communicator: every collective against a serial reference,
// with P = 1..4 ranks as threads; bit-identical all-reduce; failure paths
// (abort, timeout, mismatched calls, a rank that leaves) that must throw on
// every rank instead of hanging.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

#include "gpu/comm/in_process_communicator.h"
#include "support/comm_support.h"
#include "util/rng.h"

namespace troupe {
namespace {

using namespace test::comm;

using namespace std::chrono_literals;

// Every test group has a timeout, so that a bug shows as a failure, not a hang.
InProcessGroupOptions bounded(std::chrono::nanoseconds timeout = 30s) {
  InProcessGroupOptions o;
  o.timeout = timeout;
  return o;
}

// Runs fn(rank's communicator) on one thread per rank; returns what each threw.
std::vector<std::exception_ptr> run_ranks(
    std::vector<std::unique_ptr<InProcessCommunicator>>& comms,
    const std::function<void(Communicator&)>& fn) {
  std::vector<std::exception_ptr> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

class CommunicatorRanks : public ::testing::TestWithParam<int> {};

TEST_P(CommunicatorRanks, AllReduceIsTheRankOrderSumBitForBitOnEveryRank) {
  const int p = GetParam();
  // Sizes around the slice and block boundaries of the implementation.
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(17), size_t(1000), size_t(5003)}) {
    std::vector<std::vector<float>> in(static_cast<size_t>(p));
    for (int r = 0; r < p; ++r) in[size_t(r)] = rank_data(r, n, n);
    const std::vector<float> expected = rank_order_sum(in);
    for (int run = 0; run < 2; ++run) {  // run to run: the same bits
      auto comms = make_in_process_group(p, bounded());
      std::vector<std::vector<float>> data = in;
      expect_no_errors(run_ranks(
          comms, [&](Communicator& c) { c.all_reduce_sum(data[size_t(c.rank())].data(), n); }));
      for (int r = 0; r < p; ++r) {
        EXPECT_TRUE(same_bits(data[size_t(r)], expected))
            << "P=" << p << " n=" << n << " rank " << r;
      }
    }
  }
}

// Rank 0 gives its own pieces' sum, every other rank its pieces apart; all
// get the sum of every piece added one after the other, in rank and piece
// order: in one pass (the in-process override) and by the chain of sends
// every communicator inherits, bit for bit alike.
TEST_P(CommunicatorRanks, SumInPieceOrderAddsEveryPieceInTurn) {
  const int p = GetParam();
  for (size_t n : {size_t(1), size_t(17), size_t(1000), size_t(5003)}) {
    // Rank r holds r + 1 pieces (rank 0's already summed), of very different
    // sizes, so that another order would round differently.
    std::vector<std::vector<float>> pieces(static_cast<size_t>(p));
    for (int r = 0; r < p; ++r)
      for (int c = 0; c <= r; ++c) {
        auto d = rank_data(r * 10 + c, n, n);
        for (auto& v : d) v *= c % 2 ? 1e-3f : 1e3f;
        pieces[size_t(r)].insert(pieces[size_t(r)].end(), d.begin(), d.end());
      }
    std::vector<float> first(pieces[0].begin(), pieces[0].begin() + long(n));
    std::vector<float> expected = first;
    for (int r = 1; r < p; ++r)
      for (int c = 0; c <= r; ++c)
        for (size_t i = 0; i < n; ++i) expected[i] += pieces[size_t(r)][size_t(c) * n + i];
    for (bool chain : {false, true}) {
      auto comms = make_in_process_group(p, bounded());
      std::vector<std::vector<float>> out(static_cast<size_t>(p), std::vector<float>(n, -1.f));
      out[0] = first;
      expect_no_errors(run_ranks(comms, [&](Communicator& c) {
        const size_t r = size_t(c.rank());
        const float* mine = r == 0 ? nullptr : pieces[r].data();
        const int count = r == 0 ? 0 : int(r) + 1;
        if (chain)
          c.Communicator::sum_in_piece_order(out[r].data(), mine, count, n);
        else
          c.sum_in_piece_order(out[r].data(), mine, count, n);
      }));
      for (int r = 0; r < p; ++r)
        EXPECT_TRUE(same_bits(out[size_t(r)], expected))
            << "P=" << p << " n=" << n << " rank " << r << (chain ? " (chain)" : "");
    }
  }
}

TEST_P(CommunicatorRanks, AllGatherIsRankMajorAlsoInPlace) {
  const int p = GetParam();
  const size_t n = 37;
  std::vector<float> expected;
  for (int r = 0; r < p; ++r) {
    const auto d = rank_data(r, n, 5);
    expected.insert(expected.end(), d.begin(), d.end());
  }
  std::vector<std::vector<float>> out(static_cast<size_t>(p),
                                      std::vector<float>(n * size_t(p), -1.f));
  std::vector<std::vector<float>> in_place(static_cast<size_t>(p),
                                           std::vector<float>(n * size_t(p), -1.f));
  auto comms = make_in_process_group(p, bounded());
  expect_no_errors(run_ranks(comms, [&](Communicator& c) {
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

TEST_P(CommunicatorRanks, ReduceScatterIsTheRankOrderSumOfEachBlock) {
  const int p = GetParam();
  const size_t n = 1500;  // more than one block per rank
  std::vector<std::vector<float>> in(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) in[size_t(r)] = rank_data(r, n * size_t(p), 9);
  const std::vector<float> total = rank_order_sum(in);
  std::vector<std::vector<float>> out(static_cast<size_t>(p), std::vector<float>(n));
  std::vector<std::vector<float>> in_place = in;
  auto comms = make_in_process_group(p, bounded());
  expect_no_errors(run_ranks(comms, [&](Communicator& c) {
    const size_t r = size_t(c.rank());
    c.reduce_scatter_sum(in[r].data(), n, out[r].data());
    c.reduce_scatter_sum(in_place[r].data(), n, in_place[r].data() + r * n);
  }));
  for (int r = 0; r < p; ++r) {
    const std::vector<float> block(total.begin() + long(size_t(r) * n),
                                   total.begin() + long(size_t(r + 1) * n));
    EXPECT_TRUE(same_bits(out[size_t(r)], block)) << "rank " << r;
    const std::vector<float> got(in_place[size_t(r)].begin() + long(size_t(r) * n),
                                 in_place[size_t(r)].begin() + long(size_t(r + 1) * n));
    EXPECT_TRUE(same_bits(got, block)) << "rank " << r << " (in place)";
  }
}

TEST_P(CommunicatorRanks, BroadcastFromEveryRoot) {
  const int p = GetParam();
  auto comms = make_in_process_group(p, bounded());
  for (int root = 0; root < p; ++root) {
    std::vector<std::vector<float>> data(static_cast<size_t>(p));
    for (int r = 0; r < p; ++r) data[size_t(r)] = rank_data(r, 300, 11);
    const std::vector<float> expected = data[size_t(root)];
    expect_no_errors(run_ranks(
        comms, [&](Communicator& c) { c.broadcast(data[size_t(c.rank())].data(), 300, root); }));
    for (int r = 0; r < p; ++r)
      EXPECT_TRUE(same_bits(data[size_t(r)], expected)) << "root " << root;
  }
}

TEST_P(CommunicatorRanks, SendRecvAlongAPipelineAndBack) {
  const int p = GetParam();
  if (p == 1) GTEST_SKIP() << "no peer to send to";
  auto comms = make_in_process_group(p, bounded());
  std::vector<std::vector<float>> last(static_cast<size_t>(p));
  expect_no_errors(run_ranks(comms, [&](Communicator& c) {
    const int r = c.rank();
    // Like pipeline stages: each adds its rank and passes the activations on;
    // the last stage returns them to the first.
    for (int step = 0; step < 50; ++step) {
      std::vector<float> act(64);
      if (r == 0) {
        for (size_t i = 0; i < act.size(); ++i) act[i] = float(step * 100 + int(i));
      } else {
        c.recv(act.data(), act.size(), r - 1);
      }
      for (auto& x : act) x += float(r);
      if (r + 1 < p) {
        c.send(act.data(), act.size(), r + 1);
      } else {
        c.send(act.data(), act.size(), 0);
      }
      if (r == 0) {
        c.recv(act.data(), act.size(), p - 1);
        for (size_t i = 0; i < act.size(); ++i) {
          ASSERT_EQ(act[i], float(step * 100 + int(i) + p * (p - 1) / 2));
        }
      }
    }
  }));
}

TEST_P(CommunicatorRanks, BarrierSeparatesPhases) {
  const int p = GetParam();
  auto comms = make_in_process_group(p, bounded());
  std::atomic<int> arrived{0};
  std::atomic<int> early{0};
  expect_no_errors(run_ranks(comms, [&](Communicator& c) {
    for (int phase = 1; phase <= 200; ++phase) {
      arrived.fetch_add(1);
      c.barrier();
      if (arrived.load() < phase * p) early.fetch_add(1);
      c.barrier();  // nobody starts the next phase while others still check
    }
  }));
  EXPECT_EQ(early.load(), 0);
}

TEST_P(CommunicatorRanks, AllArgmaxTakesTheLargestAndTiesGoToTheLowestIndex) {
  const int p = GetParam();
  auto comms = make_in_process_group(p, bounded());
  std::vector<ArgMax> tie(static_cast<size_t>(p)), distinct(static_cast<size_t>(p)),
      nan_and_empty(static_cast<size_t>(p)), none(static_cast<size_t>(p));
  expect_no_errors(run_ranks(comms, [&](Communicator& c) {
    const int r = c.rank();
    const size_t i = size_t(r);
    // Every rank holds the same best value at a different index; the ranks
    // with higher indices come first, so rank order is not index order.
    tie[i] = c.all_argmax(2.5f, 1000 - r);
    distinct[i] = c.all_argmax(float(r == p / 2 ? 9 : r), 10 * r);
    // NaN and "no candidate" never win.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    nan_and_empty[i] = c.all_argmax(r == 0 ? -1.f : (r == 1 ? nan : -5.f), r == 2 ? -1 : 7 + r);
    none[i] = c.all_argmax(0, -1);
  }));
  for (int r = 0; r < p; ++r) {
    const size_t i = size_t(r);
    EXPECT_EQ(tie[i].index, 1000 - (p - 1));
    EXPECT_EQ(tie[i].value, 2.5f);
    EXPECT_EQ(distinct[i].index, 10 * (p / 2));
    EXPECT_EQ(distinct[i].value, 9.f);
    EXPECT_EQ(nan_and_empty[i].index, 7);
    EXPECT_EQ(nan_and_empty[i].value, -1.f);
    EXPECT_EQ(none[i].index, -1);
  }
}

TEST_P(CommunicatorRanks, ThousandIterationsOfMixedCollectives) {
  const int p = GetParam();
  auto comms = make_in_process_group(p, bounded());
  std::atomic<int> wrong{0};
  expect_no_errors(run_ranks(comms, [&](Communicator& c) {
    const int r = c.rank();
    MixedBuffers b(p, 96);
    for (int it = 0; it < 1000; ++it) {
      // Sizes vary per iteration (the same on every rank).
      wrong.fetch_add(mixed_collectives_round(c, it, size_t(1 + it % 96), b));
      const ArgMax m = c.all_argmax(float(r % 2), r);
      if (m.index != (p > 1 ? 1 : 0)) wrong.fetch_add(1);
      if (it % 10 == 0) c.barrier();
      wrong.fetch_add(ring_exchange_round(c, it));
    }
  }));
  EXPECT_EQ(wrong.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(P, CommunicatorRanks, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "P" + std::to_string(info.param); });

// ---- failure paths: every rank throws, none hangs ----

TEST(Communicator, AbortWakesWaitingRanksWithTheReason) {
  auto comms = make_in_process_group(3, bounded());
  std::atomic<int> waiting{0};
  std::thread aborter([&] {
    while (waiting.load() < 2) std::this_thread::yield();
    std::this_thread::sleep_for(50ms);  // long enough for both to be asleep
    comms[0]->group().abort("shard 2 died");
  });
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    if (c.rank() == 2) return;  // the crashed shard never arrives
    std::vector<float> v(10, 1.f);
    waiting.fetch_add(1);
    c.all_reduce_sum(v.data(), v.size());
  });
  aborter.join();
  EXPECT_EQ(comm_error_message(errors[0]), "shard 2 died");
  EXPECT_EQ(comm_error_message(errors[1]), "shard 2 died");
  EXPECT_FALSE(errors[2]);
  // Later calls fail at once, also on the rank that was not there.
  float x = 0;
  EXPECT_THROW(comms[2]->all_reduce_sum(&x, 1), CommError);
  EXPECT_THROW(comms[0]->barrier(), CommError);
  EXPECT_TRUE(comms[1]->group().aborted());
}

TEST(Communicator, AbortWakesARankBlockedInRecvAndInSend) {
  auto comms = make_in_process_group(3, bounded());
  std::thread aborter([&] {
    std::this_thread::sleep_for(50ms);
    comms[0]->group().abort("stop");
  });
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    float x = 1;
    if (c.rank() == 0) c.recv(&x, 1, 2);  // rank 2 never sends
    if (c.rank() == 1) c.send(&x, 1, 2);  // nor receives
  });
  aborter.join();
  EXPECT_EQ(comm_error_message(errors[0]), "stop");
  EXPECT_EQ(comm_error_message(errors[1]), "stop");
}

TEST(Communicator, TimeoutAbortsTheGroupAndNamesTheMissingRank) {
  auto comms = make_in_process_group(3, bounded(100ms));
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    if (c.rank() == 1) return;
    c.barrier();
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  // Whichever rank timed out first aborted the group; the other got that reason.
  const std::string m0 = comm_error_message(errors[0]);
  EXPECT_EQ(m0, comm_error_message(errors[2]));
  EXPECT_NE(m0.find("timed out"), std::string::npos) << m0;
  EXPECT_NE(m0.find("waiting for rank(s) 1;"), std::string::npos) << m0;
}

TEST(Communicator, MismatchedSizesOrCollectivesThrowOnEveryRank) {
  {
    auto comms = make_in_process_group(2, bounded());
    const auto errors = run_ranks(comms, [&](Communicator& c) {
      std::vector<float> v(20, 1.f);
      c.all_reduce_sum(v.data(), c.rank() == 0 ? 10 : 20);
    });
    const std::string m = comm_error_message(errors[0]);
    EXPECT_EQ(m, comm_error_message(errors[1]));
    EXPECT_NE(m.find("rank 0 all_reduce_sum(n=10), rank 1 all_reduce_sum(n=20)"), std::string::npos)
        << m;
  }
  {
    auto comms = make_in_process_group(3, bounded());
    const auto errors = run_ranks(comms, [&](Communicator& c) {
      float send[2] = {}, recv[6] = {};
      if (c.rank() == 1) {
        c.barrier();
      } else {
        c.all_gather(send, 2, recv);
      }
    });
    for (int r = 0; r < 3; ++r) {
      EXPECT_NE(comm_error_message(errors[size_t(r)]).find("different collectives"),
                std::string::npos);
    }
  }
  {
    auto comms = make_in_process_group(2, bounded());
    const auto errors = run_ranks(comms, [&](Communicator& c) {
      float v[4] = {};
      if (c.rank() == 0) c.send(v, 4, 1);
      if (c.rank() == 1) c.recv(v, 3, 0);
    });
    const std::string m = comm_error_message(errors[1]);
    EXPECT_EQ(m, comm_error_message(errors[0]));
    EXPECT_NE(m.find("sent 4 floats but rank 1 expected 3"), std::string::npos) << m;
  }
}

TEST(Communicator, ARankThatLeavesAbortsItsPeers) {
  auto comms = make_in_process_group(2, bounded());
  std::thread leaver([&] {
    std::this_thread::sleep_for(30ms);
    comms[1].reset();  // a shard that died unwinds its handle
  });
  std::exception_ptr error;
  try {
    comms[0]->barrier();
  } catch (...) {
    error = std::current_exception();
  }
  leaver.join();
  EXPECT_NE(comm_error_message(error).find("rank 1 left the group"), std::string::npos);
}

TEST(Communicator, BadArgumentsAreRejected) {
  EXPECT_THROW(InProcessGroup::create(0), std::invalid_argument);
  auto group = InProcessGroup::create(2);
  EXPECT_THROW(group->communicator(2), std::invalid_argument);
  auto c0 = group->communicator(0);
  EXPECT_THROW(group->communicator(0), std::invalid_argument);
  float x = 0;
  // A bad argument on one rank takes the group down, so its peers do not wait.
  EXPECT_THROW(c0->send(&x, 1, 0), std::invalid_argument);
  EXPECT_TRUE(group->aborted());
  EXPECT_NE(group->abort_reason().find("cannot send to rank 0"), std::string::npos);
}

TEST(Communicator, CountersFollowTheBusBandwidthConvention) {
  const int p = 4;
  auto comms = make_in_process_group(p, bounded());
  expect_no_errors(run_ranks(comms, [&](Communicator& c) {
    std::vector<float> v(1000, 1.f), g(size_t(10 * p)), rs(10);
    c.all_reduce_sum(v.data(), 1000);               // 2 * 3/4 * 4000 = 6000
    c.all_gather(v.data(), 10, g.data());           // 3 * 40 = 120
    c.reduce_scatter_sum(g.data(), 10, rs.data());  // 120
    c.broadcast(v.data(), 100, 0);                  // 400
    c.barrier();                                    // 0
    if (c.rank() == 0) c.send(v.data(), 50, 1);     // 200
    if (c.rank() == 1) c.recv(v.data(), 50, 0);     // 200
  }));
  for (int r = 0; r < p; ++r) {
    const CommStats s = comms[size_t(r)]->stats();
    const uint64_t p2p = r <= 1 ? 200 : 0;
    EXPECT_EQ(s.bytes, 6000u + 120 + 120 + 400 + p2p) << "rank " << r;
    EXPECT_EQ(s.calls, 5u + (r <= 1 ? 1 : 0)) << "rank " << r;
    EXPECT_GT(s.seconds, 0);
  }
  comms[0]->reset_stats();
  EXPECT_EQ(comms[0]->stats().bytes, 0u);
  EXPECT_EQ(comms[0]->stats().calls, 0u);

  // One rank moves nothing.
  auto single = make_in_process_group(1);
  float x[4] = {1, 2, 3, 4}, y[4];
  single[0]->all_reduce_sum(x, 4);
  single[0]->all_gather(x, 4, y);
  EXPECT_EQ(single[0]->stats().bytes, 0u);
  EXPECT_EQ(single[0]->stats().calls, 2u);
  EXPECT_EQ(y[3], 4.f);
}

}  // namespace
}  // namespace troupe
