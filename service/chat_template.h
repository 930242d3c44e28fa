#pragma once
// How a chat's messages become one prompt: the server's
// `server.chat_template`. The names here are the configuration's; the
// rendering, and what `auto` picks from a model's tokenizer_config.json, is
// net/chat_template.h.
#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace troupe {

namespace jinja {
class Template;
}

enum class ChatTemplate {
  Plain,    // "System: ...\nUser: ...\nAssistant:"
  Llama2,   // "[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST]"
  Zephyr,   // "<|user|>\n...</s>\n<|assistant|>\n" (TinyLlama-Chat, Zephyr)
  ChatML,   // "<|im_start|>user\n...<|im_end|>\n" (Qwen2, SmolLM2, ...)
  Llama3,   // "<|start_header_id|>user<|end_header_id|>\n\n...<|eot_id|>"
  Mistral,  // "[INST] ...[/INST] ...</s>" (Mistral Instruct)
  Auto,     // the model's own (Jinja, interpreted); else the one of these it is; else plain
  Jinja,    // a Jinja template, interpreted: the model's own or a file (not a name)
};

inline constexpr std::array<std::pair<std::string_view, ChatTemplate>, 7> kChatTemplates{{
    {"plain", ChatTemplate::Plain},
    {"llama2", ChatTemplate::Llama2},
    {"zephyr", ChatTemplate::Zephyr},
    {"chatml", ChatTemplate::ChatML},
    {"llama3", ChatTemplate::Llama3},
    {"mistral", ChatTemplate::Mistral},
    {"auto", ChatTemplate::Auto},
}};

// How a model writes the tool calls its template asks for (vLLM's tool-call
// parsers of the same names): Hermes' "<tool_call>{json}</tool_call>" (Qwen2.5,
// Qwen3, Hermes, SmolLM3), or Llama 3.1's bare JSON objects, "; "-separated.
// Forced: the answer is the JSON array a forced tool call (tool_choice
// "required" or a named function) is generated as under its grammar:
// [{"name": ..., "parameters": {...}}, ...], as vLLM generates it.
// ForcedNamed: the same for a named function, whose answer ends as any
// other (finish_reason "stop", not "tool_calls": OpenAI's and vLLM's).
// Mistral: "[TOOL_CALLS]" then a JSON array of {"name", "arguments"} (Mistral
// 7B v0.3, Nemo) or, from Mistral's v11 tokenizers on (Small 3.x, Devstral),
// "[TOOL_CALLS]name[ARGS]{json}" per call; its call ids are 9 letters and
// digits, as Mistral's templates demand of a history's.
enum class ToolCallFormat { None, Hermes, Llama3Json, Forced, ForcedNamed, Mistral };

inline bool is_forced(ToolCallFormat f) {
  return f == ToolCallFormat::Forced || f == ToolCallFormat::ForcedNamed;
}

// How a model's answer separates its reasoning from its reply (vLLM's
// --reasoning-parser of the same names): the text between "<think>" and
// "</think>" is reasoning (message.reasoning_content), the rest content.
// deepseek_r1: the answer starts in reasoning, "<think>" written or not
// (DeepSeek R1's template opens it in the prompt). qwen3: only an answer
// that opens "<think>" (or whose prompt the template ended with one) has
// reasoning.
enum class ReasoningParser { None, DeepSeekR1, Qwen3 };

inline constexpr std::array<std::pair<std::string_view, ReasoningParser>, 3> kReasoningParsers{{
    {"none", ReasoningParser::None},
    {"deepseek_r1", ReasoningParser::DeepSeekR1},
    {"qwen3", ReasoningParser::Qwen3},
}};

// A template and what a model's own version of it adds to every chat.
struct ChatFormat {
  ChatTemplate kind = ChatTemplate::Plain;
  // The system message a chat without one gets (Qwen2.5's "You are Qwen,
  // ...", SmolLM2's), empty for none.
  std::string default_system;
  // llama3: a system turn always opens the chat, with this before the chat's
  // own system message (Llama 3.1's "Cutting Knowledge Date: ..."); empty for
  // Llama 3's template, which has a system turn only when the chat has one.
  std::string system_preamble;
  // mistral: how its version spells a turn. v0.3's by default; v0.1 and
  // v0.2 put spaces around "[INST]" and "[/INST]" and the system message in
  // the first user turn, not the last.
  struct MistralSpelling {
    std::string inst_open = "[INST] ", inst_close = "[/INST]";
    bool system_in_last_user = true;
    std::string before_answer = " ", after_answer;  // around an answer and its "</s>"
    bool trim_answer = true;
    bool operator==(const MistralSpelling&) const = default;
  } mistral;
  // jinja: the template, and the special tokens' text it is rendered with
  // (tokenizer_config.json's, as transformers passes them).
  std::shared_ptr<const jinja::Template> jinja;
  std::string bos_token, eos_token;
  // How the model's answers carry tool calls, read from its template.
  ToolCallFormat tool_calls = ToolCallFormat::None;
  // How its answers carry reasoning: the server's server.reasoning_parser.
  ReasoningParser reasoning = ReasoningParser::None;

  ChatFormat(ChatTemplate k = ChatTemplate::Plain) : kind(k) {}  // NOLINT: a template is a format
  bool operator==(const ChatFormat&) const = default;
};

}  // namespace troupe
