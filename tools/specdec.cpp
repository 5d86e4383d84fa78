// The `specdec` command-line program: generate, compare, chat, tokenize, detokenize, make-tokenizer,
// make-fixture, make-draft.
#include "specdec/specdec.hpp"

#include <ATen/Parallel.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "generation_options.hpp"
#include "serve/server.hpp"

using nlohmann::json;
using namespace specdec;

namespace {

enum class Mode { kGenerate, kCompare, kChat, kServe };

struct RunOptions {
  std::string model, draft, prompt, prompt_ids, tokenizer, device = "cpu", dtype = "float32", weights = "as-stored",
              draft_weights = "as-stored";
  std::string system, chat_template;
  bool chat = false;
  bool int8_activations = false, draft_int8_activations = false;
  int threads = 0;
  bool json_out = false;
  bool no_stream = false;
  bool no_adaptive = false;
  int warmup = 1;
  std::string prompts_file;  // generate: JSON Lines of requests
  int batch_size = 1;
  bool prompt_cache = false;  // generate --prompts-file: each request continues the previous one's caches
  bool serve = false;  // serve: no prompt; the chat template when the model has one
  GenerationConfig gen;
};

void add_run_options(CLI::App* app, RunOptions& o, Mode mode) {
  const bool compare = mode == Mode::kCompare;
  app->add_option("--model", o.model,
                  "Target checkpoint: a Hugging Face folder, a .gguf file, or a folder holding one")
      ->required();
  app->add_option("--draft", o.draft, "Draft checkpoint (same forms); omit for target-only generation");
  if (mode != Mode::kServe)
    app->add_option("--system", o.system, "Chat: the system message (default: the template's own, if any)");
  app->add_option("--chat-template", o.chat_template,
                  "Chat: chatml, llama3, llama2 or mistral (default: recognised from the model's template)");
  if (mode != Mode::kChat && mode != Mode::kServe) {
    app->add_flag("--chat", o.chat,
                  "Format the prompt as one user turn of the model's chat template; stop at its end of turn");
    auto* text = app->add_option("--prompt", o.prompt,
                                 "Prompt text (encoded with the tokenizer, BOS/EOS as it is configured); "
                                 "without --prompt or --prompt-ids the prompt is read from stdin");
    auto* ids = app->add_option("--prompt-ids", o.prompt_ids, "Prompt token ids, comma-separated (e.g. 1,2,3)")
        ->excludes(text);
    if (mode == Mode::kGenerate) {
      auto* file = app->add_option("--prompts-file", o.prompts_file,
                      "Many requests: a JSON Lines file (- for stdin), one {\"prompt\": TEXT} or {\"prompt_ids\": [...]} "
                      "per line (with --chat, one user turn, after --system or the line's own \"system\"), "
                      "with optional per-request knobs (max_new_tokens, do_sample, temperature, top_k, top_p, "
                      "min_p, repetition_penalty, frequency_penalty, presence_penalty, seed, num_assistant_tokens, num_assistant_tokens_schedule, "
                      "assistant_confidence_threshold, prompt_lookup_num_tokens, max_matching_ngram_size, id); "
                      "writes one JSON line per request, in order")
          ->excludes(text)
          ->excludes(ids);
      app->add_option("--batch-size", o.batch_size,
                      "--prompts-file: requests generated at once (1 = one after another); as each "
                      "finishes, the next joins "
                      "the running batch (continuous batching)")
          ->capture_default_str()
          ->needs(file);
      app->add_flag("--prompt-cache", o.prompt_cache,
                    "--prompts-file, one after another: each request computes only its prompt after the "
                    "longest prefix it shares with the request before it (prompt and answer), e.g. a common "
                    "system prompt; the output is the same")
          ->needs(file);
    }
  }
  app->add_option("--tokenizer", o.tokenizer,
                  "Tokenizer: a folder with tokenizer files or a .gguf (default: --model's, when it has one)");
  if (mode != Mode::kServe)
    app->add_flag("--no-stream", o.no_stream, "Print the generated text at the end, not as it is accepted");
  cli::add_generation_options(app, o.gen, o.no_adaptive);
  app->add_option("--device", o.device, "cpu, cuda or cuda:N")->capture_default_str();
  app->add_option("--dtype", o.dtype, "Compute dtype")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}))
      ->capture_default_str();
  const std::string formats = "as-stored (keep the checkpoint's format: a Q4_1 GGUF stays Q4_1), float32, bfloat16, "
                              "float16, q8_0, q4_0, q4_1 (quantized at load); packed formats need --device cpu --dtype float32";
  const std::vector<std::string> format_names = weight_format_names();
  app->add_option("--weights", o.weights, "Format of the target's weight matrices: " + formats)
      ->check(CLI::IsMember(format_names))
      ->capture_default_str();
  app->add_option("--draft-weights", o.draft_weights, "Format of the draft's weight matrices (same choices)")
      ->check(CLI::IsMember(format_names))
      ->capture_default_str();
  app->add_flag("--int8-activations", o.int8_activations,
                "Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K target weights multiply activations quantized "
                "to 8 bits (faster, as llama.cpp; "
                "the target's numbers then differ from its dequantized float32 model)");
  app->add_flag("--draft-int8-activations", o.draft_int8_activations,
                "The same for the draft (speculation stays exact whatever the draft computes)");
  app->add_option("--threads", o.threads, "CPU threads of every pool specdec computes with: libtorch's (which runs specdec's kernels) "
                  "and OpenBLAS's (0 = their defaults)")
      ->capture_default_str();
  if (mode != Mode::kChat && mode != Mode::kServe)
    app->add_flag("--json", o.json_out, "Print one JSON object on stdout");
  if (compare)
    app->add_option("--warmup", o.warmup,
                    "Untimed warm-up runs of each mode before timing (a few tokens each)")
        ->capture_default_str();
}

