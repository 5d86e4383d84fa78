// Chat templates rendered natively, family by family, as Hugging Face's reference Jinja templates
// of each family render them (checked against apply_chat_template in the tests).
#include "specdec/chat.hpp"

#include <nlohmann/json.hpp>

#include "json.hpp"
#include "specdec/error.hpp"
#include "specdec/gguf.hpp"
#include "tokenizers/tokenizer_base.hpp"
#include "util.hpp"

namespace specdec {
namespace {

const std::pair<const char*, ChatTemplate::Kind> kNames[] = {
    {"chatml", ChatTemplate::Kind::kChatML},   {"qwen3", ChatTemplate::Kind::kQwen3},
    {"llama3", ChatTemplate::Kind::kLlama3},   {"llama2", ChatTemplate::Kind::kLlama2},
    {"mistral", ChatTemplate::Kind::kMistral}, {"gemma", ChatTemplate::Kind::kGemma},
};

// Jinja's trim, Python's str.strip(): Unicode whitespace (U+3000, U+00A0, ... too), what the
// Llama and Gemma templates apply to contents.
std::string strip(const std::string& s) { return tok::lstrip_ws(tok::rstrip_ws(s)); }

void check_role(const ChatMessage& m) {
  SPECDEC_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant",
                "chat: unknown role '", m.role, "' (expected system, user or assistant)");
}

// A ChatML template's built-in system prompt: the literal text of a
// '<|im_start|>system\n...<|im_end|>' string in the template, if it has one.
std::string chatml_default_system(const std::string& t) {
  for (const char* head : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
    for (size_t at = t.find(head); at != std::string::npos; at = t.find(head, at + 1)) {
      const size_t begin = at + std::string(head).size();
      const size_t end = t.find("<|im_end|>", begin);
      if (end == std::string::npos) continue;
      const std::string text = t.substr(begin, end - begin);
      if (text.find_first_of("'\"{}+") != std::string::npos)
        continue;  // an expression, not a literal
      std::string out;
      for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n')
          out += '\n', ++i;
        else
          out += text[i];
      }
      return out;
    }
  }
  return "";
}

// An assistant turn as Qwen3's template renders it: the reasoning of "<think>r</think>answer"
// dropped before the last user turn; after it, kept as "<think>\nr\n</think>\n\nanswer" when there
// is reasoning or the turn is the conversation's last.
std::string qwen3_turn(const std::string& text, bool after_last_query, bool last) {
  std::string content = text, reasoning;
  const size_t close = text.rfind("</think>");
  if (close != std::string::npos) {
    content = text.substr(close + 8);
    content.erase(0, content.find_first_not_of('\n') == std::string::npos
                         ? content.size()
                         : content.find_first_not_of('\n'));
    const std::string before = text.substr(0, text.find("</think>"));
    const size_t open = before.rfind("<think>");
    reasoning = open == std::string::npos ? before : before.substr(open + 7);
    const auto strip = [](std::string s) {
      const size_t b = s.find_first_not_of('\n');
      if (b == std::string::npos) return std::string();
      return s.substr(b, s.find_last_not_of('\n') - b + 1);
    };
    reasoning = strip(reasoning);
  }
  if (!after_last_query || (!last && reasoning.empty())) return content;
  const size_t b = content.find_first_not_of('\n');
  return "<think>\n" + reasoning + "\n</think>\n\n" +
         (b == std::string::npos ? std::string() : content.substr(b));
}

}  // namespace

const std::vector<std::string>& ChatTemplate::names() {
  static const std::vector<std::string> kList = [] {
    std::vector<std::string> v;
    for (const auto& entry : kNames) v.push_back(entry.first);
    return v;
  }();
  return kList;
}

ChatTemplate ChatTemplate::by_name(const std::string& name) {
  for (const auto& [n, kind] : kNames) {
    if (name == n) {
      ChatTemplate t;
      t.kind_ = kind;
      return t;
    }
  }
  throw Error("unknown chat template '" + name + "' (known: " + join(names()) + ")");
}

ChatTemplate ChatTemplate::recognise(const std::string& text, const std::string& source) {
  ChatTemplate t;
  if (text.find("<|im_start|>") != std::string::npos) {
    t.kind_ = text.find("</think>") != std::string::npos ? Kind::kQwen3 : Kind::kChatML;
    t.default_system_ = chatml_default_system(text);
  } else if (text.find("<|start_header_id|>") != std::string::npos) {
    t.kind_ = Kind::kLlama3;
  } else if (text.find("<start_of_turn>") != std::string::npos) {
    t.kind_ = Kind::kGemma;
  } else if (text.find("[INST]") != std::string::npos) {
    t.kind_ = text.find("<<SYS>>") != std::string::npos ? Kind::kLlama2 : Kind::kMistral;
  } else {
    std::string head = text.substr(0, 120);
    for (char& c : head)
      if (c == '\n') c = ' ';
    throw Error(
        source +
        ": unrecognised chat template (not ChatML, Qwen3, Llama 3, Llama 2, Mistral or Gemma): \"" +
        head + (text.size() > 120 ? "..." : "") + "\"; name one of the formats instead (" +
        join(names()) + ")");
  }
  return t;
}

