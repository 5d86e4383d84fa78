// libFuzzer target: config.json text, then (after a NUL byte in the input, if any)
// generation_config.json text applied over it. Every input parses or throws specdec::Error.
#include <string>

#include "specdec/specdec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  const size_t cut = all.find('\0');
  try {
    specdec::ModelConfig c =
        specdec::ModelConfig::from_json_text(all.substr(0, cut), "config.json");
    if (cut != std::string::npos) {
      c.apply_generation_config_text(all.substr(cut + 1), "generation_config.json");
      c.validate("generation_config.json");
    }
  } catch (const specdec::Error&) {
  }
  return 0;
}
