#include "net/openai_api.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "net/request_fields.h"
#include "text/tokenizer.h"

namespace troupe::openai {

using nlohmann::json;

namespace {

// A model this server does not serve: 404, as OpenAI answers it.
ApiError model_not_found(std::string_view id) {
  ApiError e = bad_request("The model `" + std::string(id) + "` does not exist.", "model",
                           "model_not_found");
  e.status = 404;
  return e;
}

// The shortest text that reads back as v, so that a refused 2.0000000001
// is not shown as the valid 2.
std::string show(double v) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::string("?");
}

// Integers as JSON integers or as floats with no fraction (16.0), as
// pydantic-based servers accept them.
// (An unsigned one first: nlohmann's is_number_integer() holds for those
// too, and get<int64_t>() would wrap 2^63 .. 2^64-1 to negative numbers.)
bool as_int64(const json& v, int64_t& out) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return false;
    out = int64_t(u);
    return true;
  }
  if (v.is_number_integer()) {
    out = v.get<int64_t>();
    return true;
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && std::trunc(d) == d && std::fabs(d) < 9.2e18) {
      out = int64_t(d);
      return true;
    }
  }
  return false;
}

int64_t get_int(const json& v, std::string_view name) {
  int64_t out = 0;
  if (as_int64(v, out)) return out;
  if (v.is_number_unsigned())
    fail(openai::quoted(name) + " is out of range, got " + v.dump() + ".", std::string(name));
  wrong_type(name, "an integer", v);
}

int get_int32(const json& v, std::string_view name) {
  int64_t out = get_int(v, name);
  if (out < std::numeric_limits<int>::min() || out > std::numeric_limits<int>::max())
    fail(openai::quoted(name) + " is out of range, got " + std::to_string(out) + ".",
         std::string(name));
  return int(out);
}

// Token ids, each within the vocabulary.
// `at` names the array in messages: "`prompt`" or, in a batch of one, "`prompt`[0]".
void parse_prompt_ids(const json& ids, const ModelLimits& limits, std::vector<int>& out,
                      const std::string& at = "`prompt`") {
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const json& e = ids[i];
    int64_t id = 0;
    const bool converted = e.is_number() && as_int64(e, id);
    const bool huge = !converted && e.is_number_unsigned();  // past int64
    if (!converted && !huge)
      fail(
          "`prompt` must be a string, an array of token ids, or an array of strings or of "
          "arrays of token ids; " +
              at + "[" + std::to_string(i) + "] is " + e.type_name() + ".",
          "prompt");
    if (huge || id < 0 || id >= limits.vocab_size)
      fail("Token id " + (huge ? e.dump() : std::to_string(id)) + " at " + at + "[" +
               std::to_string(i) + "] is outside the vocabulary (valid ids: 0.." +
               std::to_string(limits.vocab_size - 1) + ").",
           "prompt");
    out.push_back(int(id));
  }
}

void parse_prompt(const json& body, const ModelLimits& limits, CompletionParams& p) {
  const json* v = field(body, "prompt");
  if (!v) fail("`prompt` is required.", "prompt");
  if (v->is_string()) {
    p.prompt_text = v->get<std::string>();
    return;
  }
  if (!v->is_array()) wrong_type("prompt", "a string or an array of token ids", *v);
  if (v->empty()) fail("`prompt` must not be empty.", "prompt");
  // OpenAI's batches of one: ["text"] and [[1, 2, 3]].
  if (v->size() == 1 && (*v)[0].is_string()) {
    p.prompt_text = (*v)[0].get<std::string>();
    return;
  }
  if (v->size() == 1 && (*v)[0].is_array()) {
    if ((*v)[0].empty()) fail("`prompt` must not be empty.", "prompt");
    return parse_prompt_ids((*v)[0], limits, p.prompt_ids, "`prompt`[0]");
  }
  bool all_strings = true, all_arrays = true;
  for (const json& e : *v) {
    all_strings = all_strings && e.is_string();
    all_arrays = all_arrays && e.is_array();
  }
  if (!all_strings && !all_arrays) {
    // A batch (its first element a text or an array) that changes shape
    // names the element that does, not the first.
    const json& first = (*v)[0];
    if (first.is_string() || first.is_array())
      for (size_t i = 1; i < v->size(); ++i)
        if ((*v)[i].is_string() != first.is_string() || (*v)[i].is_array() != first.is_array())
          fail(
              "A batch of prompts holds only strings or only arrays of token ids; `prompt`[0] "
              "is " +
                  std::string(first.type_name()) + " and `prompt`[" + std::to_string(i) + "] is " +
                  (*v)[i].type_name() + ".",
              "prompt");
    return parse_prompt_ids(*v, limits, p.prompt_ids);
  }
  if (v->size() > size_t(kMaxBatchPrompts))
    fail("A batch may hold at most " + std::to_string(kMaxBatchPrompts) + " prompts; got " +
             std::to_string(v->size()) + ".",
         "prompt");
  for (size_t i = 0; i < v->size(); ++i) {
    const json& e = (*v)[i];
    const std::string at = "`prompt`[" + std::to_string(i) + "]";
    CompletionParams::Prompt one;
    if (e.is_string()) {
      one.text = e.get<std::string>();
    } else {
      if (e.empty()) fail(at + " must not be empty.", "prompt");
      parse_prompt_ids(e, limits, one.ids, at);
    }
    p.batch.push_back(std::move(one));
  }
}

void parse_stop(const json& body, CompletionParams& p) {
  const json* v = field(body, "stop");
  if (!v) return;
  // Empty stop strings would end every completion at once; they are dropped
  // (clients send "" to mean "no stop string").
  if (v->is_string()) {
    if (!v->get_ref<const std::string&>().empty()) p.stop.push_back(v->get<std::string>());
    return;
  }
  if (!v->is_array()) wrong_type("stop", "a string or an array of strings", *v);
  // OpenAI takes 4, vLLM any number: clients written for vLLM (lm-eval's
  // tasks) send more.
  if (v->size() > size_t(kMaxStopStrings))
    fail("`stop` may hold at most " + std::to_string(kMaxStopStrings) + " strings, got " +
             std::to_string(v->size()) + ".",
         "stop");
  for (const json& e : *v) {
    if (!e.is_string()) wrong_type("stop", "a string or an array of strings", e);
    if (!e.get_ref<const std::string&>().empty()) p.stop.push_back(e.get<std::string>());
  }
}

// vLLM's options on the prompt's and the stop string's place in the text.
void parse_vllm_text_options(const json& body, CompletionParams& p) {
  if (const json* v = field(body, "include_stop_str_in_output"))
    p.include_stop_str_in_output = get_bool(*v, "include_stop_str_in_output");
  if (const json* v = field(body, "truncate_prompt_tokens")) {
    const int64_t k = get_int(*v, "truncate_prompt_tokens");
    if (k < 1)
      fail(
          "`truncate_prompt_tokens` must be at least 1 (null: off), got " + std::to_string(k) + ".",
          "truncate_prompt_tokens");
    p.truncate_prompt_tokens = int(std::min<int64_t>(k, std::numeric_limits<int>::max()));
  }
}

void parse_sampling(const json& body, CompletionParams& p) {
  if (const json* v = field(body, "temperature")) {
    double t = get_number(*v, "temperature");
    if (!(t >= 0 && t <= 2))
      fail("`temperature` must be between 0 and 2, got " + show(t) + ".", "temperature");
    p.temperature = float(t);
  }
  if (const json* v = field(body, "top_p")) {
    double t = get_number(*v, "top_p");
    if (!(t > 0 && t <= 1)) fail("`top_p` must be in (0, 1], got " + show(t) + ".", "top_p");
    // A positive value below float's range still means "the top token".
    p.top_p = std::max(float(t), std::numeric_limits<float>::min());
  }
  if (const json* v = field(body, "top_k")) {
    int k = get_int32(*v, "top_k");
    // -1 is vLLM's spelling of "off".
    if (k < -1)
      fail("`top_k` must be >= 0 (0 or -1: off), got " + std::to_string(k) + ".", "top_k");
    p.top_k = k < 0 ? 0 : k;
  }
  if (const json* v = field(body, "seed")) {
    if (v->is_number_unsigned()) {
      p.seed = v->get<uint64_t>();
    } else {
      // Negative seeds are valid integers; their two's complement is the seed.
      p.seed = uint64_t(get_int(*v, "seed"));
    }
  }
}

