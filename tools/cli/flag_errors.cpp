#include "flag_errors.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <utility>

#include "util.hpp"

namespace specdec::cli {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string closest(const std::string& typed, const std::vector<std::string>& names) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, typed.size() / 4) + 1;
  for (const std::string& n : names) {
    const size_t d = n.rfind(typed, 0) == 0 ? 1 : edit_distance(typed, n);
    if (d < best_distance) best = n, best_distance = d;
  }
  return best;
}

namespace {

// Flags Hugging Face's generate() or other programs have, and what specdec does instead.
const char* instead_of(const std::string& sub, const std::string& flag) {
  static const char* const no_beams =
      "beam search is not supported: generation is greedy, or sampled with --do-sample";
  static const std::vector<std::pair<std::string, const char*>> any = {
      {"--num-beams", no_beams},
      {"--max-length", "specdec counts new tokens: --max-new-tokens"},
      {"--max-tokens", "OpenAI's max_tokens is a request's field; the flag is --max-new-tokens"},
      {"--num-return-sequences", "one answer per prompt (--prompts-file runs many prompts)"},
      // llama.cpp's and vLLM's (llama.cpp's short ones included)
      {"-m", "the model is --model"},
      {"--model-path", "the model is --model"},
      {"-t", "the threads are --threads"},
      {"-tb", "the threads are --threads"},
      {"--threads-batch", "the threads are --threads"},
  };
  // Hugging Face's other logits processors and beam-search knobs.
  static const std::vector<std::string> filters = {"--no-repeat-ngram-size", "--typical-p",
                                                   "--epsilon-cutoff", "--eta-cutoff",
                                                   "--encoder-repetition-penalty"};
  static const std::vector<std::string> beams = {"--num-beam-groups", "--diversity-penalty",
                                                 "--length-penalty", "--early-stopping"};
  const bool samples = sub == "generate" || sub == "compare" || sub == "chat";
  if (samples && std::find(filters.begin(), filters.end(), flag) != filters.end())
    return "not implemented: the samplers are --temperature, --top-k, --top-p and --min-p, with "
           "--repetition-penalty, --frequency-penalty and --presence-penalty";
  if (samples && std::find(beams.begin(), beams.end(), flag) != beams.end()) return no_beams;
  const bool drafts = sub == "generate" || sub == "compare" || sub == "chat" || sub == "serve";
  if (drafts && (flag == "--assistant-model" || flag == "--draft-model" ||
                 flag == "--model-draft" || flag == "--speculative-model"))
    return "the draft model is --draft";
  if (drafts && flag == "--suffix-speculation") return "suffix speculation is --speculate suffix";
  if (drafts && flag == "--assistant-early-exit")
    return "no early-exit self-speculation: specdec make-draft makes a draft from the target's "
           "first layers";
  if (drafts && flag == "--assistant-tokenizer")
    return "a draft must use the target's tokenizer (no universal assisted decoding)";
  if (sub == "chat" && (flag == "--prompt" || flag == "--prompt-ids"))
    return "chat reads each turn from stdin; generate takes --prompt";
  if (sub == "serve" && flag == "--num-beams")
    return "beam search is not supported: a request is greedy, or sampled when its \"temperature\" "
           "is 1e-5 or more";
  if (sub == "serve" && flag == "--do-sample")
    return "a request samples when its temperature is 1e-5 or more; --temperature is the default "
           "of a request without one";
  if (sub == "serve" && flag == "--seed")
    return "a request gives its own seed; one without draws a random seed";
  // llama.cpp's and vLLM's names for what only some subcommands have.
  const auto one_of = [&flag](std::initializer_list<const char*> names) {
    return std::find(names.begin(), names.end(), flag) != names.end();
  };
  if (samples && one_of({"-n", "--n-predict"}))
    return "the number of new tokens is --max-new-tokens";
  if ((sub == "generate" || sub == "compare") && one_of({"-p", "-f", "--file"}))
    return "the prompt is --prompt, or --prompts-file for many";
  if (drafts && one_of({"-md"})) return "the draft model is --draft";
  if (drafts && one_of({"--draft-max", "--draft-n", "--num-speculative-tokens"}))
    return "the number of tokens drafted per step is --num-assistant-tokens (every step with "
           "--schedule constant)";
  if (sub == "serve" && one_of({"-c", "--ctx-size", "--max-model-len"}))
    return "the context of each request is --ctx";
  if (samples && one_of({"-c", "--ctx-size", "--max-model-len"}))
    return "the context is the prompt and --max-new-tokens";
  if (sub == "serve" && one_of({"-np", "--parallel", "--max-num-seqs"}))
    return "the requests decoded together are --max-batch";
  for (const auto& [name, what] : any)
    if (name == flag) return what;
  return nullptr;
}

}  // namespace

