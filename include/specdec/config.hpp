// ModelConfig (config.json + generation_config.json) and GenerationConfig (generation knobs).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace specdec {

class GgufFile;

// `rope_scaling` of config.json. Only the types that change the rotary frequencies are modelled.
struct RopeScaling {
  std::string type;                                 // "" (none), "linear" or "llama3"
  double factor = 1.0;                              // linear and llama3
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

// The architecture of a checkpoint, read from config.json. Field names follow Hugging Face.
struct ModelConfig {
  // "llama", "mistral", "qwen2", "qwen3", "gemma3_text", "gpt_neox", "gpt2", "opt", "t5"
  std::string model_type;
  std::string architecture;  // first entry of `architectures`, e.g. "LlamaForCausalLM"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;  // decoder layers (T5: num_decoder_layers)
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads (multi-head attention)
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;  // the norms' epsilon (also from layer_norm_eps / layer_norm_epsilon)
  double rope_theta = 10000.0;  // Gemma 3: the full-attention layers' base
  RopeScaling rope_scaling;     // Gemma 3: the full-attention layers' only
  bool attention_bias = false;  // q/k/v biases (always true for qwen2)
  bool mlp_bias = false;        // llama: gate/up/down projections have biases
  // Attend to the last sliding_window positions only (0 = all): every layer (Mistral), or the
  // layers that layer_types names "sliding_attention" (Gemma 3).
  int64_t sliding_window = 0;
  // Per layer, "sliding_attention" or "full_attention" (Gemma 3: from `layer_types`, or from
  // `sliding_window_pattern` P of older configs: layer i is full when (i + 1) % P == 0). Empty:
  // every layer is as sliding_window says.
  std::vector<std::string> layer_types;
  // Gemma 3: the sliding layers' rotary base and scaling (`rope_local_base_freq`, or
  // rope_parameters.sliding_attention of configs written by transformers 5).
  double rope_local_theta = 10000.0;
  RopeScaling rope_local_scaling;
  // Qwen3, Gemma 3: an RMSNorm over each head of q and of k, before the rotary embedding
  // (q_norm.weight, k_norm.weight [head_dim]).
  bool qk_norm = false;
  // Gemma 3: the attention scale is query_pre_attn_scalar^-1/2 (0: head_dim^-1/2).
  double query_pre_attn_scalar = 0;
  bool tie_word_embeddings = false;  // lm_head shares embed_tokens' weight
  // A reduced-vocabulary head (drafts written by `specdec make-draft --vocab-subset`; the llama
  // family and Gemma 3): lm_head.weight has one row per id listed here (strictly increasing, <
  // vocab_size), and the logits of every other id are -inf. Empty = the head covers the whole
  // vocabulary.
  std::vector<int64_t> head_token_ids;
  // A feature-fed (EAGLE-style) draft (`specdec make-draft --features`; llama family and Gemma 3),
  // when > 0: its input at position p is fc([embed(x_p); h_{p-1}]) ("fc.weight" [hidden_size,
  // hidden_size
  // + feature_size]), where h_{p-1} is the target's last-layer hidden state (before its final norm)
  // at position p - 1 (zeros at p = 0), or, past what the target has verified, the draft's own
  // last-layer output there (its prediction of that state). 0 = an ordinary model. Config key:
  // "specdec_feature_size".
  int64_t feature_size = 0;
  std::string hidden_act = "silu";  // also from activation_function (gpt2, opt)
  // GPT-NeoX
  double rotary_pct = 1.0;  // fraction of each head that is rotated (partial_rotary_factor)
  bool use_parallel_residual = true;  // x + attn(ln1 x) + mlp(ln2 x) instead of one after the other
  // GPT-2
  bool scale_attn_weights = true;
  bool scale_attn_by_inverse_layer_idx = false;
  // OPT
  bool do_layer_norm_before = true;  // pre-norm (false: post-norm, opt-350m)
  int64_t word_embed_proj_dim = 0;   // embedding width when it differs from hidden_size
  bool enable_bias = true;
  bool remove_final_layer_norm = false;
  // T5 (encoder-decoder). The fields above describe the decoder: d_model is hidden_size, d_ff
  // intermediate_size, d_kv head_dim, num_heads num_attention_heads, num_decoder_layers
  // num_hidden_layers, the activation of feed_forward_proj hidden_act.
  bool is_encoder_decoder = false;
  int64_t num_encoder_layers = 0;  // num_layers
  bool is_gated_act = false;       // feed_forward_proj "gated-*": act(wi_0 x) * wi_1 x
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  std::string torch_dtype = "float32";  // dtype the checkpoint was saved in (informational)

