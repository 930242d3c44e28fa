#include "net/responses_api.h"

#include <array>
#include <optional>
#include <utility>

#include "net/request_fields.h"

namespace troupe::openai {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

// The chat completion a Responses request asks for, and where each chat
// field came from, to name the client's own fields in errors.
struct ChatRequest {
  ordered_json body = ordered_json::object();
  std::vector<std::string> message_at;  // chat messages[i] came from this field
  // A reasoning item's text, for the assistant's message that follows it.
  std::optional<std::string> reasoning;
};

// Sampling options both APIs know by the same name, and vLLM's extensions
// that vLLM's /v1/responses takes too.
constexpr std::array kSameNames = {
    "model",
    "temperature",
    "top_p",
    "stream",
    "seed",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "priority",
    "chat_template_kwargs",
    "parallel_tool_calls",
    "user",
    // vLLM's structured output and the rest of its sampling extensions,
    // honoured (or refused) as the chat endpoint does, never ignored.
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_whitespace_pattern",
    "structured_outputs",
    "allowed_token_ids",
    "bad_words",
    "include_stop_str_in_output",
    "truncate_prompt_tokens",
    "best_of",
    "use_beam_search",
    "length_penalty",
    "prompt_logprobs",
    "skip_special_tokens",
    "spaces_between_special_tokens",
};

// A message's content: a string, or its text parts (input_text, or a
// replayed answer's output_text) as a chat's text parts.
ordered_json message_content(const json& content, const std::string& at) {
  if (content.is_string()) return content;
  if (!content.is_array()) wrong_type(at, "a string or an array of content parts", content);
  ordered_json parts = ordered_json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string part_at = at + "[" + std::to_string(i) + "]";
    const json& part = content[i];
    if (!part.is_object()) wrong_type(part_at, "an object {type, text}", part);
    const json* type = field(part, "type");
    if (!type) fail(openai::quoted(part_at + ".type") + " is required.", part_at + ".type");
    const std::string& kind = get_string(*type, part_at + ".type");
    if (kind == "input_text" || kind == "output_text" || kind == "text") {
      const json* text = field(part, "text");
      if (!text) fail(openai::quoted(part_at + ".text") + " is required.", part_at + ".text");
      parts.push_back({{"type", "text"}, {"text", get_string(*text, part_at + ".text")}});
    } else if (kind == "refusal") {
      const json* text = field(part, "refusal");
      if (!text) fail(openai::quoted(part_at + ".refusal") + " is required.", part_at + ".refusal");
      parts.push_back({{"type", "text"}, {"text", get_string(*text, part_at + ".refusal")}});
    } else {
      unsupported(part_at + ".type",
                  "\"" + kind + "\" content; only text parts (input_text, output_text) are");
    }
  }
  return parts;
}

// The chat's last message, when it is an assistant's that may take more
// tool calls (a function_call item follows its message, or another call).
ordered_json* open_assistant(ChatRequest& chat) {
  ordered_json& messages = chat.body["messages"];
  if (messages.empty() || messages.back()["role"] != "assistant") return nullptr;
  return &messages.back();
}

void add_message(ChatRequest& chat, ordered_json message, std::string at) {
  if (message["role"] == "assistant" && chat.reasoning)
    message["reasoning_content"] = *std::exchange(chat.reasoning, std::nullopt);
  chat.body["messages"].push_back(std::move(message));
  chat.message_at.push_back(std::move(at));
}

