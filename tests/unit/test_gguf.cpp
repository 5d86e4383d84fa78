// GGUF files: the reader on good and bad bytes, and a generated Llama written as GGUF (q/k rows
// permuted as llama.cpp's converter does) giving bitwise the logits of its safetensors original;
// the loader's memory and errors; a SentencePiece vocabulary rebuilt from GGUF metadata. (The
// block formats' dequantizers and quantizers: test_gguf_blocks.cpp.)
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "specdec/specdec.hpp"
#include "test_util.hpp"

using namespace specdec;
using namespace specdec::test;

namespace {

// A GGUF file built byte by byte (little-endian, version 3 unless told otherwise).
struct GgufWriter {
  std::string kv;
  uint64_t n_kv = 0;
  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::string data;
  };
  std::vector<Tensor> tensors;

  template <typename T>
  static void put(std::string& s, T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  static void put_str(std::string& s, const std::string& v) {
    put<uint64_t>(s, v.size());
    s += v;
  }
  void key(const std::string& k, uint32_t type) {
    put_str(kv, k);
    put<uint32_t>(kv, type);
    ++n_kv;
  }
  void u32(const std::string& k, uint32_t v) { key(k, 4), put(kv, v); }
  void f32(const std::string& k, float v) { key(k, 6), put(kv, v); }
  void boolean(const std::string& k, bool v) { key(k, 7), put<uint8_t>(kv, v); }
  void str(const std::string& k, const std::string& v) { key(k, 8), put_str(kv, v); }
  void strs(const std::string& k, const std::vector<std::string>& v) {
    key(k, 9);
    put<uint32_t>(kv, 8);
    put<uint64_t>(kv, v.size());
    for (const auto& x : v) put_str(kv, x);
  }
  void f32s(const std::string& k, const std::vector<float>& v) {
    key(k, 9);
    put<uint32_t>(kv, 6);
    put<uint64_t>(kv, v.size());
    for (float x : v) put(kv, x);
  }
  void i32s(const std::string& k, const std::vector<int32_t>& v) {
    key(k, 9);
    put<uint32_t>(kv, 5);
    put<uint64_t>(kv, v.size());
    for (int32_t x : v) put(kv, x);
  }
  // `shape` in PyTorch order; float32 data.
  void f32_tensor(const std::string& name, const at::Tensor& t) {
    const at::Tensor c = t.to(at::kFloat).contiguous();
    std::vector<uint64_t> ne(c.sizes().rbegin(), c.sizes().rend());
    tensors.push_back(
        {name, ne, 0, std::string(static_cast<const char*>(c.data_ptr()), c.numel() * 4)});
  }
  std::string bytes(uint32_t version = 3, uint64_t alignment = 32) const {
    std::string s;
    put<uint32_t>(s, 0x46554747);
    put<uint32_t>(s, version);
    put<uint64_t>(s, tensors.size());
    put<uint64_t>(s, n_kv);
    s += kv;
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const Tensor& t : tensors) {
      put_str(s, t.name);
      put<uint32_t>(s, t.ne.size());
      for (uint64_t d : t.ne) put(s, d);
      put<uint32_t>(s, t.type);
      put<uint64_t>(s, offset);
      offsets.push_back(offset);
      offset += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    s.append((alignment - s.size() % alignment) % alignment, '\0');
    for (size_t i = 0; i < tensors.size(); ++i) {
      s += tensors[i].data;
      s.append((alignment - tensors[i].data.size() % alignment) % alignment, '\0');
    }
    return s;
  }
};

std::string gguf_file(const std::string& name, const std::string& bytes) {
  static const std::string dir = temp_dir("gguf");
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

void expect_gguf_error(const std::string& name, const std::string& bytes,
                       const std::string& needle) {
  const std::string path = gguf_file(name, bytes);
  try {
    GgufFile f(path);
    ADD_FAILURE() << name << ": no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << name << ": " << what;
    EXPECT_EQ(what.rfind(path, 0), 0u) << "the message names the file: " << what;
  }
}

}  // namespace

// --- the reader ---

namespace {
GgufWriter small_file() {
  GgufWriter w;
  w.str("general.architecture", "llama");
  w.u32("some.u32", 7);
  w.f32("some.f32", 0.25f);
  w.boolean("some.bool", true);
  w.strs("some.strings", {"a", "bc", ""});
  w.i32s("some.ints", {-1, 2, 3});
  w.f32_tensor("t.weight", at::arange(64, at::kFloat).reshape({2, 32}));
  return w;
}
}  // namespace

TEST(GgufReader, MetadataAndTensors) {
  for (uint32_t version : {2u, 3u}) {
    const GgufFile f(gguf_file("good.gguf", small_file().bytes(version)));
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.get_string("general.architecture"), "llama");
    EXPECT_EQ(f.get_int("some.u32"), 7);
    EXPECT_EQ(f.get_float("some.f32"), 0.25);
    EXPECT_TRUE(f.get_bool("some.bool"));
    EXPECT_EQ(f.get_strings("some.strings"), (std::vector<std::string>{"a", "bc", ""}));
    EXPECT_EQ(f.get_ints("some.ints"), (std::vector<int64_t>{-1, 2, 3}));
    EXPECT_FALSE(f.find_int("missing"));
    EXPECT_THROW(f.get_int("general.architecture"), Error);
    const at::Tensor t = f.load("t.weight", at::kFloat, c10::Device(c10::kCPU));
    EXPECT_EQ(t.sizes().vec(), (std::vector<int64_t>{2, 32}));
    EXPECT_TRUE(at::equal(t, at::arange(64, at::kFloat).reshape({2, 32})));
  }
}

