// `specdec make-fixture` and `specdec make-tokenizer`: files written in one long call each, into
// a scratch folder first, so that a failure, Ctrl-C or a kill leaves no half-written output.
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "cli.hpp"
#include "interrupt.hpp"

namespace fs = std::filesystem;

namespace specdec::cli {
namespace {

// The outermost of `dir` and its parents that does not exist yet (empty when `dir` exists): what
// writing into `dir` creates.
fs::path first_missing(const fs::path& dir) {
  std::error_code ec;
  fs::path missing;
  for (fs::path p = fs::absolute(dir); !fs::exists(p, ec); p = p.parent_path()) {
    missing = p;
    if (p == p.parent_path()) break;
  }
  return missing;
}

// A new folder named after `pattern` (ending in XXXXXX), for a command's output before it is
// whole.
std::string make_scratch(const std::string& pattern) {
  std::string path = pattern;
  SPECDEC_CHECK(::mkdtemp(path.data()), pattern, ": cannot create a scratch folder");
  return path;
}

}  // namespace

int run_make_fixture(const MakeFixtureOptions& o) {
  // A stale tokenizer beside new weights would load as one checkpoint: the folder is new or empty.
  std::error_code ec;
  const fs::path out = fs::absolute(o.out), made = first_missing(out);
  if (made.empty()) {
    SPECDEC_CHECK(fs::is_directory(out, ec), o.out, ": exists and is not a folder");
    SPECDEC_CHECK(fs::is_empty(out, ec), o.out,
                  ": the folder exists and is not empty; give a new one (or remove it)");
  }
  // Written beside it, then renamed into place: the output is whole or absent whatever stops it.
  fs::create_directories(out.parent_path(), ec);
  SPECDEC_CHECK(!ec, out.parent_path().string(), ": cannot create the folder: ", ec.message());
  const std::string scratch = make_scratch(
      (out.parent_path() / ("." + out.filename().string() + ".partial-XXXXXX")).string());
  const auto cleanup = [&] {
    const bool removed =
        remove_tree(scratch) && (made.empty() || made == out || remove_tree(made.string()));
    return removed ? std::string("nothing was written") : "remove " + scratch;
  };
  try {
    CleanupOnInterrupt guard(cleanup);
    if (!o.draft_of.empty())
      make_draft_of(o.draft_of, scratch, o.fixture.layers, o.noise, o.fixture.seed);
    else
      make_fixture(scratch, o.fixture);
    if (made.empty()) fs::remove(out);  // (empty)
    fs::rename(scratch, out);
  } catch (const fs::filesystem_error& e) {
    cleanup();
    throw Error(std::string("make-fixture: ") + e.what());
  } catch (...) {
    cleanup();
    throw;
  }
  std::cerr << "wrote " << o.out << "\n";
  return 0;
}

int run_make_tokenizer(const MakeTokenizerOptions& o) {
  // 256 byte pieces (byte fallback), <unk>, <s>, </s>, and the text's characters
  SPECDEC_CHECK(o.vocab_size >= 260, "--vocab-size must be >= 260, got ", o.vocab_size,
                " (256 byte pieces, <unk>, <s>, </s> and the text's own pieces)");
  // SentencePiece reads its options from one space-separated line, so it is given paths of its
  // own: links to the inputs in a scratch folder, where it also writes.
  std::vector<fs::path> inputs;
  for (size_t at = 0; at <= o.input.size();) {  // each input file, before anything is made
    const size_t end = std::min(o.input.find(',', at), o.input.size());
    const std::string file = o.input.substr(at, end - at);
    std::error_code ec;
    SPECDEC_CHECK(fs::is_regular_file(file, ec), "--input: ", file, ": no such file");
    inputs.push_back(fs::absolute(file));
    at = end + 1;
  }
  std::string tmp = fs::temp_directory_path().string();
  if (tmp.find_first_of(" \t,") != std::string::npos) tmp = "/tmp";
  const std::string scratch = make_scratch(tmp + "/specdec-tokenizer-XXXXXX");
  const fs::path model = fs::path(o.out) / "tokenizer.model";
  const fs::path partial = fs::path(o.out) / ".tokenizer.model.partial";
  const fs::path made = first_missing(o.out);  // the folders made for the output
  const auto cleanup = [&] {
    std::error_code ec;
    remove_tree(scratch);
    fs::remove(partial, ec);
    if (fs::exists(model, ec)) return "after writing " + model.string();
    if (!made.empty()) remove_tree(made.string());
    return std::string("nothing was written");
  };
  try {
    CleanupOnInterrupt guard(cleanup);
    std::string list;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::string link = scratch + "/input" + std::to_string(i) + ".txt";
      fs::create_symlink(inputs[i], link);
      list += (i ? "," : "") + link;
    }
    std::cerr << "training a " << o.vocab_size << "-piece SentencePiece " << o.model_type
              << " model ...\n";
    try {
      train_sentencepiece("--input=" + list + " --model_prefix=" + scratch +
                          "/tokenizer --vocab_size=" + std::to_string(o.vocab_size) +
                          " --model_type=" + o.model_type +
                          " --byte_fallback=true --character_coverage=1.0");
    } catch (const std::exception& e) {
      std::string why = e.what();
      // "Vocabulary size is smaller than required_chars. 100 vs 317. Increase vocab_size or
      // decrease character_coverage with --character_coverage option." names a flag specdec has not
      const size_t vs = why.find("required_chars. ");
      if (vs != std::string::npos) {
        const size_t at = why.find(" vs ", vs);
        why = "--vocab-size " + std::to_string(o.vocab_size) +
              " is too small for this text: it needs more than " +
              why.substr(at + 4, why.find('.', at) - at - 4) +
              " pieces (its characters, the 256 byte pieces and <unk>, <s>, </s>)";
      }
      throw Error("make-tokenizer: SentencePiece could not train on " + o.input + ": " + why);
    }
    fs::create_directories(o.out);
    fs::copy_file(scratch + "/tokenizer.model", partial, fs::copy_options::overwrite_existing);
    fs::rename(partial, model);
  } catch (const fs::filesystem_error& e) {
    cleanup();
    throw Error(std::string("make-tokenizer: ") + e.what());
  } catch (...) {
    cleanup();
    throw;
  }
  remove_tree(scratch);
  std::cerr << "wrote " << model.string() << "\n";
  return 0;
}

}  // namespace specdec::cli
