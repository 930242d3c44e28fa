#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "net/completion_exchange.h"
#include "net/openai_api.h"
#include "net/sse_parser.h"
#include "support/test_support.h"
#include "text/tokenizer.h"

namespace troupe::openai {
namespace {

using nlohmann::json;

ModelLimits limits() {
  ModelLimits l;
  l.name = "fortune";
  l.context_length = 256;
  l.vocab_size = 2000;
  l.max_tokens_cap = 200;
  l.priority_levels = 2;
  return l;
}

const Tokenizer& fortune() {
  static const Tokenizer tok = Tokenizer::load(test::model_path("fortune") / "tokenizer.model");
  return tok;
}

CompletionParams parse_ok(const std::string& body) {
  auto r = parse_completion_request(body, limits());
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << "unexpected error for " << body << ": " << e->message;
    return {};
  }
  return std::get<CompletionParams>(r);
}

ApiError parse_err(const std::string& body) {
  auto r = parse_completion_request(body, limits());
  if (auto* e = std::get_if<ApiError>(&r)) return *e;
  ADD_FAILURE() << "expected an error for " << body;
  return {};
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// ---- parsing: valid requests ----

TEST(OpenAiParse, MinimalTextPromptGetsDefaults) {
  CompletionParams p = parse_ok(R"({"model":"fortune","prompt":"Hello"})");
  ASSERT_TRUE(p.prompt_text.has_value());
  EXPECT_EQ(*p.prompt_text, "Hello");
  EXPECT_TRUE(p.prompt_ids.empty());
  EXPECT_EQ(p.max_tokens, 16);
  EXPECT_FLOAT_EQ(p.temperature, 1.0f);
  EXPECT_FLOAT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_FALSE(p.seed.has_value());
  EXPECT_TRUE(p.stop.empty());
  EXPECT_FALSE(p.stream);
  EXPECT_FALSE(p.include_usage);
  EXPECT_EQ(p.priority, 0);
  EXPECT_FALSE(p.return_token_ids);
}

TEST(OpenAiParse, ModelMayBeOmittedAndDefaultsToTheServedOne) {
  CompletionParams p = parse_ok(R"({"prompt":"Hello"})");
  EXPECT_EQ(p.model, "fortune");
}

TEST(OpenAiParse, AllFieldsAccepted) {
  CompletionParams p = parse_ok(R"({"model":"fortune","prompt":[1,2,3],"max_tokens":50,
      "temperature":0.5,"top_p":0.9,"top_k":40,"seed":1234,"stop":["\n","END"],"stream":true,
      "stream_options":{"include_usage":true},"n":1,"priority":1,"echo":false,"logprobs":null,
      "best_of":1,"suffix":null,"presence_penalty":0,"frequency_penalty":0.0,"logit_bias":{},
      "user":"me","return_token_ids":true,"some_unknown_field":{"x":[1,2]}})");
  EXPECT_EQ(p.prompt_ids, (std::vector<int>{1, 2, 3}));
  EXPECT_FALSE(p.prompt_text.has_value());
  EXPECT_EQ(p.max_tokens, 50);
  EXPECT_FLOAT_EQ(p.temperature, 0.5f);
  EXPECT_FLOAT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_EQ(p.seed, 1234u);
  EXPECT_EQ(p.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_EQ(p.priority, 1);
  EXPECT_TRUE(p.return_token_ids);
}

TEST(OpenAiParse, ContinuousUsageNeedsIncludeUsageAsInVllm) {
  EXPECT_TRUE(parse_ok(R"({"prompt":"x","stream":true,
      "stream_options":{"include_usage":true,"continuous_usage_stats":true}})")
                  .continuous_usage);
  EXPECT_FALSE(parse_ok(R"({"prompt":"x","stream":true,
      "stream_options":{"continuous_usage_stats":true}})")
                   .continuous_usage);
  EXPECT_EQ(parse_err(R"({"prompt":"x","stream":true,
      "stream_options":{"include_usage":true,"continuous_usage_stats":1}})")
                .param,
            "stream_options.continuous_usage_stats");
}

TEST(OpenAiParse, PromptLogprobsAreRefusedWhereTheEnginesLackThem) {
  ModelLimits l = limits();
  l.prompt_logprobs = false;
  auto refused = parse_completion_request(R"({"prompt":"x","echo":true,"logprobs":0})", l);
  ASSERT_TRUE(std::holds_alternative<ApiError>(refused));
  EXPECT_EQ(std::get<ApiError>(refused).param, "echo");
  EXPECT_TRUE(contains(std::get<ApiError>(refused).message, "CUDA"));
  for (const char* fine : {R"({"prompt":"x","echo":true})", R"({"prompt":"x","logprobs":3})"})
    EXPECT_TRUE(std::holds_alternative<CompletionParams>(parse_completion_request(fine, l)))
        << fine;
}

TEST(OpenAiParse, NullMeansDefault) {
  CompletionParams p = parse_ok(
      R"({"prompt":"x","max_tokens":null,"temperature":null,"stop":null,"n":null,"seed":null})");
  EXPECT_EQ(p.max_tokens, 16);
  EXPECT_FLOAT_EQ(p.temperature, 1.0f);
  EXPECT_TRUE(p.stop.empty());
  EXPECT_FALSE(p.seed.has_value());
}

TEST(OpenAiParse, PromptAsArrayWithOneString) {
  CompletionParams p = parse_ok(R"({"prompt":["Once upon"]})");
  ASSERT_TRUE(p.prompt_text.has_value());
  EXPECT_EQ(*p.prompt_text, "Once upon");
}

TEST(OpenAiParse, StopAsSingleStringAndEmptyStringsDropped) {
  EXPECT_EQ(parse_ok(R"({"prompt":"x","stop":"END"})").stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(parse_ok(R"({"prompt":"x","stop":""})").stop.empty());
  EXPECT_EQ(parse_ok(R"({"prompt":"x","stop":["","a"]})").stop, std::vector<std::string>{"a"});
}

TEST(OpenAiParse, IntegralFloatsAreIntegers) {
  EXPECT_EQ(parse_ok(R"({"prompt":"x","max_tokens":20.0})").max_tokens, 20);
}

TEST(OpenAiParse, TopKMinusOneMeansOff) {
  EXPECT_EQ(parse_ok(R"({"prompt":"x","top_k":-1})").top_k, 0);
}

TEST(OpenAiParse, NegativeAndLargeSeeds) {
  EXPECT_EQ(parse_ok(R"({"prompt":"x","seed":-1})").seed, ~uint64_t(0));
  EXPECT_EQ(parse_ok(R"({"prompt":"x","seed":18446744073709551615})").seed, ~uint64_t(0));
}

TEST(OpenAiParse, BoundaryValuesAccepted) {
  parse_ok(R"({"prompt":"x","temperature":0})");
  parse_ok(R"({"prompt":"x","temperature":2})");
  parse_ok(R"({"prompt":"x","top_p":1})");
  parse_ok(R"({"prompt":"x","max_tokens":1})");
  parse_ok(R"({"prompt":"x","max_tokens":200})");
  parse_ok(R"({"prompt":[0,1999]})");
  parse_ok(R"({"prompt":"x","stop":["a","b","c","d"]})");
}

// ---- parsing: errors ----

TEST(OpenAiParse, MalformedJsonReportsPosition) {
  ApiError e = parse_err(R"({"prompt": "x",, })");
  EXPECT_EQ(e.status, 400);
  EXPECT_TRUE(contains(e.message, "Malformed JSON")) << e.message;
  EXPECT_TRUE(contains(e.message, "line 1, column 16")) << e.message;
  EXPECT_TRUE(contains(e.message, "byte 16")) << e.message;
  EXPECT_EQ(e.code, "invalid_json");
  EXPECT_EQ(parse_err("").status, 400);
  EXPECT_EQ(parse_err("{\"prompt\":\"x\"").status, 400);
}

TEST(OpenAiParse, BodyMustBeAnObject) {
  ApiError e = parse_err("[1,2]");
  EXPECT_EQ(e.status, 400);
  EXPECT_TRUE(contains(e.message, "JSON object")) << e.message;
}

TEST(OpenAiParse, UnknownModelIs404LikeVllm) {
  ApiError e = parse_err(R"({"model":"gpt-4","prompt":"x"})");
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.message, "The model `gpt-4` does not exist.");
  EXPECT_EQ(e.param, "model");
  EXPECT_EQ(e.code, "model_not_found");
}

struct WrongType {
  const char* body;
  const char* field;
};

TEST(OpenAiParse, KnownFieldOfWrongTypeNamesTheField) {
  const WrongType cases[] = {
      {R"({"model":5,"prompt":"x"})", "model"},
      {R"({"prompt":5})", "prompt"},
      {R"({"prompt":{"a":1}})", "prompt"},
      {R"({"prompt":"x","max_tokens":"16"})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":1.5})", "max_tokens"},
      {R"({"prompt":"x","temperature":"hot"})", "temperature"},
      {R"({"prompt":"x","top_p":[1]})", "top_p"},
      {R"({"prompt":"x","top_k":0.5})", "top_k"},
      {R"({"prompt":"x","seed":"42"})", "seed"},
      {R"({"prompt":"x","stop":5})", "stop"},
      {R"({"prompt":"x","stop":["a",5]})", "stop"},
      {R"({"prompt":"x","stream":"yes"})", "stream"},
      {R"({"prompt":"x","stream":1})", "stream"},
      {R"({"prompt":"x","stream":true,"stream_options":true})", "stream_options"},
      {R"({"prompt":"x","stream":true,"stream_options":{"include_usage":"y"}})",
       "stream_options.include_usage"},
      {R"({"prompt":"x","n":"1"})", "n"},
      {R"({"prompt":"x","priority":"high"})", "priority"},
      {R"({"prompt":"x","echo":"no"})", "echo"},
      {R"({"prompt":"x","logprobs":"5"})", "logprobs"},
      {R"({"prompt":"x","best_of":"2"})", "best_of"},
      {R"({"prompt":"x","suffix":3})", "suffix"},
      {R"({"prompt":"x","return_token_ids":"true"})", "return_token_ids"},
      {R"({"prompt":"x","user":1})", "user"},
      {R"({"prompt":"x","logit_bias":[]})", "logit_bias"},
  };
  for (const auto& c : cases) {
    ApiError e = parse_err(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error") << c.body;
    EXPECT_EQ(e.param, c.field) << c.body;
    EXPECT_TRUE(contains(e.message, std::string("`") + c.field + "`"))
        << c.body << ": " << e.message;
  }
}

TEST(OpenAiParse, TypeErrorSaysWhatWasExpectedAndGot) {
  ApiError e = parse_err(R"({"prompt":"x","max_tokens":"16"})");
  EXPECT_EQ(e.message, "`max_tokens` must be an integer, got string.");
}