// One `input` item as chat messages: a message (with a role), a function
// call (joined to the assistant's message before it), a call's output (a
// tool message), reasoning (the next assistant message's reasoning_content,
// which templates such as Qwen3's show in a turn that called tools).
void add_input_item(const json& item, const std::string& at, ChatRequest& chat,
                    std::vector<std::pair<std::string, std::string>>& call_names) {
  if (!item.is_object()) wrong_type(at, "an object (an input item)", item);
  std::string type = "message";
  if (const json* t = field(item, "type")) type = get_string(*t, at + ".type");
  if (type == "message") {
    const json* role = field(item, "role");
    if (!role) fail(openai::quoted(at + ".role") + " is required.", at + ".role");
    const std::string& r = get_string(*role, at + ".role");
    if (r != "user" && r != "assistant" && r != "system" && r != "developer")
      fail(openai::quoted(at + ".role") +
               " must be \"user\", \"assistant\", \"system\" or \"developer\"; got \"" + r + "\".",
           at + ".role");
    const json* content = field(item, "content");
    if (!content) fail(openai::quoted(at + ".content") + " is required.", at + ".content");
    add_message(chat, {{"role", r}, {"content", message_content(*content, at + ".content")}}, at);
    return;
  }
  if (type == "function_call") {
    const auto text = [&](const char* name) -> const std::string& {
      const json* v = field(item, name);
      if (!v) fail(openai::quoted(at + "." + name) + " is required.", at + "." + std::string(name));
      return get_string(*v, at + "." + name);
    };
    const std::string& call_id = text("call_id");
    const std::string& name = text("name");
    ordered_json call = {{"id", call_id},
                         {"type", "function"},
                         {"function", {{"name", name}, {"arguments", text("arguments")}}}};
    call_names.emplace_back(call_id, name);
    ordered_json* assistant = open_assistant(chat);
    if (!assistant) {
      add_message(chat, {{"role", "assistant"}, {"content", nullptr}}, at);
      assistant = open_assistant(chat);
    }
    (*assistant)["tool_calls"].push_back(std::move(call));
    return;
  }
  if (type == "function_call_output") {
    const json* id = field(item, "call_id");
    if (!id) fail(openai::quoted(at + ".call_id") + " is required.", at + ".call_id");
    const std::string& call_id = get_string(*id, at + ".call_id");
    const json* output = field(item, "output");
    if (!output) fail(openai::quoted(at + ".output") + " is required.", at + ".output");
    ordered_json message = {{"role", "tool"},
                            {"tool_call_id", call_id},
                            {"content", message_content(*output, at + ".output")}};
    for (const auto& [known, name] : call_names)
      if (known == call_id) message["name"] = name;
    add_message(chat, std::move(message), at);
    return;
  }
  if (type == "reasoning") {
    // Its reasoning text (an answer of this server's, or vLLM's), for the
    // next assistant message; a summary alone is not the reasoning.
    if (const json* content = field(item, "content")) {
      if (!content->is_array())
        wrong_type(at + ".content", "an array of reasoning_text parts", *content);
      std::string text;
      for (size_t i = 0; i < content->size(); ++i) {
        const json& part = (*content)[i];
        const std::string part_at = at + ".content[" + std::to_string(i) + "]";
        if (!part.is_object()) wrong_type(part_at, "an object {type, text}", part);
        if (const json* t = field(part, "text")) text += get_string(*t, part_at + ".text");
      }
      if (!text.empty()) chat.reasoning = std::move(text);
    }
    return;
  }
  if (type == "item_reference")
    unsupported(at + ".type", "items are not stored here; send the items themselves in `input`");
  unsupported(at + ".type", "\"" + type +
                                "\" items; message, function_call, function_call_output and "
                                "reasoning items are");
}

void translate_input(const json& j, ChatRequest& chat) {
  chat.body["messages"] = ordered_json::array();
  if (const json* v = field(j, "instructions"))
    add_message(chat, {{"role", "system"}, {"content", get_string(*v, "instructions")}},
                "instructions");
  const json* input = field(j, "input");
  if (!input) fail("`input` is required.", "input");
  if (input->is_string()) {
    add_message(chat, {{"role", "user"}, {"content", *input}}, "input");
    return;
  }
  if (!input->is_array()) wrong_type("input", "a string or an array of input items", *input);
  if (input->empty()) fail("`input` must not be empty.", "input");
  std::vector<std::pair<std::string, std::string>> call_names;  // call_id, function
  for (size_t i = 0; i < input->size(); ++i)
    add_input_item((*input)[i], "input[" + std::to_string(i) + "]", chat, call_names);
}

