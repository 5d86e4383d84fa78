#include "specdec/config.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>
#include <unordered_set>

#include "json.hpp"
#include "specdec/error.hpp"
#include "specdec/limits.hpp"
#include "util.hpp"

namespace specdec {

using nlohmann::json;

const std::vector<std::string>& supported_model_types() {
  static const std::vector<std::string> kTypes = {
      "llama", "mistral", "qwen2", "qwen3", "gemma3_text", "gpt_neox", "gpt2", "opt", "t5"};
  return kTypes;
}

bool llama_family(const std::string& t) {
  return t == "llama" || t == "mistral" || t == "qwen2" || t == "qwen3";
}

namespace {

json parse_json(const std::string& text, const std::string& source) {
  try {
    return detail::parse_json_bounded(text, source);
  } catch (const json::exception& e) {
    throw Error(detail::concat(source, ": invalid JSON: ", detail::json_message(e)));
  }
}

template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

template <typename T>
void read_field(const json& j, const char* key, T& out, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    // An integer field written as a float (2048.0) is accepted when it is a whole number in range;
    // converting an out-of-range float (1e43) to an integer would be undefined behaviour.
    if (it->is_number_float()) {
      const double d = it->get<double>();
      SPECDEC_CHECK(std::isfinite(d) && d == std::floor(d) && d >= -9.2e18 && d <= 9.2e18, source,
                    ": field '", key, "' must be an integer, got ", it->dump());
      out = static_cast<T>(d);
      return;
    }
  }
  try {
    out = it->get<T>();
  } catch (const json::exception&) {
    if constexpr (is_vector<T>::value)
      if (it->is_array())  // a list with an entry of the wrong type names that entry
        for (size_t i = 0; i < it->size(); ++i) try {
            (void)(*it)[i].template get<typename T::value_type>();
          } catch (const json::exception&) {
            throw Error(detail::concat(source, ": field '", key, "' entry ", i,
                                       " has the wrong type (", (*it)[i].type_name(), ")"));
          }
    throw Error(
        detail::concat(source, ": field '", key, "' has the wrong type (", it->type_name(), ")"));
  }
}

std::vector<int64_t> read_token_list(const json& v, const char* key, const std::string& source) {
  std::vector<int64_t> ids;
  if (v.is_number_integer()) {
    ids.push_back(v.get<int64_t>());
  } else if (v.is_array()) {
    for (const auto& e : v) {
      SPECDEC_CHECK(e.is_number_integer(), source, ": field '", key,
                    "' must be an integer or a list of integers");
      ids.push_back(e.get<int64_t>());
    }
  } else {
    throw Error(
        detail::concat(source, ": field '", key, "' must be an integer or a list of integers"));
  }
  return ids;
}

void read_special_tokens(const json& j, ModelConfig& c, const std::string& source) {
  if (j.contains("bos_token_id") && !j["bos_token_id"].is_null()) {
    auto ids = read_token_list(j["bos_token_id"], "bos_token_id", source);
    if (!ids.empty()) c.bos_token_id = ids[0];
  }
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null())
    c.eos_token_ids = read_token_list(j["eos_token_id"], "eos_token_id", source);
  if (j.contains("pad_token_id") && !j["pad_token_id"].is_null()) {
    auto ids = read_token_list(j["pad_token_id"], "pad_token_id", source);
    if (!ids.empty()) c.pad_token_id = ids[0];
  }
  if (j.contains("decoder_start_token_id") && !j["decoder_start_token_id"].is_null()) {
    auto ids = read_token_list(j["decoder_start_token_id"], "decoder_start_token_id", source);
    if (!ids.empty()) c.decoder_start_token_id = ids[0];
  }
}