TEST(OpenAiParse, PromptShapes) {
  EXPECT_TRUE(contains(parse_err(R"({"model":"fortune"})").message, "`prompt` is required"));
  EXPECT_TRUE(contains(parse_err(R"({"prompt":null})").message, "`prompt` is required"));
  EXPECT_TRUE(contains(parse_err(R"({"prompt":[]})").message, "must not be empty"));
  // A batch: several texts, or several arrays of ids; a batch of one is one prompt.
  const CompletionParams two = parse_ok(R"({"prompt":["a","b c"]})");
  ASSERT_EQ(two.batch.size(), 2u);
  EXPECT_EQ(two.batch[1].text, "b c");
  EXPECT_FALSE(two.prompt_text);
  EXPECT_EQ(parse_ok(R"({"prompt":[[1,2]]})").prompt_ids, (std::vector<int>{1, 2}));
  EXPECT_TRUE(parse_ok(R"({"prompt":[[1,2]]})").batch.empty());
  const CompletionParams ids = parse_ok(R"({"prompt":[[1,2],[3]]})");
  ASSERT_EQ(ids.batch.size(), 2u);
  EXPECT_EQ(ids.batch[1].ids, std::vector<int>{3});
  EXPECT_TRUE(contains(parse_err(R"({"prompt":[[]]})").message, "must not be empty"));
  EXPECT_TRUE(contains(parse_err(R"({"prompt":[[1],[]]})").message, "`prompt`[1] must not"));
  EXPECT_EQ(parse_err(R"({"prompt":[[1],[1,5000]]})").param, "prompt");
  // A batch that changes shape names the element that does.
  for (const auto& [body, at] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt":["a","b",5]})", "`prompt`[2] is number"},
           {R"({"prompt":["a",null]})", "`prompt`[1] is null"},
           {R"({"prompt":["A fool",[1,2,3]]})", "`prompt`[1] is array"},
           {R"({"prompt":[[1],[2],"c"]})", "`prompt`[2] is string"}}) {
    const ApiError e = parse_err(body);
    EXPECT_EQ(e.param, "prompt");
    EXPECT_TRUE(contains(e.message, at)) << body << ": " << e.message;
  }
  // Too many prompts, or answers.
  std::string many = R"({"prompt":[)";
  for (int i = 0; i < 65; ++i) many += std::string(i ? "," : "") + "\"x\"";
  EXPECT_TRUE(contains(parse_err(many + "]}").message, "at most 64 prompts"));
  std::string some = R"({"n":5,"prompt":[)";
  for (int i = 0; i < 52; ++i) some += std::string(i ? "," : "") + "\"x\"";
  const ApiError answers = parse_err(some + "]}");
  EXPECT_EQ(answers.param, "n");
  EXPECT_TRUE(contains(answers.message, "260 answers")) << answers.message;
  EXPECT_EQ(parse_err(R"({"prompt":[[1,"a"]]})").param, "prompt");
  EXPECT_EQ(parse_err(R"({"prompt":[[1,99999]]})").param, "prompt");
  EXPECT_EQ(parse_err(R"({"prompt":[1,"a"]})").param, "prompt");
  EXPECT_EQ(parse_err(R"({"prompt":[1,2.5]})").param, "prompt");
  EXPECT_EQ(parse_err(R"({"prompt":[true]})").param, "prompt");
}

TEST(OpenAiParse, TokenIdsOutsideVocabulary) {
  ApiError e = parse_err(R"({"prompt":[1,2000]})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "prompt");
  EXPECT_TRUE(contains(e.message, "2000")) << e.message;
  EXPECT_TRUE(contains(e.message, "0..1999")) << e.message;
  EXPECT_TRUE(contains(parse_err(R"({"prompt":[-1]})").message, "-1"));
}

TEST(OpenAiParse, MaxTokensRange) {
  ApiError zero = parse_err(R"({"prompt":"x","max_tokens":0})");
  EXPECT_EQ(zero.message,
            "`max_tokens` must be at least 1 (0 only with `echo`, for the prompt alone), got 0.");
  EXPECT_EQ(parse_err(R"({"prompt":"x","max_tokens":0.0})").param, "max_tokens");
  ApiError cap = parse_err(R"({"prompt":"x","max_tokens":201})");
  EXPECT_EQ(cap.status, 400);
  EXPECT_EQ(cap.param, "max_tokens");
  EXPECT_TRUE(contains(cap.message, "201")) << cap.message;
  EXPECT_TRUE(contains(cap.message, "at most 200")) << cap.message;
  EXPECT_EQ(parse_err(R"({"prompt":"x","max_tokens":1e30})").param, "max_tokens");
}

TEST(OpenAiParse, SamplingRanges) {
  ApiError t = parse_err(R"({"prompt":"x","temperature":2.5})");
  EXPECT_EQ(t.param, "temperature");
  EXPECT_TRUE(contains(t.message, "between 0 and 2")) << t.message;
  EXPECT_EQ(parse_err(R"({"prompt":"x","temperature":-0.1})").param, "temperature");
  EXPECT_EQ(parse_err(R"({"prompt":"x","top_p":0})").param, "top_p");
  EXPECT_EQ(parse_err(R"({"prompt":"x","top_p":1.01})").param, "top_p");
  EXPECT_EQ(parse_err(R"({"prompt":"x","top_k":-2})").param, "top_k");
  EXPECT_EQ(parse_err(R"({"prompt":"x","seed":1.5})").param, "seed");
}

TEST(OpenAiParse, StopLimits) {
  std::string stops;
  for (int i = 0; i < kMaxStopStrings; ++i) stops += (i ? ",\"" : "\"") + std::to_string(i) + "\"";
  EXPECT_EQ(parse_ok(R"({"prompt":"x","stop":[)" + stops + "]}").stop.size(),
            size_t(kMaxStopStrings));
  ApiError e = parse_err(R"({"prompt":"x","stop":[)" + stops + R"(,"one more"]})");
  EXPECT_EQ(e.param, "stop");
  EXPECT_TRUE(contains(e.message, "at most " + std::to_string(kMaxStopStrings))) << e.message;
}

TEST(OpenAiParse, NChoicesUpToTheLimit) {
  EXPECT_EQ(parse_ok(R"({"prompt":"x"})").n, 1);
  EXPECT_EQ(parse_ok(R"({"prompt":"x","n":null})").n, 1);
  EXPECT_EQ(parse_ok(R"({"prompt":"x","n":3})").n, 3);
  EXPECT_EQ(parse_ok(R"({"prompt":"x","n":64})").n, kMaxChoices);
  for (const char* bad : {R"({"prompt":"x","n":0})", R"({"prompt":"x","n":65})"}) {
    ApiError e = parse_err(bad);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "n");
    EXPECT_TRUE(contains(e.message, "`n` must be between 1 and 64")) << e.message;
  }
}

TEST(OpenAiParse, UnsupportedOptionsAtNonDefaultValues) {
  for (const char* field : {"best_of", "suffix"}) {
    std::string value = std::string(field) == "suffix" ? "\"end\"" : "2";
    ApiError e = parse_err(std::string(R"({"prompt":"x",")") + field + "\":" + value + "}");
    EXPECT_EQ(e.status, 400) << field;
    EXPECT_EQ(e.param, field);
    EXPECT_TRUE(contains(e.message, "not supported")) << e.message;
    EXPECT_EQ(e.code, "unsupported_parameter");
  }
}

// vLLM's sampling options that this server does not implement are refused,
// not ignored as unknown fields are; their neutral values pass.
TEST(OpenAiParse, VllmOptionsNotImplementedAreRefusedUnlessNeutral) {
  for (const char* rest :
       {R"("use_beam_search":true)", R"("length_penalty":0.8)", R"("prompt_logprobs":1)",
        R"("guided_whitespace_pattern":" *")", R"("skip_special_tokens":false)",
        R"("spaces_between_special_tokens":false)"}) {
    const ApiError e = parse_err(std::string(R"({"prompt":"x",)") + rest + "}");
    EXPECT_EQ(e.status, 400) << rest;
    EXPECT_EQ(e.code, "unsupported_parameter") << rest;
    EXPECT_TRUE(contains(rest, e.param)) << rest << ": " << e.param;
  }
  EXPECT_TRUE(contains(parse_err(R"({"prompt":"x","prompt_logprobs":0})").message, "`echo`"));
  parse_ok(R"({"prompt":"x","min_p":0,"min_tokens":0.0,"stop_token_ids":[],"bad_words":[],
               "use_beam_search":false,"length_penalty":1,
               "prompt_logprobs":null,"guided_json":null,"skip_special_tokens":true,
               "spaces_between_special_tokens":true})");
}

// Each body `{"prompt":"x", rest}` is a 400 naming `param`, its message
// saying `says`.
struct Bad {
  const char* rest;
  const char* param;
  const char* says;
};
void expect_refused(std::initializer_list<Bad> bads) {
  for (const Bad& b : bads) {
    const ApiError e = parse_err(std::string(R"({"prompt":"x",)") + b.rest + "}");
    EXPECT_EQ(e.status, 400) << b.rest;
    EXPECT_EQ(e.param, b.param) << b.rest;
    EXPECT_TRUE(contains(e.message, b.says)) << b.rest << ": " << e.message;
  }
}

TEST(OpenAiParse, PenaltiesAndLogitBias) {
  const CompletionParams d = parse_ok(R"({"prompt":"x"})");
  EXPECT_EQ(d.presence_penalty, 0.0f);
  EXPECT_EQ(d.frequency_penalty, 0.0f);
  EXPECT_EQ(d.repetition_penalty, 1.0f);
  EXPECT_TRUE(d.logit_bias.empty());
  const CompletionParams p = parse_ok(
      R"({"prompt":"x","presence_penalty":-2,"frequency_penalty":1.5,"repetition_penalty":1.2,
          "logit_bias":{"1999":-100,"5":2.5,"0":100}})");
  EXPECT_EQ(p.presence_penalty, -2.0f);
  EXPECT_EQ(p.frequency_penalty, 1.5f);
  EXPECT_EQ(p.repetition_penalty, 1.2f);
  // Ascending ids, as the sampler and the wire want them.
  EXPECT_EQ(p.logit_bias,
            (std::vector<std::pair<int, float>>{{0, 100.0f}, {5, 2.5f}, {1999, -100.0f}}));
  // Leading zeros name the same id, however many.
  EXPECT_EQ(parse_ok(R"({"prompt":"x","logit_bias":{"000000000007":1}})").logit_bias,
            (std::vector<std::pair<int, float>>{{7, 1.0f}}));
  EXPECT_EQ(troupe::service_request(1, p, {1}, 0, 0, 0).sampling.logit_bias, p.logit_bias);
  EXPECT_EQ(troupe::service_request(1, p, {1}, 0, 0, 0).sampling.repetition_penalty, 1.2f);
  expect_refused({
      Bad{R"("presence_penalty":2.01)", "presence_penalty", "between -2 and 2"},
      Bad{R"("frequency_penalty":-3)", "frequency_penalty", "between -2 and 2"},
      Bad{R"("frequency_penalty":"1")", "frequency_penalty", "number"},
      Bad{R"("repetition_penalty":0)", "repetition_penalty", "(0, 2]"},
      Bad{R"("repetition_penalty":2.5)", "repetition_penalty", "(0, 2]"},
      // 0 as the float the sampler gets.
      Bad{R"("repetition_penalty":1e-46)", "repetition_penalty", "got 1e-46"},
      // The refused value as sent, not rounded to a valid one.
      Bad{R"("presence_penalty":2.0000000001)", "presence_penalty", "got 2.0000000001"},
      Bad{R"("logit_bias":{"2000":1})", "logit_bias", "valid ids: 0..1999"},
      Bad{R"("logit_bias":{"-1":1})", "logit_bias", "token id"},
      Bad{R"("logit_bias":{"a":1})", "logit_bias", "token id"},
      Bad{R"("logit_bias":{"5":101})", "logit_bias", "between -100 and 100"},
      Bad{R"("logit_bias":{"5":"1"})", "logit_bias", "`logit_bias`[\"5\"] must be a number"},
      Bad{R"("logit_bias":{"00000000002000":1})", "logit_bias", "valid ids"},
      Bad{R"("logit_bias":{"5":1,"05":2})", "logit_bias", "twice"},
  });
}