// Flat function tools ({type, name, description, parameters, strict}) as a
// chat's; a forced function ({type: function, name}) as a chat's choice.
void translate_tools(const json& j, OrderedBody& ordered, ChatRequest& chat) {
  if (const json* tools = field(j, "tools")) {
    if (!tools->is_array()) wrong_type("tools", "an array of tools", *tools);
    ordered_json out = ordered_json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string at = "tools[" + std::to_string(i) + "]";
      const json& t = (*tools)[i];
      if (!t.is_object()) wrong_type(at, "an object {type: function, name, parameters}", t);
      const json* type = field(t, "type");
      if (!type) fail(openai::quoted(at + ".type") + " is required.", at + ".type");
      if (const std::string& kind = get_string(*type, at + ".type"); kind != "function")
        unsupported(at + ".type", "\"" + kind + "\" tools; only function tools are");
      ordered_json function = ordered_json::object();
      const ordered_json given = ordered.at(t, "tools", i);
      for (const auto& [key, value] : given.items())
        if (key != "type") function[key] = value;
      out.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
    chat.body["tools"] = std::move(out);
  }
  if (const json* choice = field(j, "tool_choice")) {
    if (choice->is_object()) {
      const json* type = field(*choice, "type");
      const std::string kind = type ? get_string(*type, "tool_choice.type") : "";
      if (kind != "function")
        unsupported("tool_choice.type",
                    "only \"none\", \"auto\", \"required\" and {\"type\": \"function\", "
                    "\"name\": ...}");
      const json* name = field(*choice, "name");
      if (!name) fail("`tool_choice.name` is required.", "tool_choice.name");
      chat.body["tool_choice"] = {{"type", "function"},
                                  {"function", {{"name", get_string(*name, "tool_choice.name")}}}};
    } else {
      chat.body["tool_choice"] = *choice;
    }
  }
}

