#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "metrics/metrics.h"
#include "support/test_support.h"

namespace troupe {
namespace {

using test::contains;
using test::prometheus_sample;

TEST(Metrics, TroupeMetricsAreDeclared) {
  Metrics m;
  m.request_finished(200);
  m.request_finished(200);
  m.request_finished(429);
  m.set_queue_depth(3);
  m.set_running_sequences(5);
  m.observe_step(4, 130);
  m.set_kv_blocks(0, 10, 90);
  m.set_replica_state(0, ReplicaState::Ready);
  m.set_replica_state(1, ReplicaState::FailedPermanently);
  m.replica_restarted(1);
  m.observe_time_to_first_token(0.05);
  m.observe_time_per_output_token(0.02);
  m.observe_request_latency(1.2);
  m.add_prompt_tokens(12);
  m.add_generation_tokens(7);
  std::string text = m.render();

  EXPECT_EQ(prometheus_sample(text, "troupe_requests_total{status=\"200\"}"), "2");
  EXPECT_EQ(prometheus_sample(text, "troupe_requests_total{status=\"429\"}"), "1");
  EXPECT_EQ(prometheus_sample(text, "troupe_queue_depth"), "3");
  EXPECT_EQ(prometheus_sample(text, "troupe_running_sequences"), "5");
  EXPECT_EQ(prometheus_sample(text, "troupe_batch_size_bucket{le=\"4\"}"), "1");
  EXPECT_EQ(prometheus_sample(text, "troupe_batch_size_bucket{le=\"2\"}"), "0");
  EXPECT_EQ(prometheus_sample(text, "troupe_tokens_per_step_sum"), "130");
  EXPECT_EQ(prometheus_sample(text, "troupe_kv_blocks{replica=\"0\",state=\"used\"}"), "10");
  EXPECT_EQ(prometheus_sample(text, "troupe_kv_blocks{replica=\"0\",state=\"free\"}"), "90");
  EXPECT_EQ(prometheus_sample(text, "troupe_replica_state{replica=\"0\"}"), "2");
  EXPECT_EQ(prometheus_sample(text, "troupe_replica_state{replica=\"1\"}"), "3");
  EXPECT_EQ(prometheus_sample(text, "troupe_replica_restarts_total{replica=\"1\"}"), "1");
  EXPECT_EQ(prometheus_sample(text, "troupe_time_to_first_token_seconds_count"), "1");
  EXPECT_EQ(prometheus_sample(text, "troupe_time_per_output_token_seconds_count"), "1");
  EXPECT_EQ(prometheus_sample(text, "troupe_request_latency_seconds_bucket{le=\"1.5\"}"), "1");
  EXPECT_EQ(prometheus_sample(text, "troupe_request_latency_seconds_bucket{le=\"1\"}"), "0");
  EXPECT_EQ(prometheus_sample(text, "troupe_prompt_tokens_total"), "12");
  EXPECT_EQ(prometheus_sample(text, "troupe_generation_tokens_total"), "7");
  for (const char* name :
       {"troupe_requests_total counter", "troupe_queue_depth gauge",
        "troupe_running_sequences gauge", "troupe_batch_size histogram",
        "troupe_tokens_per_step histogram", "troupe_kv_blocks gauge",
        "troupe_time_to_first_token_seconds histogram",
        "troupe_time_per_output_token_seconds histogram",
        "troupe_request_latency_seconds histogram", "troupe_replica_state gauge",
        "troupe_replica_restarts_total counter", "troupe_prompt_tokens_total counter",
        "troupe_generation_tokens_total counter"})
    EXPECT_TRUE(contains(text, std::string("# TYPE ") + name + "\n")) << name;
}

// Every line is a comment or `name{labels} value`; a light format check.
// Not ready is Starting while a placement exists and Down while none does
// (it waits for a node); ready and given up are the router's whatever the
// supervisor says.
// vLLM's names for the figures vLLM has, labelled with the model, so that
// its dashboards and autoscalers read this server; only once asked for.
TEST(Metrics, VllmNamesMirrorTheirFigures) {
  EXPECT_FALSE(contains(Metrics().render(), "vllm:"));
  Metrics m;
  m.export_vllm_names("fortune");
  m.set_queue_depth(3);
  m.set_running_sequences(5);
  m.set_kv_blocks(0, 30, 70);
  m.set_kv_blocks(1, 10, 90);
  m.observe_time_to_first_token(0.05);
  m.observe_time_per_output_token(0.02);
  m.observe_request_latency(1.2);
  m.add_prompt_tokens(12);
  m.add_generation_tokens(7);
  const std::string text = m.render();
  const std::string model = "{model_name=\"fortune\"}";
  EXPECT_EQ(prometheus_sample(text, "vllm:num_requests_waiting" + model), "3");
  EXPECT_EQ(prometheus_sample(text, "vllm:num_requests_running" + model), "5");
  EXPECT_EQ(prometheus_sample(text, "vllm:kv_cache_usage_perc" + model), "0.2");
  EXPECT_EQ(prometheus_sample(text, "vllm:prompt_tokens_total" + model), "12");
  EXPECT_EQ(prometheus_sample(text, "vllm:generation_tokens_total" + model), "7");
  EXPECT_EQ(prometheus_sample(text, "vllm:time_to_first_token_seconds_count" + model), "1");
  EXPECT_EQ(prometheus_sample(text, "vllm:time_per_output_token_seconds_sum" + model), "0.02");
  EXPECT_EQ(prometheus_sample(text, "vllm:e2e_request_latency_seconds_count" + model), "1");
  EXPECT_EQ(prometheus_sample(text, "troupe_queue_depth"), "3") << "troupe's own stay";
  m.set_kv_blocks(0, 0, 0);  // a replica down
  EXPECT_EQ(prometheus_sample(m.render(), "vllm:kv_cache_usage_perc" + model), "0.1");
}

TEST(Metrics, AReplicaNotReadyIsDownUnlessPlaced) {
  Metrics m;
  const auto state = [&](int r) {
    return prometheus_sample(m.render(),
                             "troupe_replica_state{replica=\"" + std::to_string(r) + "\"}");
  };
  m.set_replica_placed(0, false);
  m.set_replica_state(0, ReplicaState::Starting);
  EXPECT_EQ(state(0), "0");
  m.set_replica_placed(0, true);
  EXPECT_EQ(state(0), "1");
  m.set_replica_state(0, ReplicaState::Ready);
  m.set_replica_placed(0, false);
  EXPECT_EQ(state(0), "2") << "the router's ready wins";
  m.set_replica_state(0, ReplicaState::Starting);
  EXPECT_EQ(state(0), "0");
  m.set_replica_state(1, ReplicaState::FailedPermanently);
  m.set_replica_placed(1, false);
  EXPECT_EQ(state(1), "3");
}

TEST(Metrics, EveryLineIsWellFormed) {
  Metrics m;
  m.request_finished(200);
  m.set_kv_blocks(0, 1, 2);
  m.observe_request_latency(0.2);
  std::istringstream in(m.render());
  std::string line;
  int samples = 0;
  while (std::getline(in, line)) {
    ASSERT_FALSE(line.empty());
    if (line[0] == '#') {
      EXPECT_TRUE(line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) << line;
      continue;
    }
    ++samples;
    size_t space = line.rfind(' ');
    ASSERT_NE(space, std::string::npos) << line;
    std::string value = line.substr(space + 1);
    EXPECT_NO_THROW((void)std::stod(value)) << line;
    std::string series = line.substr(0, space);
    if (series.find('{') != std::string::npos) {
      EXPECT_EQ(series.back(), '}') << line;
    }
  }
  EXPECT_GT(samples, 20);
}

}  // namespace
}  // namespace troupe
