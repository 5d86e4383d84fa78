// Minimal embedding of specdec: load a checkpoint (and optionally a draft), generate 8 tokens from
// "Hello" (ids 1,2,3 when the checkpoint has no tokenizer), print them as text or ids.
// Usage: embed TARGET_DIR [DRAFT_DIR]
#include <exception>
#include <iostream>
#include <string>

#include <specdec/specdec.hpp>

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || argv[1][0] == '-') {  // -h, --help included
    std::cerr << "usage: embed TARGET_DIR [DRAFT_DIR]\n";
    return argc == 2 && (std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") ? 0 : 2;
  }
  try {
    auto target = specdec::load_model(argv[1]);
    auto draft = argc > 2 ? specdec::load_model(argv[2]) : nullptr;
    specdec::Generator generator(target, draft);
    specdec::GenerationConfig config;
    config.max_new_tokens = 8;
    config.eos_token_ids = {-1};  // never stop early: always 8 tokens
    std::unique_ptr<specdec::Tokenizer> tok;
    if (specdec::has_tokenizer(argv[1])) tok = specdec::load_tokenizer(argv[1]);
    const std::vector<int64_t> prompt =
        tok ? tok->encode("Hello", true) : std::vector<int64_t>{1, 2, 3};
    std::cout << "prompt ids:";
    for (int64_t id : prompt) std::cout << ' ' << id;
    std::cout << "\n";
    std::unique_ptr<specdec::StreamDecoder> text;
    if (tok) text = std::make_unique<specdec::StreamDecoder>(*tok, true);
    const auto result = generator.generate(prompt, config, [&](const std::vector<int64_t>& t) {
      if (text)
        std::cout << text->push(t);
      else
        for (int64_t id : t) std::cout << id << ' ';
      std::cout << std::flush;
    });
    if (text) std::cout << text->finish();
    std::cout << "\ngenerated " << result.tokens.size() << " tokens in "
              << result.stats.target_passes << " target passes\n";
  } catch (const std::exception& e) {  // specdec::Error, and std::bad_alloc when memory runs out
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
