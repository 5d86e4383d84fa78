#include "specdec/fixture.hpp"

#include <sys/stat.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint.hpp"
#include "gguf_model.hpp"
#include "json.hpp"
#include "specdec/config.hpp"
#include "specdec/error.hpp"
#include "specdec/model.hpp"
#include "specdec/tokenizer.hpp"
#include "specdec/weights.hpp"
#include "util.hpp"

namespace specdec {

using nlohmann::json;

namespace detail {

void make_dir(const std::string& dir) {
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    const std::string part = dir.substr(0, slash);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
      throw Error(detail::concat(part, ": cannot create folder: ", std::strerror(errno)));
    if (slash == std::string::npos) return;
  }
}

const char* const kSpecialTokenKeys[] = {"bos_token_id", "eos_token_id", "pad_token_id",
                                         "decoder_start_token_id"};

json generation_config_json(const json& config) {
  json g = json::object();
  for (const char* key : kSpecialTokenKeys)
    if (config.contains(key)) g[key] = config[key];
  return g;
}

const char* const kTokenizerFiles[] = {
    "tokenizer.model", "spiece.model",          "tokenizer.json",          "vocab.json",
    "merges.txt",      "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"};

void copy_tokenizer_files(const std::string& from, const std::string& to) {
  for (const char* f : kTokenizerFiles)
    if (file_exists(from + "/" + f))
      write_file_atomic(to + "/" + f, read_text_file(from + "/" + f));
}

void write_checkpoint(const std::string& dir, const json& config,
                      const std::map<std::string, at::Tensor>& tensors) {
  make_dir(dir);
  save_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  write_file_atomic(dir + "/generation_config.json", generation_config_json(config).dump(2) + "\n");
  write_file_atomic(dir + "/config.json", config.dump(2) + "\n");
}

// config.json of a model read from GGUF metadata (what Hugging Face's LlamaConfig, Qwen2Config,
// Qwen3Config or Gemma3TextConfig would say), so that a draft cut from a GGUF target is an ordinary
// checkpoint folder.
json gguf_config_json(const ModelConfig& c) {
  json j = {{"model_type", c.model_type},
            {"architectures", {c.architecture}},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_key_value_heads},
            {"head_dim", c.head_dim},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope_theta},
            {"attention_bias", c.attention_bias},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"hidden_act", c.hidden_act},
            {"torch_dtype", "float32"}};
  if (!c.rope_scaling.type.empty())
    j["rope_scaling"] = {{"type", c.rope_scaling.type}, {"factor", c.rope_scaling.factor}};
  if (c.model_type == "gemma3_text") {
    j.erase("hidden_act");
    j.update({{"hidden_activation", c.hidden_act},
              {"layer_types", c.layer_types},
              {"sliding_window", c.sliding_window},
              {"query_pre_attn_scalar", c.query_pre_attn_scalar},
              {"rope_local_base_freq", c.rope_local_theta}});
  }
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (!c.eos_token_ids.empty())
    j["eos_token_id"] =
        c.eos_token_ids.size() == 1 ? json(c.eos_token_ids[0]) : json(c.eos_token_ids);
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  return j;
}

SourceCheckpoint open_checkpoint(const std::string& path) {
  SourceCheckpoint s;
  std::string gguf_path;
  if (gguf_checkpoint(path, &gguf_path)) {
    s.gguf = std::make_unique<GgufFile>(gguf_path);
    s.config = ModelConfig::from_gguf(*s.gguf);
    s.config_json = gguf_config_json(s.config);
    s.weights = std::make_unique<GgufWeights>(*s.gguf, s.config);
  } else {
    s.config = ModelConfig::from_dir(path);
    s.config_json =
        detail::parse_json_bounded(read_text_file(path + "/config.json"), path + "/config.json");
    if (file_exists(path + "/generation_config.json")) {
      const json g = detail::parse_json_bounded(read_text_file(path + "/generation_config.json"),
                                                path + "/generation_config.json");
      for (const char* key : kSpecialTokenKeys)
        if (g.contains(key)) s.config_json[key] = g[key];
    }
    s.weights = std::make_unique<WeightStore>(path);
  }
  return s;
}

}  // namespace detail

