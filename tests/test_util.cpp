#include "test_util.hpp"

#include "util.hpp"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

namespace specdec::test {

namespace {
void mkdirs(const std::string& path) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    ::mkdir(cur.c_str(), 0755);
  }
}

// The directories this process made. A run that passed removes them as it ends (models written by
// make-draft and the fixtures reach gigabytes over a suite, and CI runs four builds on one disk); a
// failed run keeps them to look at.
std::mutex temp_dirs_mutex;
std::vector<std::string> temp_dirs;

class RemoveTempDirsWhenPassed : public ::testing::Environment {
 public:
  void TearDown() override {
    if (!::testing::UnitTest::GetInstance()->Passed()) return;
    std::lock_guard<std::mutex> lock(temp_dirs_mutex);
    for (const auto& dir : temp_dirs) {
      try {
        remove_tree(dir);
      } catch (const Error& e) {
        std::fprintf(stderr, "test_util: %s\n", e.what());
      }
    }
    temp_dirs.clear();
  }
};
const auto* const remove_temp_dirs =
    ::testing::AddGlobalTestEnvironment(new RemoveTempDirsWhenPassed);
}  // namespace

std::string temp_dir(const std::string& name) {
  static std::atomic<int> counter{0};
  const std::string dir = std::string(SPECDEC_TEST_TMP) + "/" + std::to_string(::getpid()) + "_" +
                          std::to_string(counter++) + "_" + name;
  remove_tree(dir);
  mkdirs(dir);
  std::lock_guard<std::mutex> lock(temp_dirs_mutex);
  temp_dirs.push_back(dir);
  return dir;
}

c10::Device test_device() {
  const char* env = std::getenv("SPECDEC_TEST_DEVICE");
  return parse_device(env && *env ? env : "cpu");
}

LoadOptions test_load_options() {
  LoadOptions o;
  o.device = test_device();
  return o;
}

std::string cached_fixture(const std::string& key, const FixtureOptions& options) {
  static std::mutex m;
  static std::map<std::string, std::string> dirs;
  std::lock_guard<std::mutex> lock(m);
  auto it = dirs.find(key);
  if (it != dirs.end()) return it->second;
  const std::string dir = temp_dir(key);
  make_fixture(dir, options);
  dirs[key] = dir;
  return dir;
}

namespace {
std::shared_ptr<const Model> cached_model_on(const std::string& dir, const LoadOptions& options) {
  static std::mutex m;
  static std::map<std::string, std::shared_ptr<const Model>> models;
  std::lock_guard<std::mutex> lock(m);
  auto& slot = models[options.device.str() + "|" + dir];
  if (!slot) slot = load_model(dir, options);
  return slot;
}
}  // namespace

std::shared_ptr<const Model> cached_model(const std::string& dir) {
  return cached_model_on(dir, {});
}
std::shared_ptr<const Model> test_model(const std::string& dir) {
  return cached_model_on(dir, test_load_options());
}

std::string test_data(const std::string& rel) { return std::string(SPECDEC_TEST_DATA) + "/" + rel; }

std::string fixtures_dir() {
  const char* env = std::getenv("SPECDEC_FIXTURES");
  const std::string dir = env ? std::string(env) : std::string(SPECDEC_SHARED_DIR) + "/fixtures";
  struct stat st {};
  return (::stat((dir + "/hf").c_str(), &st) == 0) ? dir : "";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_file(path)); }

std::vector<int64_t> oracle_greedy(const Model& model, const std::vector<int64_t>& prompt,
                                   int64_t max_new_tokens, const std::vector<int64_t>& eos,
                                   int64_t min_new_tokens) {
  c10::InferenceMode guard;
  const bool enc_dec = model.config().is_encoder_decoder;
  // Encoder-decoder: the prompt is re-encoded every step too, and the decoder starts from its
  // start token.
  std::vector<int64_t> seq =
      enc_dec ? std::vector<int64_t>{*model.config().decoder_start_token_id} : prompt;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    KVCache cache = model.make_cache(static_cast<int64_t>(seq.size()));
    if (enc_dec)
      model.attach_encoder(model.encode(at::tensor(prompt, at::kLong).view({1, -1})), cache);
    const at::Tensor logits = model.forward(at::tensor(seq, at::kLong).view({1, -1}), cache, 1);
    at::Tensor last = logits[0][0].clone();
    if (i < min_new_tokens)
      for (const int64_t e : eos) last[e] = -std::numeric_limits<float>::infinity();
    const int64_t tok = last.argmax().item<int64_t>();
    seq.push_back(tok);
    out.push_back(tok);
    if (std::find(eos.begin(), eos.end(), tok) != eos.end()) break;
  }
  return out;
}

std::string smollm2_path() {
  const std::string path =
      std::string(SPECDEC_MODELS_DIR) + "/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
  return file_exists(path) ? path : "";
}

std::string gemma3_path() {
  const std::string path = std::string(SPECDEC_MODELS_DIR) + "/gemma3/gemma-3-270m-q4_k_m.gguf";
  return file_exists(path) ? path : "";
}

namespace {
KVCache prepared_cache(const Model& m, int64_t capacity) {
  KVCache cache = m.make_cache(capacity);
  if (m.config().is_encoder_decoder) {
    const at::Tensor src = at::arange(3, 19, at::kLong).unsqueeze(0);  // [1, 16] encoder input
    m.attach_encoder(m.encode(src), cache);
  }
  return cache;
}
}  // namespace

ThreeWays logits_three_ways(const Model& m, const at::Tensor& ids, int64_t n) {
  c10::InferenceMode guard;
  const int64_t len = ids.size(1), ctx = len - n;
  const at::Tensor prefix = ids.narrow(1, 0, ctx), next = ids.narrow(1, ctx, n);
  KVCache a = prepared_cache(m, len), b = prepared_cache(m, len), c = prepared_cache(m, len);
  m.forward(prefix, a);
  ThreeWays out;
  out.verify = m.forward(next, a)[0];  // [n, V]
  // The decode steps follow a pass that only fills the cache (Model::kCacheOnly: no logits).
  if (m.forward(prefix, b, Model::kCacheOnly).defined())
    throw std::runtime_error("forward(kCacheOnly) returned logits");
  std::vector<at::Tensor> steps;
  for (int64_t i = 0; i < n; ++i) steps.push_back(m.forward(next.narrow(1, i, 1), b)[0]);
  out.decode = at::cat(steps);            // [n, V]
  out.prefill = m.forward(ids, c, n)[0];  // [n, V]: the last rows of one pass
  return out;
}

SuffixOptions branching_suffix_trees() {
  SuffixOptions o;
  o.tree = true;
  o.min_token_prob = 0.02;
  o.max_spec_factor = 4;
  return o;
}

FixtureOptions small_fixture(uint64_t seed, int64_t layers, const std::string& arch) {
  FixtureOptions o;
  o.arch = arch;
  o.seed = seed;
  o.layers = layers;
  o.hidden = 64;
  o.heads = 4;
  o.kv_heads =
      arch == "llama" || arch == "mistral" || arch == "qwen2" || arch == "qwen3" || arch == "gemma3"
          ? 2
          : 0;
  o.intermediate = 128;
  o.vocab = 96;
  o.init_std = 0.1;
  o.exit_layers = 1;
  o.exit_scale = 0.2;
  return o;
}

void expect_error(const MakeDraftOptions& o, const std::string& needle) {
  const bool existed = path_exists(o.out);
  try {
    make_draft(o);
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  if (!existed) EXPECT_FALSE(path_exists(o.out)) << "a failed run left " << o.out;
}

}  // namespace specdec::test