// vLLM's min_p, min_tokens and stop_token_ids, on both endpoints.
TEST(OpenAiParse, MinPMinTokensAndStopTokenIds) {
  const CompletionParams d = parse_ok(R"({"prompt":"x"})");
  EXPECT_EQ(d.min_p, 0.0f);
  EXPECT_EQ(d.min_tokens, 0);
  EXPECT_TRUE(d.stop_token_ids.empty());
  const CompletionParams p = parse_ok(
      R"({"prompt":"x","max_tokens":20,"min_p":0.05,"min_tokens":20,"stop_token_ids":[9,3,9]})");
  EXPECT_EQ(p.min_p, 0.05f);
  EXPECT_EQ(p.min_tokens, 20);
  EXPECT_EQ(p.stop_token_ids, (std::vector<int>{3, 9}));  // a set, ascending
  const CompletionRequest r = troupe::service_request(1, p, {1}, 0, 0, 0);
  EXPECT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_EQ(r.sampling.min_tokens, 20);
  EXPECT_EQ(r.sampling.stop_token_ids, p.stop_token_ids);
  EXPECT_TRUE(parse_ok(R"({"prompt":"x","stop_token_ids":null})").stop_token_ids.empty());
  // A chat without max_tokens has the context as its cap.
  const auto chat =
      parse_chat_request(R"({"messages":[{"role":"user","content":"hi"}],"min_tokens":50})",
                         limits(), ChatTemplate::Plain);
  ASSERT_TRUE(std::holds_alternative<CompletionParams>(chat));
  EXPECT_EQ(std::get<CompletionParams>(chat).min_tokens, 50);
  expect_refused({
      Bad{R"("min_p":1.5)", "min_p", "[0, 1]"},
      Bad{R"("min_p":-0.1)", "min_p", "[0, 1]"},
      Bad{R"("min_p":"0.1")", "min_p", "number"},
      Bad{R"("min_tokens":-1)", "min_tokens", ">= 0"},
      Bad{R"("min_tokens":17)", "min_tokens", "at most `max_tokens` (16)"},
      Bad{R"("stop_token_ids":2)", "stop_token_ids", "array"},
      Bad{R"("stop_token_ids":[2000])", "stop_token_ids", "valid ids: 0..1999"},
      Bad{R"("stop_token_ids":[-1])", "stop_token_ids", "not a token id"},
      Bad{R"("stop_token_ids":["2"])", "stop_token_ids", "integer"},
  });
}

// vLLM's allowed_token_ids (a set of ids) and bad_words (strings, tokenized
// as vLLM does, with the prompt).
TEST(OpenAiParse, AllowedTokenIdsAndBadWords) {
  CompletionParams p =
      parse_ok(R"({"prompt":"x","allowed_token_ids":[9,4,9],"bad_words":["  money","his"]})");
  EXPECT_EQ(p.allowed_token_ids, (std::vector<int>{4, 9}));
  EXPECT_EQ(parse_err(R"({"prompt":"x","allowed_token_ids":[]})").param, "allowed_token_ids");
  EXPECT_EQ(p.bad_words_text, (std::vector<std::string>{"  money", "his"}));
  ASSERT_FALSE(std::holds_alternative<ApiError>(resolve_prompts(p, &fortune(), limits())));
  // Each word, spaces stripped, as the tokenizer encodes it; with a space
  // before it only where that is another first token in as many tokens.
  std::vector<std::vector<int>> want;
  for (const std::string w : {"money", "his"}) {
    const auto plain = fortune().encode(w, false), spaced = fortune().encode(" " + w, false);
    want.push_back(plain);
    if (spaced.front() != plain.front() && spaced.size() == plain.size()) want.push_back(spaced);
  }
  EXPECT_EQ(p.bad_words, want);
  const CompletionRequest r = troupe::service_request(1, p, {1}, 0, 0, 0);
  EXPECT_EQ(r.sampling.allowed_token_ids, p.allowed_token_ids);
  EXPECT_EQ(r.sampling.bad_words, want);
  // Without a tokenizer, words cannot be applied.
  CompletionParams ids = parse_ok(R"({"prompt":[5],"bad_words":["a"]})");
  const auto no_tok = resolve_prompts(ids, nullptr, limits());
  ASSERT_TRUE(std::holds_alternative<ApiError>(no_tok));
  EXPECT_EQ(std::get<ApiError>(no_tok).param, "bad_words");
  expect_refused({
      Bad{R"("allowed_token_ids":[2000])", "allowed_token_ids", "valid ids: 0..1999"},
      Bad{R"("allowed_token_ids":{"1":1})", "allowed_token_ids", "array"},
      Bad{R"("bad_words":"money")", "bad_words", "array of strings"},
      Bad{R"("bad_words":[1])", "bad_words", "array of strings"},
  });
}

// vLLM's include_stop_str_in_output and truncate_prompt_tokens.
TEST(OpenAiParse, IncludeStopStringAndTruncatePromptTokens) {
  const CompletionParams d = parse_ok(R"({"prompt":"x"})");
  EXPECT_FALSE(d.include_stop_str_in_output);
  EXPECT_EQ(d.truncate_prompt_tokens, 0);
  CompletionParams p = parse_ok(
      R"({"prompt":[5,6,7,8,9],"include_stop_str_in_output":true,"truncate_prompt_tokens":3})");
  EXPECT_TRUE(p.include_stop_str_in_output);
  EXPECT_EQ(p.truncate_prompt_tokens, 3);
  // The prompt's last 3 tokens; a shorter prompt as it is.
  auto ids = resolve_prompt(p, nullptr, limits());
  ASSERT_TRUE(std::holds_alternative<std::vector<int>>(ids));
  EXPECT_EQ(std::get<std::vector<int>>(ids), (std::vector<int>{7, 8, 9}));
  CompletionParams short_one = parse_ok(R"({"prompt":[5,6],"truncate_prompt_tokens":3})");
  EXPECT_EQ(std::get<std::vector<int>>(resolve_prompt(short_one, nullptr, limits())),
            (std::vector<int>{5, 6}));
  // A text prompt is truncated after tokenization (BOS goes first).
  CompletionParams text =
      parse_ok(R"({"prompt":"The meaning of life","truncate_prompt_tokens":2})");
  auto text_ids = resolve_prompt(text, &fortune(), limits());
  ASSERT_TRUE(std::holds_alternative<std::vector<int>>(text_ids));
  const auto whole = fortune().encode("The meaning of life", true);
  EXPECT_EQ(std::get<std::vector<int>>(text_ids), std::vector<int>(whole.end() - 2, whole.end()));
  expect_refused({
      Bad{R"("truncate_prompt_tokens":0)", "truncate_prompt_tokens", "at least 1"},
      Bad{R"("truncate_prompt_tokens":-1)", "truncate_prompt_tokens", "at least 1"},
      Bad{R"("include_stop_str_in_output":1)", "include_stop_str_in_output", "boolean"},
  });
}

TEST(OpenAiParse, EchoAndAPromptAlone) {
  EXPECT_FALSE(parse_ok(R"({"prompt":"x"})").echo);
  const CompletionParams p = parse_ok(R"({"prompt":"x","echo":true,"max_tokens":0,"logprobs":1})");
  EXPECT_TRUE(p.echo);
  EXPECT_EQ(p.max_tokens, 0);
  // The service samples one token and asks for the prompt's log-probabilities.
  const CompletionRequest r = troupe::service_request(1, p, {1, 5}, 0, 0, 0);
  EXPECT_EQ(r.max_tokens, 1);
  EXPECT_EQ(r.sampling.prompt_logprobs, 1);
  EXPECT_EQ(troupe::service_request(1, parse_ok(R"({"prompt":"x","echo":true})"), {1}, 0, 0, 0)
                .sampling.prompt_logprobs,
            -1);
  // max_tokens 0 only with echo; 0.0 is 0.
  EXPECT_EQ(parse_err(R"({"prompt":"x","max_tokens":0})").param, "max_tokens");
  EXPECT_EQ(parse_ok(R"({"prompt":"x","echo":true,"max_tokens":0.0})").max_tokens, 0);
  // The prompt alone still needs room for the one token the service samples.
  CompletionParams full = parse_ok(R"({"prompt":"x","echo":true,"max_tokens":0})");
  full.prompt_text.reset();
  full.prompt_ids.assign(256, 5);
  const auto refused = resolve_prompt(full, nullptr, limits());
  ASSERT_TRUE(std::holds_alternative<ApiError>(refused));
  EXPECT_TRUE(contains(std::get<ApiError>(refused).message, "room for one token"));
  full.prompt_ids.pop_back();
  EXPECT_TRUE(std::holds_alternative<std::vector<int>>(resolve_prompt(full, nullptr, limits())));
  EXPECT_EQ(parse_err(R"({"prompt":"x","echo":"yes"})").param, "echo");
}

TEST(OpenAiParse, LogprobsAskForThatManyAlternatives) {
  EXPECT_EQ(parse_ok(R"({"prompt":"x"})").logprobs, -1);
  EXPECT_EQ(parse_ok(R"({"prompt":"x","logprobs":null})").logprobs, -1);
  EXPECT_EQ(parse_ok(R"({"prompt":"x","logprobs":0})").logprobs, 0);
  EXPECT_EQ(parse_ok(R"({"prompt":"x","logprobs":20})").logprobs, 20);
  for (const char* bad : {R"({"prompt":"x","logprobs":21})", R"({"prompt":"x","logprobs":-1})"}) {
    const ApiError e = parse_err(bad);
    EXPECT_EQ(e.status, 400) << bad;
    EXPECT_EQ(e.param, "logprobs");
    EXPECT_TRUE(contains(e.message, "between 0 and 20")) << e.message;
  }
}

TEST(OpenAiParse, StreamOptionsNeedStream) {
  ApiError e = parse_err(R"({"prompt":"x","stream_options":{"include_usage":true}})");
  EXPECT_EQ(e.param, "stream_options");
  EXPECT_TRUE(contains(e.message, "only allowed when `stream` is true")) << e.message;
}

TEST(OpenAiParse, InvalidUtf8InJsonIsA400) {
  EXPECT_EQ(parse_err("{\"prompt\":\"\xff\xfe\"}").status, 400);
}