// OpenAI's penalties and logit bias, and vLLM's repetition penalty.
void parse_penalties(const json& body, const ModelLimits& limits, CompletionParams& p) {
  for (auto [name, dst] : {std::pair{"presence_penalty", &p.presence_penalty},
                           std::pair{"frequency_penalty", &p.frequency_penalty}}) {
    if (const json* v = field(body, name)) {
      const double x = get_number(*v, name);
      if (!(x >= -2 && x <= 2))
        fail(openai::quoted(name) + " must be between -2 and 2, got " + show(x) + ".", name);
      *dst = float(x);
    }
  }
  if (const json* v = field(body, "repetition_penalty")) {
    const double x = get_number(*v, "repetition_penalty");
    // Checked as the float the sampler gets: 1e-46 is 0 there.
    if (!(x > 0 && x <= 2 && float(x) > 0))
      fail("`repetition_penalty` must be in (0, 2] (1: off), got " + show(x) + ".",
           "repetition_penalty");
    p.repetition_penalty = float(x);
  }
  const json* v = field(body, "logit_bias");
  if (!v) return;
  if (!v->is_object()) wrong_type("logit_bias", "an object", *v);
  if (v->size() > size_t(kMaxLogitBias))
    fail("`logit_bias` may hold at most " + std::to_string(kMaxLogitBias) + " entries, got " +
             std::to_string(v->size()) + ".",
         "logit_bias");
  for (const auto& [key, value] : v->items()) {
    const std::string at = "`logit_bias`[\"" + key + "\"]";
    // Keys are token ids written as decimal strings, as OpenAI's are.
    int64_t id = -1;
    const size_t digits = key.find_first_not_of('0');  // leading zeros aside
    if (!key.empty() &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }))
      id = digits == std::string::npos ? 0
           : key.size() - digits <= 10 ? std::stoll(key.substr(digits))
                                       : std::numeric_limits<int64_t>::max();
    if (id < 0 || (limits.vocab_size > 0 && id >= limits.vocab_size))
      fail(at + ": the key must be a token id in the vocabulary" +
               (limits.vocab_size > 0
                    ? " (valid ids: 0.." + std::to_string(limits.vocab_size - 1) + ")"
                    : std::string()) +
               ".",
           "logit_bias");
    if (!value.is_number())
      fail(at + " must be a number, got " + std::string(value.type_name()) + ".", "logit_bias");
    const double b = value.get<double>();
    if (!(b >= -100 && b <= 100))
      fail(at + " must be between -100 and 100, got " + show(b) + ".", "logit_bias");
    p.logit_bias.emplace_back(int(id), float(b));
  }
  std::sort(p.logit_bias.begin(), p.logit_bias.end());
  for (size_t i = 1; i < p.logit_bias.size(); ++i)
    if (p.logit_bias[i].first == p.logit_bias[i - 1].first)
      fail("`logit_bias` names token id " + std::to_string(p.logit_bias[i].first) + " twice.",
           "logit_bias");
}

