// The flags generate, compare, chat and serve share; parsing ids; reading stdin.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <iterator>
#include <sstream>

#include "cli.hpp"
#include "generation_options.hpp"
#include "util.hpp"

namespace specdec::cli {

void add_run_options(CLI::App* app, RunOptions& o, Mode mode) {
  const bool compare = mode == Mode::kCompare;
  app->add_option("--model", o.model,
                  "Target checkpoint: a Hugging Face folder, a .gguf file, or a folder holding one")
      ->required();
  app->add_option("--draft", o.draft,
                  compare ? "Draft checkpoint (same forms); compare needs it, --prompt-lookup or "
                            "--speculate suffix"
                          : "Draft checkpoint (same forms); omit for target-only generation");
  if (mode != Mode::kServe)
    app->add_option("--system", o.system,
                    "Chat: the system message (default: the template's own, if any)");
  app->add_option(
      "--chat-template", o.chat_template,
      "Chat: chatml, qwen3, llama3, llama2, mistral or gemma (default: recognised from the "
      "model's template)");
  if (mode != Mode::kChat && mode != Mode::kServe) {
    app->add_flag(
        "--chat", o.chat,
        "Format the prompt as one user turn of the model's chat template; stop at its end of turn");
    auto* text =
        app->add_option("--prompt", o.prompt,
                        "Prompt text (encoded with the tokenizer, BOS/EOS as it is configured); "
                        "without --prompt or --prompt-ids the prompt is read from stdin");
    auto* ids = app->add_option("--prompt-ids", o.prompt_ids,
                                "Prompt token ids, comma- or space-separated (e.g. 1,2,3)")
                    ->excludes(text);
    text->each([&o](const std::string&) { o.prompt_given = true; });
    ids->check(non_empty());  // (an empty value would read stdin as if the flag were not there)
    if (mode == Mode::kGenerate) {
      auto* file =
          app->add_option("--prompts-file", o.prompts_file,
                          "Many requests: a JSON Lines file (- for stdin), one {\"prompt\": TEXT} "
                          "or {\"prompt_ids\": [...]} per line (with --chat, one user turn, after "
                          "--system or the line's own \"system\", or a conversation: "
                          "{\"messages\": [{\"role\", \"content\"}, ...]}), with optional per-request "
                          "knobs (" +
                              join(prompts_file_knobs()) +
                              "); "
                              "writes one JSON line per request, in order")
              ->excludes(text)
              ->excludes(ids);
      app->add_option("--batch-size", o.batch_size,
                      "--prompts-file: requests generated at once (1 = one after another); as each "
                      "finishes, the next joins "
                      "the running batch (continuous batching)")
          ->capture_default_str()
          ->needs(file);
      app->add_flag(
             "--prompt-cache", o.prompt_cache,
             "--prompts-file, one after another: each request computes only its prompt after the "
             "longest prefix it shares with the request before it (prompt and answer), e.g. a "
             "common "
             "system prompt; the output is the same")
          ->needs(file);
    }
  }
  app->add_option(
      "--tokenizer", o.tokenizer,
      "Tokenizer: a folder with tokenizer files or a .gguf (default: --model's, when it has one)");
  if (mode != Mode::kServe && !compare)
    app->add_flag("--no-stream", o.no_stream,
                  "Print the generated text at the end, not as it is accepted");
  add_generation_options(app, o.gen, o.no_adaptive);
  app->add_option("--suffix-cache-tokens", o.suffix.cache_tokens,
                  "--speculate suffix: tokens of earlier outputs remembered (oldest forgotten "
                  "first; 0 = this request's text only; at most 67108864)")
      ->capture_default_str();
  app->add_option("--suffix-depth", o.suffix.max_depth,
                  "--speculate suffix: longest match plus continuation counted, in tokens (2 to "
                  "1024)")
      ->capture_default_str();
  app->add_option("--suffix-min-prob", o.suffix.min_token_prob,
                  "--speculate suffix: stop a proposal once its estimated probability falls below "
                  "this (0 to 1)")
      ->capture_default_str();
  app->add_option("--suffix-spec-factor", o.suffix.max_spec_factor,
                  "--speculate suffix: a proposal is at most this times its match's length "
                  "(above 0, at most 1024)")
      ->capture_default_str();
  app->add_flag("--suffix-tree", o.suffix.tree,
                "--speculate suffix: propose a tree of continuations (up to "
                "--num-assistant-tokens nodes, verified in one pass) instead of one");
  app->add_option("--device", o.device, "cpu, cuda or cuda:N")->capture_default_str();
  app->add_option("--dtype", o.dtype, "Compute dtype")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}))
      ->capture_default_str();
  const std::string formats =
      "as-stored (keep the checkpoint's format: a Q4_1 GGUF stays Q4_1), float32, bfloat16, "
      "float16, q8_0, q4_0, q4_1 (quantized at load); packed formats need --device cpu --dtype "
      "float32";
  const std::vector<std::string> format_names = weight_format_names();
  app->add_option("--weights", o.weights, "Format of the target's weight matrices: " + formats)
      ->check(CLI::IsMember(format_names))
      ->capture_default_str();
  app->add_option("--draft-weights", o.draft_weights,
                  "Format of the draft's weight matrices (same choices)")
      ->check(CLI::IsMember(format_names))
      ->capture_default_str();
  app->add_flag(
      "--int8-activations", o.int8_activations,
      "Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K target weights multiply activations quantized "
      "to 8 bits (faster, as llama.cpp; "
      "the target's numbers then differ from its dequantized float32 model)");
  app->add_flag("--draft-int8-activations", o.draft_int8_activations,
                "The same for the draft (speculation stays exact whatever the draft computes)");
  app->add_option("--threads", o.threads,
                  "CPU threads of every pool specdec computes with: libtorch's (which runs "
                  "specdec's kernels) and OpenBLAS's (0: OMP_NUM_THREADS if set, else one per "
                  "physical core this process may use; at most 4 per logical CPU)")
      ->capture_default_str();
  if (mode != Mode::kChat && mode != Mode::kServe)
    app->add_flag("--json", o.json_out, "Print one JSON object on stdout");
  if (compare)
    app->add_option("--warmup", o.warmup,
                    "Untimed warm-up runs of each mode before timing (a few tokens each)")
        ->check(in_range(0, 100))
        ->capture_default_str();
}

