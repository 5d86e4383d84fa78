#include "specdec/model.hpp"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sched.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "gguf_model.hpp"
#include "linear.hpp"
#include "models/registry.hpp"
#include "prefill.hpp"
#include "specdec/error.hpp"
#include "specdec/limits.hpp"
#include "specdec/weights.hpp"
#include "torch_compat.hpp"
#include "util.hpp"

namespace specdec {

KVCache Model::make_cache(int64_t max_length, int64_t batch, bool keep_hidden) const {
  SPECDEC_CHECK(max_length >= 1 && max_length <= limits().max_sequence_length,
                "make_cache: max_length must be from 1 to ", limits().max_sequence_length,
                " (Limits::max_sequence_length), got ", max_length);
  SPECDEC_CHECK(batch >= 1, "make_cache: batch must be at least 1, got ", batch);
  const auto options = at::TensorOptions().dtype(dtype_).device(device_);
  try {
    KVCache cache(config_.num_hidden_layers, batch, config_.num_key_value_heads, max_length,
                  config_.head_dim, options);
    if (keep_hidden || config_.feature_size > 0) cache.keep_hidden(config_.hidden_size, options);
    return cache;
  } catch (const c10::Error& e) {  // the allocation failed
    throw Error(detail::concat("make_cache: a cache of ", batch, " x ", max_length,
                               " positions: ", e.what_without_backtrace()));
  }
}

void Model::check_pass(const at::Tensor& input_ids, const KVCache& cache, int64_t keep_last) const {
  SPECDEC_CHECK(input_ids.scalar_type() == at::kLong, "forward: input ids must be int64, got ",
                input_ids.scalar_type());
  SPECDEC_CHECK(keep_last >= kCacheOnly, "forward: keep_last must be 0 (all), positive or ",
                "kCacheOnly, got ", keep_last);
  SPECDEC_CHECK(cache.num_layers() == config_.num_hidden_layers, "forward: the cache has ",
                cache.num_layers(), " layers, the model ", config_.num_hidden_layers,
                " (make it with this model's make_cache)");
  const at::Tensor keys = cache.buffers(0).first;  // [batch, kv_heads, capacity, head_dim]
  SPECDEC_CHECK(keys.size(1) == config_.num_key_value_heads && keys.size(3) == config_.head_dim &&
                    keys.scalar_type() == dtype_ && keys.device() == device_,
                "forward: the cache holds ", keys.size(1), " heads of ", keys.size(3), " (",
                keys.scalar_type(), " on ", keys.device(), "), the model ",
                config_.num_key_value_heads, " of ", config_.head_dim, " (", dtype_, " on ",
                device_, "): make it with this model's make_cache");
}

at::Tensor Model::encode(const at::Tensor&) const {
  throw Error(config_.model_type + " is a decoder-only model: it has no encoder");
}

void Model::attach_encoder(const at::Tensor&, KVCache&, int64_t) const {
  throw Error(config_.model_type + " is a decoder-only model: it has no encoder");
}

bool Model::same_encoder(const Model&) const { return false; }

void set_num_threads(int n) {
  // More threads than kMaxThreadsPerCpu per logical CPU only spin against each other (100000
  // took libtorch over a minute to start); a count past it is a typo.
  const auto cpus = std::max<unsigned>(1, std::thread::hardware_concurrency());
  const auto most = static_cast<int64_t>(kMaxThreadsPerCpu) * cpus;
  SPECDEC_CHECK(n >= 1 && n <= most, "the thread count must be between 1 and ", most, " (",
                kMaxThreadsPerCpu, " per logical CPU; this machine has ", cpus, "), got ", n);
  at::set_num_threads(n);
  // OpenBLAS keeps its own pool (OPENBLAS_NUM_THREADS, else every core): found when loaded.
  using SetThreads = void (*)(int);
  if (auto* set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    set(n);
}

int default_num_threads() {
  // OpenMP's variable first, as libtorch reads it (a test runner, a container's setting).
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && n >= 1 && n <= 4096) return static_cast<int>(n);
  }
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
    return static_cast<int>(std::max<unsigned>(1, std::thread::hardware_concurrency()));
  std::set<std::pair<long, long>> cores;  // (package, core) of each allowed CPU
  int cpus = 0;
  bool topology = true;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    ++cpus;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    long package = -1, core = -1;
    std::ifstream(dir + "physical_package_id") >> package;
    std::ifstream(dir + "core_id") >> core;
    topology = topology && package >= 0 && core >= 0;
    cores.insert({package, core});
  }
  return std::max(1, topology ? static_cast<int>(cores.size()) : cpus);
}

