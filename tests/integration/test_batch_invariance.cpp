// Batch invariance of the float32 CPU forward pass, at the logits level: for every architecture,
// after a context of up to 1024 tokens, one pass over K+1 = 6 tokens, six one-token passes, and the
// last six rows of one prefill over the whole sequence give bitwise the same logits, at 1, 2, 3 and
// 4 threads. Greedy exactness of speculation rests on this (docs/correctness.md, "Exactness").
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "specdec/specdec.hpp"
#include "test_util.hpp"

using namespace specdec;
using namespace specdec::test;

namespace {

std::vector<int64_t> random_ids(int64_t n) {
  const at::Tensor t = at::randint(4, 128, {n}, at::TensorOptions().dtype(at::kLong));
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
}

// A 2-layer model of `arch` (hidden 64, 4 heads; 2 key/value heads where the architecture has
// them) for `max_pos` positions.
FixtureOptions fixture(const std::string& arch, int64_t max_pos, uint64_t seed) {
  FixtureOptions o;
  o.arch = arch;
  o.layers = 2, o.hidden = 64, o.heads = 4,
  o.kv_heads = arch == "llama" || arch == "qwen2" || arch == "qwen3" || arch == "gemma3" ? 2 : 0;
  o.vocab = 128, o.max_pos = max_pos, o.seed = seed, o.init_std = 0.1;
  return o;
}

// Tokens a row holds after passes [0, step].
int64_t held(const std::vector<std::vector<int64_t>>& passes, size_t step) {
  int64_t n = 0;
  for (size_t i = 0; i <= step; ++i) n += static_cast<int64_t>(passes[i].size());
  return n;
}

}  // namespace

TEST(BatchInvariance, VerificationPassEqualsDecodeStepsAndPrefillBitwise) {
  c10::InferenceMode guard;
  const ThreadsGuard restore;
  for (const std::string arch :
       {"llama", "mistral", "qwen2", "qwen3", "gemma3", "gpt_neox", "gpt2", "opt", "t5"}) {
    const auto m = cached_model(cached_fixture("bi_" + arch, fixture(arch, 1100, 5)));
    for (int64_t ctx : {1, 37, 1024}) {
      const at::Tensor ids =
          at::randint(4, 128, {1, ctx + 6}, at::TensorOptions().dtype(at::kLong));
      at::Tensor reference;  // [6, V] at 1 thread
      for (int threads : {1, 2, 3, 4}) {
        at::set_num_threads(threads);
        const auto [verify, decode, prefill] = logits_three_ways(*m, ids, 6);
        const std::string where =
            arch + ", context " + std::to_string(ctx) + ", " + std::to_string(threads) + " threads";
        EXPECT_TRUE(at::equal(verify, decode))
            << where << ": verification pass vs decode steps, max diff "
            << (verify - decode).abs().max().item<float>();
        EXPECT_TRUE(at::equal(prefill, decode)) << where << ": prefill vs decode steps";
        if (threads == 1)
          reference = decode;
        else
          EXPECT_TRUE(at::equal(decode, reference)) << where << ": differs from 1 thread";
      }
    }
  }
}