// Array elements stay in the file until asked for, but every one is checked when the file opens:
// a bad element is an error of the constructor, not of a later get_*.
TEST(GgufReader, ArraysAreReadOnDemandAndCheckedAtOpen) {
  GgufWriter w;
  w.str("general.architecture", "llama");
  w.f32s("some.floats", {0.5f, -2.0f});
  w.strs("vocab", {"<s>", "a much longer token than the short string buffer", "b"});
  w.i32s("types", {1, 2, 3});
  w.f32_tensor("t.weight", at::zeros({1, 32}));
  {
    const GgufFile f(gguf_file("arrays.gguf", w.bytes()));
    EXPECT_EQ(f.value("vocab").array_size, 3u);
    EXPECT_EQ(f.get_floats("some.floats"), (std::vector<double>{0.5, -2.0}));
    EXPECT_EQ(
        f.get_strings("vocab"),
        (std::vector<std::string>{"<s>", "a much longer token than the short string buffer", "b"}));
    EXPECT_EQ(f.get_ints("types"), (std::vector<int64_t>{1, 2, 3}));
    EXPECT_EQ(f.get_strings("vocab"), f.get_strings("vocab"));  // read again, same result
    EXPECT_THROW(f.get_strings("types"), Error);
    EXPECT_THROW(f.get_ints("vocab"), Error);
  }
  // One bad element in an array of each checked kind.
  auto one_array = [](uint32_t type, const std::string& elements, uint64_t n) {
    GgufWriter a;
    a.key("bad", 9);
    GgufWriter::put<uint32_t>(a.kv, type);
    GgufWriter::put<uint64_t>(a.kv, n);
    a.kv += elements;
    a.f32_tensor("t.weight", at::zeros({1, 32}));
    return a.bytes();
  };
  std::string bools;
  for (uint8_t b : {0, 1, 2}) GgufWriter::put<uint8_t>(bools, b);
  expect_gguf_error("bad_bool.gguf", one_array(7, bools, 3), "neither 0 nor 1");
  std::string u64s;
  GgufWriter::put<uint64_t>(u64s, 5);
  GgufWriter::put<uint64_t>(u64s, ~uint64_t{0});
  expect_gguf_error("bad_u64.gguf", one_array(10, u64s, 2), "too large");
  std::string strings;
  GgufWriter::put_str(strings, "ok");
  GgufWriter::put<uint64_t>(strings, uint64_t{1} << 40);  // a length past the end
  expect_gguf_error("bad_string.gguf", one_array(8, strings, 2), "string length");
}

