// A replica split across two processes against the same layout in one:
// decode tokens/s and communication share (EngineStats comm_s / busy_s) of a
// (1,2) and a (2,1) layout on the 110m preset, one thread per device. The
// two "processes" are engines of this one joined by Gloo over TCP loopback
// (tests/support/split_replica.h), so the figure is Gloo's cost, not a
// network's. Steps run one at a time with the engine's default micro-batches
// (two for the pipeline when the batch has two sequences or more).
// Configurations are interleaved round by round: on a shared machine, compare
// within a round, and read the medians with the spread.
// Run: build/bench_split_replica [--rounds 3] [--steps 16] [--preset 110m] [--batches 1,16]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/parallel_engine.h"
#include "gpu/synth_model.h"
#include "tests/support/engine_driver.h"
#include "tests/support/gloo_comms.h"

namespace {

using namespace troupe;
using Clock = std::chrono::steady_clock;

struct Options {
  int rounds = 3;
  int steps = 16;
  std::string preset = "110m";
  std::vector<int> batches = {1, 16};
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--rounds") {
      o.rounds = std::atoi(v.c_str());
    } else if (k == "--steps") {
      o.steps = std::atoi(v.c_str());
    } else if (k == "--preset") {
      o.preset = v;
    } else if (k == "--batches") {
      o.batches.clear();
      std::stringstream ss(v);
      for (std::string b; std::getline(ss, b, ',');) o.batches.push_back(std::atoi(b.c_str()));
    } else {
      throw std::invalid_argument("unknown option " + k);
    }
  }
  if (o.steps < 1 || o.steps > 48) throw std::invalid_argument("--steps must be in [1, 48]");
  return o;
}

constexpr int kBlockTokens = 16, kBlocksPerSeq = 4;  // 64 positions: 16 of context + the steps

struct Config {
  std::string name;
  std::unique_ptr<StepEngine> engine;
};

ParallelEngineOptions layout(int P, int T, int max_batch) {
  ParallelEngineOptions o;
  o.pipeline = P;
  o.tensor = T;
  o.block_tokens = kBlockTokens;
  o.blocks = max_batch * kBlocksPerSeq;
  return o;
}

struct Point {
  double tokens_per_s = 0;
  double comm_share = 0;
};

// `batch` fresh sequences: a 16-token prefill, then `steps` greedy decode
// steps, timed; the communication share over the decode steps alone.
Point decode(StepEngine& engine, int batch, int steps, int vocab) {
  test::SlotBook book(kBlocksPerSeq);
  std::vector<StepItem> items;
  for (int b = 0; b < batch; ++b) {
    std::vector<int> context;
    for (int i = 0; i < 16; ++i) context.push_back(1 + (i * 37 + b * 11) % (vocab - 1));
    items.push_back(book.next(uint64_t(b), context));
  }
  std::vector<int> ids = engine.step(items);
  const EngineStats before = engine.stats();
  const auto t0 = Clock::now();
  for (int k = 0; k < steps; ++k) {
    for (int b = 0; b < batch; ++b) items[size_t(b)] = book.next(uint64_t(b), {ids[size_t(b)]});
    ids = engine.step(items);
  }
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int b = 0; b < batch; ++b) engine.release(uint64_t(b));
  return {double(batch) * steps / took, engine.stats().since(before).comm_share()};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  std::fprintf(stderr, "building the %s checkpoint and four replicas...\n", o.preset.c_str());
  const Checkpoint ck = synth_checkpoint(synth_preset(o.preset), 1, DType::F32);
  std::vector<Config> configs;
  for (auto [P, T] : {std::pair{1, 2}, std::pair{2, 1}}) {
    char shape[16];
    std::snprintf(shape, sizeof shape, "(%d,%d)", P, T);
    configs.push_back({std::string(shape) + " in-process",
                       std::make_unique<ParallelEngine>(ck, DType::F32, layout(P, T, max_batch))});
    ParallelEngineOptions split = layout(P, T, max_batch);
    split.placement.host = {0, 1};  // device 0 here, device 1 in the other process
    configs.push_back({std::string(shape) + " 2 processes",
                       std::make_unique<test::SplitReplica>(
                           ck, DType::F32, split, test::gloo_comms(std::chrono::seconds(60)))});
  }
  std::map<std::pair<std::string, int>, std::vector<double>> tps, share;
  std::printf("%-5s %-24s %5s %12s %10s\n", "round", "layout", "batch", "tokens/s", "comm share");
  for (int round = 1; round <= o.rounds; ++round)
    for (int batch : o.batches)
      for (auto& c : configs) {
        const Point p = decode(*c.engine, batch, o.steps, ck.config.vocab_size);
        tps[{c.name, batch}].push_back(p.tokens_per_s);
        share[{c.name, batch}].push_back(p.comm_share);
        std::printf("%-5d %-24s %5d %12.2f %9.1f%%\n", round, c.name.c_str(), batch, p.tokens_per_s,
                    100 * p.comm_share);
        std::fflush(stdout);
      }
  std::printf("\nmedians over %d rounds (min-max tokens/s)\n", o.rounds);
  for (int batch : o.batches)
    for (auto& c : configs) {
      const auto& v = tps[{c.name, batch}];
      std::printf("%-24s batch %3d: %8.2f tokens/s (%.2f-%.2f), comm share %5.1f%%\n",
                  c.name.c_str(), batch, median(v), *std::min_element(v.begin(), v.end()),
                  *std::max_element(v.begin(), v.end()), 100 * median(share[{c.name, batch}]));
    }
}
