// `specdec generate` (one prompt, or a prompts file) and `specdec compare`.
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>

#include "cli.hpp"
#include "flag_errors.hpp"
#include "interrupt.hpp"
#include "json.hpp"
#include "proposer_choice.hpp"
#include "serve/protocol.hpp"
#include "util.hpp"

using nlohmann::json;

namespace specdec::cli {

const std::vector<std::string>& prompts_file_knobs() {
  // clang-format off
  static const std::vector<std::string> knobs = {
      "max_new_tokens", "min_new_tokens", "do_sample", "temperature", "top_k", "top_p", "min_p",
      "repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias", "seed",
      "num_assistant_tokens", "num_assistant_tokens_schedule", "draft_tree_width",
      "assistant_confidence_threshold", "prompt_lookup_num_tokens", "speculate",
      "max_matching_ngram_size", "id"};
  // clang-format on
  return knobs;
}

namespace {

// One request of a prompts file, validated.
struct FileRequest {
  size_t line = 0;
  json id;  // echoed back when given
  std::vector<int64_t> prompt;
  GenerationConfig config;
};

// A float with an integral value that a double holds exactly (4.0): an integer, as the server and
// pydantic take it.
bool integral_float(const json& v) {
  return v.is_number_float() && detail::integral(v) && std::abs(v.get<double>()) < 0x1p53;
}

// A line's "messages", read as a chat request's (serve::chat_messages); --system goes first when
// none of them is a system message.
std::vector<ChatMessage> line_messages(const json& value, const Loaded& l,
                                       const std::optional<std::string>& system) {
  std::vector<ChatMessage> out = serve::chat_messages(value, *l.chat);
  if (system && std::none_of(out.begin(), out.end(),
                             [](const ChatMessage& m) { return m.role == "system"; }))
    out.insert(out.begin(), {"system", *system});
  return out;
}

// Parses and validates every line before anything is generated: a bad line is an error naming it.
std::vector<FileRequest> read_prompts_file(const RunOptions& o, const Loaded& l,
                                           const Generator& gen) {
  std::ifstream file;
  if (o.prompts_file != "-") {
    file.open(o.prompts_file);
    if (!file) throw Error(o.prompts_file + ": cannot open: " + std::strerror(errno));
  }
  std::istream& in = o.prompts_file == "-" ? std::cin : file;
  const int64_t vocab = l.target->config().vocab_size;
  std::vector<FileRequest> out;
  int64_t greedy_with_knobs = 0;  // lines, the first of them named
  std::string first_greedy;
  std::string text;
  for (size_t n = 1; std::getline(in, text); ++n) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
    const std::string where = o.prompts_file + ":" + std::to_string(n) + ": ";
    FileRequest r;
    r.line = n;
    r.config = o.gen;
    // "prompt", and with --chat the system message (--system unless the line gives its own)
    std::string user;
    std::optional<std::string> system = o.system_message();
    try {
      const json j = detail::parse_json_bounded(text, "");
      if (!j.is_object()) throw Error("expected a JSON object");
      GenerationConfig& c = r.config;
      for (const auto& [key, value] : j.items()) {
        const auto integer = [&](auto& field) {
          if (integral_float(value)) {
            field = static_cast<std::remove_reference_t<decltype(field)>>(value.get<double>());
            return;
          }
          if (!value.is_number_integer()) throw Error("\"" + key + "\" must be an integer");
          if (value.is_number_unsigned() &&
              value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            throw Error("\"" + key + "\" is out of range, got " + value.dump());
          field = value.get<std::remove_reference_t<decltype(field)>>();
        };
        const auto number = [&](double& field) {
          if (!value.is_number()) throw Error("\"" + key + "\" must be a number");
          field = value.get<double>();
        };
        if ((key == "prompt" || key == "messages") && !l.tokenizer)
          throw Error(o.model + " has no tokenizer: give --tokenizer DIR, or \"prompt_ids\"");
        if (key == "prompt") {
          if (!value.is_string()) throw Error("\"prompt\" must be a string");
          user = value.get<std::string>();
        } else if (key == "messages") {
          if (!o.chat) throw Error("\"messages\" needs --chat");
          r.prompt = encode_chat(l, line_messages(value, l, system));
        } else if (key == "system") {
          if (!o.chat) throw Error("\"system\" needs --chat");
          if (!value.is_string()) throw Error("\"system\" must be a string");
          system = value.get<std::string>();
        } else if (key == "prompt_ids") {
          if (o.chat) throw Error("\"prompt_ids\" with --chat: a chat turn is text (\"prompt\")");
          if (!value.is_array()) throw Error("\"prompt_ids\" must be an array of integers");
          for (json id : value) {
            if (integral_float(id)) id = static_cast<int64_t>(id.get<double>());
            if (!id.is_number_integer()) throw Error("\"prompt_ids\" must be an array of integers");
            if (id.is_number_unsigned() && id.get<uint64_t>() > static_cast<uint64_t>(vocab))
              throw Error("prompt token id " + id.dump() + " is outside the vocabulary [0, " +
                          std::to_string(vocab) + ")");
            r.prompt.push_back(id.get<int64_t>());
          }
        } else if (key == "id") {
          r.id = value;
        } else if (key == "max_new_tokens")
          integer(c.max_new_tokens);
        else if (key == "min_new_tokens")
          integer(c.min_new_tokens);
        else if (key == "top_k")
          integer(c.top_k);
        else if (key == "seed") {
          if (integral_float(value) && value.get<double>() >= 0)
            c.seed = static_cast<uint64_t>(value.get<double>());
          else if (!value.is_number_unsigned())
            throw Error("\"seed\" must be a non-negative integer");
          else
            c.seed = value.get<uint64_t>();
        } else if (key == "num_assistant_tokens")
          integer(c.num_assistant_tokens);
        else if (key == "draft_tree_width")
          integer(c.draft_tree_width);
        else if (key == "prompt_lookup_num_tokens")
          integer(c.prompt_lookup_num_tokens);
        else if (key == "max_matching_ngram_size")
          integer(c.max_matching_ngram_size);
        else if (key == "assistant_confidence_threshold")
          number(c.assistant_confidence_threshold);
        else if (key == "temperature")
          number(c.temperature);
        else if (key == "top_p")
          number(c.top_p);
        else if (key == "min_p")
          number(c.min_p);
        else if (key == "repetition_penalty")
          number(c.repetition_penalty);
        else if (key == "frequency_penalty")
          number(c.frequency_penalty);
        else if (key == "presence_penalty")
          number(c.presence_penalty);
        else if (key == "logit_bias") {  // OpenAI's shape: {"token id": bias}
          if (!value.is_object()) throw Error("\"logit_bias\" must be an object {\"ID\": BIAS}");
          for (const auto& [id, bias] : value.items()) {
            const bool digits = !id.empty() && id.size() < 19 &&
                                id.find_first_not_of("0123456789") == std::string::npos;
            if (!digits || !bias.is_number())
              throw Error("\"logit_bias\" must be an object {\"ID\": BIAS}, got " + value.dump());
            c.logit_bias.emplace_back(std::stoll(id), bias.get<double>());
          }
        } else if (key == "do_sample") {
          if (!value.is_boolean()) throw Error("\"do_sample\" must be true or false");
          c.do_sample = value.get<bool>();
        } else if (key == "speculate") {
          if (!value.is_string() || (value != "suffix" && value != "none"))
            throw Error("\"speculate\" must be \"suffix\" or \"none\"");
          c.suffix_speculation = value == "suffix";
        } else if (key == "num_assistant_tokens_schedule") {
          if (!value.is_string()) throw Error("\"num_assistant_tokens_schedule\" must be a string");
          c.num_assistant_tokens_schedule = value.get<std::string>();
        } else {
          std::vector<std::string> keys = prompts_file_knobs();
          keys.insert(keys.end(), {"prompt", "prompt_ids", "messages", "system"});
          // OpenAI's names for what the file's keys (Hugging Face's) say.
          const std::string near = key == "max_tokens" || key == "max_completion_tokens"
                                       ? "max_new_tokens"
                                       : closest(key, keys);
          throw Error("unknown key \"" + key + "\"" +
                      (near.empty() ? "" : " (did you mean \"" + near + "\"?)"));
        }
      }
      if (j.contains("prompt") + j.contains("prompt_ids") + j.contains("messages") != 1)
        throw Error("give exactly one of \"prompt\", \"prompt_ids\" and \"messages\"");
      if (c.draft_tree_width > 1 && j.contains("draft_tree_width") && o.draft.empty())
        throw Error("\"draft_tree_width\" needs --draft");
      // A line's choice of proposer replaces the flags' (as a server request's does).
      choose_proposer(c, j.contains("prompt_lookup_num_tokens"), j.contains("speculate"));
      if (j.contains("system") && !j.contains("prompt"))
        throw Error(j.contains("messages")
                        ? "\"system\" goes with \"prompt\": \"messages\" hold their own"
                        : "\"system\" goes with \"prompt\", not \"prompt_ids\"");
      // Sampling knobs on a greedy line do nothing (warned about once, after the lines).
      std::string idle;
      for (const char* k : {"temperature", "top_k", "top_p", "min_p", "seed"})
        if (!c.do_sample && j.contains(k)) idle += std::string(idle.empty() ? "" : ", ") + k;
      if (!idle.empty() && greedy_with_knobs++ == 0)
        first_greedy = "line " + std::to_string(n) + ": " + idle;
      if (j.contains("prompt"))
        r.prompt = o.chat ? encode_turn(l, system, user) : l.tokenizer->encode(user, true);
      gen.check(r.prompt, c);  // (the context included: nothing runs unless every line fits)
    } catch (const std::exception& e) {  // json's parse and type errors included
      // (the line is parsed alone: the parser's "line 1" is the file's line n)
      throw Error(where + in_key_words(replace_all(detail::json_message(e), "at line 1, column",
                                                   "at column")));
    }
    out.push_back(std::move(r));
  }
  if (out.empty()) throw Error(o.prompts_file + ": no requests (one JSON object per line)");
  if (greedy_with_knobs > 0)
    warn(o.prompts_file + ": " + std::to_string(greedy_with_knobs) +
         (greedy_with_knobs == 1 ? " greedy line sets" : " greedy lines set") +
         " sampling keys, which apply with \"do_sample\": true (or --do-sample) only (" +
         first_greedy + ")");
  return out;
}

// --prompts-file: every request validated first, then generated on one Generator: one after
// another (--batch-size 1; with --prompt-cache each continuing the caches of the one before), or
// at most --batch-size at once, each finished request making room for the next (continuous
// batching; a request's own keys say whether it drafts by prompt lookup, suffix speculation, with
// the draft model, or not at all). One JSON line per request on stdout, in order, each written as
// soon as it and those before it are done; progress on stderr.
int run_prompts_file(RunOptions& o, const Loaded& l) {
  if (o.batch_size < 1) throw Error("--batch-size must be >= 1");
  if (o.prompt_cache && o.batch_size > 1)
    throw Error("--prompt-cache runs the requests one after another: it needs --batch-size 1");
  Generator gen(l.target, l.draft);
  gen.set_suffix_options(o.suffix);
  const std::vector<FileRequest> requests = read_prompts_file(o, l, gen);
  // The flags no line uses (a line's own knobs are not warned about).
  std::vector<std::string> unused = inapplicable_flags(o, requests[0].config);
  for (auto r = requests.begin() + 1; r != requests.end(); ++r) {
    const std::vector<std::string> here = inapplicable_flags(o, r->config);
    unused.erase(std::remove_if(unused.begin(), unused.end(),
                                [&](const std::string& w) {
                                  return std::find(here.begin(), here.end(), w) == here.end();
                                }),
                 unused.end());
  }
  for (const std::string& w : unused) warn(w);
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
    flush_output();  // (a lost line ends the run)
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
    // A line that cannot be written ends the run: the rows left are cancelled at their first
    // tokens (those still waiting are admitted, then cancelled), the error reported.
    std::exception_ptr lost;
    options.on_finished = [&](size_t row, const GenerationResult& r) {
      done[row] = r;
      try {
        write_ready();
      } catch (const Error&) {
        if (!lost) lost = std::current_exception();  // (the first says why; later ones cannot)
      }
    };
    const BatchTokenCallback stop_when_lost = [&](size_t, const std::vector<int64_t>&) {
      if (lost) throw Cancelled();
    };
    count(gen.generate_batch(prompts, configs, stop_when_lost, options).stats);
    if (lost) std::rethrow_exception(lost);
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "%lld tokens in %.3f s: %.2f tokens/s (%.2f after the prefill)",
                static_cast<long long>(tokens), seconds,
                seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0,
                seconds > prefill ? static_cast<double>(tokens) / (seconds - prefill) : 0.0);
  std::cerr << "specdec: " << requests.size()
            << (requests.size() == 1 ? " request, " : " requests, ") << buf << "\n";
  return 0;
}

}  // namespace

