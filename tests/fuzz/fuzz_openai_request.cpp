// The OpenAI request decoder: a POST /v1/completions body through
// parse_completion_request and resolve_prompts, with the fortune tokenizer and
// without one, as the server calls them. An accepted request then runs
// through a CompletionExchange (the stop strings and the streaming
// detokenizer are the request's to choose), with the prompt's own ids as the
// "generated" tokens, streamed and not. Oracles: no exception escapes; the
// streamed text equals the whole response's text; that text is a prefix of
// decode(ids), equal to it without stop strings, and holds no stop string.
// The same bytes as vLLM's /tokenize and /detokenize bodies: no exception
// escapes; an accepted body's tokens are within the vocabulary, counted, and
// what /detokenize takes back. And as a chat for a Jinja template that shows
// tools and tool calls: no exception escapes the chat parsers.
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "fuzz_support.h"
#include "net/completion_exchange.h"
#include "net/openai_api.h"
#include "net/sse_parser.h"
#include "serving_support.h"

namespace troupe::fuzz {
namespace {

using nlohmann::json;

// nlohmann's dump() refuses invalid UTF-8 by default.
bool valid_utf8(const std::string& s) {
  try {
    (void)json(s).dump();
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

// The text a client reads from one exchange: the response's choice, or the
// streamed chunks' texts concatenated.
std::string client_text(const ExchangeStep& last, const std::string& streamed) {
  if (last.response) {
    const json body = json::parse(last.response->body);
    return body.at("choices").at(0).at("text").get<std::string>();
  }
  std::string text;
  for (const std::string& data : sse_events(streamed)) {
    if (data == "[DONE]") continue;
    const json chunk = json::parse(data);
    if (chunk.contains("error")) violated("an exchange without errors streamed " + data);
    for (const json& c : chunk.at("choices")) text += c.at("text").get<std::string>();
  }
  return text;
}

// Feeds `ids` as the generated tokens and returns what the client reads.
std::string run_exchange(const openai::CompletionParams& params, const std::vector<int>& ids,
                         const Tokenizer* tok) {
  const auto now = CompletionExchange::Clock::now();
  CompletionExchange ex(1, params, {"cmpl-fuzz", 0, params.model}, int(ids.size()), tok, now);
  std::string streamed;
  ExchangeStep step;
  for (int id : ids) {
    step = ex.on_token(id, nullptr, now);
    streamed += step.events;
    if (ex.finished()) break;
  }
  if (!ex.finished()) {
    step = ex.on_done(FinishReason::Length, int(ids.size()), now);
    streamed += step.events;
  }
  if (!ex.finished() || !step.finished || step.finished->status != 200)
    violated("an exchange fed valid tokens did not end with 200");
  return client_text(step, streamed);
}

void check_exchange(const openai::CompletionParams& params, const std::vector<int>& prompt) {
  const Tokenizer& tok = fortune_tokenizer();
  std::vector<int> ids(prompt.begin(),
                       prompt.begin() + std::min<size_t>(prompt.size(), size_t(params.max_tokens)));
  const std::string full = tok.decode(ids);
  openai::CompletionParams streamed = params, whole = params;
  streamed.stream = true;
  whole.stream = false;
  const std::string a = run_exchange(streamed, ids, &tok);
  const std::string b = run_exchange(whole, ids, &tok);
  // Invalid UTF-8 in the model's text is replaced per JSON string, so the
  // text comparisons below only hold for valid text.
  if (!valid_utf8(full)) return;
  if (a != b) violated("streamed text '" + a + "' differs from the response's '" + b + "'");
  if (full.compare(0, b.size(), b) != 0)
    violated("response text '" + b + "' is not a prefix of the decoded tokens '" + full + "'");
  if (params.stop.empty() && b != full)
    violated("without stop strings the text '" + b + "' differs from decode(ids) '" + full + "'");
  for (const std::string& s : params.stop)
    if (b.find(s) != std::string::npos)
      violated("response text '" + b + "' holds the stop string '" + s + "'");
}

// A Jinja chat template that shows everything a chat may bring.
const ChatFormat& jinja_chat() {
  static const ChatFormat format = [] {
    ChatFormat f = openai::jinja_chat_format(
        "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}"
        "{% if m.tool_calls %}{{ m.tool_calls|tojson }}{% endif %}{{ m.tool_call_id }}"
        "{{ eos_token }}{% endfor %}{% if tools %}{{ tools|tojson(indent=2) }}{% endif %}"
        "{% if add_generation_prompt %}assistant:{% endif %}{{ enable_thinking }}",
        "<s>", "</s>");
    f.tool_calls = ToolCallFormat::Hermes;
    return f;
  }();
  return format;
}

void check_chat_parsers(std::string_view body, const openai::ModelLimits& limits) {
  (void)openai::parse_tokenize_request(body, limits, jinja_chat());
  const auto chat = openai::parse_chat_request(body, limits, jinja_chat());
  if (const auto* p = std::get_if<openai::CompletionParams>(&chat))
    if (!p->prompt_text) violated("a chat was accepted without a rendered prompt");
}

void check_tokenizer_calls(std::string_view body, const openai::ModelLimits& limits) {
  const Tokenizer& tok = fortune_tokenizer();
  const auto parsed = openai::parse_tokenize_request(body, limits, ChatTemplate::Plain);
  if (const auto* p = std::get_if<openai::TokenizeParams>(&parsed)) {
    const auto answer = openai::tokenize_response(*p, &tok, limits);
    if (const auto* j = std::get_if<json>(&answer)) {
      const std::vector<int> ids = j->at("tokens").get<std::vector<int>>();
      if (j->at("count").get<size_t>() != ids.size()) violated("/tokenize miscounted its tokens");
      for (int id : ids)
        if (id < 0 || id >= limits.vocab_size)
          violated("/tokenize gave an id outside the vocabulary");
      if (!std::holds_alternative<json>(openai::detokenize_response(ids, &tok)))
        violated("/detokenize refused what /tokenize gave");
    }
  }
  const auto ids = openai::parse_detokenize_request(body, limits);
  if (const auto* v = std::get_if<std::vector<int>>(&ids))
    if (!std::holds_alternative<json>(openai::detokenize_response(*v, &tok)))
      violated("/detokenize refused ids it accepted");
}

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  using namespace troupe::fuzz;
  static const openai::ModelLimits limits = fortune_limits();
  check_tokenizer_calls(as_text(data, size), limits);
  check_chat_parsers(as_text(data, size), limits);
  const auto parsed = openai::parse_completion_request(as_text(data, size), limits);
  const auto* params = std::get_if<openai::CompletionParams>(&parsed);
  if (!params) return 0;
  // Without a tokenizer (a server for token-id prompts only) ...
  openai::CompletionParams without = *params;
  (void)openai::resolve_prompts(without, nullptr, limits);
  // ... and with the model's (a batch's every prompt).
  openai::CompletionParams with = *params;
  const auto prompts = openai::resolve_prompts(with, &fortune_tokenizer(), limits);
  if (const auto* all = std::get_if<std::vector<std::vector<int>>>(&prompts))
    for (const std::vector<int>& ids : *all) check_exchange(with, ids);
  return 0;
}