void dash_flag_names(std::vector<std::string>& args) {
  for (std::string& a : args) {
    if (a.size() < 3 || a.compare(0, 2, "--") != 0) continue;
    const size_t end = std::min(a.find('='), a.size());
    std::replace(a.begin() + 2, a.begin() + static_cast<std::ptrdiff_t>(end), '_', '-');
  }
}

std::string unknown_name_message(const CLI::App& app, const std::vector<std::string>& args) {
  if (args.size() < 2 || args[1].empty()) return "";
  const auto subs = app.get_subcommands([](const CLI::App*) { return true; });
  if (args[1][0] == '-') {  // `specdec --threads 1 generate ...`: the subcommand comes first
    if (args[1] == "-h" || args[1] == "--help" || args[1] == "--version") return "";
    for (size_t i = 2; i < args.size(); ++i)
      for (const CLI::App* s : subs)
        if (s->get_name() == args[i])
          return "the subcommand comes first, then its flags: specdec " + args[i] + " " + args[1] +
                 " ...";
    return "";
  }
  std::vector<std::string> names;
  const CLI::App* sub = nullptr;
  for (const CLI::App* s : subs) {
    names.push_back(s->get_name());
    if (s->get_name() == args[1]) sub = s;
  }
  if (!sub) {
    std::string m = "unknown subcommand '" + args[1] + "'";
    if (const std::string near = closest(args[1], names); !near.empty())
      m += " (did you mean " + near + "?)";
    m += "; the subcommands:";
    for (const std::string& n : names) m += (&n == &names[0] ? " " : ", ") + n;
    return m + " (specdec --help says what each does)";
  }
  std::vector<std::string> all, switches, valued;  // (--help not a switch: `--help WORD` is help)
  std::vector<std::string> shorts;
  for (const CLI::Option* o : sub->get_options()) {
    for (const std::string& n : o->get_snames()) shorts.push_back("-" + n);
    for (const std::string& n : o->get_lnames()) {
      all.push_back("--" + n);
      if (o->get_expected_max() > 0) valued.push_back(all.back());
      if (o->get_expected_max() == 0 && o != sub->get_help_ptr()) switches.push_back(all.back());
    }
  }
  const auto listed = [](const std::vector<std::string>& names, const std::string& flag) {
    return std::find(names.begin(), names.end(), flag) != names.end();
  };
  for (size_t i = 2; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;  // what follows is not flags
    // A short flag (-n 12, not a negative number), which only llama.cpp's habits would give.
    const bool short_flag = a.size() >= 2 && a[0] == '-' && a[1] != '-' &&
                            !std::isdigit(static_cast<unsigned char>(a[1])) && a[1] != '.';
    if (!short_flag && (a.size() < 3 || a.compare(0, 2, "--") != 0)) continue;
    if (i > 2 && listed(valued, args[i - 1])) continue;  // a flag's value (--prompt -x)
    const std::string flag = a.substr(0, a.find('='));
    if (short_flag) {
      if (listed(shorts, flag)) continue;
      std::string m = sub->get_name() + " has no flag " + flag;
      if (const char* what = instead_of(sub->get_name(), flag)) m += " (" + std::string(what) + ")";
      return m + "; specdec " + sub->get_name() + " --help lists its flags";
    }
    // Hugging Face's do_sample=True written as `--do_sample True`: a switch takes no value.
    if (listed(switches, flag)) {
      if (flag == a && i + 1 < args.size() && !args[i + 1].empty() && args[i + 1][0] != '-')
        return flag + " is a switch: give it alone, or " + flag + "=true or " + flag +
               "=false (not \"" + args[i + 1] + "\" after it)";
      continue;
    }
    if (listed(all, flag)) {
      // `--prompt --chat`: a flag where its value should be (CLI11 would take it for the value)
      if (flag == a && listed(valued, flag) && i + 1 < args.size() &&
          listed(all, args[i + 1].substr(0, args[i + 1].find('='))))
        return flag + " needs a value, and " + args[i + 1] + " after it is a flag (a value that " +
               "begins with -- is written " + flag + "=VALUE)";
      continue;
    }
    std::string m = sub->get_name() + " has no flag " + flag;
    if (const char* what = instead_of(sub->get_name(), flag))
      m += " (" + std::string(what) + ")";
    else if (const std::string near = closest(flag, all); !near.empty())
      m += " (did you mean " + near + "?)";
    return m + "; specdec " + sub->get_name() + " --help lists its flags";
  }
  return "";
}