// T5Config: d_model, d_ff, d_kv, num_heads, num_layers, num_decoder_layers, feed_forward_proj.
void read_t5_fields(const json& j, ModelConfig& c, const std::string& source) {
  c.is_encoder_decoder = true;
  c.hidden_size = 512, c.head_dim = 64, c.intermediate_size = 2048, c.num_attention_heads = 8;
  c.num_encoder_layers = 6;
  read_field(j, "d_model", c.hidden_size, source);
  read_field(j, "d_kv", c.head_dim, source);
  read_field(j, "d_ff", c.intermediate_size, source);
  read_field(j, "num_heads", c.num_attention_heads, source);
  c.num_key_value_heads = c.num_attention_heads;
  read_field(j, "num_layers", c.num_encoder_layers, source);
  c.num_hidden_layers = c.num_encoder_layers;
  read_field(j, "num_decoder_layers", c.num_hidden_layers, source);
  read_field(j, "relative_attention_num_buckets", c.relative_attention_num_buckets, source);
  read_field(j, "relative_attention_max_distance", c.relative_attention_max_distance, source);
  std::string ff = "relu";
  read_field(j, "feed_forward_proj", ff, source);
  // As T5Config: "[gated-]ACT", and "gated-gelu" means the tanh approximation (t5-v1_1, flan-t5).
  const size_t dash = ff.find('-');
  const bool gated = dash != std::string::npos && ff.substr(0, dash) == "gated";
  SPECDEC_CHECK(dash == std::string::npos || (gated && ff.find('-', dash + 1) == std::string::npos),
                source, ": feed_forward_proj '", ff, "' is not of the form ACT or gated-ACT");
  c.is_gated_act = gated;
  c.hidden_act = ff == "gated-gelu" ? "gelu_new" : gated ? ff.substr(dash + 1) : ff;
  // Fields saved by T5Config.to_dict() win, as in Hugging Face.
  read_field(j, "dense_act_fn", c.hidden_act, source);
  read_field(j, "is_gated_act", c.is_gated_act, source);
}

// A `rope_scaling` object, or one of `rope_parameters` (transformers 5, which moves rope_theta into
// it): the scaling type and factors into `scaling`, a rope_theta into `theta`.
void read_rope(const json& rs, RopeScaling& scaling, double& theta, const std::string& source,
               const std::string& key) {
  SPECDEC_CHECK(rs.is_object(), source, ": field '", key, "' must be an object");
  std::string type;
  read_field(rs, "rope_type", type, source);
  if (type.empty()) read_field(rs, "type", type, source);
  SPECDEC_CHECK(type.empty() || type == "linear" || type == "llama3" || type == "default", source,
                ": unsupported ", key, " type '", type, "' (supported: default, linear, llama3)");
  scaling.type = type == "default" ? "" : type;
  // Hugging Face's rope validation: the keys each type needs.
  std::vector<const char*> needs;
  if (type == "linear") needs = {"factor"};
  if (type == "llama3")
    needs = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
  for (const char* k : needs)
    SPECDEC_CHECK(rs.contains(k) && !rs[k].is_null(), source, ": ", key, " of type '", type,
                  "' needs '", k, "'");
  read_field(rs, "factor", scaling.factor, source);
  read_field(rs, "low_freq_factor", scaling.low_freq_factor, source);
  read_field(rs, "high_freq_factor", scaling.high_freq_factor, source);
  read_field(rs, "original_max_position_embeddings", scaling.original_max_position_embeddings,
             source);
  read_field(rs, "rope_theta", theta, source);
}

