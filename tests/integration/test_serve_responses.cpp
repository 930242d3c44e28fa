// POST /v1/responses through `troupe serve` on the bundled model: the same
// answer as the chat it amounts to, whole or as typed events, structured by
// text.format, and nothing stored to retrieve.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "net/sse_parser.h"
#include "support/process_support.h"
#include "support/serving_support.h"

namespace troupe {
namespace {

using json = nlohmann::json;
using test::Server;

json post(Server& s, const std::string& path, const json& body, int status = 200) {
  const auto r = test::http_request(s.port(), "POST", path, body.dump(), 120);
  EXPECT_EQ(r.status, status) << r.body;
  return json::parse(r.body, nullptr, false);
}

TEST(ServeResponses, AResponseIsTheChatsAnswerWholeOrStreamed) {
  Server s({"devices=[{kind: cpu, threads: 1}]"});
  const json chat = post(s, "/v1/chat/completions",
                         {{"messages",
                           {{{"role", "system"}, {"content", "Be wise."}},
                            {{"role", "user"}, {"content", "Tell me a fortune"}}}},
                          {"max_tokens", 24},
                          {"temperature", 0}});
  const std::string expected = chat["choices"][0]["message"]["content"];
  const json body = {{"instructions", "Be wise."},
                     {"input", "Tell me a fortune"},
                     {"max_output_tokens", 24},
                     {"temperature", 0}};
  const json r = post(s, "/v1/responses", body);
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["id"].get<std::string>().rfind("resp_", 0), 0u) << r["id"];
  EXPECT_EQ(r["output"][0]["content"][0]["text"], expected);
  EXPECT_EQ(r["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
  EXPECT_EQ(r["usage"]["output_tokens"], chat["usage"]["completion_tokens"]);
  EXPECT_EQ(r["status"],
            chat["choices"][0]["finish_reason"] == "length" ? "incomplete" : "completed");

  json streamed = body;
  streamed["stream"] = true;
  const auto events = test::http_request(s.port(), "POST", "/v1/responses", streamed.dump(), 120);
  ASSERT_EQ(events.status, 200) << events.body;
  std::string text;
  json last;
  for (const std::string& e : sse_events(events.body)) {
    last = json::parse(e);
    if (last["type"] == "response.output_text.delta") text += last["delta"].get<std::string>();
  }
  EXPECT_EQ(text, expected);
  EXPECT_EQ(last["response"]["output"][0]["content"][0]["text"], expected);
  EXPECT_NE(events.body.find("event: response.created\n"), std::string::npos);

  // Shaped by text.format.
  const json shaped = post(s, "/v1/responses", json::parse(R"({"input": "Someone",
      "max_output_tokens": 120, "temperature": 0, "text": {"format": {"type": "json_schema",
      "name": "p", "schema": {"type": "object", "properties": {"age": {"type": "integer"}},
      "required": ["age"]}}}})"));
  const json value =
      json::parse(shaped["output"][0]["content"][0]["text"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(value.is_object()) << shaped;
  EXPECT_TRUE(value["age"].is_number_integer()) << value;

  // Errors name the Responses fields; nothing is stored.
  const json bad = post(s, "/v1/responses", {{"input", "x"}, {"max_output_tokens", 0}}, 400);
  EXPECT_EQ(bad["error"]["param"], "max_output_tokens");
  const auto stored = test::http_request(s.port(), "GET", "/v1/responses/resp_1", "", 30);
  EXPECT_EQ(stored.status, 404);
}

}  // namespace
}  // namespace troupe