TEST(OpenAiParse, DeepNestingIsAnErrorNotACrash) {
  std::string deep(200000, '[');
  EXPECT_EQ(parse_err(deep).status, 400);
  std::string body =
      R"({"prompt":"x","extra":)" + std::string(100000, '[') + std::string(100000, ']') + "}";
  parse_ok(body);  // unknown fields are ignored, however deep
}

// ---- prompt resolution and the context check ----

TEST(OpenAiPrompt, TextIsTokenizedWithBos) {
  CompletionParams p = parse_ok(R"({"prompt":"Hello world"})");
  auto r = resolve_prompt(p, &fortune(), limits());
  auto& ids = std::get<std::vector<int>>(r);
  EXPECT_EQ(ids, fortune().encode("Hello world", true));
  EXPECT_EQ(ids.front(), fortune().bos_id());
}

TEST(OpenAiPrompt, EveryPromptOfABatchIsResolvedAndAnErrorNamesIt) {
  CompletionParams p = parse_ok(R"({"prompt":["A fool","Love is"],"max_tokens":10})");
  auto r = resolve_prompts(p, &fortune(), limits());
  ASSERT_TRUE(std::holds_alternative<std::vector<std::vector<int>>>(r));
  const auto& prompts = std::get<std::vector<std::vector<int>>>(r);
  ASSERT_EQ(prompts.size(), 2u);
  EXPECT_EQ(prompts[0], fortune().encode("A fool", true));
  EXPECT_EQ(prompts[1], fortune().encode("Love is", true));
  std::string long_text;
  for (int i = 0; i < 300; ++i) long_text += "word ";
  CompletionParams over = parse_ok(R"({"prompt":["A fool",")" + long_text + R"("]})");
  auto e = resolve_prompts(over, &fortune(), limits());
  ASSERT_TRUE(std::holds_alternative<ApiError>(e));
  EXPECT_TRUE(contains(std::get<ApiError>(e).message, "`prompt`[1]: "))
      << std::get<ApiError>(e).message;
  CompletionParams one = parse_ok(R"({"prompt":"A fool"})");
  EXPECT_EQ(prompt_text_bytes(one), 6u);
  EXPECT_EQ(prompt_text_bytes(p), 0u) << "resolved: the batch is gone";
}

TEST(OpenAiPrompt, TokenIdsPassThrough) {
  CompletionParams p = parse_ok(R"({"prompt":[5,6,7]})");
  auto r = resolve_prompt(p, nullptr, limits());
  EXPECT_EQ(std::get<std::vector<int>>(r), (std::vector<int>{5, 6, 7}));
}

TEST(OpenAiPrompt, TextWithoutTokenizerIsRefused) {
  CompletionParams p = parse_ok(R"({"prompt":"Hello"})");
  auto r = resolve_prompt(p, nullptr, limits());
  auto& e = std::get<ApiError>(r);
  EXPECT_EQ(e.status, 400);
  EXPECT_TRUE(contains(e.message, "token ids")) << e.message;
  CompletionParams s = parse_ok(R"({"prompt":[1,2],"stop":"x"})");
  EXPECT_EQ(std::get<ApiError>(resolve_prompt(s, nullptr, limits())).param, "stop");
}

TEST(OpenAiPrompt, OverTheContextGivesVllmMessage) {
  std::string ids = "[";
  for (int i = 0; i < 250; ++i) ids += (i ? ",5" : "5");
  ids += "]";
  CompletionParams p = parse_ok(R"({"prompt":)" + ids + R"(,"max_tokens":10})");
  ApiError e = std::get<ApiError>(resolve_prompt(p, nullptr, limits()));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.message,
            "This model's maximum context length is 256 tokens. However, you requested 260 "
            "tokens (250 in the prompt, 10 in the completion). Please reduce the length of the "
            "prompt or completion.");
  EXPECT_EQ(e.code, "context_length_exceeded");
  // Exactly at the limit is fine.
  CompletionParams q = parse_ok(R"({"prompt":)" + ids + R"(,"max_tokens":6})");
  EXPECT_TRUE(std::holds_alternative<std::vector<int>>(resolve_prompt(q, nullptr, limits())));
}

TEST(OpenAiPrompt, LongTextPromptCountsTokens) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += "word ";
  CompletionParams p = parse_ok(json{{"prompt", text}}.dump());
  ApiError e = std::get<ApiError>(resolve_prompt(p, &fortune(), limits()));
  int n = int(fortune().encode(text, true).size());
  EXPECT_TRUE(
      contains(e.message, "(" + std::to_string(n) + " in the prompt, 16 in the completion)"))
      << e.message;
}

TEST(OpenAiPrompt, CheckContextLength) {
  EXPECT_FALSE(check_context_length(100, 156, 256).has_value());
  EXPECT_TRUE(check_context_length(100, 157, 256).has_value());
  EXPECT_TRUE(check_context_length(2000000000, 2000000000, 256).has_value());  // no overflow
}

// ---- errors as JSON ----

TEST(OpenAiErrors, ErrorJsonShape) {
  ApiError e = bad_request("bad thing", "max_tokens");
  json j = json::parse(error_body(e));
  ASSERT_TRUE(j.contains("error"));
  EXPECT_EQ(j["error"]["message"], "bad thing");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  EXPECT_TRUE(j["error"]["code"].is_null());
  json k = json::parse(error_body(bad_request("x")));
  EXPECT_TRUE(k["error"]["param"].is_null());
}

TEST(OpenAiErrors, ServiceErrorMapping) {
  EXPECT_EQ(from_service_error({ServiceErrorKind::BadRequest, "b", 0}).status, 400);
  ApiError q = from_service_error({ServiceErrorKind::QueueFull, "full", 2.2});
  EXPECT_EQ(q.status, 429);
  EXPECT_EQ(q.message, "full");
  EXPECT_DOUBLE_EQ(q.retry_after_s, 2.2);
  ApiError u = from_service_error({ServiceErrorKind::Unavailable, "", 0});
  EXPECT_EQ(u.status, 503);
  EXPECT_GT(u.retry_after_s, 0);  // always tell the client when to come back
  EXPECT_FALSE(u.message.empty());
  EXPECT_EQ(from_service_error({ServiceErrorKind::Timeout, "t", 0}).status, 504);
  EXPECT_EQ(from_service_error({ServiceErrorKind::Internal, "i", 0}).status, 500);
}

TEST(OpenAiErrors, RetryAfterRoundsUp) {
  EXPECT_EQ(retry_after_header_seconds(0.2), 1);
  EXPECT_EQ(retry_after_header_seconds(1.0), 1);
  EXPECT_EQ(retry_after_header_seconds(1.01), 2);
  EXPECT_EQ(retry_after_header_seconds(0), 1);
  EXPECT_EQ(retry_after_header_seconds(1e12), 86400);
}

// ---- responses ----

ResponseMeta meta() {
  return {completion_id(0xabc, 7), 1700000000, "fortune"};
}

TEST(OpenAiResponse, CompletionIdFormat) {
  std::string id = completion_id(0x1234, 0xff);
  EXPECT_EQ(id, "cmpl-000000000000123400000000000000ff");
  EXPECT_NE(completion_id(1, 2), completion_id(1, 3));
}

TEST(OpenAiResponse, NonStreamingShape) {
  json j = completion_response(meta(), "Hello there", FinishReason::Length, {5, 3});
  EXPECT_EQ(j["id"], meta().id);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "fortune");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["text"], "Hello there");
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(j["choices"][0].contains("token_ids"));
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 8);
  std::vector<int> ids = {4, 5, 6};
  json k = completion_response(meta(), "", FinishReason::Stop, {1, 3}, &ids);
  EXPECT_EQ(k["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(k["choices"][0]["token_ids"], json(ids));
}

json sse_payload(const std::string& event) {
  EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n");
  std::string body = event.substr(6, event.size() - 8);
  EXPECT_EQ(body.find('\n'), std::string::npos);
  return json::parse(body);
}

TEST(OpenAiResponse, SseChunks) {
  json c = sse_payload(sse_text_chunk(meta(), "Hi\n", std::nullopt, false));
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["id"], meta().id);
  EXPECT_EQ(c["choices"][0]["text"], "Hi\n");
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(c.contains("usage"));

  json last = sse_payload(sse_text_chunk(meta(), "", FinishReason::Stop, true));
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(last["usage"].is_null());

  json u = sse_payload(sse_usage_chunk(meta(), {4, 2}));
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 6);

  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  json err = sse_payload(sse_error(from_service_error({ServiceErrorKind::Internal, "boom", 0})));
  EXPECT_EQ(err["error"]["message"], "boom");
  EXPECT_EQ(err["error"]["status"], 500);
}

TEST(OpenAiResponse, InvalidUtf8IsReplacedNotThrown) {
  json j = completion_response(meta(),
                               std::string("a\xff"
                                           "b"),
                               FinishReason::Stop, {1, 1});
  std::string s;
  EXPECT_NO_THROW(s = dump(j));
  EXPECT_TRUE(contains(s,
                       "a\xEF\xBF\xBD"
                       "b"));
}

// What sse_text_chunk() wrote when it built a json tree: its bytes must not change.
std::string reference_text_chunk(const ResponseMeta& m, const std::string& text,
                                 std::optional<FinishReason> reason, bool include_usage,
                                 const std::vector<int>* token_ids) {
  json c = {{"index", 0},
            {"text", text},
            {"logprobs", nullptr},
            {"finish_reason", reason ? json(finish_reason_name(*reason)) : json(nullptr)}};
  if (token_ids) c["token_ids"] = *token_ids;
  json j = {
      {"id", m.id}, {"object", "text_completion"}, {"created", m.created}, {"model", m.model}};
  j["choices"] = json::array({c});
  if (include_usage) j["usage"] = nullptr;
  return "data: " + dump(j) + "\n\n";
}

TEST(OpenAiResponse, JsonStringsAreWhatDumpWrites) {
  std::vector<std::string> cases = {
      "",
      "plain",
      "quote \" backslash \\ slash /",
      "\b\f\n\r\t",
      std::string("nul \0 in", 6),
      "\x01\x1f\x20\x7f",
      "\xC3\xA9t\xC3\xA9",                           // été
      "\xE2\x82\xAC \xF0\x9F\x98\x80",               // € 😀
      "\xED\x9F\xBF \xEE\x80\x80 \xF4\x8F\xBF\xBF",  // edges that are valid
      "\xC0\xAF",                                    // overlong
      "\xE0\x80\xAF",                                // overlong
      "\xED\xA0\x80",                                // a surrogate
      "\xF4\x90\x80\x80",                            // above U+10FFFF
      "\xF5\x80\x80\x80",
      "cut \xE2\x82",  // truncated
      "\x80 lone continuation",
      "a\xff"
      "b"};
  for (int b = 0; b < 256; ++b) cases.push_back(std::string(1, char(b)) + "x");
  // Random bytes, mostly ASCII with runs of high bytes, from a fixed seed.
  uint64_t state = 12345;
  const auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(state >> 33);
  };
  for (int n = 0; n < 3000; ++n) {
    std::string s;
    const int len = int(next() % 12);
    for (int i = 0; i < len; ++i) {
      const uint32_t r = next();
      s += char(r % 4 == 0 ? 0x80 + (r >> 8) % 0x80 : (r >> 8) % 0x80);
    }
    cases.push_back(s);
  }
  for (const std::string& s : cases) {
    std::string out = "x";
    append_json_string(out, s);
    std::string expected = "x";  // piece by piece: GCC 12 warns (-Wrestrict, falsely) on "x" + s
    expected += dump(json(s));
    EXPECT_EQ(out, expected) << json(s).dump(-1, ' ', true, json::error_handler_t::replace);
  }
}

