// The process's own figures on /metrics, as Prometheus clients export them.
#include <gtest/gtest.h>

#include <string>

#include "metrics/metrics.h"
#include "metrics/process_metrics.h"

namespace troupe {
namespace {

// A real /proc/<pid>/stat line whose command name holds a space and a ')'.
constexpr std::string_view kStat =
    "4242 (troupe) serve) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 11 0 "
    "12345 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";

TEST(ProcessMetrics, ParsesStatFields) {
  const auto f = parse_proc_stat(kStat, 100, 4096, 1'700'000'000);
  ASSERT_TRUE(f);
  EXPECT_DOUBLE_EQ(f->cpu_seconds, 3.0);  // (250 + 50) ticks
  EXPECT_DOUBLE_EQ(f->threads, 11);
  EXPECT_DOUBLE_EQ(f->start_time_s, 1'700'000'000 + 123.45);
  EXPECT_DOUBLE_EQ(f->virtual_bytes, 104857600);
  EXPECT_DOUBLE_EQ(f->resident_bytes, 2560.0 * 4096);
  EXPECT_FALSE(parse_proc_stat("garbage", 100, 4096, 0));
  EXPECT_FALSE(parse_proc_stat("1 (x) S 1 2", 100, 4096, 0));
}

TEST(ProcessMetrics, ThisProcessIsReadAndRendered) {
  const ProcessFigures f = read_process_figures();
  EXPECT_GT(f.resident_bytes, 1 << 20);
  EXPECT_GE(f.virtual_bytes, f.resident_bytes);
  EXPECT_GE(f.open_fds, 3) << "stdin, stdout, stderr";
  EXPECT_GE(f.threads, 1);
  EXPECT_GT(f.start_time_s, 1.6e9);
  const std::string text = Metrics().render();
  for (const char* line :
       {"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total ",
        "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes ",
        "\nprocess_open_fds ", "\nprocess_max_fds ", "\nprocess_start_time_seconds ",
        "\nprocess_virtual_memory_bytes ", "\nprocess_threads "})
    EXPECT_NE(text.find(line), std::string::npos) << line;
  EXPECT_NE(text.find("troupe_requests_total"), std::string::npos) << "the registry's come first";
}

}  // namespace
}  // namespace troupe