int run_generate(RunOptions& o) {
  Loaded l = load(o, o.chat);
  if (!o.prompts_file.empty()) return run_prompts_file(o, l);
  Generator gen(l.target, l.draft);
  gen.set_suffix_options(o.suffix);
  bool first = true;
  std::optional<StreamDecoder> text_stream;
  if (l.tokenizer) text_stream.emplace(*l.tokenizer, true);
  TokenCallback stream;
  // Ctrl-C while the answer streams stops it where it is: the line ends, the stats line says
  // "stop: cancelled", and the program ends by the signal (exit status 130).
  std::optional<StopAnswerOnInterrupt> interrupt;
  PrefillNotice notice(static_cast<int64_t>(l.prompt.size()));
  if (!o.json_out && !o.no_stream) {
    stream = [&](const std::vector<int64_t>& toks) {
      notice.update(toks);
      // Ctrl-C before these tokens (while the prompt went in): none of them is shown or kept.
      if (interrupt->stop()) throw Cancelled(0);
      if (text_stream) {
        std::cout << text_stream->push(toks);
      } else {
        for (int64_t t : toks) std::cout << (first ? "" : " ") << t, first = false;
      }
      flush_output();  // (an output that cannot be written stops the generation, with its reason)
      if (interrupt->stop()) throw Cancelled();  // (the tokens shown so far are the answer)
    };
    interrupt.emplace();
    interrupt->answering(true);
  } else {
    stream = [&](const std::vector<int64_t>& toks) { notice.update(toks); };
  }
  const GenerationResult r = gen.generate(l.prompt, o.gen, stream);
  notice.erase();
  const bool interrupted = interrupt && interrupt->stop();
  interrupt.reset();
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
  if (interrupted) {
    // Ended by the signal, so that a calling shell sees the interrupt (a loop in a script stops
    // as it would have, had the program died at once); 130, its status, where it survives.
    flush_output();
    ::signal(SIGINT, SIG_DFL);
    ::raise(SIGINT);
    return 130;
  }
  return 0;
}