std::vector<int64_t> parse_ids(const std::string& given, const char* flag, bool allow_empty) {
  std::vector<int64_t> ids;
  // (spaces around an id, as in "1, 2, 3", are not part of it)
  const auto trimmed = [](std::string s) {
    s.erase(0, s.find_first_not_of(" \t"));
    s.erase(s.find_last_not_of(" \t") + 1);
    return s;
  };
  const std::string text = trimmed(given);
  if (allow_empty && text.empty()) return ids;
  if (!text.empty() && text.back() == ',')
    throw Error(std::string(flag) + ": '" + text + "' ends with a comma (expected e.g. 1,2,3)");
  // Commas, or spaces alone (as generate prints the ids of a model without a tokenizer).
  const bool commas = text.find(',') != std::string::npos;
  std::stringstream ss(text);
  std::string item;
  while (commas ? static_cast<bool>(std::getline(ss, item, ',')) : static_cast<bool>(ss >> item)) {
    item = trimmed(item);
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

std::string read_stdin(const char* flag) {
  if (isatty(STDIN_FILENO))
    std::cerr << "specdec: reading the " << (flag + 2) << " from stdin (end with Ctrl-D; or use "
              << flag << " TEXT)\n";
  std::string text(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>{});
  // The line break that ends the input (echo's, a file's last line) is not part of the prompt.
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  return text;
}

}  // namespace specdec::cli
