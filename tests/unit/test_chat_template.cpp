// Chat messages rendered into one prompt by each configured template.
#include <gtest/gtest.h>

#include "net/chat_template.h"

namespace troupe::openai {
namespace {

const std::vector<ChatMessage> kConversation = {
    {ChatRole::System, "Be brief."},
    {ChatRole::User, "Hello"},
    {ChatRole::Assistant, "Hi."},
    {ChatRole::User, "Tell me a fortune"},
};

TEST(ChatTemplate, PlainIsOneLinePerMessageThenTheAssistantsTurn) {
  EXPECT_EQ(render_chat(kConversation, ChatTemplate::Plain),
            "System: Be brief.\nUser: Hello\nAssistant: Hi.\nUser: Tell me a fortune\nAssistant:");
  EXPECT_EQ(render_chat({{ChatRole::User, "A fool"}}, ChatTemplate::Plain),
            "User: A fool\nAssistant:");
}

TEST(ChatTemplate, WithoutTheGenerationPromptTheTextEndsAfterTheLastMessage) {
  EXPECT_EQ(render_chat(kConversation, ChatTemplate::Plain, false),
            "System: Be brief.\nUser: Hello\nAssistant: Hi.\nUser: Tell me a fortune\n");
  EXPECT_EQ(render_chat(kConversation, ChatTemplate::Llama2, false),
            render_chat(kConversation, ChatTemplate::Llama2));
}

TEST(ChatTemplate, PlainKeepsMultiLineContentAsItIs) {
  EXPECT_EQ(render_chat({{ChatRole::User, "one\ntwo"}}, ChatTemplate::Plain),
            "User: one\ntwo\nAssistant:");
}

TEST(ChatTemplate, Llama2PutsTheSystemPromptInTheFirstInstruction) {
  EXPECT_EQ(render_chat(kConversation, ChatTemplate::Llama2),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHello [/INST] Hi. </s><s>[INST] Tell me a "
            "fortune [/INST]");
  EXPECT_EQ(render_chat({{ChatRole::User, "A fool"}}, ChatTemplate::Llama2),
            "[INST] A fool [/INST]");
}

TEST(ChatTemplate, Llama2SystemWithoutAUserTurnStillGetsAnInstruction) {
  EXPECT_EQ(render_chat({{ChatRole::System, "Rules"}}, ChatTemplate::Llama2),
            "[INST] <<SYS>>\nRules\n<</SYS>>\n\n [/INST]");
}

TEST(ChatTemplate, Llama2AssistantFirstHasNoLeadingSpace) {
  EXPECT_EQ(
      render_chat({{ChatRole::Assistant, "Hi."}, {ChatRole::User, "Go on"}}, ChatTemplate::Llama2),
      "Hi. </s><s>[INST] Go on [/INST]");
  EXPECT_EQ(
      render_chat({{ChatRole::User, "Go"}, {ChatRole::Assistant, "Gone"}}, ChatTemplate::Llama2),
      "[INST] Go [/INST] Gone")
      << "a last assistant turn stays open";
}

TEST(ChatTemplate, ZephyrEndsEachMessageWithEosAndOpensTheAssistantsTurn) {
  EXPECT_EQ(render_chat(kConversation, ChatTemplate::Zephyr),
            "<|system|>\nBe brief.</s>\n<|user|>\nHello</s>\n<|assistant|>\nHi.</s>\n<|user|>\n"
            "Tell me a fortune</s>\n<|assistant|>\n");
  EXPECT_EQ(render_chat({{ChatRole::User, "A fool"}}, ChatTemplate::Zephyr, false),
            "<|user|>\nA fool</s>\n");
}

// What `auto` reads in a model's tokenizer_config.json: the templates'
// markers, as their published Jinja writes them.
TEST(ChatTemplate, ModelTemplatesAreRecognizedByTheirMarkers) {
  EXPECT_EQ(recognize_chat_template(
                "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ "
                "'<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == "
                "'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}"),
            ChatTemplate::Zephyr);
  EXPECT_EQ(recognize_chat_template("{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }} "
                                    "{% set content = '<<SYS>>\n' + system + '\n<</SYS>>' %}"),
            ChatTemplate::Llama2);
  EXPECT_EQ(recognize_chat_template("{{'<|im_start|>' + message['role'] + '\n' + "
                                    "message['content'] + '<|im_end|>' + '\n'}}"),
            ChatTemplate::ChatML);
  EXPECT_FALSE(recognize_chat_template("{{ message['content'] }}"));
  EXPECT_FALSE(recognize_chat_template(""));
}

TEST(ChatTemplate, ChatMLWithTheModelsDefaultSystemMessage) {
  EXPECT_EQ(render_chat(kConversation, ChatTemplate::ChatML),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
            "<|im_start|>assistant\nHi.<|im_end|>\n<|im_start|>user\nTell me a "
            "fortune<|im_end|>\n<|im_start|>assistant\n");
  // Qwen2.5's template, as published: its literal system message is the
  // default; the one built from messages[0] is not.
  const std::string qwen25 =
      "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == "
      "'system' %}\n        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are "
      "Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n"
      "{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- "
      "'<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else "
      "%}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
      "helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{{- "
      "'<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}";
  const auto format = recognize_chat_template(qwen25);
  ASSERT_TRUE(format);
  EXPECT_EQ(format->kind, ChatTemplate::ChatML);
  EXPECT_EQ(format->default_system,
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  EXPECT_EQ(render_chat({{ChatRole::User, "Hi"}}, *format),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_chat({{ChatRole::System, "S"}, {ChatRole::User, "Hi"}}, *format, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, Llama3TrimsEachMessageAndOpensTheAssistantsHeader) {
  EXPECT_EQ(render_chat({{ChatRole::System, " Be brief. "}, {ChatRole::User, "Hello\n"}},
                        ChatTemplate::Llama3),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe "
            "brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render_chat({{ChatRole::User, "Hi"}}, ChatTemplate::Llama3, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

TEST(ChatTemplate, Llama31AlwaysOpensWithItsDatedSystemTurn) {
  const std::string llama31 =
      "{{- bos_token }}\n{%- if not date_string is defined %}\n    {%- set date_string = \"26 "
      "Jul 2024\" %}\n{%- endif %}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" "
      "}}\n{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + "
      "date_string + \"\\n\\n\" }}\n{{- system_message }}\n{{- \"<|eot_id|>\" }}";
  const auto format = recognize_chat_template(llama31, "06 Dec 2026");
  ASSERT_TRUE(format);
  EXPECT_EQ(format->kind, ChatTemplate::Llama3);
  EXPECT_EQ(render_chat({{ChatRole::User, "Hi"}}, *format, false),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
            "Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user"
            "<|end_header_id|>\n\nHi<|eot_id|>");
  EXPECT_EQ(render_chat({{ChatRole::System, "Rules "}, {ChatRole::User, "Hi"}}, *format, false),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
            "Date: December 2023\nToday Date: 26 Jul 2024\n\nRules<|eot_id|><|start_header_id|>"
            "user<|end_header_id|>\n\nHi<|eot_id|>");
  // Llama 3.2 asks for the day's date.
  const auto dated = recognize_chat_template(
      llama31 +
          "{%- if strftime_now is defined %}{%- set date_string = strftime_now(\"%d %b "
          "%Y\") %}{%- endif %}",
      "06 Dec 2026");
  ASSERT_TRUE(dated);
  EXPECT_NE(dated->system_preamble.find("Today Date: 06 Dec 2026\n\n"), std::string::npos);
}

// Mistral Instruct's templates, as published for v0.3 and (updated) v0.1 and
// v0.2, and the first v0.1 one: the spacing and the system message's place
// are read from the template's literals.
TEST(ChatTemplate, MistralVersionsAsTheirTemplatesSpellThem) {
  const std::string v03 =
      "{%- if messages[0][\"role\"] == \"system\" %}\n    {%- set system_message = "
      "messages[0][\"content\"] %}\n{%- endif %}\n{{- bos_token }}\n{%- for message in "
      "loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n        {%- if loop.last "
      "and system_message is defined %}\n            {{- \"[INST] \" + system_message + "
      "\"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n        {%- else %}\n            "
      "{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}\n    {%- "
      "elif message[\"role\"] == \"assistant\" %}\n        {{- \" \" + "
      "message[\"content\"]|trim + eos_token}}\n    {%- endif %}\n{%- endfor %}\n";
  const auto f3 = recognize_chat_template(v03);
  ASSERT_TRUE(f3);
  EXPECT_EQ(f3->kind, ChatTemplate::Mistral);
  EXPECT_EQ(render_chat(kConversation, *f3),
            "[INST] Hello[/INST] Hi.</s>[INST] Be brief.\n\nTell me a fortune[/INST]");
  EXPECT_EQ(render_chat(kConversation, ChatTemplate::Mistral), render_chat(kConversation, *f3))
      << "v0.3's is the default spelling";

  const std::string v01 =
      "{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message['role'] == "
      "'user' %}\n        {%- if loop.first and system_message is defined %}\n            {{- "
      "' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n        "
      "{%- else %}\n            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n        "
      "{%- endif %}\n    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + "
      "message['content'] + eos_token}}\n    {%- endif %}\n{%- endfor %}\n";
  const auto f1 = recognize_chat_template(v01);
  ASSERT_TRUE(f1);
  EXPECT_EQ(render_chat(kConversation, *f1),
            " [INST] Be brief.\n\nHello [/INST] Hi.</s> [INST] Tell me a fortune [/INST]");

  const std::string first =
      "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] "
      "' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
      "message['content'] + eos_token + ' ' }}{% endif %}{% endfor %}";
  const auto f0 = recognize_chat_template(first);
  ASSERT_TRUE(f0);
  EXPECT_EQ(
      render_chat({{ChatRole::User, "Hi"}, {ChatRole::Assistant, " Yo "}, {ChatRole::User, "Go"}},
                  *f0),
      "[INST] Hi [/INST] Yo </s> [INST] Go [/INST]");
}

TEST(ChatTemplate, EveryConfiguredNameRenders) {
  for (const auto& [name, tmpl] : kChatTemplates)
    EXPECT_FALSE(render_chat(kConversation, tmpl).empty()) << name;
}

TEST(ChatTemplate, AJinjaTemplateRendersWithTheModelsSpecialTokensAndTheRequestsSwitches) {
  const ChatFormat f = jinja_chat_format(
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}"
      "{% endfor %}{% if add_generation_prompt %}<assistant>{% if think is defined and not think "
      "%}<nothink>{% endif %}{% endif %}",
      "<s>", "</s>");
  EXPECT_EQ(f.kind, ChatTemplate::Jinja);
  EXPECT_EQ(render_chat(kConversation, f),
            "<s><system>Be brief.</s><user>Hello</s><assistant>Hi.</s><user>Tell me a "
            "fortune</s><assistant>");
  ChatOptions o;
  o.template_kwargs = {{"think", false}};
  EXPECT_EQ(render_chat({{ChatRole::User, "A"}}, f, o), "<s><user>A</s><assistant><nothink>");
  o.generation_prompt = false;
  EXPECT_EQ(render_chat({{ChatRole::User, "A"}}, f, o), "<s><user>A</s>");
}

TEST(ChatTemplate, ContinuingTheFinalMessageCutsTheTextAfterIt) {
  ChatOptions o;
  o.generation_prompt = false;
  o.continue_final_message = true;
  const std::vector<ChatMessage> begun = {{ChatRole::User, "Hello"},
                                          {ChatRole::Assistant, "Well, "}};
  EXPECT_EQ(render_chat(begun, ChatTemplate::ChatML, o),
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nWell, ");
  // A template that trims the content is cut after the trimmed text.
  EXPECT_EQ(render_chat(begun, ChatTemplate::Llama3, o),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nWell,");
  o.generation_prompt = true;
  EXPECT_THROW(render_chat(begun, ChatTemplate::ChatML, o), ChatTemplateError);
}

TEST(ChatTemplate, WhatAJinjaTemplateRefusesOrCannotDoIsAChatTemplateError) {
  const ChatFormat f = jinja_chat_format(
      "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
      "{% endif %}{{ messages[0].content }}",
      "", "");
  try {
    render_chat(kConversation, f);
    FAIL() << "no error";
  } catch (const ChatTemplateError& e) {
    EXPECT_STREQ(e.what(),
                 "The model's chat template refused this chat: System role not supported");
  }
  // Parsing, and a first render of a one-message chat, happen when the format is made.
  EXPECT_THROW(jinja_chat_format("{% if %}", "", ""), ChatTemplateError);
  EXPECT_THROW(jinja_chat_format("{{ messages | nosuchfilter }}", "", ""), ChatTemplateError);
  EXPECT_THROW(jinja_chat_format("{{ raise_exception('never') }}", "", ""), ChatTemplateError);
}

}  // namespace
}  // namespace troupe::openai
