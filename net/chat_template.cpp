#include "net/chat_template.h"

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

}  // namespace

std::optional<ChatTemplate> recognize_chat_template(std::string_view jinja) {
  const auto has = [&](std::string_view marker) {
    return jinja.find(marker) != std::string_view::npos;
  };
  if (has("<|user|>") && has("<|assistant|>")) return ChatTemplate::Zephyr;
  if (has("[INST]") && has("<<SYS>>")) return ChatTemplate::Llama2;
  return std::nullopt;
}

std::string render_chat(const std::vector<ChatMessage>& messages, ChatTemplate tmpl,
                        bool generation_prompt) {
  switch (tmpl) {
    case ChatTemplate::Plain:
      return render_plain(messages, generation_prompt);
    case ChatTemplate::Llama2:
      return render_llama2(messages);
    case ChatTemplate::Zephyr:
      return render_zephyr(messages, generation_prompt);
    case ChatTemplate::Auto:
      break;
  }
  return render_plain(messages, generation_prompt);
}

}  // namespace troupe::openai
