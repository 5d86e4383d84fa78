// Batch invariance of the float32 CPU forward pass, at the logits level: for every architecture,
// after a context of up to 1024 tokens, one pass over K+1 = 6 tokens, six one-token passes, and the
// last six rows of one prefill over the whole sequence give bitwise the same logits, at 1, 2, 3 and
// 4 threads. Greedy exactness of speculation rests on this (README, "Correctness").
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "specdec/specdec.hpp"
#include "test_util.hpp"

using namespace specdec;
using namespace specdec::test;

namespace {

struct Threads {  // restores libtorch's thread count
  int saved = at::get_num_threads();
  ~Threads() { at::set_num_threads(saved); }
};

KVCache prepared_cache(const Model& m, int64_t capacity) {
  KVCache cache = m.make_cache(capacity);
  if (m.config().is_encoder_decoder) {
    const at::Tensor src = at::arange(3, 19, at::kLong).unsqueeze(0);  // [1, 16] encoder input
    m.attach_encoder(m.encode(src), cache);
  }
  return cache;
}

}  // namespace

TEST(BatchInvariance, VerificationPassEqualsDecodeStepsAndPrefillBitwise) {
  c10::InferenceMode guard;
  Threads restore;
  for (const std::string arch : {"llama", "mistral", "qwen2", "gpt_neox", "gpt2", "opt", "t5"}) {
    FixtureOptions o;
    o.arch = arch;
    o.layers = 2, o.hidden = 64, o.heads = 4, o.kv_heads = arch == "llama" || arch == "qwen2" ? 2 : 0;
    o.vocab = 128, o.max_pos = 1100, o.seed = 5, o.init_std = 0.1;
    const auto m = cached_model(cached_fixture("bi_" + arch, o));
    for (int64_t ctx : {1, 37, 1024}) {
      const at::Tensor ids = at::randint(4, 128, {1, ctx + 6}, at::TensorOptions().dtype(at::kLong));
      const at::Tensor prefix = ids.narrow(1, 0, ctx), next = ids.narrow(1, ctx, 6);
      at::Tensor reference;  // [6, V] at 1 thread
      for (int threads : {1, 2, 3, 4}) {
        at::set_num_threads(threads);
        KVCache a = prepared_cache(*m, ctx + 6), b = prepared_cache(*m, ctx + 6), c = prepared_cache(*m, ctx + 6);
        m->forward(prefix, a);
        const at::Tensor verify = m->forward(next, a)[0];  // [6, V]
        m->forward(prefix, b);
        std::vector<at::Tensor> steps;
        for (int64_t i = 0; i < 6; ++i) steps.push_back(m->forward(next.narrow(1, i, 1), b)[0]);
        const at::Tensor decode = at::cat(steps);          // [6, V]
        const at::Tensor prefill = m->forward(ids, c, 6)[0];  // [6, V]: last rows of one pass
        const std::string where = arch + ", context " + std::to_string(ctx) + ", " + std::to_string(threads) + " threads";
        EXPECT_TRUE(at::equal(verify, decode)) << where << ": verification pass vs decode steps, max diff "
                                               << (verify - decode).abs().max().item<float>();
        EXPECT_TRUE(at::equal(prefill, decode)) << where << ": prefill vs decode steps";
        if (threads == 1) reference = decode;
        else EXPECT_TRUE(at::equal(decode, reference)) << where << ": differs from 1 thread";
      }
    }
  }
}
