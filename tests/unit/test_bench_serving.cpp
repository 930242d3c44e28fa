// `troupe bench` serving mode without a server: statistics, arrivals, URLs
// and options (test_bench_serving_e2e.cpp runs it against one).
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "apps/bench_serving.h"

namespace troupe::app::serving_bench {
namespace {

// ---- percentile and summaries ----

TEST(BenchServingPercentile, NearestRank) {
  std::vector<double> v;
  for (int i = 1; i <= 10; ++i) v.push_back(i);
  EXPECT_EQ(percentile_nearest_rank(v, 50), 5);
  EXPECT_EQ(percentile_nearest_rank(v, 90), 9);
  EXPECT_EQ(percentile_nearest_rank(v, 91), 10);
  EXPECT_EQ(percentile_nearest_rank(v, 99), 10);
  EXPECT_EQ(percentile_nearest_rank(v, 100), 10);
  EXPECT_EQ(percentile_nearest_rank(v, 0.1), 1);
  EXPECT_EQ(percentile_nearest_rank({7.5}, 50), 7.5);
  EXPECT_EQ(percentile_nearest_rank({7.5}, 99), 7.5);
  std::vector<double> hundred;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  // Exactly p% of 100 samples: the rank must not drift up by rounding.
  EXPECT_EQ(percentile_nearest_rank(hundred, 99), 99);
  EXPECT_EQ(percentile_nearest_rank(hundred, 90), 90);
  EXPECT_EQ(percentile_nearest_rank(hundred, 50), 50);
  EXPECT_EQ(percentile_nearest_rank({1, 2, 3, 4}, 50), 2);
  EXPECT_EQ(percentile_nearest_rank({1, 2, 3, 4}, 51), 3);
}

TEST(BenchServingPercentile, RejectsEmptyAndOutOfRange) {
  EXPECT_THROW(percentile_nearest_rank({}, 50), std::invalid_argument);
  EXPECT_THROW(percentile_nearest_rank({1, 2}, 0), std::invalid_argument);
  EXPECT_THROW(percentile_nearest_rank({1, 2}, 100.5), std::invalid_argument);
  EXPECT_THROW(percentile_nearest_rank({1, 2}, std::nan("")), std::invalid_argument);
}

TEST(BenchServingSummary, SortsAndAverages) {
  const auto d = summarize({5, 1, 4, 2, 3});
  EXPECT_EQ(d.count, 5u);
  EXPECT_EQ(d.p50, 3);
  EXPECT_EQ(d.p90, 5);
  EXPECT_EQ(d.p99, 5);
  EXPECT_DOUBLE_EQ(d.mean, 3);
  const auto j = d.to_json();
  EXPECT_EQ(j["p50"], 3.0);
  EXPECT_EQ(j["count"], 5);
  const auto none = summarize({}).to_json();
  EXPECT_EQ(none["count"], 0);
  for (const char* k : {"p50", "p90", "p99", "mean"}) EXPECT_TRUE(none[k].is_null()) << k;
}

// ---- arrivals ----

TEST(BenchServingPoisson, SeededAndDeterministic) {
  PoissonArrivals a(10, 42), b(10, 42), c(10, 43);
  bool differs = false;
  for (int i = 0; i < 1000; ++i) {
    const double x = a.next_gap_s(), y = b.next_gap_s(), z = c.next_gap_s();
    EXPECT_EQ(x, y);
    EXPECT_GT(x, 0);
    EXPECT_TRUE(std::isfinite(x));
    differs |= x != z;
  }
  EXPECT_TRUE(differs);
  // The generator is fixed by its definition, not by the standard library:
  // the first outputs for seed 0 (splitmix64-seeded xoshiro256**), taken from
  // a separate transcription of the reference C code.
  Xoshiro256 rng(0);
  EXPECT_EQ(rng.next(), 0x99ec5f36cb75f2b4ULL);
  EXPECT_EQ(rng.next(), 0xbf6e1f784956452aULL);
  EXPECT_THROW(PoissonArrivals(0, 1), std::invalid_argument);
}

TEST(BenchServingPoisson, MeanGapIsOneOverRate) {
  for (const double rate : {0.5, 8.0, 250.0}) {
    PoissonArrivals p(rate, 7);
    const int n = 200000;
    double sum = 0, sum2 = 0;
    for (int i = 0; i < n; ++i) {
      const double g = p.next_gap_s();
      sum += g;
      sum2 += g * g;
    }
    const double mean = sum / n;
    const double sd = std::sqrt(sum2 / n - mean * mean);
    EXPECT_NEAR(mean * rate, 1.0, 0.01) << rate;
    // Exponential: the standard deviation equals the mean.
    EXPECT_NEAR(sd / mean, 1.0, 0.02) << rate;
  }
  Xoshiro256 rng(3);
  double sum = 0;
  for (int i = 0; i < 100000; ++i) {
    const double u = rng.next_double();
    ASSERT_GE(u, 0);
    ASSERT_LT(u, 1);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.01);
}

// ---- URL and options ----

TEST(BenchServingUrl, Parses) {
  auto u = parse_http_url("http://127.0.0.1:8080");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, "8080");
  EXPECT_EQ(u.base_path, "");
  EXPECT_EQ(u.authority(), "127.0.0.1:8080");
  u = parse_http_url("HTTP://localhost/");
  EXPECT_EQ(u.host, "localhost");
  EXPECT_EQ(u.port, "80");
  EXPECT_EQ(u.authority(), "localhost");
  u = parse_http_url("http://gpu-box:9000/prefix/v1/");
  EXPECT_EQ(u.base_path, "/prefix/v1");
  EXPECT_EQ(api_root(u), "/prefix/v1");
  EXPECT_EQ(api_root(parse_http_url("http://h:1/prefix")), "/prefix/v1");
  u = parse_http_url("http://[::1]:8081");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, "8081");
  EXPECT_EQ(u.authority(), "[::1]:8081");
}

