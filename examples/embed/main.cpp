// Minimal embedding of specdec: load a checkpoint (and optionally a draft), generate 8 tokens.
// Usage: embed TARGET_DIR [DRAFT_DIR]
#include <iostream>

#include <specdec/specdec.hpp>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: embed TARGET_DIR [DRAFT_DIR]\n";
    return 2;
  }
  try {
    auto target = specdec::load_model(argv[1]);
    auto draft = argc > 2 ? specdec::load_model(argv[2]) : nullptr;
    specdec::Generator generator(target, draft);
    specdec::GenerationConfig config;
    config.max_new_tokens = 8;
    config.eos_token_ids = {-1};  // never stop early: always 8 tokens
    const auto result = generator.generate({1, 2, 3}, config, [](const std::vector<int64_t>& t) {
      for (int64_t id : t) std::cout << id << ' ';
      std::cout << std::flush;
    });
    std::cout << "\ngenerated " << result.tokens.size() << " tokens in "
              << result.stats.target_passes << " target passes\n";
  } catch (const specdec::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
