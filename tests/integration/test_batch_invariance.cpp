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
      at::Tensor reference;  // [6, V] at 1 thread
      for (int threads : {1, 2, 3, 4}) {
        at::set_num_threads(threads);
        const auto [verify, decode, prefill] = logits_three_ways(*m, ids, 6);
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
