#include "net/chat_template.h"

#include <ctime>

#include "net/tool_calls.h"
#include "text/jinja/template.h"

namespace troupe::openai {

namespace {

const char* plain_label(ChatRole role) {
  switch (role) {
    case ChatRole::System:
      return "System: ";
    case ChatRole::User:
      return "User: ";
    case ChatRole::Assistant:
      return "Assistant: ";
    case ChatRole::Tool:
      return "Tool: ";
  }
  return "";
}

std::string render_plain(const std::vector<ChatMessage>& messages, bool generation_prompt) {
  std::string out;
  for (const ChatMessage& m : messages) {
    out += plain_label(m.role);
    out += m.content;
    out += '\n';
  }
  if (generation_prompt) out += "Assistant:";
  return out;
}

std::string render_llama2(const std::vector<ChatMessage>& messages) {
  std::string out;
  std::string system;     // waits for the next user turn
  bool answered = false;  // an assistant turn ended the text: its EOS, BOS come next
  const auto instruction = [&](const std::string& text) {
    if (answered)
      out += " </s><s>";  // Meta's turn boundary; the tokenizer reads them as EOS, BOS
    else if (!out.empty())
      out += ' ';
    out += "[INST] ";
    out += system;
    out += text;
    out += " [/INST]";
    system.clear();
    answered = false;
  };
  for (const ChatMessage& m : messages) {
    switch (m.role) {
      case ChatRole::System:
        system += "<<SYS>>\n" + m.content + "\n<</SYS>>\n\n";
        break;
      case ChatRole::User:
      case ChatRole::Tool:
        instruction(m.content);
        break;
      case ChatRole::Assistant:
        if (!out.empty()) out += ' ';
        out += m.content;
        answered = true;
        break;
    }
  }
  if (!system.empty()) instruction("");  // a system message with no user turn after it
  return out;
}

std::string render_zephyr(const std::vector<ChatMessage>& messages, bool generation_prompt) {
  std::string out;
  for (const ChatMessage& m : messages) {
    out += m.role == ChatRole::System ? "<|system|>\n"
           : m.role == ChatRole::User ? "<|user|>\n"
                                      : "<|assistant|>\n";
    out += m.content;
    out += "</s>\n";
  }
  if (generation_prompt) out += "<|assistant|>\n";
  return out;
}

const char* role_name(ChatRole role) {
  switch (role) {
    case ChatRole::System:
      return "system";
    case ChatRole::User:
      return "user";
    case ChatRole::Assistant:
      return "assistant";
    case ChatRole::Tool:
      return "tool";
  }
  return "user";
}

std::string render_chatml(const std::vector<ChatMessage>& messages, const ChatFormat& format,
                          bool generation_prompt) {
  std::string out;
  const auto turn = [&](const char* role, const std::string& content) {
    out += "<|im_start|>";
    out += role;
    out += '\n';
    out += content;
    out += "<|im_end|>\n";
  };
  if (!format.default_system.empty() && (messages.empty() || messages[0].role != ChatRole::System))
    turn("system", format.default_system);
  for (const ChatMessage& m : messages) turn(role_name(m.role), m.content);
  if (generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// Jinja's `trim`: white space off both ends.
std::string trimmed(const std::string& s) {
  constexpr const char* kSpace = " \t\n\r\f\v";
  const size_t first = s.find_first_not_of(kSpace);
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(kSpace) - first + 1);
}

std::string render_llama3(const std::vector<ChatMessage>& messages, const ChatFormat& format,
                          bool generation_prompt) {
  std::string out = "<|begin_of_text|>";
  const auto turn = [&](const char* role, const std::string& content) {
    out += "<|start_header_id|>";
    out += role;
    out += "<|end_header_id|>\n\n";
    out += content;
    out += "<|eot_id|>";
  };
  size_t first = 0;
  if (!format.system_preamble.empty()) {
    std::string system = format.system_preamble;
    if (!messages.empty() && messages[0].role == ChatRole::System) {
      system += trimmed(messages[0].content);
      first = 1;
    }
    turn("system", system);
  }
  for (size_t i = first; i < messages.size(); ++i)
    turn(role_name(messages[i].role), trimmed(messages[i].content));
  if (generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string render_mistral(const std::vector<ChatMessage>& messages, const ChatFormat& format) {
  const ChatFormat::MistralSpelling& s = format.mistral;
  const bool has_system = !messages.empty() && messages[0].role == ChatRole::System;
  const size_t first = has_system ? 1 : 0;
  // The user turn that carries the system message.
  size_t carrier = messages.size();
  for (size_t i = first; i < messages.size(); ++i)
    if (messages[i].role != ChatRole::Assistant) {
      carrier = i;
      if (!s.system_in_last_user) break;
    }
  std::string out;
  const auto instruction = [&](const std::string& text, bool with_system) {
    out += s.inst_open;
    if (with_system) out += messages[0].content + "\n\n";
    out += text;
    out += s.inst_close;
  };
  if (has_system && carrier == messages.size()) instruction("", true);
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == ChatRole::Assistant) {
      out += s.before_answer;
      out += s.trim_answer ? trimmed(m.content) : m.content;
      out += "</s>";  // read as EOS
      out += s.after_answer;
    } else {
      instruction(m.content, has_system && i == carrier);
    }
  }
  return out;
}

// The literal system message a ChatML template writes for a chat without one:
// '<|im_start|>system\n' TEXT '<|im_end|>' inside one string literal.
std::string chatml_default_system(std::string_view jinja) {
  constexpr std::string_view kOpen = "<|im_start|>system";
  for (size_t at = jinja.find(kOpen); at != std::string_view::npos;
       at = jinja.find(kOpen, at + 1)) {
    size_t from = at + kOpen.size();
    if (jinja.substr(from, 2) == "\\n")
      from += 2;  // \n written in the Jinja string
    else if (jinja.substr(from, 1) == "\n")
      from += 1;  // a newline itself
    else
      continue;
    const size_t end = jinja.find("<|im_end|>", from);
    if (end == std::string_view::npos) break;
    const std::string_view text = jinja.substr(from, end - from);
    if (text.empty() || text.find_first_of("'\"{}+\\") != std::string_view::npos) continue;
    return std::string(text);
  }
  return {};
}

}  // namespace

std::optional<ChatFormat> recognize_chat_template(std::string_view jinja,
                                                  const std::string& today) {
  const auto has = [&](std::string_view marker) {
    return jinja.find(marker) != std::string_view::npos;
  };
  if (has("<|start_header_id|>") && has("<|eot_id|>")) {
    ChatFormat f(ChatTemplate::Llama3);
    // Llama 3.1 and later: a system turn with the knowledge cut-off and the
    // date (the day's where the template asks strftime_now for it).
    if (has("Cutting Knowledge Date"))
      f.system_preamble = "Cutting Knowledge Date: December 2023\nToday Date: " +
                          (has("strftime_now") ? today : std::string("26 Jul 2024")) + "\n\n";
    return f;
  }
  if (has("<|im_start|>") && has("<|im_end|>")) {
    ChatFormat f(ChatTemplate::ChatML);
    f.default_system = chatml_default_system(jinja);
    return f;
  }
  if (has("<|user|>") && has("<|assistant|>")) return ChatFormat(ChatTemplate::Zephyr);
  if (has("[INST]") && has("<<SYS>>")) return ChatFormat(ChatTemplate::Llama2);
  if (has("[INST]") && has("[/INST]")) {
    // Mistral's versions differ in spacing and in where the system message
    // goes; the template's own literals say which.
    ChatFormat f(ChatTemplate::Mistral);
    auto& s = f.mistral;
    const auto literal = [&](const std::string& text) {
      // Appended, not `"'" + text`: GCC 12 warns falsely (-Wrestrict) on that.
      for (const char quote : {'\'', '"'}) {
        std::string quoted(1, quote);
        quoted.append(text).push_back(quote);
        if (has(quoted)) return true;
      }
      return false;
    };
    s.inst_open = literal(" [INST] ") ? " [INST] " : "[INST] ";
    s.inst_close = has(" [/INST]'") || has(" [/INST]\"") ? " [/INST]" : "[/INST]";
    s.system_in_last_user = !has("loop.first and system_message");
    const bool space_after = has("eos_token + ' '");
    s.before_answer.assign(literal(" ") && !space_after ? 1 : 0, ' ');
    s.after_answer.assign(space_after ? 1 : 0, ' ');
    s.trim_answer = has("|trim + eos_token") || has("| trim + eos_token");
    return f;
  }
  return std::nullopt;
}

namespace {

// Python's time.strftime over the local time now: transformers' strftime_now.
jinja::Value strftime_now() {
  return jinja::Value::function("strftime_now", [](jinja::Args& a) {
    const std::string format = a.take(0, "format").str();
    a.done();
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &tm);
    return jinja::Value(std::string(buf, n));
  });
}

std::string render_jinja(const std::vector<ChatMessage>& messages, const ChatFormat& format,
                         const ChatOptions& options) {
  jinja::List list;
  for (const ChatMessage& m : messages) {
    jinja::Dict d;
    d.set("role", jinja::Value(role_name(m.role)));
    d.set("content", jinja::Value(m.content));
    if (!m.tool_calls.is_null()) d.set("tool_calls", jinja::Value::from_json(m.tool_calls));
    if (!m.tool_call_id.empty()) d.set("tool_call_id", jinja::Value(m.tool_call_id));
    if (!m.name.empty()) d.set("name", jinja::Value(m.name));
    if (m.reasoning_content) d.set("reasoning_content", jinja::Value(*m.reasoning_content));
    list.emplace_back(std::move(d));
  }
  jinja::Dict context;
  context.set("messages", jinja::Value(std::move(list)));
  context.set("add_generation_prompt", jinja::Value(options.generation_prompt));
  context.set("bos_token", jinja::Value(format.bos_token));
  context.set("eos_token", jinja::Value(format.eos_token));
  context.set("tools", options.tools.is_null() ? jinja::Value(nullptr)
                                               : jinja::Value::from_json(options.tools));
  context.set("documents", jinja::Value(nullptr));
  context.set("strftime_now", strftime_now());
  if (options.template_kwargs.is_object())
    for (const auto& [key, value] : options.template_kwargs.items())
      context.set(key, jinja::Value::from_json(value));
  try {
    return format.jinja->render(context);
  } catch (const jinja::Raised& e) {
    throw ChatTemplateError(std::string("The model's chat template refused this chat: ") +
                            e.what());
  } catch (const jinja::Error& e) {
    throw ChatTemplateError(std::string("The chat template failed to render: ") + e.what());
  }
}

// transformers' continue_final_message: the text up to the end of the last
// message's content (trimmed where the template trimmed it); an empty one
// cuts nothing, as there.
std::string cut_after_final_message(std::string text, const std::vector<ChatMessage>& messages) {
  if (messages.empty() || messages.back().content.empty()) return text;
  std::string content = messages.back().content;
  size_t at = text.rfind(content);
  if (at == std::string::npos) {
    content = trimmed(content);
    at = content.empty() ? std::string::npos : text.rfind(content);
  }
  if (at == std::string::npos)
    throw ChatTemplateError(
        "continue_final_message: the last message's content is not in the rendered chat");
  text.resize(at + content.size());
  return text;
}

std::string render_fixed(const std::vector<ChatMessage>& messages, const ChatFormat& format,
                         bool generation_prompt) {
  switch (format.kind) {
    case ChatTemplate::ChatML:
      return render_chatml(messages, format, generation_prompt);
    case ChatTemplate::Llama3:
      return render_llama3(messages, format, generation_prompt);
    case ChatTemplate::Mistral:
      return render_mistral(messages, format);
    case ChatTemplate::Plain:
      return render_plain(messages, generation_prompt);
    case ChatTemplate::Llama2:
      return render_llama2(messages);
    case ChatTemplate::Zephyr:
      return render_zephyr(messages, generation_prompt);
    case ChatTemplate::Auto:
    case ChatTemplate::Jinja:
      break;
  }
  return render_plain(messages, generation_prompt);
}

}  // namespace

std::string render_chat(const std::vector<ChatMessage>& messages, const ChatFormat& format,
                        const ChatOptions& options) {
  if (options.continue_final_message && options.generation_prompt)
    throw ChatTemplateError(
        "continue_final_message and add_generation_prompt cannot both be true: the first "
        "continues the last message, the second opens a new one");
  std::string text = format.kind == ChatTemplate::Jinja && format.jinja
                         ? render_jinja(messages, format, options)
                         : render_fixed(messages, format, options.generation_prompt);
  return options.continue_final_message ? cut_after_final_message(std::move(text), messages) : text;
}

std::string render_chat(const std::vector<ChatMessage>& messages, const ChatFormat& format,
                        bool generation_prompt) {
  ChatOptions options;
  options.generation_prompt = generation_prompt;
  return render_chat(messages, format, options);
}

ChatFormat jinja_chat_format(std::string_view source, std::string bos_token,
                             std::string eos_token) {
  ChatFormat format(ChatTemplate::Jinja);
  try {
    format.jinja = std::make_shared<const jinja::Template>(source);
  } catch (const jinja::Error& e) {
    throw ChatTemplateError(std::string("the chat template cannot be parsed: ") + e.what());
  }
  format.bos_token = std::move(bos_token);
  format.eos_token = std::move(eos_token);
  format.tool_calls = detect_tool_call_format(source);
  render_chat({ChatMessage{ChatRole::User, "Hello"}}, format);  // throws what a chat would meet
  return format;
}

}  // namespace troupe::openai