// Gemma3TextConfig's fields beyond the llama family's, in both dialects: transformers 4.5x
// (rope_theta, rope_local_base_freq, sliding_window_pattern, rope_scaling for the full layers) and
// 5 (layer_types, rope_parameters per layer type).
void read_gemma3_fields(const json& j, ModelConfig& c, const std::string& source) {
  c.qk_norm = true;
  c.tie_word_embeddings = true;
  c.hidden_act = "gelu_pytorch_tanh";  // Gemma's field is hidden_activation (read last)
  c.query_pre_attn_scalar = 256;
  read_field(j, "query_pre_attn_scalar", c.query_pre_attn_scalar, source);
  read_field(j, "rope_local_base_freq", c.rope_local_theta, source);
  c.sliding_window = 4096;
  read_field(j, "sliding_window", c.sliding_window, source);
  bool bidirectional = false;
  read_field(j, "use_bidirectional_attention", bidirectional, source);
  SPECDEC_CHECK(!bidirectional, source,
                ": use_bidirectional_attention is set (an encoder's attention): not supported");
  for (const char* cap : {"final_logit_softcapping", "attn_logit_softcapping"})
    SPECDEC_CHECK(!j.contains(cap) || j[cap].is_null(), source, ": field '", cap,
                  "' is set: logit soft-capping (Gemma 2) is not supported");
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    read_field(j, "layer_types", c.layer_types, source);
  } else {
    int64_t pattern = 6;
    read_field(j, "sliding_window_pattern", pattern, source);
    check_layer_limit(c.num_hidden_layers, source, "num_hidden_layers");
    // (a pattern past the layer count makes every layer sliding, as Hugging Face reads it)
    SPECDEC_CHECK(pattern >= 1, source, ": sliding_window_pattern must be >= 1, got ", pattern);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      c.layer_types.push_back((i + 1) % pattern ? "sliding_attention" : "full_attention");
  }
}

}  // namespace

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& source) {
  const json j = parse_json(text, source);
  SPECDEC_CHECK(j.is_object(), source, ": expected a JSON object");
  ModelConfig c;
  read_field(j, "model_type", c.model_type, source);
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    c.architecture = j["architectures"][0].get<std::string>();
  const auto& types = supported_model_types();
  SPECDEC_CHECK(!c.model_type.empty(), source,
                ": missing field 'model_type' (supported: ", join(types), ")");
  SPECDEC_CHECK(std::find(types.begin(), types.end(), c.model_type) != types.end(), source,
                ": unsupported model_type '", c.model_type, "' (",
                c.model_type == "gemma3" ? "Gemma 3's multimodal checkpoint: its text model loads, "
                                           "as gemma3_text or from a GGUF file; "
                                         : "",
                "supported: ", join(types), ")");
  const bool gpt2 = c.model_type == "gpt2", opt = c.model_type == "opt",
             neox = c.model_type == "gpt_neox", gemma3 = c.model_type == "gemma3_text";
  read_field(j, "vocab_size", c.vocab_size, source);
  if (c.model_type == "t5") {
    read_t5_fields(j, c, source);
  } else {
    read_field(j, gpt2 ? "n_embd" : "hidden_size", c.hidden_size, source);
    read_field(j,
               gpt2  ? "n_inner"
               : opt ? "ffn_dim"
                     : "intermediate_size",
               c.intermediate_size, source);
    if (gpt2 && c.intermediate_size == 0) c.intermediate_size = 4 * c.hidden_size;  // n_inner: null
    read_field(j, gpt2 ? "n_layer" : "num_hidden_layers", c.num_hidden_layers, source);
    read_field(j, gpt2 ? "n_head" : "num_attention_heads", c.num_attention_heads, source);
    c.num_key_value_heads = c.num_attention_heads;
    read_field(j, "num_key_value_heads", c.num_key_value_heads, source);
    if (gemma3) c.head_dim = 256, c.max_position_embeddings = 131072;  // Gemma3TextConfig's
    if (c.model_type == "qwen3") c.head_dim = 128;                     // Qwen3Config's
    read_field(j, "head_dim", c.head_dim, source);
    SPECDEC_CHECK(c.head_dim != 0 || !j.contains("head_dim") || j["head_dim"].is_null(), source,
                  ": field 'head_dim' must be a positive integer, got 0");
    if (c.head_dim == 0 && c.num_attention_heads > 0) {
      SPECDEC_CHECK(c.hidden_size % c.num_attention_heads == 0, source, ": hidden_size ",
                    c.hidden_size, " is not a multiple of num_attention_heads ",
                    c.num_attention_heads, " (and there is no head_dim)");
      c.head_dim = c.hidden_size / c.num_attention_heads;
    }
    read_field(j, gpt2 ? "n_positions" : "max_position_embeddings", c.max_position_embeddings,
               source);
  }
  if (neox || gpt2 || opt) c.rms_norm_eps = 1e-5;
  read_field(j, "rms_norm_eps", c.rms_norm_eps, source);
  read_field(j, "layer_norm_eps", c.rms_norm_eps, source);
  read_field(j, "layer_norm_epsilon", c.rms_norm_eps, source);
  if (gemma3) c.rope_theta = 1e6;  // Gemma3TextConfig's default for the full-attention layers
  read_field(j, "rope_theta", c.rope_theta, source);
  read_field(j, "rotary_emb_base", c.rope_theta, source);
  read_field(j, "partial_rotary_factor", c.rotary_pct, source);
  read_field(j, "rotary_pct", c.rotary_pct, source);
  read_field(j, "use_parallel_residual", c.use_parallel_residual, source);
  read_field(j, "scale_attn_weights", c.scale_attn_weights, source);
  read_field(j, "scale_attn_by_inverse_layer_idx", c.scale_attn_by_inverse_layer_idx, source);
  read_field(j, "do_layer_norm_before", c.do_layer_norm_before, source);
  read_field(j, "word_embed_proj_dim", c.word_embed_proj_dim, source);
  read_field(j, "enable_bias", c.enable_bias, source);
  read_field(j, "_remove_final_layer_norm", c.remove_final_layer_norm, source);
  if (neox) c.attention_bias = true;
  read_field(j, "attention_bias", c.attention_bias, source);
  if (c.model_type == "qwen2") c.attention_bias = true;  // Qwen2 always has q/k/v biases
  read_field(j, "mlp_bias", c.mlp_bias, source);
  if (c.model_type == "mistral") read_field(j, "sliding_window", c.sliding_window, source);
  if (c.model_type == "qwen2" || c.model_type == "qwen3") {
    // Qwen applies its window only with use_sliding_window, and then only from max_window_layers.
    bool use = false;
    read_field(j, "use_sliding_window", use, source);
    SPECDEC_CHECK(!use, source, ": use_sliding_window is not supported for ", c.model_type,
                  " (the window applies from max_window_layers on); only Mistral's and Gemma 3's "
                  "sliding_window are");
  }
  if (c.model_type == "qwen3") c.qk_norm = true;
  // transformers 5 writes layer_types for other families too: read, so that a window the layers
  // would have and these models do not apply is refused (validate), not ignored.
  if (!gemma3 && j.contains("layer_types") && !j["layer_types"].is_null())
    read_field(j, "layer_types", c.layer_types, source);
  SPECDEC_CHECK(!c.mlp_bias || c.model_type == "llama" || c.model_type == "mistral" ||
                    c.model_type == "qwen2",
                source, ": mlp_bias is only supported for llama, mistral and qwen2");
  // GPT-2, OPT, T5 and Gemma 3 tie the head to the embeddings unless told otherwise; GPT-NeoX
  // never does.
  c.tie_word_embeddings = gpt2 || opt || c.is_encoder_decoder;
  if (gemma3) read_gemma3_fields(j, c, source);
  read_field(j, "tie_word_embeddings", c.tie_word_embeddings, source);
  if (j.contains("head_token_ids") && !j["head_token_ids"].is_null()) {
    SPECDEC_CHECK(j["head_token_ids"].is_array(), source,
                  ": field 'head_token_ids' must be a list of token ids");
    c.head_token_ids = read_token_list(j["head_token_ids"], "head_token_ids", source);
    SPECDEC_CHECK(!c.head_token_ids.empty(), source, ": field 'head_token_ids' is empty");
  }
  read_field(j, "specdec_feature_size", c.feature_size, source);
  if (neox || gpt2 || opt) c.hidden_act = neox ? "gelu" : gpt2 ? "gelu_new" : "relu";
  read_field(j, "hidden_act", c.hidden_act, source);
  read_field(j, "activation_function", c.hidden_act, source);
  if (gemma3) {  // Gemma3TextConfig reads hidden_activation only
    c.hidden_act = "gelu_pytorch_tanh";
    read_field(j, "hidden_activation", c.hidden_act, source);
  }
  read_field(j, "torch_dtype", c.torch_dtype, source);
  read_field(j, "dtype", c.torch_dtype, source);  // transformers 5's name
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    read_rope(j["rope_scaling"], c.rope_scaling, c.rope_theta, source, "rope_scaling");
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    // transformers 5: one object, or (Gemma 3) one per layer type.
    const json& rp = j["rope_parameters"];
    // (per layer type when it holds objects; then only the two types Gemma 3 has)
    const bool per_type = rp.is_object() && std::any_of(rp.begin(), rp.end(), [](const json& v) {
                            return v.is_object();
                          });
    if (per_type)
      for (const auto& [type, v] : rp.items())
        SPECDEC_CHECK(type == "full_attention" || type == "sliding_attention", source,
                      ": rope_parameters names the layer type '", type,
                      "' (supported: full_attention, sliding_attention)");
    if (!per_type) read_rope(rp, c.rope_scaling, c.rope_theta, source, "rope_parameters");
    if (per_type && rp.contains("full_attention"))
      read_rope(rp["full_attention"], c.rope_scaling, c.rope_theta, source,
                "rope_parameters.full_attention");
    if (per_type && rp.contains("sliding_attention"))
      read_rope(rp["sliding_attention"], c.rope_local_scaling, c.rope_local_theta, source,
                "rope_parameters.sliding_attention");
  }
  read_special_tokens(j, c, source);
  c.validate(source);
  return c;
}