// A set of token ids (`name`: an array of them, null or absent: none),
// ascending: repeats say nothing more.
void parse_id_set(const json& body, const char* name, int most, const ModelLimits& limits,
                  std::vector<int>& out) {
  const json* v = field(body, name);
  if (!v || v->is_null()) return;
  if (!v->is_array()) wrong_type(name, "an array of token ids", *v);
  if (v->size() > size_t(most))
    fail(openai::quoted(name) + " may hold at most " + std::to_string(most) + " ids, got " +
             std::to_string(v->size()) + ".",
         name);
  for (const json& e : *v) {
    const int64_t id = get_int(e, name);
    if (id < 0 || (limits.vocab_size > 0 && id >= limits.vocab_size))
      fail(openai::quoted(name) + ": " + std::to_string(id) +
               " is not a token id in the vocabulary" +
               (limits.vocab_size > 0
                    ? " (valid ids: 0.." + std::to_string(limits.vocab_size - 1) + ")"
                    : std::string()) +
               ".",
           name);
    out.push_back(int(id));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
}

// vLLM's min_p, min_tokens, stop_token_ids, allowed_token_ids and bad_words
// (after max_tokens is known).
void parse_vllm_sampling(const json& body, const ModelLimits& limits, CompletionParams& p) {
  if (const json* v = field(body, "min_p")) {
    const double x = get_number(*v, "min_p");
    if (!(x >= 0 && x <= 1))
      fail("`min_p` must be in [0, 1] (0: off), got " + show(x) + ".", "min_p");
    p.min_p = float(x);
  }
  if (const json* v = field(body, "min_tokens")) {
    const int64_t m = get_int(*v, "min_tokens");
    if (m < 0) fail("`min_tokens` must be >= 0, got " + std::to_string(m) + ".", "min_tokens");
    if (!p.max_tokens_from_context && m > p.max_tokens)
      fail("`min_tokens` (" + std::to_string(m) + ") must be at most `max_tokens` (" +
               std::to_string(p.max_tokens) + ").",
           "min_tokens");
    p.min_tokens = int(std::min<int64_t>(m, std::numeric_limits<int>::max()));
  }
  parse_id_set(body, "stop_token_ids", kMaxStopTokenIds, limits, p.stop_token_ids);
  parse_id_set(body, "allowed_token_ids", kMaxAllowedTokenIds, limits, p.allowed_token_ids);
  // An empty list would leave no token to sample (vLLM refuses it too).
  if (const json* v = field(body, "allowed_token_ids"); v && v->is_array() && v->empty())
    fail("`allowed_token_ids` must not be empty: it would leave no token to sample.",
         "allowed_token_ids");
  const json* v = field(body, "bad_words");
  if (!v || v->is_null()) return;
  if (!v->is_array()) wrong_type("bad_words", "an array of strings", *v);
  if (v->size() > size_t(kMaxBadWords))
    fail("`bad_words` may hold at most " + std::to_string(kMaxBadWords) + " words, got " +
             std::to_string(v->size()) + ".",
         "bad_words");
  for (const json& e : *v) {
    if (!e.is_string()) wrong_type("bad_words", "an array of strings", e);
    p.bad_words_text.push_back(e.get<std::string>());
  }
}

void reject_unsupported(const json& body, Api api) {
  if (const json* v = field(body, "best_of")) {
    if (get_int(*v, "best_of") != 1) unsupported("best_of", "only best_of=1 is accepted");
  }
  if (const json* v = field(body, "suffix")) {
    if (!get_string(*v, "suffix").empty()) unsupported("suffix");
  }
  if (const json* v = field(body, "user")) get_string(*v, "user");
  // vLLM's own sampling options: a client that sets them expects them
  // honoured, so they are refused rather than ignored as unknown fields
  // are. Their neutral values pass.
  auto is_neutral = [](const json& v, const json& neutral) {
    return v.is_number() && neutral.is_number() ? v.get<double>() == neutral.get<double>()
                                                : v == neutral;
  };
  struct VllmOption {
    const char* name;
    json neutral;
    const char* instead;
  };
  static const VllmOption options[] = {
      {"use_beam_search", false, nullptr},
      {"length_penalty", 1, nullptr},
      {"prompt_logprobs", nullptr, "`echo` with `logprobs` on /v1/completions"},
      {"guided_whitespace_pattern", nullptr, nullptr},
      // Special tokens never reach the text here (as vLLM's defaults).
      {"skip_special_tokens", true, nullptr},
      {"spaces_between_special_tokens", true, nullptr},
  };
  for (const VllmOption& o : options) {
    const json* v = field(body, o.name);
    if (!v || is_neutral(*v, o.neutral)) continue;
    unsupported(o.name, std::string("a vLLM option this server does not implement") +
                            (o.instead ? std::string("; use ") + o.instead + " instead" : ""));
  }
  // Tools are a chat's (parse_tools); a client that sends them to
  // /v1/completions expects them honoured just the same.
  if (!is_chat(api)) {
    for (const char* name : {"tools", "functions"}) {
      if (const json* v = field(body, name)) {
        if (!v->is_array()) wrong_type(name, "an array", *v);
        if (!v->empty()) unsupported(name, "tools are offered in a chat (/v1/chat/completions)");
      }
    }
    if (const json* v = field(body, "tool_choice")) {
      if (!v->is_string() || (*v != "none" && *v != "auto"))
        unsupported("tool_choice", "only \"none\" and \"auto\" (with no tools) are accepted");
    }
  }
}

void parse_streaming(const json& body, CompletionParams& p) {
  if (const json* v = field(body, "stream")) p.stream = get_bool(*v, "stream");
  if (const json* v = field(body, "stream_options")) {
    if (!v->is_object()) wrong_type("stream_options", "an object", *v);
    if (!p.stream)
      fail("`stream_options` is only allowed when `stream` is true.", "stream_options");
    if (const json* u = field(*v, "include_usage"))
      p.include_usage = get_bool(*u, "stream_options.include_usage");
    // As vLLM: without include_usage it is ignored.
    if (const json* u = field(*v, "continuous_usage_stats"))
      p.continuous_usage = get_bool(*u, "stream_options.continuous_usage_stats") && p.include_usage;
  }
}

// The body as a JSON object.
// Absent: the served model. Another name is a 404, as OpenAI answers it.
std::string parse_model(const json& body, const ModelLimits& limits) {
  const json* v = field(body, "model");
  if (!v) return limits.name;
  const std::string& model = get_string(*v, "model");
  if (model != limits.name) throw Invalid{model_not_found(model)};
  return model;
}

// `max_tokens` (or a chat's `max_completion_tokens`, `name`) against the cap.
int checked_max_tokens(const json& v, const std::string& name, const ModelLimits& limits) {
  int64_t m = get_int(v, name);
  if (m < 1)
    fail(openai::quoted(name) + " must be at least 1, got " + std::to_string(m) + ".", name);
  if (limits.max_tokens_cap > 0 && m > limits.max_tokens_cap)
    fail(openai::quoted(name) + " is " + std::to_string(m) + ", but this server allows at most " +
             std::to_string(limits.max_tokens_cap) + " tokens per completion.",
         name);
  if (m > std::numeric_limits<int>::max())
    fail(openai::quoted(name) + " is out of range, got " + std::to_string(m) + ".", name);
  return int(m);
}

// How many likeliest alternatives to report per token: 0 .. kMaxLogprobs.
int checked_logprobs(const json& v, const char* name) {
  const int64_t k = get_int(v, name);
  if (k < 0 || k > kMaxLogprobs)
    fail(openai::quoted(name) + " must be between 0 and " + std::to_string(kMaxLogprobs) +
             ", got " + std::to_string(k) + ".",
         name);
  return int(k);
}

// A grammar given as GBNF, checked: it parses and a matcher can start on it.
std::string checked_grammar(std::string text, const std::string& param) {
  if (const std::string problem = grammar::grammar_problem(text); !problem.empty())
    fail("`" + param + "`: " + problem + ".", param);
  if (text.size() > kMaxGrammarBytes)
    fail("`" + param + "` makes a grammar of " + std::to_string(text.size()) + " bytes; at most " +
             std::to_string(kMaxGrammarBytes) + " are accepted.",
         param);
  return text;
}

// The grammar of a JSON schema, with the schema's own errors as 400s naming
// where in the request they are.
std::string schema_grammar(const nlohmann::ordered_json& schema, const std::string& param) {
  try {
    return checked_grammar(grammar::json_schema_grammar(schema), param);
  } catch (const grammar::SchemaError& e) {
    fail(std::string("`") + param + "`: " + e.what() + ".", param, "unsupported_parameter");
  }
}

// A schema sent as an object, or (vLLM's guided_json) as a JSON text.
nlohmann::ordered_json schema_value(const json& v, nlohmann::ordered_json ordered,
                                    const std::string& param) {
  if (v.is_string()) {
    auto parsed = nlohmann::ordered_json::parse(v.get<std::string>(), nullptr, false);
    if (parsed.is_discarded())
      fail("`" + param + "` is not a JSON schema (nor its JSON text).", param);
    return parsed;
  }
  if (!v.is_object() && !v.is_boolean()) wrong_type(param, "a JSON schema (an object)", v);
  return ordered;
}

// Structured output, as OpenAI's response_format and vLLM's guided_json,
// guided_choice, guided_regex, guided_grammar and structured_outputs ask for it: at most
// one of them, turned into the grammar the answer follows.
void parse_structured_output(const json& j, std::string_view body, const ModelLimits& limits,
                             CompletionParams& p) {
  OrderedBody ordered(body);
  std::vector<std::pair<std::string, std::string>> asked;  // (param, grammar)
  if (const json* v = field(j, "response_format")) {
    if (!v->is_object()) wrong_type("response_format", "an object", *v);
    const json* type = field(*v, "type");
    if (!type) fail("`response_format.type` is required.", "response_format.type");
    const std::string& kind = get_string(*type, "response_format.type");
    if (kind == "json_object") {
      asked.emplace_back("response_format", grammar::json_object_grammar());
    } else if (kind == "json_schema") {
      const json* spec = field(*v, "json_schema");
      if (!spec) fail("`response_format.json_schema` is required.", "response_format.json_schema");
      if (!spec->is_object())
        wrong_type("response_format.json_schema", "an object {name, schema, strict}", *spec);
      const json* schema = field(*spec, "schema");
      if (!schema)
        fail("`response_format.json_schema.schema` is required.",
             "response_format.json_schema.schema");
      const std::string param = "response_format.json_schema.schema";
      asked.emplace_back(
          "response_format",
          schema_grammar(
              schema_value(*schema, ordered.at(*schema, "response_format", "json_schema", "schema"),
                           param),
              param));
    } else if (kind != "text") {
      fail("`response_format.type` must be \"text\", \"json_object\" or \"json_schema\"; got \"" +
               kind + "\".",
           "response_format.type");
    }
  }
  // vLLM's guided_* and their newer spelling, structured_outputs.{json, ...}.
  const json* so = field(j, "structured_outputs");
  if (so && !so->is_object()) wrong_type("structured_outputs", "an object", *so);
  auto option = [&](const char* guided, const char* inner) -> std::pair<const json*, std::string> {
    if (const json* v = field(j, guided)) return {v, guided};
    if (so)
      if (const json* v = field(*so, inner)) return {v, std::string("structured_outputs.") + inner};
    return {nullptr, ""};
  };
  if (auto [v, param] = option("guided_json", "json"); v) {
    const nlohmann::ordered_json given = param == "guided_json"
                                             ? ordered.at(*v, "guided_json")
                                             : ordered.at(*v, "structured_outputs", "json");
    asked.emplace_back(param, schema_grammar(schema_value(*v, given, param), param));
  }
  if (auto [v, param] = option("guided_choice", "choice"); v) {
    if (!v->is_array() || v->empty()) wrong_type(param, "a non-empty array of strings", *v);
    std::vector<std::string> choices;
    for (const json& c : *v) {
      if (!c.is_string()) wrong_type(param, "a non-empty array of strings", *v);
      choices.push_back(c.get<std::string>());
    }
    asked.emplace_back(param, checked_grammar(grammar::choice_grammar(choices), param));
  }
  if (auto [v, param] = option("guided_grammar", "grammar"); v)
    asked.emplace_back(param, checked_grammar(get_string(*v, param), param));
  if (auto [v, param] = option("guided_regex", "regex"); v) {
    std::string g;
    try {
      g = "root ::= " + grammar::regex_to_gbnf(get_string(*v, param)) + "\n";
    } catch (const grammar::GrammarError& e) {
      fail("`" + param + "`: " + e.what() + ".", param, "unsupported_parameter");
    }
    asked.emplace_back(param, checked_grammar(std::move(g), param));
  }
  if (so) {
    if (const json* v = field(*so, "json_object");
        v && get_bool(*v, "structured_outputs.json_object"))
      asked.emplace_back("structured_outputs.json_object", grammar::json_object_grammar());
  }
  if (asked.empty()) return;
  if (asked.size() > 1)
    fail("Only one kind of structured output may be asked for at once; got `" + asked[0].first +
             "` and `" + asked[1].first + "`.",
         asked[1].first);
  if (!limits.structured_output_refusal.empty())
    unsupported(asked[0].first, limits.structured_output_refusal);
  p.grammar = std::move(asked[0].second);
}

// What both endpoints take alike: sampling, stop strings, streaming, the
// options refused on both, and the extensions.
void parse_generation_options(const json& j, const ModelLimits& limits, CompletionParams& p) {
  parse_sampling(j, p);
  parse_penalties(j, limits, p);
  parse_vllm_sampling(j, limits, p);
  parse_stop(j, p);
  parse_vllm_text_options(j, p);
  parse_streaming(j, p);
  reject_unsupported(j, p.api);
  if (const json* v = field(j, "priority")) {
    p.priority = get_int32(*v, "priority");
    if (limits.priority_levels > 0 && (p.priority < 0 || p.priority >= limits.priority_levels))
      fail("`priority` must be between 0 and " + std::to_string(limits.priority_levels - 1) +
               ", got " + std::to_string(p.priority) + ".",
           "priority");
  }
  if (const json* v = field(j, "n")) {
    const int64_t n = get_int(*v, "n");
    if (n < 1 || n > kMaxChoices)
      fail("`n` must be between 1 and " + std::to_string(kMaxChoices) + ", got " +
               std::to_string(n) + ".",
           "n");
    p.n = int(n);
  }
  if (const json* v = field(j, "return_token_ids"))
    p.return_token_ids = get_bool(*v, "return_token_ids");
  if (const json* v = field(j, "ignore_eos")) p.ignore_eos = get_bool(*v, "ignore_eos");
}

CompletionParams parse_completion(std::string_view body, const ModelLimits& limits) {
  const json j = parse_body(body);
  CompletionParams p;
  p.model = parse_model(j, limits);
  parse_prompt(j, limits, p);
  if (const json* v = field(j, "echo")) p.echo = get_bool(*v, "echo");
  if (const json* v = field(j, "max_tokens")) {
    // With echo, 0 asks for the prompt alone (its log-probabilities, say).
    const bool zero = v->is_number() && v->get<double>() == 0;
    if (zero && !p.echo)
      fail("`max_tokens` must be at least 1 (0 only with `echo`, for the prompt alone), got 0.",
           "max_tokens");
    p.max_tokens = zero ? 0 : checked_max_tokens(*v, "max_tokens", limits);
  } else if (limits.max_tokens_cap > 0 && p.max_tokens > limits.max_tokens_cap) {
    p.max_tokens = limits.max_tokens_cap;
  }
  parse_generation_options(j, limits, p);
  parse_structured_output(j, body, limits, p);
  if (const json* v = field(j, "logprobs")) p.logprobs = checked_logprobs(*v, "logprobs");
  if (p.echo && p.logprobs >= 0 && !limits.prompt_logprobs)
    unsupported("echo",
                "with `logprobs` it asks for the prompt's log-probabilities, which this "
                "server's CUDA devices do not compute yet");
  const size_t answers = std::max<size_t>(1, p.batch.size()) * size_t(p.n);
  if (answers > size_t(kMaxAnswers))
    fail(std::to_string(p.batch.size()) + " prompts with n=" + std::to_string(p.n) + " ask for " +
             std::to_string(answers) + " answers; a request may ask for at most " +
             std::to_string(kMaxAnswers) + ".",
         "n");
  return p;
}

ChatRole parse_role(const json& message, const std::string& where) {
  const std::string name = where + ".role";
  const json* v = field(message, "role");
  if (!v) fail(openai::quoted(name) + " is required.", name);
  const std::string& role = get_string(*v, name);
  if (role == "system" || role == "developer") return ChatRole::System;
  if (role == "user") return ChatRole::User;
  if (role == "assistant") return ChatRole::Assistant;
  if (role == "tool") return ChatRole::Tool;
  fail(openai::quoted(name) + " must be one of system, user, assistant, tool; got '" + role +
           "' (function messages are not supported).",
       name);
}

// A string, or an array of {"type": "text", "text": "..."} parts joined by "\n".
// An assistant's may be null or absent (OpenAI's own answers carry null
// beside tool calls; vLLM takes it as empty): then "".
std::string parse_content(const json& message, const std::string& where, bool optional) {
  const std::string name = where + ".content";
  const json* v = field(message, "content");
  if (!v && optional) return {};
  if (!v) fail(openai::quoted(name) + " is required.", name);
  if (v->is_string()) return v->get<std::string>();
  if (!v->is_array()) wrong_type(name, "a string or an array of text parts", *v);
  std::string text;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& part = (*v)[i];
    const std::string at = name + "[" + std::to_string(i) + "]";
    if (!part.is_object()) wrong_type(at, "an object {\"type\": \"text\", \"text\": ...}", part);
    const json* type = field(part, "type");
    if (!type) fail(openai::quoted(at + ".type") + " is required.", at + ".type");
    const std::string& kind = get_string(*type, at + ".type");
    if (kind != "text")
      fail(openai::quoted(at + ".type") + " is '" + kind + "'; only text parts are supported.",
           at + ".type", "unsupported_parameter");
    const json* t = field(part, "text");
    if (!t) fail(openai::quoted(at + ".text") + " is required.", at + ".text");
    if (i > 0) text += '\n';
    text += get_string(*t, at + ".text");
  }
  return text;
}

