// `troupe serve` on a Hugging Face checkpoint whose tokenizer is only a
// tokenizer.json (as Llama 3, Qwen2 and SmolLM ship it): text prompts,
// /tokenize, streaming, and chats in the model's own Llama 3 template.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/serving_support.h"
#include "support/test_support.h"
#include "text/tokenizer.h"

namespace troupe {
namespace {

using test::json;

// Llama 3's chat template as Meta publishes it in tokenizer_config.json.
constexpr const char* kLlama3Template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
    "endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

// A random tiny Llama with 1600 rows of vocabulary (more than the
// tokenizer's 1506, as padded embeddings have), Llama 3.1's tokenizer cut to
// 1500 tokens, its template and its EOS tokens.
std::filesystem::path write_model(const test::TempDir& tmp) {
  const auto dir = tmp / "llama3-tiny";
  const auto r = test::run_command({test::troupe_binary(), "synth-model", "--preset", "tiny",
                                    "--vocab", "1600", "--context", "256", "--out", dir.string()},
                                   300);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  json config = json::parse(test::read_file(dir / "config.json"));
  config["eos_token_id"] = {1501, 1505};
  test::write_file(dir / "config.json", config.dump());
  test::write_file(dir / "tokenizer.json",
                   test::read_file(test::data_path("tokenizers/llama3_1-small.tokenizer.json")));
  test::write_file(dir / "tokenizer_config.json", json{{"chat_template", kLlama3Template},
                                                       {"bos_token", "<|begin_of_text|>"},
                                                       {"eos_token", "<|eot_id|>"}}
                                                      .dump());
  return dir;
}

json post(test::Server& s, const std::string& path, const json& body) {
  auto r = test::http_request(s.port(), "POST", path, body.dump());
  EXPECT_EQ(r.status, 200) << path << ": " << r.body;
  return r.status == 200 ? json::parse(r.body) : json();
}

TEST(ServeTokenizerJson, TextPromptsChatsAndStreamsThroughTheTokenizersFile) {
  test::TempDir tmp;
  const auto dir = write_model(tmp);
  const Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
  test::Server s({"model.path=" + dir.string()});

  // A text prompt is the tokenizer's ids after its BOS, as Hugging Face's
  // tokenizer(text) gives them.
  const std::string text = "The year 1984: don't PANIC, naïve café 😀!";
  const json counted = post(s, "/tokenize", {{"prompt", text}, {"return_token_strs", true}});
  EXPECT_EQ(counted["tokens"].get<std::vector<int>>(), tok.encode(text, true));
  EXPECT_EQ(counted["tokens"][0], 1500);
  EXPECT_EQ(counted["token_strs"][2], tok.piece(tok.encode(text, false)[1]));
  const json back = post(s, "/detokenize", {{"tokens", counted["tokens"]}});
  EXPECT_EQ(back["prompt"], text);

  // The completion's usage counts the same prompt; its streamed text, byte
  // tokens of split characters included, is the whole text.
  json body = {{"prompt", text},
               {"max_tokens", 40},
               {"temperature", 1.0},
               {"seed", 11},
               {"ignore_eos", true}};
  const json done = post(s, "/v1/completions", body);
  EXPECT_EQ(done["usage"]["prompt_tokens"], counted["count"]);
  body["stream"] = true;
  auto st = test::http_request(s.port(), "POST", "/v1/completions", body.dump());
  ASSERT_EQ(st.status, 200) << st.body;
  EXPECT_EQ(test::sse_text(st.body), done["choices"][0]["text"]);

  // A chat is the model's Llama 3 template with one BOS (the template
  // writes it; the tokenizer does not add another), and answers as the
  // completion of those ids does.
  const json messages = json::array(
      {{{"role", "system"}, {"content", "Be brief. "}}, {{"role", "user"}, {"content", "Hello"}}});
  const json rendered = post(s, "/tokenize", {{"messages", messages}});
  const std::string want =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(rendered["tokens"].get<std::vector<int>>(), tok.encode(want, false));
  EXPECT_EQ(rendered["tokens"][0], 1500);
  EXPECT_NE(rendered["tokens"][1], 1500);
  const json chat = post(s, "/v1/chat/completions",
                         {{"messages", messages}, {"max_tokens", 16}, {"temperature", 0}});
  const json same = post(s, "/v1/completions",
                         {{"prompt", rendered["tokens"]}, {"max_tokens", 16}, {"temperature", 0}});
  EXPECT_EQ(chat["choices"][0]["message"]["content"], same["choices"][0]["text"]);
  EXPECT_EQ(chat["usage"]["prompt_tokens"], rendered["count"]);
}

// Qwen2.5's template as published (the part a chat without tools takes).
constexpr const char* kQwen25Template =
    "{%- if messages[0]['role'] == 'system' %}\n    {{- '<|im_start|>system\\n' + "
    "messages[0]['content'] + '<|im_end|>\\n' }}\n{%- else %}\n    {{- "
    "'<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n{%- endif %}\n{%- for message in messages %}{{- "
    "'<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- "
    "endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

// A Qwen2 checkpoint (q/k/v biases) with Qwen's tokenizer (NFC, no BOS) and
// `chat_template` in its tokenizer_config.json.
std::filesystem::path write_qwen_model(const test::TempDir& tmp, const std::string& chat_template,
                                       int context = 256) {
  const auto dir = tmp / "qwen2-tiny";
  const auto r = test::run_command(
      {test::troupe_binary(), "synth-model", "--preset", "tiny", "--qkv-bias", "--vocab", "1536",
       "--context", std::to_string(context), "--out", dir.string()},
      300);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  json config = json::parse(test::read_file(dir / "config.json"));
  EXPECT_EQ(config["model_type"], "qwen2");
  config["eos_token_id"] = 1502;
  test::write_file(dir / "config.json", config.dump());
  test::write_file(dir / "tokenizer.json",
                   test::read_file(test::data_path("tokenizers/qwen-small.tokenizer.json")));
  test::write_file(dir / "tokenizer_config.json",
                   json{{"chat_template", chat_template}, {"eos_token", "<|im_end|>"}}.dump());
  return dir;
}

// Qwen2.5's ChatML template, whose default system message a chat without one
// gets.
TEST(ServeTokenizerJson, Qwen2WithItsChatTemplate) {
  test::TempDir tmp;
  const auto dir = write_qwen_model(tmp, kQwen25Template);
  const Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
  test::Server s({"model.path=" + dir.string()});

  const std::string decomposed = "cafe\xCC\x81";  // NFC makes it "café"
  const json counted = post(s, "/tokenize", {{"prompt", decomposed}});
  EXPECT_EQ(counted["tokens"].get<std::vector<int>>(), tok.encode("caf\xC3\xA9", false));
  const json messages = json::array({{{"role", "user"}, {"content", "Hello"}}});
  const json rendered = post(s, "/tokenize", {{"messages", messages}});
  EXPECT_EQ(rendered["tokens"].get<std::vector<int>>(),
            tok.encode("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
                       "helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                       "<|im_start|>assistant\n",
                       false));
  const json chat = post(s, "/v1/chat/completions",
                         {{"messages", messages}, {"max_tokens", 12}, {"temperature", 0}});
  const json same = post(s, "/v1/completions",
                         {{"prompt", rendered["tokens"]}, {"max_tokens", 12}, {"temperature", 0}});
  EXPECT_EQ(chat["choices"][0]["message"]["content"], same["choices"][0]["text"]);
}

// Qwen3's own template (tests/data/chat_templates), interpreted: its switches
// through chat_template_kwargs, continue_final_message, and what the template
// refuses is a 400 with the template's words.
TEST(ServeTokenizerJson, TheModelsOwnJinjaTemplateWithItsSwitches) {
  test::TempDir tmp;
  const auto dir = write_qwen_model(
      tmp, test::read_file(test::data_path("chat_templates/Qwen-Qwen3-0.6B.jinja")));
  const Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
  test::Server s({"model.path=" + dir.string()});
  const auto rendered = [&](json body) {
    return post(s, "/tokenize", body)["tokens"].get<std::vector<int>>();
  };
  const json hello = json::array({{{"role", "user"}, {"content", "Hello"}}});
  EXPECT_EQ(rendered({{"messages", hello}}),
            tok.encode("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", false));
  EXPECT_EQ(rendered({{"messages", hello}, {"chat_template_kwargs", {{"enable_thinking", false}}}}),
            tok.encode("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
                       "<think>\n\n</think>\n\n",
                       false));
  // Earlier reasoning is left out of the history, as Qwen3's template does.
  const json history =
      json::array({{{"role", "user"}, {"content", "2+2?"}},
                   {{"role", "assistant"}, {"content", "<think>\nadd\n</think>\n\nIt is 4."}},
                   {{"role", "user"}, {"content", "And 3+3?"}}});
  EXPECT_EQ(rendered({{"messages", history}}),
            tok.encode("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\nIt is 4."
                       "<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"
                       "<|im_start|>assistant\n",
                       false));
  // The answer begun by the client goes on from its last character (after
  // the empty reasoning block Qwen3's template gives the last answer).
  const json begun = json::array(
      {{{"role", "user"}, {"content", "Hello"}}, {{"role", "assistant"}, {"content", "Well,"}}});
  const std::vector<int> continued = tok.encode(
      "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
      "<think>\n\n</think>\n\nWell,",
      false);
  EXPECT_EQ(rendered({{"messages", begun}, {"continue_final_message", true}}), continued);
  const json chat = post(s, "/v1/chat/completions",
                         {{"messages", begun},
                          {"continue_final_message", true},
                          {"add_generation_prompt", false},
                          {"max_tokens", 6},
                          {"temperature", 0}});
  EXPECT_EQ(chat["usage"]["prompt_tokens"], continued.size());

  // Switches of the wrong kind or that contradict each other are 400s.
  for (const json& bad :
       {json{{"messages", hello}, {"chat_template_kwargs", "x"}},
        json{
            {"messages", hello}, {"continue_final_message", true}, {"add_generation_prompt", true}},
        json{{"messages", hello}, {"chat_template", "{{ 1 }}"}}}) {
    const auto r = test::http_request(s.port(), "POST", "/v1/chat/completions", bad.dump());
    EXPECT_EQ(r.status, 400) << bad.dump() << ": " << r.body;
  }
}

// Structured output from a reasoning model (server.reasoning_parser qwen3,
// Qwen3's template): "<think>" and "</think>" are tokens of their own; the
// reasoning is free and the reply after it follows the schema. A logit bias
// makes this random model open and close its reasoning as a real one would
// (and tempts it with them everywhere after).
TEST(ServeTokenizerJson, StructuredOutputShapesTheReplyAfterAQwen3Reasoning) {
  test::TempDir tmp;
  const auto dir = write_qwen_model(
      tmp, test::read_file(test::data_path("chat_templates/Qwen-Qwen3-0.6B.jinja")));
  const Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
  const std::vector<int> open = tok.encode("<think>", false), close = tok.encode("</think>", false);
  ASSERT_EQ(open.size(), 1u);
  ASSERT_EQ(close.size(), 1u);
  test::Server s({"model.path=" + dir.string(), "server.reasoning_parser=qwen3"});
  const json schema = {
      {"type", "object"},
      {"properties", {{"a", {{"type", "integer"}, {"minimum", 0}, {"maximum", 9}}}}},
      {"required", {"a"}}};
  json body = {{"messages", json::array({{{"role", "user"}, {"content", "Hello"}}})},
               {"max_tokens", 40},
               {"temperature", 0},
               {"logit_bias", {{std::to_string(open[0]), 50}, {std::to_string(close[0]), 100}}},
               {"response_format",
                {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", schema}}}}}};
  const json c = post(s, "/v1/chat/completions", body)["choices"][0];
  EXPECT_EQ(c["finish_reason"], "stop") << c;
  EXPECT_EQ(c["message"]["reasoning_content"], "") << c;
  const json reply = json::parse(c["message"]["content"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(reply.is_object()) << c;
  ASSERT_TRUE(reply["a"].is_number_integer()) << c;
  EXPECT_TRUE(reply["a"].get<int>() >= 0 && reply["a"].get<int>() <= 9) << c;
  // With enable_thinking false the template closes the reasoning in the
  // prompt: the whole answer is the reply and follows the schema.
  body.erase("logit_bias");
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  const json plain = post(s, "/v1/chat/completions", body)["choices"][0]["message"];
  EXPECT_TRUE(plain["reasoning_content"].is_null()) << plain;
  EXPECT_TRUE(json::parse(plain["content"].get<std::string>(), nullptr, false).is_object())
      << plain;
}

// Qwen2.5's whole template with tools, a tool call and its result: the
// prompt is transformers' render of it (tests/data/chat_templates), token for
// token, and a chat that offers tools is answered.
TEST(ServeTokenizerJson, ToolsAndToolCallsRenderAsTransformersRendersThem) {
  test::TempDir tmp;
  const std::string name = "Qwen-Qwen2.5-7B-Instruct";
  const auto dir = write_qwen_model(
      tmp, test::read_file(test::data_path("chat_templates/" + name + ".jinja")), 1024);
  const Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
  test::Server s({"model.path=" + dir.string()});
  // In the file's key order, which the template's tojson shows.
  using ordered = nlohmann::ordered_json;
  const ordered cases =
      ordered::parse(test::read_file(test::data_path("chat_templates/cases.json")));
  const json expected =
      json::parse(test::read_file(test::data_path("chat_templates/expected.json")))[name];
  int checked = 0;
  for (const ordered& c : cases) {
    const std::string id = c["name"];
    if (id != "tools" && id != "tool_call_empty_content" && id != "multi_nogen") continue;
    SCOPED_TRACE(id);
    ordered body = {{"messages", c["messages"]},
                    {"add_generation_prompt", c["add_generation_prompt"]}};
    if (c.contains("tools")) body["tools"] = c["tools"];
    const auto r = test::http_request(s.port(), "POST", "/tokenize", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["tokens"].get<std::vector<int>>(),
              tok.encode(expected["renders"][id].get<std::string>(), false));
    ++checked;
  }
  EXPECT_EQ(checked, 3);
  // A chat that offers tools (its prompt fits the small model's context).
  ordered chat = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
                  {"tools", {cases[6]["tools"][0]}},
                  {"max_tokens", 8},
                  {"temperature", 0}};
  const auto answered = test::http_request(s.port(), "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(answered.status, 200) << answered.body;
  const json choice = json::parse(answered.body)["choices"][0];
  EXPECT_TRUE(choice["message"].contains("tool_calls") || choice["message"]["content"].is_string())
      << answered.body;
  chat["stream"] = true;
  const auto streamed = test::http_request(s.port(), "POST", "/v1/chat/completions", chat.dump());
  EXPECT_EQ(streamed.status, 200) << streamed.body;
}

// A template the interpreter cannot take (an `include` here) still serves:
// rendered by the built-in template its markers say, with a warning.
TEST(ServeTokenizerJson, AnUninterpretableTemplateFallsBackToTheOneItIsRecognisedAs) {
  test::TempDir tmp;
  const auto dir = write_qwen_model(
      tmp, "{% include 'turns.jinja' %}{{ '<|im_start|>' + m.role + '<|im_end|>' }}");
  const Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
  test::Server s({"model.path=" + dir.string()});
  const json hello = json::array({{{"role", "user"}, {"content", "Hello"}}});
  EXPECT_EQ(post(s, "/tokenize", {{"messages", hello}})["tokens"].get<std::vector<int>>(),
            tok.encode("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", false));
}

// --chat-template FILE renders instead of the model's own; a file that does
// not parse stops start-up naming the file and the line.
TEST(ServeTokenizerJson, AChatTemplateFileReplacesTheModels) {
  test::TempDir tmp;
  const auto dir = write_qwen_model(tmp, kQwen25Template);
  const Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
  test::write_file(tmp / "mine.jinja",
                   "{% if messages[0].role == 'system' %}"
                   "{{ raise_exception('System role not supported') }}{% endif %}\n"
                   "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                   "{% if add_generation_prompt %}[assistant]{% endif %}\n");
  {
    test::Server s({"model.path=" + dir.string(),
                    "server.chat_template_file=" + (tmp / "mine.jinja").string()});
    const json hello = json::array({{{"role", "user"}, {"content", "Hello"}}});
    EXPECT_EQ(post(s, "/tokenize", {{"messages", hello}})["tokens"].get<std::vector<int>>(),
              tok.encode("[user] Hello\n[assistant]", false));
    // What the template refuses is a 400 in the template's words.
    const auto refused = test::http_request(
        s.port(), "POST", "/v1/chat/completions",
        json{{"messages", json::array({{{"role", "system"}, {"content", "x"}}})}, {"max_tokens", 4}}
            .dump());
    EXPECT_EQ(refused.status, 400) << refused.body;
    EXPECT_NE(
        refused.body.find("The model's chat template refused this chat: System role not supported"),
        std::string::npos)
        << refused.body;
  }
  test::write_file(tmp / "broken.jinja", "line one\n{% if messages %}never closed");
  const auto r =
      test::run_command({test::troupe_binary(), "serve", "-m", dir.string(), "--chat-template",
                         (tmp / "broken.jinja").string(), "--port", "0"},
                        60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("broken.jinja"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("line 2: the template ended inside a block: expected {% endif %}"),
            std::string::npos)
      << r.err;
}

TEST(ServeTokenizerJson, ATokenizerLargerThanTheModelIsRefused) {
  test::TempDir tmp;
  const auto dir = tmp / "small-vocab";
  const auto r = test::run_command(
      {test::troupe_binary(), "synth-model", "--preset", "tiny", "--out", dir.string()}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  test::write_file(dir / "tokenizer.json",
                   test::read_file(test::data_path("tokenizers/gpt2-small.tokenizer.json")));
  const auto refused = test::serve_until_exit({"model.path=" + dir.string()});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.stderr_text.find("1501 tokens but the model only 300"), std::string::npos)
      << refused.stderr_text;
}

}  // namespace
}  // namespace troupe
