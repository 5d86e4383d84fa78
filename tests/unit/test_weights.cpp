// safetensors reading and model loading on good and bad bytes.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "test_util.hpp"
#include "torch_compat.hpp"

namespace specdec::test {
namespace {

std::string file_with(const std::string& header, const std::string& data) {
  std::string out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + header + data;
}

void expect_load_error(const std::string& bytes, const std::string& needle) {
  const std::string path = temp_dir("st") + "/model.safetensors";
  write_file(path, bytes);
  try {
    SafetensorsFile f(path);
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << "error must name the file";
  }
}

TEST(Safetensors, RoundTripsAllDtypes) {
  const std::string path = temp_dir("rt") + "/model.safetensors";
  const at::Tensor a = at::arange(6, at::kFloat).view({2, 3});
  save_safetensors(path, {{"a", a}, {"b", a.to(at::kBFloat16)}, {"c", a.to(at::kHalf)}});
  SafetensorsFile f(path);
  for (const char* name : {"a", "b", "c"}) {
    const at::Tensor got = f.load(name, at::kFloat, c10::Device(c10::kCPU));
    EXPECT_TRUE(at::equal(got, a)) << name;
  }
  EXPECT_EQ(f.tensors().at("b").dtype, "BF16");
  EXPECT_TRUE(f.load("a", at::kBFloat16, c10::Device(c10::kCPU)).scalar_type() == at::kBFloat16);
}

TEST(Safetensors, RejectsBadFiles) {
  expect_load_error("", "truncated");
  expect_load_error("abc", "truncated");
  expect_load_error(file_with("{}", "").substr(0, 8) + "{", "header length");
  expect_load_error(file_with("{nope", ""), "invalid safetensors header JSON");
  expect_load_error(file_with(R"({"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}})", "x"),
                    "unsupported dtype 'I8'");
  expect_load_error(file_with(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "xxxx"),
                    "need 8");
  expect_load_error(file_with(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "xxxx"),
                    "outside the data section");
  expect_load_error(
      file_with(
          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
          "xxxxxxxx"),
      "overlap");
  expect_load_error(file_with(R"({"a":{"dtype":"F32","shape":[1]}})", "xxxx"),
                    "needs dtype, shape and data_offsets");
  expect_load_error(file_with(R"([1,2])", ""), "must be a JSON object");
  // Found by fuzzing (scripts/fuzz.sh safetensors): a huge number parsed as a float reached an
  // integer conversion (undefined behaviour); and dimensions whose product wraps around.
  expect_load_error(
      file_with(
          R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[155555555555555555555555555555555555555555556,2]}})",
          "xx"),
      "data_offsets must hold non-negative integers");
  expect_load_error(file_with(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "xxxx"),
                    "shape must hold non-negative integers");
  expect_load_error(
      file_with(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
                ""),
      "overflows");
}

TEST(Safetensors, MissingFileNamesIt) {
  EXPECT_THROW(SafetensorsFile("/nonexistent/x.safetensors"), Error);
}

FixtureOptions tiny() {
  FixtureOptions o;
  o.layers = 1;
  o.hidden = 16;
  o.heads = 2;
  o.vocab = 32;
  o.intermediate = 32;
  return o;
}

TEST(LoadModel, ShardedCheckpointMatchesSingleFile) {
  const std::string single = cached_fixture("tiny", tiny());
  const std::string dir = temp_dir("sharded");
  std::system(
      ("cp " + single + "/config.json " + single + "/generation_config.json " + dir).c_str());
  WeightStore w(single);
  std::map<std::string, at::Tensor> s1, s2;
  nlohmann::json map;
  size_t i = 0;
  for (const auto& name : w.names()) {
    const at::Tensor t = w.load(name, at::kFloat, c10::Device(c10::kCPU));
    ((i++ % 2) ? s1 : s2)[name] = t;
    map[name] = (i % 2) ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  save_safetensors(dir + "/model-00001-of-00002.safetensors", s2);
  save_safetensors(dir + "/model-00002-of-00002.safetensors", s1);
  write_file(dir + "/model.safetensors.index.json", nlohmann::json{{"weight_map", map}}.dump());
  GenerationConfig cfg;
  cfg.max_new_tokens = 8;
  EXPECT_EQ(Generator(load_model(dir)).generate({3, 4}, cfg).tokens,
            Generator(load_model(single)).generate({3, 4}, cfg).tokens);
  // Hugging Face loads every tensor of each shard the index names, whether the index lists it or
  // not: an index that leaves one out loads the same model.
  map.erase(map.begin());
  write_file(dir + "/model.safetensors.index.json", nlohmann::json{{"weight_map", map}}.dump());
  EXPECT_EQ(Generator(load_model(dir)).generate({3, 4}, cfg).tokens,
            Generator(load_model(single)).generate({3, 4}, cfg).tokens);
}

TEST(LoadModel, ComputeDtypesLoad) {
  const std::string dir = cached_fixture("tiny", tiny());
  for (auto dt : {at::kBFloat16, at::kHalf}) {
    LoadOptions o;
    if (dt == at::kHalf && !compat::kCpuHalfMatmul) {
      o.dtype = dt;
      EXPECT_THROW(load_model(dir, o), Error) << "float16 on CPU must be refused with libtorch 1.x";
      continue;
    }
    o.dtype = dt;
    const auto m = load_model(dir, o);
    EXPECT_EQ(m->dtype(), dt);
    // The low-precision logits are those of the float32 model up to that precision's rounding,
    // and really were computed in it (not bitwise the float32 ones).
    c10::InferenceMode guard;
    const auto f32 = load_model(dir);
    const at::Tensor ids = at::tensor(std::vector<int64_t>{1, 2, 5, 7}).unsqueeze(0);
    KVCache a = m->make_cache(4), b = f32->make_cache(4);
    const at::Tensor low = m->forward(ids, a), full = f32->forward(ids, b);  // [1, 4, V] float32
    const double scale = full.abs().max().item<double>();
    EXPECT_LT((low - full).abs().max().item<double>(), 0.05 * scale) << c10::toString(dt);
    EXPECT_FALSE(at::equal(low, full)) << c10::toString(dt);
  }
}

void expect_model_error(const std::string& dir, const std::string& needle) {
  try {
    load_model(dir);
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(LoadModel, MissingTensorWrongShapeAndMissingWeights) {
  const std::string good = cached_fixture("tiny", tiny());
  const std::string dir = temp_dir("bad_model");
  std::system(("cp " + good + "/config.json " + dir).c_str());
  expect_model_error(dir, "no model.safetensors");
  WeightStore w(good);
  std::map<std::string, at::Tensor> t;
  for (const auto& n : w.names()) t[n] = w.load(n, at::kFloat, c10::Device(c10::kCPU));
  auto missing = t;
  missing.erase("model.norm.weight");
  save_safetensors(dir + "/model.safetensors", missing);
  expect_model_error(dir, "no tensor named 'model.norm.weight'");
  auto wrong = t;
  wrong["model.norm.weight"] = at::ones({15});
  save_safetensors(dir + "/model.safetensors", wrong);
  expect_model_error(dir, "tensor 'model.norm.weight' has shape [15] but config.json implies [16]");
  expect_model_error("/nonexistent", "/nonexistent/config.json");
}

TEST(LoadModel, NothingHalfWrittenWhenSavingFails) {
  const std::string dir = temp_dir("readonly");
  const std::string path = dir + "/missing_folder/model.safetensors";
  EXPECT_THROW(save_safetensors(path, {{"a", at::ones({2})}}), Error);
  EXPECT_TRUE(read_file(path).empty());
}

}  // namespace
}  // namespace specdec::test
