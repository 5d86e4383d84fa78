// libFuzzer target: the `specdec` program's generation flags as CLI-like strings (the input cut at
// NUL bytes and newlines into arguments), parsed by the program's own option table into a
// GenerationConfig and validated. Every input parses (and validates) or is refused with a
// CLI11 parse error or specdec::Error, which the program turns into a message and exit status. A
// configuration that validates then runs a request on a tiny generated Llama pair (stopped after 16
// tokens by the streaming callback): what validates must also run.
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "generation_options.hpp"
#include "specdec/fixture.hpp"
#include "specdec/specdec.hpp"

namespace {
const specdec::Generator& generator() {
  static const specdec::Generator g = [] {
    specdec::FixtureOptions o;
    o.layers = 2, o.hidden = 32, o.heads = 2, o.vocab = 64, o.max_pos = 128, o.init_std = 0.2;
    const std::string target = fuzz_dir() + "/target", draft = fuzz_dir() + "/draft";
    specdec::make_fixture(target, o);
    specdec::make_draft_of(target, draft, 1);
    return specdec::Generator(specdec::load_model(target), specdec::load_model(draft));
  }();
  return g;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args{"specdec"};
  std::string cur;
  for (size_t i = 0; i < size; ++i) {
    const char c = static_cast<char>(data[i]);
    if (c == '\0' || c == '\n') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) args.push_back(cur);
  if (args.size() > 64) return 0;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  CLI::App app("fuzz");
  specdec::GenerationConfig gen;
  bool no_adaptive = false;
  specdec::cli::add_generation_options(&app, gen, no_adaptive);
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
    specdec::cli::finish_generation_options(gen, no_adaptive);
    int64_t delivered = 0;
    (void)generator().generate({3, 4, 5, 3, 4}, gen, [&](const std::vector<int64_t>& tokens) {
      delivered += static_cast<int64_t>(tokens.size());
      if (delivered >= 16) throw specdec::Cancelled();
    });
  } catch (const CLI::ParseError&) {
  } catch (const specdec::Error&) {
  }
  return 0;
}