// Each Limits field refuses a file that is otherwise fine, naming the limit; the defaults load it.
TEST(GgufReader, LimitsAreCheckedBeforeAllocating) {
  GgufWriter w = small_file();  // 6 keys (4 + 3 + 3 values), 1 tensor [2, 32]
  w.f32_tensor("u.weight", at::zeros({32}));
  const std::string path = gguf_file("limits.gguf", w.bytes());
  EXPECT_NO_THROW(GgufFile{path});
  const auto refused = [&](Limits l, const std::string& field) {
    const ScopedLimits scoped(l);
    try {
      GgufFile f(path);
      ADD_FAILURE() << field << ": loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("Limits::" + field), std::string::npos) << e.what();
    }
  };
  Limits l;
  l.max_metadata_values = 5;
  refused(l, "max_metadata_values");  // 6 keys
  {
    GgufWriter one_array;  // 1 key, 10 array elements
    one_array.i32s("ids", std::vector<int32_t>(10, 1));
    const std::string p = gguf_file("limits_array.gguf", one_array.bytes());
    l = {}, l.max_metadata_values = 9;
    const ScopedLimits scoped(l);
    try {
      GgufFile f(p);
      ADD_FAILURE() << "array: loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("Limits::max_metadata_values"), std::string::npos)
          << e.what();
    }
  }
  l = {}, l.max_header_bytes = 4;
  refused(l, "max_header_bytes");  // "llama" is 5 bytes
  l = {}, l.max_tensors = 1;
  refused(l, "max_tensors");
  l = {}, l.max_tensor_elements = 63;
  refused(l, "max_tensor_elements");
  l = {}, l.max_rank = 1;
  try {
    const ScopedLimits scoped(l);
    GgufFile f(path);
    ADD_FAILURE() << "max_rank: loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dimensions (expected 1 to 1)"), std::string::npos)
        << e.what();
  }
  l = {}, l.max_metadata_values = 12, l.max_header_bytes = 20, l.max_tensors = 2,
  l.max_tensor_elements = 64, l.max_rank = 2;
  const ScopedLimits exact(l);
  EXPECT_NO_THROW(GgufFile{path});
}

