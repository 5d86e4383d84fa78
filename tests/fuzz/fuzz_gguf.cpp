// libFuzzer target: GGUF files. Every input parses, or throws specdec::Error; anything else (a
// crash, another exception, a sanitizer report, a huge allocation) is a finding. A parsed file is
// also read as a model configuration and a tokenizer (byte-level BPE), and its small tensors are
// dequantized.
#include <vector>

#include "fuzz_util.hpp"
#include "specdec/specdec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz_input_file(data, size, "model.gguf");
  if (path.empty()) return 0;
  try {
    const specdec::GgufFile file(path);
    for (const auto& [name, t] : file.tensors()) {
      if (t.numel > (1 << 20)) continue;  // the reader checked its bytes; keep iterations fast
      std::vector<float> out(static_cast<size_t>(t.numel));
      specdec::ggml_dequantize(t.type, file.data(t), out.data(), t.numel);
    }
    try {
      (void)specdec::ModelConfig::from_gguf(file);
    } catch (const specdec::Error&) {
    }
    // SentencePiece vocabularies go through the dlopen'd shim, which needs RTLD_DEEPBIND; the
    // sanitizer runtimes refuse that flag, so only byte-level BPE vocabularies are fuzzed here.
    if (file.find_string("tokenizer.ggml.model").value_or("") != "llama")
      (void)specdec::load_tokenizer(path);
  } catch (const specdec::Error&) {
  }
  return 0;
}