int run_compare(RunOptions& o) {
  if (o.draft.empty() && !o.gen.speculates_without_model())  // (before anything loads)
    throw Error("compare needs --draft PATH, --prompt-lookup N or --speculate suffix");
  Loaded l = load(o, o.chat);
  Generator plain(l.target);
  Generator assisted(l.target, l.draft);
  assisted.set_suffix_options(o.suffix);
  GenerationConfig base = o.gen;
  base.prompt_lookup_num_tokens = 0;
  base.suffix_speculation = false;
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
  // estimate_speedup predicts nothing for trees (Leviathan's formula is a chain's), when nothing
  // was drafted, or when the draft's cost was not measured.
  const char* no_prediction = e.predicted > 0           ? nullptr
                              : b.stats.tree_passes > 0 ? "no prediction for trees"
                              : b.stats.drafted_tokens == 0
                                  ? "no prediction: nothing drafted"
                                  : "no prediction: the draft drafted in the first iteration only, "
                                    "so its cost per token was not measured";
  if (o.json_out) {
    std::cout << json{{"target_only", result_json(a, l.tokenizer.get())},
                      {"assisted", result_json(b, l.tokenizer.get())},
                      {"identical", identical},
                      {"speedup", e.measured},
                      {"alpha", e.alpha},
                      {"gamma", e.gamma},
                      {"cost_ratio", e.cost_measured ? json(e.cost_ratio) : json(nullptr)},
                      {"predicted_speedup", no_prediction ? json(nullptr) : json(e.predicted)},
                      {"pass_ratio", e.pass_ratio > 0 ? json(e.pass_ratio) : json(nullptr)},
                      {"predicted_speedup_with_pass_cost",
                       e.predicted_with_passes > 0 ? json(e.predicted_with_passes) : json(nullptr)}}
                     .dump()
              << "\n";
    return 0;
  }
  const auto shown = [&](const std::vector<int64_t>& t) {
    return l.tokenizer ? json(l.tokenizer->decode(t, true)).dump() : join_ids(t);
  };
  std::printf("target only: %s\n", shown(a.tokens).c_str());
  std::printf("assisted:    %s\n", shown(b.tokens).c_str());
  std::printf(
      "identical:   %s%s\n", identical ? "yes" : "no",
      !identical && o.gen.sampling() && !o.draft.empty() && o.gen.draft_tree_width <= 1
          ? " (sampling with a draft model's chain: outputs are independent draws, not expected "
            "equal)"
          : "");
  std::printf("target only: %.3f s, %.1f ms/token\n", a.stats.total_seconds,
              1e3 * a.stats.total_seconds / std::max<int64_t>(1, a.stats.new_tokens));
  std::printf(
      "assisted:    %.3f s, %.1f ms/token; %s, %.2f tokens per target pass, %lld target passes\n",
      b.stats.total_seconds, 1e3 * b.stats.total_seconds / std::max<int64_t>(1, b.stats.new_tokens),
      acceptance_text(b.stats).c_str(), b.stats.tokens_per_target_pass(),
      static_cast<long long>(b.stats.target_passes));
  if (no_prediction) {
    char c[32] = "unknown";
    if (e.cost_measured) std::snprintf(c, sizeof c, "%.3f", e.cost_ratio);
    std::printf("speedup:     %.2fx (%s; alpha %.3f, gamma %.2f, c %s)\n", e.measured,
                no_prediction, e.alpha, e.gamma, c);
  } else if (e.predicted_with_passes > 0) {
    // Leviathan et al.'s formula prices a verification pass as one decode step; on a CPU a pass of
    // gamma + 1 tokens costs more, which the first prediction shows.
    std::printf(
        "speedup:     %.2fx (predicted %.2fx from alpha %.3f, gamma %.2f, c %.3f and a "
        "verification pass of %.2f decode steps; %.2fx if it cost one, as Leviathan et al. "
        "assume)\n",
        e.measured, e.predicted_with_passes, e.alpha, e.gamma, e.cost_ratio, e.pass_ratio,
        e.predicted);
  } else {
    std::printf("speedup:     %.2fx (predicted %.2fx from alpha %.3f, gamma %.2f, c %.3f)\n",
                e.measured, e.predicted, e.alpha, e.gamma, e.cost_ratio);
  }
  return 0;
}

}  // namespace specdec::cli