namespace {

using detail::copy_tokenizer_files;
using detail::make_dir;
using detail::write_checkpoint;

const char* architecture_of(const std::string& arch) {
  if (arch == "llama") return "LlamaForCausalLM";
  if (arch == "mistral") return "MistralForCausalLM";
  if (arch == "qwen3") return "Qwen3ForCausalLM";
  if (arch == "gemma3") return "Gemma3ForCausalLM";
  if (arch == "gpt_neox") return "GPTNeoXForCausalLM";
  if (arch == "gpt2") return "GPT2LMHeadModel";
  if (arch == "opt") return "OPTForCausalLM";
  if (arch == "t5") return "T5ForConditionalGeneration";
  return "Qwen2ForCausalLM";
}

}  // namespace

void FixtureOptions::validate() const {
  SPECDEC_CHECK(llama_family(arch) || arch == "gemma3" || arch == "gpt_neox" || arch == "gpt2" ||
                    arch == "opt" || arch == "t5",
                "make-fixture: --arch '", arch,
                "' is not supported (supported: llama, mistral, qwen2, qwen3, gemma3, gpt_neox, "
                "gpt2, opt, t5)");
  SPECDEC_CHECK(arch == "t5" || !gated_act, "make-fixture: --gated is for --arch t5 only");
  SPECDEC_CHECK(llama_family(arch) || !feature_fed,
                "make-fixture: a feature-fed draft is for the llama family only");
  SPECDEC_CHECK(llama_family(arch) || arch == "gemma3" || kv_heads == 0 || kv_heads == heads,
                "make-fixture: ", arch,
                " has no grouped-query attention (--kv-heads must equal --heads)");
  for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"--layers", layers},
                                    {"--hidden", hidden},
                                    {"--heads", heads},
                                    {"--vocab", vocab},
                                    {"--max-pos", max_pos}})
    SPECDEC_CHECK(value > 0, "make-fixture: ", flag, " must be positive, got ", value);
  SPECDEC_CHECK(hidden % heads == 0, "make-fixture: hidden (", hidden,
                ") must be a multiple of heads (", heads, ")");
  SPECDEC_CHECK((hidden / heads) % 2 == 0, "make-fixture: head size hidden/heads must be even");
  const int64_t kv = kv_heads == 0 ? heads : kv_heads;
  SPECDEC_CHECK(kv > 0 && heads % kv == 0, "make-fixture: heads (", heads,
                ") must be a multiple of kv-heads (", kv, ")");
  SPECDEC_CHECK(intermediate >= 0, "make-fixture: intermediate must be >= 0");
  SPECDEC_CHECK(init_std > 0 && std::isfinite(init_std),
                "make-fixture: init-std must be finite and > 0, got ", init_std);
  SPECDEC_CHECK(exit_scale >= 0 && std::isfinite(exit_scale),
                "make-fixture: exit-scale must be finite and >= 0, got ", exit_scale);
  // The weights are made in memory first: a size past this is a typo, not a fixture.
  const double inter = intermediate == 0 ? 4.0 * static_cast<double>(hidden) : intermediate;
  const double stacks = arch == "t5" ? 2.0 : 1.0;  // T5: an encoder and a decoder of `layers`
  const double params = stacks * static_cast<double>(layers) * static_cast<double>(hidden) *
                            (4.0 * static_cast<double>(hidden) + 3.0 * inter) +
                        2.0 * static_cast<double>(vocab) * static_cast<double>(hidden);
  SPECDEC_CHECK(params <= 2e9, "make-fixture: about ", static_cast<int64_t>(params),
                " parameters; a fixture has at most 2e9");
  SPECDEC_CHECK(exit_layers == -1 || (exit_layers >= 0 && exit_layers <= layers),
                "make-fixture: --exit-layers must be in [0, --layers] (", layers,
                "), or -1 for none; got ", exit_layers);
  for (int64_t id : {bos_token_id, eos_token_id, pad_token_id})
    SPECDEC_CHECK(id >= 0 && id < vocab, "make-fixture: special token id ", id,
                  " outside the vocabulary");
  parse_dtype(dtype);
}

