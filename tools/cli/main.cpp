// The `specdec` command-line program: generate, compare, chat, serve, tokenize, detokenize,
// make-tokenizer, make-fixture, make-draft (each in tools/cli/; this file parses the flags).
#include <CLI/CLI.hpp>
#include <cerrno>
#include <iostream>

#include "cli.hpp"
#include "flag_errors.hpp"
#include "generation_options.hpp"
#include "json.hpp"

using namespace specdec;
using namespace specdec::cli;

int main(int argc, char** argv) {
  CLI::App app{"specdec: speculative decoding (assisted generation) on libtorch"};
  app.footer(
      "specdec SUBCOMMAND --help (or specdec help SUBCOMMAND) lists a subcommand's flags; a flag "
      "may also be written with underscores, as Hugging Face names its fields (--max_new_tokens).");
  app.require_subcommand(1);
  app.set_version_flag("--version", "specdec " SPECDEC_VERSION);
  RunOptions gen_opts, cmp_opts;
  auto* gen = app.add_subcommand(
      "generate", "Generate tokens (assisted with --draft, --prompt-lookup or --speculate suffix)");
  add_run_options(gen, gen_opts, Mode::kGenerate);
  auto* cmp = app.add_subcommand(
      "compare", "Target-only and assisted generation on the same prompt: outputs, times, speedup");
  add_run_options(cmp, cmp_opts, Mode::kCompare);
  RunOptions chat_opts;
  chat_opts.gen.max_new_tokens = 256;
  auto* chat = app.add_subcommand("chat",
                                  "Interactive multi-turn conversation with the model's chat "
                                  "template, streamed; /reset, /stats, /exit");
  add_run_options(chat, chat_opts, Mode::kChat);

  RunOptions serve_opts;
  serve_opts.gen.top_k =
      0;  // OpenAI's requests know no top_k: off unless a request or --top-k sets it
  serve::ServeOptions serve_server;
  auto* srv = app.add_subcommand("serve",
                                 "An OpenAI-compatible HTTP server (/v1/chat/completions, "
                                 "/v1/completions, /metrics, a chat page at /)");
  add_run_options(srv, serve_opts, Mode::kServe);
  serve::add_serve_options(srv, serve_server);
  // A request's own fields take the place of these (a request without a seed draws a random one).
  for (const char* flag : {"--do-sample", "--seed"}) srv->remove_option(srv->get_option(flag));
  srv->get_option("--max-new-tokens")
      ->description(
          "max_tokens of a request that sets none (unset: 16 for a completion, the rest of --ctx "
          "for a chat)")
      ->default_str("");
  srv->get_option("--temperature")
      ->description("temperature of a request that sets none (0, or below 1e-5, = greedy)");

  TokenizeOptions tk, dtk;
  auto* tokc = app.add_subcommand("tokenize", "Text to token ids (the text from --text or stdin)");
  tokc->add_option("--tokenizer", tk.dir,
                   "The tokenizer: a folder with its files, or a GGUF file (or its folder)")
      ->required();
  tokc->add_option("--text", tk.text, "Text to encode; without it, stdin is read");
  tokc->add_flag("--no-special", tk.no_special,
                 "Do not add BOS/EOS (special-token text is still recognised)");
  tokc->add_flag("--json", tk.json_out,
                 "Print {\"ids\": [...]} (with --chat, and the rendered prompt as \"text\")");
  tokc->add_flag("--chat", tk.chat,
                 "Encode the text as one user turn through the chat template, as generate --chat "
                 "does (the template's special tokens are in the text: no BOS is added)");
  tokc->add_option("--system", tk.system, "--chat: the system message");
  tokc->add_option("--chat-template", tk.chat_template,
                   "--chat: the template (default: recognised from the tokenizer's files)");
  auto* detok = app.add_subcommand("detokenize", "Token ids to text");
  detok
      ->add_option("--tokenizer", dtk.dir,
                   "The tokenizer: a folder with its files, or a GGUF file (or its folder)")
      ->required();
  detok->add_option("--ids", dtk.ids, "Token ids, comma- or space-separated (\"\" for none)")
      ->required();
  detok->add_flag("--skip-special", dtk.skip_special, "Leave special tokens (BOS, EOS, ...) out");
  detok->add_flag("--json", dtk.json_out, "Print {\"text\": \"...\"}");

  MakeTokenizerOptions mt;
  auto* mtok = app.add_subcommand(
      "make-tokenizer",
      "Train a SentencePiece tokenizer (tokenizer.model) on text files, for generated checkpoints");
  mtok->add_option("--input", mt.input, "Text files, comma-separated")->required();
  mtok->add_option("--out", mt.out, "Output folder (receives tokenizer.model; made if missing)")
      ->required();
  mtok->add_option(
          "--vocab-size", mt.vocab_size,
          "Number of pieces, including the 256 byte pieces of byte fallback and <unk>, <s>, </s>")
      ->capture_default_str();
  mtok->add_option("--model-type", mt.model_type, "SentencePiece model type")
      ->check(CLI::IsMember({"bpe", "unigram"}))
      ->capture_default_str();

  MakeFixtureOptions mf;
  FixtureOptions& fx = mf.fixture;
  auto* mk = app.add_subcommand(
      "make-fixture",
      "Write a deterministic random-weight checkpoint in Hugging Face layout, or an early-exit "
      "draft of a model (--draft-of)");
  mk->add_option("--out", mf.out, "Output folder (new, or empty)")->required();
  mk->add_option("--arch", fx.arch, "Architecture (t5: encoder-decoder T5ForConditionalGeneration)")
      ->check(CLI::IsMember(
          {"llama", "mistral", "qwen2", "qwen3", "gemma3", "gpt_neox", "gpt2", "opt", "t5"}))
      ->capture_default_str();
  mk->add_option(
        "--layers", fx.layers,
        "Decoder layers (t5: encoder and decoder layers each; with --draft-of: decoder layers "
        "kept, a t5 draft keeps the whole encoder)")
      ->capture_default_str();
  mk->add_option("--hidden", fx.hidden, "Hidden size")->capture_default_str();
  mk->add_option("--heads", fx.heads, "Attention heads")->capture_default_str();
  mk->add_option("--kv-heads", fx.kv_heads, "Key/value heads (0 = --heads)")->capture_default_str();
  mk->add_option("--intermediate", fx.intermediate, "MLP size (0 = 4 x hidden)")
      ->capture_default_str();
  mk->add_option("--vocab", fx.vocab, "Vocabulary size")->capture_default_str();
  mk->add_option("--max-pos", fx.max_pos, "max_position_embeddings")->capture_default_str();
  mk->add_option("--seed", fx.seed, "Seed of the weights")
      ->check(seed_validator())
      ->capture_default_str();
  mk->add_option("--dtype", fx.dtype, "Saved dtype")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}))
      ->capture_default_str();
  mk->add_option("--init-std", fx.init_std, "Standard deviation of the weights")
      ->capture_default_str();
  mk->add_option(
        "--exit-layers", fx.exit_layers,
        "Scale the attention and MLP outputs of layers >= N by --exit-scale (o_proj/down_proj; "
        "gemma3: the post-norms) (synthetic early-exit pair; 0 with --exit-scale 0: a bigram "
        "model that still runs every layer; -1: none)")
      ->capture_default_str();
  mk->add_option("--exit-scale", fx.exit_scale, "See --exit-layers")->capture_default_str();
  mk->add_flag("--gated", fx.gated_act,
               "t5: gated-GELU feed-forward as in t5-v1_1 / flan-t5 (default: ReLU as in t5)");
  mk->add_flag("--tie-word-embeddings", fx.tie_word_embeddings,
               "Tie the head to the input embeddings (t5: then scaled by d_model^-0.5)");
  mk->add_option("--tokenizer", fx.tokenizer_dir,
                 "Copy this folder's tokenizer files in; --vocab becomes the tokenizer's size");
  auto* draft_of =
      mk->add_option("--draft-of", mf.draft_of,
                     "Derive an early-exit draft from this target: its embeddings, first --layers "
                     "layers, final norm and head");
  mk->add_option("--noise", mf.noise, "--draft-of: add Gaussian noise of this standard deviation")
      ->needs(draft_of)
      ->capture_default_str();
  // A draft takes its shape, dtype and tokenizer from its target.
  for (const char* name : {"--arch", "--hidden", "--heads", "--kv-heads", "--intermediate",
                           "--vocab", "--max-pos", "--dtype", "--init-std", "--exit-layers",
                           "--exit-scale", "--gated", "--tie-word-embeddings", "--tokenizer"})
    draft_of->excludes(mk->get_option(name));
  mk->get_option("--exit-scale")->needs(mk->get_option("--exit-layers"));

  MakeDraftOptions md;
  auto* mkd = app.add_subcommand(
      "make-draft",
      "Distil a small draft from a Llama, Mistral, Qwen2, Qwen3 or Gemma 3 target: its first "
      "layers, a head over the most frequent tokens, trained with libtorch to match the target's "
      "next-token distributions");
  mkd->add_option("--target", md.target,
                  "Target checkpoint: folder, or GGUF file / folder holding one")
      ->required();
  mkd->add_option("--out", md.out, "Output folder (must not exist unless --resume)")->required();
  auto* layers = mkd->add_option("--layers", md.layers, "Keep the target's first N layers")
                     ->capture_default_str();
  mkd->add_option("--layer-ids", md.layer_ids,
                  "Keep exactly these target layers (comma-separated), instead of --layers")
      ->delimiter(',')
      ->excludes(layers);
  auto* vs = mkd->add_option(
      "--vocab-subset", md.vocab_subset,
      "Head over the V' most frequent tokens of the training text (plus EOS); default: "
      "the whole vocabulary");
  mkd->add_flag(
      "--features", md.features,
      "A feature-fed (EAGLE-style) draft: it also reads the target's last hidden state of the "
      "position before (kept by the target's cache as it verifies); --data-from needs data made "
      "with it");
  mkd->add_flag(
      "--int8-activations", md.int8_activations,
      "The target computes with 8-bit activations wherever make-draft runs it (as it serves "
      "with --int8-activations; data made faster)");
  mkd->add_option("--data", md.data_files, "Plain-text training files (off-policy)");
  mkd->add_option(
      "--prompts", md.prompts_file,
      "Prompts, one per line, that the target answers itself (on-policy training text; its chat "
      "template is applied when it has one)");
  mkd->add_option("--self-prompts", md.self_prompts,
                  "The target writes N prompts itself and answers them: on-policy training text "
                  "without a prompt list (a chat model's user messages, sampled from the start of "
                  "a user turn of its chat template; a base model's text openings, sampled from "
                  "BOS)")
      ->capture_default_str();
  mkd->add_option("--data-from", md.data_from,
                  "Reuse the training text and target labels of an earlier make-draft output "
                  "folder (same target "
                  "and --seq-len) instead of --data/--prompts/--self-prompts");
  mkd->add_option("--eval-prompts", md.eval_prompts,
                  "Prompts, one per line (keep them out of the training text), that the target "
                  "answers greedily "
                  "after training: the draft is measured on those answers (their greedy agreement "
                  "is the share of "
                  "first proposals generation keeps on such prompts)");
  mkd->add_option("--gen-tokens", md.gen_tokens,
                  "--prompts, --self-prompts, --eval-prompts: new tokens per answer")
      ->capture_default_str();
  mkd->add_option("--gen-temperature", md.gen_temperatures,
                  "--prompts, --self-prompts: answers' sampling temperature(s), comma-separated; "
                  "each prompt is answered once per "
                  "temperature (0 = the greedy answer)")
      ->delimiter(',')
      ->capture_default_str();
  mkd->add_option(
         "--steps", md.steps,
         "Optimizer steps in all (with --resume: the total to reach; 0: write the untrained draft)")
      ->capture_default_str();
  mkd->add_option("--seq-len", md.seq_len, "Tokens per training sequence")->capture_default_str();
  mkd->add_option("--batch", md.batch, "Sequences per step")->capture_default_str();
  mkd->add_option(
         "--lr", md.lr,
         "AdamW peak learning rate (warm-up over the first 5% of steps, cosine decay to 10%)")
      ->capture_default_str();
  mkd->add_option("--threads", md.threads,
                  "CPU threads (0: OMP_NUM_THREADS if set, else one per physical core this process "
                  "may use)")
      ->capture_default_str();
  mkd->add_option("--seed", md.seed, "Seed of the data order and of the sampled answers")
      ->check(seed_validator())
      ->capture_default_str();
  mkd->add_option("--checkpoint-every", md.checkpoint_every,
                  "Steps between checkpoints (one is also written at the end)")
      ->capture_default_str();
  mkd->add_flag(
      "--resume", md.resume,
      "Continue the run saved in --out (its layers, head, data and --seq-len are kept; --steps is "
      "the new total)");

  // Hugging Face's snake_case names as the dashed flags; an unknown subcommand or flag named with
  // the closest real one (CLI11 alone says "The following arguments were not expected").
  std::vector<std::string> args(argv, argv + argc);
  dash_flag_names(args);
  if (args.size() > 1 && args[1] == "help")  // `specdec help [SUBCOMMAND]`
    args = args.size() > 2 ? std::vector<std::string>{args[0], args[2], "--help"}
                           : std::vector<std::string>{args[0], "--help"};
  if (const std::string m = unknown_name_message(app, args); !m.empty()) {
    std::cerr << "specdec: error: " << m << "\n";
    return 1;
  }
  std::vector<char*> dashed;
  for (std::string& a : args) dashed.push_back(a.data());
  try {
    app.parse(static_cast<int>(dashed.size()), dashed.data());
  } catch (const CLI::ParseError& e) {
    // --help and --version print and succeed; every parse error prints its message (CLI11's, or
    // ours where CLI11's is unclear) as every other error does, and exits 1 (CLI11's own codes
    // are 100 and more)
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
      errno = 0;
      app.exit(e);
      const int err = errno;
      try {
        flush_output(err);  // help that cannot be written is an error as any output is
      } catch (const std::exception& x) {
        std::cerr << "specdec: error: " << x.what() << "\n";
        return 1;
      }
      return 0;
    }
    const std::string m = parse_error_message(e, app);
    std::cerr << "specdec: error: " << (m.empty() ? std::string(e.what()) : m) << "\n";
    return 1;
  }
  // Every command's output is flushed and checked before it exits 0.
  const auto finished = [](int rc) {
    if (rc == 0) flush_output();
    return rc;
  };
  for (const auto& [sub, given] : {std::pair{gen, &gen_opts.system_given},
                                   {cmp, &cmp_opts.system_given},
                                   {chat, &chat_opts.system_given},
                                   {tokc, &tk.system_given}})
    *given = sub->count("--system") > 0;
  try {
    if (*gen) return finished(run_generate(gen_opts));
    if (*cmp) return finished(run_compare(cmp_opts));
    if (*chat) return finished(run_chat(chat_opts));
    if (*srv)
      return run_serve(serve_opts, serve_server, srv->get_option("--max-new-tokens")->count() > 0);
    if (*tokc) {
      tk.text_given = tokc->count("--text") > 0;
      return finished(run_tokenize(tk));
    }
    if (*mtok) return finished(run_make_tokenizer(mt));
    if (*detok) return finished(run_detokenize(dtk));
    if (*mkd) {
      if (vs->count() > 0 && md.vocab_subset < 1)
        throw Error("make-draft: --vocab-subset must be >= 1");
      if (md.resume) {  // what the run keeps of its own (training/state.json, its data and head)
        std::string given;
        for (const char* name : {"--layers", "--layer-ids", "--vocab-subset", "--data", "--prompts",
                                 "--self-prompts", "--data-from", "--gen-temperature", "--seq-len"})
          if (mkd->get_option(name)->count() > 0)
            given += (given.empty() ? "" : ", ") + std::string(name);
        if (!given.empty())
          std::cerr << "specdec: warning: " << given
                    << " not used with --resume: the run keeps its own layers, head, training text "
                       "and sequence length\n";
        inherit_labelling(md, mkd->get_option("--features")->count() > 0,
                          mkd->get_option("--int8-activations")->count() > 0);
      }
      return finished(run_make_draft(md));
    }
    if (*mk) return finished(run_make_fixture(mf));
  } catch (const std::exception& e) {
    std::cerr << "specdec: error: " << in_flag_words(detail::json_message(e)) << "\n";
    return 1;
  }
  return 0;
}
