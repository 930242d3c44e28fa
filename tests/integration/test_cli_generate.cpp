// `troupe generate` as a user runs it: real process, real files.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace troupe {
namespace {

using test::run_command;

test::CommandResult troupe_cmd(std::vector<std::string> args) {
  args.insert(args.begin(), test::troupe_binary());
  return run_command(args, 120);
}

std::string fortune() {
  return test::model_path("fortune").string();
}
std::string stories() {
  return (test::model_path("stories260K") / "stories260K.bin").string();
}

// A failed command: non-zero exit, not killed by a signal, one message line
// on stderr that contains every needle.
void expect_clean_failure(const test::CommandResult& r, const std::vector<std::string>& needles) {
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_LT(r.exit_code, 128) << "killed by a signal: " << r.err;
  for (const auto& n : needles)
    EXPECT_NE(r.err.find(n), std::string::npos) << "missing '" << n << "' in: " << r.err;
  EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
}

TEST(CliGenerate, HelpExplainsEveryOption) {
  auto top = troupe_cmd({"--help"});
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_NE(top.out.find("generate"), std::string::npos);
  auto r = troupe_cmd({"generate", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* opt :
       {"--model", "--tokenizer", "--prompt", "--prompt-ids", "--max-tokens", "--temperature",
        "--top-p", "--top-k", "--seed", "--ids", "--dtype", "--kv-dtype", "--threads"})
    EXPECT_NE(r.out.find(opt), std::string::npos) << opt;
}

TEST(CliGenerate, GreedyFortuneTextAndStatsLine) {
  const auto golden =
      nlohmann::json::parse(test::read_file(test::data_path("fortune_greedy.json")));
  auto r = troupe_cmd({"generate", "--model", fortune(), "--prompt", "The meaning of life",
                       "--max-tokens", "64", "--temperature", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, golden["text"].get<std::string>() + "\n");
  EXPECT_NE(r.err.find("prompt tokens: 6, generated tokens: 63"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos);
}

// Gemma 3's sliding-window layers split over devices: every layout gives
// llama.cpp's ids for the fixture (a prompt and steps past its window).
TEST(CliGenerate, Gemma3GivesLlamaCppsIdsInEveryLayout) {
  const auto expected =
      nlohmann::json::parse(test::read_file(test::data_path("gguf/models.expected.json")));
  nlohmann::json want;
  for (const auto& c : expected["cases"])
    if (c["file"] == "gemma3-q8_0.gguf") want = c;
  ASSERT_TRUE(want.is_object());
  const auto joined = [](const nlohmann::json& list) {
    std::string s;
    for (int id : list) {
      if (!s.empty()) s += ',';
      s += std::to_string(id);
    }
    return s;
  };
  const std::string prompt = joined(want["prompt_ids"]), ids = joined(want["ids"]);
  const std::string model = test::data_path("gguf/gemma3-q8_0.gguf").string();
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--tensor", "2"}, {"--pipeline", "2"}, {"--pipeline", "3"}}) {
    std::vector<std::string> args{"generate", "--model",      model,   "--prompt-ids",
                                  prompt,     "--max-tokens", "32",    "--temperature",
                                  "0",        "--ignore-eos", "--ids", "--dtype",
                                  "f32",      "--threads",    "1"};
    args.insert(args.end(), layout.begin(), layout.end());
    auto r = troupe_cmd(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, ids + "\n") << layout[0];
  }
}

TEST(CliGenerate, StoriesIdsMatchReference) {
  const auto ref =
      nlohmann::json::parse(test::read_file(test::data_path("stories260K_expected.json")));
  const auto& c = ref["cases"][1];
  std::string prompt, want;
  auto join = [](const nlohmann::json& ids) {
    std::string out;
    for (int id : ids) {
      if (!out.empty()) out.push_back(',');
      out.append(std::to_string(id));
    }
    return out;
  };
  prompt = join(c["prompt_ids"]);
  want = join(c["ids"]);
  auto r = troupe_cmd({"generate", "--model", stories(), "--prompt-ids", prompt, "--max-tokens",
                       "64", "--temperature", "0", "--ids"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, want + "\n");
}

TEST(CliGenerate, SameSeedSameTextDifferentSeedDifferentText) {
  auto run = [&](const std::string& seed) {
    return troupe_cmd({"generate", "--prompt", "A fool", "--max-tokens", "40", "--temperature",
                       "0.9", "--top-p", "0.95", "--seed", seed, "--model", fortune()});
  };
  auto a = run("7"), b = run("7"), c = run("8");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
}

TEST(CliGenerate, BadInputsGetOneClearMessage) {
  test::TempDir tmp;
  expect_clean_failure(troupe_cmd({"generate", "--model", "/nonexistent/model", "--prompt", "x"}),
                       {"/nonexistent/model", "does not exist"});
  // Truncated llama2.c checkpoint.
  const auto bytes = test::read_file(stories());
  test::write_file(tmp / "cut.bin", bytes.substr(0, bytes.size() / 2));
  expect_clean_failure(
      troupe_cmd({"generate", "--model", (tmp / "cut.bin").string(), "--prompt-ids", "1"}),
      {"cut.bin"});
  // A Hugging Face directory whose config contradicts itself.
  std::filesystem::create_directories(tmp / "hf");
  auto cfg = nlohmann::json::parse(test::read_file(test::model_path("fortune") / "config.json"));
  cfg["num_key_value_heads"] = 4;  // does not divide 6 heads
  test::write_file(tmp / "hf" / "config.json", cfg.dump());
  std::filesystem::copy_file(test::model_path("fortune") / "model.safetensors",
                             tmp / "hf" / "model.safetensors");
  expect_clean_failure(
      troupe_cmd({"generate", "--model", (tmp / "hf").string(), "--prompt-ids", "1"}),
      {"config.json", "kv heads"});
  expect_clean_failure(
      troupe_cmd({"generate", "--model", fortune(), "--prompt", "x", "--max-tokens", "0"}),
      {"--max-tokens"});
  expect_clean_failure(
      troupe_cmd({"generate", "--model", fortune(), "--prompt", "x", "--max-tokens", "-3"}),
      {"--max-tokens"});
  expect_clean_failure(troupe_cmd({"generate", "--model", stories(), "--prompt-ids", "1,99999"}),
                       {"99999", "vocabulary"});
  expect_clean_failure(troupe_cmd({"generate", "--model", stories(), "--prompt-ids", "1,abc"}),
                       {"--prompt-ids", "abc"});
  std::string long_prompt = "1";
  for (int i = 0; i < 600; ++i) long_prompt += ",5";
  expect_clean_failure(troupe_cmd({"generate", "--model", stories(), "--prompt-ids", long_prompt}),
                       {"601 tokens", "context of 512"});
  expect_clean_failure(
      troupe_cmd({"generate", "--model", stories(), "--prompt", "Once upon a time"}),
      {"tokenizer"});
  expect_clean_failure(troupe_cmd({"generate", "--model", fortune(), "--prompt", "x", "--tokenizer",
                                   (tmp / "missing.model").string()}),
                       {"missing.model"});
  expect_clean_failure(
      troupe_cmd({"generate", "--model", fortune(), "--prompt", "x", "--dtype", "f8"}),
      {"--dtype"});
  expect_clean_failure(
      troupe_cmd({"generate", "--model", fortune(), "--prompt", "x", "--temperature", "-1"}),
      {"temperature"});
  expect_clean_failure(
      troupe_cmd({"generate", "--model", fortune(), "--prompt", "x", "--top-p", "0"}), {"top_p"});
  expect_clean_failure(
      troupe_cmd({"generate", "--model", fortune(), "--prompt", "x", "--prompt-ids", "1"}),
      {"--prompt-ids"});
}

TEST(CliGenerate, SixteenBitWeightsRun) {
  for (const char* dt : {"bf16", "f16"}) {
    auto r = troupe_cmd({"generate", "--model", fortune(), "--prompt", "The meaning of life",
                         "--max-tokens", "8", "--temperature", "0", "--dtype", dt});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find(std::string(dt) + " weights"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace troupe