TEST(GgufReader, BadFilesAreErrorsNamingTheFieldOrTensor) {
  const std::string good = small_file().bytes();
  auto patched = [&](size_t at, const std::string& bytes) {
    std::string s = good;
    s.replace(at, bytes.size(), bytes);
    return s;
  };
  auto u64 = [](uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); };
  auto u32 = [](uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); };
  expect_gguf_error("short.gguf", good.substr(0, 10), "too short");
  expect_gguf_error("trunc.gguf", good.substr(0, 150), "truncated");
  expect_gguf_error("trunc_data.gguf", good.substr(0, good.size() - 16),
                    "runs past the end of the file");
  expect_gguf_error("magic.gguf", patched(0, "GGUX"), "magic");
  expect_gguf_error("v1.gguf", patched(4, u32(1)), "version 1");
  expect_gguf_error("ntensors.gguf", patched(8, u64(1ull << 62)), "tensor_count");
  expect_gguf_error("nkv.gguf", patched(16, u64(~0ull >> 1)), "metadata_kv_count");
  // The first key's length (offset 24): past the end.
  expect_gguf_error("strlen.gguf", patched(24, u64(1ull << 40)), "string length");
  // The first value's type (after the 20-byte key "general.architecture").
  expect_gguf_error("vtype.gguf", patched(24 + 8 + 20, u32(99)), "unknown value type");
  {  // A key of 2 MB of NUL bytes (a corrupt length): the message quotes 120 bytes of it, not all
    // (each message, each array element's too, copied the key, and each NUL was escaped in place).
    std::string s;
    GgufWriter::put<uint32_t>(s, 0x46554747);
    GgufWriter::put<uint32_t>(s, 3);
    GgufWriter::put<uint64_t>(s, 0);
    GgufWriter::put<uint64_t>(s, 1);
    GgufWriter::put_str(s, std::string(2000000, '\0'));
    GgufWriter::put<uint32_t>(s, 99);
    s.append(64, '\0');
    try {
      GgufFile f(gguf_file("nul_key.gguf", s));
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("... (2000000 bytes)' has unknown value type 99"), std::string::npos)
          << what;
      EXPECT_LT(what.size(), 1000u);
    }
  }
  // Tensor infos: build files with one bad field each.
  auto with_tensor = [&](const std::vector<uint64_t>& ne, uint32_t type, uint64_t offset,
                         bool twice = false, const std::string& name = "t",
                         const std::string& second = "") {
    GgufWriter w;
    w.str("general.architecture", "llama");
    std::string s;
    GgufWriter::put<uint32_t>(s, 0x46554747);
    GgufWriter::put<uint32_t>(s, 3);
    GgufWriter::put<uint64_t>(s, twice ? 2 : 1);
    GgufWriter::put<uint64_t>(s, 1);
    s += w.kv;
    for (int k = 0; k < (twice ? 2 : 1); ++k) {
      GgufWriter::put_str(s, k == 1 && !second.empty() ? second : name);
      GgufWriter::put<uint32_t>(s, ne.size());
      for (uint64_t d : ne) GgufWriter::put(s, d);
      GgufWriter::put<uint32_t>(s, type);
      GgufWriter::put<uint64_t>(s, offset + 32 * k * 4);
    }
    s.append((32 - s.size() % 32) % 32, '\0');
    s.append(4096, '\0');
    return s;
  };
  EXPECT_NO_THROW(GgufFile(gguf_file("ok.gguf", with_tensor({32}, 0, 0))));
  {  // 2^23 + 1 one-byte values: the file is only 8 MB, the parsed values would be ~1 GB
    std::string s;
    GgufWriter::put<uint32_t>(s, 0x46554747);
    GgufWriter::put<uint32_t>(s, 3);
    GgufWriter::put<uint64_t>(s, 0);
    GgufWriter::put<uint64_t>(s, 1);
    GgufWriter::put_str(s, "many");
    GgufWriter::put<uint32_t>(s, 9);
    GgufWriter::put<uint32_t>(s, 0);
    GgufWriter::put<uint64_t>(s, (uint64_t{1} << 23) + 1);
    s.append((size_t{1} << 23) + 1, '\x07');
    expect_gguf_error("many.gguf", s, "exceeds the limit of 8388608 metadata values");
  }  // the builder is well-formed
  expect_gguf_error("ttype.gguf", with_tensor({32}, 77, 0),
                    "is stored as type 77, a tensor type this build does not read");
  expect_gguf_error("overflow.gguf", with_tensor({1ull << 40, 1ull << 40}, 0, 0), "overflows");
  expect_gguf_error("align.gguf", with_tensor({32}, 0, 4), "alignment");
  expect_gguf_error("past.gguf", with_tensor({1 << 20}, 0, 0), "past the end");
  expect_gguf_error("blocks.gguf", with_tensor({33}, 8, 0), "blocks of 32");
  expect_gguf_error("dup.gguf", with_tensor({32}, 0, 0, true), "duplicate tensor name 't'");
  // 64 float32 values each, the second 128 bytes after the first: the error names both.
  expect_gguf_error("overlap.gguf", with_tensor({64}, 0, 0, true, "t", "u"),
                    "the data of tensors 't' [0, 256) and 'u' [128, 384) overlap");
  // A name with a NUL byte is shown whole, the NUL as \0 (what() would end at it).
  expect_gguf_error("nul.gguf", with_tensor({32}, 0, 0, true, std::string("a\0b", 3)),
                    "duplicate tensor name 'a\\0b'");
}

// --- a generated Llama as GGUF ---

