// Structured output through `troupe serve` on the bundled model, as clients
// of OpenAI's and vLLM's APIs ask for it: the answers follow the schema, the
// choices or the grammar, whole or streamed, sampled or greedy; a forced
// tool call comes back as tool_calls; a server that cannot is clear why.
#include <gtest/gtest.h>

#include <cctype>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "net/sse_parser.h"
#include "support/process_support.h"
#include "support/serving_support.h"
#include "support/test_support.h"

namespace troupe {
namespace {

using json = nlohmann::json;
// Bodies keep their keys in the order written: a schema's properties are
// generated in that order.
using ojson = nlohmann::ordered_json;
using test::Server;

json post_chat(Server& s, const ojson& body, int status = 200) {
  const auto r = test::http_request(s.port(), "POST", "/v1/chat/completions", body.dump(), 120);
  EXPECT_EQ(r.status, status) << r.body;
  return json::parse(r.body, nullptr, false);
}

const ojson kPerson = ojson::parse(R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0},
    "mood": {"enum": ["happy", "sad"]},
    "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}},
  "required": ["name", "age", "mood", "score"]})");

// The answer is the JSON of a person as kPerson has it, keys in its order.
void expect_person(const std::string& text, const std::string& where) {
  const json v = json::parse(text, nullptr, false);
  ASSERT_FALSE(v.is_discarded()) << where << ": " << text;
  ASSERT_TRUE(v.is_object()) << where << ": " << text;
  ASSERT_TRUE(v.contains("name") && v["name"].is_string()) << where << ": " << text;
  EXPECT_LE(v["name"].get<std::string>().size(), 80u) << where;
  ASSERT_TRUE(v.contains("age") && v["age"].is_number_integer()) << where << ": " << text;
  EXPECT_GE(v["age"].get<int64_t>(), 0) << where;
  ASSERT_TRUE(v.contains("mood")) << where << ": " << text;
  EXPECT_TRUE(v["mood"] == "happy" || v["mood"] == "sad") << where << ": " << text;
  ASSERT_TRUE(v.contains("score") && v["score"].is_number()) << where << ": " << text;
  EXPECT_TRUE(v["score"].get<double>() > 0 && v["score"].get<double>() <= 1)
      << where << ": " << text;
  for (const auto& [k, x] : v.items())
    EXPECT_TRUE(k == "name" || k == "age" || k == "mood" || k == "score" || k == "tags")
        << where << ": " << k;
  EXPECT_LT(text.find("\"name\""), text.find("\"age\"")) << where << ": " << text;
}

