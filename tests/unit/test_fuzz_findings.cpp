// What the fuzzers (tests/fuzz/, scripts/fuzz.sh) found: each input that
// broke a promise is kept in tests/data/fuzz/TARGET/ and run here through the
// same entry point as its fuzz target, expecting the documented answer.
#include <gtest/gtest.h>

#include <string>
#include <variant>

#include "deploy/config.h"
#include "gpu/checkpoint.h"
#include "net/openai_api.h"
#include "support/test_support.h"

namespace troupe {
namespace {

std::string finding(const std::string& target, const std::string& name) {
  return test::read_file(test::data_path("fuzz/" + target + "/" + name));
}

// As `troupe serve` sets them for models/fortune under the default config.
const openai::ModelLimits kFortune{"fortune", 256, 2000, 4096};

// "[1e3082,.3]": a number beyond a double is nlohmann's out_of_range, not a
// parse_error; it escaped the decoder and the server answered 500.
TEST(FuzzFindings, OpenAiNumberOverflowIsA400NamingIt) {
  const auto r =
      openai::parse_completion_request(finding("openai_request", "number-overflow.json"), kFortune);
  const auto* e = std::get_if<openai::ApiError>(&r);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->code, "invalid_json");
  EXPECT_TRUE(test::contains(e->message, "number overflow")) << e->message;
  // The same inside an object, where a real client would put it.
  const auto r2 =
      openai::parse_completion_request(R"({"prompt": "x", "max_tokens": 1e400})", kFortune);
  ASSERT_TRUE(std::holds_alternative<openai::ApiError>(r2));
  EXPECT_EQ(std::get<openai::ApiError>(r2).status, 400);
}

// A model.path holding bytes that are not UTF-8 was accepted, and
// to_yaml() (--print-config) wrote it back as U+FFFD: not the same config.
// Now refused, naming the key.
TEST(FuzzFindings, ConfigTextThatIsNotUtf8IsRefusedNamingTheKey) {
  try {
    parse_config(finding("config", "invalid-utf8-path.yaml"), "fuzz.yaml");
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "model.path");
    EXPECT_TRUE(test::contains(e.what(), "UTF-8")) << e.what();
  }
  Config c;
  EXPECT_THROW(apply_override(c, "model.name", "caf\xe9"), ConfigError);
  // Valid UTF-8 beyond ASCII still reads and survives to_yaml().
  apply_override(c, "model.name", "caf\xc3\xa9 \xe2\x98\x83");
  EXPECT_EQ(parse_config(to_yaml(c), "printed"), c);
}

// model.path "m ... .bin " followed by carriage returns: to_yaml() wrote it
// as a plain scalar, which reads back without them (a CR is a line break,
// edge spaces are trimmed). Such text is now written double-quoted.
TEST(FuzzFindings, ConfigTextWithControlsOrEdgeSpacesSurvivesToYaml) {
  const Config c = parse_config(finding("config", "carriage-returns-in-path.yaml"), "fuzz.yaml");
  EXPECT_TRUE(test::contains(c.model.path, ".bin \r\r")) << c.model.path;
  EXPECT_EQ(parse_config(to_yaml(c), "printed"), c);
  for (const std::string name : {" lead", "trail ", "tab\t", "cr\rlf\n", "del\x7f", "bell\a"}) {
    Config d;
    apply_override(d, "model.name", name);
    EXPECT_EQ(parse_config(to_yaml(d), "printed").model.name, name) << to_yaml(d);
    // The items of a list of text (placement.replicas, from main) are
    // written the same way; in a flow sequence yaml-cpp read these back
    // even before, so this only keeps it so.
    Config e;
    e.placement.replicas = {name};
    EXPECT_EQ(parse_config(to_yaml(e), "printed").placement.replicas, e.placement.replicas)
        << to_yaml(e);
  }
}

// config.json with 65536 heads of head_dim 65536: validate() computed
// q_dim() = n_heads * head_dim in int, which overflowed (undefined; wrapped
// to 0 it passed the size check). Found by a hand-made input to the hf_dir
// target, after reading the check. Now refused as absurdly large.
TEST(FuzzFindings, HfHeadCountTimesHeadDimOverflowIsRefused) {
  test::TempDir dir;
  test::write_file(dir / "config.json", finding("hf_dir", "head-product-overflow.json"));
  try {
    load_checkpoint(dir.path());
    FAIL() << "loaded";
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(test::contains(e.what(), "config.json")) << e.what();
    EXPECT_TRUE(test::contains(e.what(), "absurdly large")) << e.what();
  }
}

}  // namespace
}  // namespace troupe