namespace {
// llama.cpp's converter (convert_hf_to_gguf.py LlamaModel.permute): per head, rows [h * d/2 + i]
// go to row 2i + h.
at::Tensor llama_cpp_permute(const at::Tensor& w, int64_t heads) {
  return w.reshape({heads, 2, w.size(0) / heads / 2, w.size(1)}).transpose(1, 2).reshape(w.sizes());
}

// The llama.* metadata of configuration `c`.
void put_llama_metadata(GgufWriter& g, const ModelConfig& c) {
  g.str("general.architecture", "llama");
  g.u32("llama.context_length", c.max_position_embeddings);
  g.u32("llama.embedding_length", c.hidden_size);
  g.u32("llama.block_count", c.num_hidden_layers);
  g.u32("llama.feed_forward_length", c.intermediate_size);
  g.u32("llama.attention.head_count", c.num_attention_heads);
  g.u32("llama.attention.head_count_kv", c.num_key_value_heads);
  g.f32("llama.rope.freq_base", c.rope_theta);
  g.f32("llama.attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  g.u32("llama.vocab_size", c.vocab_size);
  g.u32("tokenizer.ggml.eos_token_id", c.eos_token_ids.at(0));
}

GgufWriter llama_as_gguf(const std::string& dir, bool with_head) {
  const ModelConfig c = ModelConfig::from_dir(dir);
  WeightStore w(dir);
  GgufWriter g;
  put_llama_metadata(g, c);
  const std::pair<const char*, const char*> names[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  const c10::Device cpu(c10::kCPU);
  g.f32_tensor("token_embd.weight", w.load("model.embed_tokens.weight", at::kFloat, cpu));
  g.f32_tensor("output_norm.weight", w.load("model.norm.weight", at::kFloat, cpu));
  if (with_head) g.f32_tensor("output.weight", w.load("lm_head.weight", at::kFloat, cpu));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    for (const auto& [hf, gg] : names) {
      at::Tensor t = w.load("model.layers." + std::to_string(i) + "." + hf, at::kFloat, cpu);
      if (std::string(gg) == "attn_q.weight") t = llama_cpp_permute(t, c.num_attention_heads);
      if (std::string(gg) == "attn_k.weight") t = llama_cpp_permute(t, c.num_key_value_heads);
      g.f32_tensor("blk." + std::to_string(i) + "." + gg, t);
    }
  return g;
}
}  // namespace

TEST(GgufModel, GeneratedLlamaGivesTheSafetensorsLogitsBitwise) {
  c10::InferenceMode guard;
  FixtureOptions o;
  o.hidden = 64, o.heads = 4, o.kv_heads = 2, o.layers = 2, o.vocab = 256, o.seed = 7;
  const std::string dir = temp_dir("gguf_llama");
  make_fixture(dir, o);
  const std::string path = gguf_file("llama.gguf", llama_as_gguf(dir, true).bytes());
  const auto a = load_model(dir), b = load_model(path);
  EXPECT_EQ(b->config().num_key_value_heads, 2);
  EXPECT_FALSE(b->config().tie_word_embeddings);
  const at::Tensor ids = at::tensor(std::vector<int64_t>{1, 5, 9, 200, 3, 17}).unsqueeze(0);
  KVCache ca = a->make_cache(16), cb = b->make_cache(16);
  EXPECT_TRUE(at::equal(a->forward(ids, ca), b->forward(ids, cb)));
  // Without output.weight the head is tied to the embeddings.
  const auto tied = load_model(gguf_file("tied.gguf", llama_as_gguf(dir, false).bytes()));
  EXPECT_TRUE(tied->config().tie_word_embeddings);
  // Without the un-permutation the logits would differ: the permutation is not the identity here.
  WeightStore w(dir);
  const at::Tensor q =
      w.load("model.layers.0.self_attn.q_proj.weight", at::kFloat, c10::Device(c10::kCPU));
  EXPECT_FALSE(at::equal(q, llama_cpp_permute(q, 4)));
}

namespace {
// A kB figure of /proc/self/status ("VmRSS", "VmHWM").
int64_t status_kb(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1));
  ADD_FAILURE() << "no " << key << " in /proc/self/status";
  return 0;
}

// A 4-layer Llama (hidden 512, vocabulary 32768, untied head) with random weights, its matrices
// as `type` (F16 or Q8_0); `weight_bytes` gets the bytes of all its tensors.
std::string random_llama_gguf(const std::string& name, GgmlType type, int64_t* weight_bytes) {
  const int64_t h = 512, inter = 1536, vocab = 32768, layers = 4;
  ModelConfig c;
  c.max_position_embeddings = 256, c.hidden_size = h, c.num_hidden_layers = layers;
  c.intermediate_size = inter, c.num_attention_heads = 8, c.num_key_value_heads = 4;
  c.rms_norm_eps = 1e-6, c.vocab_size = vocab, c.eos_token_ids = {2};
  GgufWriter g;
  put_llama_metadata(g, c);
  *weight_bytes = 0;
  auto add = [&](const std::string& tensor, int64_t n, int64_t k, bool matrix) {
    const at::Tensor x = at::randn({n, k}) * 0.05;
    std::string data;
    if (!matrix) {
      g.f32_tensor(tensor, x.view({k}));
    } else if (type == GgmlType::kF16) {
      const at::Tensor f = x.to(at::kHalf).contiguous();
      data.assign(static_cast<const char*>(f.data_ptr()), f.numel() * 2);
    } else {
      data.resize(static_cast<size_t>(n * k / 32 * ggml_block_bytes(type)));
      ggml_quantize(type, x.contiguous().data_ptr<float>(), reinterpret_cast<uint8_t*>(data.data()),
                    n * k);
    }
    if (matrix)
      g.tensors.push_back({tensor,
                           {static_cast<uint64_t>(k), static_cast<uint64_t>(n)},
                           static_cast<uint32_t>(type),
                           data});
    *weight_bytes += static_cast<int64_t>(matrix ? data.size() : k * 4);
  };
  add("token_embd.weight", vocab, h, true);
  add("output.weight", vocab, h, true);
  add("output_norm.weight", 1, h, false);
  for (int64_t i = 0; i < layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    add(b + "attn_norm.weight", 1, h, false);
    add(b + "ffn_norm.weight", 1, h, false);
    add(b + "attn_q.weight", h, h, true);
    add(b + "attn_k.weight", h / 2, h, true);
    add(b + "attn_v.weight", h / 2, h, true);
    add(b + "attn_output.weight", h, h, true);
    add(b + "ffn_gate.weight", inter, h, true);
    add(b + "ffn_up.weight", inter, h, true);
    add(b + "ffn_down.weight", h, inter, true);
  }
  return gguf_file(name, g.bytes());
}
}  // namespace

