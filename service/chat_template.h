#pragma once
// How a chat's messages become one prompt for a model that has no chat
// template of its own (the bundled ones are base models): the server's
// `server.chat_template`. The names here are the configuration's; the
// rendering is net/chat_template.h.
#include <array>
#include <string_view>
#include <utility>

namespace troupe {

enum class ChatTemplate {
  Plain,   // "System: ...\nUser: ...\nAssistant:"
  Llama2,  // "[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST]"
};

inline constexpr std::array<std::pair<std::string_view, ChatTemplate>, 2> kChatTemplates{{
    {"plain", ChatTemplate::Plain},
    {"llama2", ChatTemplate::Llama2},
}};

}  // namespace troupe