  // Special tokens: generation_config.json wins over config.json when both name them.
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // `eos_token_id` may be an int or a list
  std::optional<int64_t> pad_token_id;
  std::optional<int64_t> decoder_start_token_id;  // encoder-decoder: the decoder's first token

  // Reads `dir`/config.json and, when present, `dir`/generation_config.json. Throws specdec::Error
  // naming the file and field on any problem (missing file, bad JSON, unknown model_type ...).
  static ModelConfig from_dir(const std::string& dir);
  // Parses config.json text; `source` names it in errors.
  static ModelConfig from_json_text(const std::string& text, const std::string& source);
  // Reads a GGUF file's metadata (architectures `llama`, `qwen2`, `qwen3`, `gemma3`):
  // `<arch>.context_length`,
  // `embedding_length`, `block_count`, `feed_forward_length`, `attention.head_count[_kv]`,
  // `rope.freq_base`, `attention.layer_norm_rms_epsilon`, `rope.scaling.*`, the vocabulary size
  // from the token list, a tied head when `output.weight` is absent, BOS/EOS/PAD from
  // `tokenizer.ggml.*`.
  static ModelConfig from_gguf(const GgufFile& file);
  // A checkpoint folder (config.json), or a `.gguf` file or a folder holding one.
  static ModelConfig from_path(const std::string& path);
  // Applies generation_config.json text (bos/eos/pad) over this config.
  void apply_generation_config_text(const std::string& text, const std::string& source);

  bool is_eos(int64_t token) const;
  void validate(const std::string& source) const;
};

// The model types this build can run.
const std::vector<std::string>& supported_model_types();
// Whether `model_type` is one of the Llama decoder's (llama, mistral, qwen2, qwen3).
bool llama_family(const std::string& model_type);

// GenerationConfig::num_assistant_tokens_schedule, parsed (its strings stay Hugging Face's).
enum class Schedule { kConstant, kHeuristic, kHeuristicTransient, kDynamic, kGoodput };

// Per-request generation knobs. Names and meanings follow Hugging Face's GenerationConfig so that
// results can be compared 1:1 with `model.generate(assistant_model=...)` (per-pass traces under
// the same schedule: Hugging Face's default is "constant", greedy speculation's here "goodput").
struct GenerationConfig {
  // Number of new tokens to generate at most (prompt excluded). Must be >= 1.
  int64_t max_new_tokens = 20;
  // No EOS before this many new tokens (their logits are -inf until then), as Hugging Face's
  // MinNewTokensLengthLogitsProcessor; 0 = off.
  int64_t min_new_tokens = 0;
  // EOS ids that end generation; empty = the target model's eos ids. An id outside the vocabulary
  // (e.g. {-1}) never matches: generation then runs to max_new_tokens.
  std::vector<int64_t> eos_token_ids;