TEST(OpenAiResponse, SseTextChunkBytesAreTheJsonTreeDump) {
  const std::vector<int> ids = {0, 7, 1999, -1, 2147483647};
  const std::vector<int> none;
  const ResponseMeta odd{"cmpl-\"odd\"\n", -5, "m\xC3\xA9\\del"};
  for (const ResponseMeta& m : {meta(), odd})
    for (const std::string text : {"", "Hi\n", " the \"end\"", "a\xff", "\xE2\x82\xAC\x01"})
      for (const std::optional<FinishReason> reason :
           {std::optional<FinishReason>{}, std::optional{FinishReason::Stop},
            std::optional{FinishReason::Length}})
        for (const bool usage : {false, true})
          for (const std::vector<int>* t : {(const std::vector<int>*)nullptr, &none, &ids})
            EXPECT_EQ(sse_text_chunk(m, text, reason, usage, t),
                      reference_text_chunk(m, text, reason, usage, t));
}

TEST(OpenAiResponse, LogprobsInTheLegacyAndTheChatShape) {
  const std::vector<TokenLogprob> toks = {{" the", -0.5f, {{" the", -0.5f}, {" a", -1.25f}}},
                                          {"\xe2", -std::numeric_limits<float>::infinity(), {}},
                                          {"x", std::nullopt, {}}};
  const json legacy = logprobs_json(Api::Completions, toks, 7);
  // Half a character cannot be a JSON string: its bytes, spelled out.
  EXPECT_EQ(legacy["tokens"], json({" the", "bytes:\\xe2", "x"}));
  EXPECT_EQ(legacy["token_logprobs"][0], -0.5);
  EXPECT_EQ(legacy["token_logprobs"][1], -9999.0);  // -inf, as OpenAI writes it
  EXPECT_TRUE(legacy["token_logprobs"][2].is_null());
  EXPECT_EQ(legacy["top_logprobs"][0], json({{" the", -0.5}, {" a", -1.25}}));
  EXPECT_EQ(legacy["top_logprobs"][1], json({{"bytes:\\xe2", -9999.0}}));  // the sampled one
  EXPECT_EQ(legacy["text_offset"], json({7, 11, 12}));                     // bytes of the text
  const json chat = logprobs_json(Api::Chat, toks);
  ASSERT_EQ(chat["content"].size(), 3u);
  EXPECT_EQ(chat["content"][0]["token"], " the");
  EXPECT_EQ(chat["content"][0]["bytes"], json({32, 116, 104, 101}));
  EXPECT_EQ(chat["content"][0]["top_logprobs"][1],
            json({{"token", " a"}, {"logprob", -1.25}, {"bytes", {32, 97}}}));
  EXPECT_EQ(chat["content"][1]["token"], "bytes:\\xe2");
  EXPECT_EQ(chat["content"][1]["bytes"], json({0xe2}));
  EXPECT_NO_THROW(dump(chat));
  // In a stream chunk and a whole response alike.
  const std::string chunk = sse_text_chunk(meta(), " the", std::nullopt, false, nullptr, &legacy);
  const json parsed = json::parse(chunk.substr(6));
  EXPECT_EQ(parsed["choices"][0]["logprobs"], legacy);
  const json whole =
      completion_response(meta(), " the", FinishReason::Stop, {1, 1}, nullptr, &legacy);
  EXPECT_EQ(whole["choices"][0]["logprobs"], legacy);
  // The legacy maps list their tokens likeliest first, as OpenAI writes
  // them (json itself sorts keys: " a" before " the"); chat's lists keep
  // their order and their objects' keys.
  const std::string text = dump(whole);
  EXPECT_NE(text.find(R"("top_logprobs":[{" the":-0.5," a":-1.25},)"), std::string::npos) << text;
  EXPECT_EQ(json::parse(text), whole);
  const std::string chat_text = dump(chat);
  EXPECT_NE(chat_text.find(R"({"bytes":[32,97],"logprob":-1.25,"token":" a"})"), std::string::npos)
      << chat_text;
  EXPECT_EQ(dump(json{{"b", 1}, {"a", 2}}), R"({"a":2,"b":1})");
}

TEST(OpenAiResponse, OneModelOrA404) {
  auto found = model_response("fortune", limits(), 123);
  ASSERT_TRUE(std::holds_alternative<json>(found));
  EXPECT_EQ(std::get<json>(found), models_response(limits(), 123)["data"][0]);
  auto missing = model_response("gpt-4", limits(), 123);
  ASSERT_TRUE(std::holds_alternative<ApiError>(missing));
  EXPECT_EQ(std::get<ApiError>(missing).status, 404);
  EXPECT_EQ(std::get<ApiError>(missing).code, "model_not_found");
}

TEST(OpenAiResponse, ModelsList) {
  json j = models_response(limits(), 123);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "fortune");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["created"], 123);
  EXPECT_EQ(j["data"][0]["max_model_len"], 256);
  EXPECT_EQ(j["data"][0]["vocab_size"], 2000) << "what a token-id prompt may hold";
}

// ---- chat completions ----

CompletionParams chat_ok(const std::string& body, const ChatFormat& tmpl = ChatTemplate::Plain) {
  auto r = parse_chat_request(body, limits(), tmpl);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << "unexpected error for " << body << ": " << e->message;
    return {};
  }
  return std::get<CompletionParams>(r);
}

ApiError chat_err(const std::string& body, const ChatFormat& tmpl = ChatTemplate::Plain) {
  auto r = parse_chat_request(body, limits(), tmpl);
  if (auto* e = std::get_if<ApiError>(&r)) return *e;
  ADD_FAILURE() << "expected an error for " << body;
  return {};
}

TEST(OpenAiChatParse, MessagesBecomeTheRenderedPrompt) {
  CompletionParams p = chat_ok(R"({"model":"fortune","messages":[
      {"role":"system","content":"Be brief."},{"role":"user","content":"Hello"}]})");
  EXPECT_EQ(p.api, Api::Chat);
  ASSERT_TRUE(p.prompt_text.has_value());
  EXPECT_EQ(*p.prompt_text, "System: Be brief.\nUser: Hello\nAssistant:");
  EXPECT_TRUE(p.prompt_ids.empty());
  CompletionParams l =
      chat_ok(R"({"messages":[{"role":"user","content":"Hello"}]})", ChatTemplate::Llama2);
  EXPECT_EQ(*l.prompt_text, "[INST] Hello [/INST]");
}

TEST(OpenAiChatParse, ContentPartsAreJoinedAndDeveloperIsSystem) {
  CompletionParams p = chat_ok(R"({"messages":[{"role":"developer","content":"Rules"},
      {"role":"user","content":[{"type":"text","text":"one"},{"type":"text","text":"two"}]},
      {"role":"assistant","content":"ok","name":"bot"}]})");
  EXPECT_EQ(*p.prompt_text, "System: Rules\nUser: one\ntwo\nAssistant: ok\nAssistant:");
}

TEST(OpenAiChatParse, TheSameOptionsAsCompletions) {
  CompletionParams p = chat_ok(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":50,
      "temperature":0.5,"top_p":0.9,"top_k":40,"seed":1234,"stop":["\n","END"],"stream":true,
      "stream_options":{"include_usage":true},"n":1,"priority":1,"ignore_eos":true,
      "logprobs":false,"top_logprobs":0,"tools":[],"tool_choice":"none",
      "response_format":{"type":"text"},"presence_penalty":0,"user":"me","unknown":{"x":1}})");
  EXPECT_EQ(p.max_tokens, 50);
  EXPECT_FALSE(p.max_tokens_from_context);
  EXPECT_FLOAT_EQ(p.temperature, 0.5f);
  EXPECT_FLOAT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_EQ(p.seed, 1234u);
  EXPECT_EQ(p.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_EQ(p.priority, 1);
  EXPECT_TRUE(p.ignore_eos);
}

TEST(OpenAiChatParse, MaxCompletionTokensWinsAndBothAreChecked) {
  const std::string m = R"("messages":[{"role":"user","content":"x"}])";
  EXPECT_EQ(chat_ok("{" + m + R"(,"max_completion_tokens":7})").max_tokens, 7);
  EXPECT_EQ(chat_ok("{" + m + R"(,"max_completion_tokens":7,"max_tokens":9})").max_tokens, 7);
  EXPECT_EQ(chat_ok("{" + m + R"(,"max_tokens":9})").max_tokens, 9);
  ApiError over = chat_err("{" + m + R"(,"max_completion_tokens":1000})");
  EXPECT_EQ(over.param, "max_completion_tokens");
  EXPECT_TRUE(contains(over.message, "at most 200")) << over.message;
  EXPECT_EQ(chat_err("{" + m + R"(,"max_tokens":0})").param, "max_tokens");
}

TEST(OpenAiChatParse, WithoutMaxTokensTheContextLeftIsTheLimit) {
  CompletionParams p = chat_ok(R"({"messages":[{"role":"user","content":"Hello"}]})");
  EXPECT_TRUE(p.max_tokens_from_context);
  EXPECT_EQ(p.max_tokens, 200);  // the cap, until the prompt is known
  auto ids = resolve_prompt(p, &fortune(), limits());
  ASSERT_TRUE(std::holds_alternative<std::vector<int>>(ids));
  EXPECT_EQ(p.max_tokens, 200) << "the context leaves more than the cap";

  ModelLimits tight = limits();
  tight.context_length = 20;
  CompletionParams q = chat_ok(R"({"messages":[{"role":"user","content":"Hello"}]})");
  auto qi = resolve_prompt(q, &fortune(), tight);
  ASSERT_TRUE(std::holds_alternative<std::vector<int>>(qi));
  EXPECT_EQ(q.max_tokens, 20 - int(std::get<std::vector<int>>(qi).size()));

  std::string words;
  for (int i = 0; i < 30; ++i) words += "word ";
  CompletionParams full = chat_ok(R"({"messages":[{"role":"user","content":")" + words + R"("}]})");
  ApiError e = std::get<ApiError>(resolve_prompt(full, &fortune(), tight));
  EXPECT_EQ(e.code, "context_length_exceeded");
}

TEST(OpenAiChatParse, WithoutATokenizerTheMessagesAreRefused) {
  CompletionParams p = chat_ok(R"({"messages":[{"role":"user","content":"Hello"}]})");
  ApiError e = std::get<ApiError>(resolve_prompt(p, nullptr, limits()));
  EXPECT_EQ(e.param, "messages");
}