// Tool messages and tool calls reach only a Jinja template, which knows how
// to show them; the built-in templates do not.
void need_jinja(const ChatFormat& tmpl, const std::string& name, std::string_view what) {
  if (tmpl.kind != ChatTemplate::Jinja)
    unsupported(name, std::string(what) +
                          " reach the model through its own chat template (Jinja), and this "
                          "server renders chats with a built-in one");
}

// An assistant's tool calls as a template reads them: the client's objects,
// each call's arguments (a JSON text) read into an object, as vLLM and
// transformers hand them over.
nlohmann::ordered_json parse_tool_calls_field(const json& calls,
                                              const nlohmann::ordered_json& ordered,
                                              const std::string& name) {
  if (!calls.is_array()) wrong_type(name, "an array of tool calls", calls);
  nlohmann::ordered_json out = ordered;
  const auto same_shape = [&] {
    if (!out.is_array() || out.size() != calls.size()) return false;
    for (const auto& c : out)
      if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) return false;
    return true;
  };
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string at = name + "[" + std::to_string(k) + "]";
    if (!calls[k].is_object()) wrong_type(at, "an object", calls[k]);
    const json* fn = field(calls[k], "function");
    if (!fn) fail(openai::quoted(at + ".function") + " is required.", at + ".function");
    if (!fn->is_object()) wrong_type(at + ".function", "an object {name, arguments}", *fn);
    const json* fname = field(*fn, "name");
    if (!fname)
      fail(openai::quoted(at + ".function.name") + " is required.", at + ".function.name");
    get_string(*fname, at + ".function.name");
    const json* args = field(*fn, "arguments");
    if (args && args->is_string()) {
      auto parsed = nlohmann::ordered_json::parse(args->get<std::string>(), nullptr, false);
      if (parsed.is_discarded())
        fail(openai::quoted(at + ".function.arguments") + " is not a JSON text.",
             at + ".function.arguments");
      if (!same_shape()) out = nlohmann::ordered_json(calls);  // duplicate keys read apart
      out[k]["function"]["arguments"] = std::move(parsed);
    } else if (args && !args->is_object()) {
      wrong_type(at + ".function.arguments", "a JSON text (a string)", *args);
    }
  }
  return out;
}

std::vector<ChatMessage> parse_messages(const json& body, OrderedBody& ordered,
                                        const ChatFormat& tmpl) {
  const json* v = field(body, "messages");
  if (!v) fail("`messages` is required.", "messages");
  if (!v->is_array()) wrong_type("messages", "an array of messages", *v);
  if (v->empty()) fail("`messages` must not be empty.", "messages");
  std::vector<ChatMessage> messages;
  messages.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) wrong_type(where, "an object", m);
    if (field(m, "function_call")) unsupported(where + ".function_call", "use tool_calls");
    ChatMessage message;
    message.role = parse_role(m, where);
    const json* calls = field(m, "tool_calls");
    if (calls && message.role != ChatRole::Assistant)
      fail(openai::quoted(where + ".tool_calls") + " belongs to an assistant's message.",
           where + ".tool_calls");
    if (calls && !(calls->is_array() && calls->empty())) {
      need_jinja(tmpl, where + ".tool_calls", "tool calls");
      message.tool_calls = parse_tool_calls_field(
          *calls, ordered.at(*calls, "messages", i, "tool_calls"), where + ".tool_calls");
    }
    if (message.role == ChatRole::Tool) {
      need_jinja(tmpl, where + ".role", "'tool' messages (a call's result)");
      if (const json* id = field(m, "tool_call_id"))
        message.tool_call_id = get_string(*id, where + ".tool_call_id");
      if (const json* n = field(m, "name")) message.name = get_string(*n, where + ".name");
    }
    message.content = parse_content(m, where, message.role == ChatRole::Assistant);
    // An earlier answer's reasoning, as vLLM takes it back (either name):
    // templates such as Qwen3's show it in a turn that called tools.
    for (const char* name : {"reasoning_content", "reasoning"})
      if (const json* r = field(m, name); r && message.role == ChatRole::Assistant)
        message.reasoning_content = get_string(*r, where + "." + name);
    messages.push_back(std::move(message));
  }
  return messages;
}