// Comma-separated ids; an empty list is an error unless `allow_empty` (detokenize: "" decodes to "").
std::vector<int64_t> parse_ids(const std::string& text, const char* flag = "--prompt-ids", bool allow_empty = false) {
  std::vector<int64_t> ids;
  if (allow_empty && text.empty()) return ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size())
      throw Error(std::string(flag) + ": '" + item + "' is not an integer (expected e.g. 1,2,3)");
    ids.push_back(v);
  }
  if (ids.empty()) throw Error(std::string(flag) + ": no token ids given");
  return ids;
}

std::string read_stdin() {
  if (isatty(STDIN_FILENO))
    std::cerr << "specdec: reading the prompt from stdin (end with Ctrl-D; or use --prompt TEXT)\n";
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

struct Loaded {
  std::shared_ptr<const Model> target, draft;
  std::unique_ptr<Tokenizer> tokenizer;  // null when there is none and ids are used
  std::optional<ChatTemplate> chat;      // --chat and the chat subcommand
  std::vector<int64_t> prompt;
};

// The chat format: --chat-template, else recognised from the template the model ships.
ChatTemplate chat_template(const RunOptions& o, const std::string& tok_source) {
  if (!o.chat_template.empty()) return ChatTemplate::by_name(o.chat_template);
  for (const std::string& where : {tok_source, o.model}) {
    if (auto text = read_chat_template(where)) return ChatTemplate::recognise(*text, where);
  }
  throw Error(o.model + " ships no chat template: choose one with --chat-template chatml|llama3|llama2|mistral");
}

std::vector<int64_t> encode_chat(const Loaded& l, const std::vector<ChatMessage>& messages) {
  const std::vector<int64_t> ids = l.tokenizer->encode(l.chat->render(messages, true), false);
  if (ids.empty()) throw Error("the prompt is empty");
  return ids;
}

// One user turn after the system message `system` (none when empty: the template's own, if any).
std::vector<int64_t> encode_turn(const Loaded& l, const std::string& system, const std::string& user) {
  std::vector<ChatMessage> messages;
  if (!system.empty()) messages.push_back({"system", system});
  messages.push_back({"user", user});
  return encode_chat(l, messages);
}

Loaded load(RunOptions& o, bool chat) {
  if (o.threads < 0) throw Error("--threads must be >= 0");
  try {
    if (o.threads > 0) set_num_threads(o.threads);
  } catch (const Error& e) {
    throw Error(std::string("--threads: ") + e.what());
  }
  cli::finish_generation_options(o.gen, o.no_adaptive);
  if (!chat && !o.serve && (!o.system.empty() || !o.chat_template.empty()))
    throw Error("--system and --chat-template need --chat");
  // Hugging Face runs prompt lookup when given both and leaves the assistant model unused.
  if (!o.draft.empty() && o.gen.prompt_lookup_num_tokens > 0)
    throw Error("--prompt-lookup and --draft: give one of them (prompt lookup copies from the text and runs no draft)");
  std::string prompts_file = o.prompts_file == "-" ? "" : o.prompts_file;
  for (const std::string* path : {&o.model, &o.draft, &o.tokenizer, &prompts_file}) {
    struct stat st {};
    if (!path->empty() && ::stat(path->c_str(), &st) != 0) throw Error(*path + ": no such file or folder");
  }
  // A path that is no checkpoint is named as such before any message about its tokenizer.
  for (const std::string* path : {&o.model, &o.draft})
    if (!path->empty()) ModelConfig::from_path(*path);
  Loaded l;
  const std::string tok_dir = !o.tokenizer.empty() ? o.tokenizer : has_tokenizer(o.model) ? o.model : "";
  if (!tok_dir.empty()) l.tokenizer = load_tokenizer(tok_dir);
  // A draft with tokenizer files of its own must tokenize exactly like the target.
  if (l.tokenizer && !o.draft.empty() && has_tokenizer(o.draft))
    require_same_tokenizer(*l.tokenizer, *load_tokenizer(o.draft));
  if (o.serve) {
    if (!l.tokenizer) throw Error(o.model + " has no tokenizer: give --tokenizer, which serve needs");
    // Chat requests need a template; without one they are refused (completions still work).
    try {
      l.chat = chat_template(o, tok_dir);
    } catch (const Error& e) {
      if (!o.chat_template.empty()) throw;
      std::cerr << "specdec serve: " << e.what() << " (/v1/chat/completions is refused)\n";
    }
  } else if (chat) {
    if (!o.prompt_ids.empty()) throw Error("--chat needs a text prompt (--prompt or stdin), not --prompt-ids");
    if (!l.tokenizer) throw Error(o.model + " has no tokenizer: give --tokenizer, which chat needs");
    l.chat = chat_template(o, tok_dir);
  }
  if (o.serve || !o.prompts_file.empty()) {
    // Requests come later (serve), or are read and checked by run_prompts_file.
  } else if (!o.prompt_ids.empty()) {
    l.prompt = parse_ids(o.prompt_ids);
  } else if (o.chat) {
    l.prompt = encode_turn(l, o.system, o.prompt.empty() ? read_stdin() : o.prompt);
  } else if (!chat) {
    if (!l.tokenizer)
      throw Error(o.model + " has no tokenizer files: give --tokenizer DIR, or the prompt as --prompt-ids");
    const std::string text = o.prompt.empty() ? read_stdin() : o.prompt;
    l.prompt = l.tokenizer->encode(text, true);
    if (l.prompt.empty()) throw Error("the prompt is empty");
  }
  LoadOptions lo;
  lo.device = parse_device(o.device);
  lo.dtype = parse_dtype(o.dtype);
  lo.weights = parse_weight_format(o.weights);
  lo.int8_activations = o.int8_activations;
  LoadOptions draft_lo = lo;
  draft_lo.weights = parse_weight_format(o.draft_weights);
  draft_lo.int8_activations = o.draft_int8_activations;
  l.target = load_model(o.model, lo);
  if (!o.draft.empty()) l.draft = load_model(o.draft, draft_lo);
  if (o.gen.eos_token_ids.empty()) {
    o.gen.eos_token_ids = l.target->config().eos_token_ids;
    if (o.gen.eos_token_ids.empty() && l.tokenizer && l.tokenizer->eos_token_id())
      o.gen.eos_token_ids = {*l.tokenizer->eos_token_id()};
    // A chat answer ends at the template's end-of-turn token too.
    if (l.chat) {
      const std::vector<int64_t> eot = l.tokenizer->encode(l.chat->end_of_turn(), false);
      if (eot.size() == 1 && !l.target->config().is_eos(eot[0])) o.gen.eos_token_ids.push_back(eot[0]);
    }
  }
  return l;
}

json result_json(const GenerationResult& r, const Tokenizer* tok) {
  json j = {{"tokens", r.tokens}, {"stats", json::parse(r.stats.to_json())}};
  if (tok) j["text"] = tok->decode(r.tokens, true);
  return j;
}

void print_stats(const GenerationStats& s, std::ostream& os) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%lld new tokens in %.3f s (%.2f tok/s); %lld target passes (%.2f tokens/pass), "
                "%lld draft passes, acceptance %.1f%% (%lld/%lld); stop: %s\n",
                static_cast<long long>(s.new_tokens), s.total_seconds, s.tokens_per_second(),
                static_cast<long long>(s.target_passes), s.tokens_per_target_pass(),
                static_cast<long long>(s.draft_passes), 100.0 * s.acceptance_rate(),
                static_cast<long long>(s.accepted_tokens), static_cast<long long>(s.drafted_tokens),
                s.stop_reason.c_str());
  os << buf;
  if (s.cached_prompt_tokens > 0)
    os << "(" << s.cached_prompt_tokens << " of the " << s.prompt_tokens
       << " prompt tokens came from the conversation's cache)\n";
}