// An assistant turn's content may be null or absent (as OpenAI's own
// answers beside tool calls, and vLLM takes it): an empty turn. Tool calls
// need a Jinja template (tests/unit/test_chat_request_tools.cpp).
TEST(OpenAiChatParse, AnAssistantsContentMayBeNull) {
  CompletionParams p = chat_ok(R"({"messages":[{"role":"user","content":"hi"},
      {"role":"assistant","content":null},{"role":"assistant"},{"role":"user","content":"again"}]})");
  EXPECT_EQ(*p.prompt_text, "User: hi\nAssistant: \nAssistant: \nUser: again\nAssistant:");
  EXPECT_EQ(chat_err(R"({"messages":[{"role":"assistant","content":null,"tool_calls":[
      {"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}]})")
                .param,
            "messages[0].tool_calls");
  EXPECT_EQ(chat_err(R"({"messages":[{"role":"assistant","content":5}]})").param,
            "messages[0].content");
}

// A Llama 2 chat of several turns becomes the ids Meta's reference code
// makes: each finished exchange BOS + "[INST] ... [/INST] answer " + EOS,
// then BOS + the open instruction.
TEST(OpenAiChatParse, Llama2TurnsAreMetasIds) {
  CompletionParams p = chat_ok(R"({"messages":[{"role":"user","content":"A fool"},
      {"role":"assistant","content":"and his money"},{"role":"user","content":"Go on"}]})",
                               ChatTemplate::Llama2);
  const auto prompts = resolve_prompts(p, &fortune(), limits());
  ASSERT_FALSE(std::holds_alternative<ApiError>(prompts));
  std::vector<int> want{1};
  for (int id : fortune().encode("[INST] A fool [/INST] and his money ", false)) want.push_back(id);
  want.insert(want.end(), {2, 1});
  for (int id : fortune().encode("[INST] Go on [/INST]", false)) want.push_back(id);
  EXPECT_EQ(std::get<std::vector<std::vector<int>>>(prompts).at(0), want);
}

TEST(OpenAiChatParse, BadMessagesNameTheField) {
  EXPECT_EQ(chat_err(R"({})").param, "messages");
  EXPECT_EQ(chat_err(R"({"messages":"hi"})").param, "messages");
  EXPECT_EQ(chat_err(R"({"messages":[]})").param, "messages");
  EXPECT_EQ(chat_err(R"({"messages":["hi"]})").param, "messages[0]");
  EXPECT_EQ(chat_err(R"({"messages":[{"content":"x"}]})").param, "messages[0].role");
  ApiError role = chat_err(R"({"messages":[{"role":"user","content":"x"},
      {"role":"tool","content":"y"}]})");
  EXPECT_EQ(role.param, "messages[1].role");
  EXPECT_TRUE(contains(role.message, "'tool'")) << role.message;
  EXPECT_EQ(chat_err(R"({"messages":[{"role":"user"}]})").param, "messages[0].content");
  EXPECT_EQ(chat_err(R"({"messages":[{"role":"user","content":null}]})").param,
            "messages[0].content");
  EXPECT_EQ(chat_err(R"({"messages":[{"role":"user","content":5}]})").param, "messages[0].content");
  EXPECT_EQ(chat_err(R"({"messages":[{"role":"user","content":["x"]}]})").param,
            "messages[0].content[0]");
  ApiError image = chat_err(R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},
      {"type":"image_url","image_url":{"url":"http://x"}}]}]})");
  EXPECT_EQ(image.param, "messages[0].content[1].type");
  EXPECT_TRUE(contains(image.message, "image_url")) << image.message;
  EXPECT_EQ(chat_err(R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})").param,
            "messages[0].content[0].text");
  EXPECT_EQ(chat_err(R"({"messages":[{"role":"assistant","content":"x","tool_calls":{}}]})").param,
            "messages[0].tool_calls");
}

// A template that shows what it is given: the request's tools and tool
// messages as vLLM hands them to a chat template.
ChatFormat shown_as_json(ToolCallFormat calls) {
  ChatFormat f = jinja_chat_format("{{ messages|tojson }}|{{ tools|tojson }}", "", "");
  f.tool_calls = calls;
  return f;
}

// An earlier answer's reasoning given back (reasoning_content, or vLLM's
// newer `reasoning`) reaches the template as message.reasoning_content.
TEST(OpenAiChatParse, AnAssistantsReasoningReachesTheTemplate) {
  const ChatFormat f = shown_as_json(ToolCallFormat::None);
  for (const char* key : {"reasoning_content", "reasoning"}) {
    const CompletionParams p = chat_ok(std::string(R"({"messages":[{"role":"user","content":"hi"},
        {"role":"assistant","content":"Yes.",")") +
                                           key + R"(":"Think."},
        {"role":"user","content":"And?"}]})",
                                       f);
    EXPECT_NE(p.prompt_text->find(R"("reasoning_content": "Think.")"), std::string::npos)
        << key << ": " << *p.prompt_text;
  }
  EXPECT_EQ(
      chat_err(R"({"messages":[{"role":"assistant","content":"x","reasoning_content":3}]})").param,
      "messages[0].reasoning_content");
}

TEST(OpenAiChatParse, ToolsAndToolMessagesReachAJinjaTemplateAsVllmHandsThem) {
  const std::string messages = R"("messages":[{"role":"user","content":"hi"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
        "function":{"name":"get","arguments":"{\"z\": 1, \"a\": [2]}"}}]},
      {"role":"tool","tool_call_id":"c1","name":"get","content":"22"}])";
  const std::string tools = R"("tools":[{"function":{"parameters":{"type":"object",
      "properties":{"z":{"type":"integer"}}},"name":"get"},"type":"function"}])";
  const ChatFormat hermes = shown_as_json(ToolCallFormat::Hermes);
  const CompletionParams p = chat_ok("{" + messages + "," + tools + "}", hermes);
  EXPECT_EQ(*p.prompt_text,
            R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", )"
            R"("tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get", )"
            R"("arguments": {"z": 1, "a": [2]}}}]}, {"role": "tool", "content": "22", )"
            R"("tool_call_id": "c1", "name": "get"}]|[{"type": "function", "function": )"
            R"({"name": "get", "description": null, "parameters": {"type": "object", )"
            R"("properties": {"z": {"type": "integer"}}}}}])");
  EXPECT_EQ(p.tool_calls, ToolCallFormat::Hermes);

  // Forced: shown the same, and the answer held to a JSON array of calls.
  for (const std::string choice :
       {R"("required")", R"({"type":"function","function":{"name":"get"}})"}) {
    const CompletionParams forced =
        chat_ok("{" + messages + "," + tools + R"(,"tool_choice":)" + choice + "}", hermes);
    EXPECT_EQ(forced.prompt_text, p.prompt_text) << choice;
    EXPECT_EQ(forced.tool_calls,
              choice == R"("required")" ? ToolCallFormat::Forced : ToolCallFormat::ForcedNamed)
        << choice;
    grammar::Matcher m(
        std::make_shared<const grammar::Grammar>(grammar::Grammar::parse(forced.grammar)));
    EXPECT_TRUE(m.accept(R"([{"name": "get", "parameters": {"z": 3}}])") && m.is_complete())
        << choice;
    grammar::Matcher other(
        std::make_shared<const grammar::Grammar>(grammar::Grammar::parse(forced.grammar)));
    EXPECT_FALSE(other.accept(R"([{"name": "put")")) << choice;
  }

  // tool_choice none: offered, neither shown nor read.
  const CompletionParams none =
      chat_ok("{" + messages + "," + tools + R"(,"tool_choice":"none"})", hermes);
  EXPECT_TRUE(none.prompt_text->ends_with("|null"));
  EXPECT_EQ(none.tool_calls, ToolCallFormat::None);

  for (const auto& [rest, param] : std::vector<std::pair<std::string, std::string>>{
           {tools + R"(,"tool_choice":{"type":"function","function":{"name":"put"}})",
            "tool_choice.function.name"},
           {tools + R"(,"tool_choice":{"type":"function"})", "tool_choice.function.name"},
           {tools + R"(,"tool_choice":"required","response_format":{"type":"json_object"})",
            "tool_choice"},
           {R"("tool_choice":"required")", "tool_choice"},
           {R"("tool_choice":"sometimes")", "tool_choice"},
           {R"("tools":[{"type":"code","function":{"name":"get"}}])", "tools[0].type"},
           {R"("tools":[{"type":"function","function":{"name":""}}])", "tools[0].function.name"},
           {R"("tools":[{"type":"function"}])", "tools[0].function"},
           {R"("tools":{"type":"function"})", "tools"}}) {
    const ApiError e =
        chat_err(R"({"messages":[{"role":"user","content":"x"}],)" + rest + "}", hermes);
    EXPECT_EQ(e.status, 400) << rest;
    EXPECT_EQ(e.param, param) << rest << ": " << e.message;
  }
  EXPECT_EQ(chat_err(R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f",
      "arguments":"{not json"}}]}]})",
                     hermes)
                .param,
            "messages[0].tool_calls[0].function.arguments");
  // A body with a key twice (the last counts) reads its calls and tools from
  // the same occurrence as the rest.
  const CompletionParams twice = chat_ok(
      R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":"f"}],)"
      R"("messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}],)"
      R"("tools":[{"type":"function","function":{"name":"g"}}]})",
      hermes);
  EXPECT_EQ(*twice.prompt_text,
            R"([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", )"
            R"("arguments": {}}}]}]|[{"type": "function", "function": {"name": "g", )"
            R"("description": null, "parameters": null}}])");
  // A template whose calls this server cannot read is not offered tools.
  const ApiError unread = chat_err(R"({"messages":[{"role":"user","content":"x"}],)" + tools + "}",
                                   shown_as_json(ToolCallFormat::None));
  EXPECT_EQ(unread.param, "tools");
  EXPECT_EQ(unread.code, "unsupported_parameter");
}

TEST(OpenAiChatParse, EchoIsACompletionsOption) {
  const ApiError e = chat_err(R"({"messages":[{"role":"user","content":"x"}],"echo":true})");
  EXPECT_EQ(e.param, "echo");
  EXPECT_EQ(e.code, "unsupported_parameter");
}

TEST(OpenAiChatParse, SharedRulesGiveTheSameErrors) {
  const std::string m = R"("messages":[{"role":"user","content":"x"}])";
  for (const std::string rest :
       {R"("temperature":-1)", R"("top_p":0)", R"("n":0)", R"("stop":5)", R"("seed":"x")",
        R"("stream":"yes")", R"("stream_options":{"include_usage":true})", R"("priority":1.5)",
        R"("presence_penalty":3)", R"("logit_bias":{"1":200})", R"("model":"gpt-4")"}) {
    ApiError chat = chat_err("{" + m + "," + rest + "}");
    ApiError completion = parse_err(R"({"prompt":"x",)" + rest + "}");
    EXPECT_EQ(chat.status, completion.status) << rest;
    EXPECT_EQ(chat.message, completion.message) << rest;
    EXPECT_EQ(chat.param, completion.param) << rest;
  }
  EXPECT_EQ(chat_err(R"({"messages":)").code, "invalid_json");
  EXPECT_EQ(chat_err(R"({"messages":[{"role":"user","content":"x"}],"model":"gpt-4"})").status,
            404);
}

