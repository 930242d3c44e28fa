#include "net/tool_calls.h"

#include <algorithm>
#include <array>
#include <cstdint>

#include "text/jinja/value.h"
#include "util/rng.h"

namespace troupe::openai {

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralOpen = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
constexpr std::array<std::string_view, 3> kMistralMarkers{kMistralOpen, kMistralArgs,
                                                          kMistralCallId};

// The text a call begins with, in the formats that mark their calls.
std::string_view call_marker(ToolCallFormat format) {
  if (format == ToolCallFormat::Hermes) return kHermesOpen;
  if (format == ToolCallFormat::Mistral) return kMistralOpen;
  return {};
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// The length of the JSON value at the start of `text` (its braces and
// brackets balanced outside strings), or 0 when it does not end.
size_t json_extent(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return 0;
}

// vLLM's arguments: json.dumps(value, ensure_ascii=False).
std::string python_dumps(const nlohmann::ordered_json& value) {
  return jinja::to_json(jinja::Value::from_json(value));
}

std::optional<ToolCall> call_from(const nlohmann::ordered_json& j, const char* arguments_key,
                                  const char* fallback_key) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const char* key = j.contains(arguments_key) ? arguments_key : fallback_key;
  if (!key || !j.contains(key)) return std::nullopt;
  return ToolCall{"", j["name"].get<std::string>(), python_dumps(j[key])};
}

// The JSON array of a forced call; anything else (an answer cut short by
// max_tokens) is no call.
std::optional<std::vector<ToolCall>> forced_calls(std::string_view text) {
  const auto j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (!j.is_array()) return std::nullopt;
  std::vector<ToolCall> calls;
  for (const auto& c : j) {
    auto call = call_from(c, "parameters", nullptr);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
  }
  return calls;
}

std::optional<std::vector<ToolCall>> hermes_calls(std::string_view text) {
  std::vector<ToolCall> calls;
  for (size_t at = text.find(kHermesOpen); at != std::string_view::npos;
       at = text.find(kHermesOpen, at)) {
    const size_t body = at + kHermesOpen.size();
    const size_t close = text.find(kHermesClose, body);
    const std::string_view inside =
        text.substr(body, close == std::string_view::npos ? std::string_view::npos : close - body);
    const auto j = nlohmann::ordered_json::parse(inside, nullptr, false);
    const auto call = j.is_discarded() ? std::nullopt : call_from(j, "arguments", nullptr);
    if (!call) return std::nullopt;
    calls.push_back(*call);
    if (close == std::string_view::npos) break;
    at = close + kHermesClose.size();
  }
  return calls;
}

// A call of Mistral's JSON form: {"name", "arguments"}, arguments {} when
// left out. Arguments written as a JSON text of an object are that object:
// a client reads `arguments` as an object's JSON text, not a string's.
std::optional<ToolCall> mistral_json_call(const nlohmann::ordered_json& j) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  nlohmann::ordered_json args = j.value("arguments", nlohmann::ordered_json::object());
  if (args.is_string()) {
    auto inner = nlohmann::ordered_json::parse(args.get<std::string>(), nullptr, false);
    if (inner.is_object()) args = std::move(inner);
  }
  return ToolCall{"", j["name"].get<std::string>(), python_dumps(args)};
}

// `text` starts with "[TOOL_CALLS]". Before v11 one JSON value follows: an
// array of calls (or a lone call); from v11 each call is its own
// "[TOOL_CALLS]name{...}", with "[CALL_ID]id" and "[ARGS]" between the name
// and the arguments where the tokenizer's version writes them. What follows
// a call's JSON up to the next marker is ignored, as vLLM ignores it.
std::optional<std::vector<ToolCall>> mistral_calls(std::string_view text) {
  std::vector<ToolCall> calls;
  const std::string_view first = trim(text.substr(kMistralOpen.size()));
  if (!first.empty() && (first[0] == '[' || first[0] == '{')) {
    const size_t n = json_extent(first);
    if (n == 0) return std::nullopt;
    auto j = nlohmann::ordered_json::parse(first.substr(0, n), nullptr, false);
    if (j.is_object()) j = nlohmann::ordered_json::array({std::move(j)});
    if (!j.is_array()) return std::nullopt;
    for (const auto& c : j) {
      auto call = mistral_json_call(c);
      if (!call) return std::nullopt;
      calls.push_back(std::move(*call));
    }
    return calls;
  }
  for (size_t at = 0; at != std::string_view::npos;) {
    const size_t body = at + kMistralOpen.size();
    const size_t brace = text.find('{', body);
    if (brace == std::string_view::npos) return std::nullopt;
    const std::string_view head = text.substr(body, brace - body);
    if (head.find(kMistralOpen) != std::string_view::npos) return std::nullopt;
    const std::string_view name =
        trim(head.substr(0, std::min(head.find(kMistralCallId), head.find(kMistralArgs))));
    const size_t n = json_extent(text.substr(brace));
    if (name.empty() || n == 0) return std::nullopt;
    const auto args = nlohmann::ordered_json::parse(text.substr(brace, n), nullptr, false);
    if (!args.is_object()) return std::nullopt;
    calls.push_back(ToolCall{"", std::string(name), python_dumps(args)});
    at = text.find(kMistralOpen, brace + n);
  }
  return calls;
}