// Issue 13's memory goal, measured on the loader alone: loading a GGUF never holds more than one
// copy of a tensor (no float32 copy of a 16-bit tensor, no mapped pages beside their copy, no
// freed buffers kept as holes in the heap): the process's peak resident memory grows by at most
// 1.15x the weights' bytes. (Peak = VmHWM, reset through /proc/self/clear_refs; left out of the
// sanitizer job, whose allocator keeps freed memory in quarantine.)
TEST(GgufModel, LoadingHoldsOneCopyOfTheWeights) {
  for (const GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0})
    for (const bool int8 : {false, true}) {
      if (type == GgmlType::kF16 && int8) continue;
      int64_t bytes = 0;
      const std::string path = random_llama_gguf("memory.gguf", type, &bytes);
      LoadOptions o;
      o.int8_activations = int8;
      load_model(path,
                 o);     // once first: libtorch's own start-up (thread pools) is not the loader's
      ::malloc_trim(0);  // ... nor the heap that load left behind
      const int64_t before = status_kb("VmRSS");
      std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS
      ASSERT_LE(status_kb("VmHWM"), before + 1024) << "the peak was not reset";
      const auto model = load_model(path, o);
      const double grown = static_cast<double>(status_kb("VmHWM") - before) * 1024;
      std::printf("%s%s: the peak grew by %.1f MiB for %.1f MiB of weights\n",
                  ggml_type_name(static_cast<uint32_t>(type)).c_str(), int8 ? " int8" : "",
                  grown / 1048576, static_cast<double>(bytes) / 1048576);
      EXPECT_LE(grown, 1.15 * static_cast<double>(bytes))
          << ggml_type_name(static_cast<uint32_t>(type)) << (int8 ? " int8" : "")
          << ": peak grew by " << grown / 1048576 << " MiB for "
          << static_cast<double>(bytes) / 1048576 << " MiB of weights";
    }
}

