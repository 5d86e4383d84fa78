// Chat templates: recognition from template text, rendering of each family (expected strings
// worked out by hand from each family's reference Jinja template), errors.
#include <gtest/gtest.h>

#include <fstream>

#include "specdec/chat.hpp"
#include "specdec/error.hpp"
#include "test_util.hpp"

using namespace specdec;

namespace {
const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", "Hi!"}, {"assistant", "Hello."}, {"user", " Why? "}};
}

TEST(Chat, ChatMLWithAndWithoutDefaultSystem) {
  // SmolLM2's template (real newlines) and Qwen2's (escaped \n inside a Jinja string).
  const std::string smol =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
      "'<|im_start|>system\nYou are SmolLM<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + "
      "message['role'] + "
      "'\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}";
  const std::string qwen =
      "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}<|im_start|>";
  const std::string plain =
      "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content']}}";
  EXPECT_EQ(ChatTemplate::recognise(smol, "t").default_system(), "You are SmolLM");
  EXPECT_EQ(ChatTemplate::recognise(qwen, "t").default_system(), "You are a helpful assistant.");
  EXPECT_EQ(ChatTemplate::recognise(plain, "t").default_system(), "");
  const ChatTemplate t = ChatTemplate::recognise(smol, "t");
  EXPECT_EQ(t.render({{"user", "Hi!"}}, true),
            "<|im_start|>system\nYou are "
            "SmolLM<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.render(kConversation, false),
            "<|im_start|>system\nBe "
            "brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
            "Hello.<|im_end|>\n<|im_start|>user\n Why? <|im_end|>\n");
  EXPECT_EQ(t.end_of_turn(), "<|im_end|>");
}