c10::Device parse_device(const std::string& name) {
  c10::Device device(c10::kCPU);
  try {
    device = c10::Device(name);
  } catch (const std::exception&) {
    throw Error("unsupported device '" + name + "' (expected cpu, cuda or cuda:N)");
  }
  SPECDEC_CHECK(device.is_cpu() || device.is_cuda(), "unsupported device '", name,
                "' (expected cpu, cuda or cuda:N)");
  if (device.is_cuda()) {
    SPECDEC_CHECK(at::hasCUDA(), "device '", name,
                  "' requested but this libtorch build or machine has no CUDA");
    const auto count = static_cast<int64_t>(torch::cuda::device_count());
    SPECDEC_CHECK(device.index() < count, "device '", name, "' requested but this machine has ",
                  count, " CUDA device(s): use cuda:0 to cuda:", count - 1);
  }
  return device;
}

at::Tensor padded_ids(const std::vector<std::vector<int64_t>>& rows, std::vector<int64_t>& counts) {
  counts.clear();
  int64_t t = 1;
  for (const auto& row : rows) {
    counts.push_back(static_cast<int64_t>(row.size()));
    t = std::max(t, counts.back());
  }
  at::Tensor ids = at::zeros({static_cast<int64_t>(rows.size()), t}, at::kLong);
  int64_t* out = ids.data_ptr<int64_t>();
  for (size_t r = 0; r < rows.size(); ++r) std::copy(rows[r].begin(), rows[r].end(), out + r * t);
  return ids;
}

int64_t prefill_rows(const Model& model, KVCache& cache,
                     const std::vector<const std::vector<int64_t>*>& seqs, int64_t chunk,
                     const std::function<bool()>& stop) {
  const auto b = static_cast<int64_t>(seqs.size());
  std::vector<int64_t> todo(b);  // tokens each row still has to prefill
  for (int64_t r = 0; r < b; ++r) {
    todo[r] = std::max<int64_t>(0, static_cast<int64_t>(seqs[r]->size()) - 1 - cache.length(r));
    SPECDEC_CHECK(r == 0 || todo[r] <= todo[r - 1],
                  "prefill_rows: rows must be sorted longest first");
  }
  int64_t passes = 0;
  for (int64_t done = 0, step = 0; b > 0 && done < todo[0]; done += step, ++passes) {
    int64_t rows = 0;
    while (rows < b && todo[rows] > done) ++rows;
    step = rows == 1 ? std::max(chunk, kPrefillChunk) : chunk;
    std::vector<std::vector<int64_t>> pieces(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const auto first = seqs[r]->begin() + cache.length(r);
      pieces[r].assign(first, first + std::min(step, todo[r] - done));
    }
    std::vector<int64_t> counts;
    const at::Tensor ids = padded_ids(pieces, counts);
    (void)model.forward(ids, cache, Model::kCacheOnly, counts);
    if (stop && done + step < todo[0] && stop()) return passes + 1;
  }
  return passes;
}

int64_t prefill_into(const Model& model, KVCache& cache, const std::vector<int64_t>& slots,
                     const std::vector<const std::vector<int64_t>*>& seqs,
                     const std::vector<int64_t>& held) {
  SPECDEC_CHECK(slots.size() == seqs.size() && !model.config().is_encoder_decoder &&
                    (held.empty() || held.size() == seqs.size()),
                "prefill_into: one slot (and held count) per sequence, decoder-only models");
  if (seqs.empty()) return 0;
  const auto held_of = [&](size_t i) { return held.empty() ? 0 : held[i]; };
  std::vector<size_t> order(seqs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Longest rest first (prefill_rows' order).
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return static_cast<int64_t>(seqs[a]->size()) - held_of(a) >
           static_cast<int64_t>(seqs[b]->size()) - held_of(b);
  });
  std::vector<const std::vector<int64_t>*> sorted;
  int64_t longest = 1;
  for (const size_t i : order) {
    sorted.push_back(seqs[i]);
    longest = std::max(longest, static_cast<int64_t>(seqs[i]->size()));
  }
  KVCache scratch =
      model.make_cache(longest, static_cast<int64_t>(seqs.size()), cache.keeps_hidden());
  for (size_t r = 0; r < order.size(); ++r)  // the positions a row holds go in with it
    if (held_of(order[r]) > 0) {
      scratch.copy_row(cache, slots[order[r]], static_cast<int64_t>(r));
      scratch.crop(static_cast<int64_t>(r), held_of(order[r]));
    }
  const int64_t passes = prefill_rows(model, scratch, sorted);
  for (size_t r = 0; r < order.size(); ++r)
    cache.copy_row(scratch, static_cast<int64_t>(r), slots[order[r]]);
  return passes;
}