TEST(BenchServingUrl, RejectsWithAReason) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"127.0.0.1:8080", "expected http://"},
      {"https://host", "https is not supported"},
      {"http://", "no host"},
      {"http://:8080", "no host"},
      {"http://host:", "empty port"},
      {"http://host:abc", "not a number"},
      {"http://host:0", "outside 1..65535"},
      {"http://host:70000", "outside 1..65535"},
      {"http://::1:80", "brackets"},
      {"http://user:pw@host", "credentials"},
      {"http://host/x?y=1", "query"},
      {"http://[::1", "unterminated"},
  };
  for (const auto& [url, why] : bad) {
    try {
      parse_http_url(url);
      ADD_FAILURE() << url << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << url << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("--url"), std::string::npos) << e.what();
    }
  }
}

std::string validation_error(const ServingBenchOptions& o) {
  try {
    validate(o);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(BenchServingOptions, BadOptionsSayWhich) {
  ServingBenchOptions o;
  o.url = "http://127.0.0.1:8080";
  EXPECT_NE(validation_error(o).find("--concurrency"), std::string::npos);
  EXPECT_NE(validation_error(o).find("--rate"), std::string::npos);
  o.concurrency = 2;
  EXPECT_EQ(validation_error(o), "");
  o.rate = 5;
  EXPECT_NE(validation_error(o).find("not both"), std::string::npos);
  o.rate = 0;
  o.requests = 0;
  EXPECT_NE(validation_error(o).find("--requests"), std::string::npos);
  o.requests = 1;
  o.url = "localhost:8080";
  EXPECT_NE(validation_error(o).find("--url"), std::string::npos);
  o.url = "http://h:1";
  o.vocab = 3;
  EXPECT_NE(validation_error(o).find("--vocab"), std::string::npos);
  o.vocab = 100;
  o.timeout_s = 0;
  EXPECT_NE(validation_error(o).find("--timeout-s"), std::string::npos);
  o.timeout_s = 1;
  o.concurrency = -1;
  EXPECT_NE(validation_error(o).find("--concurrency must be at least 1"), std::string::npos);
  o.concurrency = 0;
  o.rate = 1;
  o.max_inflight = 0;
  EXPECT_NE(validation_error(o).find("--max-inflight"), std::string::npos);
  EXPECT_THROW(run_serving_bench(o), std::invalid_argument);
}

TEST(BenchServingPrompt, IdsInRangeAndVaried) {
  const auto a = prompt_ids(300, 10, 1, 0);
  const auto b = prompt_ids(300, 10, 1, 1);
  ASSERT_EQ(a.size(), 300u);
  std::set<int> seen;
  for (const int id : a) {
    EXPECT_GE(id, 3);
    EXPECT_LT(id, 10);
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 7u) << "every allowed id shows up in 300 draws";
  EXPECT_NE(a, b);
  EXPECT_EQ(a, prompt_ids(300, 10, 1, 0));
  EXPECT_NE(a, prompt_ids(300, 10, 2, 0));
}

}  // namespace
}  // namespace troupe::app::serving_bench