// Rows of different lengths in one pass (Model::forward with row_tokens): every row's logits are
// bitwise those of the same row run alone, in batches of 3 and 8, through a ragged prefill, ragged
// passes with idle rows (0 tokens) and after compacting the batch (KVCache::copy_row). T5 rows get
// encoder outputs of different lengths (padding hidden by the cross mask).
TEST(BatchInvariance, EachRowOfARaggedBatchEqualsTheRowAloneBitwise) {
  c10::InferenceMode guard;
  const auto opts = at::TensorOptions().dtype(at::kLong);
  for (const std::string arch :
       {"llama", "mistral", "qwen2", "qwen3", "gemma3", "gpt_neox", "gpt2", "opt", "t5"}) {
    const auto m = cached_model(cached_fixture("bi_" + arch + "_ragged", fixture(arch, 256, 7)));
    const bool enc_dec = m->config().is_encoder_decoder;
    for (const int64_t batch : {3, 8}) {
      at::manual_seed(static_cast<uint64_t>(batch));
      // Each row's passes: a prompt of 1..40 tokens, then three passes of 0..6 tokens.
      std::vector<std::vector<std::vector<int64_t>>> passes(batch);
      for (auto& row : passes) {
        const int64_t prompt = at::randint(1, 41, {1}, opts).item<int64_t>();
        row.push_back(random_ids(prompt));
        for (int step = 0; step < 3; ++step)
          row.push_back(random_ids(at::randint(0, 7, {1}, opts).item<int64_t>()));
      }
      std::vector<at::Tensor> encoder_ids;
      for (int64_t r = 0; r < batch; ++r)
        encoder_ids.push_back(at::randint(4, 128, {1, 3 + 2 * r}, opts));

      // Each row alone: the logits of every token of every pass, [tokens, V].
      std::vector<std::vector<at::Tensor>> alone(batch);
      for (int64_t r = 0; r < batch; ++r) {
        KVCache cache = m->make_cache(128);
        if (enc_dec) m->attach_encoder(m->encode(encoder_ids[r]), cache);
        for (const auto& ids : passes[r])
          alone[r].push_back(ids.empty()
                                 ? at::Tensor()
                                 : m->forward(at::tensor(ids, opts).view({1, -1}), cache)[0]);
      }

      // The batch: one ragged pass per step over every row (rows are padded with token 0).
      KVCache cache = m->make_cache(128, batch);
      if (enc_dec)  // each longer than the last: the cross-attention buffers grow as rows join
        for (int64_t r = 0; r < batch; ++r) m->attach_encoder(m->encode(encoder_ids[r]), cache, r);
      std::vector<int64_t> rows(batch);
      for (int64_t r = 0; r < batch; ++r) rows[r] = r;  // cache row -> original row
      for (size_t step = 0; step < passes[0].size(); ++step) {
        if (step == 3) {  // compact: drop cache row 1, the last row moves into its slot
          cache.copy_row(static_cast<int64_t>(rows.size()) - 1, 1);
          rows[1] = rows.back();
          rows.pop_back();
        }
        const int64_t b = static_cast<int64_t>(rows.size());
        std::vector<int64_t> counts;
        int64_t t = 1;
        for (const int64_t r : rows) {
          counts.push_back(static_cast<int64_t>(passes[r][step].size()));
          t = std::max(t, counts.back());
        }
        at::Tensor ids = at::zeros({b, t}, opts);
        for (int64_t i = 0; i < b; ++i)
          if (counts[i] > 0)
            ids[i].narrow(0, 0, counts[i]).copy_(at::tensor(passes[rows[i]][step], opts));
        const int64_t keep =
            step % 2 == 1 ? std::min<int64_t>(2, t) : 0;  // every token, or each row's last two
        const at::Tensor logits = m->forward(ids, cache, keep, counts);  // [B, T or 2, V]
        for (int64_t i = 0; i < b; ++i) {
          EXPECT_EQ(cache.length(i), held(passes[rows[i]], step)) << arch << ", row " << rows[i];
          const int64_t n = keep > 0 ? std::min(keep, counts[i]) : counts[i];
          if (n == 0) continue;
          const at::Tensor mine = logits[i].narrow(0, keep > 0 ? keep - n : 0, n);
          const at::Tensor ref = alone[rows[i]][step].narrow(0, counts[i] - n, n);
          EXPECT_TRUE(at::equal(mine, ref))
              << arch << ", batch " << batch << ", row " << rows[i] << ", pass " << step
              << ": max diff " << (mine - ref).abs().max().item<float>();
        }
      }
    }
  }
}