// Qwen3's template (a ChatML template mentioning </think>): earlier assistant turns are rendered
// without their reasoning; one after the last user turn keeps it. Expected strings worked out by
// hand from the template's Jinja: content = text after the last "</think>" without leading
// newlines, reasoning = between "<think>" and the first "</think>" without surrounding newlines.
TEST(Chat, Qwen3DropsEarlierReasoning) {
  const std::string tmpl =
      "{%- if '</think>' in message.content %}<|im_start|>{{ '<think>\\n\\n</think>' }}";
  const ChatTemplate t = ChatTemplate::recognise(tmpl, "t");
  EXPECT_EQ(t.name(), "qwen3");
  EXPECT_EQ(t.end_of_turn(), "<|im_end|>");
  const std::vector<ChatMessage> chat = {
      {"user", "2+2?"}, {"assistant", "<think>\nadd them\n</think>\n\n4"}, {"user", "and 3+3?"}};
  EXPECT_EQ(t.render(chat, true),
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\nand 3+3?<|im_end|>\n<|im_start|>assistant\n");
  // The last turn, after the last user turn: reasoning kept (empty when there was none).
  EXPECT_EQ(t.render({{"user", "hi"}, {"assistant", "<think>\n\nwave\n</think>hello"}}, false),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nwave\n</think>\n\n"
            "hello<|im_end|>\n");
  EXPECT_EQ(t.render({{"user", "hi"}, {"assistant", "hello"}}, false),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
            "hello<|im_end|>\n");
  // Plain ChatML keeps every turn as written.
  EXPECT_EQ(
      ChatTemplate::by_name("chatml").render(chat, false).find("add them") != std::string::npos,
      true);
}

// Gemma's template: <bos>, the system message as the first paragraph of the first user turn,
// contents trimmed, the assistant as "model".
TEST(Chat, Gemma) {
  const ChatTemplate t =
      ChatTemplate::recognise("{{ bos_token }}{{ '<start_of_turn>' + role + '\\n' }}", "t");
  EXPECT_EQ(t.name(), "gemma");
  EXPECT_EQ(t.end_of_turn(), "<end_of_turn>");
  EXPECT_EQ(t.render(kConversation, true),
            "<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\n"
            "Hello.<end_of_turn>\n<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(t.render({{"user", "Hi"}}, false), "<bos><start_of_turn>user\nHi<end_of_turn>\n");
  EXPECT_THROW(t.render({{"assistant", "x"}}, true), Error);  // roles must alternate from user
  // Jinja's trim is Python's str.strip(): Unicode whitespace goes too (U+3000, U+00A0, U+2003,
  // U+001F), a zero-width space (U+200B) and a lone "\u2581" stay.
  EXPECT_EQ(t.render({{"user", "\u3000\u00a0 Hi\u2003\x1f\n"}}, false),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n");
  EXPECT_EQ(t.render({{"user", "\u200bHi\u2581"}}, false),
            "<bos><start_of_turn>user\n\u200bHi\u2581<end_of_turn>\n");
}

// Content as text parts: Gemma 3's template renders `item['text'] | trim` for each part, and a
// system message's first part (`messages[0]['content'][0]['text']`) as it is; the templates that
// take a string get the parts joined by line breaks, as vLLM joins them.
TEST(Chat, ContentPartsAsEachFamilysTemplateRendersThem) {
  const ChatTemplate gemma = ChatTemplate::by_name("gemma");
  EXPECT_EQ(gemma.join_parts("user", {" part one ", "part two\n"}), "part onepart two");
  EXPECT_EQ(gemma.join_parts("system", {" Be brief. ", "ignored"}), " Be brief. ");
  EXPECT_EQ(gemma.render({{"system", gemma.join_parts("system", {"Be brief.", "x"})},
                          {"user", gemma.join_parts("user", {" a ", " b"})}},
                         true),
            "<bos><start_of_turn>user\nBe brief.\n\nab<end_of_turn>\n<start_of_turn>model\n");
  const ChatTemplate chatml = ChatTemplate::by_name("chatml");
  EXPECT_EQ(chatml.join_parts("user", {" part one ", "part two"}), " part one \npart two");
  EXPECT_EQ(chatml.join_parts("system", {"a"}), "a");
  EXPECT_EQ(chatml.join_parts("user", {}), "");
}

TEST(Chat, Llama3) {
  const ChatTemplate t = ChatTemplate::recognise("{{ bos_token }}<|start_header_id|>...", "t");
  EXPECT_EQ(t.name(), "llama3");
  EXPECT_EQ(t.render(kConversation, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWhy?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(t.end_of_turn(), "<|eot_id|>");
}

TEST(Chat, Llama2AndMistral) {
  const ChatTemplate l2 = ChatTemplate::recognise("... '[INST] ' ... '<<SYS>>\\n' ...", "t");
  EXPECT_EQ(l2.name(), "llama2");
  EXPECT_EQ(
      l2.render(kConversation, true),
      "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST] Hello. </s><s>[INST] Why? [/INST]");
  const ChatTemplate mi = ChatTemplate::recognise("{{ bos_token }}... '[INST] ' ...", "t");
  EXPECT_EQ(mi.name(), "mistral");
  EXPECT_EQ(mi.render(kConversation, true),
            "<s>[INST] Be brief.\n\nHi! [/INST]Hello.</s>[INST]  Why?  [/INST]");
  EXPECT_THROW(l2.render({{"assistant", "x"}}, true), Error);  // must start with the user
  EXPECT_EQ(l2.end_of_turn(), "</s>");
}

TEST(Chat, ErrorsNameWhatWasFound) {
  try {
    ChatTemplate::recognise("{% for m in messages %}### Human: {{ m.content }}", "model.gguf");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("model.gguf: unrecognised chat template"), std::string::npos) << w;
    EXPECT_NE(w.find("### Human"), std::string::npos) << w;
    EXPECT_NE(w.find("name one of the formats instead (chatml, qwen3,"), std::string::npos) << w;
    EXPECT_EQ(w.find("--"), std::string::npos) << w;  // (a library's error names no flag)
  }
  EXPECT_THROW(ChatTemplate::by_name("vicuna"), Error);
  EXPECT_THROW(read_chat_template("/nonexistent/model.gguf"), Error);  // (not "ships none")
  // A named list whose entry has a name of another type: specdec::Error, not nlohmann's.
  const std::string dir = test::temp_dir("chat_template_list");
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"chat_template": [{"name": 5, "template": "x"}, {"name": "default", "template": "y"}]})";
  EXPECT_EQ(read_chat_template(dir).value_or(""), "y");
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"chat_template": [{"name": 5, "template": "x"}]})";
  EXPECT_THROW(read_chat_template(dir), Error);
  EXPECT_EQ(ChatTemplate::by_name("llama3").name(), "llama3");
  EXPECT_THROW(ChatTemplate::by_name("chatml").render({{"robot", "x"}}, true), Error);
}