void ModelConfig::apply_generation_config_text(const std::string& text, const std::string& source) {
  const json j = parse_json(text, source);
  SPECDEC_CHECK(j.is_object(), source, ": expected a JSON object");
  read_special_tokens(j, *this, source);
}

ModelConfig ModelConfig::from_dir(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  // Reached by load_model for anything that is not a GGUF checkpoint: say what a checkpoint is.
  const bool gguf_name = dir.size() > 5 && dir.compare(dir.size() - 5, 5, ".gguf") == 0;
  SPECDEC_CHECK(path_exists(dir), dir,
                gguf_name ? ": no such file"
                          : ": no such file or folder (a checkpoint is a folder with " +
                                config_path + " or a .gguf file)");
  SPECDEC_CHECK(!file_exists(dir), dir,
                ": not a checkpoint: a file whose name does not end in .gguf (a checkpoint is a "
                "folder with config.json or a .gguf file)");
  SPECDEC_CHECK(dir_exists(dir), dir,
                ": not a checkpoint: neither a file nor a folder (a checkpoint is a folder with "
                "config.json or a .gguf file)");
  SPECDEC_CHECK(file_exists(config_path), dir, ": not a checkpoint: no ", config_path,
                " (Hugging Face) and no .gguf file (GGUF)");
  ModelConfig c = from_json_text(read_text_file(config_path), config_path);
  const std::string gen_path = dir + "/generation_config.json";
  if (file_exists(gen_path)) {
    c.apply_generation_config_text(read_text_file(gen_path), gen_path);
    c.validate(gen_path);  // its token ids must fit the vocabulary too
  }
  return c;
}

