// Micro benchmarks of the pieces of one iteration (Google Benchmark). Not tests: nothing asserted.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "linear.hpp"
#include "specdec/specdec.hpp"

namespace {

using specdec::GgmlType;

// BENCH_THREADS threads, 2 by default (as in the end-to-end figures).
void set_bench_threads() {
  at::set_num_threads(std::getenv("BENCH_THREADS") ? std::atoi(std::getenv("BENCH_THREADS")) : 2);
}

void BM_KVCacheCrop(benchmark::State& state) {
  specdec::KVCache c(16, 1, 8, 4096, 128, at::TensorOptions().dtype(at::kFloat));
  for (int64_t l = 0; l < 16; ++l)
    c.append(l, at::zeros({1, 8, 64, 128}), at::zeros({1, 8, 64, 128}));
  c.advance(64);
  for (auto _ : state) {
    c.crop(32);
    c.advance(32);  // refill the length without copying: crop is what is measured
    benchmark::DoNotOptimize(c.length());
  }
}
BENCHMARK(BM_KVCacheCrop);

// One verification of K candidates over a 32000-token vocabulary (q is ignored by the greedy one).
template <typename V>
void BM_Verify(benchmark::State& state) {
  c10::InferenceMode guard;
  const int64_t k = state.range(0);
  const at::Tensor scores = at::randn({k + 1, 32000});
  specdec::Candidates c;
  for (int64_t i = 0; i < k; ++i) c.tokens.push_back(i);
  c.q = at::randn({k, 32000}).softmax(-1);
  const V v;
  specdec::Rng rng(0);
  for (auto _ : state) benchmark::DoNotOptimize(v.verify(scores, c, rng));
}
BENCHMARK_TEMPLATE(BM_Verify, specdec::GreedyVerifier)->Arg(1)->Arg(5)->Arg(20);
BENCHMARK_TEMPLATE(BM_Verify, specdec::RejectionSamplingVerifier)->Arg(1)->Arg(5)->Arg(20);

// The greedy choice of R rows over a vocabulary of V (SmolLM2's 49152, Gemma 3's 262144):
// libtorch's argmax (state.range(2) 0) against specdec's (1).
void BM_Argmax(benchmark::State& state) {
  c10::InferenceMode guard;
  const at::Tensor scores = at::randn({state.range(0), state.range(1)});
  for (auto _ : state)
    benchmark::DoNotOptimize(state.range(2) ? specdec::kernels::argmax(scores) : scores.argmax(-1));
}
BENCHMARK(BM_Argmax)->ArgsProduct({{1, 4}, {49152, 262144}, {0, 1}});

void BM_TopPProcessor(benchmark::State& state) {
  c10::InferenceMode guard;
  const at::Tensor scores = at::randn({6, 32000});
  auto p = specdec::make_top_p(0.9);
  for (auto _ : state) benchmark::DoNotOptimize(p->apply(scores, {}));
}
BENCHMARK(BM_TopPProcessor);

// The last-level cache's size (Linux sysfs; 32 MiB where it cannot be read).
int64_t last_level_cache_bytes() {
  int64_t bytes = int64_t{32} << 20;
  for (int index = 0; index < 8; ++index) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    int64_t kib = 0;
    if (f >> kib) bytes = kib << 10;  // "307200K"; the highest index is the last level
  }
  return bytes;
}