std::string join_ids(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s;
}

// One request of a prompts file, validated.
struct FileRequest {
  size_t line = 0;
  json id;  // echoed back when given
  std::vector<int64_t> prompt;
  GenerationConfig config;
};

// Parses and validates every line before anything is generated: a bad line is an error naming it.
std::vector<FileRequest> read_prompts_file(const RunOptions& o, const Loaded& l) {
  std::ifstream file;
  if (o.prompts_file != "-") {
    file.open(o.prompts_file);
    if (!file) throw Error(o.prompts_file + ": cannot open: " + std::strerror(errno));
  }
  std::istream& in = o.prompts_file == "-" ? std::cin : file;
  const int64_t vocab = l.target->config().vocab_size;
  std::vector<FileRequest> out;
  std::string text;
  for (size_t n = 1; std::getline(in, text); ++n) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
    const std::string where = o.prompts_file + ":" + std::to_string(n) + ": ";
    FileRequest r;
    r.line = n;
    r.config = o.gen;
    // "prompt", and with --chat the system message (--system unless the line gives its own)
    std::string user, system = o.system;
    try {
      const json j = json::parse(text);
      if (!j.is_object()) throw Error("expected a JSON object");
      if (j.contains("prompt") == j.contains("prompt_ids")) throw Error("give exactly one of \"prompt\" and \"prompt_ids\"");
      GenerationConfig& c = r.config;
      for (const auto& [key, value] : j.items()) {
        const auto integer = [&](auto& field) {
          if (!value.is_number_integer()) throw Error("\"" + key + "\" must be an integer");
          field = value.get<std::remove_reference_t<decltype(field)>>();
        };
        const auto number = [&](double& field) {
          if (!value.is_number()) throw Error("\"" + key + "\" must be a number");
          field = value.get<double>();
        };
        if (key == "prompt") {
          if (!value.is_string()) throw Error("\"prompt\" must be a string");
          if (!l.tokenizer) throw Error(o.model + " has no tokenizer: give --tokenizer DIR, or \"prompt_ids\"");
          user = value.get<std::string>();
        } else if (key == "system") {
          if (!o.chat) throw Error("\"system\" needs --chat");
          if (!value.is_string()) throw Error("\"system\" must be a string");
          system = value.get<std::string>();
        } else if (key == "prompt_ids") {
          if (!value.is_array()) throw Error("\"prompt_ids\" must be an array of integers");
          for (const json& id : value) {
            if (!id.is_number_integer()) throw Error("\"prompt_ids\" must be an array of integers");
            r.prompt.push_back(id.get<int64_t>());
          }
        } else if (key == "id") {
          r.id = value;
        } else if (key == "max_new_tokens") integer(c.max_new_tokens);
        else if (key == "top_k") integer(c.top_k);
        else if (key == "seed") {
          if (!value.is_number_unsigned()) throw Error("\"seed\" must be a non-negative integer");
          c.seed = value.get<uint64_t>();
        } else if (key == "num_assistant_tokens") integer(c.num_assistant_tokens);
        else if (key == "prompt_lookup_num_tokens") integer(c.prompt_lookup_num_tokens);
        else if (key == "max_matching_ngram_size") integer(c.max_matching_ngram_size);
        else if (key == "assistant_confidence_threshold") number(c.assistant_confidence_threshold);
        else if (key == "temperature") number(c.temperature);
        else if (key == "top_p") number(c.top_p);
        else if (key == "min_p") number(c.min_p);
        else if (key == "repetition_penalty") number(c.repetition_penalty);
        else if (key == "frequency_penalty") number(c.frequency_penalty);
        else if (key == "presence_penalty") number(c.presence_penalty);
        else if (key == "do_sample") {
          if (!value.is_boolean()) throw Error("\"do_sample\" must be true or false");
          c.do_sample = value.get<bool>();
        } else if (key == "num_assistant_tokens_schedule") {
          if (!value.is_string()) throw Error("\"num_assistant_tokens_schedule\" must be a string");
          c.num_assistant_tokens_schedule = value.get<std::string>();
        } else {
          throw Error("unknown key \"" + key + "\"");
        }
      }
      if (j.contains("system") && !j.contains("prompt"))
        throw Error("\"system\" goes with \"prompt\", not \"prompt_ids\"");
      if (j.contains("prompt"))
        r.prompt = o.chat ? encode_turn(l, system, user) : l.tokenizer->encode(user, true);
      if (r.prompt.empty()) throw Error("the prompt is empty");
      for (int64_t id : r.prompt)
        if (id < 0 || id >= vocab)
          throw Error("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
      c.validate();
    } catch (const std::exception& e) {  // json's parse and type errors included
      throw Error(where + e.what());
    }
    out.push_back(std::move(r));
  }
  if (out.empty()) throw Error(o.prompts_file + ": no requests (one JSON object per line)");
  return out;
}