TEST(ServeStructuredOutput, AnswersFollowTheSchemaTheChoicesOrTheGrammar) {
  Server s({"devices=[{kind: cpu, threads: 1}]"});
  const ojson messages = {{{"role", "user"}, {"content", "Tell me about someone."}}};
  const ojson format = {
      {"type", "json_schema"},
      {"json_schema", {{"name", "person"}, {"strict", true}, {"schema", kPerson}}}};
  // Greedy, sampled with n choices, and streamed: every answer a person.
  const json greedy = post_chat(s, {{"messages", messages},
                                    {"max_tokens", 150},
                                    {"temperature", 0},
                                    {"response_format", format}});
  ASSERT_TRUE(greedy.is_object());
  EXPECT_EQ(greedy["choices"][0]["finish_reason"], "stop");
  expect_person(greedy["choices"][0]["message"]["content"], "greedy");
  const json sampled = post_chat(s, {{"messages", messages},
                                     {"max_tokens", 150},
                                     {"temperature", 1.0},
                                     {"seed", 11},
                                     {"n", 3},
                                     {"response_format", format}});
  ASSERT_EQ(sampled["choices"].size(), 3u);
  for (const json& c : sampled["choices"]) {
    EXPECT_EQ(c["finish_reason"], "stop");
    expect_person(c["message"]["content"], "choice " + c["index"].dump());
  }
  ojson stream = {{"messages", messages},
                  {"max_tokens", 150},
                  {"temperature", 0},
                  {"stream", true},
                  {"response_format", format}};
  const auto streamed =
      test::http_request(s.port(), "POST", "/v1/chat/completions", stream.dump(), 120);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::string deltas;
  for (const std::string& e : sse_events(streamed.body)) {
    if (e == "[DONE]") continue;
    const json d = json::parse(e)["choices"][0]["delta"];
    if (d.contains("content") && d["content"].is_string()) deltas += d["content"];
  }
  EXPECT_EQ(deltas, greedy["choices"][0]["message"]["content"]);
  // vLLM's guided_json (here a JSON text), guided_choice and guided_grammar
  // on /v1/completions.
  const auto r = s.complete({{"prompt", "The weather today is"},
                             {"max_tokens", 20},
                             {"temperature", 1.0},
                             {"seed", 3},
                             {"n", 4},
                             {"guided_choice", {"sunny", "rainy", "foggy and cold"}}});
  ASSERT_EQ(r.status, 200) << r.body;
  for (const json& c : json::parse(r.body)["choices"]) {
    const std::string t = c["text"];
    EXPECT_TRUE(t == "sunny" || t == "rainy" || t == "foggy and cold") << t;
    EXPECT_EQ(c["finish_reason"], "stop");
  }
  const auto g = s.complete({{"prompt", "Count:"},
                             {"max_tokens", 40},
                             {"temperature", 0},
                             {"guided_grammar", "root ::= [0-9]{1,3} (\", \" [0-9]{1,3}){2}"}});
  ASSERT_EQ(g.status, 200) << g.body;
  const std::string counted = json::parse(g.body)["choices"][0]["text"];
  int numbers = 0;
  for (char c : counted) numbers += c == ',';
  EXPECT_EQ(numbers, 2) << counted;
  EXPECT_EQ(json::parse(g.body)["choices"][0]["finish_reason"], "stop") << counted;
  const auto rx = s.complete({{"prompt", "Code:"},
                              {"max_tokens", 20},
                              {"temperature", 0.7},
                              {"seed", 5},
                              {"guided_regex", "[A-Z]{2}-\\d{3}"}});
  ASSERT_EQ(rx.status, 200) << rx.body;
  const std::string code = json::parse(rx.body)["choices"][0]["text"];
  ASSERT_EQ(code.size(), 6u) << code;
  EXPECT_TRUE(std::isupper(code[0]) && std::isupper(code[1]) && code[2] == '-' &&
              std::isdigit(code[3]) && std::isdigit(code[4]) && std::isdigit(code[5]))
      << code;
  const auto gj = s.complete({{"prompt", "A list:"},
                              {"max_tokens", 60},
                              {"temperature", 0},
                              {"guided_json", R"({"type": "array", "items": {"type": "boolean"},
                                                  "minItems": 2, "maxItems": 4})"}});
  ASSERT_EQ(gj.status, 200) << gj.body;
  const json list =
      json::parse(std::string(json::parse(gj.body)["choices"][0]["text"]), nullptr, false);
  ASSERT_TRUE(list.is_array()) << gj.body;
  EXPECT_GE(list.size(), 2u);
  EXPECT_LE(list.size(), 4u);
  for (const json& b : list) EXPECT_TRUE(b.is_boolean()) << gj.body;
  // A pattern holds a string's content: two capitals and two digits.
  const ojson code_schema = ojson::parse(R"({"type": "object", "properties": {
      "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}}, "required": ["code"]})");
  const json coded = post_chat(
      s, {{"messages", messages},
          {"max_tokens", 40},
          {"temperature", 0},
          {"response_format",
           {{"type", "json_schema"}, {"json_schema", {{"name", "c"}, {"schema", code_schema}}}}}});
  const json code_doc = json::parse(coded["choices"][0]["message"]["content"].get<std::string>());
  const std::string code2 = code_doc["code"];
  ASSERT_EQ(code2.size(), 4u) << code2;
  EXPECT_TRUE(std::isupper(code2[0]) && std::isupper(code2[1]) && std::isdigit(code2[2]) &&
              std::isdigit(code2[3]))
      << code2;
  // A schema that cannot be enforced: 400 naming the keyword; the server serves on.
  const json bad =
      post_chat(s,
                {{"messages", messages},
                 {"response_format",
                  {{"type", "json_schema"},
                   {"json_schema",
                    {{"name", "x"}, {"schema", {{"type", "array"}, {"uniqueItems", true}}}}}}}},
                400);
  EXPECT_NE(bad["error"]["message"].get<std::string>().find("uniqueItems"), std::string::npos)
      << bad.dump();
  EXPECT_EQ(post_chat(s, {{"messages", messages}, {"max_tokens", 5}})["choices"].size(), 1u);
}

// tool_choice "required" or a named function: the answer is a call of a
// tool offered, with arguments valid under its parameters.
TEST(ServeStructuredOutput, AForcedToolCallComesBackAsToolCalls) {
  test::TempDir dir;
  test::write_file(dir / "tools.jinja",
                   "{%- if tools %}Tools: {{ tools|tojson }}\n{% endif %}"
                   "{%- for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                   "{%- if add_generation_prompt %}assistant:{% endif %}");
  Server s({"devices=[{kind: cpu, threads: 1}]",
            "server.chat_template_file=" + (dir / "tools.jinja").string()});
  // Small arguments: the prompt with the tool takes most of the model's 256.
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                     "metric": {"type": "boolean"}}, "required": ["city", "metric"]}}}])");
  const ojson messages = {{{"role", "user"}, {"content", "Weather in Oslo?"}}};
  for (const ojson& choice :
       {ojson("required"), ojson{{"type", "function"}, {"function", {{"name", "weather"}}}}}) {
    for (bool stream : {false, true}) {
      const ojson body = {{"messages", messages}, {"tools", tools},   {"tool_choice", choice},
                          {"max_tokens", 90},     {"temperature", 0}, {"stream", stream}};
      const auto r = test::http_request(s.port(), "POST", "/v1/chat/completions", body.dump(), 120);
      ASSERT_EQ(r.status, 200) << r.body;
      json call;
      std::string finish;
      if (!stream) {
        const json c = json::parse(r.body)["choices"][0];
        finish = c["finish_reason"];
        EXPECT_TRUE(c["message"]["content"].is_null()) << r.body;
        ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r.body;
        call = c["message"]["tool_calls"][0];
      } else {
        for (const auto& line : sse_events(r.body)) {
          if (line == "[DONE]") continue;
          const json c = json::parse(line)["choices"][0];
          if (c["delta"].contains("tool_calls")) call = c["delta"]["tool_calls"][0];
          if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
        }
      }
      // A named function's call ends as any answer (OpenAI's and vLLM's way).
      EXPECT_EQ(finish, choice.is_string() ? "tool_calls" : "stop") << r.body;
      ASSERT_TRUE(call.is_object()) << r.body;
      EXPECT_EQ(call["type"], "function");
      EXPECT_EQ(call["function"]["name"], "weather");
      const json args = json::parse(call["function"]["arguments"].get<std::string>());
      EXPECT_TRUE(args["city"].is_string() && args["metric"].is_boolean()) << args;
    }
  }
}

