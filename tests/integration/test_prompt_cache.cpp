// PromptCache: the turns of a conversation continue the keys and values of the turns before. Every
// turn's output equals the same request without the cache (greedy: the target-only output; sampled:
// the same seed's tokens), and the cache holds what it says: the common prefix of the last sequence
// and the new prompt, all but the prompt's last token at most.
#include <gtest/gtest.h>

#include "test_util.hpp"

namespace specdec::test {
namespace {

struct Pair {
  std::shared_ptr<const Model> target, draft;
};

Pair pair_for(const std::string& arch, uint64_t seed) {
  const std::string t =
      cached_fixture("pc_t" + arch + std::to_string(seed), small_fixture(seed, 3, arch));
  const std::string d = temp_dir("pc_d" + arch);
  make_draft_of(t, d, 1, 0.0, seed);
  return {test_model(t), test_model(d)};
}

std::vector<int64_t> ids(uint64_t seed, size_t n) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back(static_cast<int64_t>((seed * 29 + i * 13 + 5) % 90) + 3);
  return out;
}

std::vector<int64_t> concat(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

// Turns of a conversation (each prompt: the last sequence and a new message), an edited history (a
// prompt that leaves the last sequence part-way), a prompt equal to the last sequence and one
// shorter than it: the output of each turn is the fresh request's, and the cache held the positions
// it should. Greedy (assisted, prompt lookup, suffix speculation's chains and trees) and sampled,
// across architectures.
TEST(PromptCache, TurnsEqualFreshRequestsAndContinueTheCommonPrefix) {
  for (const auto& [arch, seed] : std::vector<std::pair<std::string, uint64_t>>{
           {"llama", 1}, {"gpt2", 2}, {"opt", 3}, {"gpt_neox", 4}}) {
    const Pair p = pair_for(arch, seed);
    for (const std::string mode : {"greedy", "lookup", "suffix", "suffix trees", "sampled"}) {
      SCOPED_TRACE(arch + " " + mode);
      GenerationConfig c;
      c.max_new_tokens = 12;
      c.num_assistant_tokens = 3;
      if (mode == "lookup") c.prompt_lookup_num_tokens = 3;
      c.suffix_speculation = mode.rfind("suffix", 0) == 0;
      if (mode == "sampled") c.do_sample = true, c.seed = seed;
      Generator assisted(p.target, p.draft);
      SuffixOptions trees;  // "suffix trees": branches down to 2% of the mass
      trees.tree = true;
      trees.min_token_prob = 0.02;
      if (mode == "suffix trees") assisted.set_suffix_options(trees);
      PromptCache cache;
      EXPECT_EQ(cache.positions(), 0);
      std::vector<int64_t> last;  // the cache's last sequence: prompt and answer
      int64_t held = 0;           // positions its target cache holds
      const auto turn = [&](const std::vector<int64_t>& prompt, int64_t expect_cached) {
        const GenerationResult r = assisted.generate(prompt, c, cache);
        // Without the cache: a fresh Generator (greedy: the target alone).
        const GenerationResult fresh = mode == "sampled"
                                           ? Generator(p.target, p.draft).generate(prompt, c)
                                           : Generator(p.target).generate(prompt, c);
        EXPECT_EQ(r.tokens, fresh.tokens) << "prompt of " << prompt.size();
        EXPECT_EQ(r.stats.cached_prompt_tokens, expect_cached) << "prompt of " << prompt.size();
        last = concat(prompt, r.tokens);
        // Every token but the last went through the target (and that one too when it is an EOS
        // that the target accepted from the draft).
        held = cache.positions();
        const auto n = static_cast<int64_t>(last.size());
        EXPECT_TRUE(held == n - 1 || (held == n && r.stats.stop_reason == "eos"))
            << held << " of " << n;
      };
      const std::vector<int64_t> first = ids(seed, 7);
      turn(first, 0);
      turn(concat(last, ids(seed + 1, 5)), held);   // the next message
      turn(concat(last, ids(seed + 2, 40)), held);  // past the cache's capacity
      const int64_t other = last[10] == 91 ? 90 : 91;
      turn(concat(std::vector<int64_t>(last.begin(), last.begin() + 10), {other, 92}),
           10);  // history edited
      const std::vector<int64_t> same = last;
      turn(same, static_cast<int64_t>(same.size()) - 1);              // the last sequence itself
      turn(std::vector<int64_t>(last.begin(), last.begin() + 6), 5);  // a prefix of it
    }
  }
}

// What the cache does not continue: another Generator's models, an encoder-decoder model, a
// cancelled request (it continues that one's tokens) and a failing one (it is left empty).
TEST(PromptCache, OtherModelsEncoderDecoderCancelledAndFailedRequests) {
  const Pair p = pair_for("llama", 7);
  GenerationConfig c;
  c.max_new_tokens = 10;
  // constant K (5): goodput, the greedy default, may verify all 10 tokens in one pass, and the
  // request cancelled after 3 would then end at max_new_tokens
  c.num_assistant_tokens_schedule = "constant";
  const std::vector<int64_t> prompt = ids(7, 9);
  PromptCache cache;
  const Generator assisted(p.target, p.draft);
  const std::vector<int64_t> answer = assisted.generate(prompt, c, cache).tokens;
  ASSERT_GT(cache.positions(), 0);
  const std::vector<int64_t> next = concat(concat(prompt, answer), ids(8, 4));

  // The draft's models as the target: nothing of the cache is used, and the cache then holds its
  // run.
  const Generator other(p.draft);
  GenerationResult r = other.generate(next, c, cache);
  EXPECT_EQ(r.stats.cached_prompt_tokens, 0);
  EXPECT_EQ(r.tokens, Generator(p.draft).generate(next, c).tokens);
  EXPECT_GE(cache.positions(), static_cast<int64_t>(next.size() + r.tokens.size()) - 1);

  // A request refused before it runs leaves the cache as it was; one that fails while running
  // leaves it empty.
  const int64_t before = cache.positions();
  EXPECT_THROW(other.generate({1, 500}, c, cache), Error);
  EXPECT_EQ(cache.positions(), before);
  EXPECT_THROW(
      other.generate(next, c, cache,
                     [](const std::vector<int64_t>&) { throw std::runtime_error("gone"); }),
      std::runtime_error);
  EXPECT_EQ(cache.positions(), 0);

  // A second request on a cache in use is refused (here from the first one's callback, as a
  // second thread would be), and leaves the first one and the cache to go on.
  std::string refused;
  const GenerationResult first =
      assisted.generate(prompt, c, cache, [&](const std::vector<int64_t>&) {
        if (!refused.empty()) return;
        try {
          assisted.generate(prompt, c, cache);
          refused = "(not refused)";
        } catch (const Error& e) {
          refused = e.what();
        }
      });
  EXPECT_NE(refused.find("the PromptCache is in use by another request"), std::string::npos)
      << refused;
  EXPECT_EQ(first.tokens, Generator(p.target).generate(prompt, c).tokens);
  EXPECT_EQ(assisted.generate(prompt, c, cache).tokens, first.tokens);  // (released)

  // Cancelled after a few tokens: the cache holds that shorter sequence, and the next turn
  // continues it.
  std::vector<int64_t> streamed;
  r = assisted.generate(prompt, c, cache, [&](const std::vector<int64_t>& t) {
    streamed.insert(streamed.end(), t.begin(), t.end());
    if (streamed.size() >= 3) throw Cancelled();
  });
  ASSERT_EQ(r.stats.stop_reason, "cancelled");
  const std::vector<int64_t> after_cancel = concat(concat(prompt, r.tokens), ids(9, 3));
  r = assisted.generate(after_cancel, c, cache);
  EXPECT_EQ(r.stats.cached_prompt_tokens,
            static_cast<int64_t>(prompt.size() + streamed.size()) - 1);
  EXPECT_EQ(r.tokens, Generator(p.target).generate(after_cancel, c).tokens);

  // Encoder-decoder: every request starts afresh.
  const auto t5 = test_model(cached_fixture("pc_t5", small_fixture(5, 2, "t5")));
  PromptCache t5_cache;
  const Generator t5_gen(t5);
  const std::vector<int64_t> t5_first = t5_gen.generate(prompt, c, t5_cache).tokens;
  r = t5_gen.generate(prompt, c, t5_cache);
  EXPECT_EQ(r.stats.cached_prompt_tokens, 0);
  EXPECT_EQ(r.tokens, t5_first);
  EXPECT_EQ(t5_cache.positions(), 0);
}

}  // namespace specdec::test