// One 8192 x 2048 projection for T tokens: libtorch's at::linear on float32 against specdec's
// Linear in each weight format (state.range(1): 0 float32, 1 bfloat16, 2 Q8_0, 3 Q4_0, 4 Q4_1,
// 5 Q4_K, 6 Q6_K, 7 float16, 8 Q5_0; the K-quants and Q5_0 hold random bytes with a float16 scale
// of 0.01, as specdec has no quantizer for them); BM_Linear8192x2048Int8 runs the 8-bit-activation
// kernels of the formats that have one. Copies of the matrix rotate, at least 8 and together at
// least twice the last-level cache (a Xeon with 300 MiB of L3 held eight Q4_K matrices), so each
// call streams its weights from memory; bytes/s counts the weight bytes read.
// BM_Linear1024x2048Int8Cached calls one 1024 x 2048 matrix (at most 1.7 MB, in the caches) again
// and again: the kernel's arithmetic rate, with memory out of the way. The copies live in a
// WeightArena (transparent huge pages), as a loaded model's matrices do: on small pages streams
// side by side measured up to 2.5x slower than they run in a model (Zen 5, 2026-11-29).
void linear_bench(benchmark::State& state, bool int8, int64_t n, bool stream) {
  c10::InferenceMode guard;
  set_bench_threads();
  const GgmlType types[] = {GgmlType::kF32,  GgmlType::kBF16, GgmlType::kQ8_0,
                            GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ4_K,
                            GgmlType::kQ6_K, GgmlType::kF16,  GgmlType::kQ5_0};
  const GgmlType type = types[state.range(1)];
  const bool dense = type == GgmlType::kF32 || type == GgmlType::kBF16 || type == GgmlType::kF16;
  const at::Tensor f = at::randn({n, 2048});
  at::Tensor stored;  // the matrix as a Linear takes it: dense [n, 2048], or ggml blocks
  if (dense) {
    stored = type == GgmlType::kF32 ? f : f.to(type == GgmlType::kF16 ? at::kHalf : at::kBFloat16);
  } else {
    const int64_t block = specdec::ggml_block_elements(type),
                  bytes_per_block = specdec::ggml_block_bytes(type);
    stored = at::empty({n, 2048 / block * bytes_per_block}, at::kByte);
    if (block == 256 || type == GgmlType::kQ5_0) {  // random bytes, the d (and dmin) fields 0.01
      stored.random_(0, 256);
      const uint16_t h = c10::Half(0.01f).x;
      uint8_t* p = stored.data_ptr<uint8_t>();
      for (int64_t b = 0; b < stored.numel() / bytes_per_block; ++b)
        for (int64_t off : type == GgmlType::kQ6_K   ? std::vector<int64_t>{208}
                           : type == GgmlType::kQ5_0 ? std::vector<int64_t>{0}
                                                     : std::vector<int64_t>{0, 2})
          std::memcpy(p + b * bytes_per_block + off, &h, 2);
    } else {
      specdec::ggml_quantize(type, f.data_ptr<float>(), stored.data_ptr<uint8_t>(), f.numel());
    }
  }
  const int64_t bytes = stored.numel() * stored.element_size();
  const int64_t copies =
      stream ? std::max<int64_t>(8, (2 * last_level_cache_bytes() + bytes - 1) / bytes) : 1;
  std::vector<specdec::Linear> w;
  specdec::WeightArena arena;  // huge pages, as a loaded model holds its matrices
  for (int64_t i = 0; i < copies; ++i) {
    at::Tensor copy = arena.copy(stored, false).first;
    if (dense)
      w.emplace_back(std::move(copy));
    else
      w.emplace_back(type, std::move(copy), 2048, at::Tensor(), int8);
  }
  const at::Tensor x = at::randn({1, state.range(0), 2048});
  size_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(w[i++ % w.size()](x));
  state.SetBytesProcessed(state.iterations() * w[0].bytes());
  state.SetLabel(std::string(specdec::ggml_type_name(static_cast<uint32_t>(type))) +
                 (int8 ? " int8" : ""));
}
void BM_Linear8192x2048(benchmark::State& state) { linear_bench(state, false, 8192, true); }
void BM_Linear8192x2048Int8(benchmark::State& state) { linear_bench(state, true, 8192, true); }
void BM_Linear1024x2048Int8Cached(benchmark::State& state) {
  linear_bench(state, true, 1024, false);
}
BENCHMARK(BM_Linear8192x2048)
    ->ArgsProduct({{1, 2, 3, 4, 6, 16, 128}, {0, 1, 2, 3, 4, 5, 6, 7, 8}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Linear8192x2048Int8)
    ->ArgsProduct({{1, 2, 3, 4, 6, 16, 128}, {2, 3, 4, 5, 6, 8}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Linear1024x2048Int8Cached)
    ->ArgsProduct({{1, 2}, {2, 3, 4, 5, 6, 8}})
    ->Unit(benchmark::kMicrosecond);

// One forward pass of a whole model over T new tokens after a 64-token context: the cost curve a
// verification pass pays (T = K + 1) and prefill (T = 128). The model is SPECDEC_BENCH_MODEL,
// default the SmolLM2 GGUF of scripts/get_models.sh, weights as stored (SPECDEC_BENCH_INT8=1: with
// 8-bit activations); skipped when absent.
void BM_ModelPass(benchmark::State& state) {
  c10::InferenceMode guard;
  set_bench_threads();
  const char* env = std::getenv("SPECDEC_BENCH_MODEL");
  const std::string path = env ? env : "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
  static std::map<std::string, std::shared_ptr<const specdec::Model>> models;
  if (!models.count(path)) {
    try {
      specdec::LoadOptions options;
      const char* int8 = std::getenv("SPECDEC_BENCH_INT8");
      options.int8_activations = int8 && std::string(int8) == "1";
      models[path] = specdec::load_model(path, options);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      return;
    }
  }
  const specdec::Model& model = *models[path];
  const int64_t t = state.range(0), context = 64;
  specdec::KVCache cache = model.make_cache(context + t);
  model.forward(at::randint(1, 1000, {1, context}, at::kLong), cache);
  const at::Tensor ids = at::randint(1, 1000, {1, t}, at::kLong);
  for (auto _ : state) {
    benchmark::DoNotOptimize(model.forward(ids, cache));
    cache.crop(context);
  }
  state.SetLabel(path.substr(path.find_last_of('/') + 1));
}
BENCHMARK(BM_ModelPass)
    ->Arg(1)
    ->Arg(2)
    ->Arg(3)
    ->Arg(4)
    ->Arg(6)
    ->Arg(8)
    ->Arg(16)
    ->Arg(128)
    ->Unit(benchmark::kMillisecond);

// The memory-bandwidth floor beside BM_ModelPass: a read of state.range(0) MB (96: SmolLM2 Q4_1's
// 96.5 MB of weight matrices, each read once by a one-token pass; SPECDEC_BENCH_READ_MB=N adds
// BM_ReadBandwidth/N, as benchmarks/llama_cpp_peer.sh does with each file's bytes) from huge pages
// as the weights are held (WeightArena), each thread summing its contiguous share, as the linear
// kernels split a matrix, prefetching 8 KiB ahead as they do (on Zen 5, 2026-11-29, a 4 GB read at
// 1 thread 34 GB/s without, 41 with). bytes_per_second is the rate; a pass's floor is its bytes at
// that rate.
#if defined(__x86_64__)
__attribute__((target("avx2"))) uint64_t read_words(const uint64_t* p, int64_t n) {
  __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                  _mm256_setzero_si256()};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 2; ++j)
      _mm_prefetch(reinterpret_cast<const char*>(p + i + 8 * j) + 8192, _MM_HINT_T0);
    for (int j = 0; j < 4; ++j)
      a[j] = _mm256_add_epi64(a[j],
                              _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4 * j)));
  }
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out),
                     _mm256_add_epi64(_mm256_add_epi64(a[0], a[1]), _mm256_add_epi64(a[2], a[3])));
  uint64_t sum = out[0] + out[1] + out[2] + out[3];
  for (; i < n; ++i) sum += p[i];
  return sum;
}
#else
uint64_t read_words(const uint64_t* p, int64_t n) {
  uint64_t a[8] = {}, sum = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) a[j] += p[i + j];
  for (int j = 0; j < 8; ++j) sum += a[j];
  for (; i < n; ++i) sum += p[i];
  return sum;
}
#endif

