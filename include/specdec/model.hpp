// Model: a loaded language model, decoder-only or encoder-decoder (immutable weights, shareable
// across threads).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <string>
#include <vector>

#include "specdec/config.hpp"
#include "specdec/kv_cache.hpp"

namespace specdec {

// The shape of one row's tokens in a pass (Model::forward): parents[j] is the index, among the
// row's tokens of the pass, of token j's parent (below j), or -1 for a token that follows the
// row's cached positions directly. Token j takes position length + depth(j) (depth 0 for -1) and
// attends to the row's cached positions and to its ancestors only, so that on the CPU in float32
// its logits are bitwise those of the path to it run as a chain. A chain: parents[j] = j - 1.
using TokenTree = std::vector<int64_t>;

class Model {
 public:
  virtual ~Model() = default;

  const ModelConfig& config() const { return config_; }
  c10::Device device() const { return device_; }
  at::ScalarType dtype() const { return dtype_; }

  // A cache sized for `max_length` positions of each of `batch` sequences (the request owns it);
  // `keep_hidden`: it also keeps each position's last-layer hidden state (KVCache::keep_hidden), as
  // the target of a feature-fed draft must, and as a feature-fed draft's own cache does.
  KVCache make_cache(int64_t max_length, int64_t batch = 1, bool keep_hidden = false) const;

  // Runs a pass over `input_ids` ([B, T], int64, on any device; B <= cache.batch()): row b is
  // sequence b of `cache`, and its first n_b = row_tokens[b] tokens (all T when row_tokens is
  // empty) take positions [cache.length(b), cache.length(b) + n_b); the rest of the row is
  // padding (computed, never attended to, never kept). Rows of different lengths share the pass;
  // each row's logits are bitwise those it would get alone. Appends the real tokens' keys/values to
  // `cache` and returns float32 logits [B, T', V] for each row's last T' = min(T, keep_last) real
  // tokens (keep_last 0: all T positions; a row with fewer real tokens has copies of its first
  // one in front; kCacheOnly: no logits, an undefined tensor, for passes that only fill the cache).
  // `trees` (empty, or one per row; an empty one: a chain): row b's real tokens as a TokenTree,
  // n_b entries; they still go to the cache's next n_b slots in pass order (KVCache::keep_path
  // then keeps one path). Call it inside c10::InferenceMode, as the generator does: outside it
  // libtorch keeps autograd's version counters, and a cache made inside it cannot be written.
  // Encoder-decoder models: `input_ids` are decoder ids, and `cache` must hold the encoder output
  // (attach_encoder); they take chains only.
  static constexpr int64_t kCacheOnly = -1;
  virtual at::Tensor forward(const at::Tensor& input_ids, KVCache& cache, int64_t keep_last = 0,
                             const std::vector<int64_t>& row_tokens = {},
                             const std::vector<TokenTree>& trees = {}) const = 0;

  // --- encoder-decoder models (config().is_encoder_decoder); the others throw specdec::Error ---
  // Runs the encoder over `input_ids` ([B, S], int64): hidden states [B, S, H].
  virtual at::Tensor encode(const at::Tensor& input_ids) const;
  // Computes every decoder layer's cross-attention keys/values over one sequence's encoder output
  // (`encoder_states` [1, S, H], from encode() of this model or of one with the same_encoder())
  // once and stores them as row `row` of `cache` (KVCache::set_cross), which its decoder attends
  // to from then on; other rows may decode meanwhile.
  virtual void attach_encoder(const at::Tensor& encoder_states, KVCache& cache,
                              int64_t row = 0) const;
  // True when `other` has an identical encoder (configuration and weights), so that one encoder
  // pass serves both models. False for decoder-only models.
  virtual bool same_encoder(const Model& other) const;

 protected:
  // forward's checks of its arguments (ids int64, keep_last, a cache made by this model's
  // make_cache; layers::Pass checks the shapes); every model's forward runs them first.
  void check_pass(const at::Tensor& input_ids, const KVCache& cache, int64_t keep_last) const;
  Model(ModelConfig config, c10::Device device, at::ScalarType dtype)
      : config_(std::move(config)), device_(device), dtype_(dtype) {}

  ModelConfig config_;
  c10::Device device_;
  at::ScalarType dtype_;
};

// How the weight matrices of the linear layers (and the token embeddings) are held in memory.
// kAsStored keeps the checkpoint's format: a Q4_1 GGUF stays Q4_1, a bf16 safetensors stays bf16.
// The others convert at load: to a float format, or quantized to Q8_0 / Q4_0 / Q4_1 with ggml's
// reference quantizers (safetensors checkpoints too). Packed formats need float32 compute on the
// CPU; with another device or compute dtype, only kAsStored (dequantized into the compute dtype, as
// before) and the compute dtype's own format are accepted.
enum class WeightFormat { kAsStored, kFloat32, kBFloat16, kFloat16, kQ8_0, kQ4_0, kQ4_1 };
// "as-stored", "float32", "bfloat16", "float16", "q8_0", "q4_0", "q4_1"; throws specdec::Error
// otherwise.
WeightFormat parse_weight_format(const std::string& name);
std::string weight_format_name(WeightFormat format);
// Every format's name, in enum order.
std::vector<std::string> weight_format_names();

struct LoadOptions {
  c10::Device device = c10::Device(c10::kCPU);  // cpu or cuda[:N]
  at::ScalarType dtype = at::kFloat;            // compute dtype: float32, bfloat16, float16
  WeightFormat weights = WeightFormat::kAsStored;
  // Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K matrices multiply activations quantized per
  // row to 8-bit blocks (integer dot products, as llama.cpp does): faster, but the logits are no
  // longer those of the float32 model on the dequantized weights. Greedy speculation stays exact
  // (every row is still computed in one fixed order). Other formats ignore it.
  bool int8_activations = false;
};

// Throws specdec::Error for options load_model refuses whatever the checkpoint: a compute dtype
// other than float32, bfloat16 and float16, CUDA where there is none, float16 on the CPU with a
// libtorch that lacks it, a packed weight format beside another device or compute dtype.
void check_load_options(const LoadOptions& options);

// Loads a Hugging Face checkpoint folder (config.json, generation_config.json, model.safetensors or
// a sharded index), or a GGUF file (a `.gguf` path, or a folder without config.json holding one
// `.gguf`), with its weight matrices in `options.weights`' format. Throws specdec::Error naming the
// file and what is wrong.
std::shared_ptr<const Model> load_model(const std::string& path, const LoadOptions& options = {});

// Parses "cpu", "cuda", "cuda:1"; throws specdec::Error for anything else or when CUDA is absent.
c10::Device parse_device(const std::string& name);

// Sets how many CPU threads every pool the library computes with uses (1 <= n <= kMaxThreadsPerCpu
// x the logical CPUs, else specdec::Error; process-wide):
// libtorch's intra-op pool, which also runs specdec's own kernels, and OpenBLAS's pool when the
// process uses OpenBLAS (libtorch's BLAS products: bf16/f16 and device fallbacks). Concurrent
// requests share these pools: keep (requests running at once) x n <= cores.
void set_num_threads(int n);
constexpr int kMaxThreadsPerCpu = 4;
// OMP_NUM_THREADS where it is set (a number from 1 to 4096), else one per physical core this
// process may run on: the CPUs of its affinity mask, the hardware threads of one core counted once
// (Linux's sysfs topology; the CPUs where it cannot be read). libtorch's own default can be fewer
// (one on a 2-vCPU AMD EPYC); the specdec program sets this where --threads is 0.
int default_num_threads();

}  // namespace specdec
