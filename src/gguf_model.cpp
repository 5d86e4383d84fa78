// GGUF checkpoints: the model configuration from the metadata, and the weights under Hugging Face's
// names (one name table per GGUF architecture), so that the model code is the safetensors one.
#include "gguf_model.hpp"

#include <ATen/ATen.h>

#include <algorithm>

#include "specdec/error.hpp"
#include "util.hpp"

namespace specdec {
namespace {

// GGUF name -> Hugging Face name: the names llama.cpp's LLM_ARCH_LLAMA, QWEN2, QWEN3 and GEMMA3
// share, then each family's own. "{N}" is the block index.
using NameMap = std::pair<const char*, const char*>;
const NameMap kCommonNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
    {"blk.{N}.attn_norm.weight", "model.layers.{N}.input_layernorm.weight"},
    {"blk.{N}.attn_q.weight", "model.layers.{N}.self_attn.q_proj.weight"},
    {"blk.{N}.attn_k.weight", "model.layers.{N}.self_attn.k_proj.weight"},
    {"blk.{N}.attn_v.weight", "model.layers.{N}.self_attn.v_proj.weight"},
    {"blk.{N}.attn_q.bias", "model.layers.{N}.self_attn.q_proj.bias"},
    {"blk.{N}.attn_k.bias", "model.layers.{N}.self_attn.k_proj.bias"},
    {"blk.{N}.attn_v.bias", "model.layers.{N}.self_attn.v_proj.bias"},
    {"blk.{N}.attn_q_norm.weight", "model.layers.{N}.self_attn.q_norm.weight"},
    {"blk.{N}.attn_k_norm.weight", "model.layers.{N}.self_attn.k_norm.weight"},
    {"blk.{N}.attn_output.weight", "model.layers.{N}.self_attn.o_proj.weight"},
    {"blk.{N}.attn_output.bias", "model.layers.{N}.self_attn.o_proj.bias"},
    {"blk.{N}.ffn_gate.weight", "model.layers.{N}.mlp.gate_proj.weight"},
    {"blk.{N}.ffn_up.weight", "model.layers.{N}.mlp.up_proj.weight"},
    {"blk.{N}.ffn_down.weight", "model.layers.{N}.mlp.down_proj.weight"},
};
const NameMap kLlamaNames[] = {
    {"blk.{N}.ffn_norm.weight", "model.layers.{N}.post_attention_layernorm.weight"},
};
const NameMap kGemma3Names[] = {
    {"blk.{N}.post_attention_norm.weight", "model.layers.{N}.post_attention_layernorm.weight"},
    {"blk.{N}.ffn_norm.weight", "model.layers.{N}.pre_feedforward_layernorm.weight"},
    {"blk.{N}.post_ffw_norm.weight", "model.layers.{N}.post_feedforward_layernorm.weight"},
};

std::string replace_block(std::string s, const std::string& n) {
  const size_t at = s.find("{N}");
  return at == std::string::npos ? s : s.replace(at, 3, n);
}

}  // namespace