bool ModelConfig::is_eos(int64_t token) const {
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), token) != eos_token_ids.end();
}

void ModelConfig::validate(const std::string& source) const {
  auto positive = [&](int64_t v, const char* name) {
    SPECDEC_CHECK(v != 0, source, ": field '", name, "' is missing (or 0)");
    SPECDEC_CHECK(v > 0, source, ": field '", name, "' must be a positive integer, got ", v);
  };
  positive(vocab_size, "vocab_size");
  SPECDEC_CHECK(vocab_size <= limits().max_vocab_size, source, ": vocab_size ", vocab_size,
                " exceeds the limit of ", limits().max_vocab_size, " (Limits::max_vocab_size)");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(max_position_embeddings, "max_position_embeddings");
  check_layer_limit(num_hidden_layers, source, "num_hidden_layers");
  SPECDEC_CHECK(head_dim <= limits().max_head_dim, source, ": head_dim ", head_dim,
                " exceeds the limit of ", limits().max_head_dim, " (Limits::max_head_dim)");
  SPECDEC_CHECK(num_attention_heads % num_key_value_heads == 0, source, ": num_attention_heads (",
                num_attention_heads, ") must be a multiple of num_key_value_heads (",
                num_key_value_heads, ")");
  if (!is_encoder_decoder)
    SPECDEC_CHECK(head_dim % 2 == 0, source, ": head_dim must be even for rotary embeddings, got ",
                  head_dim);
  // (as float32, where the kernels use them)
  const auto finite_positive = [&](double v, const char* name) {
    SPECDEC_CHECK(v > 0 && v <= std::numeric_limits<float>::max(), source, ": ", name,
                  " must be a number > 0 that float32 holds (at most 3.4e38), got ", v);
  };
  finite_positive(rms_norm_eps, "rms_norm_eps");
  finite_positive(rope_theta, "rope_theta");
  finite_positive(rope_local_theta, "the sliding layers' rope_theta (rope_local_base_freq)");
  // Hugging Face rotates int(head_dim * rotary_pct) dimensions, in halves
  SPECDEC_CHECK(rotary_pct > 0 && rotary_pct <= 1, source,
                ": rotary_pct (partial_rotary_factor) must be in (0, 1], got ", rotary_pct);
  if (rotary_pct != 1) {
    SPECDEC_CHECK(model_type == "gpt_neox", source,
                  ": partial rotary embeddings (partial_rotary_factor ", rotary_pct,
                  ") are supported for gpt_neox only");
    const auto rotated = static_cast<int64_t>(static_cast<double>(head_dim) * rotary_pct);
    SPECDEC_CHECK(rotated > 0 && rotated % 2 == 0, source, ": rotary_pct ", rotary_pct, " rotates ",
                  rotated, " of head_dim ", head_dim, " dimensions: an even number > 0 is needed");
  }
  for (size_t i = 0; i < head_token_ids.size(); ++i)
    SPECDEC_CHECK(head_token_ids[i] >= 0 && head_token_ids[i] < vocab_size &&
                      (i == 0 || head_token_ids[i] > head_token_ids[i - 1]),
                  source, ": head_token_ids must be strictly increasing ids below vocab_size ",
                  vocab_size, " (entry ", i, " is ", head_token_ids[i], ")");
  SPECDEC_CHECK(feature_size == 0 || feature_size == hidden_size, source,
                ": specdec_feature_size must be 0 or ", "hidden_size (", hidden_size,
                "): a feature-fed draft reads its own outputs as features too; got ", feature_size);
  const bool llama = llama_family(model_type);
  SPECDEC_CHECK(
      feature_size == 0 || llama || model_type == "gemma3_text", source,
      ": specdec_feature_size (a feature-fed draft) is supported for the llama family and "
      "gemma3_text only");
  SPECDEC_CHECK(
      head_token_ids.empty() || llama || model_type == "gemma3_text", source,
      ": head_token_ids (a reduced-vocabulary head) is supported for the llama family and Gemma 3");
  if (llama) {
    SPECDEC_CHECK(hidden_act == "silu", source, ": unsupported hidden_act '", hidden_act,
                  "' (supported: silu)");
  } else {
    const std::vector<std::string> acts = {"relu",      "gelu", "gelu_new", "gelu_pytorch_tanh",
                                           "gelu_fast", "silu"};
    SPECDEC_CHECK(std::find(acts.begin(), acts.end(), hidden_act) != acts.end(), source,
                  ": unsupported activation '", hidden_act, "' (supported: ", join(acts), ")");
  }
  if (!layer_types.empty()) {
    SPECDEC_CHECK(static_cast<int64_t>(layer_types.size()) == num_hidden_layers, source,
                  ": layer_types has ", layer_types.size(), " entries for ", num_hidden_layers,
                  " layers (num_hidden_layers)");
    for (const std::string& t : layer_types)
      SPECDEC_CHECK(t == "sliding_attention" || t == "full_attention", source,
                    ": layer_types entry '", t,
                    "' is neither \"sliding_attention\" nor \"full_attention\"");
  }
  SPECDEC_CHECK(sliding_window >= 0, source, ": sliding_window must be >= 0, got ", sliding_window);
  // The attention scale, query_pre_attn_scalar^-1/2, is applied in float32: it must be finite.
  SPECDEC_CHECK(query_pre_attn_scalar == 0 ||
                    (query_pre_attn_scalar > 0 &&
                     std::isfinite(static_cast<float>(1 / std::sqrt(query_pre_attn_scalar)))),
                source,
                ": query_pre_attn_scalar must be > 0 with a finite float32 scale (its -1/2 "
                "power), or 0 for head_dim; got ",
                query_pre_attn_scalar);
  if (model_type == "gemma3_text") {
    SPECDEC_CHECK(static_cast<int64_t>(layer_types.size()) == num_hidden_layers, source,
                  ": gemma3_text needs a layer_types entry per layer");
    SPECDEC_CHECK(!attention_bias, source,
                  ": attention_bias is not supported for gemma3_text (Gemma 3 has no biases)");
  }
  if (model_type != "gemma3_text")  // one window on every layer or none (Mistral's)
    for (const std::string& t : layer_types)
      SPECDEC_CHECK(t == (sliding_window > 0 ? "sliding_attention" : "full_attention"), source,
                    ": layer_types has a '", t, "' layer, but ", model_type, " applies ",
                    sliding_window > 0 ? "its sliding_window to every layer"
                                       : "no sliding window (only Mistral's and Gemma 3's are)");
  SPECDEC_CHECK(sliding_window > 0 || std::find(layer_types.begin(), layer_types.end(),
                                                "sliding_attention") == layer_types.end(),
                source, ": layer_types has sliding_attention layers but sliding_window is 0");
  if (is_encoder_decoder) {
    check_layer_limit(num_encoder_layers, source, "num_layers");
    positive(relative_attention_num_buckets, "relative_attention_num_buckets");
    positive(relative_attention_max_distance, "relative_attention_max_distance");
    SPECDEC_CHECK(decoder_start_token_id.has_value(), source,
                  ": encoder-decoder model without decoder_start_token_id");
    SPECDEC_CHECK(*decoder_start_token_id >= 0 && *decoder_start_token_id < vocab_size, source,
                  ": decoder_start_token_id ", *decoder_start_token_id,
                  " is outside the vocabulary [0, ", vocab_size, ")");
  }
  for (int64_t id : eos_token_ids)
    SPECDEC_CHECK(id >= 0 && id < vocab_size, source, ": eos_token_id ", id,
                  " is outside the vocabulary [0, ", vocab_size, ")");
  SPECDEC_CHECK(!bos_token_id || (*bos_token_id >= 0 && *bos_token_id < vocab_size), source,
                ": bos_token_id ", bos_token_id.value_or(0), " is outside the vocabulary [0, ",
                vocab_size, ")");
  // A negative pad_token_id (original LLaMA configs say -1) means none.
  SPECDEC_CHECK(!pad_token_id || *pad_token_id < vocab_size, source, ": pad_token_id ",
                pad_token_id.value_or(0), " is outside the vocabulary [0, ", vocab_size, ")");
  for (const RopeScaling* r : {&rope_scaling, &rope_local_scaling})
    if (!r->type.empty()) {
      finite_positive(r->factor, "the rope scaling factor");
      if (r->type == "llama3") {
        finite_positive(r->low_freq_factor, "llama3 rope scaling's low_freq_factor");
        finite_positive(r->high_freq_factor, "llama3 rope scaling's high_freq_factor");
        SPECDEC_CHECK(
            r->high_freq_factor > r->low_freq_factor && r->original_max_position_embeddings > 0,
            source,
            ": llama3 rope scaling needs high_freq_factor > low_freq_factor and "
            "original_max_position_embeddings > 0");
      }
    }
}

