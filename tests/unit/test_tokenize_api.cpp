// vLLM's /tokenize and /detokenize as pure functions: parsing, the ids the
// completion endpoints would use, and the text back.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "net/openai_api.h"
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
  return l;
}

const Tokenizer& fortune() {
  static const Tokenizer tok = Tokenizer::load(test::model_path("fortune") / "tokenizer.model");
  return tok;
}

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
