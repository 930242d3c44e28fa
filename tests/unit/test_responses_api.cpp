// The Responses API read as the chat it asks for, and its response object
// and events (net/responses_api.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "net/responses_api.h"
#include "net/sse_parser.h"

namespace troupe::openai {
namespace {

using nlohmann::json;

ModelLimits limits() {
  ModelLimits l;
  l.name = "fortune";
  l.context_length = 1024;
  l.vocab_size = 2000;
  l.max_tokens_cap = 200;
  return l;
}

// A template that shows the messages and tools it is given.
ChatFormat shown() {
  ChatFormat f = jinja_chat_format("{{ messages|tojson }}|{{ tools|tojson }}", "", "");
  f.tool_calls = ToolCallFormat::Hermes;
  return f;
}

CompletionParams ok(const std::string& body) {
  auto r = parse_responses_request(body, limits(), shown());
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << ": " << e->message;
  return std::get<CompletionParams>(r);
}

ApiError err(const std::string& body) {
  auto r = parse_responses_request(body, limits(), shown());
  if (!std::holds_alternative<ApiError>(r)) {
    ADD_FAILURE() << "accepted: " << body;
    return {};
  }
  return std::get<ApiError>(r);
}

TEST(ResponsesParse, InputAndInstructionsAreTheChatsMessages) {
  const CompletionParams p = ok(
      R"({"input": "Hi", "instructions": "Be brief.", "max_output_tokens": 7, "temperature": 0.5,
          "metadata": {"k": "v"}})");
  EXPECT_EQ(p.api, Api::Responses);
  EXPECT_EQ(
      *p.prompt_text,
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]|null)");
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_FLOAT_EQ(p.temperature, 0.5f);
  EXPECT_EQ(p.response_fields["instructions"], "Be brief.");
  EXPECT_EQ(p.response_fields["max_output_tokens"], 7);
  EXPECT_EQ(p.response_fields["metadata"]["k"], "v");
  EXPECT_EQ(p.response_fields["store"], false);
  // No max_output_tokens: what the context leaves, as a chat's.
  EXPECT_TRUE(ok(R"({"input": "Hi"})").max_tokens_from_context);
}

// Items: messages with text parts, a function call joined to the
// assistant's message before it, its output as a tool message naming the
// function; a reasoning item's text is the next assistant message's
// reasoning_content (which Qwen3's template shows in a turn with calls).
TEST(ResponsesParse, ItemsBecomeMessagesToolCallsAndToolMessages) {
  const CompletionParams p = ok(R"({"input": [
      {"role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "W?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [],
       "content": [{"type": "reasoning_text", "text": "Look it up."}]},
      {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
       "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
      {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{\"z\": 1}"},
      {"type": "function_call", "call_id": "c2", "name": "put", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c2", "output": "done"},
      {"type": "function_call_output", "call_id": "c1", "output": "22"}],
    "tools": [{"type": "function", "name": "get", "parameters": {"type": "object"}}]})");
  const std::string prompt = *p.prompt_text;
  const json messages = json::parse(prompt.substr(0, prompt.find('|')));
  ASSERT_EQ(messages.size(), 5u) << prompt;
  EXPECT_EQ(messages[0]["role"], "system");  // developer, OpenAI's newer name
  EXPECT_EQ(messages[0]["content"], "Rules.");
  EXPECT_EQ(messages[1]["content"], "W?");
  EXPECT_EQ(messages[2]["content"], "Let me look.");
  EXPECT_EQ(messages[2]["reasoning_content"], "Look it up.");  // the reasoning item's
  ASSERT_EQ(messages[2]["tool_calls"].size(), 2u);
  EXPECT_EQ(messages[2]["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(messages[2]["tool_calls"][0]["function"]["arguments"]["z"], 1);
  EXPECT_EQ(messages[3]["role"], "tool");
  EXPECT_EQ(messages[3]["tool_call_id"], "c2");
  EXPECT_EQ(messages[3]["name"], "put");
  EXPECT_EQ(messages[4]["name"], "get");
  const json tools = json::parse(prompt.substr(prompt.find('|') + 1));
  EXPECT_EQ(tools[0]["function"]["name"], "get");
  EXPECT_EQ(p.tool_calls, ToolCallFormat::Hermes);
  // A call with no message before it is an assistant's message of its own.
  const CompletionParams q = ok(R"({"input": [{"role": "user", "content": "W?"},
      {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{}"}]})");
  EXPECT_NE(q.prompt_text->find(R"({"role": "assistant", "content": "", "tool_calls")"),
            std::string::npos)
      << *q.prompt_text;
}

TEST(ResponsesParse, TextFormatAndForcedFunctionsAreGrammars) {
  const CompletionParams schema = ok(R"({"input": "x", "text": {"format": {"type": "json_schema",
      "name": "p", "strict": true, "schema": {"type": "object", "properties": {"a": {"type":
      "integer"}}, "required": ["a"], "additionalProperties": false}}}})");
  grammar::Matcher m(
      std::make_shared<const grammar::Grammar>(grammar::Grammar::parse(schema.grammar)));
  EXPECT_TRUE(m.accept(R"({"a": 12})") && m.is_complete());
  EXPECT_EQ(schema.response_fields["text"]["format"]["name"], "p");
  EXPECT_FALSE(
      ok(R"({"input": "x", "text": {"format": {"type": "json_object"}}})").grammar.empty());
  EXPECT_TRUE(ok(R"({"input": "x", "text": {"format": {"type": "text"}}})").grammar.empty());
  const CompletionParams named = ok(R"({"input": "x", "tool_choice": {"type": "function", "name":
      "get"}, "tools": [{"type": "function", "name": "get", "parameters": {"type": "object"}}]})");
  EXPECT_EQ(named.tool_calls, ToolCallFormat::ForcedNamed);
  EXPECT_EQ(named.response_fields["tool_choice"]["name"], "get");
}