void make_fixture(const std::string& out_dir, const FixtureOptions& options) {
  FixtureOptions o = options;
  if (!o.tokenizer_dir.empty()) {
    SPECDEC_CHECK(
        std::any_of(std::begin(detail::kTokenizerFiles), std::end(detail::kTokenizerFiles),
                    [&](const char* f) { return file_exists(o.tokenizer_dir + "/" + f); }),
        o.tokenizer_dir,
        ": no tokenizer files to copy (tokenizer.model, spiece.model, tokenizer.json or "
        "vocab.json + merges.txt); a GGUF's vocabulary stays in its GGUF");
    const auto tok = load_tokenizer(o.tokenizer_dir);
    o.vocab = tok->size();
    if (tok->bos_token_id()) o.bos_token_id = *tok->bos_token_id();
    if (tok->eos_token_id()) o.eos_token_id = *tok->eos_token_id();
    // Padding (and T5's decoder start) is the tokenizer's <pad> when it has one, else EOS.
    o.pad_token_id = o.eos_token_id;
    for (int64_t id = 0; id < tok->size(); ++id)
      if (tok->token(id) == "<pad>") {
        o.pad_token_id = id;
        break;
      }
  }
  o.validate();
  c10::InferenceMode guard;
  const int64_t kv = o.kv_heads == 0 ? o.heads : o.kv_heads;
  const int64_t inter = o.intermediate == 0 ? 4 * o.hidden : o.intermediate;
  const int64_t d = o.hidden / o.heads;
  const at::ScalarType dtype = parse_dtype(o.dtype);
  at::Generator gen = at::detail::createCPUGenerator(o.seed);
  std::map<std::string, at::Tensor> t;
  auto randn = [&](std::vector<int64_t> shape, double scale = 1.0) {
    return at::normal(0.0, o.init_std * scale, shape, gen).to(dtype);
  };
  auto ones = [&](int64_t n) { return at::ones({n}, at::kFloat).to(dtype); };
  auto zeros = [&](int64_t n) { return at::zeros({n}, at::kFloat).to(dtype); };
  // Scale of the residual-branch outputs of layer i (the synthetic early exit).
  auto exit_scale = [&](int64_t i) {
    return (o.exit_layers >= 0 && i >= o.exit_layers) ? o.exit_scale : 1.0;
  };
  const int64_t h = o.hidden;
  json c = {{"architectures", {architecture_of(o.arch)}},
            {"model_type", o.arch},
            {"vocab_size", o.vocab},
            {"torch_dtype", dtype_name(dtype)},
            {"bos_token_id", o.bos_token_id},
            {"eos_token_id", o.eos_token_id},
            {"pad_token_id", o.pad_token_id}};
  const bool gemma3 = o.arch == "gemma3";
  if (llama_family(o.arch) || gemma3) {
    // Gemma stores a norm's scale as 1 + w: its unit norms are zeros.
    auto unit = [&](int64_t n) { return gemma3 ? zeros(n) : ones(n); };
    t["model.embed_tokens.weight"] = randn({o.vocab, h});
    for (int64_t i = 0; i < o.layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      // Gemma normalises each branch's output before its residual add: the early exit scales
      // those norms (scale 1 + w = s) instead of the output projections.
      const double s = gemma3 ? 1.0 : exit_scale(i);
      t[p + "input_layernorm.weight"] = unit(h);
      if (gemma3) {
        const at::Tensor post = (zeros(h).to(at::kFloat) + (exit_scale(i) - 1.0)).to(dtype);
        t[p + "post_attention_layernorm.weight"] = post;
        t[p + "pre_feedforward_layernorm.weight"] = unit(h);
        t[p + "post_feedforward_layernorm.weight"] = post;
      } else {
        t[p + "post_attention_layernorm.weight"] = unit(h);
      }
      if (gemma3 || o.arch == "qwen3")
        t[p + "self_attn.q_norm.weight"] = unit(d), t[p + "self_attn.k_norm.weight"] = unit(d);
      t[p + "self_attn.q_proj.weight"] = randn({o.heads * d, h});
      t[p + "self_attn.k_proj.weight"] = randn({kv * d, h});
      t[p + "self_attn.v_proj.weight"] = randn({kv * d, h});
      t[p + "self_attn.o_proj.weight"] = randn({h, o.heads * d}, s);
      if (o.arch == "qwen2") {
        t[p + "self_attn.q_proj.bias"] = randn({o.heads * d});
        t[p + "self_attn.k_proj.bias"] = randn({kv * d});
        t[p + "self_attn.v_proj.bias"] = randn({kv * d});
      }
      t[p + "mlp.gate_proj.weight"] = randn({inter, h});
      t[p + "mlp.up_proj.weight"] = randn({inter, h});
      t[p + "mlp.down_proj.weight"] = randn({h, inter}, s);
    }
    t["model.norm.weight"] = unit(h);
    const bool tied = o.tie_word_embeddings || gemma3;  // Gemma3ForCausalLM always ties
    if (!tied) t["lm_head.weight"] = randn({o.vocab, h});
    if (o.feature_fed) {
      t["fc_norm.weight"] = ones(h);
      t["fc.weight"] = randn({h, 2 * h});
      c["specdec_feature_size"] = h;
    }
    c.update({{"hidden_size", h},
              {"intermediate_size", inter},
              {"num_hidden_layers", o.layers},
              {"num_attention_heads", o.heads},
              {"num_key_value_heads", kv},
              {"head_dim", d},
              {"max_position_embeddings", o.max_pos},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 10000.0},
              {"hidden_act", "silu"},
              {"tie_word_embeddings", tied}});
    if (gemma3) {
      // Gemma 3's layout in small: sliding and global layers alternating (the real models have
      // five sliding layers per global one), a window shorter than the test sequences.
      json types = json::array();
      for (int64_t i = 0; i < o.layers; ++i)
        types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
      c.erase("hidden_act");
      c.update({{"model_type", "gemma3_text"},
                {"hidden_activation", "gelu_pytorch_tanh"},
                {"layer_types", types},
                {"sliding_window", std::min<int64_t>(16, o.max_pos)},
                {"query_pre_attn_scalar", d},
                {"rope_theta", 1000000.0},
                {"rope_local_base_freq", 10000.0}});
    }
  } else if (o.arch == "gpt_neox") {
    t["gpt_neox.embed_in.weight"] = randn({o.vocab, h});
    for (int64_t i = 0; i < o.layers; ++i) {
      const std::string p = "gpt_neox.layers." + std::to_string(i) + ".";
      const double s = exit_scale(i);
      for (const char* n : {"input_layernorm", "post_attention_layernorm"})
        t[p + n + ".weight"] = ones(h), t[p + n + ".bias"] = zeros(h);
      t[p + "attention.query_key_value.weight"] = randn({3 * h, h});
      t[p + "attention.query_key_value.bias"] = randn({3 * h});
      t[p + "attention.dense.weight"] = randn({h, h}, s);
      t[p + "attention.dense.bias"] = randn({h}, s);
      t[p + "mlp.dense_h_to_4h.weight"] = randn({inter, h});
      t[p + "mlp.dense_h_to_4h.bias"] = randn({inter});
      t[p + "mlp.dense_4h_to_h.weight"] = randn({h, inter}, s);
      t[p + "mlp.dense_4h_to_h.bias"] = randn({h}, s);
    }
    t["gpt_neox.final_layer_norm.weight"] = ones(h), t["gpt_neox.final_layer_norm.bias"] = zeros(h);
    t["embed_out.weight"] = randn({o.vocab, h});
    c.update({{"hidden_size", h},
              {"intermediate_size", inter},
              {"num_hidden_layers", o.layers},
              {"num_attention_heads", o.heads},
              {"max_position_embeddings", o.max_pos},
              {"rotary_pct", 0.25},
              {"rotary_emb_base", 10000},
              {"use_parallel_residual", true},
              {"layer_norm_eps", 1e-5},
              {"hidden_act", "gelu"},
              {"attention_bias", true},
              {"tie_word_embeddings", false}});
  } else if (o.arch == "gpt2") {
    // Conv1D layout: weights are [in, out].
    t["transformer.wte.weight"] = randn({o.vocab, h});
    t["transformer.wpe.weight"] = randn({o.max_pos, h});
    for (int64_t i = 0; i < o.layers; ++i) {
      const std::string p = "transformer.h." + std::to_string(i) + ".";
      const double s = exit_scale(i);
      for (const char* n : {"ln_1", "ln_2"})
        t[p + n + ".weight"] = ones(h), t[p + n + ".bias"] = zeros(h);
      t[p + "attn.c_attn.weight"] = randn({h, 3 * h});
      t[p + "attn.c_attn.bias"] = randn({3 * h});
      t[p + "attn.c_proj.weight"] = randn({h, h}, s);
      t[p + "attn.c_proj.bias"] = randn({h}, s);
      t[p + "mlp.c_fc.weight"] = randn({h, inter});
      t[p + "mlp.c_fc.bias"] = randn({inter});
      t[p + "mlp.c_proj.weight"] = randn({inter, h}, s);
      t[p + "mlp.c_proj.bias"] = randn({h}, s);
    }
    t["transformer.ln_f.weight"] = ones(h), t["transformer.ln_f.bias"] = zeros(h);
    c.update({{"n_embd", h},
              {"n_inner", inter},
              {"n_layer", o.layers},
              {"n_head", o.heads},
              {"n_positions", o.max_pos},
              {"activation_function", "gelu_new"},
              {"layer_norm_epsilon", 1e-5},
              {"scale_attn_weights", true}});
  } else if (o.arch == "t5") {
    const int64_t inner = o.heads * d;
    t["shared.weight"] = randn({o.vocab, h});
    auto block = [&](const std::string& p, bool decoder, double s) {
      auto attention = [&](const std::string& a) {
        for (const char* n : {"q", "k", "v"}) t[a + n + ".weight"] = randn({inner, h});
        t[a + "o.weight"] = randn({h, inner}, s);
      };
      t[p + "layer.0.layer_norm.weight"] = ones(h);
      attention(p + "layer.0.SelfAttention.");
      if (decoder) {
        t[p + "layer.1.layer_norm.weight"] = ones(h);
        attention(p + "layer.1.EncDecAttention.");
      }
      const std::string f = p + "layer." + (decoder ? "2" : "1") + ".";
      t[f + "layer_norm.weight"] = ones(h);
      for (const char* n :
           o.gated_act ? std::vector<const char*>{"wi_0", "wi_1"} : std::vector<const char*>{"wi"})
        t[f + "DenseReluDense." + n + ".weight"] = randn({inter, h});
      t[f + "DenseReluDense.wo.weight"] = randn({h, inter}, s);
    };
    for (int64_t i = 0; i < o.layers; ++i) {
      block("encoder.block." + std::to_string(i) + ".", false, 1.0);
      block("decoder.block." + std::to_string(i) + ".", true, exit_scale(i));
    }
    // The relative position bias is learnt by the first block of each stack: N(0, 1) per bucket
    // and head, so that positions matter.
    for (const char* stack : {"encoder", "decoder"})
      t[std::string(stack) + ".block.0.layer.0.SelfAttention.relative_attention_bias.weight"] =
          at::normal(0.0, 1.0, {32, o.heads}, gen).to(dtype);
    t["encoder.final_layer_norm.weight"] = ones(h);
    t["decoder.final_layer_norm.weight"] = ones(h);
    if (!o.tie_word_embeddings) t["lm_head.weight"] = randn({o.vocab, h});
    c.update({{"d_model", h},
              {"d_kv", d},
              {"d_ff", inter},
              {"num_layers", o.layers},
              {"num_decoder_layers", o.layers},
              {"num_heads", o.heads},
              {"relative_attention_num_buckets", 32},
              {"relative_attention_max_distance", 128},
              {"feed_forward_proj", o.gated_act ? "gated-gelu" : "relu"},
              {"layer_norm_epsilon", 1e-6},
              {"is_encoder_decoder", true},
              {"decoder_start_token_id", o.pad_token_id},
              {"tie_word_embeddings", o.tie_word_embeddings}});
  } else {  // opt
    const std::string r = "model.decoder.";
    t[r + "embed_tokens.weight"] = randn({o.vocab, h});
    t[r + "embed_positions.weight"] = randn({o.max_pos + 2, h});
    for (int64_t i = 0; i < o.layers; ++i) {
      const std::string p = r + "layers." + std::to_string(i) + ".";
      const double s = exit_scale(i);
      for (const char* n : {"self_attn_layer_norm", "final_layer_norm"})
        t[p + n + ".weight"] = ones(h), t[p + n + ".bias"] = zeros(h);
      for (const char* n : {"q_proj", "k_proj", "v_proj"})
        t[p + "self_attn." + n + ".weight"] = randn({h, h}),
                                 t[p + "self_attn." + n + ".bias"] = randn({h});
      t[p + "self_attn.out_proj.weight"] = randn({h, h}, s);
      t[p + "self_attn.out_proj.bias"] = randn({h}, s);
      t[p + "fc1.weight"] = randn({inter, h});
      t[p + "fc1.bias"] = randn({inter});
      t[p + "fc2.weight"] = randn({h, inter}, s);
      t[p + "fc2.bias"] = randn({h}, s);
    }
    t[r + "final_layer_norm.weight"] = ones(h), t[r + "final_layer_norm.bias"] = zeros(h);
    c.update({{"hidden_size", h},
              {"ffn_dim", inter},
              {"num_hidden_layers", o.layers},
              {"num_attention_heads", o.heads},
              {"max_position_embeddings", o.max_pos},
              {"do_layer_norm_before", true},
              {"word_embed_proj_dim", h},
              {"activation_function", "relu"},
              {"enable_bias", true},
              {"layer_norm_elementwise_affine", true}});
  }
  make_dir(out_dir);
  if (!o.tokenizer_dir.empty()) copy_tokenizer_files(o.tokenizer_dir, out_dir);
  write_checkpoint(out_dir, c, t);
}