TEST(OpenAiChatParse, OptionsThisServerCannotHonourAreRefused) {
  const std::string m = R"("messages":[{"role":"user","content":"x"}])";
  for (const auto& [rest, param] : std::vector<std::pair<std::string, std::string>>{
           {R"("tools":[{"type":"function","function":{"name":"f"}}])", "tools"},
           {R"("functions":[{"name":"f"}])", "functions"},
           {R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required")",
            "tools"}}) {
    ApiError e = chat_err("{" + m + "," + rest + "}");
    EXPECT_EQ(e.status, 400) << rest;
    EXPECT_EQ(e.param, param) << rest;
    EXPECT_EQ(e.code, "unsupported_parameter") << rest;
  }
  EXPECT_EQ(chat_err("{" + m + R"(,"logprobs":3})").param, "logprobs");
}

TEST(OpenAiChatParse, LogprobsIsABooleanAndTopLogprobsNeedsIt) {
  const std::string m = R"({"messages":[{"role":"user","content":"x"}])";
  auto chat = [](const std::string& body) {
    auto r = parse_chat_request(body, limits(), ChatTemplate::Plain);
    return std::get_if<CompletionParams>(&r) ? std::get<CompletionParams>(r).logprobs : -2;
  };
  EXPECT_EQ(chat(m + "}"), -1);
  EXPECT_EQ(chat(m + R"(,"logprobs":false,"top_logprobs":null})"), -1);
  EXPECT_EQ(chat(m + R"(,"logprobs":false,"top_logprobs":0})"), -1);
  EXPECT_EQ(chat(m + R"(,"logprobs":true})"), 0);
  EXPECT_EQ(chat(m + R"(,"logprobs":true,"top_logprobs":5})"), 5);
  EXPECT_EQ(chat_err(m + R"(,"top_logprobs":2})").param, "top_logprobs");
  EXPECT_EQ(chat_err(m + R"(,"logprobs":true,"top_logprobs":21})").param, "top_logprobs");
}

// Tools on /v1/completions: a client that sends them expects them honoured
// there too, so they are refused, not ignored.
TEST(OpenAiParse, ToolsAreRefusedOutsideAChat) {
  for (const auto& [rest, param] : std::vector<std::pair<std::string, std::string>>{
           {R"("tools":[{"type":"function","function":{"name":"f"}}])", "tools"},
           {R"("functions":[{"name":"f"}])", "functions"},
           {R"("tool_choice":"required")", "tool_choice"}}) {
    ApiError e = parse_err(R"({"prompt":"x",)" + rest + "}");
    EXPECT_EQ(e.status, 400) << rest;
    EXPECT_EQ(e.param, param) << rest;
    EXPECT_EQ(e.code, "unsupported_parameter") << rest;
  }
  const std::string harmless =
      R"({"prompt":"x","tools":[],"tool_choice":"none","response_format":{"type":"text"}})";
  EXPECT_EQ(*std::get<CompletionParams>(parse_completion_request(harmless, limits())).prompt_text,
            "x");
}

// Structured output: OpenAI's response_format, vLLM's guided_* and
// structured_outputs become one grammar the answer is held to.
bool grammar_matches(const std::string& gbnf, const std::string& text) {
  grammar::Matcher m(std::make_shared<const grammar::Grammar>(grammar::Grammar::parse(gbnf)));
  return m.accept(text) && m.is_complete();
}

TEST(OpenAiParse, StructuredOutputBecomesTheAnswersGrammar) {
  EXPECT_EQ(parse_ok(R"({"prompt":"x"})").grammar, "");
  EXPECT_EQ(parse_ok(R"({"prompt":"x","response_format":{"type":"text"}})").grammar, "");
  const std::string object =
      parse_ok(R"({"prompt":"x","response_format":{"type":"json_object"}})").grammar;
  EXPECT_TRUE(grammar_matches(object, R"({"a": [1, "b"]})"));
  EXPECT_FALSE(grammar_matches(object, R"([1])"));
  // The schema's properties in the order the client wrote them (z before a).
  const std::string schema = parse_ok(R"({"prompt":"x","response_format":{"type":"json_schema",
      "json_schema":{"name":"t","strict":true,"schema":{"type":"object",
      "properties":{"z":{"type":"integer"},"a":{"type":"boolean"}},"required":["z","a"]}}}})")
                                 .grammar;
  EXPECT_TRUE(grammar_matches(schema, R"({"z": 1, "a": true})"));
  EXPECT_FALSE(grammar_matches(schema, R"({"a": true, "z": 1})"));
  const std::string guided =
      parse_ok(
          R"({"prompt":"x","guided_json":"{\"type\": \"array\", \"items\": {\"type\": \"null\"}}"})")
          .grammar;
  EXPECT_TRUE(grammar_matches(guided, "[null, null]"));
  const std::string choice = parse_ok(R"({"prompt":"x","guided_choice":["yes","no"]})").grammar;
  EXPECT_TRUE(grammar_matches(choice, "no"));
  EXPECT_FALSE(grammar_matches(choice, "maybe"));
  EXPECT_TRUE(grammar_matches(
      parse_ok(R"({"prompt":"x","structured_outputs":{"grammar":"root ::= [0-9]+"}})").grammar,
      "42"));
  EXPECT_TRUE(grammar_matches(
      parse_ok(R"({"prompt":"x","structured_outputs":{"json_object":true}})").grammar, "{}"));
  const std::string re = parse_ok(R"({"prompt":"x","guided_regex":"[0-9]{3}-[a-z]+"})").grammar;
  EXPECT_TRUE(grammar_matches(re, "123-abc"));
  EXPECT_FALSE(grammar_matches(re, "12-abc"));
}

TEST(OpenAiParse, StructuredOutputThatCannotBeHonouredIsRefusedNamingWhy) {
  for (const auto& [rest, param, says] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {R"("guided_grammar":"root ::= (")", "guided_grammar", "line 1"},
           {R"("guided_grammar":"start ::= \"a\"")", "guided_grammar", "no rule named 'root'"},
           {R"("guided_json":{"type":"string","pattern":"a\\1"})", "guided_json", "pattern"},
           {R"("guided_json":"{not json")", "guided_json", "not a JSON schema"},
           {R"("guided_choice":[])", "guided_choice", "non-empty"},
           {R"("response_format":{"type":"json_schema"})", "response_format.json_schema", ""},
           {R"("response_format":{"type":"json_schema","json_schema":{"name":"n"}})",
            "response_format.json_schema.schema", ""},
           {R"("response_format":{"type":"xml"})", "response_format.type", "json_schema"},
           {R"("response_format":{"type":"json_object"},"guided_choice":["a"])", "guided_choice",
            "Only one"},
           {R"j("structured_outputs":{"regex":"(?=a)"})j", "structured_outputs.regex",
            "lookaround"},
           {R"("guided_regex":"a{2")", "guided_regex", "unclosed"}}) {
    const ApiError e = parse_err(R"({"prompt":"x",)" + rest + "}");
    EXPECT_EQ(e.status, 400) << rest;
    EXPECT_EQ(e.param, param) << rest << ": " << e.message;
    EXPECT_TRUE(contains(e.message, says)) << rest << ": " << e.message;
  }
  // Engines that cannot: the reason, whatever was asked.
  ModelLimits l = limits();
  l.structured_output_refusal = "the model has no tokenizer";
  const auto r =
      parse_completion_request(R"({"prompt":"x","response_format":{"type":"json_object"}})", l);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).code, "unsupported_parameter");
  EXPECT_TRUE(contains(std::get<ApiError>(r).message, "no tokenizer"));
}

// nlohmann holds 2^63 .. 2^64-1 as unsigned; they were read as negative
// numbers ("must be at least 1, got -1").
TEST(OpenAiParse, IntegersPastInt64AreOutOfRangeAsSent) {
  ApiError e = parse_err(R"({"prompt":"x","max_tokens":18446744073709551615})");
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_TRUE(contains(e.message, "18446744073709551615")) << e.message;
  e = parse_err(R"({"prompt":"x","top_k":9223372036854775808})");
  EXPECT_EQ(e.param, "top_k");
  EXPECT_TRUE(contains(e.message, "9223372036854775808")) << e.message;
  EXPECT_FALSE(contains(e.message, "-")) << e.message;
  e = parse_err(R"({"prompt":[18446744073709551615]})");
  EXPECT_EQ(e.param, "prompt");
  EXPECT_TRUE(contains(e.message, "Token id 18446744073709551615")) << e.message;
  e = parse_err(R"({"prompt":"x","n":18446744073709551615})");
  EXPECT_FALSE(contains(e.message, "n=-1")) << e.message;
}

TEST(OpenAiParse, ABatchOfOnesBadIdIsNamedWithBothIndices) {
  EXPECT_TRUE(contains(parse_err(R"({"prompt":[[5,-1]]})").message, "`prompt`[0][1]"));
  EXPECT_TRUE(contains(parse_err(R"({"prompt":[[5,"x"]]})").message, "`prompt`[0][1] is string"));
  EXPECT_TRUE(contains(parse_err(R"({"prompt":[5,-1]})").message, "`prompt`[1]"));
}

// A top_p below float's smallest normal number was stored as 0, which the
// replica refuses: every such request ended 503 "cancelled by the server".
TEST(OpenAiParse, ATinyTopPStaysPositive) {
  for (const char* body : {R"({"prompt":"x","top_p":1e-46})", R"({"prompt":"x","top_p":1e-300})"}) {
    auto p = parse_completion_request(body, limits());
    ASSERT_TRUE(std::holds_alternative<CompletionParams>(p)) << body;
    EXPECT_GT(std::get<CompletionParams>(p).top_p, 0.0f) << body;
  }
}

TEST(OpenAiChatParse, ABadMaxTokensIsRefusedBesideMaxCompletionTokens) {
  ApiError e = chat_err(
      R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0,"max_completion_tokens":3})");
  EXPECT_EQ(e.param, "max_tokens");
}

TEST(OpenAiParse, APriorityOutsideTheServersLevelsNamesTheField) {
  for (const char* body : {R"({"prompt":"x","priority":2})", R"({"prompt":"x","priority":-1})"}) {
    ApiError e = parse_err(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, "priority") << body;
    EXPECT_TRUE(contains(e.message, "between 0 and 1")) << e.message;
  }
  ApiError chat = chat_err(R"({"messages":[{"role":"user","content":"x"}],"priority":7})");
  EXPECT_EQ(chat.param, "priority");
  EXPECT_EQ(std::get<CompletionParams>(
                parse_completion_request(R"({"prompt":"x","priority":1})", limits()))
                .priority,
            1);
}

ResponseMeta chat_meta() {
  return {completion_id(0xabc, 7, Api::Chat), 1700000000, "fortune", Api::Chat};
}

TEST(OpenAiChatResponse, IdAndNonStreamingShape) {
  EXPECT_EQ(completion_id(0x1234, 0xff, Api::Chat), "chatcmpl-000000000000123400000000000000ff");
  json j = completion_response(chat_meta(), "Hello there", FinishReason::Stop, {5, 3, 4});
  EXPECT_EQ(j["id"], chat_meta().id);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "fortune");
  ASSERT_EQ(j["choices"].size(), 1u);
  const json& c = j["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_EQ(c["message"], json({{"role", "assistant"}, {"content", "Hello there"}}));
  EXPECT_FALSE(c.contains("text"));
  EXPECT_TRUE(c.contains("logprobs") && c["logprobs"].is_null());
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(j["usage"], json({{"prompt_tokens", 5},
                              {"completion_tokens", 3},
                              {"total_tokens", 8},
                              {"prompt_tokens_details", {{"cached_tokens", 4}}}}));
}

