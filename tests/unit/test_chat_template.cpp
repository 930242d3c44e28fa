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
  EXPECT_FALSE(recognize_chat_template("{{'<|im_start|>' + message['role'] + '\n'}}"))
      << "ChatML is not one of ours";
  EXPECT_FALSE(recognize_chat_template(""));
}

TEST(ChatTemplate, EveryConfiguredNameRenders) {
  for (const auto& [name, tmpl] : kChatTemplates)
    EXPECT_FALSE(render_chat(kConversation, tmpl).empty()) << name;
}

}  // namespace
}  // namespace troupe::openai
