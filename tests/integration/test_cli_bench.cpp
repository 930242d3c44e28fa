// `troupe bench` (engine mode) and `troupe synth-model` as a user runs them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace troupe {
namespace {

test::CommandResult troupe_cmd(std::vector<std::string> args, int timeout_s = 300) {
  args.insert(args.begin(), test::troupe_binary());
  return test::run_command(args, timeout_s);
}

TEST(CliBench, EngineJsonHasEveryField) {
  auto r = troupe_cmd({"bench", "--model", test::model_path("fortune").string(), "--batch", "1,3",
                       "--prompt-len", "16", "--decode-tokens", "4", "--repeats", "1", "--threads",
                       "1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"model", "dtype", "threads", "bandwidth_gbs", "prefill_tokens_per_s",
                        "decode", "kv_bytes_per_token", "peak_rss_bytes"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["dtype"], "f32");
  EXPECT_EQ(j["threads"], 1);
  EXPECT_GT(j["bandwidth_gbs"].get<double>(), 0.1);
  EXPECT_GT(j["prefill_tokens_per_s"].get<double>(), 0);
  ASSERT_EQ(j["decode"].size(), 2u);
  EXPECT_EQ(j["decode"][1]["batch"], 3);
  for (const auto& d : j["decode"]) {
    EXPECT_GT(d["tokens_per_s"].get<double>(), 0);
    EXPECT_GT(d["bound_fraction"].get<double>(), 0);
  }
  // fortune: 5 layers x 2 (k, v) x 2 kv heads x 32 x 4 bytes
  EXPECT_EQ(j["kv_bytes_per_token"], 5 * 2 * 64 * 4);
  EXPECT_GT(j["peak_rss_bytes"].get<double>(), 1e6);
  EXPECT_EQ(j["kv_dtype"], "f32");
}

// A 16-bit cache, and decode from a long context (prefilled in several
// steps first); a context past the model's length gives way to the steps.
TEST(CliBench, SixteenBitKvCacheAndLongContexts) {
  for (const char* kv : {"f16", "bf16"}) {
    auto r = troupe_cmd({"bench", "--model", test::model_path("fortune").string(), "--kv-dtype",
                         kv, "--batch", "2,5", "--context", "200", "--prompt-len", "16",
                         "--decode-tokens", "4", "--repeats", "1", "--threads", "1", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["kv_dtype"], kv);
    EXPECT_EQ(j["kv_bytes_per_token"], 5 * 2 * 64 * 2);
    EXPECT_EQ(j["context"], 200);
    ASSERT_EQ(j["decode"].size(), 2u);
    EXPECT_GT(j["decode"][1]["tokens_per_s"].get<double>(), 0);
  }
  auto r = troupe_cmd({"bench", "--model", test::model_path("fortune").string(), "--batch", "1",
                       "--context", "100000", "--decode-tokens", "8", "--repeats", "1",
                       "--threads", "1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const int max_seq_len = 256;  // fortune's context
  EXPECT_EQ(nlohmann::json::parse(r.out)["context"], max_seq_len - 8);
  auto bad = troupe_cmd({"bench", "--preset", "tiny", "--context", "0"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--context must be at least 1"), std::string::npos) << bad.err;
}

TEST(CliBench, TableAndBadOptions) {
  auto r =
      troupe_cmd({"bench", "--preset", "tiny", "--batch", "2", "--prompt-len", "8",
                  "--decode-tokens", "2", "--repeats", "1", "--dtype", "bf16", "--threads", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("decode tokens/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bf16"), std::string::npos);
  auto bad = troupe_cmd({"bench", "--preset", "tiny", "--batch", "0"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--batch"), std::string::npos) << bad.err;
  bad = troupe_cmd({"bench", "--preset", "tiny", "--kv-dtype", "f8"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--kv-dtype must be f32, f16 or bf16"), std::string::npos) << bad.err;
  bad = troupe_cmd({"bench", "--preset", "tiny", "--batch", "0"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--batch"), std::string::npos) << bad.err;
  bad = troupe_cmd({"bench", "--preset", "nope"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("tiny, 110m, 1b"), std::string::npos) << bad.err;
}

TEST(CliSynthModel, WritesALoadableSeededCheckpoint) {
  test::TempDir tmp;
  for (const char* name : {"a", "b", "c"}) {
    const std::string seed = std::string(name) == "c" ? "2" : "1";
    auto r = troupe_cmd({"synth-model", "--preset", "tiny", "--dtype", "bf16", "--seed", seed,
                         "--out", (tmp / name).string()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  const auto a = test::read_file(tmp / "a" / "model.safetensors");
  EXPECT_EQ(a, test::read_file(tmp / "b" / "model.safetensors"));
  EXPECT_NE(a, test::read_file(tmp / "c" / "model.safetensors"));
  auto g = troupe_cmd({"generate", "--model", (tmp / "a").string(), "--prompt-ids", "1,5,9",
                       "--max-tokens", "5", "--temperature", "0", "--ids"});
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_EQ(std::count(g.out.begin(), g.out.end(), ','), 4) << g.out;
  // Explicit dims, and a contradiction named.
  auto d = troupe_cmd({"synth-model", "--dim", "96", "--heads", "4", "--kv-heads", "2", "--layers",
                       "2", "--out", (tmp / "d").string(), "--dtype", "f16"});
  EXPECT_EQ(d.exit_code, 0) << d.err;
  auto bad =
      troupe_cmd({"synth-model", "--dim", "100", "--heads", "3", "--out", (tmp / "e").string()});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("divisible"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace troupe