// `tools` and `tool_choice`, as vLLM takes them with a tool-call parser on:
// "auto" (the default with tools) shows the tools to the model through its
// template and reads its calls from the answer; "none" neither. "required"
// and a named function show them too and force the answer, by a grammar,
// to be a JSON array of calls ([{"name", "parameters"}], as vLLM's), of any
// of the tools or of the named one (exactly one call).
void parse_tools(const json& j, OrderedBody& ordered, const ChatFormat& tmpl, ChatOptions& o,
                 ToolCallFormat* format, std::string* forced_grammar) {
  if (const json* v = field(j, "functions")) {
    if (!v->is_array()) wrong_type("functions", "an array", *v);
    if (!v->empty()) unsupported("functions", "the deprecated `functions`; offer `tools`");
  }
  const json* tools = field(j, "tools");
  if (tools && !tools->is_array()) wrong_type("tools", "an array of tools", *tools);
  const bool offered = tools && !tools->empty();
  std::string choice = "auto";
  std::string named;  // the function a named tool_choice forces
  if (const json* v = field(j, "tool_choice")) {
    if (v->is_object()) {
      choice = "named";
      const json* fn = field(*v, "function");
      const json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
      if (!name)
        fail(
            "`tool_choice.function.name` is required (tool_choice {\"type\": \"function\", "
            "\"function\": {\"name\": ...}}).",
            "tool_choice.function.name");
      named = get_string(*name, "tool_choice.function.name");
    } else {
      choice = get_string(*v, "tool_choice");
      if (choice != "none" && choice != "auto" && choice != "required")
        fail(
            "`tool_choice` must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
            "\"function\": {\"name\": ...}}; got \"" +
                choice + "\".",
            "tool_choice");
    }
  }
  if (!offered) {
    if (choice == "required" || choice == "named")
      fail("`tool_choice` asks for a tool call, but the request offers no `tools`.", "tool_choice");
    return;
  }
  nlohmann::ordered_json shown = nlohmann::ordered_json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    const json& t = (*tools)[i];
    if (!t.is_object()) wrong_type(at, "an object {type: function, function: {...}}", t);
    const json* type = field(t, "type");
    if (type && get_string(*type, at + ".type") != "function")
      fail(openai::quoted(at + ".type") + " must be \"function\".", at + ".type");
    const json* fn = field(t, "function");
    if (!fn) fail(openai::quoted(at + ".function") + " is required.", at + ".function");
    if (!fn->is_object())
      wrong_type(at + ".function", "an object {name, description, parameters}", *fn);
    const json* name = field(*fn, "name");
    if (!name) fail(openai::quoted(at + ".function.name") + " is required.", at + ".function.name");
    if (get_string(*name, at + ".function.name").empty())
      fail(openai::quoted(at + ".function.name") + " must not be empty.", at + ".function.name");
    if (const json* params = field(*fn, "parameters"); params && !params->is_object())
      wrong_type(at + ".function.parameters", "an object (a JSON schema)", *params);
    // vLLM's model_dump(): these keys in this order, absent ones none.
    nlohmann::ordered_json given = ordered.at(*fn, "tools", i, "function");
    if (!given.is_object() || !given.contains("name")) given = nlohmann::ordered_json(*fn);
    nlohmann::ordered_json function = {
        {"name", given["name"]},
        {"description", given.value("description", nlohmann::ordered_json())},
        {"parameters", given.value("parameters", nlohmann::ordered_json())}};
    shown.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  if (choice == "none") return;  // offered, not to be used: not shown, as vLLM
  need_jinja(tmpl, "tools", "tools");
  if (choice == "required" || choice == "named") {
    nlohmann::ordered_json calls = nlohmann::ordered_json::array();
    bool found = false;
    for (size_t i = 0; i < shown.size(); ++i) {
      const auto& fn = shown[i]["function"];
      const std::string name = fn["name"].get<std::string>();
      if (choice == "named" && name != named) continue;
      found = true;
      nlohmann::ordered_json params = fn["parameters"].is_null()
                                          ? nlohmann::ordered_json{{"type", "object"}}
                                          : fn["parameters"];
      calls.push_back({{"type", "object"},
                       {"properties", {{"name", {{"const", name}}}, {"parameters", params}}},
                       {"required", {"name", "parameters"}}});
    }
    if (!found)
      fail("`tool_choice` names the function '" + named + "', which is not among the `tools`.",
           "tool_choice.function.name");
    nlohmann::ordered_json schema = {
        {"type", "array"},
        {"items", calls.size() == 1 ? calls[0] : nlohmann::ordered_json{{"anyOf", calls}}},
        {"minItems", 1}};
    if (choice == "named") schema["maxItems"] = 1;
    try {
      const std::string g = checked_grammar(grammar::json_schema_grammar(schema), "tools");
      if (forced_grammar) *forced_grammar = g;
    } catch (const grammar::SchemaError& e) {
      fail(std::string("A tool's `parameters` cannot be enforced: ") + e.what() + ".", "tools",
           "unsupported_parameter");
    }
    o.tools = std::move(shown);
    if (format) *format = choice == "named" ? ToolCallFormat::ForcedNamed : ToolCallFormat::Forced;
    return;
  }
  if (tmpl.tool_calls == ToolCallFormat::None)
    unsupported("tools",
                "the model's chat template writes tool calls in no format this server reads "
                "(hermes' <tool_call>, Mistral's [TOOL_CALLS], Llama 3's JSON)");
  o.tools = std::move(shown);
  if (format) *format = tmpl.tool_calls;
}

// A chat asks for log-probabilities with `logprobs: true`, and for the
// likeliest alternatives with `top_logprobs`, which needs it.
void parse_chat_logprobs(const json& j, CompletionParams& p) {
  const json* on = field(j, "logprobs");
  const bool wanted = on && get_bool(*on, "logprobs");
  const json* top = field(j, "top_logprobs");
  const int k = top ? checked_logprobs(*top, "top_logprobs") : 0;
  if (k > 0 && !wanted) fail("`top_logprobs` needs `logprobs` to be true.", "top_logprobs");
  if (wanted) p.logprobs = k;
}

// vLLM's chat rendering options: add_generation_prompt, continue_final_message,
// chat_template_kwargs. A request's own `chat_template` is refused, as vLLM
// refuses it unless trusted: the server's is set by server.chat_template_file.
ChatOptions parse_chat_options(const json& j) {
  ChatOptions o;
  if (const json* v = field(j, "add_generation_prompt"))
    o.generation_prompt = get_bool(*v, "add_generation_prompt");
  if (const json* v = field(j, "continue_final_message"))
    o.continue_final_message = get_bool(*v, "continue_final_message");
  if (o.continue_final_message && o.generation_prompt && field(j, "add_generation_prompt"))
    fail("`continue_final_message` and `add_generation_prompt` cannot both be true.",
         "continue_final_message");
  if (o.continue_final_message) o.generation_prompt = false;  // vLLM's clients set only this
  if (const json* v = field(j, "chat_template_kwargs")) {
    if (!v->is_object()) wrong_type("chat_template_kwargs", "an object", *v);
    o.template_kwargs = *v;
  }
  if (field(j, "chat_template"))
    unsupported("chat_template",
                "a request may not bring its own template; the server's is set by "
                "server.chat_template_file");
  return o;
}

// The chat's prompt; a chat with tools says in `format` how to read the
// model's calls (null: /tokenize, which only renders).
std::string render_chat_request(const json& j, std::string_view body, const ChatFormat& tmpl,
                                ToolCallFormat* format, std::string* forced_grammar) {
  OrderedBody ordered(body);
  const std::vector<ChatMessage> messages = parse_messages(j, ordered, tmpl);
  ChatOptions options = parse_chat_options(j);
  parse_tools(j, ordered, tmpl, options, format, forced_grammar);
  try {
    return render_chat(messages, tmpl, options);
  } catch (const ChatTemplateError& e) {
    fail(e.what(), "messages");
  }
}

CompletionParams parse_chat(std::string_view body, const ModelLimits& limits,
                            const ChatFormat& tmpl) {
  const json j = parse_body(body);
  CompletionParams p;
  p.api = Api::Chat;
  p.model = parse_model(j, limits);
  p.prompt_text = render_chat_request(j, body, tmpl, &p.tool_calls, &p.grammar);
  p.reasoning = tmpl.reasoning;
  const json* max = field(j, "max_completion_tokens");
  const std::string name = max ? "max_completion_tokens" : "max_tokens";
  if (!max) {
    max = field(j, "max_tokens");
  } else if (const json* old = field(j, "max_tokens")) {
    // The newer name wins, but a bad value under the older is not ignored.
    checked_max_tokens(*old, "max_tokens", limits);
  }
  if (max) {
    p.max_tokens = checked_max_tokens(*max, name, limits);
  } else {
    p.max_tokens = limits.max_tokens_cap > 0 ? limits.max_tokens_cap : limits.context_length;
    p.max_tokens_from_context = true;
  }
  parse_generation_options(j, limits, p);
  if (!p.grammar.empty()) {
    // A forced tool call: its grammar, and nothing else may shape the answer.
    if (!limits.structured_output_refusal.empty())
      unsupported("tool_choice", "forcing a tool call needs structured output, but " +
                                     limits.structured_output_refusal);
    CompletionParams other;
    parse_structured_output(j, body, limits, other);
    if (!other.grammar.empty())
      fail(
          "A forced tool call (`tool_choice`) shapes the answer already; it cannot have "
          "structured output as well.",
          "tool_choice");
  } else {
    parse_structured_output(j, body, limits, p);
  }
  parse_chat_logprobs(j, p);
  // vLLM's chat echo repeats the last message; not honoured here.
  if (const json* v = field(j, "echo"))
    if (get_bool(*v, "echo")) unsupported("echo", "only /v1/completions echoes its prompt");
  return p;
}

