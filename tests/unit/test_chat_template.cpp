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

TEST(ChatTemplate, EveryConfiguredNameRenders) {
  for (const auto& [name, tmpl] : kChatTemplates)
    EXPECT_FALSE(render_chat(kConversation, tmpl).empty()) << name;
}

}  // namespace
}  // namespace troupe::openai