const std::vector<std::string>& supported_gguf_architectures() {
  static const std::vector<std::string> kArchs = {"llama", "qwen2", "qwen3", "gemma3"};
  return kArchs;
}

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
  const std::string& src = f.path();
  const std::string arch = f.get_string("general.architecture");
  const auto& archs = supported_gguf_architectures();
  SPECDEC_CHECK(std::find(archs.begin(), archs.end(), arch) != archs.end(), src,
                ": unsupported GGUF architecture '", arch, "' (supported: ", join(archs), ")");
  ModelConfig c;
  const bool gemma3 = arch == "gemma3";
  c.model_type = gemma3 ? "gemma3_text" : arch;  // as transformers' GGUF loader names them
  c.architecture = arch == "qwen2"   ? "Qwen2ForCausalLM"
                   : arch == "qwen3" ? "Qwen3ForCausalLM"
                   : gemma3          ? "Gemma3ForCausalLM"
                                     : "LlamaForCausalLM";
  const std::string p = arch + ".";
  c.hidden_size = f.get_int(p + "embedding_length");
  c.intermediate_size = f.get_int(p + "feed_forward_length");
  c.num_hidden_layers = f.get_int(p + "block_count");
  check_layer_limit(c.num_hidden_layers, src, p + "block_count");
  c.num_attention_heads = f.get_int(p + "attention.head_count");
  c.num_key_value_heads = f.find_int(p + "attention.head_count_kv").value_or(c.num_attention_heads);
  SPECDEC_CHECK(c.num_attention_heads > 0, src, ": ", p, "attention.head_count must be > 0");
  if (auto key = f.find_int(p + "attention.key_length")) {
    c.head_dim = *key;
  } else {
    SPECDEC_CHECK(c.hidden_size % c.num_attention_heads == 0, src, ": ", p, "embedding_length ",
                  c.hidden_size, " is not a multiple of ", p, "attention.head_count ",
                  c.num_attention_heads, " (and there is no ", p, "attention.key_length)");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (auto value = f.find_int(p + "attention.value_length"); value && c.head_dim > 0)
    SPECDEC_CHECK(*value == c.head_dim, src, ": ", p, "attention.value_length ", *value,
                  " differs from the key size ", c.head_dim,
                  " (values and keys of one size are supported)");
  if (auto rot = f.find_int(p + "rope.dimension_count"))
    SPECDEC_CHECK(*rot == c.head_dim, src, ": ", p, "rope.dimension_count ", *rot,
                  " differs from the head size ", c.head_dim,
                  " (partial rotary is not supported for ", arch, ")");
  c.max_position_embeddings = f.find_int(p + "context_length").value_or(c.max_position_embeddings);
  c.rms_norm_eps = f.get_float(p + "attention.layer_norm_rms_epsilon");
  c.rope_theta = f.find_float(p + "rope.freq_base").value_or(10000.0);
  const std::string scaling = f.find_string(p + "rope.scaling.type").value_or("none");
  if (scaling == "linear") {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = f.get_float(p + "rope.scaling.factor");
  } else if (auto old = f.find_float(p + "rope.scale_linear"); old && *old != 1.0) {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = *old;
  } else {
    SPECDEC_CHECK(scaling == "none", src, ": unsupported ", p, "rope.scaling.type '", scaling,
                  "' (supported: none, linear)");
  }
  SPECDEC_CHECK(!f.tensors().count("rope_freqs.weight"), src,
                ": per-frequency rope factors (tensor 'rope_freqs.weight', Llama 3.1 style) are "
                "not supported");
  if (f.has("tokenizer.ggml.tokens")) {
    c.vocab_size = static_cast<int64_t>(f.value("tokenizer.ggml.tokens").array_size);
  } else {
    const std::optional<int64_t> size = f.find_int(p + "vocab_size");
    SPECDEC_CHECK(size, src, ": no vocabulary: neither tokenizer.ggml.tokens nor ", p,
                  "vocab_size is present");
    c.vocab_size = *size;
  }
  c.attention_bias = arch == "qwen2" || f.tensors().count("blk.0.attn_q.bias") != 0;
  c.tie_word_embeddings = f.tensors().count("output.weight") == 0;
  c.hidden_act = "silu";
  c.qk_norm = arch == "qwen3" || gemma3;
  if (gemma3) {
    // What llama.cpp assumes for every Gemma 3 GGUF (its converter writes none of these): one
    // global layer in six, the sliding layers' rotary base 10000 without scaling (rope.scaling.*
    // is the global layers'), and query_pre_attn_scalar = head_dim except for the 27B model (62
    // layers), whose is hidden / heads.
    c.hidden_act = "gelu_pytorch_tanh";
    c.sliding_window = f.get_int(p + "attention.sliding_window");
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      c.layer_types.push_back((i + 1) % 6 ? "sliding_attention" : "full_attention");
    c.rope_local_theta = 10000.0;
    c.query_pre_attn_scalar = static_cast<double>(
        c.num_hidden_layers == 62 ? c.hidden_size / c.num_attention_heads : c.head_dim);
    for (const char* cap : {"final_logit_softcapping", "attn_logit_softcapping"})
      SPECDEC_CHECK(!f.has(p + cap), src, ": ", p, cap,
                    " is set: logit soft-capping is not supported");
  }
  if (auto id = f.find_int("tokenizer.ggml.bos_token_id")) c.bos_token_id = *id;
  if (auto id = f.find_int("tokenizer.ggml.eos_token_id")) c.eos_token_ids = {*id};
  if (auto id = f.find_int("tokenizer.ggml.padding_token_id")) c.pad_token_id = *id;
  try {
    c.validate(src);  // also checks the BOS/EOS/PAD ids against the vocabulary
  } catch (const Error& e) {
    // validate() names config.json's fields: name the metadata keys they were read from instead.
    std::string m = e.what();
    const std::pair<std::string, std::string> keys[] = {
        {"layer_types has sliding_attention layers but sliding_window is 0",
         p + "attention.sliding_window is 0, and five layers in six are sliding"},
        {"'hidden_size'", "'" + p + "embedding_length'"},
        {"'intermediate_size'", "'" + p + "feed_forward_length'"},
        {"'num_attention_heads'", "'" + p + "attention.head_count'"},
        {"'num_key_value_heads'", "'" + p + "attention.head_count_kv'"},
        {"'head_dim'", "'" + p + "attention.key_length'"},
        {"'max_position_embeddings'", "'" + p + "context_length'"},
        {": rms_norm_eps must", ": " + p + "attention.layer_norm_rms_epsilon must"},
        {": rope_theta must", ": " + p + "rope.freq_base must"},
        {"sliding_window must be", p + "attention.sliding_window must be"}};
    for (const auto& [field, key] : keys) m = replace_all(m, field, key);
    throw Error(m);
  }
  return c;
}