  // --- assisted generation ---
  // Draft tokens per iteration: the fixed K (constant), the start value (heuristic*), or the cap
  // (dynamic, goodput). 0 = default: 20 for "dynamic", 16 under suffix speculation, 12 for
  // "goodput", 5 otherwise. Under prompt lookup, prompt_lookup_num_tokens takes its place. At most
  // kMaxLookahead.
  int64_t num_assistant_tokens = 0;
  // The most tokens one iteration may propose (num_assistant_tokens, prompt_lookup_num_tokens): a
  // pass verifies them at once, and more only costs.
  static constexpr int64_t kMaxLookahead = 256;
  // "constant" | "heuristic" (value carried over between requests of one Generator) |
  // "heuristic_transient" (reset each request) | "dynamic" (confidence-threshold stop) |
  // "goodput" (specdec's: the K with the most expected tokens per second, from measured costs;
  // see lookahead.hpp. Sampled output keeps the target's distribution, but with a draft model's
  // chain which tokens a seed gives then depends on the measured timings). "" (the default):
  // "goodput" for greedy decoding, so that speculation never plans a pass that costs more than it
  // gains (a fixed K of a slow or rejected draft runs slower than no draft at all); "constant" when
  // sampling (a seed's tokens then never depend on timings). Proposals without a model follow
  // "constant" (every iteration up to the cap) or "goodput"; the other schedules act as "constant".
  std::string num_assistant_tokens_schedule = "";
  // dynamic: the draft stops once the probability of the token it just drafted is below this.
  double assistant_confidence_threshold = 0.4;
  // dynamic: re-fit the threshold from this request's acceptance history (minimise FPR + 3 FNR).
  bool adaptive_threshold = true;
  // > 0: use prompt lookup (n-gram copying from prompt + output) instead of a draft model,
  // proposing up to this many tokens per iteration (at most kMaxLookahead).
  int64_t prompt_lookup_num_tokens = 0;
  // Longest n-gram prompt lookup tries to match (it falls back to shorter ones down to 1).
  int64_t max_matching_ngram_size = 2;
  // Which earlier occurrence of the n-gram prompt lookup copies from: "first" (Hugging Face's rule)
  // or "last" (the most recent one; specdec's option, measured in docs/generation.md).
  std::string prompt_lookup_match = "first";
  // Suffix speculation (SuffixDecoding) instead of a draft model: the most frequent continuation of
  // the longest matching suffix, from trees over this request's prompt and output and over the
  // Generator's earlier outputs (SuffixOptions, suffix.hpp); up to num_assistant_tokens per
  // iteration. Not with prompt lookup.
  bool suffix_speculation = false;
  // Draft-model rows: a tree of candidates instead of a chain, the draft's W most probable tokens
  // at each position, the first continuing (still one draft pass per position), all verified in
  // one target pass (sampling: as a deterministic proposal, exactly). 1 = a chain; at most 16.
  // Under goodput, the candidates that do not pay for their pass are cut (Generator's goodput
  // planning).
  int64_t draft_tree_width = 1;

  // --- sampling ---
  bool do_sample = false;    // false: greedy (argmax). temperature == 0 also means greedy.
  double temperature = 1.0;  // sampling at kGreedyBelow or more; below it, greedy (its limit)
  int64_t top_k = 50;        // 0 = off; 50 is Hugging Face's default
  double top_p = 1.0;        // [0, 1]; 1 = off, 0 keeps the most likely token
  double min_p = 0.0;        // [0, 1); 0 = off
  double repetition_penalty = 1.0;  // >= kMinRepetitionPenalty; 1 = off
  // OpenAI's penalties, over the generated tokens only (the prompt excluded), in [-2, 2] (0 = off):
  // a token's logit drops by frequency_penalty x its count so far, and by presence_penalty once it
  // occurred. Applied before the repetition penalty, greedy or sampled.
  double frequency_penalty = 0.0;
  double presence_penalty = 0.0;
  // OpenAI's logit_bias, as Hugging Face's sequence_bias of one-token sequences: (token id, bias in
  // [-100, 100]) added to that token's logit before every other processor, greedy or sampled
  // (-100 in effect bans a token, 100 forces it). Each id at most once.
  std::vector<std::pair<int64_t, double>> logit_bias;
  uint64_t seed = 0;  // seed of the request's random generator (sampling only)

  // Effective number of draft tokens after resolving the default (see num_assistant_tokens);
  // throws specdec::Error for an unknown schedule when the default depends on it.
  int64_t resolved_num_assistant_tokens() const;
  // num_assistant_tokens_schedule as an enum; throws specdec::Error for a name it does not know.
  Schedule schedule() const;
  // Prompt lookup or suffix speculation: proposals made from the sequence, without a model.
  bool speculates_without_model() const {
    return prompt_lookup_num_tokens > 0 || suffix_speculation;
  }
  // A temperature below this decodes greedily, as vLLM's does: logits divided by it would overflow
  // float32 (1e-38 made every probability NaN), and greedy is the limit as it goes to 0.
  static constexpr double kGreedyBelow = 1e-5;
  // The least repetition_penalty: a positive logit divided by less could overflow float32.
  static constexpr double kMinRepetitionPenalty = 1e-6;
  // True when tokens are chosen by sampling (do_sample and temperature >= kGreedyBelow).
  bool sampling() const { return do_sample && temperature >= kGreedyBelow; }
  // Throws specdec::Error naming the first invalid field.
  void validate() const;
};

}  // namespace specdec