void BM_ReadBandwidth(benchmark::State& state) {
  set_bench_threads();
  const int64_t n = state.range(0) * 1000 * 1000 / 8;  // 64-bit words
  static specdec::WeightArena arena;
  static std::map<int64_t, at::Tensor> buffers;
  if (!buffers.count(n))
    buffers[n] = arena.copy(at::ones({n}, at::kLong), /*release_source=*/true).first;
  const auto* p = static_cast<const uint64_t*>(buffers[n].data_ptr());
  for (auto _ : state) {
    std::vector<uint64_t> sums(static_cast<size_t>(at::get_num_threads()), 0);
    at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t t0, int64_t t1) {
      const int64_t from = n * t0 / at::get_num_threads(), to = n * t1 / at::get_num_threads();
      sums[static_cast<size_t>(t0)] = read_words(p + from, to - from);
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.SetBytesProcessed(state.iterations() * n * 8);
}
BENCHMARK(BM_ReadBandwidth)->Arg(96)->Unit(benchmark::kMillisecond);

// The compute floor beside BM_ModelPass: float32 multiply-adds at the CPU's peak rate, each thread
// running 12 independent chains of 8-wide FMAs (enough to hide their latency; 16-wide ones gave
// the same rate on Zen 4). The FLOP/s counter is the rate; a pass's floor is its 2 x multiply-adds
// (SmolLM2-135M: 134.5 M per token) at that rate.
#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) float fma_chains(int64_t n) {
  constexpr int kChains = 12;
  __m256 a[kChains];
  for (int i = 0; i < kChains; ++i) a[i] = _mm256_set1_ps(0.001f * static_cast<float>(i));
  const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.0001f);
  for (int64_t i = 0; i < n; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kChains; ++j) a[j] = _mm256_fmadd_ps(a[j], b, c);
  }
  alignas(32) float out[8];
  __m256 sum = a[0];
  for (int i = 1; i < kChains; ++i) sum = _mm256_add_ps(sum, a[i]);
  _mm256_store_ps(out, sum);
  return out[0];
}

