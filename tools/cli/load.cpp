// Loading what the flags name: models, tokenizer, chat template, prompt; printing results.
#include <ATen/Parallel.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <tuple>

#include "cli.hpp"
#include "generation_options.hpp"
#include "tokenizers/tokenizer_base.hpp"
#include "util.hpp"

using nlohmann::json;

namespace specdec::cli {

ChatTemplate chat_template(const TurnOptions& o, const std::string& model,
                           const std::string& tok_source) {
  if (!o.chat_template.empty()) return ChatTemplate::by_name(o.chat_template);
  for (const std::string& where : {tok_source, model}) {
    if (auto text = read_chat_template(where)) try {
        return ChatTemplate::recognise(*text, where);
      } catch (const Error& e) {
        throw Error(std::string(e.what()) + " with --chat-template");
      }
  }
  std::string names;
  for (const std::string& n : ChatTemplate::names()) names += (names.empty() ? "" : "|") + n;
  throw Error(model + " ships no chat template: choose one with --chat-template " + names);
}

std::optional<int64_t> end_of_turn_token(const ChatTemplate& t, const Tokenizer& tok) {
  const std::vector<int64_t> eot = tok.encode(t.end_of_turn(), false);
  if (eot.size() == 1) return eot[0];
  warn("the " + t.name() + " template's end of turn, " + t.end_of_turn() +
       ", is no token of this tokenizer: the template was made for another model (its markers are "
       "plain text here, and an answer does not stop at its turn's end)");
  return std::nullopt;
}

std::vector<int64_t> encode_chat(const Loaded& l, const std::vector<ChatMessage>& messages) {
  const std::vector<int64_t> ids = l.tokenizer->encode(l.chat->render(messages, true), false);
  if (ids.empty()) throw Error("the prompt is empty");
  return ids;
}

void require_utf8_in(const std::string& text, const std::string& where) {
  try {
    tok::require_utf8(text);
  } catch (const Error& e) {
    throw Error(where + ": " + e.what());
  }
}

std::vector<ChatMessage> one_turn(const std::optional<std::string>& system,
                                  const std::string& user) {
  std::vector<ChatMessage> messages;
  if (system) messages.push_back({"system", *system});
  messages.push_back({"user", user});
  return messages;
}

std::vector<int64_t> encode_turn(const Loaded& l, const std::optional<std::string>& system,
                                 const std::string& user) {
  return encode_chat(l, one_turn(system, user));
}

void warn(const std::string& message) { std::cerr << "specdec: warning: " << message << "\n"; }

namespace {

// The target's load options, or the draft's (which shares the device and compute dtype).
LoadOptions load_options(const RunOptions& o, bool draft) {
  LoadOptions lo;
  lo.device = parse_device(o.device);
  lo.dtype = parse_dtype(o.dtype);
  lo.weights = parse_weight_format(draft ? o.draft_weights : o.weights);
  lo.int8_activations = draft ? o.draft_int8_activations : o.int8_activations;
  return lo;
}
}  // namespace

std::vector<std::string> inapplicable_flags(const RunOptions& o, const GenerationConfig& c) {
  std::vector<std::string> out;
  const GenerationConfig plain;
  std::string sampling;
  int flags = 0;
  for (const auto& [given, flag] :
       {std::pair{o.gen.temperature != plain.temperature &&
                      o.gen.temperature >= GenerationConfig::kGreedyBelow,
                  "--temperature"},
        {o.gen.top_k != plain.top_k, "--top-k"},
        {o.gen.top_p != plain.top_p, "--top-p"},
        {o.gen.min_p != plain.min_p, "--min-p"},
        {o.gen.seed != plain.seed, "--seed"}})
    if (given) sampling += (flags++ ? ", " : "") + std::string(flag);
  if (!c.do_sample && flags > 0)
    out.push_back(sampling + (flags == 1 ? " only applies" : " only apply") +
                  " with --do-sample: this decoding is greedy");
  else if (c.do_sample && !c.sampling() && flags > 0)
    out.push_back(sampling + (flags == 1 ? " does" : " do") +
                  " not apply at --temperature 0 (or below 1e-5): this decoding is greedy");
  else if (c.do_sample && c.temperature > 0 && !c.sampling())
    out.push_back(
        "--do-sample at --temperature below 1e-5 decodes greedily (its limit; dividing "
        "the logits by it would overflow them)");
  if (c.prompt_lookup_num_tokens == 0 &&
      (o.gen.max_matching_ngram_size != plain.max_matching_ngram_size ||
       o.gen.prompt_lookup_match != plain.prompt_lookup_match))
    out.push_back("--max-matching-ngram and --prompt-lookup-match only apply with --prompt-lookup");
  if (c.prompt_lookup_num_tokens > 0 && o.gen.num_assistant_tokens != plain.num_assistant_tokens)
    out.push_back(
        "--num-assistant-tokens does not apply with --prompt-lookup N, whose N caps a proposal "
        "(as in Hugging Face)");
  const bool without_model = c.speculates_without_model();
  const std::string& schedule = o.gen.num_assistant_tokens_schedule;
  const bool dynamic_knobs =
      o.gen.assistant_confidence_threshold != plain.assistant_confidence_threshold ||
      o.gen.adaptive_threshold != plain.adaptive_threshold;
  if (o.draft.empty() && !without_model &&
      (!schedule.empty() || o.gen.num_assistant_tokens != plain.num_assistant_tokens ||
       dynamic_knobs)) {
    out.push_back(
        "--schedule, --num-assistant-tokens and the confidence-threshold flags only apply with "
        "--draft, --prompt-lookup or --speculate suffix: this is target-only generation");
  } else {
    if (without_model && schedule != "" && schedule != "constant" && schedule != "goodput")
      out.push_back("--schedule " + schedule +
                    " acts as constant with --prompt-lookup or --speculate suffix (their "
                    "proposals have no draft probabilities); goodput (their default when greedy) "
                    "or constant apply");
    if (dynamic_knobs && (without_model || c.num_assistant_tokens_schedule != "dynamic"))
      out.push_back(
          "--confidence-threshold and --no-adaptive-threshold only apply with --draft and "
          "--schedule dynamic");
  }
  const SuffixOptions suffix;
  if (!c.suffix_speculation &&
      (o.suffix.max_depth != suffix.max_depth || o.suffix.min_token_prob != suffix.min_token_prob ||
       o.suffix.max_spec_factor != suffix.max_spec_factor || o.suffix.tree != suffix.tree ||
       o.suffix.cache_tokens != suffix.cache_tokens))
    out.push_back("the --suffix-* flags only apply with --speculate suffix");
  if (c.min_new_tokens > c.max_new_tokens)
    out.push_back("--min-new-tokens " + std::to_string(c.min_new_tokens) + " is more than " +
                  "--max-new-tokens " + std::to_string(c.max_new_tokens) + ": at most " +
                  std::to_string(c.max_new_tokens) + " are generated");
  return out;
}

void check_flags(RunOptions& o, bool chat) {
  if (o.threads < 0) throw Error("--threads must be >= 0 (0: one per physical core)");
  try {
    set_num_threads(o.threads > 0 ? o.threads : default_num_threads());
  } catch (const Error& e) {
    throw Error(std::string("--threads: ") + e.what() + " (or 0: one per physical core)");
  }
  finish_generation_options(o.gen, o.no_adaptive);
  if (!chat && !o.serve && (o.system_given || !o.chat_template.empty()))
    throw Error("--system and --chat-template need --chat");
  // Hugging Face runs prompt lookup when given both and leaves the assistant model unused.
  if (!o.draft.empty() && o.gen.prompt_lookup_num_tokens > 0)
    throw Error(
        "--prompt-lookup and --draft: give one of them (prompt lookup copies from the text and "
        "runs no draft)");
  if (!o.draft.empty() && o.gen.suffix_speculation)
    throw Error(
        "--speculate suffix and --draft: give one of them (suffix speculation runs no draft)");
  o.suffix.validate();
  // What load() parses from the flags, refused here already (serve: before it binds its port).
  check_load_options(load_options(o, false));
  if (!o.draft.empty()) check_load_options(load_options(o, true));
  if (!o.chat_template.empty()) ChatTemplate::by_name(o.chat_template);
  // A draft model's flags without one are an error; flags that apply only beside another are
  // warned about, where every request takes the flags (not a server's or a prompts file's
  // requests, which may set the knob the flag is the default of).
  if (o.draft.empty()) {
    if (o.gen.draft_tree_width > 1) throw Error("--draft-tree-width needs --draft");
    if (o.draft_weights != "as-stored") throw Error("--draft-weights needs --draft");
    if (o.draft_int8_activations) throw Error("--draft-int8-activations needs --draft");
  }
  if (!o.serve && o.prompts_file.empty())
    for (const std::string& w : inapplicable_flags(o, o.gen)) warn(w);
  for (const auto& [int8, weights, which] :
       {std::tuple{o.int8_activations, o.weights, "--int8-activations"},
        {o.draft_int8_activations, o.draft_weights, "--draft-int8-activations"}})
    if (int8 && (weights == "float32" || weights == "bfloat16" || weights == "float16"))
      warn(std::string(which) + " applies to quantized weights only, not " + weights +
           ": nothing changes");
  if (!o.prompts_file.empty() && (o.json_out || o.no_stream))
    warn(
        "--json and --no-stream do not apply with --prompts-file, which writes one JSON line per "
        "request");
  if (o.model.empty()) throw Error("--model is empty");
  std::string prompts_file = o.prompts_file == "-" ? "" : o.prompts_file;
  for (const std::string* path : {&o.model, &o.draft, &o.tokenizer, &prompts_file}) {
    struct stat st {};
    if (!path->empty() && ::stat(path->c_str(), &st) != 0)
      throw Error(*path + ": no such file or folder");
  }
  if (struct stat st{};
      !prompts_file.empty() && ::stat(prompts_file.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw Error(prompts_file + ": a folder, not a file of requests");
}

Loaded load(RunOptions& o, bool chat) {
  check_flags(o, chat);
  // A path that is no checkpoint is named as such before any message about its tokenizer.
  const ModelConfig target_config = ModelConfig::from_path(o.model);
  if (!o.draft.empty()) ModelConfig::from_path(o.draft);
  Loaded l;
  const std::string tok_dir = !o.tokenizer.empty()     ? o.tokenizer
                              : has_tokenizer(o.model) ? o.model
                                                       : "";
  if (!tok_dir.empty()) l.tokenizer = load_tokenizer(tok_dir);
  // A draft with tokenizer files of its own must tokenize exactly like the target.
  if (l.tokenizer && !o.draft.empty() && has_tokenizer(o.draft))
    require_same_tokenizer(*l.tokenizer, *load_tokenizer(o.draft));
  if (o.serve) {
    if (!l.tokenizer)
      throw Error(o.model + " has no tokenizer: give --tokenizer, which serve needs");
    // Chat requests need a template; without one they are refused (completions still work).
    try {
      l.chat = chat_template(o, o.model, tok_dir);
    } catch (const Error& e) {
      if (!o.chat_template.empty()) throw;
      std::cerr << "specdec serve: " << e.what() << " (/v1/chat/completions is refused)\n";
    }
  } else if (chat) {
    if (!o.prompt_ids.empty())
      throw Error("--chat needs a text prompt (--prompt or stdin), not --prompt-ids");
    if (!l.tokenizer)
      throw Error(o.model + " has no tokenizer: give --tokenizer, which chat needs");
    l.chat = chat_template(o, o.model, tok_dir);
    require_utf8_in(o.system, "--system");
  }
  const char* empty_prompt =
      o.chat ? "the prompt is empty (give --prompt TEXT, or the text on stdin)"
             : "the prompt is empty (give --prompt TEXT or --prompt-ids, or the text on stdin)";
  if (o.serve || !o.prompts_file.empty()) {
    // Requests come later (serve), or are read and checked by run_prompts_file.
  } else if (!o.prompt_ids.empty()) {
    l.prompt = parse_ids(o.prompt_ids);
    for (const int64_t id : l.prompt)
      SPECDEC_CHECK(id >= 0 && id < target_config.vocab_size, "--prompt-ids: token id ", id,
                    " is outside the vocabulary [0, ", target_config.vocab_size, ")");
  } else if (o.chat) {
    const std::string text = o.prompt_given ? o.prompt : read_stdin();
    if (text.empty()) throw Error(empty_prompt);
    require_utf8_in(text, o.prompt_given ? "--prompt" : "the prompt (stdin)");
    l.prompt = encode_turn(l, o.system_message(), text);
  } else if (!chat) {
    if (!l.tokenizer)
      throw Error(o.model +
                  " has no tokenizer files: give --tokenizer (a folder with them, or a .gguf), or "
                  "the prompt as --prompt-ids");
    const std::string text = o.prompt_given ? o.prompt : read_stdin();
    require_utf8_in(text, o.prompt_given ? "--prompt" : "the prompt (stdin)");
    // An empty text is the tokenizer's BOS alone, where it adds one (generation from nothing).
    l.prompt = l.tokenizer->encode(text, true);
    if (l.prompt.empty())
      throw Error(std::string(empty_prompt) +
                  (text.empty() ? "; this tokenizer adds no BOS to begin from" : ""));
  }
  l.target = load_model(o.model, load_options(o, false));
  if (!o.draft.empty()) l.draft = load_model(o.draft, load_options(o, true));
  // A tokenizer of another model: the model writes ids it cannot decode, or it has ids the model
  // lacks (a model's vocabulary may exceed its tokenizer's by padding: Qwen2.5's by 271).
  if (l.tokenizer && !o.tokenizer.empty()) {
    const int64_t n = l.tokenizer->size(), v = l.target->config().vocab_size;
    if (n > v || v > n + 1024)
      warn("--tokenizer has " + std::to_string(n) + " tokens, the model " + std::to_string(v) +
           ": it was made for another model (the text will not be this model's)");
    for (const int64_t id : l.prompt)
      if (id >= v)
        throw Error("the prompt holds token " + std::to_string(id) +
                    " of --tokenizer, which the model's vocabulary [0, " + std::to_string(v) +
                    ") lacks: --tokenizer was made for another model");
  }
  // A draft without tokenizer files of its own cannot be compared with the target's tokenizer: a
  // vocabulary smaller than the ids the target writes says it was not made for it (a larger one
  // may be padding, as Qwen2.5's sizes differ by model). The library would run it, drafting for no
  // row whose text holds an id the draft lacks: most often none, a target-only run in disguise.
  const int64_t vocab = l.target->config().vocab_size;
  const int64_t ids = l.tokenizer ? std::min(l.tokenizer->size(), vocab) : vocab;
  if (l.draft && !has_tokenizer(o.draft) && l.draft->config().vocab_size < ids)
    throw Error("the draft's vocabulary has " + std::to_string(l.draft->config().vocab_size) +
                " tokens, the target writes " + std::to_string(ids) +
                ": it was not made for this target (make-draft makes one that is)");
  if (l.chat)
    if (const auto eot = end_of_turn_token(*l.chat, *l.tokenizer))
      if (!l.target->config().is_eos(*eot)) l.end_of_turn = eot;
  if (o.gen.eos_token_ids.empty()) {
    o.gen.eos_token_ids = l.target->config().eos_token_ids;
    if (o.gen.eos_token_ids.empty() && l.tokenizer && l.tokenizer->eos_token_id())
      o.gen.eos_token_ids = {*l.tokenizer->eos_token_id()};
    if (l.end_of_turn) o.gen.eos_token_ids.push_back(*l.end_of_turn);
  }
  return l;
}

json result_json(const GenerationResult& r, const Tokenizer* tok) {
  json j = {{"tokens", r.tokens}, {"stats", json::parse(r.stats.to_json())}};
  if (tok) j["text"] = tok->decode(r.tokens, true);
  return j;
}

std::string acceptance_text(const GenerationStats& s) {
  if (s.drafted_tokens == 0) return "nothing drafted";
  char buf[96];
  std::snprintf(buf, sizeof buf, "acceptance %.1f%% (%lld/%lld)", 100.0 * s.acceptance_rate(),
                static_cast<long long>(s.accepted_tokens),
                static_cast<long long>(s.drafted_tokens));
  return buf;
}

void print_stats(const GenerationStats& s, std::ostream& os) {
  const double after = s.total_seconds - s.prefill_seconds;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%lld new tokens in %.3f s (%.2f tok/s, %.2f after the prefill: %lld prompt tokens "
                "in %.3f s); %lld target passes (%.2f tokens/pass), %lld draft passes, %s; stop: "
                "%s\n",
                static_cast<long long>(s.new_tokens), s.total_seconds, s.tokens_per_second(),
                after > 0 ? static_cast<double>(s.new_tokens) / after : 0.0,
                static_cast<long long>(s.prompt_tokens), s.prefill_seconds,
                static_cast<long long>(s.target_passes), s.tokens_per_target_pass(),
                static_cast<long long>(s.draft_passes), acceptance_text(s).c_str(),
                s.stop_reason.c_str());
  os << buf;
  if (s.cached_prompt_tokens > 0)
    os << "(" << s.cached_prompt_tokens << " of the " << s.prompt_tokens
       << " prompt tokens came from the conversation's cache)\n";
}

PrefillNotice::PrefillNotice(int64_t prompt_tokens)
    : tokens_(prompt_tokens), tty_(isatty(STDERR_FILENO) != 0), start_(Clock::now()) {}

PrefillNotice::~PrefillNotice() { erase(); }

void PrefillNotice::erase() {
  if (shown_) std::cerr << "\r\033[K" << std::flush;
  shown_ = false;
}

void PrefillNotice::update(const std::vector<int64_t>& new_tokens) {
  if (answering_ || !tty_) return;
  if (!new_tokens.empty()) {
    answering_ = true;
    return erase();
  }
  const double elapsed = seconds_since(start_);
  if (elapsed < 1) return;
  std::cerr << "\r\033[Kspecdec: reading the prompt";
  if (tokens_ > 0) std::cerr << " (" << tokens_ << " tokens)";
  std::cerr << "... " << static_cast<int64_t>(elapsed) << " s" << std::flush;
  shown_ = true;
}

void flush_output(int earlier_errno) {
  // A write that failed already (output longer than the buffer) is reported with the errno its
  // caller saw then, if any: errno now may be another call's.
  const bool failed = !std::cout || std::ferror(stdout);
  errno = 0;
  std::cout.flush();
  std::fflush(stdout);
  const int err = failed ? earlier_errno : errno;
  if (std::cout && !std::ferror(stdout)) return;
  throw Error(std::string("cannot write the output (stdout)") +
              (err ? ": " + std::string(std::strerror(err)) : ""));
}

std::string join_ids(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s;
}

}  // namespace specdec::cli