void make_draft_of(const std::string& target, const std::string& out_dir, int64_t layers,
                   double noise, uint64_t seed) {
  c10::InferenceMode guard;
  SPECDEC_CHECK(noise >= 0, "make-fixture: --noise must be >= 0");
  const detail::SourceCheckpoint src = detail::open_checkpoint(target);
  // The target is loaded as a model first: a tensor of the wrong shape, or a config its weights do
  // not follow, is refused in the loader's words before a draft of it is written.
  load_model(target);
  const ModelConfig& tc = src.config;
  json c = src.config_json;
  const WeightSource* w = src.weights.get();
  SPECDEC_CHECK(layers >= 1 && layers <= tc.num_hidden_layers, "make-fixture: --layers ", layers,
                " must be in [1, ", tc.num_hidden_layers, "] for a draft of ", target);
  c[tc.model_type == "gpt2" ? "n_layer"
    : tc.model_type == "t5" ? "num_decoder_layers"
                            : "num_hidden_layers"] = layers;
  if (c.contains("layer_types") && c["layer_types"].is_array())  // Gemma 3: the first layers' kinds
    c["layer_types"].erase(c["layer_types"].begin() + layers, c["layer_types"].end());
  at::Generator gen = at::detail::createCPUGenerator(seed);
  std::map<std::string, at::Tensor> t;
  for (const std::string& name : w->names()) {
    if (decoder_layer_of(name) >= layers) continue;
    at::Tensor x = w->load(name, at::kFloat, c10::Device(c10::kCPU));
    if (noise > 0) x = x + at::normal(0.0, noise, x.sizes(), gen);
    t[name] = x.to(w->stored_dtype(name));
  }
  make_dir(out_dir);
  // A GGUF target's tokenizer lives in its metadata: the draft folder has none of its own and
  // programs use the target's.
  if (!src.gguf) copy_tokenizer_files(target, out_dir);
  write_checkpoint(out_dir, c, t);
}

}  // namespace specdec