TokenizeParams parse_tokenize(std::string_view body, const ModelLimits& limits,
                              const ChatFormat& tmpl) {
  const json j = parse_body(body);
  parse_model(j, limits);  // only checked
  TokenizeParams p;
  const json* prompt = field(j, "prompt");
  const bool chat = field(j, "messages") != nullptr;  // null: not given, as elsewhere
  if (prompt && chat) fail("Give either `prompt` or `messages`, not both.", "prompt");
  if (chat) {
    p.text = render_chat_request(j, body, tmpl, nullptr, nullptr);
    p.chat = true;
  } else if (prompt) {
    p.text = get_string(*prompt, "prompt");
  } else {
    fail("`prompt` (a text) or `messages` is required.", "prompt");
  }
  if (const json* v = field(j, "add_special_tokens"))
    p.add_special_tokens = get_bool(*v, "add_special_tokens");
  if (const json* v = field(j, "return_token_strs"))
    p.return_token_strs = get_bool(*v, "return_token_strs");
  return p;
}

std::vector<int> parse_detokenize(std::string_view body, const ModelLimits& limits) {
  const json j = parse_body(body);
  parse_model(j, limits);  // only checked
  const json* v = field(j, "tokens");
  if (!v) fail("`tokens` is required.", "tokens");
  if (!v->is_array()) wrong_type("tokens", "an array of token ids", *v);
  std::vector<int> ids;
  ids.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    const json& e = (*v)[i];
    const std::string at = "tokens[" + std::to_string(i) + "]";
    int64_t id = 0;
    if (!e.is_number() || !as_int64(e, id)) {
      if (!e.is_number_unsigned()) wrong_type(at, "a token id", e);
      id = -1;  // past int64: outside the vocabulary all the same
    }
    if (id < 0 || id >= limits.vocab_size)
      fail("Token id " + (id < 0 && e.is_number_unsigned() ? e.dump() : std::to_string(id)) +
               " at `" + at + "` is outside the vocabulary (valid ids: 0.." +
               std::to_string(limits.vocab_size - 1) + ").",
           "tokens");
    ids.push_back(int(id));
  }
  return ids;
}

ApiError no_tokenizer(std::string_view endpoint) {
  return bad_request("This server has no tokenizer, so " + std::string(endpoint) +
                     " cannot answer.");
}

}  // namespace

ApiError bad_request(std::string message, std::string param, std::string code) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

ApiError from_service_error(const ServiceError& s) {
  ApiError e;
  e.message = s.message;
  switch (s.kind) {
    case ServiceErrorKind::BadRequest:
      e.status = 400;
      break;
    case ServiceErrorKind::QueueFull:
      e.status = 429;
      e.type = "rate_limit_error";
      e.code = "queue_full";
      e.retry_after_s = s.retry_after_s > 0 ? s.retry_after_s : 1;
      break;
    case ServiceErrorKind::Unavailable:
      e.status = 503;
      e.type = "service_unavailable";
      e.retry_after_s = s.retry_after_s > 0 ? s.retry_after_s : 1;
      break;
    case ServiceErrorKind::Timeout:
      e.status = 504;
      e.type = "timeout";
      break;
    case ServiceErrorKind::Internal:
      e.status = 500;
      e.type = "server_error";
      break;
  }
  if (e.message.empty()) e.message = "The request failed (HTTP " + std::to_string(e.status) + ").";
  return e;
}

json error_json(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return json{{"error", std::move(err)}};
}

std::string error_body(const ApiError& e) {
  return dump(error_json(e));
}

int retry_after_header_seconds(double seconds) {
  if (!(seconds > 0)) return 1;
  if (seconds > 86400) return 86400;
  return std::max(1, int(std::ceil(seconds)));
}

std::optional<ApiError> check_context_length(int prompt_tokens, int max_tokens,
                                             int context_length) {
  int64_t total = int64_t(prompt_tokens) + max_tokens;
  if (total <= context_length) return std::nullopt;
  return bad_request("This model's maximum context length is " + std::to_string(context_length) +
                         " tokens. However, you requested " + std::to_string(total) + " tokens (" +
                         std::to_string(prompt_tokens) + " in the prompt, " +
                         std::to_string(max_tokens) +
                         " in the completion). Please reduce the length of the prompt or "
                         "completion.",
                     "prompt", "context_length_exceeded");
}

Result<CompletionParams> parse_completion_request(std::string_view body,
                                                  const ModelLimits& limits) {
  return parsed<CompletionParams>([&] { return parse_completion(body, limits); });
}

Result<CompletionParams> parse_chat_request(std::string_view body, const ModelLimits& limits,
                                            const ChatFormat& tmpl) {
  return parsed<CompletionParams>([&] { return parse_chat(body, limits, tmpl); });
}

Result<TokenizeParams> parse_tokenize_request(std::string_view body, const ModelLimits& limits,
                                              const ChatFormat& tmpl) {
  return parsed<TokenizeParams>([&] { return parse_tokenize(body, limits, tmpl); });
}

namespace {

// Whether the tokenizer adds its BOS to a prompt: yes when it has one, but not
// to a chat whose template wrote it already (Llama 3's "<|begin_of_text|>"),
// as vLLM encodes a rendered chat without special tokens.
bool adds_bos(const Tokenizer& tokenizer, std::string_view text, bool chat) {
  const int bos = tokenizer.bos_id();
  return bos >= 0 && !(chat && text.starts_with(tokenizer.piece(bos)));
}

}  // namespace

Result<json> tokenize_response(const TokenizeParams& p, const Tokenizer* tokenizer,
                               const ModelLimits& limits) {
  if (!tokenizer) return no_tokenizer("/tokenize");
  std::vector<int> ids;
  try {
    ids = tokenizer->encode(p.text, p.add_special_tokens && adds_bos(*tokenizer, p.text, p.chat));
  } catch (const std::exception& e) {
    return bad_request(std::string("The text could not be tokenized: ") + e.what(), "prompt");
  }
  json strs = nullptr;
  if (p.return_token_strs) {
    strs = json::array();
    for (int id : ids) strs.push_back(tokenizer->piece(id));
  }
  return json{{"count", ids.size()},
              {"max_model_len", limits.context_length},
              {"tokens", ids},
              {"token_strs", std::move(strs)}};
}

Result<std::vector<int>> parse_detokenize_request(std::string_view body,
                                                  const ModelLimits& limits) {
  return parsed<std::vector<int>>([&] { return parse_detokenize(body, limits); });
}

Result<json> detokenize_response(const std::vector<int>& ids, const Tokenizer* tokenizer) {
  if (!tokenizer) return no_tokenizer("/detokenize");
  try {
    return json{{"prompt", tokenizer->decode(ids)}};
  } catch (const std::exception& e) {
    return bad_request(std::string("The tokens could not be decoded: ") + e.what(), "tokens");
  }
}

Result<std::vector<int>> resolve_prompt(CompletionParams& p, const Tokenizer* tokenizer,
                                        const ModelLimits& limits) {
  std::vector<int> ids;
  if (p.prompt_text) {
    if (!tokenizer && is_chat(p.api))
      return bad_request(
          "This server has no tokenizer, so chat messages cannot be turned into a prompt; use "
          "/v1/completions with token ids.",
          "messages");
    if (!tokenizer)
      return bad_request("This server has no tokenizer: send `prompt` as an array of token ids.",
                         "prompt");
    try {
      ids = tokenizer->encode(*p.prompt_text, adds_bos(*tokenizer, *p.prompt_text, is_chat(p.api)));
    } catch (const std::exception& e) {
      return bad_request(std::string("The prompt could not be tokenized: ") + e.what(), "prompt");
    }
  } else {
    ids = p.prompt_ids;
  }
  // vLLM's truncation: the prompt's last tokens, BOS or not.
  if (p.truncate_prompt_tokens > 0 && ids.size() > size_t(p.truncate_prompt_tokens))
    ids.erase(ids.begin(), ids.end() - p.truncate_prompt_tokens);
  if (!p.stop.empty() && !tokenizer)
    return bad_request("This server has no tokenizer, so `stop` strings cannot be applied.",
                       "stop");
  if (ids.empty()) return bad_request("`prompt` must not be empty.", "prompt");
  if (p.max_tokens_from_context) {
    const int64_t room = int64_t(limits.context_length) - int64_t(ids.size());
    p.max_tokens = int(std::max<int64_t>(1, std::min<int64_t>(p.max_tokens, room)));
  }
  // An echo without a completion (max_tokens 0) still has the service
  // sample one token, which it drops: the prompt must leave room for it.
  if (p.echo && p.max_tokens == 0 && int64_t(ids.size()) >= limits.context_length)
    return bad_request(
        "This model's maximum context length is " + std::to_string(limits.context_length) +
            " tokens, and an echo of a prompt needs room for one token after it, "
            "even with max_tokens 0. However, the prompt has " +
            std::to_string(ids.size()) + " tokens. Please reduce the length of the prompt.",
        "prompt", "context_length_exceeded");
  if (auto e = check_context_length(int(ids.size()), p.max_tokens, limits.context_length))
    return *e;
  return ids;
}