namespace {

constexpr std::pair<const char*, Schedule> kSchedules[] = {
    {"constant", Schedule::kConstant},
    {"heuristic", Schedule::kHeuristic},
    {"heuristic_transient", Schedule::kHeuristicTransient},
    {"dynamic", Schedule::kDynamic},
    {"goodput", Schedule::kGoodput}};

}  // namespace

Schedule GenerationConfig::schedule() const {
  if (num_assistant_tokens_schedule.empty())
    return sampling() ? Schedule::kConstant : Schedule::kGoodput;
  for (const auto& [name, value] : kSchedules)
    if (num_assistant_tokens_schedule == name) return value;
  std::string names;
  const size_t n = std::size(kSchedules);
  for (size_t i = 0; i < n; ++i)
    names += std::string(i == 0 ? "" : i + 1 == n ? " or " : ", ") + kSchedules[i].first;
  throw Error("GenerationConfig.num_assistant_tokens_schedule must be " + names + ", got '" +
              num_assistant_tokens_schedule + "'");
}

int64_t GenerationConfig::resolved_num_assistant_tokens() const {
  if (prompt_lookup_num_tokens > 0) return prompt_lookup_num_tokens;
  if (num_assistant_tokens > 0) return num_assistant_tokens;
  if (suffix_speculation) return 16;
  const Schedule s = schedule();
  return s == Schedule::kDynamic ? 20 : s == Schedule::kGoodput ? 12 : 5;
}

