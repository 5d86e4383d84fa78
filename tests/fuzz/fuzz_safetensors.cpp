// libFuzzer target: a model.safetensors file (header and data). Every input parses or throws
// specdec::Error; a parsed file's tensors are loaded.
#include "fuzz_util.hpp"
#include "specdec/specdec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz_input_file(data, size, "model.safetensors");
  if (path.empty()) return 0;
  try {
    const specdec::SafetensorsFile f(path);
    for (const auto& [name, info] : f.tensors())
      if (info.end - info.begin <= (1u << 22))
        (void)f.load(name, at::kFloat, c10::Device(c10::kCPU));
  } catch (const specdec::Error&) {
  }
  return 0;
}
