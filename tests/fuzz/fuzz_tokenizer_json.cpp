// libFuzzer target: tokenizer.json (byte-level BPE). Every input loads or throws specdec::Error; a
// loaded tokenizer encodes and decodes a few strings.
#include "fuzz_util.hpp"
#include "specdec/specdec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz_input_file(data, size, "tokenizer.json");
  if (path.empty()) return 0;
  try {
    const auto tok = specdec::load_tokenizer_file(path);
    for (const char* text : {"Hello world", " 12 ab\n\tcd é", "<|endoftext|>x"}) {
      const auto ids = tok->encode(text, true);
      (void)tok->decode(ids, false);
    }
  } catch (const specdec::Error&) {
  }
  return 0;
}