std::string parse_error_message(const CLI::ParseError& error, const CLI::App& app) {
  const std::string what = error.what();
  const std::string twice = ": At Most 1 required but received ";
  if (const size_t at = what.find(twice); at != std::string::npos)
    return what.substr(0, at) + " is given " + what.substr(at + twice.size()) +
           " times: give it once";
  if (dynamic_cast<const CLI::ExtrasError*>(&error))
    return what + " (every input is a flag's value: --help lists the flags)";
  // CLI11: "Could not convert: --threads = abc"
  const std::string convert = "Could not convert: ", equals = " = ";
  if (what.rfind(convert, 0) == 0)
    if (const size_t at = what.find(equals); at != std::string::npos) {
      const std::string flag = what.substr(convert.size(), at - convert.size());
      // A switch (--chat=maybe) or a numeric flag, the only kinds whose values can fail.
      bool a_switch = false, an_integer = false;
      for (const CLI::App* sub : app.get_subcommands())  // (the one given)
        for (const CLI::Option* opt : sub->get_options())
          if (flag.size() > 2 && opt->check_lname(flag.substr(2))) {
            a_switch = opt->get_expected_max() == 0;
            an_integer = opt->get_type_name().rfind("INT", 0) == 0 ||
                         opt->get_type_name().rfind("UINT", 0) == 0;
          }
      return flag + ": \"" + what.substr(at + equals.size()) + "\" is not a value it takes (" +
             (a_switch     ? "a switch: give it alone, or =true or =false"
              : an_integer ? "a whole number within its range is expected"
                           : "a number is expected") +
             ")";
    }
  if (dynamic_cast<const CLI::RequiredError*>(&error) && !app.get_subcommands().empty())
    return what + " (specdec " + app.get_subcommands().front()->get_name() +
           " --help lists its flags)";
  if (what == "A subcommand is required")
    return "a subcommand is required, e.g. generate, chat or serve (specdec --help lists them "
           "all)";
  return "";
}

namespace {

// `message` with the text after "GenerationConfig." or "GenerationConfig: " put through `word`.
template <class Word>
std::string reword(const std::string& message, Word word) {
  const std::string config = "GenerationConfig";
  const size_t at = message.find(config);
  if (at == std::string::npos) return message;
  size_t end = at + config.size();
  if (end < message.size() && message[end] == ':') ++end;  // "GenerationConfig: a and b: ..."
  if (end < message.size() && (message[end] == '.' || message[end] == ' ')) ++end;
  return message.substr(0, at) + word(message.substr(end));
}

// `text` with each field name of `names` replaced by its flag.
std::string renamed(std::string text,
                    const std::vector<std::pair<std::string, std::string>>& names) {
  for (const auto& [field, flag] : names) text = replace_all(std::move(text), field, flag);
  return text;
}

}  // namespace

std::string in_key_words(const std::string& message) {
  return reword(message, [](std::string rest) {
    return replace_all(std::move(rest), "suffix_speculation", "\"speculate\": \"suffix\"");
  });
}

std::string in_flag_words(const std::string& message) {
  // Longest field first where one begins another (num_assistant_tokens_schedule).
  static const std::vector<std::pair<std::string, std::string>> flags = {
      {"num_assistant_tokens_schedule", "--schedule"},
      {"num_assistant_tokens", "--num-assistant-tokens"},
      {"assistant_confidence_threshold", "--confidence-threshold"},
      {"prompt_lookup_num_tokens", "--prompt-lookup"},
      {"prompt_lookup_match", "--prompt-lookup-match"},
      {"max_matching_ngram_size", "--max-matching-ngram"},
      {"suffix_speculation", "--speculate suffix"},
      {"draft_tree_width", "--draft-tree-width"},
      {"max_new_tokens", "--max-new-tokens"},
      {"min_new_tokens", "--min-new-tokens"},
      {"repetition_penalty", "--repetition-penalty"},
      {"frequency_penalty", "--frequency-penalty"},
      {"presence_penalty", "--presence-penalty"},
      {"temperature", "--temperature"},
      {"top_k", "--top-k"},
      {"top_p", "--top-p"},
      {"min_p", "--min-p"},
  };
  static const std::vector<std::pair<std::string, std::string>> suffix_flags = {
      {"max_depth", "--suffix-depth"},
      {"min_token_prob", "--suffix-min-prob"},
      {"max_spec_factor", "--suffix-spec-factor"},
      {"cache_tokens", "--suffix-cache-tokens"},
  };
  // SuffixOptions::validate's messages: "suffix speculation: FIELD must be ..." (the prefix kept).
  const std::string suffix = "suffix speculation: ";
  if (const size_t at = message.find(suffix); at != std::string::npos)
    return message.substr(0, at + suffix.size()) +
           renamed(message.substr(at + suffix.size()), suffix_flags);
  return reword(message, [](std::string rest) { return renamed(std::move(rest), flags); });
}

}  // namespace specdec::cli