// --prompts-file: every request validated first, then generated on one Generator: one after
// another (--batch-size 1; with --prompt-cache each continuing the caches of the one before), or
// at most --batch-size at once, each finished request making room for the next (continuous
// batching; a request's own keys say whether it drafts by prompt lookup, with the draft model, or
// not at all). One JSON line per request on stdout, in order, each written as soon as it and those
// before it are done; progress on stderr.
int run_prompts_file(RunOptions& o, const Loaded& l) {
  if (o.batch_size < 1) throw Error("--batch-size must be >= 1");
  if (o.prompt_cache && o.batch_size > 1)
    throw Error("--prompt-cache runs the requests one after another: it needs --batch-size 1");
  const std::vector<FileRequest> requests = read_prompts_file(o, l);
  const Generator gen(l.target, l.draft);
  int64_t tokens = 0;
  double seconds = 0, prefill = 0;
  size_t written = 0;
  std::vector<std::optional<GenerationResult>> done(requests.size());
  const auto write_ready = [&] {
    const size_t before = written;
    for (; written < requests.size() && done[written]; ++written) {
      json line = {{"line", requests[written].line}};
      if (!requests[written].id.is_null()) line["id"] = requests[written].id;
      line.update(result_json(*done[written], l.tokenizer.get()));
      std::cout << line.dump() << "\n";
      done[written].reset();
    }
    if (written == before) return;
    std::cout << std::flush;
    std::cerr << "specdec: " << written << "/" << requests.size() << " requests\n";
  };
  const auto count = [&](const auto& stats) {  // a request's GenerationStats or a run's BatchStats
    tokens += stats.new_tokens;
    seconds += stats.total_seconds;
    prefill += stats.prefill_seconds;
  };
  if (o.prompt_cache) {
    PromptCache cache;  // one conversation: each request continues the caches of the one before
    for (size_t i = 0; i < requests.size(); ++i) {
      done[i] = gen.generate(requests[i].prompt, requests[i].config, cache);
      count(done[i]->stats);
      write_ready();
    }
  } else {
    // One batch: each row drafts as its request asks (prompt lookup, the draft model, or not).
    std::vector<std::vector<int64_t>> prompts;
    std::vector<GenerationConfig> configs;
    for (const auto& request : requests) {
      prompts.push_back(request.prompt);
      configs.push_back(request.config);
    }
    BatchOptions options;
    options.max_rows = o.batch_size;
    options.on_finished = [&](size_t row, const GenerationResult& r) {
      done[row] = r;
      write_ready();
    };
    count(gen.generate_batch(prompts, configs, {}, options).stats);
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "%lld tokens in %.3f s: %.2f tokens/s (%.2f after the prefill)",
                static_cast<long long>(tokens), seconds,
                seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0,
                seconds > prefill ? static_cast<double>(tokens) / (seconds - prefill) : 0.0);
  std::cerr << "specdec: " << requests.size() << " requests, " << buf << "\n";
  return 0;
}

int run_generate(RunOptions& o) {
  Loaded l = load(o, o.chat);
  if (!o.prompts_file.empty()) return run_prompts_file(o, l);
  Generator gen(l.target, l.draft);
  bool first = true;
  std::optional<StreamDecoder> text_stream;
  if (l.tokenizer) text_stream.emplace(*l.tokenizer, true);
  TokenCallback stream;
  if (!o.json_out && !o.no_stream)
    stream = [&](const std::vector<int64_t>& toks) {
      if (text_stream) {
        std::cout << text_stream->push(toks);
      } else {
        for (int64_t t : toks) std::cout << (first ? "" : " ") << t, first = false;
      }
      std::cout << std::flush;
    };
  const GenerationResult r = gen.generate(l.prompt, o.gen, stream);
  if (o.json_out) {
    std::cout << result_json(r, l.tokenizer.get()).dump() << "\n";
    return 0;
  }
  if (o.no_stream)
    std::cout << (l.tokenizer ? l.tokenizer->decode(r.tokens, true) : join_ids(r.tokens));
  else if (text_stream)
    std::cout << text_stream->finish();
  std::cout << "\n";
  print_stats(r.stats, std::cerr);
  return 0;
}