// vLLM's tokenization of bad_words: each word with its leading spaces
// stripped, and with one space before it where that gives another first
// token and as many tokens (a word at the start of the text and inside it).
std::optional<ApiError> tokenize_bad_words(CompletionParams& p, const Tokenizer* tokenizer) {
  p.bad_words.clear();
  if (p.bad_words_text.empty()) return std::nullopt;
  if (!tokenizer)
    return bad_request("This server has no tokenizer, so `bad_words` cannot be applied.",
                       "bad_words");
  for (const std::string& word : p.bad_words_text) {
    const std::string bare = word.substr(std::min(word.find_first_not_of(' '), word.size()));
    if (bare.empty()) continue;
    std::vector<int> plain, spaced;
    try {
      plain = tokenizer->encode(bare, false);
      spaced = tokenizer->encode(" " + bare, false);
    } catch (const std::exception& e) {
      return bad_request(std::string("A bad word could not be tokenized: ") + e.what(),
                         "bad_words");
    }
    for (const auto* ids : {&plain, &spaced}) {
      if (ids->empty() || ids->size() > size_t(kMaxBadWordTokens)) {
        if (ids->empty()) continue;
        return bad_request("`bad_words`: \"" + word + "\" is " + std::to_string(ids->size()) +
                               " tokens, more than " + std::to_string(kMaxBadWordTokens) + ".",
                           "bad_words");
      }
      if (ids == &spaced && !plain.empty() &&
          (spaced.front() == plain.front() || spaced.size() != plain.size()))
        continue;
      p.bad_words.push_back(*ids);
    }
  }
  return std::nullopt;
}

Result<std::vector<std::vector<int>>> resolve_prompts(CompletionParams& p,
                                                      const Tokenizer* tokenizer,
                                                      const ModelLimits& limits) {
  std::vector<std::vector<int>> out;
  if (auto e = tokenize_bad_words(p, tokenizer)) return *e;
  if (p.batch.empty()) {
    auto one = resolve_prompt(p, tokenizer, limits);
    if (auto* e = std::get_if<ApiError>(&one)) return *e;
    out.push_back(std::move(std::get<std::vector<int>>(one)));
    return out;
  }
  std::vector<CompletionParams::Prompt> batch = std::move(p.batch);
  p.batch.clear();
  for (size_t i = 0; i < batch.size(); ++i) {
    CompletionParams one = p;
    one.prompt_text = std::move(batch[i].text);
    one.prompt_ids = std::move(batch[i].ids);
    auto ids = resolve_prompt(one, tokenizer, limits);
    if (auto* e = std::get_if<ApiError>(&ids)) {
      ApiError named = *e;
      named.message = "`prompt`[" + std::to_string(i) + "]: " + named.message;
      return named;
    }
    out.push_back(std::move(std::get<std::vector<int>>(ids)));
  }
  return out;
}

size_t prompt_text_bytes(const CompletionParams& p) {
  size_t bytes = p.prompt_text ? p.prompt_text->size() : 0;
  for (const auto& one : p.batch) bytes += one.text ? one.text->size() : 0;
  return bytes;
}

std::string completion_id(uint64_t nonce, uint64_t request_id, Api api, std::string_view tag) {
  const char* prefix = api == Api::Chat ? "chatcmpl-" : api == Api::Responses ? "resp_" : "cmpl-";
  if (!tag.empty()) return std::string(prefix).append(tag);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s%016llx%016llx", prefix, static_cast<unsigned long long>(nonce),
                static_cast<unsigned long long>(request_id));
  return buf;
}

const char* finish_reason_name(FinishReason r) {
  return r == FinishReason::Length ? "length" : "stop";
}