void BM_FmaPeak(benchmark::State& state) {
  if (!__builtin_cpu_supports("fma") || !__builtin_cpu_supports("avx2")) {
    state.SkipWithError("no AVX2 FMA");
    return;
  }
  set_bench_threads();
  constexpr int64_t kSteps = 1 << 20;  // 12 x 8 x 2 x 2^20 FLOP per thread
  for (auto _ : state) {
    std::vector<float> sums(static_cast<size_t>(at::get_num_threads()), 0);
    at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) sums[static_cast<size_t>(t)] = fma_chains(kSteps);
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * at::get_num_threads() * 12 * 8 * 2 * kSteps,
      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_FmaPeak)->Unit(benchmark::kMillisecond);
#endif

// One decode step's attention over a long context (SmolLM2's heads: 9 query heads over 3 key/value
// heads of 64), state.range(0) cached positions; state.range(1): 0 the CPU's kernel family, 1 the
// portable (scalar) copy of the same code.
void BM_AttentionDecode(benchmark::State& state) {
  c10::InferenceMode guard;
  set_bench_threads();
  const int64_t len = state.range(0);
  const at::Tensor q = at::randn({1, 9, 1, 64}), k = at::randn({1, 3, len, 64}),
                   v = at::randn({1, 3, len, 64});
  const auto isa =
      state.range(1) ? specdec::kernels::Isa::kPortable : specdec::kernels::default_isa();
  for (auto _ : state)
    benchmark::DoNotOptimize(specdec::kernels::attention_f32(q, k, v, {}, 0.125, isa));
  state.SetLabel(specdec::kernels::isa_name(isa));
}
BENCHMARK(BM_AttentionDecode)
    ->ArgsProduct({{256, 1024, 4096}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

void BM_LibtorchLinear8192x2048(benchmark::State& state) {
  c10::InferenceMode guard;
  at::set_num_threads(2);
  std::vector<at::Tensor> w;
  for (int i = 0; i < 8; ++i) w.push_back(at::randn({8192, 2048}));
  const at::Tensor x = at::randn({1, state.range(0), 2048});
  size_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(at::linear(x, w[i++ % w.size()]));
}
BENCHMARK(BM_LibtorchLinear8192x2048)->Arg(1)->Arg(6)->Unit(benchmark::kMillisecond);

// Byte-level BPE on one word without spaces of state.range(0) bytes (the heap merge is O(n log n);
// the textbook loop is quadratic). The tiny BPE of tests/data: "Hello" repeated.
void BM_BpeLongWord(benchmark::State& state) {
  const auto tok = specdec::load_tokenizer(SPECDEC_TEST_DATA "/tiny_bpe");
  std::string word;
  for (int64_t i = 0; i < state.range(0); ++i) word += "Hello"[i % 5];
  for (auto _ : state)
    benchmark::DoNotOptimize(tok->encode(word, false));  // long words are not cached
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_BpeLongWord)->Arg(1 << 16)->Arg(1 << 20)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  if (const char* mb = std::getenv("SPECDEC_BENCH_READ_MB"))
    benchmark::RegisterBenchmark("BM_ReadBandwidth", BM_ReadBandwidth)
        ->Arg(std::atoll(mb))
        ->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