TEST(GgufModel, MissingTensorAndUnsupportedArchitecture) {
  FixtureOptions o;
  o.hidden = 32, o.heads = 2, o.layers = 1, o.vocab = 64;
  const std::string dir = temp_dir("gguf_llama_small");
  make_fixture(dir, o);
  GgufWriter g = llama_as_gguf(dir, true);
  g.tensors.erase(g.tensors.begin() + 3);  // blk.0.attn_norm.weight
  try {
    load_model(gguf_file("missing.gguf", g.bytes()));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor 'blk.0.attn_norm.weight'"),
              std::string::npos)
        << e.what();
  }
  // A layer past block_count (a header that undercounts them) is an error, not a smaller model.
  GgufWriter extra = llama_as_gguf(dir, true);
  GgufWriter::Tensor copy = extra.tensors[3];
  copy.name = "blk.1.attn_norm.weight";
  extra.tensors.push_back(copy);
  try {
    load_model(gguf_file("extra_layer.gguf", extra.bytes()));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'blk.1.attn_norm.weight' belongs to layer 1, "
                                         "but its block_count is 1"),
              std::string::npos)
        << e.what();
  }
  // The same in a Hugging Face folder whose config.json undercounts them.
  FixtureOptions two = o;
  two.layers = 2;
  const std::string hf = temp_dir("hf_llama_two_layers");
  make_fixture(hf, two);
  std::string config = read_file(hf + "/config.json");
  const size_t at = config.find("\"num_hidden_layers\": 2");
  ASSERT_NE(at, std::string::npos) << config;
  config.replace(at, 22, "\"num_hidden_layers\": 1");
  std::ofstream(hf + "/config.json") << config;
  try {
    load_model(hf);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("belongs to layer 1, but config.json's num_hidden_layers is 1"),
        std::string::npos)
        << e.what();
  }
  GgufWriter bad;
  bad.str("general.architecture", "mamba");
  try {
    load_model(gguf_file("mamba.gguf", bad.bytes()));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "unsupported GGUF architecture 'mamba' (supported: llama, qwen2, qwen3, gemma3)"),
              std::string::npos)
        << e.what();
  }
}

// --- tokenizer.ggml.model "llama": a SentencePiece model rebuilt from GGUF metadata ---

namespace {
// The pieces of a serialized SentencePiece ModelProto (field 1: piece 1, score 2, type 3), read
// with a minimal protobuf reader, independent of the library's writer.
struct Piece {
  std::string text;
  float score = 0;
  int type = 1;
};
uint64_t varint(const std::string& s, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const uint8_t b = static_cast<uint8_t>(s.at(i++));
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
}
std::vector<Piece> proto_pieces(const std::string& model) {
  std::vector<Piece> out;
  for (size_t i = 0; i < model.size();) {
    const uint64_t key = varint(model, i);
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (wire == 0) {
      varint(model, i);
      continue;
    }
    if (wire == 5) {
      i += 4;
      continue;
    }
    if (wire == 1) {
      i += 8;
      continue;
    }
    const size_t len = varint(model, i);
    const std::string body = model.substr(i, len);
    i += len;
    if (field != 1) continue;
    Piece p;
    for (size_t j = 0; j < body.size();) {
      const uint64_t k = varint(body, j);
      if ((k >> 3) == 1) {
        const size_t n = varint(body, j);
        p.text = body.substr(j, n);
        j += n;
      } else if ((k >> 3) == 2) {
        std::memcpy(&p.score, body.data() + j, 4);
        j += 4;
      } else {
        p.type = static_cast<int>(varint(body, j));
      }
    }
    out.push_back(p);
  }
  return out;
}
}  // namespace

namespace {
// A small Gemma 3 file's metadata, without a vocabulary.
GgufWriter gemma3_metadata() {
  GgufWriter g;
  g.str("general.architecture", "gemma3");
  g.u32("gemma3.embedding_length", 64);
  g.u32("gemma3.feed_forward_length", 128);
  g.u32("gemma3.block_count", 2);
  g.u32("gemma3.attention.head_count", 4);
  g.f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6f);
  return g;
}
}  // namespace

// The vocabulary's size comes from tokenizer.ggml.tokens (real Gemma 3 files carry no
// gemma3.vocab_size): a file with neither says so, not that gemma3.vocab_size is missing.
TEST(GgufConfig, AFileWithoutAVocabularySaysSo) {
  GgufWriter g = gemma3_metadata();
  try {
    ModelConfig::from_gguf(GgufFile(gguf_file("no_vocab.gguf", g.bytes())));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "no vocabulary: neither tokenizer.ggml.tokens nor gemma3.vocab_size is present"),
              std::string::npos)
        << e.what();
  }
}

