// Tool calls read from a model's answer as vLLM's hermes and llama3_json
// parsers read them, whole and streamed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>

#include "net/tool_calls.h"
#include "support/test_support.h"

namespace troupe::openai {
namespace {

TEST(ToolCalls, TheFormatIsReadFromTheTemplatesMarkers) {
  EXPECT_EQ(detect_tool_call_format("{{- '<tool_call>\\n' }}{{ tool_call | tojson }}"),
            ToolCallFormat::Hermes);
  EXPECT_EQ(detect_tool_call_format(
                "<|start_header_id|>{{ '{\"name\": \"' + f.name + '\", \"parameters\": ' }}"),
            ToolCallFormat::Llama3Json);
  EXPECT_EQ(detect_tool_call_format("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ToolCallFormat::None);
}

TEST(ToolCalls, HermesCallsAreTheJsonBetweenTheMarkersAndTheContentBeforeThem) {
  const ParsedAnswer a = parse_tool_calls(
      ToolCallFormat::Hermes,
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Zürich\", \"days\": [1,2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", "
      "\"arguments\": {}}\n</tool_call>",
      "call-");
  EXPECT_EQ(a.content, "Let me look.\n");
  ASSERT_EQ(a.calls.size(), 2u);
  // Arguments as Python's json.dumps(ensure_ascii=False) writes them.
  EXPECT_EQ(a.calls[0],
            (ToolCall{"call-0", "get_weather", R"({"city": "Zürich", "days": [1, 2]})"}));
  EXPECT_EQ(a.calls[1], (ToolCall{"call-1", "now", "{}"}));
}

TEST(ToolCalls, AnUnclosedLastHermesCallCountsAndAMalformedOneLeavesTheText) {
  const ParsedAnswer open = parse_tool_calls(
      ToolCallFormat::Hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}", "c");
  ASSERT_EQ(open.calls.size(), 1u);
  EXPECT_EQ(open.calls[0].arguments, R"({"x": 1})");
  EXPECT_EQ(open.content, "");
  for (const char* bad : {"<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}",
                          "<tool_call>{\"arguments\": {}}</tool_call>",
                          "<tool_call>{\"name\": \"f\"}</tool_call>", "no call at all"}) {
    const ParsedAnswer a = parse_tool_calls(ToolCallFormat::Hermes, bad, "c");
    EXPECT_TRUE(a.calls.empty()) << bad;
    EXPECT_EQ(a.content, bad);
  }
}

TEST(ToolCalls, Llama3CallsAreJsonObjectsFromTheFirstCharacter) {
  const ParsedAnswer a = parse_tool_calls(
      ToolCallFormat::Llama3Json,
      R"({"name": "a", "parameters": {"q": "x; y"}}; {"name": "b", "arguments": {"n": 2.5}})",
      "id");
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.calls[0], (ToolCall{"id0", "a", R"({"q": "x; y"})"}));
  EXPECT_EQ(a.calls[1], (ToolCall{"id1", "b", R"({"n": 2.5})"}));
  EXPECT_EQ(a.content, "");
  for (const char* text : {"The answer is {\"name\": \"a\", \"parameters\": {}}",
                           "{\"name\": \"a\"}", "{\"name\": \"a\", \"parameters\": {}"}) {
    const ParsedAnswer b = parse_tool_calls(ToolCallFormat::Llama3Json, text, "id");
    EXPECT_TRUE(b.calls.empty()) << text;
    EXPECT_EQ(b.content, text);
  }
}

// A forced call (tool_choice required or named) is generated as a JSON array
// under its grammar: every element a call; the stream holds all of it.
TEST(ToolCalls, ForcedCallsAreTheJsonArrayTheGrammarMade) {
  const ParsedAnswer a = parse_tool_calls(
      ToolCallFormat::Forced,
      R"([{"name": "a", "parameters": {"q": "é", "n": [1, 2]}}, {"name": "b", "parameters": {}}])",
      "id");
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.calls[0], (ToolCall{"id0", "a", R"({"q": "é", "n": [1, 2]})"}));
  EXPECT_EQ(a.calls[1], (ToolCall{"id1", "b", "{}"}));
  EXPECT_EQ(a.content, "");
  // Cut short by max_tokens: no call, the text as content.
  const std::string cut = R"([{"name": "a", "parameters": {"q": )";
  const ParsedAnswer b = parse_tool_calls(ToolCallFormat::Forced, cut, "id");
  EXPECT_TRUE(b.calls.empty());
  EXPECT_EQ(b.content, cut);
  ToolCallFilter f(ToolCallFormat::Forced, "id");
  EXPECT_EQ(f.push("[{\"name\": \"a\", "), "");
  EXPECT_EQ(f.push("\"parameters\": {}}]"), "");
  const ParsedAnswer c = f.finish();
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.calls[0].arguments, "{}");
}

// Content streams out up to a call's marker, whatever the pieces; a piece
// that only looked like the marker's start goes out when it is not.
TEST(ToolCalls, TheStreamingFilterHoldsOnlyWhatMayBeACall) {
  const std::string answer =
      "Sure <tool <b>.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"<tool_call>\"}}\n"
      "</tool_call>";
  for (size_t piece : {1u, 2u, 3u, 5u, 11u, 200u}) {
    SCOPED_TRACE(piece);
    ToolCallFilter filter(ToolCallFormat::Hermes, "c");
    std::string streamed;
    for (size_t at = 0; at < answer.size(); at += piece) {
      const std::string out = filter.push(answer.substr(at, piece));
      streamed += out;
      EXPECT_EQ(answer.compare(0, streamed.size(), streamed), 0)
          << "only the answer's text, in order";
    }
    const ParsedAnswer rest = filter.finish();
    EXPECT_EQ(streamed + rest.content, "Sure <tool <b>.\n");
    ASSERT_EQ(rest.calls.size(), 1u);
    EXPECT_EQ(rest.calls[0].arguments, R"({"a": "<tool_call>"})");
  }
  // Not a call after all: everything is content, in order.
  ToolCallFilter filter(ToolCallFormat::Hermes, "c");
  std::string streamed = filter.push("a <tool_");
  streamed += filter.push("call>{oops");
  const ParsedAnswer rest = filter.finish();
  EXPECT_TRUE(rest.calls.empty());
  EXPECT_EQ(streamed + rest.content, "a <tool_call>{oops");

  ToolCallFilter llama(ToolCallFormat::Llama3Json, "c");
  EXPECT_EQ(llama.push("{\"name\": \"f\", "), "");
  EXPECT_EQ(llama.push("\"parameters\": {}}"), "");
  EXPECT_EQ(llama.finish().calls.size(), 1u);
  ToolCallFilter prose(ToolCallFormat::Llama3Json, "c");
  EXPECT_EQ(prose.push("Hello {"), "Hello {");
  EXPECT_EQ(prose.push("x"), "x");
  EXPECT_TRUE(prose.finish().calls.empty());
}

TEST(ToolCalls, MistralsTemplatesWriteTheirCallsAfterToolCallsTokens) {
  for (const char* name :
       {"mistralai-Mistral-Nemo-Instruct-2407.jinja", "Mistral-Small-3.2-24B-Instruct-2506.jinja"})
    EXPECT_EQ(detect_tool_call_format(test::read_file(test::data_path("chat_templates") / name)),
              ToolCallFormat::Mistral)
        << name;
  EXPECT_EQ(control_markers(ToolCallFormat::Mistral).size(), 3u);
  EXPECT_TRUE(control_markers(ToolCallFormat::Hermes).empty());
}

bool is_mistral_id(const std::string& id) {
  return id.size() == 9 &&
         std::all_of(id.begin(), id.end(), [](unsigned char c) { return std::isalnum(c) != 0; });
}

// Before Mistral's v11 tokenizers (7B v0.3, Nemo): "[TOOL_CALLS]" and one JSON
// array of {"name", "arguments"}, as vLLM's mistral parser reads it.
TEST(ToolCalls, MistralCallsBeforeV11AreOneJsonArray) {
  const ParsedAnswer a = parse_tool_calls(
      ToolCallFormat::Mistral,
      "Let me see. [TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Zürich\"}, \"id\": \"abcDEF123\"}, {\"name\": \"now\"}, {\"name\": \"s\", "
      "\"arguments\": \"{\\\"q\\\": 1}\"}]</s>",
      "chatcmpl-tool-x-0-");
  EXPECT_EQ(a.content, "Let me see. ");
  ASSERT_EQ(a.calls.size(), 3u);
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_EQ(a.calls[0].arguments, R"({"city": "Zürich"})");
  EXPECT_EQ(a.calls[1].arguments, "{}");           // left out: none
  EXPECT_EQ(a.calls[2].arguments, R"({"q": 1})");  // a JSON text of an object: the object
  for (const ToolCall& c : a.calls) EXPECT_TRUE(is_mistral_id(c.id)) << c.id;
  EXPECT_NE(a.calls[0].id, a.calls[1].id);
  EXPECT_NE(a.calls[1].id, a.calls[2].id);
  // The same answer's ids again; another answer's differ.
  const ParsedAnswer again = parse_tool_calls(
      ToolCallFormat::Mistral, "[TOOL_CALLS][{\"name\": \"f\"}]", "chatcmpl-tool-x-0-");
  EXPECT_EQ(again.calls.at(0).id, a.calls[0].id);
  const ParsedAnswer other = parse_tool_calls(
      ToolCallFormat::Mistral, "[TOOL_CALLS][{\"name\": \"f\"}]", "chatcmpl-tool-y-0-");
  EXPECT_NE(other.calls.at(0).id, a.calls[0].id);
  // A lone object is one call.
  const ParsedAnswer lone = parse_tool_calls(
      ToolCallFormat::Mistral, "[TOOL_CALLS] {\"name\": \"f\", \"arguments\": {\"x\": [1]}}", "c");
  ASSERT_EQ(lone.calls.size(), 1u);
  EXPECT_EQ(lone.calls[0].arguments, R"({"x": [1]})");
  EXPECT_EQ(lone.content, "");
}

// From v11 (Small 3.x, Devstral): "[TOOL_CALLS]name[ARGS]{...}" per call, with
// "[CALL_ID]id" where the template writes it.
TEST(ToolCalls, MistralCallsFromV11AreNameThenArguments) {
  const ParsedAnswer a =
      parse_tool_calls(ToolCallFormat::Mistral,
                       "Two calls.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"[TOOL_CALLS] Paris\"}"
                       "[TOOL_CALLS]add[CALL_ID]a1b2c3d4e[ARGS]{\"a\": 1, \"b\": {\"c\": 2}} "
                       "[TOOL_CALLS]plain{}",
                       "c");
  EXPECT_EQ(a.content, "Two calls.");
  ASSERT_EQ(a.calls.size(), 3u);
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_EQ(a.calls[0].arguments, R"({"city": "[TOOL_CALLS] Paris"})");
  EXPECT_EQ(a.calls[1].name, "add");
  EXPECT_EQ(a.calls[1].arguments, R"({"a": 1, "b": {"c": 2}})");
  EXPECT_EQ(a.calls[2].name, "plain");
  EXPECT_EQ(a.calls[2].arguments, "{}");
  // Malformed: the whole text stays content.
  for (const char* bad :
       {"[TOOL_CALLS]f[ARGS]{\"a\": ", "[TOOL_CALLS][{\"name\": \"f\"", "[TOOL_CALLS]f",
        "[TOOL_CALLS][ARGS]{}", "[TOOL_CALLS]f[TOOL_CALLS]g{}", "[TOOL_CALLS][{\"arguments\": {}}]",
        "[TOOL_CALLS]f[ARGS]{\"a\" 1}", "no call"}) {
    const ParsedAnswer b = parse_tool_calls(ToolCallFormat::Mistral, bad, "c");
    EXPECT_TRUE(b.calls.empty()) << bad;
    EXPECT_EQ(b.content, bad);
  }
}

TEST(ToolCalls, TheStreamingFilterHoldsFromMistralsMarker) {
  const std::string answer = "Sure [TOOL [b].[TOOL_CALLS]f[ARGS]{\"a\": \"[TOOL_CALLS]\"}";
  for (size_t piece : {1u, 3u, 7u, 200u}) {
    SCOPED_TRACE(piece);
    ToolCallFilter filter(ToolCallFormat::Mistral, "c");
    std::string streamed;
    for (size_t at = 0; at < answer.size(); at += piece)
      streamed += filter.push(answer.substr(at, piece));
    const ParsedAnswer rest = filter.finish();
    EXPECT_EQ(streamed + rest.content, "Sure [TOOL [b].");
    ASSERT_EQ(rest.calls.size(), 1u);
    EXPECT_EQ(rest.calls[0].arguments, R"({"a": "[TOOL_CALLS]"})");
  }
}

TEST(ToolCalls, CallsAreOpenAIsShape) {
  const std::vector<ToolCall> calls = {{"c0", "f", "{}"}, {"c1", "g", R"({"x": 1})"}};
  EXPECT_EQ(tool_calls_json(calls, false).dump(),
            R"([{"function":{"arguments":"{}","name":"f"},"id":"c0","type":"function"},)"
            R"({"function":{"arguments":"{\"x\": 1}","name":"g"},"id":"c1","type":"function"}])");
  EXPECT_EQ(tool_calls_json(calls, true)[1]["index"], 1);
}

}  // namespace
}  // namespace troupe::openai