// A pass over a tree of candidates (Model::forward with trees): each node's logits are bitwise
// those of the path to it run as a chain after the same context, in a batch beside a chain row;
// after KVCache::keep_path keeps one path, the next pass is bitwise the chain's. Every decoder
// architecture (sliding windows included: Gemma 3's fixture has one of 16, shorter than the
// contexts); T5 refuses trees.
TEST(BatchInvariance, TreePassNodesEqualTheirPathsAsChainsBitwise) {
  c10::InferenceMode guard;
  const ThreadsGuard restore;
  const auto opts = at::TensorOptions().dtype(at::kLong);
  // Parents before children: two subtrees under the context, depths up to 4.
  const TokenTree parents = {-1, 0, 0, 1, 2, -1, 5, 3, 7};
  const std::vector<int64_t> kept = {0, 1, 3, 7, 8};  // a root-to-leaf path of it
  for (const std::string arch :
       {"llama", "mistral", "qwen2", "qwen3", "gemma3", "gpt_neox", "gpt2", "opt", "t5"}) {
    const auto m = cached_model(cached_fixture("bi_" + arch, fixture(arch, 1100, 5)));
    if (m->config().is_encoder_decoder) {
      KVCache cache = m->make_cache(16);
      m->attach_encoder(m->encode(at::arange(3, 9, opts).unsqueeze(0)), cache);
      EXPECT_THROW(m->forward(at::tensor(std::vector<int64_t>{5, 6}, opts).view({1, 2}), cache, 0,
                              {}, {TokenTree{-1, -1}}),
                   Error)
          << arch;
      continue;
    }
    for (int64_t ctx : {1, 37, 1024}) {
      for (int threads : {1, 3}) {
        at::set_num_threads(threads);
        const std::string where =
            arch + ", context " + std::to_string(ctx) + ", " + std::to_string(threads) + " threads";
        at::manual_seed(static_cast<uint64_t>(ctx));
        const std::vector<int64_t> context = random_ids(ctx), nodes = random_ids(9),
                                   other = random_ids(4), next = random_ids(1);
        // The context prefilled once; each chain starts from a copy of its cache.
        KVCache prefilled = m->make_cache(ctx + 16);
        m->forward(at::tensor(context, opts).view({1, -1}), prefilled, Model::kCacheOnly);
        const auto chain_after_context = [&](const std::vector<int64_t>& tokens) {
          KVCache cache = m->make_cache(ctx + 16);
          cache.copy_row(prefilled, 0, 0);
          return std::make_pair(m->forward(at::tensor(tokens, opts).view({1, -1}), cache)[0],
                                std::move(cache));
        };
        // Row 0: the tree; row 1: a chain of 4 after a context one token longer.
        KVCache cache = m->make_cache(ctx + 16, 2);
        std::vector<int64_t> longer = context;
        longer.push_back(3);
        at::Tensor first = at::zeros({2, ctx + 1}, opts);
        first[0].narrow(0, 0, ctx).copy_(at::tensor(context, opts));
        first[1].copy_(at::tensor(longer, opts));
        m->forward(first, cache, Model::kCacheOnly, {ctx, ctx + 1});
        at::Tensor ids = at::zeros({2, 9}, opts);
        ids[0].copy_(at::tensor(nodes, opts));
        ids[1].narrow(0, 0, 4).copy_(at::tensor(other, opts));
        const at::Tensor logits = m->forward(ids, cache, 0, {9, 4}, {parents, {}});  // [2, 9, V]
        for (int64_t j = 0; j < 9; ++j) {
          std::vector<int64_t> path;
          for (int64_t i = j; i >= 0; i = parents[i]) path.insert(path.begin(), nodes[i]);
          const at::Tensor ref = chain_after_context(path).first[-1];
          EXPECT_TRUE(at::equal(logits[0][j], ref))
              << where << ": node " << j << " vs its path as a chain, max diff "
              << (logits[0][j] - ref).abs().max().item<float>();
        }
        {
          KVCache alone = m->make_cache(ctx + 16);
          m->forward(at::tensor(longer, opts).view({1, -1}), alone, Model::kCacheOnly);
          const at::Tensor ref = m->forward(at::tensor(other, opts).view({1, -1}), alone)[0];
          EXPECT_TRUE(at::equal(logits[1].narrow(0, 0, 4), ref)) << where << ": the chain row";
        }
        // Keep one path, then one more token: the chain's cache gives the same bits.
        cache.keep_path(0, ctx, kept);
        EXPECT_EQ(cache.length(0), ctx + static_cast<int64_t>(kept.size())) << where;
        std::vector<int64_t> path;
        for (const int64_t i : kept) path.push_back(nodes[i]);
        auto [unused, chain_cache] = chain_after_context(path);
        at::Tensor last = at::zeros({2, 1}, opts);
        last[0][0] = next[0];
        const at::Tensor after = m->forward(last, cache, 0, {1, 0});
        const at::Tensor ref = m->forward(at::tensor(next, opts).view({1, 1}), chain_cache)[0];
        EXPECT_TRUE(at::equal(after[0], ref)) << where << ": after keep_path, max diff "
                                              << (after[0] - ref).abs().max().item<float>();
      }
    }
  }
}

// Every architecture's forward and make_cache refuse bad arguments with a specdec::Error (not a
// libtorch error from deep inside, nor a silent pass).
TEST(ModelApi, ForwardAndMakeCacheRefuseBadArgumentsOnEveryArchitecture) {
  c10::InferenceMode guard;
  const auto other = cached_model(cached_fixture("bi_llama", fixture("llama", 1100, 5)));
  int foreign_shapes = 0;
  for (const std::string arch :
       {"llama", "mistral", "qwen2", "qwen3", "gemma3", "gpt_neox", "gpt2", "opt", "t5"}) {
    SCOPED_TRACE(arch);
    const auto m = cached_model(cached_fixture("bi_" + arch, fixture(arch, 1100, 5)));
    EXPECT_THROW(m->make_cache(int64_t{1} << 40), Error);
    EXPECT_THROW(m->make_cache(0), Error);
    EXPECT_THROW(m->make_cache(8, 0), Error);
    KVCache cache = m->make_cache(16);
    if (m->config().is_encoder_decoder)
      m->attach_encoder(m->encode(at::tensor({5, 6, 7}, at::kLong).view({1, 3})), cache);
    const auto ids = at::tensor({5, 6}, at::kLong).view({1, 2});
    EXPECT_THROW(m->forward(ids.to(at::kFloat), cache), Error);
    EXPECT_THROW(m->forward(ids.to(at::kInt), cache), Error);
    EXPECT_THROW(m->forward(at::zeros({1, 0}, at::kLong), cache), Error);
    EXPECT_THROW(m->forward(ids, cache, -5), Error);
    KVCache wrong(1, 1, 1, 16, 4, at::TensorOptions());
    EXPECT_THROW(m->forward(ids, wrong), Error);
    const ModelConfig &a = m->config(), &b = other->config();
    if (a.num_hidden_layers != b.num_hidden_layers ||
        a.num_key_value_heads != b.num_key_value_heads || a.head_dim != b.head_dim) {
      KVCache foreign = other->make_cache(16);  // another model's, of another shape
      EXPECT_THROW(m->forward(ids, foreign), Error);
      ++foreign_shapes;
    }
    EXPECT_EQ(cache.length(0), 0);  // nothing was appended by the refused passes
    EXPECT_EQ(m->forward(ids, cache).size(1), 2);
  }
  EXPECT_GE(foreign_shapes, 3);
}