// A config error in a GGUF names the metadata key, not the config.json field it stands for.
TEST(GgufConfig, ErrorsNameTheMetadataKeys) {
  const auto error_of = [](const char* key, uint32_t value) {
    GgufWriter g = gemma3_metadata();
    g.u32("gemma3.vocab_size", 32);
    for (const char* k : {"gemma3.attention.key_length", "gemma3.attention.value_length",
                          "gemma3.context_length", "gemma3.attention.sliding_window"})
      g.u32(k, std::string(k) == key ? value : 16);
    try {
      ModelConfig::from_gguf(GgufFile(gguf_file("bad_key.gguf", g.bytes())));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("gemma3.attention.key_length", 0)
                .find("field 'gemma3.attention.key_length' is missing (or 0)"),
            std::string::npos)
      << error_of("gemma3.attention.key_length", 0);
  // Values of another size than the keys (no supported architecture has them) are refused.
  EXPECT_NE(error_of("gemma3.attention.value_length", 8)
                .find("gemma3.attention.value_length 8 differs from the key size 16"),
            std::string::npos)
      << error_of("gemma3.attention.value_length", 8);
  EXPECT_EQ(error_of("gemma3.attention.value_length", 16).find("value_length"), std::string::npos);
  EXPECT_NE(error_of("gemma3.context_length", 0).find("field 'gemma3.context_length' is missing"),
            std::string::npos)
      << error_of("gemma3.context_length", 0);
  EXPECT_NE(error_of("gemma3.attention.sliding_window", 0)
                .find("gemma3.attention.sliding_window is 0, and five layers in six are sliding"),
            std::string::npos)
      << error_of("gemma3.attention.sliding_window", 0);
}

TEST(GgufTokenizer, SentencePieceVocabularyTokenizesLikeTheOriginalModel) {
  // A Llama-style model: BPE, byte fallback, identity normalizer, no whitespace squeezing.
  const std::string dir = temp_dir("gguf_spm");
  std::string corpus;
  const char* lines[] = {"the quick brown fox jumps over the lazy dog",
                         "speculative decoding drafts tokens",
                         "the target verifies them in one pass", "café naïve Привет мир 12345"};
  for (int k = 0; k < 300; ++k)
    corpus += std::string(lines[k % 4]) + (k % 7 ? " fast" : " slow") + "\n";
  write_file(dir + "/corpus.txt", corpus);
  train_sentencepiece(
      "--input=" + dir + "/corpus.txt --model_prefix=" + dir +
      "/tokenizer --vocab_size=400 --model_type=bpe --byte_fallback=true --character_coverage=1.0 "
      "--normalization_rule_name=identity --remove_extra_whitespaces=false");
  const auto original = load_tokenizer(dir);
  const std::vector<Piece> pieces = proto_pieces(read_file(dir + "/tokenizer.model"));
  ASSERT_EQ(static_cast<int64_t>(pieces.size()), original->size());
  GgufWriter g;
  g.str("general.architecture", "llama");
  g.str("tokenizer.ggml.model", "llama");
  std::vector<std::string> texts;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (const Piece& p : pieces)
    texts.push_back(p.text), scores.push_back(p.score), types.push_back(p.type);
  g.strs("tokenizer.ggml.tokens", texts);
  g.f32s("tokenizer.ggml.scores", scores);
  g.i32s("tokenizer.ggml.token_type", types);
  g.u32("tokenizer.ggml.unknown_token_id", 0);
  g.u32("tokenizer.ggml.bos_token_id", 1);
  g.u32("tokenizer.ggml.eos_token_id", 2);
  const auto rebuilt = load_tokenizer(gguf_file("spm.gguf", g.bytes()));
  EXPECT_EQ(rebuilt->kind(), "sentencepiece");
  EXPECT_EQ(rebuilt->size(), original->size());
  EXPECT_EQ(rebuilt->bos_token_id(), 1);
  EXPECT_EQ(rebuilt->eos_token_id(), 2);
  for (const std::string text : {"the quick brown fox", "  two  spaces  ", "café Привет",
                                 "unseen: Zebra ✓ 42", "<s>the</s> fast", "line\nbreak", ""}) {
    for (bool special : {false, true}) {
      const auto ids = original->encode(text, special);
      EXPECT_EQ(rebuilt->encode(text, special), ids) << text;
      EXPECT_EQ(rebuilt->decode(ids, false), original->decode(ids, false)) << text;
      EXPECT_EQ(rebuilt->decode(ids, true), original->decode(ids, true)) << text;
    }
  }
  // An unknown tokenizer model is refused, naming it.
  GgufWriter bad;
  bad.str("tokenizer.ggml.model", "bert");
  try {
    load_tokenizer(gguf_file("bert.gguf", bad.bytes()));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.model 'bert' is not supported"),
              std::string::npos);
  }
}
