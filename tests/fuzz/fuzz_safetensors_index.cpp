// libFuzzer target: model.safetensors.index.json (a sharded checkpoint's weight map) beside two
// small valid shards, a.safetensors and b.safetensors
// (tests/fuzz/corpus/safetensors/small.safetensors). Every input opens or throws specdec::Error; an
// opened store's tensors are listed and loaded.
#include <fstream>
#include <sstream>

#include "fuzz_util.hpp"
#include "specdec/specdec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool ready = [] {
    std::ifstream in(
        std::string(SPECDEC_SOURCE_DIR) + "/tests/fuzz/corpus/safetensors/small.safetensors",
        std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    fuzz_put("a.safetensors", ss.str());
    fuzz_put("b.safetensors", ss.str());
    return true;
  }();
  (void)ready;
  fuzz_input_file(data, size, "model.safetensors.index.json");
  try {
    const specdec::WeightStore store(fuzz_dir());
    for (const std::string& name : store.names())
      (void)store.load(name, at::kFloat, c10::Device(c10::kCPU));
  } catch (const specdec::Error&) {
  }
  return 0;
}