// vLLM's structured output and sampling extensions are the chat's: honoured
// or refused alike, never ignored.
TEST(ResponsesParse, VllmExtensionsAreTheChatsOwn) {
  EXPECT_FALSE(ok(R"({"input": "x", "guided_choice": ["yes", "no"]})").grammar.empty());
  EXPECT_FALSE(ok(R"({"input": "x", "guided_regex": "[0-9]{4}"})").grammar.empty());
  EXPECT_FALSE(
      ok(R"({"input": "x", "structured_outputs": {"choice": ["a", "b"]}})").grammar.empty());
  const CompletionParams p = ok(R"({"input": "x", "allowed_token_ids": [5, 3],
      "include_stop_str_in_output": true, "stop": ["."]})");
  EXPECT_EQ(p.allowed_token_ids, (std::vector<int>{3, 5}));
  EXPECT_TRUE(p.include_stop_str_in_output);
  for (const char* rest : {R"("best_of": 3)", R"("use_beam_search": true)",
                           R"("prompt_logprobs": 1)", R"("allowed_token_ids": [])"}) {
    const ApiError e = err(std::string(R"({"input": "x", )") + rest + "}");
    EXPECT_EQ(e.status, 400) << rest;
    EXPECT_NE(std::string(rest).find(e.param), std::string::npos) << rest << ": " << e.param;
  }
}

// Errors name the fields the client sent, not the chat's they became.
TEST(ResponsesParse, ErrorsNameTheResponsesFields) {
  const auto param = [](const std::string& body) { return err(body).param; };
  EXPECT_EQ(param(R"({"instructions": "x"})"), "input");
  EXPECT_EQ(param(R"({"input": "x", "max_output_tokens": -1})"), "max_output_tokens");
  const ApiError max = err(R"({"input": "x", "max_output_tokens": 0})");
  EXPECT_NE(max.message.find("`max_output_tokens`"), std::string::npos) << max.message;
  EXPECT_EQ(param(R"({"input": [{"role": "user"}]})"), "input[0].content");
  EXPECT_EQ(param(R"({"input": [{"role": "robot", "content": "x"}]})"), "input[0].role");
  EXPECT_EQ(param(R"({"instructions": "s", "input": [{"role": "user", "content": "a"},
      {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})"),
            "input[1].content[0].type");
  EXPECT_EQ(param(R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})"),
            "input[0].call_id");
  EXPECT_EQ(param(R"({"input": [{"type": "function_call", "call_id": "c", "name": "f",
      "arguments": "not json"}]})"),
            "input[0].tool_calls[0].function.arguments");
  EXPECT_EQ(param(R"({"input": [{"type": "item_reference", "id": "x"}]})"), "input[0].type");
  EXPECT_EQ(param(R"({"input": "x", "tools": [{"type": "web_search"}]})"), "tools[0].type");
  EXPECT_EQ(param(R"({"input": "x", "tools": [{"type": "function"}]})"), "tools[0].name");
  EXPECT_EQ(param(R"({"input": "x", "tool_choice": {"type": "function", "name": "nope"},
      "tools": [{"type": "function", "name": "get"}]})"),
            "tool_choice.name");
  EXPECT_EQ(param(R"({"input": "x", "text": {"format": {"type": "json_schema"}}})"),
            "text.format.schema");
  EXPECT_EQ(param(R"({"input": "x", "text": {"format": {"type": "xml"}}})"), "text.format.type");
  EXPECT_EQ(param(R"({"input": "x", "previous_response_id": "resp_1"})"), "previous_response_id");
  EXPECT_EQ(param(R"({"input": "x", "background": true})"), "background");
  EXPECT_EQ(param(R"({"input": "x", "include": ["message.output_text.logprobs"]})"), "include[0]");
  EXPECT_EQ(param(R"({"input": "x", "model": "gpt-9"})"), "model");
  EXPECT_EQ(err(R"({"input": "x", "model": "gpt-9"})").status, 404);
  // Accepted as clients send them: nothing is stored, no reasoning is encrypted.
  ok(R"({"input": "x", "store": true, "include": ["reasoning.encrypted_content"],
      "truncation": "disabled", "reasoning": {"effort": "low"}, "parallel_tool_calls": false})");
}

