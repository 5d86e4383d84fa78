// libFuzzer target: a GPT-2 style tokenizer folder, vocab.json and merges.txt (the input cut at its
// first NUL byte; no NUL: the whole input is vocab.json and merges.txt is empty). Every input loads
// or throws specdec::Error; a loaded tokenizer encodes and decodes a few strings.
#include "fuzz_util.hpp"
#include "specdec/specdec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz_split(data, size, 2);
  fuzz_put("vocab.json", parts[0]);
  fuzz_put("merges.txt", parts.size() > 1 ? parts[1] : "");
  try {
    const auto tok = specdec::load_tokenizer(fuzz_dir());
    for (const char* text : {"Hello world", " the hell\n\t é", "<|endoftext|>x"}) {
      const auto ids = tok->encode(text, true);
      (void)tok->decode(ids, false);
    }
  } catch (const specdec::Error&) {
  }
  return 0;
}