// text.format as a chat's response_format.
void translate_text_format(const json& j, OrderedBody& ordered, ChatRequest& chat) {
  const json* text = field(j, "text");
  if (!text) return;
  if (!text->is_object()) wrong_type("text", "an object {format}", *text);
  const json* format = field(*text, "format");
  if (!format) return;
  if (!format->is_object()) wrong_type("text.format", "an object {type, ...}", *format);
  const json* type = field(*format, "type");
  if (!type) fail("`text.format.type` is required.", "text.format.type");
  const std::string& kind = get_string(*type, "text.format.type");
  if (kind == "text") return;
  if (kind == "json_object") {
    chat.body["response_format"] = {{"type", "json_object"}};
    return;
  }
  if (kind != "json_schema")
    fail("`text.format.type` must be \"text\", \"json_object\" or \"json_schema\"; got \"" + kind +
             "\".",
         "text.format.type");
  ordered_json spec = ordered_json::object();
  const ordered_json given = ordered.at(*format, "text", "format");
  for (const auto& [key, value] : given.items())
    if (key != "type") spec[key] = value;
  chat.body["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(spec)}};
}

// What needs state this server does not keep, and options it does not have.
void refuse_stateful(const json& j) {
  if (field(j, "previous_response_id"))
    unsupported("previous_response_id",
                "responses are not stored here; send the whole conversation in `input`");
  if (field(j, "conversation"))
    unsupported("conversation",
                "conversations are not stored here; send the whole conversation in `input`");
  if (const json* v = field(j, "background"); v && get_bool(*v, "background"))
    unsupported("background", "responses are answered while the request waits");
  if (field(j, "prompt")) unsupported("prompt", "stored prompt templates are not kept here");
  if (const json* v = field(j, "truncation"); v && get_string(*v, "truncation") != "disabled")
    unsupported("truncation", "only \"disabled\": a prompt over the context is refused");
  if (const json* v = field(j, "store")) get_bool(*v, "store");  // accepted; nothing is kept
  if (const json* v = field(j, "include")) {
    if (!v->is_array()) wrong_type("include", "an array of strings", *v);
    for (size_t i = 0; i < v->size(); ++i) {
      const std::string at = "include[" + std::to_string(i) + "]";
      // Reasoning is never encrypted here: there is nothing more to include.
      if (get_string((*v)[i], at) != "reasoning.encrypted_content")
        unsupported(at, "\"" + (*v)[i].get<std::string>() + "\"");
    }
  }
  if (const json* v = field(j, "top_logprobs"); v && !(v->is_number() && v->get<double>() == 0))
    unsupported("top_logprobs", "log-probabilities come with /v1/chat/completions");
  for (const char* name : {"reasoning", "metadata"})
    if (const json* v = field(j, name); v && !v->is_object()) wrong_type(name, "an object", *v);
}

// The fields a response repeats, as the client gave them (defaults else).
json response_fields(const json& j) {
  const auto given = [&](const char* name, json fallback) {
    const json* v = field(j, name);
    return v ? *v : fallback;
  };
  return {{"instructions", given("instructions", nullptr)},
          {"max_output_tokens", given("max_output_tokens", nullptr)},
          {"max_tool_calls", given("max_tool_calls", nullptr)},
          {"metadata", given("metadata", json::object())},
          {"parallel_tool_calls", given("parallel_tool_calls", true)},
          {"previous_response_id", nullptr},
          {"reasoning", given("reasoning", json{{"effort", nullptr}, {"summary", nullptr}})},
          {"store", false},
          {"temperature", given("temperature", 1.0)},
          {"text", given("text", json{{"format", {{"type", "text"}}}})},
          {"tool_choice", given("tool_choice", "auto")},
          {"tools", given("tools", json::array())},
          {"top_logprobs", 0},
          {"top_p", given("top_p", 1.0)},
          {"truncation", "disabled"},
          {"user", given("user", nullptr)}};
}

// A chat field's error named as the Responses field it came from.
void rename_param(ApiError& e, const ChatRequest& chat) {
  std::string from, to;
  if (e.param.starts_with("messages[")) {
    const size_t close = e.param.find(']');
    const size_t i = std::stoul(e.param.substr(9, close - 9));
    if (i < chat.message_at.size()) {
      from = e.param.substr(0, close + 1);
      to = chat.message_at[i];
    }
  } else {
    static constexpr std::array<std::pair<std::string_view, std::string_view>, 6> kNames{{
        {"max_completion_tokens", "max_output_tokens"},
        {"response_format.json_schema.", "text.format."},
        {"response_format.json_schema", "text.format"},
        {"response_format", "text.format"},
        {"tool_choice.function.name", "tool_choice.name"},
        {"messages", "input"},
    }};
    for (const auto& [chat_name, name] : kNames)
      if (e.param.starts_with(chat_name)) {
        from = chat_name;
        to = name;
        break;
      }
    if (from.empty() && e.param.starts_with("tools[")) {
      const size_t fn = e.param.find("].function");
      if (fn != std::string::npos) {
        from = e.param.substr(0, fn + 10);
        to = e.param.substr(0, fn + 1);
      }
    }
  }
  if (from.empty()) return;
  e.param = to + e.param.substr(from.size());
  for (size_t at = e.message.find("`" + from); at != std::string::npos;
       at = e.message.find("`" + from, at + to.size()))
    e.message.replace(at + 1, from.size(), to);
}

CompletionParams parse_responses(std::string_view body, const ModelLimits& limits,
                                 const ChatFormat& tmpl) {
  const json j = parse_body(body);
  OrderedBody ordered(body);  // the client's key order, where it shows
  refuse_stateful(j);
  ChatRequest chat;
  for (const char* name : kSameNames)
    if (j.contains(name)) chat.body[name] = ordered_json(j[name]);
  if (const json* v = field(j, "max_output_tokens")) chat.body["max_completion_tokens"] = *v;
  translate_input(j, chat);
  translate_tools(j, ordered, chat);
  translate_text_format(j, ordered, chat);
  auto result = parse_chat_request(chat.body.dump(), limits, tmpl);
  if (auto* e = std::get_if<ApiError>(&result)) {
    rename_param(*e, chat);
    throw Invalid{std::move(*e)};
  }
  CompletionParams p = std::move(std::get<CompletionParams>(result));
  p.api = Api::Responses;
  p.response_fields = response_fields(j);
  return p;
}

}  // namespace