std::string ChatTemplate::name() const {
  for (const auto& [n, kind] : kNames)
    if (kind == kind_) return n;
  return "?";
}

std::string ChatTemplate::end_of_turn() const {
  switch (kind_) {
    case Kind::kChatML:
    case Kind::kQwen3:
      return "<|im_end|>";
    case Kind::kLlama3:
      return "<|eot_id|>";
    case Kind::kGemma:
      return "<end_of_turn>";
    default:
      return "</s>";
  }
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
  for (const ChatMessage& m : messages) check_role(m);
  std::string out;
  switch (kind_) {
    case Kind::kChatML:
    case Kind::kQwen3: {
      if (!default_system_.empty() && (messages.empty() || messages[0].role != "system"))
        out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
      // Qwen3: assistant turns before the last user turn (the last turn when there is none) lose
      // their reasoning; those after it keep it.
      size_t last_query = messages.empty() ? 0 : messages.size() - 1;
      for (size_t i = messages.size(); i-- > 0;)
        if (messages[i].role == "user") {
          last_query = i;
          break;
        }
      for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        std::string content = m.content;
        if (kind_ == Kind::kQwen3 && m.role == "assistant")
          content = qwen3_turn(content, i > last_query, i + 1 == messages.size());
        out += "<|im_start|>" + m.role + "\n" + content + "<|im_end|>\n";
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    }
    case Kind::kLlama3: {
      for (size_t i = 0; i < messages.size(); ++i)
        out += std::string(i == 0 ? "<|begin_of_text|>" : "") + "<|start_header_id|>" +
               messages[i].role + "<|end_header_id|>\n\n" + strip(messages[i].content) +
               "<|eot_id|>";
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    }
    case Kind::kGemma:
    case Kind::kLlama2:
    case Kind::kMistral: {
      // All three alternate user/assistant after an optional system message, which goes into the
      // first user turn: Llama 2 in a <<SYS>> block, Mistral and Gemma as a first paragraph.
      size_t first = 0;
      std::string system;
      if (!messages.empty() && messages[0].role == "system")
        system = messages[0].content, first = 1;
      const bool llama2 = kind_ == Kind::kLlama2, gemma = kind_ == Kind::kGemma;
      out += gemma ? "<bos>" : llama2 ? "" : "<s>";
      for (size_t i = first; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        SPECDEC_CHECK(m.role != "system" && (m.role == "user") == ((i - first) % 2 == 0),
                      "chat: the ", name(),
                      " format needs roles alternating user/assistant/user/... after an optional "
                      "system message");
        if (gemma) {  // the system message opens the first user turn; the assistant is "model"
          out += "<start_of_turn>" + std::string(m.role == "user" ? "user" : "model") + "\n" +
                 (i == first && first == 1 ? system + "\n\n" : "") + strip(m.content) +
                 "<end_of_turn>\n";
          continue;
        }
        std::string content = m.content;
        if (i == first && first == 1)
          content = llama2 ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content
                           : system + "\n\n" + content;
        if (m.role == "user")
          out += (llama2 ? "<s>[INST] " + strip(content) : "[INST] " + content) + " [/INST]";
        else
          out += llama2 ? " " + strip(content) + " </s>" : content + "</s>";
      }
      if (gemma && add_generation_prompt) out += "<start_of_turn>model\n";
      return out;
    }
  }
  return out;
}

std::string ChatTemplate::join_parts(const std::string& role,
                                     const std::vector<std::string>& parts) const {
  std::string out;
  if (kind_ == Kind::kGemma) {
    if (role == "system") return parts.empty() ? "" : parts.front();
    for (const std::string& part : parts) out += strip(part);
    return out;
  }
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "\n" : "") + parts[i];
  return out;
}

std::optional<std::string> read_chat_template(const std::string& path) {
  SPECDEC_CHECK(path_exists(path), path, ": no such file or folder");
  std::string gguf;
  if (!file_exists(path + "/tokenizer_config.json") && find_gguf(path, &gguf))
    return GgufFile(gguf).find_string("tokenizer.chat_template");
  const std::string cfg = path + "/tokenizer_config.json";
  if (!file_exists(cfg)) return std::nullopt;
  nlohmann::json j;
  try {
    j = detail::parse_json_bounded(read_text_file(cfg), cfg);
  } catch (const nlohmann::json::exception& e) {
    throw Error(cfg + ": invalid JSON: " + detail::json_message(e));
  }
  if (!j.is_object() || !j.contains("chat_template") || j["chat_template"].is_null())
    return std::nullopt;
  const auto& t = j["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  // A list of named templates: the one named "default".
  if (t.is_array())
    for (const auto& e : t)
      if (e.is_object() && e.contains("name") && e["name"] == "default" && e.contains("template") &&
          e["template"].is_string())
        return e["template"].get<std::string>();
  throw Error(cfg + ": chat_template must be a string or a list with a 'default' entry");
}

}  // namespace specdec