// server.reasoning_parser with structured output: the grammar shapes the
// reply after the reasoning, and leaves the reasoning free, as vLLM does. A
// test template opens the reasoning in the prompt when asked (as DeepSeek
// R1's and Qwen3-Thinking's do), since this model writes no "<think>".
TEST(ServeStructuredOutput, WithAReasoningParserTheGrammarShapesTheReply) {
  test::TempDir dir;
  test::write_file(dir / "think.jinja",
                   "{%- for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                   "{%- if add_generation_prompt %}assistant:{% if think %}<think>\n{% endif %}"
                   "{% endif %}");
  Server s({"devices=[{kind: cpu, threads: 1}]", "server.reasoning_parser=qwen3",
            "server.chat_template_file=" + (dir / "think.jinja").string()});
  const ojson base = {{"messages", {{{"role", "user"}, {"content", "Why?"}}}},
                      {"max_tokens", 24},
                      {"temperature", 0}};
  auto reply_follows = [](const json& content) {
    if (!content.is_string()) return false;
    std::string text = content;
    text.erase(0, text.find_first_not_of(" \n"));
    if (text.size() < 3 || text.size() > 12) return false;
    for (char c : text)
      if (c < 'a' || c > 'z') return false;
    return true;
  };
  // No reasoning opened: the grammar shapes the answer from its start.
  ojson shaped = base;
  shaped["guided_regex"] = "[a-z]{3,12}";
  const json direct = post_chat(s, shaped)["choices"][0]["message"];
  EXPECT_TRUE(direct["reasoning_content"].is_null()) << direct;
  EXPECT_TRUE(reply_follows(direct["content"])) << direct;

  // Opened: the reasoning is what the model writes without a grammar.
  ojson open_free = base;
  open_free["chat_template_kwargs"] = {{"think", true}};
  ojson open_shaped = shaped;
  open_shaped["chat_template_kwargs"] = {{"think", true}};
  const json free = post_chat(s, open_free)["choices"][0]["message"];
  const json held = post_chat(s, open_shaped)["choices"][0]["message"];
  ASSERT_TRUE(free["reasoning_content"].is_string()) << free;
  ASSERT_TRUE(held["reasoning_content"].is_string()) << held;
  EXPECT_GE(free["reasoning_content"].get<std::string>().size(), 8u) << free;
  EXPECT_EQ(held["reasoning_content"], free["reasoning_content"]);
  // A reply, if the model closed its reasoning within max_tokens, follows it.
  if (!held["content"].is_null()) {
    EXPECT_TRUE(reply_follows(held["content"])) << held;
  }

  // Streamed, the same split.
  open_shaped["stream"] = true;
  const auto r =
      test::http_request(s.port(), "POST", "/v1/chat/completions", open_shaped.dump(), 120);
  ASSERT_EQ(r.status, 200) << r.body;
  std::string reasoning, content;
  for (const std::string& e : sse_events(r.body)) {
    if (e == "[DONE]") continue;
    const json d = json::parse(e)["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content") && d["content"].is_string())
      content += d["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, held["reasoning_content"]);
  EXPECT_EQ(content, held["content"].is_null() ? "" : held["content"].get<std::string>());
}

TEST(ServeStructuredOutput, WithoutATokenizerItIsRefusedSayingWhy) {
  Server s({"model.path=models/stories260K/stories260K.bin"});
  const auto r = s.complete(
      {{"prompt", std::vector<int>{1, 300}}, {"guided_choice", {"a", "b"}}, {"max_tokens", 4}});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("no tokenizer"), std::string::npos) << r.body;
}

}  // namespace
}  // namespace troupe