json usage_json(const Usage& u) {
  // prompt_tokens_details as OpenAI writes it (vLLM: with
  // --enable-prompt-tokens-details).
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {

// A non-streaming response's choice: its text, or a chat's message.
json choice_json(const ResponseMeta& meta, const std::string& text,
                 std::optional<FinishReason> reason, const std::vector<int>* token_ids,
                 const json* logprobs, const std::vector<ToolCall>* tool_calls,
                 const std::optional<std::string>* reasoning) {
  const Api api = meta.api;
  const bool called = api == Api::Chat && tool_calls && !tool_calls->empty();
  json c = {{"index", meta.index},
            {"logprobs", logprobs ? *logprobs : json(nullptr)},
            {"finish_reason", called && !meta.named_tool_call ? json("tool_calls")
                              : reason                        ? json(finish_reason_name(*reason))
                                                              : json(nullptr)}};
  if (api == Api::Chat) {
    const bool no_content = (called || reasoning) && text.empty();
    c["message"] = {{"role", "assistant"}, {"content", no_content ? json(nullptr) : json(text)}};
    if (reasoning)
      c["message"]["reasoning_content"] = *reasoning ? json(**reasoning) : json(nullptr);
    if (called) c["message"]["tool_calls"] = tool_calls_json(*tool_calls, false);
  } else {
    c["text"] = text;
  }
  if (token_ids) c["token_ids"] = *token_ids;
  return c;
}

const char* object_name(Api api, bool chunk) {
  if (api == Api::Completions) return "text_completion";
  return chunk ? "chat.completion.chunk" : "chat.completion";
}

json envelope(const ResponseMeta& meta, bool chunk) {
  return {{"id", meta.id},
          {"object", object_name(meta.api, chunk)},
          {"created", meta.created},
          {"model", meta.model}};
}

std::string sse(const json& j) {
  return "data: " + dump(j) + "\n\n";
}

// -inf as OpenAI writes it; JSON has no infinities.
json logprob_value(float lp) {
  return std::isinf(lp) ? json(-9999.0) : json(lp);
}

bool valid_utf8(std::string_view s);  // below

// A token's text for JSON: as it is when it is UTF-8; else (a piece of a
// character) "bytes:\\xNN...", as OpenAI spells such tokens.
std::string token_string(const std::string& bytes) {
  if (valid_utf8(bytes)) return bytes;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "bytes:";
  for (unsigned char c : bytes) {
    out += "\\x";
    out += kHex[c >> 4];
    out += kHex[c & 0xF];
  }
  return out;
}

json bytes_json(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

}  // namespace

json logprobs_json(Api api, const std::vector<TokenLogprob>& tokens, int64_t text_offset) {
  auto value = [](const std::optional<float>& lp) {
    return lp ? logprob_value(*lp) : json(nullptr);
  };
  if (api == Api::Chat) {
    json content = json::array();
    for (const TokenLogprob& t : tokens) {
      json top = json::array();
      for (const auto& [tok, lp] : t.top)
        top.push_back({{"token", token_string(tok)},
                       {"logprob", logprob_value(lp)},
                       {"bytes", bytes_json(tok)}});
      content.push_back({{"token", token_string(t.token)},
                         {"logprob", value(t.logprob)},
                         {"bytes", bytes_json(t.token)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}};
  }
  json toks = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprob& t : tokens) {
    toks.push_back(token_string(t.token));
    lps.push_back(value(t.logprob));
    json top = json::object();
    for (const auto& [tok, lp] : t.top) top.emplace(token_string(tok), logprob_value(lp));
    if (t.logprob) top.emplace(token_string(t.token), logprob_value(*t.logprob));  // kept if there
    // No log-probability (an echoed prompt's first token): null, as OpenAI
    // and vLLM write it.
    tops.push_back(t.logprob ? std::move(top) : json(nullptr));
    offsets.push_back(text_offset);
    text_offset += int64_t(t.token.size());
  }
  return {{"text_offset", std::move(offsets)},
          {"token_logprobs", std::move(lps)},
          {"tokens", std::move(toks)},
          {"top_logprobs", std::move(tops)}};
}

json completion_response(const ResponseMeta& meta, const std::string& text, FinishReason reason,
                         const Usage& usage, const std::vector<int>* token_ids,
                         const json* logprobs, const std::vector<ToolCall>* tool_calls,
                         const std::optional<std::string>* reasoning) {
  json j = envelope(meta, /*chunk=*/false);
  j["choices"] =
      json::array({choice_json(meta, text, reason, token_ids, logprobs, tool_calls, reasoning)});
  j["usage"] = usage_json(usage);
  return j;
}

namespace {

// Well-formed UTF-8 (Unicode 15, table 3-7): what nlohmann's serializer
// accepts as it is, without replacing anything.
bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  const auto cont = [&](const unsigned char* q, unsigned char lo, unsigned char hi) {
    return q < end && *q >= lo && *q <= hi;
  };
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
    } else if (c >= 0xC2 && c <= 0xDF) {
      if (!cont(p + 1, 0x80, 0xBF)) return false;
      p += 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      const unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
      if (!cont(p + 1, lo, hi) || !cont(p + 2, 0x80, 0xBF)) return false;
      p += 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      const unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
      if (!cont(p + 1, lo, hi) || !cont(p + 2, 0x80, 0xBF) || !cont(p + 3, 0x80, 0xBF))
        return false;
      p += 4;
    } else {
      return false;
    }
  }
  return true;
}

void append_int(std::string& out, int64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
  if (!valid_utf8(s)) {
    out += dump(json(std::string(s)));  // U+FFFD where it is not UTF-8, as dump() does
    return;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  size_t run = 0;  // start of the bytes copied as they are
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(s.data() + run, i - run);
    run = i + 1;
    out += '\\';
    switch (c) {
      case '"':
        out += '"';
        break;
      case '\\':
        out += '\\';
        break;
      case '\b':
        out += 'b';
        break;
      case '\t':
        out += 't';
        break;
      case '\n':
        out += 'n';
        break;
      case '\f':
        out += 'f';
        break;
      case '\r':
        out += 'r';
        break;
      default:
        out += "u00";
        out += kHex[c >> 4];
        out += kHex[c & 0xF];
    }
  }
  out.append(s.data() + run, s.size() - run);
  out += '"';
}

// Written directly rather than built as a json tree and dumped: it is sent
// once per token. The bytes are dump()'s, keys in its (sorted) order, which
// tests/unit/test_openai_api.cpp checks.
std::string sse_text_chunk(const ResponseMeta& meta, const std::string& text,
                           std::optional<FinishReason> reason, const ChunkUsage& usage,
                           const std::vector<int>* token_ids, const json* logprobs,
                           bool reasoning) {
  const bool chat = meta.api == Api::Chat;
  std::string out;
  out.reserve(180 + text.size() + meta.id.size() + meta.model.size() +
              (token_ids ? 8 * token_ids->size() : 0));
  out += "data: {\"choices\":[{";
  if (chat) {
    if (reason && text.empty()) {
      out += "\"delta\":{},";
    } else {
      out += reasoning ? "\"delta\":{\"reasoning_content\":" : "\"delta\":{\"content\":";
      append_json_string(out, text);
      out += "},";
    }
  }
  out += "\"finish_reason\":";
  if (reason) {
    out += '"';
    out += finish_reason_name(*reason);
    out += '"';
  } else {
    out += "null";
  }
  out += ",\"index\":";
  append_int(out, meta.index);
  out += ",\"logprobs\":";
  out += logprobs ? dump(*logprobs) : "null";
  if (!chat) {
    out += ",\"text\":";
    append_json_string(out, text);
  }
  if (token_ids) {
    out += ",\"token_ids\":[";
    for (size_t i = 0; i < token_ids->size(); ++i) {
      if (i > 0) out += ',';
      append_int(out, (*token_ids)[i]);
    }
    out += ']';
  }
  out += "}],\"created\":";
  append_int(out, meta.created);
  out += ",\"id\":";
  append_json_string(out, meta.id);
  out += ",\"model\":";
  append_json_string(out, meta.model);
  out += ",\"object\":\"";
  out += object_name(meta.api, /*chunk=*/true);
  out += '"';
  if (usage.include)
    out += ",\"usage\":" + (usage.so_far ? dump(usage_json(*usage.so_far)) : "null");
  out += "}\n\n";
  return out;
}

std::string sse_role_chunk(const ResponseMeta& meta, const ChunkUsage& usage) {
  json j = envelope(meta, /*chunk=*/true);
  j["choices"] = json::array({json{{"index", meta.index},
                                   {"delta", {{"role", "assistant"}, {"content", ""}}},
                                   {"logprobs", nullptr},
                                   {"finish_reason", nullptr}}});
  if (usage.include) j["usage"] = usage.so_far ? usage_json(*usage.so_far) : json(nullptr);
  return sse(j);
}

std::string sse_finish_chunks(const ResponseMeta& meta, const std::string& text,
                              FinishReason reason, const ChunkUsage& usage,
                              const std::vector<int>* token_ids, const json* logprobs,
                              const std::vector<ToolCall>* tool_calls) {
  if (meta.api == Api::Chat && tool_calls && !tool_calls->empty()) {
    std::string out;
    if (!text.empty() || logprobs || token_ids)
      out += sse_text_chunk(meta, text, std::nullopt, usage, token_ids, logprobs);
    const auto chunk = [&](json delta, json finish) {
      json j = envelope(meta, /*chunk=*/true);
      j["choices"] = json::array({json{{"index", meta.index},
                                       {"delta", std::move(delta)},
                                       {"logprobs", nullptr},
                                       {"finish_reason", std::move(finish)}}});
      if (usage.include) j["usage"] = usage.so_far ? usage_json(*usage.so_far) : json(nullptr);
      return sse(j);
    };
    out += chunk({{"tool_calls", tool_calls_json(*tool_calls, true)}}, nullptr);
    out += chunk(json::object(),
                 meta.named_tool_call ? finish_reason_name(reason) : std::string("tool_calls"));
    return out;
  }
  if (meta.api == Api::Completions || text.empty())
    return sse_text_chunk(meta, text, reason, usage, token_ids, logprobs);
  static const std::vector<int> kNone;
  return sse_text_chunk(meta, text, std::nullopt, usage, token_ids, logprobs) +
         sse_text_chunk(meta, "", reason, usage, token_ids ? &kNone : nullptr);
}

std::string sse_usage_chunk(const ResponseMeta& meta, const Usage& usage) {
  json j = envelope(meta, /*chunk=*/true);
  j["choices"] = json::array();
  j["usage"] = usage_json(usage);
  return sse(j);
}

std::string sse_error(const ApiError& e) {
  json j = error_json(e);
  j["error"]["status"] = e.status;  // the HTTP status it would have had
  return sse(j);
}

std::string sse_done() {
  return "data: [DONE]\n\n";
}

namespace {

json model_json(const ModelLimits& limits, int64_t created) {
  return {{"id", limits.name},
          {"object", "model"},
          {"created", created},
          {"owned_by", "troupe"},
          {"root", limits.name},
          {"parent", nullptr},
          {"max_model_len", limits.context_length},
          // Beyond OpenAI's fields, as max_model_len is vLLM's: the range of
          // token ids a prompt may hold (troupe bench --url reads it).
          {"vocab_size", limits.vocab_size}};
}

}  // namespace

json models_response(const ModelLimits& limits, int64_t created) {
  return {{"object", "list"}, {"data", json::array({model_json(limits, created)})}};
}

Result<json> model_response(std::string_view id, const ModelLimits& limits, int64_t created) {
  if (id == limits.name) return model_json(limits, created);
  return model_not_found(id);
}

namespace {

std::string dump_plain(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// A completion's top_logprobs entry: token -> log-probability.
bool is_token_map(const json& j) {
  return j.is_object() && !j.empty() &&
         std::all_of(j.begin(), j.end(), [](const json& v) { return v.is_number(); });
}

bool has_top_logprobs(const json& j, int depth) {
  if (depth == 0 || !(j.is_object() || j.is_array())) return false;
  if (j.is_object() && j.contains("top_logprobs")) return true;
  return std::any_of(j.begin(), j.end(),
                     [&](const json& v) { return has_top_logprobs(v, depth - 1); });
}

// dump(), but the token maps in a "top_logprobs" list are written likeliest
// first (ties by token), as OpenAI and vLLM write them: json keeps an
// object's keys sorted.
void write_ordered(const json& j, std::string& out, bool in_top_logprobs) {
  if (j.is_array()) {
    out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) out += ',';
      write_ordered(j[i], out, in_top_logprobs);
    }
    out += ']';
    return;
  }
  if (!j.is_object()) {
    out += dump_plain(j);
    return;
  }
  std::vector<std::pair<const std::string*, const json*>> members;
  for (auto it = j.begin(); it != j.end(); ++it) members.emplace_back(&it.key(), &it.value());
  if (in_top_logprobs && is_token_map(j))
    std::stable_sort(members.begin(), members.end(), [](const auto& a, const auto& b) {
      return a.second->template get<double>() > b.second->template get<double>();
    });
  out += '{';
  for (size_t i = 0; i < members.size(); ++i) {
    if (i) out += ',';
    out += dump_plain(json(*members[i].first));
    out += ':';
    write_ordered(*members[i].second, out, *members[i].first == "top_logprobs");
  }
  out += '}';
}

}  // namespace

std::string dump(const json& j) {
  // A response's logprobs sit at most four levels down (choices, a choice,
  // its logprobs); other answers take json's own writer.
  if (!has_top_logprobs(j, 4)) return dump_plain(j);
  std::string out;
  write_ordered(j, out, false);
  return out;
}

}  // namespace troupe::openai
