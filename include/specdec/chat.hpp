// Chat templates: turning a list of messages into the prompt text a chat model was trained on.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace specdec {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// One of the chat formats specdec renders natively (no Jinja): recognised from a model's template
// text, or chosen by name. Rendering follows what Hugging Face's `apply_chat_template` produces for
// the reference templates of each family.
class ChatTemplate {
 public:
  enum class Kind {
    kChatML,   // <|im_start|>role\ncontent<|im_end|>\n (SmolLM2, Qwen2)
    kQwen3,    // ChatML whose earlier assistant turns lose their <think>...</think> reasoning
    kLlama3,   // <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
    kLlama2,   // <s>[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] answer </s>
    kMistral,  // <s>[INST] system\n\nuser [/INST] answer</s> (no <<SYS>> block)
    kGemma,    // <bos><start_of_turn>user\nsystem\n\nuser<end_of_turn>\n<start_of_turn>model\n
  };

  // "chatml", "qwen3", "llama3", "llama2", "mistral", "gemma"; throws specdec::Error listing them
  // otherwise.
  static ChatTemplate by_name(const std::string& name);
  // Recognises the family from a Jinja template's text (`source` names where it came from). ChatML
  // templates that insert a default system turn when the conversation has none (SmolLM2's, Qwen2's)
  // keep that text. Throws specdec::Error naming what was found when no family matches.
  static ChatTemplate recognise(const std::string& template_text, const std::string& source);
  // The names by_name accepts.
  static const std::vector<std::string>& names();

  Kind kind() const { return kind_; }
  std::string name() const;
  // The system prompt inserted when the messages have none ("" = none).
  const std::string& default_system() const { return default_system_; }
  // The prompt text; with `add_generation_prompt`, ends with the header of the assistant's turn.
  // Encode it with add_special_tokens = false (the text carries its own special tokens). Throws
  // specdec::Error for an unknown role or a role order the format cannot express.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  // A message's content given as text parts (OpenAI's [{"type": "text", "text": ...}, ...]) as
  // this family's reference template renders it: Gemma's joins the parts trimmed, and its system
  // message keeps the first part only; the other families' templates take a string, and the parts
  // are joined by line breaks, as vLLM joins them for such templates.
  std::string join_parts(const std::string& role, const std::vector<std::string>& parts) const;
  // The token text that ends an assistant turn ("<|im_end|>", "<|eot_id|>", "</s>",
  // "<end_of_turn>").
  std::string end_of_turn() const;

 private:
  Kind kind_ = Kind::kChatML;
  std::string default_system_;
};

// The chat template a model ships: `chat_template` of tokenizer_config.json in the folder, else
// `tokenizer.chat_template` of a GGUF file (the path, or a folder holding one), the order in which
// load_tokenizer reads the tokenizer itself. nullopt when neither
// has one (Gemma 3 270M's GGUF ships none: check before rendering); specdec::Error for a path that
// does not exist.
std::optional<std::string> read_chat_template(const std::string& path);

}  // namespace specdec