void GenerationConfig::validate() const {
  SPECDEC_CHECK(max_new_tokens >= 1, "GenerationConfig.max_new_tokens must be >= 1, got ",
                max_new_tokens);
  SPECDEC_CHECK(max_new_tokens <= limits().max_sequence_length, "GenerationConfig.max_new_tokens ",
                max_new_tokens, " exceeds the limit of ", limits().max_sequence_length,
                " positions (Limits::max_sequence_length)");
  SPECDEC_CHECK(min_new_tokens >= 0 && min_new_tokens <= limits().max_sequence_length,
                "GenerationConfig.min_new_tokens must be in [0, ", limits().max_sequence_length,
                "], got ", min_new_tokens);
  SPECDEC_CHECK(num_assistant_tokens >= 0 && num_assistant_tokens <= kMaxLookahead,
                "GenerationConfig.num_assistant_tokens must be in [0, ", kMaxLookahead,
                "] (0 = default), got ", num_assistant_tokens);
  (void)schedule();  // a known name
  SPECDEC_CHECK(assistant_confidence_threshold >= 0 && assistant_confidence_threshold <= 1,
                "GenerationConfig.assistant_confidence_threshold must be in [0, 1], got ",
                assistant_confidence_threshold);
  SPECDEC_CHECK(prompt_lookup_num_tokens >= 0 && prompt_lookup_num_tokens <= kMaxLookahead,
                "GenerationConfig.prompt_lookup_num_tokens must be in [0, ", kMaxLookahead,
                "], got ", prompt_lookup_num_tokens);
  SPECDEC_CHECK(prompt_lookup_match == "first" || prompt_lookup_match == "last",
                "GenerationConfig.prompt_lookup_match must be \"first\" or \"last\", got \"",
                prompt_lookup_match, "\"");
  SPECDEC_CHECK(!(suffix_speculation && prompt_lookup_num_tokens > 0),
                "GenerationConfig: suffix_speculation and prompt_lookup_num_tokens: give one of "
                "them");
  SPECDEC_CHECK(draft_tree_width >= 1 && draft_tree_width <= 16,
                "GenerationConfig.draft_tree_width must be in [1, 16], got ", draft_tree_width);
  SPECDEC_CHECK(max_matching_ngram_size >= 1,
                "GenerationConfig.max_matching_ngram_size must be >= 1, got ",
                max_matching_ngram_size);
  SPECDEC_CHECK(temperature >= 0 && std::isfinite(temperature),
                "GenerationConfig.temperature must be finite and >= 0, got ", temperature);
  SPECDEC_CHECK(top_k >= 0, "GenerationConfig.top_k must be >= 0, got ", top_k);
  SPECDEC_CHECK(top_p >= 0 && top_p <= 1, "GenerationConfig.top_p must be in [0, 1], got ", top_p);
  SPECDEC_CHECK(min_p >= 0 && min_p < 1, "GenerationConfig.min_p must be in [0, 1), got ", min_p);
  SPECDEC_CHECK(repetition_penalty >= kMinRepetitionPenalty && std::isfinite(repetition_penalty),
                "GenerationConfig.repetition_penalty must be finite and >= ", kMinRepetitionPenalty,
                ", got ", repetition_penalty);
  SPECDEC_CHECK(frequency_penalty >= -2 && frequency_penalty <= 2,
                "GenerationConfig.frequency_penalty must be in [-2, 2], got ", frequency_penalty);
  SPECDEC_CHECK(presence_penalty >= -2 && presence_penalty <= 2,
                "GenerationConfig.presence_penalty must be in [-2, 2], got ", presence_penalty);
  // (a set, not a scan of the earlier entries: a bias may name every token of a 262k vocabulary)
  std::unordered_set<int64_t> seen(logit_bias.size());
  for (const auto& [id, bias] : logit_bias) {
    SPECDEC_CHECK(id >= 0, "GenerationConfig.logit_bias: token id ", id, " is negative");
    SPECDEC_CHECK(bias >= -100 && bias <= 100, "GenerationConfig.logit_bias: the bias of token ",
                  id, " must be in [-100, 100], got ", bias);
    SPECDEC_CHECK(seen.insert(id).second, "GenerationConfig.logit_bias: token id ", id,
                  " is given twice");
  }
}

}  // namespace specdec
