// `specdec tokenize` and `specdec detokenize`.
#include <iostream>

#include "cli.hpp"

using nlohmann::json;

namespace specdec::cli {

int run_tokenize(const TokenizeOptions& o) {
  const auto tok = load_tokenizer(o.dir);
  const std::vector<int64_t> ids =
      tok->encode(o.text_given ? o.text : read_stdin("--text"), !o.no_special);
  if (o.json_out) {
    std::cout << json{{"ids", ids}}.dump() << "\n";
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