Result<CompletionParams> parse_responses_request(std::string_view body, const ModelLimits& limits,
                                                 const ChatFormat& tmpl) {
  return parsed<CompletionParams>([&] { return parse_responses(body, limits, tmpl); });
}

// ---- the response ----

ResponsesWriter::ResponsesWriter(const ResponseMeta& meta, json request_fields)
    : meta_(meta), fields_(std::move(request_fields)) {
  const size_t underscore = meta_.id.find('_');
  hex_ = underscore == std::string::npos ? meta_.id : meta_.id.substr(underscore + 1);
}

std::string ResponsesWriter::event(const char* type, json data) {
  data["type"] = type;
  data["sequence_number"] = sequence_++;
  std::string out = "event: ";
  out += type;
  out += "\ndata: ";
  out += dump(data);
  out += "\n\n";
  return out;
}

json ResponsesWriter::response(const char* status) const {
  json r = {{"id", meta_.id},
            {"object", "response"},
            {"created_at", meta_.created},
            {"status", status},
            {"background", false},
            {"error", nullptr},
            {"incomplete_details", incomplete_},
            {"model", meta_.model},
            {"output", output_},
            {"usage", usage_}};
  for (const auto& [key, value] : fields_.items()) r[key] = value;
  return r;
}

std::string ResponsesWriter::open() {
  if (opened_) return {};
  opened_ = true;
  const json r = response("in_progress");
  std::string out = event("response.created", {{"response", r}});
  return out + event("response.in_progress", {{"response", r}});
}

json ResponsesWriter::item(Open kind, const char* status) const {
  const bool done = std::string_view(status) != "in_progress";
  if (kind == Open::Reasoning) {
    json content = json::array();
    if (done) content.push_back({{"type", "reasoning_text"}, {"text", text_}});
    return {{"id", "rs_" + hex_},
            {"type", "reasoning"},
            {"summary", json::array()},
            {"content", std::move(content)},
            {"status", status}};
  }
  json content = json::array();
  if (done)
    content.push_back({{"type", "output_text"},
                       {"text", text_},
                       {"annotations", json::array()},
                       {"logprobs", json::array()}});
  return {{"id", "msg_" + hex_},
          {"type", "message"},
          {"role", "assistant"},
          {"status", status},
          {"content", std::move(content)}};
}

// An item and its one content part begin.
std::string ResponsesWriter::open_item(Open kind) {
  std::string out = close_item();
  open_ = kind;
  text_.clear();
  const json item_json = item(kind, "in_progress");
  const json part = kind == Open::Reasoning ? json{{"type", "reasoning_text"}, {"text", ""}}
                                            : json{{"type", "output_text"},
                                                   {"text", ""},
                                                   {"annotations", json::array()},
                                                   {"logprobs", json::array()}};
  const int index = int(output_.size());
  out += event("response.output_item.added", {{"output_index", index}, {"item", item_json}});
  out += event("response.content_part.added", {{"item_id", item_json["id"]},
                                               {"output_index", index},
                                               {"content_index", 0},
                                               {"part", part}});
  return out;
}

// The open item's text, part and item end (in a stream, as events).
std::string ResponsesWriter::close_item() {
  if (open_ == Open::None) return {};
  const bool reasoning = open_ == Open::Reasoning;
  const json done = item(open_, status_ == "incomplete" && !reasoning ? "incomplete" : "completed");
  const int index = int(output_.size());
  const json where = {{"item_id", done["id"]}, {"output_index", index}, {"content_index", 0}};
  json text_done = where;
  text_done["text"] = text_;
  if (!reasoning) text_done["logprobs"] = json::array();
  json part_done = where;
  part_done["part"] = done["content"][0];
  std::string out = event(reasoning ? "response.reasoning_text.done" : "response.output_text.done",
                          std::move(text_done));
  out += event("response.content_part.done", std::move(part_done));
  out += event("response.output_item.done", {{"output_index", index}, {"item", done}});
  output_.push_back(done);
  if (!reasoning) message_done_ = true;
  open_ = Open::None;
  text_.clear();
  return out;
}

