// The `specdec` program's pieces: the options every generating subcommand shares, loading the
// models and tokenizer they name, and one entry point per subcommand (tools/cli/*.cpp; main.cpp
// parses).
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "serve/server.hpp"
#include "specdec/fixture.hpp"
#include "specdec/make_draft.hpp"
#include "specdec/specdec.hpp"

namespace CLI {
class App;
}

namespace specdec::cli {

enum class Mode { kGenerate, kCompare, kChat, kServe };

// --system and --chat-template, of the commands that put a turn through a chat template.
struct TurnOptions {
  std::string system, chat_template;
  bool system_given = false;  // --system given (an empty one is an empty system turn)
  std::optional<std::string> system_message() const {
    return system_given ? std::optional<std::string>(system) : std::nullopt;
  }
};

struct RunOptions : TurnOptions {
  std::string model, draft, prompt, prompt_ids, tokenizer,
      device = "cpu", dtype = "float32", weights = "as-stored", draft_weights = "as-stored";
  bool chat = false;
  bool prompt_given = false;  // --prompt, which may be "" (the tokenizer's BOS alone)
  bool int8_activations = false, draft_int8_activations = false;
  int threads = 0;
  bool json_out = false;
  bool no_stream = false;
  bool no_adaptive = false;
  int warmup = 1;
  std::string prompts_file;  // generate: JSON Lines of requests
  int batch_size = 1;
  bool prompt_cache =
      false;           // generate --prompts-file: each request continues the previous one's caches
  bool serve = false;  // serve: no prompt; the chat template when the model has one
  GenerationConfig gen;
  SuffixOptions suffix;  // every Generator's (Generator::set_suffix_options)
};

// The flags of generate, compare, chat and serve (`mode` says which apply).
void add_run_options(CLI::App* app, RunOptions& o, Mode mode);

// Comma-separated ids; an empty list is an error unless `allow_empty` (detokenize: "" decodes to
// "").
std::vector<int64_t> parse_ids(const std::string& text, const char* flag = "--prompt-ids",
                               bool allow_empty = false);
// All of stdin (on a terminal, a note on stderr first naming `flag`, which gives the text instead).
std::string read_stdin(const char* flag = "--prompt");

struct Loaded {
  std::shared_ptr<const Model> target, draft;
  std::unique_ptr<Tokenizer> tokenizer;  // null when there is none and ids are used
  std::optional<ChatTemplate> chat;      // --chat and the chat subcommand
  // The chat template's end of turn, when it is one token and none of the target's EOS ids: a chat
  // answer ends there too.
  std::optional<int64_t> end_of_turn;
  std::vector<int64_t> prompt;
};

// The chat format: --chat-template, else recognised from the template that `tok_source` or
// `model` ships.
ChatTemplate chat_template(const TurnOptions& o, const std::string& model,
                           const std::string& tok_source);
// Text from the user as UTF-8, or an Error naming where it came from (`where`: "--prompt", "your
// message") and the byte in it.
void require_utf8_in(const std::string& text, const std::string& where);
// The template's end of turn as one token of `tok`; none, with a warning, when it is no token of it
// (a template made for another model).
std::optional<int64_t> end_of_turn_token(const ChatTemplate& t, const Tokenizer& tok);
// The conversation through the chat template, as ids (the model must have a tokenizer).
std::vector<int64_t> encode_chat(const Loaded& l, const std::vector<ChatMessage>& messages);
// One user turn, after the system message `system` (none when absent: the template's own, if any;
// an empty one is an empty system turn, as in Hugging Face's apply_chat_template).
std::vector<ChatMessage> one_turn(const std::optional<std::string>& system,
                                  const std::string& user);
// One user turn (after `system`, when given): through the chat template when l.chat is set.
std::vector<int64_t> encode_turn(const Loaded& l, const std::optional<std::string>& system,
                                 const std::string& user);
// The flags' values and combinations, the threads set, the named files there (Error otherwise).
void check_flags(RunOptions& o, bool chat);
// The warnings for the flags of `o` that a request whose config is `c` does not use (check_flags
// prints them for a prompt's run; a prompts file's, those that no line uses).
std::vector<std::string> inapplicable_flags(const RunOptions& o, const GenerationConfig& c);
void warn(const std::string& message);  // "specdec: warning: ..." on stderr
// The models, tokenizer, chat template and prompt that `o` names; check_flags first.
Loaded load(RunOptions& o, bool chat);

nlohmann::json result_json(const GenerationResult& r, const Tokenizer* tok);
// "acceptance 61.3% (19/31)", or "nothing drafted" when nothing was.
std::string acceptance_text(const GenerationStats& s);
// "N new tokens in T s (R tok/s, R' after the prefill: P prompt tokens in T' s); ..." and the
// passes, acceptance and stop reason.
void print_stats(const GenerationStats& s, std::ostream& os);
// On a terminal, while a long prompt goes in, "specdec: reading the prompt (N tokens)... 4 s" on
// stderr: redrawn from the token callback's calls between the prefill's passes once a second has
// gone by, erased before the answer's first tokens are shown (or when it ends without them).
class PrefillNotice {
 public:
  explicit PrefillNotice(int64_t prompt_tokens);  // 0: the count is not shown
  ~PrefillNotice();
  PrefillNotice(const PrefillNotice&) = delete;
  PrefillNotice& operator=(const PrefillNotice&) = delete;
  void update(const std::vector<int64_t>& new_tokens);  // first thing in the token callback
  void erase();                                         // (before other output on stderr)

 private:
  const int64_t tokens_;
  const bool tty_;
  bool shown_ = false, answering_ = false;
  const std::chrono::steady_clock::time_point start_;
};
std::string join_ids(const std::vector<int64_t>& v);
// Flushes stdout; Error ("cannot write the output (stdout): <reason>", the reason when this flush
// saw it) when a write to it failed (a full disk, a closed file), so that a command never ends
// with 0 having lost its output.
// `earlier_errno`: where the caller wrote with nothing between (CLI11's help), the errno after it.
void flush_output(int earlier_errno = 0);

struct TokenizeOptions : TurnOptions {
  std::string dir, text, ids;
  bool text_given = false;  // --text given (it may be empty); otherwise stdin is read
  bool no_special = false, skip_special = false, json_out = false;
  bool chat = false;  // tokenize: one user turn through the chat template
};

// make-fixture: a checkpoint, or with draft_of an early-exit draft of one.
struct MakeFixtureOptions {
  std::string out, draft_of;
  FixtureOptions fixture;
  double noise = 0.0;  // draft_of's
};
struct MakeTokenizerOptions {
  std::string input, out, model_type = "bpe";
  int64_t vocab_size = 4096;
};

int run_generate(RunOptions& o);
// The optional keys of a --prompts-file line, beside "prompt", "prompt_ids" and "system".
const std::vector<std::string>& prompts_file_knobs();
int run_compare(RunOptions& o);
int run_chat(RunOptions& o);
int run_tokenize(const TokenizeOptions& o);
int run_detokenize(const TokenizeOptions& o);
int run_make_draft(const MakeDraftOptions& o);
// make-draft --resume: --features and --int8-activations as the run in --out was made, where the
// flag is not given (a run made otherwise is refused by make_draft).
void inherit_labelling(MakeDraftOptions& o, bool features_given, bool int8_given);
int run_make_fixture(const MakeFixtureOptions& o);
int run_make_tokenizer(const MakeTokenizerOptions& o);
int run_serve(RunOptions& o, const serve::ServeOptions& so, bool max_tokens_given);

}  // namespace specdec::cli
