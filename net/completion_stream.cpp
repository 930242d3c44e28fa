#include "net/completion_stream.h"

#include <nlohmann/json.hpp>

namespace troupe {

int cached_prompt_tokens(const nlohmann::json& usage) {
  const auto d = usage.find("prompt_tokens_details");
  if (d == usage.end() || !d->is_object()) return 0;
  const auto c = d->find("cached_tokens");
  return c != d->end() && c->is_number_integer() ? c->get<int>() : 0;
}

void CompletionStream::feed(std::string_view body_bytes, Clock::time_point now) {
  sse_.feed(body_bytes, [&](const std::string& data) { event(data, now); });
}

void CompletionStream::event(const std::string& data, Clock::time_point now) {
  if (data == "[DONE]") {
    done_ = true;
    return;
  }
  const auto j = nlohmann::json::parse(data, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    if (error_.empty()) error_ = "bad_stream";
    return;
  }
  if (const auto e = j.find("error"); e != j.end()) {
    error_ = "stream_error";
    error_detail_ = e->is_object() && e->contains("message") && (*e)["message"].is_string()
                        ? (*e)["message"].get<std::string>()
                        : e->dump();
  }
  if (const auto u = j.find("usage"); u != j.end() && u->is_object()) {
    if (const auto c = u->find("completion_tokens"); c != u->end() && c->is_number_integer())
      usage_tokens_ = c->get<int>();
    cached_tokens_ = cached_prompt_tokens(*u);
  }
  int tokens = 0;
  if (const auto ch = j.find("choices"); ch != j.end() && ch->is_array()) {
    for (const auto& choice : *ch) {
      if (!choice.is_object()) continue;
      if (const auto ids = choice.find("token_ids"); ids != choice.end() && ids->is_array()) {
        tokens += int(ids->size());
      } else if (const auto t = choice.find("text");
                 t != choice.end() && t->is_string() && !t->get_ref<const std::string&>().empty()) {
        tokens += 1;
      }
    }
  }
  if (tokens > 0) {
    if (!first_) first_ = now;
    last_ = now;
    counted_tokens_ += tokens;
  }
}

}  // namespace troupe
