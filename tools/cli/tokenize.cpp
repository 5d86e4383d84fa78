// `specdec tokenize` and `specdec detokenize`.
#include <iostream>

#include "cli.hpp"

using nlohmann::json;

namespace specdec::cli {

int run_tokenize(const TokenizeOptions& o) {
  const auto tok = load_tokenizer(o.dir);
  const std::vector<int64_t> ids =
      tok->encode(o.text.empty() ? read_stdin() : o.text, !o.no_special);
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
  const std::string text = tok->decode(parse_ids(o.ids, "--ids", true), o.skip_special);
  if (o.json_out)
    std::cout << json{{"text", text}}.dump() << "\n";
  else
    std::cout << text << "\n";
  return 0;
}

}  // namespace specdec::cli
