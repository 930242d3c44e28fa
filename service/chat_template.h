#pragma once
// How a chat's messages become one prompt: the server's
// `server.chat_template`. The names here are the configuration's; the
// rendering, and what `auto` picks from a model's tokenizer_config.json, is
// net/chat_template.h.
#include <array>
#include <string_view>
#include <utility>

namespace troupe {

enum class ChatTemplate {
  Plain,   // "System: ...\nUser: ...\nAssistant:"
  Llama2,  // "[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST]"
  Zephyr,  // "<|user|>\n...</s>\n<|assistant|>\n" (TinyLlama-Chat, Zephyr)
  Auto,    // the model's own, when it is one of these; else plain
};

inline constexpr std::array<std::pair<std::string_view, ChatTemplate>, 4> kChatTemplates{{
    {"plain", ChatTemplate::Plain},
    {"llama2", ChatTemplate::Llama2},
    {"zephyr", ChatTemplate::Zephyr},
    {"auto", ChatTemplate::Auto},
}};

}  // namespace troupe