// The events of a stream, parsed: type and payload.
std::vector<json> parse_events(const std::string& text) {
  std::vector<json> out;
  for (const std::string& data : sse_events(text)) out.push_back(json::parse(data));
  return out;
}

ResponseMeta meta() {
  return {"resp_00ab", 1700000000, "fortune", Api::Responses};
}

json fields() {
  return {{"instructions", nullptr}, {"tools", json::array()}};
}

TEST(ResponsesWriter, AStreamNumbersItsEventsAndEndsWithTheWholeResponse) {
  ResponsesWriter w(meta(), fields());
  std::string s = w.open();
  EXPECT_EQ(w.open(), "");  // once
  s += w.reasoning("Think", true);
  s += w.reasoning("ing.", true);
  s += w.reply("Hel", true);
  s += w.reply("lo", true);
  s += w.finish_stream(FinishReason::Stop, {10, 6}, 3, {{"call_x_0", "get", R"({"a": 1})"}});
  const std::vector<json> events = parse_events(s);
  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["sequence_number"], int(i));
    types.push_back(events[i]["type"]);
  }
  const std::vector<std::string> expected = {"response.created",
                                             "response.in_progress",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.reasoning_text.delta",
                                             "response.reasoning_text.delta",
                                             "response.reasoning_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.output_text.delta",
                                             "response.output_text.delta",
                                             "response.output_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.function_call_arguments.delta",
                                             "response.function_call_arguments.done",
                                             "response.output_item.done",
                                             "response.completed"};
  EXPECT_EQ(types, expected);
  // The SSE lines name the event too.
  EXPECT_NE(s.find("event: response.completed\ndata: "), std::string::npos);
  const json& r = events.back()["response"];
  EXPECT_EQ(r["status"], "completed");
  ASSERT_EQ(r["output"].size(), 3u);
  EXPECT_EQ(r["output"][0]["type"], "reasoning");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "Thinking.");
  EXPECT_EQ(r["output"][1]["content"][0]["text"], "Hello");
  EXPECT_EQ(r["output"][1]["id"], "msg_00ab");
  EXPECT_EQ(r["output"][2]["call_id"], "call_x_0");
  EXPECT_EQ(r["output"][2]["arguments"], R"({"a": 1})");
  EXPECT_EQ(r["usage"]["output_tokens_details"]["reasoning_tokens"], 3);
  EXPECT_EQ(r["usage"]["total_tokens"], 16);
  EXPECT_EQ(events[0]["response"]["status"], "in_progress");
  EXPECT_TRUE(events[0]["response"]["usage"].is_null());
}

TEST(ResponsesWriter, AWholeResponseHasItsItemsAndStatus) {
  // Cut by max_output_tokens: incomplete, and so is its message.
  ResponsesWriter cut(meta(), fields());
  cut.reply("Hel", false);
  const json r = cut.finish(FinishReason::Length, {3, 5}, 0, {});
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
  EXPECT_EQ(r["object"], "response");
  EXPECT_TRUE(r["instructions"].is_null());
  // No text and no call: an empty message still.
  ResponsesWriter empty(meta(), fields());
  const json e = empty.finish(FinishReason::Stop, {3, 1}, 0, {});
  ASSERT_EQ(e["output"].size(), 1u);
  EXPECT_EQ(e["output"][0]["content"][0]["text"], "");
  // Only calls: no message.
  ResponsesWriter calls(meta(), fields());
  const json c =
      calls.finish(FinishReason::Stop, {3, 1}, 0, {{"c0", "f", "{}"}, {"c1", "g", "{}"}});
  ASSERT_EQ(c["output"].size(), 2u);
  EXPECT_EQ(c["output"][1]["id"], "fc_00ab_1");
  // Reasoning alone: the reply after it is an empty message.
  ResponsesWriter thought(meta(), fields());
  thought.reasoning("Hmm", false);
  const json t = thought.finish(FinishReason::Stop, {3, 1}, 1, {});
  ASSERT_EQ(t["output"].size(), 2u);
  EXPECT_EQ(t["output"][1]["type"], "message");
  // An error after the stream started.
  const std::vector<json> err = parse_events(thought.error(bad_request("Gone.", "", "x")));
  ASSERT_EQ(err.size(), 1u);
  EXPECT_EQ(err[0]["type"], "error");
  EXPECT_EQ(err[0]["message"], "Gone.");
}

}  // namespace
}  // namespace troupe::openai