// Interactive conversation: a line of stdin per user turn, the answer streamed as it is verified.
// Each turn re-encodes the whole conversation; the prompt cache keeps the keys and values of the
// conversation so far, so a turn computes only what follows the previous turn's tokens.
int run_chat(RunOptions& o) {
  Loaded l = load(o, true);
  Generator gen(l.target, l.draft);
  PromptCache cache;
  std::vector<ChatMessage> messages;
  const auto reset = [&] {
    cache.clear();
    messages.clear();
    if (!o.system.empty()) messages.push_back({"system", o.system});
  };
  reset();
  const bool tty = isatty(STDIN_FILENO);
  std::cerr << "specdec chat (" << l.chat->name() << (l.draft ? ", with a draft" : "")
            << (o.gen.prompt_lookup_num_tokens > 0 ? ", prompt lookup" : "")
            << "): type a message; /reset starts over, /stats shows the last answer's statistics, /exit or "
               "Ctrl-D ends\n";
  std::optional<GenerationStats> last;
  int64_t total_tokens = 0;
  double total_seconds = 0;
  std::string line;
  while (true) {
    if (tty) std::cerr << "> " << std::flush;
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      reset();
      std::cerr << "(conversation reset)\n";
      continue;
    }
    if (line == "/stats") {
      if (last) print_stats(*last, std::cerr);
      else std::cerr << "(no answer yet)\n";
      char session[96];
      std::snprintf(session, sizeof session, "session: %lld tokens in %.3f s (%.2f tok/s)\n",
                    static_cast<long long>(total_tokens), total_seconds,
                    total_seconds > 0 ? total_tokens / total_seconds : 0.0);
      std::cerr << session;
      continue;
    }
    if (line[0] == '/') {
      std::cerr << "unknown command " << line << " (commands: /reset, /stats, /exit)\n";
      continue;
    }
    messages.push_back({"user", line});
    StreamDecoder stream(*l.tokenizer, true);
    GenerationResult r;
    try {
      const std::vector<int64_t> prompt = encode_chat(l, messages);
      // --max-new-tokens is a cap per answer; a long conversation leaves less room in the context.
      GenerationConfig turn = o.gen;
      int64_t room = l.target->config().max_position_embeddings;
      if (l.draft) room = std::min(room, l.draft->config().max_position_embeddings);
      room -= static_cast<int64_t>(prompt.size());
      if (room < 1) throw Error("the conversation fills the model's context");
      turn.max_new_tokens = std::min(turn.max_new_tokens, room);
      r = gen.generate(prompt, turn, cache, [&](const std::vector<int64_t>& t) {
        if (!o.no_stream) std::cout << stream.push(t) << std::flush;
      });
    } catch (const Error& e) {  // e.g. the conversation outgrew the context: this turn is dropped
      messages.pop_back();
      std::cerr << "specdec: error: " << e.what() << " (the conversation goes on without this turn; /reset starts over)\n";
      continue;
    }
    const std::string answer = l.tokenizer->decode(r.tokens, true);
    std::cout << (o.no_stream ? answer : stream.finish()) << "\n" << std::flush;
    messages.push_back({"assistant", answer});
    last = r.stats;
    total_tokens += r.stats.new_tokens;
    total_seconds += r.stats.total_seconds;
  }
  return 0;
}

struct TokenizeOptions {
  std::string dir, text, ids;
  bool no_special = false, skip_special = false, json_out = false;
};

int run_tokenize(const TokenizeOptions& o) {
  const auto tok = load_tokenizer(o.dir);
  const std::vector<int64_t> ids = tok->encode(o.text.empty() ? read_stdin() : o.text, !o.no_special);
  if (o.json_out) {
    std::cout << json{{"ids", ids}}.dump() << "\n";
  } else {
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? "," : "") << ids[i];
    std::cout << "\n";
  }
  return 0;
}

int run_detokenize(const TokenizeOptions& o) {
  const auto tok = load_tokenizer(o.dir);
  const std::string text = tok->decode(parse_ids(o.ids, "--ids", true), o.skip_special);
  if (o.json_out) std::cout << json{{"text", text}}.dump() << "\n";
  else std::cout << text << "\n";
  return 0;
}

int run_compare(RunOptions& o) {
  Loaded l = load(o, o.chat);
  if (!l.draft && o.gen.prompt_lookup_num_tokens == 0)
    throw Error("compare needs --draft DIR or --prompt-lookup N");
  Generator plain(l.target);
  Generator assisted(l.target, l.draft);
  GenerationConfig base = o.gen;
  base.prompt_lookup_num_tokens = 0;
  if (o.warmup < 0) throw Error("--warmup must be >= 0");
  GenerationConfig warm = o.gen, warm_base = base;
  warm.max_new_tokens = warm_base.max_new_tokens = std::min<int64_t>(4, o.gen.max_new_tokens);
  for (int i = 0; i < o.warmup; ++i) {
    plain.generate(l.prompt, warm_base);
    // A throw-away generator: the timed one must not inherit a heuristic lookahead from warm-up.
    Generator(l.target, l.draft).generate(l.prompt, warm);
  }
  if (!o.json_out) std::cerr << "target only ...\n";
  const GenerationResult a = plain.generate(l.prompt, base);
  if (!o.json_out) std::cerr << "assisted ...\n";
  const GenerationResult b = assisted.generate(l.prompt, o.gen);
  const bool identical = a.tokens == b.tokens;
  const SpeedupEstimate e = estimate_speedup(a.stats, b.stats);
  if (o.json_out) {
    std::cout << json{{"target_only", result_json(a, l.tokenizer.get())},
                      {"assisted", result_json(b, l.tokenizer.get())},
                      {"identical", identical},
                      {"speedup", e.measured},
                      {"alpha", e.alpha},
                      {"gamma", e.gamma},
                      {"cost_ratio", e.cost_ratio},
                      {"predicted_speedup", e.predicted}}
                     .dump()
              << "\n";
    return 0;
  }
  const auto shown = [&](const std::vector<int64_t>& t) {
    return l.tokenizer ? json(l.tokenizer->decode(t, true)).dump() : join_ids(t);
  };
  std::printf("target only: %s\n", shown(a.tokens).c_str());
  std::printf("assisted:    %s\n", shown(b.tokens).c_str());
  std::printf("identical:   %s%s\n", identical ? "yes" : "no",
              o.gen.sampling() ? " (sampling: outputs are independent draws, not expected equal)" : "");
  std::printf("target only: %.3f s, %.1f ms/token\n", a.stats.total_seconds,
              1e3 * a.stats.total_seconds / std::max<int64_t>(1, a.stats.new_tokens));
  std::printf("assisted:    %.3f s, %.1f ms/token; acceptance %.1f%%, %.2f tokens per target pass, "
              "%lld target passes\n",
              b.stats.total_seconds, 1e3 * b.stats.total_seconds / std::max<int64_t>(1, b.stats.new_tokens),
              100 * b.stats.acceptance_rate(), b.stats.tokens_per_target_pass(),
              static_cast<long long>(b.stats.target_passes));
  std::printf("speedup:     %.2fx (predicted %.2fx from alpha %.3f, gamma %.2f, c %.3f)\n",
              e.measured, e.predicted, e.alpha, e.gamma, e.cost_ratio);
  return 0;
}

