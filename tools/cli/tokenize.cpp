// `specdec tokenize` and `specdec detokenize`.
#include <iostream>
#include <optional>

#include "cli.hpp"

using nlohmann::json;

namespace specdec::cli {

int run_tokenize(const TokenizeOptions& o) {
  const auto tok = load_tokenizer(o.dir);
  const std::string text = o.text_given ? o.text : read_stdin("--text");
  std::optional<std::string> rendered;  // --chat: the prompt the template makes of the text
  if (o.chat) {
    require_utf8_in(text, o.text_given ? "--text" : "the text (stdin)");
    require_utf8_in(o.system, "--system");
    const ChatTemplate t = chat_template(o, o.dir, o.dir);  // as generate --chat finds it
    end_of_turn_token(t, *tok);  // warns about a template made for another model
    rendered = t.render(one_turn(o.system_message(), text), true);
  } else if (o.system_given || !o.chat_template.empty()) {
    throw Error("--system and --chat-template go with --chat");
  }
  const std::vector<int64_t> ids =
      rendered ? tok->encode(*rendered, false) : tok->encode(text, !o.no_special);
  if (o.json_out) {
    json j{{"ids", ids}};
    if (rendered) j["text"] = *rendered;
    std::cout << j.dump() << "\n";
  } else {
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? "," : "") << ids[i];
    std::cout << "\n";
  }
  return 0;
}

int run_detokenize(const TokenizeOptions& o) {
  const auto tok = load_tokenizer(o.dir);
  const std::vector<int64_t> ids = parse_ids(o.ids, "--ids", true);
  for (const int64_t id : ids)  // (decode shows an id past the tokenizer as nothing)
    SPECDEC_CHECK(tok->contains(id), "--ids: token id ", id, " is not in the tokenizer (",
                  tok->size(), " tokens)");
  const std::string text = tok->decode(ids, o.skip_special);
  if (o.json_out)
    std::cout << json{{"text", text}}.dump() << "\n";
  else
    std::cout << text << "\n";
  return 0;
}

}  // namespace specdec::cli
