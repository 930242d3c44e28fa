#pragma once
// A chat's messages rendered as one prompt, by the template the server was
// configured with (service/chat_template.h). Pure functions, unit-tested.
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "service/chat_template.h"

namespace troupe::openai {

// Tool messages (a call's result) are for Jinja templates only: the request
// parser refuses them for the built-in templates.
enum class ChatRole { System, User, Assistant, Tool };

struct ChatMessage {
  ChatMessage(ChatRole r = ChatRole::User, std::string text = {})
      : role(r), content(std::move(text)) {}

  ChatRole role = ChatRole::User;
  std::string content;  // the text parts, joined by "\n"
  // An assistant's tool calls, OpenAI's shape with each call's arguments as
  // an object (as transformers' templates read them), in the client's key
  // order; null for none. (Its content may be null: then "", as vLLM has it.)
  nlohmann::ordered_json tool_calls;
  std::string tool_call_id;  // a tool message: the call it answers
  std::string name;          // a tool message: the function's name, when given
  // An assistant's reasoning, given back (a Jinja template's
  // message.reasoning_content; undefined there when absent).
  std::optional<std::string> reasoning_content;
  bool operator==(const ChatMessage&) const = default;
};

// The prompt text, ending where the assistant's next turn begins, so that
// the model's completion is that turn:
// - plain: one "System: ", "User: " or "Assistant: " line per message, then
//   "Assistant:".
// - llama2: Meta's Llama 2 chat format. Each user turn is "[INST] ... [/INST]",
//   a system message goes first into the next one as "<<SYS>>\n...\n<</SYS>>\n\n",
//   an assistant turn follows as " ...", and one followed by another turn ends
//   with Meta's " </s><s>" (which the tokenizer reads as EOS, BOS: each turn
//   encoded as Meta's reference code does). The tokenizer adds the first BOS;
//   a last assistant turn stays open, to be continued.
// - zephyr: "<|system|>\n", "<|user|>\n" or "<|assistant|>\n", the content,
//   "</s>\n" (read as EOS) per message, then "<|assistant|>\n": TinyLlama-Chat's
//   and Zephyr's template as transformers renders it.
// - chatml: "<|im_start|>" role "\n" content "<|im_end|>\n" per message, then
//   "<|im_start|>assistant\n"; a chat without a system message starts with the
//   format's default_system, when it has one.
// - llama3: "<|begin_of_text|>", then "<|start_header_id|>" role
//   "<|end_header_id|>\n\n" content (trimmed) "<|eot_id|>" per message, then
//   the assistant's header; with a system_preamble, a system turn always comes
//   first: the preamble and the chat's first system message (trimmed).
// - mistral: "[INST] " user "[/INST]" and " " answer "</s>" (read as EOS), the
//   system message before the last user message with "\n\n" (v0.3); the
//   format's MistralSpelling gives v0.1's and v0.2's spaces and placement.
//   The tokenizer adds the BOS; the text ends with the last turn either way.
// - jinja: the format's template, interpreted as transformers renders it, with
//   `messages` (role and content; an assistant's tool_calls, a tool message's
//   tool_call_id and name), `add_generation_prompt`, `bos_token`,
//   `eos_token`, `tools` (the options', else none), `documents` (none),
//   strftime_now() and the options' template_kwargs.
// Without `generation_prompt` the text ends after the last message (plain
// leaves out the closing "Assistant:", zephyr the "<|assistant|>\n"; llama2's
// turns have no such marker). Auto (unresolved) renders as plain.
struct ChatOptions {
  bool generation_prompt = true;
  // vLLM's continue_final_message: the text ends right after the last
  // message's content (as transformers cuts it), for the model to continue it.
  bool continue_final_message = false;
  // vLLM's chat_template_kwargs: more variables for a Jinja template
  // (enable_thinking, ...): a JSON object, or null.
  nlohmann::json template_kwargs;
  // The tools a Jinja template lists for the model (OpenAI's shape), or null.
  nlohmann::ordered_json tools;
};

// A chat the template cannot render: its raise_exception() (the chat is not
// one it accepts), or a failure of the template itself. The message says which.
class ChatTemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string render_chat(const std::vector<ChatMessage>& messages, const ChatFormat& format,
                        const ChatOptions& options);
std::string render_chat(const std::vector<ChatMessage>& messages, const ChatFormat& format,
                        bool generation_prompt = true);

// A Jinja chat template, parsed and tried on a one-message chat, as a format
// to render with; throws ChatTemplateError naming what it could not parse or
// render.
ChatFormat jinja_chat_format(std::string_view source, std::string bos_token, std::string eos_token);

// Which of the templates above a model's own chat template (the Jinja text of
// tokenizer_config.json's "chat_template") is, by its markers, with the
// default system message or preamble it writes; nothing when it is none of
// them. `today` is the date a template that asks for the day's
// (strftime_now, Llama 3.2) gets, as "06 Dec 2026".
std::optional<ChatFormat> recognize_chat_template(std::string_view jinja,
                                                  const std::string& today = "26 Jul 2024");

}  // namespace troupe::openai