TEST(OpenAiChatResponse, StreamChunks) {
  json role = sse_payload(sse_role_chunk(chat_meta(), false));
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["id"], chat_meta().id);
  EXPECT_EQ(role["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(role["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(role.contains("usage"));
  EXPECT_TRUE(sse_payload(sse_role_chunk(chat_meta(), true))["usage"].is_null());

  json text = sse_payload(sse_text_chunk(chat_meta(), "Hi", std::nullopt, false));
  EXPECT_EQ(text["choices"][0]["delta"], json({{"content", "Hi"}}));
  EXPECT_FALSE(text["choices"][0].contains("text"));
  EXPECT_TRUE(text["choices"][0]["finish_reason"].is_null());

  // The end: the last text, then the finish reason with an empty delta.
  std::vector<std::string> end =
      sse_events(sse_finish_chunks(chat_meta(), "!", FinishReason::Length, true));
  ASSERT_EQ(end.size(), 2u);
  EXPECT_EQ(json::parse(end[0])["choices"][0]["delta"], json({{"content", "!"}}));
  EXPECT_TRUE(json::parse(end[0])["choices"][0]["finish_reason"].is_null());
  const json last = json::parse(end[1]);
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(last["usage"].is_null());
  EXPECT_EQ(sse_events(sse_finish_chunks(chat_meta(), "", FinishReason::Stop, false)).size(), 1u);
  // Completions end in one chunk, text and reason together.
  EXPECT_EQ(sse_finish_chunks(meta(), "!", FinishReason::Stop, false),
            sse_text_chunk(meta(), "!", FinishReason::Stop, false));

  json usage = sse_payload(sse_usage_chunk(chat_meta(), {4, 2}));
  EXPECT_EQ(usage["object"], "chat.completion.chunk");
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 6);
}

// A chat chunk as a json tree: sse_text_chunk() must write its dump() bytes.
std::string reference_chat_chunk(const ResponseMeta& m, const std::string& text,
                                 std::optional<FinishReason> reason, bool include_usage,
                                 const std::vector<int>* token_ids) {
  json c = {{"index", 0},
            {"delta", reason && text.empty() ? json::object() : json({{"content", text}})},
            {"logprobs", nullptr},
            {"finish_reason", reason ? json(finish_reason_name(*reason)) : json(nullptr)}};
  if (token_ids) c["token_ids"] = *token_ids;
  json j = {{"id", m.id},
            {"object", "chat.completion.chunk"},
            {"created", m.created},
            {"model", m.model}};
  j["choices"] = json::array({c});
  if (include_usage) j["usage"] = nullptr;
  return "data: " + dump(j) + "\n\n";
}

TEST(OpenAiChatResponse, SseChunkBytesAreTheJsonTreeDump) {
  const std::vector<int> ids = {0, 7, 1999};
  const ResponseMeta odd{"chatcmpl-\"odd\"\n", -5, "m\xC3\xA9\\del", Api::Chat};
  for (const ResponseMeta& m : {chat_meta(), odd})
    for (const std::string text : {"", "Hi\n", " the \"end\"", "a\xff"})
      for (const std::optional<FinishReason> reason :
           {std::optional<FinishReason>{}, std::optional{FinishReason::Stop}})
        for (const bool usage : {false, true})
          for (const std::vector<int>* t : {(const std::vector<int>*)nullptr, &ids})
            EXPECT_EQ(sse_text_chunk(m, text, reason, usage, t),
                      reference_chat_chunk(m, text, reason, usage, t));
}

// ---- vLLM's /tokenize and /detokenize ----

TokenizeParams tokenize_ok(const std::string& body, ChatTemplate tmpl = ChatTemplate::Plain) {
  auto r = parse_tokenize_request(body, limits(), tmpl);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body << ": " << e->message;
    return {};
  }
  return std::get<TokenizeParams>(r);
}

json tokenize(const std::string& body) {
  auto r = tokenize_response(tokenize_ok(body), &fortune(), limits());
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body << ": " << e->message;
    return {};
  }
  return std::get<json>(r);
}

TEST(Tokenize, ATextGivesTheIdsACompletionPromptHas) {
  const std::string text = "A fool and his money are soon parted.";
  const json j = tokenize(json({{"prompt", text}, {"model", "fortune"}}).dump());
  CompletionParams p;
  p.prompt_text = text;
  p.max_tokens = 1;
  auto ids = resolve_prompt(p, &fortune(), limits());
  ASSERT_TRUE(std::holds_alternative<std::vector<int>>(ids));
  EXPECT_EQ(j["tokens"], json(std::get<std::vector<int>>(ids)));
  EXPECT_EQ(j["count"], std::get<std::vector<int>>(ids).size());
  EXPECT_EQ(j["max_model_len"], 256);
  EXPECT_TRUE(j["token_strs"].is_null());
  EXPECT_EQ(j["tokens"][0], fortune().bos_id());
}

TEST(Tokenize, NullMessagesAreNotGiven) {
  EXPECT_EQ(tokenize_ok(R"({"prompt":"Hi","messages":null})").text, "Hi");
}

TEST(Tokenize, WithoutSpecialTokensAndWithPieces) {
  const json j =
      tokenize(R"({"prompt":"Hello world","add_special_tokens":false,"return_token_strs":true})");
  ASSERT_FALSE(j["tokens"].empty());
  EXPECT_NE(j["tokens"][0], fortune().bos_id());
  ASSERT_EQ(j["token_strs"].size(), j["tokens"].size());
  for (size_t i = 0; i < j["tokens"].size(); ++i)
    EXPECT_EQ(j["token_strs"][i], fortune().piece(j["tokens"][i].get<int>()));
  EXPECT_EQ(fortune().decode(j["tokens"].get<std::vector<int>>()), "Hello world");
}

TEST(Tokenize, MessagesAreRenderedAsTheChatEndpointRendersThem) {
  const std::string body = R"({"messages":[{"role":"system","content":"Be brief."},
                                           {"role":"user","content":"Hi"}]})";
  for (ChatTemplate tmpl : {ChatTemplate::Plain, ChatTemplate::Llama2}) {
    auto chat = parse_chat_request(body, limits(), tmpl);
    ASSERT_TRUE(std::holds_alternative<CompletionParams>(chat));
    EXPECT_EQ(tokenize_ok(body, tmpl).text, *std::get<CompletionParams>(chat).prompt_text);
  }
  const std::string open = tokenize_ok(body).text;
  const std::string closed = tokenize_ok(R"({"messages":[{"role":"system","content":"Be brief."},
                                  {"role":"user","content":"Hi"}],"add_generation_prompt":false})")
                                 .text;
  EXPECT_EQ(open, closed + "Assistant:");
}

TEST(Tokenize, BadRequestsNameTheProblem) {
  struct Bad {
    const char* body;
    int status;
    const char* param;
    const char* says;
  };
  for (const Bad& b : {
           Bad{R"({})", 400, "prompt", "`prompt` (a text) or `messages` is required"},
           Bad{R"({"prompt":"x","messages":[]})", 400, "prompt", "not both"},
           Bad{R"({"prompt":null,"messages":null})", 400, "prompt", "or `messages` is required"},
           Bad{R"({"prompt":[1,2]})", 400, "prompt", "must be a string"},
           Bad{R"({"prompt":"x","add_special_tokens":1})", 400, "add_special_tokens", "boolean"},
           Bad{R"({"prompt":"x","return_token_strs":"yes"})", 400, "return_token_strs", "boolean"},
           Bad{R"({"messages":[]})", 400, "messages", "must not be empty"},
           Bad{R"({"messages":[{"role":"tool","content":"x"}]})", 400, "messages[0].role", "tool"},
           Bad{R"({"prompt":"x","model":"gpt-4"})", 404, "model", "does not exist"},
           Bad{R"([1])", 400, "", "JSON object"},
       }) {
    auto r = parse_tokenize_request(b.body, limits(), ChatTemplate::Plain);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << b.body;
    const ApiError& e = std::get<ApiError>(r);
    EXPECT_EQ(e.status, b.status) << b.body;
    EXPECT_EQ(e.param, b.param) << b.body;
    EXPECT_NE(e.message.find(b.says), std::string::npos) << b.body << ": " << e.message;
  }
  auto none = tokenize_response(tokenize_ok(R"({"prompt":"x"})"), nullptr, limits());
  ASSERT_TRUE(std::holds_alternative<ApiError>(none));
  EXPECT_NE(std::get<ApiError>(none).message.find("no tokenizer"), std::string::npos);
}

TEST(Detokenize, IdsBackToTheirText) {
  const std::vector<int> ids = fortune().encode("Time flies like an arrow.", true);
  auto parsed = parse_detokenize_request(json({{"tokens", ids}}).dump(), limits());
  ASSERT_TRUE(std::holds_alternative<std::vector<int>>(parsed));
  EXPECT_EQ(std::get<std::vector<int>>(parsed), ids);
  auto r = detokenize_response(ids, &fortune());
  ASSERT_TRUE(std::holds_alternative<json>(r));
  EXPECT_EQ(std::get<json>(r), json({{"prompt", "Time flies like an arrow."}}));
  auto empty = detokenize_response({}, &fortune());
  ASSERT_TRUE(std::holds_alternative<json>(empty));
  EXPECT_EQ(std::get<json>(empty)["prompt"], "");
  EXPECT_TRUE(std::holds_alternative<ApiError>(detokenize_response(ids, nullptr)));
}

TEST(Detokenize, BadIdsAreNamed) {
  struct Bad {
    const char* body;
    const char* says;
  };
  for (const Bad& b : {
           Bad{R"({})", "`tokens` is required"},
           Bad{R"({"tokens":"1 2"})", "`tokens` must be an array of token ids, got string"},
           Bad{R"({"tokens":[1,2000]})", "Token id 2000 at `tokens[1]` is outside the vocabulary"},
           Bad{R"({"tokens":[-1]})", "Token id -1 at `tokens[0]`"},
           Bad{R"({"tokens":[18446744073709551615]})", "Token id 18446744073709551615"},
           Bad{R"({"tokens":[1.5]})", "`tokens[0]` must be a token id, got number"},
           Bad{R"({"tokens":[1,"2"]})", "`tokens[1]` must be a token id, got string"},
       }) {
    auto r = parse_detokenize_request(b.body, limits());
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << b.body;
    EXPECT_EQ(std::get<ApiError>(r).status, 400) << b.body;
    EXPECT_NE(std::get<ApiError>(r).message.find(b.says), std::string::npos)
        << b.body << ": " << std::get<ApiError>(r).message;
  }
  auto ok = parse_detokenize_request(R"({"tokens":[3.0, 1999]})", limits());
  ASSERT_TRUE(std::holds_alternative<std::vector<int>>(ok));
  EXPECT_EQ(std::get<std::vector<int>>(ok), (std::vector<int>{3, 1999}));
}

}  // namespace
}  // namespace troupe::openai
