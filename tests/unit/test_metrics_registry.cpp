#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "metrics/registry.h"
#include "support/test_support.h"

namespace troupe {
namespace {

using test::contains;
using test::prometheus_sample;

TEST(MetricsRegistry, CounterAndGaugeRendering) {
  MetricsRegistry r;
  auto& c = r.counter("jobs_total", "Jobs done.", {"kind"});
  c.labels({"a"}).inc();
  c.labels({"a"}).inc(2);
  c.labels({"b"}).inc(0.5);
  auto& g = r.gauge("temperature", "Current temperature.").labels(std::vector<std::string>{});
  g.set(21.5);
  g.dec(1);

  std::string text = r.render();
  EXPECT_TRUE(contains(text,
                       "# HELP jobs_total Jobs done.\n# TYPE jobs_total counter\n"
                       "jobs_total{kind=\"a\"} 3\njobs_total{kind=\"b\"} 0.5\n"))
      << text;
  EXPECT_TRUE(contains(text,
                       "# HELP temperature Current temperature.\n# TYPE temperature gauge\n"
                       "temperature 20.5\n"))
      << text;
  // Registration order is kept.
  EXPECT_LT(text.find("jobs_total"), text.find("temperature"));
}

TEST(MetricsRegistry, ARemovedSeriesIsGoneUntilUsedAgain) {
  MetricsRegistry r;
  auto& g = r.gauge("age", "Age.", {"node"});
  g.labels({"a"}).set(1);
  g.labels({"b"}).set(2);
  g.remove({"a"});
  g.remove({"nope"});
  std::string text = r.render();
  EXPECT_EQ(prometheus_sample(text, "age{node=\"a\"}"), "<missing>") << text;
  EXPECT_EQ(prometheus_sample(text, "age{node=\"b\"}"), "2") << text;
  g.labels({"a"}).set(3);
  EXPECT_EQ(prometheus_sample(r.render(), "age{node=\"a\"}"), "3");
}

TEST(MetricsRegistry, UnlabelledFamiliesRenderBeforeFirstUse) {
  MetricsRegistry r;
  r.counter("idle_total", "Never touched.");
  r.counter("labelled_total", "Has labels.", {"x"});
  std::string text = r.render();
  EXPECT_EQ(prometheus_sample(text, "idle_total"), "0");
  EXPECT_TRUE(contains(text, "# TYPE labelled_total counter\n"));
  EXPECT_FALSE(contains(text, "labelled_total{"));
}

TEST(MetricsRegistry, LabelAndHelpEscaping) {
  MetricsRegistry r;
  r.counter("esc_total", "Line one\nback\\slash \"quotes\" stay", {"path"})
      .labels({"a\"b\\c\nd"})
      .inc();
  std::string text = r.render();
  EXPECT_TRUE(contains(text, "# HELP esc_total Line one\\nback\\\\slash \"quotes\" stay\n"))
      << text;
  EXPECT_TRUE(contains(text, "esc_total{path=\"a\\\"b\\\\c\\nd\"} 1\n")) << text;
}

TEST(MetricsRegistry, HistogramBucketsSumCount) {
  MetricsRegistry r;
  auto& h = r.histogram("lat_seconds", "Latency.", {0.1, 0.5, 1}, {"route"}).labels({"/x"});
  for (double v : {0.05, 0.1, 0.3, 0.7, 5.0}) h.observe(v);
  std::string text = r.render();
  EXPECT_TRUE(contains(text, "# TYPE lat_seconds histogram\n")) << text;
  // le is inclusive (0.1 lands in the 0.1 bucket) and cumulative.
  EXPECT_EQ(prometheus_sample(text, "lat_seconds_bucket{route=\"/x\",le=\"0.1\"}"), "2");
  EXPECT_EQ(prometheus_sample(text, "lat_seconds_bucket{route=\"/x\",le=\"0.5\"}"), "3");
  EXPECT_EQ(prometheus_sample(text, "lat_seconds_bucket{route=\"/x\",le=\"1\"}"), "4");
  EXPECT_EQ(prometheus_sample(text, "lat_seconds_bucket{route=\"/x\",le=\"+Inf\"}"), "5");
  EXPECT_EQ(prometheus_sample(text, "lat_seconds_count{route=\"/x\"}"), "5");
  EXPECT_DOUBLE_EQ(std::stod(prometheus_sample(text, "lat_seconds_sum{route=\"/x\"}")), 6.15);
}

TEST(MetricsRegistry, HistogramWithoutLabels) {
  MetricsRegistry r;
  auto& h = r.histogram("sizes", "Sizes.", {1, 2}).labels(std::vector<std::string>{});
  h.observe(2);
  h.observe(std::nan(""));  // ignored
  std::string text = r.render();
  EXPECT_EQ(prometheus_sample(text, "sizes_bucket{le=\"1\"}"), "0");
  EXPECT_EQ(prometheus_sample(text, "sizes_bucket{le=\"2\"}"), "1");
  EXPECT_EQ(prometheus_sample(text, "sizes_bucket{le=\"+Inf\"}"), "1");
  EXPECT_EQ(prometheus_sample(text, "sizes_sum"), "2");
  EXPECT_EQ(prometheus_sample(text, "sizes_count"), "1");
}

TEST(MetricsRegistry, ValueFormatting) {
  EXPECT_EQ(prometheus_format_value(3), "3");
  EXPECT_EQ(prometheus_format_value(0.1), "0.1");
  EXPECT_EQ(prometheus_format_value(1e-9), "1e-09");
  EXPECT_EQ(prometheus_format_value(1.0 / 0.0), "+Inf");
  EXPECT_EQ(prometheus_format_value(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(prometheus_format_value(std::nan("")), "NaN");
}

TEST(MetricsRegistry, RegistrationRules) {
  MetricsRegistry r;
  auto& a = r.counter("x_total", "X.", {"k"});
  EXPECT_EQ(&a, &r.counter("x_total", "X.", {"k"}));  // same definition: same family
  EXPECT_THROW(r.gauge("x_total", "X."), std::invalid_argument);
  EXPECT_THROW(r.counter("x_total", "X.", {"other"}), std::invalid_argument);
  EXPECT_THROW(r.counter("bad name", "X."), std::invalid_argument);
  EXPECT_THROW(r.counter("1abc", "X."), std::invalid_argument);
  EXPECT_THROW(r.counter("ok_total", "X.", {"bad-label"}), std::invalid_argument);
  EXPECT_THROW(r.histogram("h", "H.", {1, 2}, {"le"}), std::invalid_argument);
  EXPECT_THROW(r.histogram("h2", "H.", {2, 1}), std::invalid_argument);
  EXPECT_THROW(a.labels({"one", "two"}), std::invalid_argument);
  EXPECT_THROW(a.labels({"v"}).inc(-1), std::invalid_argument);
}

TEST(MetricsRegistry, ExponentialBuckets) {
  EXPECT_EQ(exponential_buckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_THROW(exponential_buckets(0, 2, 4), std::invalid_argument);
}

TEST(MetricsRegistry, ConcurrentUpdatesAreNotLost) {
  MetricsRegistry r;
  auto& c = r.counter("hits_total", "Hits.", {"t"});
  auto& h = r.histogram("obs", "Obs.", {0.5}).labels(std::vector<std::string>{});
  auto& g = r.gauge("g", "G.").labels(std::vector<std::string>{});
  constexpr int kThreads = 8, kIters = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        c.labels({std::to_string(i % 4)}).inc();
        h.observe(t % 2 ? 1.0 : 0.25);
        g.inc();
        if (i % 1000 == 0) r.render();  // scrapes while updating
      }
    });
  }
  for (auto& th : threads) th.join();
  double total = 0;
  for (int k = 0; k < 4; ++k) total += c.labels({std::to_string(k)}).value();
  EXPECT_EQ(total, double(kThreads) * kIters);
  auto s = h.snapshot();
  EXPECT_EQ(s.count, uint64_t(kThreads) * kIters);
  EXPECT_EQ(s.cumulative[0], uint64_t(kThreads / 2) * kIters);
  EXPECT_EQ(g.value(), double(kThreads) * kIters);
}

}  // namespace
}  // namespace troupe