std::atomic<bool> g_interrupted{false};

std::string duration_text(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<int64_t>(s + 0.5);
  std::ostringstream o;
  if (t >= 3600) o << t / 3600 << "h";
  if (t >= 60) o << (t % 3600) / 60 << "m";
  o << t % 60 << "s";
  return o.str();
}

// Progress on stderr: a bar redrawn in place on a terminal, else one line every 10 s and at the end
// of each phase.
class ProgressPrinter {
 public:
  void operator()(const MakeDraftProgress& p) {
    const bool tty = isatty(STDERR_FILENO);
    const auto now = std::chrono::steady_clock::now();
    const bool end = p.done == p.total;
    if (!tty && !end && now - last_ < std::chrono::seconds(10)) return;
    last_ = now;
    const int width = 24;
    const int filled = p.total > 0 ? static_cast<int>(width * p.done / p.total) : 0;
    std::ostringstream line;
    line << (p.phase == "self-prompts" ? "writing prompts   "
             : p.phase == "generate"   ? "answering prompts "
             : p.phase == "label"      ? "labelling (target)"
             : p.phase == "evaluate"   ? "answering eval    "
                                       : "training          ")
         << " [" << std::string(static_cast<size_t>(filled), '#')
         << std::string(static_cast<size_t>(width - filled), '.') << "] " << p.done << "/"
         << p.total;
    if (p.phase == "train") line << "  kl " << std::fixed << std::setprecision(4) << p.loss;
    line << "  " << std::fixed << std::setprecision(0) << p.tokens_per_s << " tok/s  ETA " << duration_text(p.eta_s);
    std::cerr << (tty ? "\r\033[K" : "") << line.str() << (tty && !end ? "" : "\n") << std::flush;
  }

 private:
  std::chrono::steady_clock::time_point last_{};
};

std::string quality_text(const DraftQuality& q) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(3) << "kl " << q.kl << ", acceptance >= " << q.acceptance
    << ", greedy agreement " << q.greedy_agreement << " (" << q.positions << " positions)";
  return o.str();
}

int run_make_draft(const MakeDraftOptions& o) {
  // Ctrl-C asks for a clean stop (a checkpoint is written); a second one kills the program.
  g_interrupted = false;
  std::signal(SIGINT, [](int) {
    g_interrupted = true;
    std::signal(SIGINT, SIG_DFL);
  });
  ProgressPrinter printer;
  const MakeDraftResult r = make_draft(o, std::ref(printer), &g_interrupted);
  std::signal(SIGINT, SIG_DFL);
  if (r.interrupted && r.steps_done == 0 && !o.resume) {
    std::cerr << "\ninterrupted before the first checkpoint: nothing was written\n";
    return 130;
  }
  std::cerr << "held-out, before training: " << quality_text(r.before) << "\n"
            << "held-out, after " << r.steps_done << " steps: " << quality_text(r.after) << "\n";
  if (r.eval.positions > 0) std::cerr << "eval prompts' answers: " << quality_text(r.eval) << "\n";
  if (r.interrupted) {
    std::cerr << "interrupted: " << o.out << " holds the checkpoint of step " << r.steps_done
              << "; continue with the same command and --resume\n";
    return 130;
  }
  std::cerr << "wrote " << o.out << "\n";
  return 0;
}

}  // namespace

int run_serve(RunOptions& o, const serve::ServeOptions& so, bool max_tokens_given) {
  o.serve = true;
  return serve::run_serve(so, [&o, max_tokens_given] {
    Loaded l = load(o, false);
    serve::ServeModels m;
    m.target = l.target;
    m.draft = l.draft;
    m.tokenizer = std::move(l.tokenizer);
    m.chat = l.chat;
    if (m.chat) {
      const std::vector<int64_t> eot = m.tokenizer->encode(m.chat->end_of_turn(), false);
      if (eot.size() == 1 && !l.target->config().is_eos(eot[0])) m.chat_eos.push_back(eot[0]);
    }
    m.defaults = o.gen;
    if (max_tokens_given) m.max_tokens = o.gen.max_new_tokens;
    std::string name = o.model;
    while (name.size() > 1 && name.back() == '/') name.pop_back();
    m.model_id = name.substr(name.find_last_of('/') + 1);
    return m;
  });
}

