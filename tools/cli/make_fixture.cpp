// `specdec make-fixture` and `specdec make-tokenizer`: files written in one long call each, into
// a scratch folder first, so that a failure, Ctrl-C or a kill leaves no half-written output.
// Paths through POSIX calls, not std::filesystem (src/util.hpp says why).
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>

#include "cli.hpp"
#include "interrupt.hpp"
#include "tooling/checkpoint.hpp"
#include "util.hpp"

namespace specdec::cli {
namespace {

std::string absolute(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char cwd[PATH_MAX];
  SPECDEC_CHECK(::getcwd(cwd, sizeof cwd), "cannot read the current folder");
  return std::string(cwd) + "/" + path;
}

std::string parent_of(const std::string& path) {
  const size_t slash = path.find_last_of('/', path.size() > 1 ? path.size() - 2 : 0);
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

// The outermost of `dir` and its parents that does not exist yet (empty when `dir` exists): what
// writing into `dir` creates.
std::string first_missing(const std::string& dir) {
  std::string missing;
  for (std::string p = absolute(dir); !path_exists(p); p = parent_of(p)) {
    missing = p;
    if (p == "/") break;
  }
  return missing;
}

bool empty_folder(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  SPECDEC_CHECK(d, dir, ": exists and is not a folder");
  bool empty = true;
  while (const dirent* e = ::readdir(d))
    if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") empty = false;
  ::closedir(d);
  return empty;
}

// A new folder named after `pattern` (ending in XXXXXX) for a command's own scratch work (0700);
// `what` names it in errors.
std::string make_scratch(const std::string& pattern, const std::string& what) {
  std::string path = pattern;
  if (!::mkdtemp(&path[0])) throw Error(what + ": cannot create it (" + std::strerror(errno) + ")");
  return path;
}

// A new folder `prefix` + a random suffix that becomes `what` (the command's output, named in
// errors) once whole: made by mkdir, so with the permissions the umask gives any folder.
std::string make_output_scratch(const std::string& prefix, const std::string& what) {
  std::random_device random;
  for (int attempt = 0; attempt < 100; ++attempt) {
    char suffix[16];
    std::snprintf(suffix, sizeof suffix, "%08x", static_cast<unsigned>(random()));
    const std::string path = prefix + suffix;
    if (::mkdir(path.c_str(), 0777) == 0) return path;
    if (errno != EEXIST) throw Error(what + ": cannot create it (" + std::strerror(errno) + ")");
  }
  throw Error(what + ": cannot create a scratch folder beside it");
}

}  // namespace

int run_make_fixture(const MakeFixtureOptions& o) {
  if (o.out.empty()) throw Error("--out: the value is empty");
  // A stale tokenizer beside new weights would load as one checkpoint: the folder is new or empty.
  const std::string out = absolute(o.out), made = first_missing(out);
  SPECDEC_CHECK(!made.empty() || empty_folder(out), o.out,
                ": the folder exists and is not empty; give a new one (or remove it)");
  // Written beside it, then renamed into place: the output is whole or absent whatever stops it.
  const std::string parent = parent_of(out);
  detail::make_dir(parent);
  const size_t slash = out.find_last_of('/');
  const std::string scratch =
      make_output_scratch(parent + "/." + out.substr(slash + 1) + ".partial-", o.out);
  const auto cleanup = [&] {
    const bool removed = remove_path(scratch) && (made.empty() || made == out || remove_path(made));
    return removed ? std::string("nothing was written") : "remove " + scratch;
  };
  try {
    CleanupOnInterrupt guard(cleanup);
    if (!o.draft_of.empty())
      make_draft_of(o.draft_of, scratch, o.fixture.layers, o.noise, o.fixture.seed);
    else
      make_fixture(scratch, o.fixture);
    if (made.empty()) ::rmdir(out.c_str());  // (empty)
    rename_path(scratch, out);
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
  std::vector<std::string> inputs;
  for (size_t at = 0; at <= o.input.size();) {  // each input file, before anything is made
    const size_t end = std::min(o.input.find(',', at), o.input.size());
    const std::string file = o.input.substr(at, end - at);
    SPECDEC_CHECK(file_exists(file), "--input: ", file, ": no such file");
    inputs.push_back(absolute(file));
    at = end + 1;
  }
  const char* env = std::getenv("TMPDIR");
  std::string tmp = env && *env ? env : "/tmp";
  if (tmp.find_first_of(" \t,") != std::string::npos) tmp = "/tmp";
  const std::string model = o.out + "/tokenizer.model";
  SPECDEC_CHECK(!path_exists(model), model, ": already exists; give a new --out (or remove it)");
  const std::string scratch =
      make_scratch(tmp + "/specdec-tokenizer-XXXXXX", "a scratch folder in " + tmp);
  const std::string partial = model + ".tmp." + std::to_string(::getpid());  // write_file_atomic's
  const std::string made = first_missing(o.out);  // the folders made for the output
  const auto cleanup = [&] {
    remove_path(scratch);
    std::remove(partial.c_str());
    if (file_exists(model)) return "after writing " + model;
    if (!made.empty()) remove_path(made);
    return std::string("nothing was written");
  };
  try {
    CleanupOnInterrupt guard(cleanup);
    std::string list;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::string link = scratch + "/input" + std::to_string(i) + ".txt";
      SPECDEC_CHECK(::symlink(inputs[i].c_str(), link.c_str()) == 0, link,
                    ": cannot create a link to ", inputs[i]);
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
    detail::make_dir(absolute(o.out));
    write_file_atomic(model, read_text_file(scratch + "/tokenizer.model"));
  } catch (...) {
    cleanup();
    throw;
  }
  remove_path(scratch);
  std::cerr << "wrote " << model << "\n";
  return 0;
}

}  // namespace specdec::cli
