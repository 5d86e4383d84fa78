// libFuzzer target: tokenizer_config.json (before the input's first NUL byte) and
// special_tokens_map.json (after it, when there is one) beside the tiny byte-level BPE of
// tests/data/tiny_bpe. Every input loads or throws specdec::Error; a loaded tokenizer encodes and
// decodes a few strings, and a chat template in the file is read and recognised.
#include <fstream>
#include <sstream>

#include "fuzz_util.hpp"
#include "specdec/specdec.hpp"

namespace {
std::string read_source(const std::string& name) {
  std::ifstream in(std::string(SPECDEC_SOURCE_DIR) + "/tests/data/tiny_bpe/" + name,
                   std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool ready = [] {
    fuzz_put("vocab.json", read_source("vocab.json"));
    fuzz_put("merges.txt", read_source("merges.txt"));
    return true;
  }();
  (void)ready;
  const auto parts = fuzz_split(data, size, 2);
  fuzz_put("tokenizer_config.json", parts[0]);
  fuzz_put("special_tokens_map.json", parts.size() > 1 ? parts[1] : "", parts.size() > 1);
  try {
    const auto tok = specdec::load_tokenizer(fuzz_dir());
    for (const char* text : {"Hello world", " the hell\n\t é", "<|endoftext|>x"}) {
      const auto ids = tok->encode(text, true);
      (void)tok->decode(ids, false);
    }
  } catch (const specdec::Error&) {
  }
  try {
    if (const auto text = specdec::read_chat_template(fuzz_dir())) {
      const auto chat = specdec::ChatTemplate::recognise(*text, fuzz_dir());
      (void)chat.render({{"user", "Hi"}}, true);
    }
  } catch (const specdec::Error&) {
  }
  return 0;
}