int main(int argc, char** argv) {
  CLI::App app{"specdec: speculative decoding (assisted generation) on libtorch"};
  app.require_subcommand(1);
  RunOptions gen_opts, cmp_opts;
  auto* gen = app.add_subcommand("generate", "Generate tokens (assisted when --draft is given)");
  add_run_options(gen, gen_opts, Mode::kGenerate);
  auto* cmp = app.add_subcommand(
      "compare", "Target-only and assisted generation on the same prompt: outputs, times, speedup");
  add_run_options(cmp, cmp_opts, Mode::kCompare);
  RunOptions chat_opts;
  chat_opts.gen.max_new_tokens = 256;
  auto* chat = app.add_subcommand(
      "chat", "Interactive multi-turn conversation with the model's chat template, streamed; /reset, /stats");
  add_run_options(chat, chat_opts, Mode::kChat);

  RunOptions serve_opts;
  serve_opts.gen.top_k = 0;  // OpenAI's requests know no top_k: off unless a request or --top-k sets it
  serve::ServeOptions serve_server;
  auto* srv = app.add_subcommand(
      "serve", "An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /metrics, a chat page at /)");
  add_run_options(srv, serve_opts, Mode::kServe);
  serve::add_serve_options(srv, serve_server);
  // A request's own fields take the place of these (a request without a seed draws a random one).
  for (const char* flag : {"--do-sample", "--seed"}) srv->remove_option(srv->get_option(flag));
  srv->get_option("--max-new-tokens")
      ->description("max_tokens of a request that sets none (unset: 16 for a completion, the rest of --ctx for a chat)")
      ->default_str("");
  srv->get_option("--temperature")->description("temperature of a request that sets none (0 = greedy)");

  TokenizeOptions tk, dtk;
  auto* tokc = app.add_subcommand("tokenize", "Text to token ids (the text from --text or stdin)");
  tokc->add_option("--tokenizer", tk.dir, "Folder with the tokenizer files")->required();
  tokc->add_option("--text", tk.text, "Text to encode; without it, stdin is read");
  tokc->add_flag("--no-special", tk.no_special, "Do not add BOS/EOS (special-token text is still recognised)");
  tokc->add_flag("--json", tk.json_out, "Print {\"ids\": [...]}");
  auto* detok = app.add_subcommand("detokenize", "Token ids to text");
  detok->add_option("--tokenizer", dtk.dir, "Folder with the tokenizer files")->required();
  detok->add_option("--ids", dtk.ids, "Token ids, comma-separated (\"\" for none)")->required();
  detok->add_flag("--skip-special", dtk.skip_special, "Leave special tokens (BOS, EOS, ...) out");
  detok->add_flag("--json", dtk.json_out, "Print {\"text\": \"...\"}");

  std::string mt_input, mt_out, mt_type = "bpe";
  int64_t mt_vocab = 4096;
  auto* mtok = app.add_subcommand(
      "make-tokenizer", "Train a SentencePiece tokenizer (tokenizer.model) on text files, for generated checkpoints");
  mtok->add_option("--input", mt_input, "Text files, comma-separated")->required();
  mtok->add_option("--out", mt_out, "Output folder (receives tokenizer.model)")->required();
  mtok->add_option("--vocab-size", mt_vocab,
                   "Number of pieces, including the 256 byte pieces of byte fallback and <unk>, <s>, </s>")
      ->capture_default_str();
  mtok->add_option("--model-type", mt_type, "SentencePiece model type")
      ->check(CLI::IsMember({"bpe", "unigram"}))
      ->capture_default_str();

  FixtureOptions fx;
  std::string out, draft_of;
  int64_t draft_layers = 1;
  double noise = 0.0;
  auto* mk = app.add_subcommand("make-fixture",
                                "Write a deterministic random-weight checkpoint in Hugging Face layout");
  mk->add_option("--out", out, "Output folder")->required();
  mk->add_option("--arch", fx.arch, "Architecture (t5: encoder-decoder T5ForConditionalGeneration)")
      ->check(CLI::IsMember({"llama", "mistral", "qwen2", "gpt_neox", "gpt2", "opt", "t5"}))
      ->capture_default_str();
  mk->add_option("--layers", fx.layers,
                 "Decoder layers (t5: encoder and decoder layers each; with --draft-of: decoder layers "
                 "kept, a t5 draft keeps the whole encoder)")
      ->capture_default_str();
  mk->add_option("--hidden", fx.hidden, "Hidden size")->capture_default_str();
  mk->add_option("--heads", fx.heads, "Attention heads")->capture_default_str();
  mk->add_option("--kv-heads", fx.kv_heads, "Key/value heads (0 = --heads)")->capture_default_str();
  mk->add_option("--intermediate", fx.intermediate, "MLP size (0 = 4 x hidden)")->capture_default_str();
  mk->add_option("--vocab", fx.vocab, "Vocabulary size")->capture_default_str();
  mk->add_option("--max-pos", fx.max_pos, "max_position_embeddings")->capture_default_str();
  mk->add_option("--seed", fx.seed, "Seed of the weights")->capture_default_str();
  mk->add_option("--dtype", fx.dtype, "Saved dtype")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}))
      ->capture_default_str();
  mk->add_option("--init-std", fx.init_std, "Standard deviation of the weights")->capture_default_str();
  mk->add_option("--exit-layers", fx.exit_layers,
                 "Scale o_proj/down_proj of layers >= N by --exit-scale (synthetic early-exit pair; "
                 "0 with --exit-scale 0: a bigram model that still runs every layer)")
      ->capture_default_str();
  mk->add_option("--exit-scale", fx.exit_scale, "See --exit-layers")->capture_default_str();
  mk->add_flag("--gated", fx.gated_act,
              "t5: gated-GELU feed-forward as in t5-v1_1 / flan-t5 (default: ReLU as in t5)");
  mk->add_flag("--tie-word-embeddings", fx.tie_word_embeddings,
               "Tie the head to the input embeddings (t5: then scaled by d_model^-0.5)");
  mk->add_option("--tokenizer", fx.tokenizer_dir,
                 "Copy this folder's tokenizer files in; --vocab becomes the tokenizer's size");
  mk->add_option("--draft-of", draft_of,
                 "Derive an early-exit draft from this target: its embeddings, first --layers "
                 "layers, final norm and head");
  mk->add_option("--noise", noise, "--draft-of: add Gaussian noise of this standard deviation")
      ->capture_default_str();

  MakeDraftOptions md;
  auto* mkd = app.add_subcommand(
      "make-draft",
      "Distil a small draft from a llama-family target: its first layers, a head over the most frequent "
      "tokens, trained with libtorch to match the target's next-token distributions");
  mkd->add_option("--target", md.target, "Target checkpoint: folder, or GGUF file / folder holding one")->required();
  mkd->add_option("--out", md.out, "Output folder (must not exist unless --resume)")->required();
  mkd->add_option("--layers", md.layers, "Keep the target's first N layers")->capture_default_str();
  mkd->add_option("--layer-ids", md.layer_ids, "Keep exactly these target layers (comma-separated), instead of --layers")
      ->delimiter(',');
  auto* vs = mkd->add_option("--vocab-subset", md.vocab_subset,
                             "Head over the V' most frequent tokens of the training text (plus EOS); default: "
                             "the whole vocabulary");
  mkd->add_flag("--features", md.features,
                "A feature-fed (EAGLE-style) draft: it also reads the target's last hidden state of the "
                "position before (kept by the target's cache as it verifies); --data-from needs data made with it");
  mkd->add_flag("--int8-activations", md.int8_activations,
                "The target computes with 8-bit activations wherever make-draft runs it (as it serves "
                "with --int8-activations; data made faster)");
  mkd->add_option("--data", md.data_files, "Plain-text training files (off-policy)");
  mkd->add_option("--prompts", md.prompts_file,
                  "Prompts, one per line, that the target answers itself (on-policy training text; its chat "
                  "template is applied when it has one)");
  mkd->add_option("--self-prompts", md.self_prompts,
                  "The target writes N user messages itself (sampled from the start of a user turn "
                  "of its chat "
                  "template) and answers them: on-policy training text without a prompt list")
      ->capture_default_str();
  mkd->add_option("--data-from", md.data_from,
                  "Reuse the training text and target labels of an earlier make-draft output "
                  "folder (same target "
                  "and --seq-len) instead of --data/--prompts/--self-prompts");
  mkd->add_option("--eval-prompts", md.eval_prompts,
                  "Prompts, one per line (keep them out of the training text), that the target answers greedily "
                  "after training: the draft is measured on those answers (their greedy agreement is the share of "
                  "first proposals generation keeps on such prompts)");
  mkd->add_option("--gen-tokens", md.gen_tokens, "--prompts, --self-prompts, --eval-prompts: new tokens per answer")
      ->capture_default_str();
  mkd->add_option("--gen-temperature", md.gen_temperatures,
                  "--prompts, --self-prompts: answers' sampling temperature(s), comma-separated; "
                  "each prompt is answered once per "
                  "temperature (0 = the greedy answer)")
      ->delimiter(',')
      ->capture_default_str();
  mkd->add_option("--steps", md.steps, "Optimizer steps in all (with --resume: the total to reach; 0: write the untrained draft)")
      ->capture_default_str();
  mkd->add_option("--seq-len", md.seq_len, "Tokens per training sequence")->capture_default_str();
  mkd->add_option("--batch", md.batch, "Sequences per step")->capture_default_str();
  mkd->add_option("--lr", md.lr, "AdamW peak learning rate (warm-up over the first 5% of steps, cosine decay to 10%)")
      ->capture_default_str();
  mkd->add_option("--threads", md.threads, "CPU threads (0 = libtorch's default)")->capture_default_str();
  mkd->add_option("--seed", md.seed, "Seed of the data order and of the sampled answers")->capture_default_str();
  mkd->add_option("--checkpoint-every", md.checkpoint_every, "Steps between checkpoints (one is also written at the end)")
      ->capture_default_str();
  mkd->add_flag("--resume", md.resume,
                "Continue the run saved in --out (its layers, head and data are kept; --steps is the new total)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*gen) return run_generate(gen_opts);
    if (*cmp) return run_compare(cmp_opts);
    if (*chat) return run_chat(chat_opts);
    if (*srv) return run_serve(serve_opts, serve_server, srv->get_option("--max-new-tokens")->count() > 0);
    if (*tokc) return run_tokenize(tk);
    if (*mtok) {
      if (mt_vocab < 8) throw Error("--vocab-size must be >= 8");
      if (::mkdir(mt_out.c_str(), 0755) != 0 && errno != EEXIST)
        throw Error(mt_out + ": cannot create folder: " + std::strerror(errno));
      std::cerr << "training a " << mt_vocab << "-piece SentencePiece " << mt_type << " model ...\n";
      train_sentencepiece("--input=" + mt_input + " --model_prefix=" + mt_out + "/tokenizer --vocab_size=" +
                          std::to_string(mt_vocab) + " --model_type=" + mt_type +
                          " --byte_fallback=true --character_coverage=1.0");
      std::remove((mt_out + "/tokenizer.vocab").c_str());
      std::cerr << "wrote " << mt_out << "/tokenizer.model\n";
      return 0;
    }
    if (*detok) return run_detokenize(dtk);
    if (*mkd) {
      if (vs->count() > 0 && md.vocab_subset < 1) throw Error("make-draft: --vocab-subset must be >= 1");
      return run_make_draft(md);
    }
    if (*mk) {
      if (!draft_of.empty()) {
        make_draft_of(draft_of, out, fx.layers, noise, fx.seed);
      } else {
        make_fixture(out, fx);
      }
      std::cerr << "wrote " << out << "\n";
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "specdec: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