namespace {

std::shared_ptr<const Model> build(const ModelConfig& config, const WeightSource& weights,
                                   const LoadOptions& options) {
  // supported_model_types() lists exactly what from_json_text accepts.
  if (config.model_type == "gemma3_text") return models::make_gemma3(config, weights, options);
  if (config.model_type == "gpt_neox") return models::make_gpt_neox(config, weights, options);
  if (config.model_type == "gpt2") return models::make_gpt2(config, weights, options);
  if (config.model_type == "opt") return models::make_opt(config, weights, options);
  if (config.model_type == "t5") return models::make_t5(config, weights, options);
  return models::make_llama(config, weights, options);
}

// A tensor of a layer past the config's count: a header or config.json that undercounts the
// layers would otherwise load the first ones only, and generate from another model.
void check_layer_count(const std::vector<std::string>& names, int64_t layers,
                       const std::string& where, const char* count) {
  for (const std::string& name : names)
    if (const int64_t layer = decoder_layer_of(name); layer >= layers)
      throw Error(where + ": tensor '" + name + "' belongs to layer " + std::to_string(layer) +
                  ", but " + count + " is " + std::to_string(layers));
}

std::shared_ptr<const Model> load(const std::string& path, const LoadOptions& options) {
  check_load_options(options);
  std::string gguf;
  if (gguf_checkpoint(path, &gguf)) {
    // The mapping lives only while loading: the model keeps its own converted copy.
    const GgufFile file(gguf);
    const ModelConfig config = ModelConfig::from_gguf(file);
    std::vector<std::string> names;
    for (const auto& tensor : file.tensors()) names.push_back(tensor.first);
    check_layer_count(names, config.num_hidden_layers, gguf, "its block_count");
    return build(config, GgufWeights(file, config), options);
  }
  const ModelConfig config = ModelConfig::from_dir(path);
  const WeightStore weights(path);
  if (!config.is_encoder_decoder)  // T5 counts its decoder blocks apart
    check_layer_count(weights.names(), config.num_hidden_layers, path,
                      "config.json's num_hidden_layers");
  return build(config, weights, options);
}

}  // namespace

void check_load_options(const LoadOptions& options) {
  SPECDEC_CHECK(
      options.dtype == at::kFloat || options.dtype == at::kBFloat16 || options.dtype == at::kHalf,
      "load_model: unsupported compute dtype ", c10::toString(options.dtype),
      " (supported: float32, bfloat16, float16)");
  if (options.device.is_cuda())
    SPECDEC_CHECK(at::hasCUDA(), "load_model: CUDA requested but not available");
  SPECDEC_CHECK(compat::kCpuHalfMatmul || !(options.device.is_cpu() && options.dtype == at::kHalf),
                "load_model: float16 compute is not supported on the CPU by libtorch ",
                compat::kMajor, ".", compat::kMinor,
                " (use float32 or bfloat16 there, or float16 on cuda)");
  if (packed_compute(options) || options.weights == WeightFormat::kAsStored) return;
  const bool own_dtype =
      (options.weights == WeightFormat::kFloat32 && options.dtype == at::kFloat) ||
      (options.weights == WeightFormat::kBFloat16 && options.dtype == at::kBFloat16) ||
      (options.weights == WeightFormat::kFloat16 && options.dtype == at::kHalf);
  SPECDEC_CHECK(own_dtype, "weight format ", weight_format_name(options.weights),
                " needs float32 compute on the CPU (here: ", dtype_name(options.dtype), " on ",
                options.device.str(), "); use as-stored or the compute dtype");
}

std::shared_ptr<const Model> load_model(const std::string& path, const LoadOptions& options) {
  return torch_errors_as_specdec(("load_model(" + path + ")").c_str(),
                                 [&] { return load(path, options); });
}

}  // namespace specdec