// Released text into the item of its kind (opened first, closing the other).
std::string ResponsesWriter::append(Open kind, std::string_view text, bool stream) {
  if (text.empty()) return {};
  std::string out;
  if (open_ != kind) out = open_item(kind);
  text_ += text;
  if (!stream) return {};
  const bool reasoning = kind == Open::Reasoning;
  json delta = {{"item_id", (reasoning ? "rs_" : "msg_") + hex_},
                {"output_index", int(output_.size())},
                {"content_index", 0},
                {"delta", text}};
  if (!reasoning) delta["logprobs"] = json::array();
  return out + event(reasoning ? "response.reasoning_text.delta" : "response.output_text.delta",
                     std::move(delta));
}

std::string ResponsesWriter::reasoning(std::string_view text, bool stream) {
  return append(Open::Reasoning, text, stream);
}

std::string ResponsesWriter::reply(std::string_view text, bool stream) {
  return append(Open::Message, text, stream);
}

// The open item closed, the message (empty) when there is none and no
// calls, then each call as an item.
void ResponsesWriter::close_items(const std::vector<ToolCall>& calls, std::string* events) {
  std::string out;
  if (open_ == Open::Reasoning || (open_ == Open::None && !message_done_ && calls.empty()))
    out += open_item(Open::Message);
  out += close_item();
  for (size_t i = 0; i < calls.size(); ++i) {
    const int index = int(output_.size());
    json call = {{"id", "fc_" + hex_ + "_" + std::to_string(i)},
                 {"type", "function_call"},
                 {"call_id", calls[i].id},
                 {"name", calls[i].name},
                 {"arguments", ""},
                 {"status", "in_progress"}};
    out += event("response.output_item.added", {{"output_index", index}, {"item", call}});
    const json where = {{"item_id", call["id"]}, {"output_index", index}};
    json delta = where, done = where;
    delta["delta"] = calls[i].arguments;
    done["name"] = calls[i].name;
    done["arguments"] = calls[i].arguments;
    out += event("response.function_call_arguments.delta", std::move(delta));
    out += event("response.function_call_arguments.done", std::move(done));
    call["arguments"] = calls[i].arguments;
    call["status"] = "completed";
    out += event("response.output_item.done", {{"output_index", index}, {"item", call}});
    output_.push_back(std::move(call));
  }
  if (events) *events += out;
}

void ResponsesWriter::settle(FinishReason reason, const Usage& usage, int reasoning_tokens) {
  status_ = reason == FinishReason::Length ? "incomplete" : "completed";
  if (reason == FinishReason::Length) incomplete_ = {{"reason", "max_output_tokens"}};
  usage_ = {{"input_tokens", usage.prompt_tokens},
            {"input_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
            {"output_tokens", usage.completion_tokens},
            {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
            {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

json ResponsesWriter::finish(FinishReason reason, const Usage& usage, int reasoning_tokens,
                             const std::vector<ToolCall>& calls) {
  settle(reason, usage, reasoning_tokens);
  close_items(calls, nullptr);
  return response(status_.c_str());
}

std::string ResponsesWriter::finish_stream(FinishReason reason, const Usage& usage,
                                           int reasoning_tokens,
                                           const std::vector<ToolCall>& calls) {
  settle(reason, usage, reasoning_tokens);
  std::string out;
  close_items(calls, &out);
  return out + event(reason == FinishReason::Length ? "response.incomplete" : "response.completed",
                     {{"response", response(status_.c_str())}});
}

std::string ResponsesWriter::error(const ApiError& e) {
  return event("error", {{"code", e.code.empty() ? json(nullptr) : json(e.code)},
                         {"message", e.message},
                         {"param", e.param.empty() ? json(nullptr) : json(e.param)}});
}

}  // namespace troupe::openai