bool gguf_checkpoint(const std::string& path, std::string* file) {
  return !file_exists(path + "/config.json") && find_gguf(path, file);
}

ModelConfig ModelConfig::from_path(const std::string& path) {
  std::string gguf;
  if (gguf_checkpoint(path, &gguf)) return from_gguf(GgufFile(gguf));
  return from_dir(path);
}

GgufWeights::GgufWeights(const GgufFile& file, const ModelConfig& config)
    : file_(file),
      heads_(config.num_attention_heads),
      kv_heads_(config.num_key_value_heads),
      unpermute_qk_(config.model_type == "llama"),
      norm_shift_(config.model_type == "gemma3_text") {
  // Only llama.cpp's converter for LlamaForCausalLM permutes q/k rows (Qwen's and Gemma's do not).
  auto add = [&](const auto& names) {
    for (const auto& [g, h] : names) {
      if (std::string(g).find("{N}") == std::string::npos) {
        to_gguf_[h] = g;
        continue;
      }
      for (int64_t n = 0; n < config.num_hidden_layers; ++n)
        to_gguf_[replace_block(h, std::to_string(n))] = replace_block(g, std::to_string(n));
    }
  };
  add(kCommonNames);
  if (norm_shift_)
    add(kGemma3Names);
  else
    add(kLlamaNames);
}

const GgufTensorInfo& GgufWeights::info(const std::string& name) const {
  auto it = to_gguf_.find(name);
  SPECDEC_CHECK(it != to_gguf_.end(), file_.path(), ": checkpoint has no tensor for '", name, "'");
  SPECDEC_CHECK(file_.tensors().count(it->second), file_.path(), ": missing tensor '", it->second,
                "' (", name, ")");
  return file_.tensors().at(it->second);
}

const GgufTensorInfo& GgufWeights::checked(const std::string& name,
                                           const std::vector<int64_t>& expected_shape) const {
  const GgufTensorInfo& t = info(name);
  check_shape(file_.path(), t.name, t.shape, expected_shape, "the GGUF metadata");
  return t;
}

at::Tensor GgufWeights::unpermute(const GgufTensorInfo& t, at::Tensor x) const {
  const bool q = t.name.find(".attn_q.") != std::string::npos,
             k = t.name.find(".attn_k.") != std::string::npos;
  if (!unpermute_qk_ || !(q || k)) return x;
  const int64_t heads = q ? heads_ : kv_heads_;
  const int64_t d = x.size(0) / heads;
  SPECDEC_CHECK(x.size(0) % heads == 0 && d % 2 == 0, file_.path(), ": tensor '", t.name, "' has ",
                x.size(0), " rows, not a whole number of heads of even size");
  std::vector<int64_t> split = {heads, d / 2, 2};
  for (int64_t i = 1; i < x.dim(); ++i) split.push_back(x.size(i));
  return x.view(split).transpose(1, 2).reshape(x.sizes()).contiguous();
}

at::Tensor GgufWeights::load(const std::string& name, at::ScalarType dtype, c10::Device device,
                             const std::vector<int64_t>& expected_shape) const {
  const GgufTensorInfo& t = checked(name, expected_shape);
  // Gemma's norm weights as Hugging Face holds them: its GGUF loader subtracts the 1 in float32,
  // then casts to the dtype.
  const bool shift =
      norm_shift_ && name.size() > 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0;
  at::Tensor x = unpermute(t, file_.load(t.name, shift ? at::kFloat : dtype,
                                         c10::Device(c10::kCPU)));  // [rows, ...]
  if (shift) x = (x - 1.0).to(dtype);
  return device.is_cpu() ? x : x.to(device);
}

bool GgufWeights::load_blocks(const std::string& name, const std::vector<int64_t>& expected_shape,
                              at::Tensor* bytes, GgmlType* type) const {
  const GgufTensorInfo& t = checked(name, expected_shape);
  if (t.type == GgmlType::kF32 || t.type == GgmlType::kF16 || t.type == GgmlType::kBF16 ||
      t.shape.size() != 2)
    return false;
  const int64_t rows = t.shape[0], row_bytes = static_cast<int64_t>(t.bytes) / rows;
  at::Tensor b = at::empty({rows, row_bytes}, at::kByte);
  file_.read(t, b.data_ptr<uint8_t>());
  *bytes = unpermute(t, b);
  *type = t.type;
  return true;
}

std::vector<std::string> GgufWeights::names() const {
  std::vector<std::string> n;
  for (const auto& kv : to_gguf_)
    if (file_.tensors().count(kv.second)) n.push_back(kv.first);
  return n;
}

at::ScalarType GgufWeights::stored_dtype(const std::string& name) const {
  return ggml_dtype(info(name).type);
}

}  // namespace specdec