// Mistral's templates refuse a history whose call ids are not 9 characters,
// and its tokenizers check for letters and digits: a hash of the usual id,
// so that ids stay distinct across answers and stable for one.
std::string mistral_call_id(std::string_view usual) {
  uint64_t state = 1469598103934665603ull;  // FNV-1a, mixed for the low digits
  for (const unsigned char c : usual) state = (state ^ c) * 1099511628211ull;
  uint64_t h = splitmix64(state);
  static constexpr std::string_view kDigits =
      "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  std::string id(9, '0');
  for (char& c : id) {
    c = kDigits[h % kDigits.size()];
    h /= kDigits.size();
  }
  return id;
}

std::optional<std::vector<ToolCall>> llama3_calls(std::string_view text) {
  if (text.empty() || text[0] != '{') return std::nullopt;
  std::vector<ToolCall> calls;
  size_t at = 0;
  while (at < text.size()) {
    const size_t n = json_extent(text.substr(at));
    if (n == 0) return std::nullopt;
    const auto j = nlohmann::ordered_json::parse(text.substr(at, n), nullptr, false);
    const auto call = j.is_discarded() ? std::nullopt : call_from(j, "arguments", "parameters");
    if (!call) return std::nullopt;
    calls.push_back(*call);
    at += n;
    while (at < text.size() && (is_space(text[at]) || text[at] == ';')) ++at;
  }
  return calls;
}

}  // namespace

ToolCallFormat detect_tool_call_format(std::string_view jinja) {
  if (jinja.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::Hermes;
  if (jinja.find(kMistralOpen) != std::string_view::npos) return ToolCallFormat::Mistral;
  if (jinja.find("<|start_header_id|>") != std::string_view::npos &&
      jinja.find("\"parameters\"") != std::string_view::npos)
    return ToolCallFormat::Llama3Json;
  return ToolCallFormat::None;
}

std::span<const std::string_view> control_markers(ToolCallFormat format) {
  if (format == ToolCallFormat::Mistral) return kMistralMarkers;
  return {};
}

ParsedAnswer parse_tool_calls(ToolCallFormat format, std::string_view text,
                              const std::string& id_prefix) {
  ParsedAnswer answer;
  std::optional<std::vector<ToolCall>> calls;
  size_t content_end = text.size();
  if (format == ToolCallFormat::Hermes) {
    content_end = text.find(kHermesOpen);
    if (content_end != std::string_view::npos) calls = hermes_calls(text);
  } else if (format == ToolCallFormat::Mistral) {
    content_end = text.find(kMistralOpen);
    if (content_end != std::string_view::npos) calls = mistral_calls(text.substr(content_end));
  } else if (format == ToolCallFormat::Llama3Json) {
    calls = llama3_calls(text);
    content_end = 0;
  } else if (is_forced(format)) {
    calls = forced_calls(text);
    content_end = 0;
  }
  if (!calls || calls->empty()) {
    answer.content = std::string(text);
    return answer;
  }
  answer.content = std::string(text.substr(0, content_end));
  answer.calls = std::move(*calls);
  for (size_t i = 0; i < answer.calls.size(); ++i) {
    answer.calls[i].id = id_prefix + std::to_string(i);
    if (format == ToolCallFormat::Mistral) answer.calls[i].id = mistral_call_id(answer.calls[i].id);
  }
  return answer;
}

std::string ToolCallFilter::push(std::string_view text) {
  if (format_ == ToolCallFormat::None) return std::string(text);
  held_ += text;
  if (in_call_) return {};
  if (is_forced(format_)) {
    in_call_ = true;  // the whole answer is the calls
    return {};
  }
  if (format_ == ToolCallFormat::Llama3Json) {
    // A call is the whole answer, from its first character.
    if (held_.empty()) return {};
    in_call_ = held_[0] == '{';
    return in_call_ ? std::string() : std::exchange(held_, {});
  }
  const std::string_view marker = call_marker(format_);
  const size_t open = held_.find(marker);
  if (open != std::string::npos) {
    in_call_ = true;
    std::string content = held_.substr(0, open);
    held_.erase(0, open);
    return content;
  }
  // Hold back a tail that may be the marker's beginning.
  size_t keep = 0;
  for (size_t n = std::min(held_.size(), marker.size() - 1); n > 0; --n)
    if (marker.substr(0, n) == std::string_view(held_).substr(held_.size() - n)) {
      keep = n;
      break;
    }
  std::string content = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return content;
}

ParsedAnswer ToolCallFilter::finish() {
  ParsedAnswer answer;
  if (!in_call_) {
    answer.content = std::exchange(held_, {});
    return answer;
  }
  answer = parse_tool_calls(format_, held_, id_prefix_);
  held_.clear();
  return answer;
}

nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, bool indexed) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    nlohmann::json c = {{"id", calls[i].id},
                        {"type", "function"},
                        {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (indexed) c["index"] = i;
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace troupe::openai
