// The core invariant on generated checkpoints: assisted greedy output == target-only greedy output,
// token for token, for every schedule, K, length limit, EOS placement and draft quality.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.hpp"

namespace specdec::test {
namespace {

struct Pair {
  std::shared_ptr<const Model> target, early_exit, unrelated;
};

Pair pair_for(uint64_t seed, const std::string& arch = "llama") {
  const std::string t =
      cached_fixture("t" + std::to_string(seed) + arch, small_fixture(seed, 3, arch));
  const std::string key = "d" + std::to_string(seed) + arch;
  static std::map<std::string, std::string> drafts;
  if (!drafts.count(key)) {
    drafts[key] = temp_dir(key);
    make_draft_of(t, drafts[key], 1, 0.0, seed);
  }
  FixtureOptions u = small_fixture(seed + 100, 1, arch);
  const std::string un = cached_fixture("u" + std::to_string(seed) + arch, u);
  return {test_model(t), test_model(drafts[key]), test_model(un)};
}

std::vector<int64_t> prompt_for(uint64_t seed, size_t len) {
  std::vector<int64_t> p;
  for (size_t i = 0; i < len; ++i)
    p.push_back(static_cast<int64_t>((seed * 31 + i * 17 + 3) % 90) + 3);
  return p;
}

// The EOS tests' setting on `arch`: seed 6's pair and prompt, at most 30 new tokens with EOS 95,
// and the target-only answer under it (from which a test picks another EOS).
struct EosCase {
  Pair p;
  std::vector<int64_t> prompt;
  GenerationConfig probe;
  std::vector<int64_t> free_run;
};
EosCase eos_case(const char* arch) {
  EosCase e{pair_for(6, arch), prompt_for(6, 5), {}, {}};
  e.probe.max_new_tokens = 30;
  e.probe.eos_token_ids = {95};
  e.free_run = Generator(e.p.target).generate(e.prompt, e.probe).tokens;
  return e;
}

TEST(Exactness, TargetOnlyGreedyEqualsUncachedOracle) {
  for (uint64_t seed : {1, 2}) {
    const Pair p = pair_for(seed);
    for (size_t len : {1u, 7u}) {
      const auto prompt = prompt_for(seed, len);
      GenerationConfig cfg;
      cfg.max_new_tokens = 24;
      cfg.eos_token_ids = {95};  // rarely produced: long runs
      const auto got = Generator(p.target).generate(prompt, cfg).tokens;
      EXPECT_EQ(got, oracle_greedy(*p.target, prompt, 24, {95})) << "seed " << seed;
    }
  }
}

TEST(Exactness, AssistedEqualsTargetOnlyAcrossSchedulesKAndLengths) {
  int64_t cases = 0;
  const std::pair<const char*, uint64_t> runs[] = {
      {"llama", 1}, {"llama", 2}, {"llama", 3}, {"t5", 1}, {"t5", 2}};
  for (const auto& [arch, seed] : runs) {
    const Pair p = pair_for(seed, arch);
    const auto prompt = prompt_for(seed, 5);
    // Suffix speculation on one Generator throughout: each request also proposes from the earlier
    // ones' outputs.
    const Generator remembering(p.target);
    Generator branching(p.target);  // ... proposing trees (T5: chains, as it verifies no trees)
    SuffixOptions trees;
    trees.tree = true;
    trees.min_token_prob = 0.02;
    branching.set_suffix_options(trees);
    for (const char* schedule :
         {"constant", "heuristic", "heuristic_transient", "dynamic", "goodput"}) {
      for (int64_t k : {1, 2, 5, 8}) {
        for (int64_t n : {int64_t{1}, int64_t{2}, k, k + 1, int64_t{37}}) {
          GenerationConfig cfg;
          cfg.max_new_tokens = n;
          cfg.num_assistant_tokens = k;
          cfg.num_assistant_tokens_schedule = schedule;
          cfg.eos_token_ids = {95};
          const auto want = Generator(p.target).generate(prompt, cfg).tokens;
          for (const auto& draft : {p.early_exit, p.unrelated}) {
            const auto got = Generator(p.target, draft).generate(prompt, cfg);
            ASSERT_EQ(got.tokens, want) << arch << " seed " << seed << " schedule " << schedule
                                        << " K " << k << " max_new_tokens " << n;
            ASSERT_LE(static_cast<int64_t>(got.tokens.size()), n);
            ++cases;
          }
          GenerationConfig lookup = cfg;  // prompt lookup: no draft model, K tokens copied
          lookup.prompt_lookup_num_tokens = k;
          lookup.max_matching_ngram_size = 1 + k % 3;
          ASSERT_EQ(Generator(p.target).generate(prompt, lookup).tokens, want)
              << arch << " prompt lookup seed " << seed << " K " << k << " max_new_tokens " << n;
          GenerationConfig suffix = cfg;
          suffix.suffix_speculation = true;
          ASSERT_EQ(remembering.generate(prompt, suffix).tokens, want)
              << arch << " suffix seed " << seed << " K " << k << " max_new_tokens " << n;
          ASSERT_EQ(branching.generate(prompt, suffix).tokens, want)
              << arch << " suffix trees seed " << seed << " K " << k << " max_new_tokens " << n;
        }
      }
    }
  }
  EXPECT_EQ(cases, 5 * 5 * 4 * 5 * 2);
}

TEST(Exactness, OtherArchitecturesAndPromptLookup) {
  for (const char* arch :
       {"mistral", "qwen2", "qwen3", "gemma3", "gpt_neox", "gpt2", "opt", "t5"}) {
    const Pair p = pair_for(7, arch);
    const auto prompt = prompt_for(7, 6);
    GenerationConfig cfg;
    cfg.max_new_tokens = 30;
    cfg.eos_token_ids = {95};
    const auto want = Generator(p.target).generate(prompt, cfg).tokens;
    EXPECT_EQ(want, oracle_greedy(*p.target, prompt, 30, {95})) << arch;
    for (const char* schedule : {"constant", "heuristic", "dynamic"}) {
      for (int64_t n : {1, 7, 30}) {
        GenerationConfig a = cfg;
        a.num_assistant_tokens_schedule = schedule;
        a.max_new_tokens = n;
        const std::vector<int64_t> prefix(want.begin(),
                                          want.begin() + std::min<size_t>(n, want.size()));
        const auto r = Generator(p.target, p.early_exit).generate(prompt, a);
        EXPECT_EQ(r.tokens, prefix) << arch << " " << schedule << " " << n;
        if (n == 30) EXPECT_GT(r.stats.accepted_tokens, 0) << arch << " " << schedule;
        EXPECT_EQ(Generator(p.target, p.unrelated).generate(prompt, a).tokens, prefix) << arch;
      }
    }
    GenerationConfig suffix = cfg;
    cfg.prompt_lookup_num_tokens = 4;
    EXPECT_EQ(Generator(p.target).generate(prompt, cfg).tokens, want) << arch << " prompt lookup";
    // Suffix speculation, twice on one Generator: the second request proposes the first's output.
    suffix.suffix_speculation = true;
    suffix.num_assistant_tokens_schedule = "constant";
    const Generator remembering(p.target);
    EXPECT_EQ(remembering.generate(prompt, suffix).tokens, want) << arch << " suffix";
    const GenerationResult again = remembering.generate(prompt, suffix);
    EXPECT_EQ(again.tokens, want) << arch << " suffix, again";
    EXPECT_GT(again.stats.accepted_tokens, 0) << arch;
  }
}

TEST(Exactness, EncoderDecoderSharesTheEncoderOnlyWhenIdentical) {
  // pair_for's T5 early-exit draft keeps the target's encoder exactly; the unrelated one and a
  // noisy copy have encoders of their own. Output is the same in every case.
  const Pair p = pair_for(7, "t5");
  const std::string noisy = temp_dir("t5_noisy");
  make_draft_of(cached_fixture("t7t5", small_fixture(7, 3, "t5")), noisy, 1, 0.01, 3);
  const auto noisy_draft = test_model(noisy);
  EXPECT_TRUE(p.target->same_encoder(*p.early_exit));
  EXPECT_FALSE(p.target->same_encoder(*p.unrelated));
  EXPECT_FALSE(p.target->same_encoder(*noisy_draft));
  const auto prompt = prompt_for(7, 9);
  GenerationConfig cfg;
  cfg.max_new_tokens = 25;
  cfg.eos_token_ids = {95};
  const auto plain = Generator(p.target).generate(prompt, cfg);
  EXPECT_EQ(plain.stats.encoder_passes, 1);
  EXPECT_EQ(plain.stats.prompt_tokens, 9);
  const std::pair<std::shared_ptr<const Model>, int64_t> drafts[] = {
      {p.early_exit, 1}, {p.unrelated, 2}, {noisy_draft, 2}};
  for (const auto& [draft, passes] : drafts) {
    const auto r = Generator(p.target, draft).generate(prompt, cfg);
    EXPECT_EQ(r.tokens, plain.tokens);
    EXPECT_EQ(r.stats.encoder_passes, passes);
  }
  GenerationConfig lookup = cfg;
  lookup.prompt_lookup_num_tokens = 3;
  const auto r =
      Generator(p.target, p.unrelated).generate(prompt, lookup);  // the draft is not used
  EXPECT_EQ(r.tokens, plain.tokens);
  EXPECT_EQ(r.stats.encoder_passes, 1);
  EXPECT_EQ(r.stats.draft_passes, 0);
  // A different prompt changes the encoder's output and so the decoder's.
  EXPECT_NE(Generator(p.target).generate(prompt_for(8, 9), cfg).tokens, plain.tokens);
}

TEST(Exactness, T5VariantsGatedGeluUntiedHeadAndTiedHead) {
  // flan-t5 style (gated GELU, separate lm_head) and t5 style (ReLU, tied head scaled by
  // d_model^-0.5): cached decoding equals the uncached oracle and assisted output equals it.
  for (const bool gated : {true, false}) {
    FixtureOptions o = small_fixture(11, 3, "t5");
    o.gated_act = gated;
    o.tie_word_embeddings = !gated;
    const std::string key = gated ? "t5_gated" : "t5_tied";
    const std::string dir = cached_fixture(key, o);
    const std::string draft_dir = temp_dir(key + "_draft");
    make_draft_of(dir, draft_dir, 1);
    const auto target = test_model(dir), draft = test_model(draft_dir);
    EXPECT_EQ(target->config().is_gated_act, gated);
    EXPECT_EQ(target->config().hidden_act, gated ? "gelu_new" : "relu");
    const auto prompt = prompt_for(11, 6);
    GenerationConfig cfg;
    cfg.max_new_tokens = 20;
    cfg.eos_token_ids = {95};
    const auto want = oracle_greedy(*target, prompt, 20, {95});
    EXPECT_EQ(Generator(target).generate(prompt, cfg).tokens, want) << key;
    for (const char* schedule : {"constant", "heuristic", "dynamic"}) {
      cfg.num_assistant_tokens_schedule = schedule;
      const auto r = Generator(target, draft).generate(prompt, cfg);
      EXPECT_EQ(r.tokens, want) << key << " " << schedule;
      EXPECT_GT(r.stats.accepted_tokens, 0) << key << " " << schedule;
    }
  }
}

TEST(Exactness, PromptLookupCopiesAQuotedPassageOfABigramTarget) {
  // --exit-layers 0 --exit-scale 0: no layer changes the residual stream, so the next token depends
  // on the current one only, and the walk from token 5 is the same whatever precedes it.
  FixtureOptions o = small_fixture(3, 3);
  o.exit_layers = 0;
  o.exit_scale = 0.0;
  const auto target = test_model(cached_fixture("bigram", o));
  GenerationConfig cfg;
  cfg.max_new_tokens = 20;
  cfg.eos_token_ids = {-1};
  const auto walk = Generator(target).generate({5}, cfg).tokens;
  std::vector<int64_t> prompt = {7, 5};
  prompt.insert(prompt.end(), walk.begin(), walk.end());
  prompt.insert(prompt.end(), {9, 5});
  EXPECT_EQ(Generator(target).generate(prompt, cfg).tokens, walk);  // the output copies the quote
  cfg.prompt_lookup_num_tokens = 10;
  cfg.num_assistant_tokens_schedule = "constant";  // 10 every time (goodput starts from 5)
  const auto r = Generator(target).generate(prompt, cfg);
  EXPECT_EQ(r.tokens, walk);
  EXPECT_EQ(r.stats.accepted_tokens, r.stats.drafted_tokens);
  EXPECT_LE(r.stats.target_passes, 3);  // 20 tokens at up to 11 per pass
  GenerationConfig suffix = cfg;
  suffix.prompt_lookup_num_tokens = 0;
  suffix.suffix_speculation = true;
  EXPECT_EQ(Generator(target).generate(prompt, suffix).tokens, walk);
}

// Suffix speculation's trees (branches down to 2% of the mass) on every architecture: requests
// with different prompts through one Generator, each equal to target-only greedy, a repetition
// penalty (each node's scores follow its own path's tokens) or a logit bias too; the proposals did
// branch. T5
// verifies chains only: its rows propose chains.
TEST(Exactness, SuffixTreesGiveTargetOnlyTokensOnEveryArchitecture) {
  for (const char* arch :
       {"llama", "mistral", "qwen2", "qwen3", "gemma3", "gpt_neox", "gpt2", "opt", "t5"}) {
    const Pair p = pair_for(5, arch);
    Generator g(p.target);
    g.set_suffix_options(branching_suffix_trees());
    // Sampled answers first, so that the shared tree holds continuations that differ.
    for (uint64_t i = 0; i < 6; ++i) {
      GenerationConfig sampled;
      sampled.max_new_tokens = 40;
      sampled.do_sample = true;
      sampled.temperature = 1.5;
      sampled.seed = i;
      sampled.suffix_speculation = true;
      g.generate(prompt_for(i % 4, 3 + i), sampled);
    }
    int64_t trees_verified = 0;
    for (uint64_t i = 0; i < 8; ++i) {
      GenerationConfig cfg;
      cfg.max_new_tokens = 40;
      cfg.eos_token_ids = {95};
      cfg.repetition_penalty = i % 3 == 2 ? 1.3 : 1.0;
      if (i % 3 == 1) cfg.logit_bias = {{7, 3.0}, {12, -100}};
      const auto prompt = prompt_for(i % 4, 3 + i);
      const auto want = Generator(p.target).generate(prompt, cfg).tokens;
      cfg.suffix_speculation = true;
      cfg.num_assistant_tokens_schedule = "constant";
      cfg.num_assistant_tokens = 6;
      const GenerationResult r = g.generate(prompt, cfg);
      ASSERT_EQ(r.tokens, want) << arch << " request " << i;
      trees_verified += r.stats.tree_passes;
    }
    if (std::string(arch) == "t5")
      EXPECT_EQ(trees_verified, 0) << "T5 was proposed trees";
    else
      EXPECT_GT(trees_verified, 0) << arch << ": no proposal branched";
  }
}

// A draft model's trees (its 3 most probable tokens at each position) on every architecture, under
// constant K and goodput (whose cut keeps the candidates that pay), a repetition penalty or a logit
// bias too: each request equals target-only greedy, and trees were verified. T5 verifies chains
// only. A sampled request verifies trees too (its distribution: test_statistical.cpp).
TEST(Exactness, DraftTreesGiveTargetOnlyTokensOnEveryArchitecture) {
  for (const char* arch :
       {"llama", "mistral", "qwen2", "qwen3", "gemma3", "gpt_neox", "gpt2", "opt", "t5"}) {
    const Pair p = pair_for(6, arch);
    const Generator target_only(p.target);
    const Generator g(p.target, p.early_exit);
    int64_t trees_verified = 0;
    for (uint64_t i = 0; i < 6; ++i) {
      GenerationConfig cfg;
      cfg.max_new_tokens = 30;
      cfg.eos_token_ids = {95};
      cfg.repetition_penalty = i % 3 == 2 ? 1.3 : 1.0;
      if (i % 3 == 1) cfg.logit_bias = {{7, 3.0}, {12, -100}};
      const auto prompt = prompt_for(i, 2 + 2 * i);
      const auto want = target_only.generate(prompt, cfg).tokens;
      cfg.draft_tree_width = 3;
      cfg.num_assistant_tokens = 4;
      cfg.num_assistant_tokens_schedule = i % 2 ? "goodput" : "constant";
      const GenerationResult r = g.generate(prompt, cfg);
      ASSERT_EQ(r.tokens, want) << arch << " request " << i;
      trees_verified += r.stats.tree_passes;
    }
    GenerationConfig sampled;
    sampled.max_new_tokens = 20;
    sampled.do_sample = true;
    sampled.seed = 3;
    sampled.draft_tree_width = 3;
    const int64_t sampled_trees = g.generate(prompt_for(1, 5), sampled).stats.tree_passes;
    if (std::string(arch) == "t5") {
      EXPECT_EQ(trees_verified + sampled_trees, 0) << "T5 was proposed trees";
    } else {
      EXPECT_GT(trees_verified, 0) << arch << ": no tree verified";
      EXPECT_GT(sampled_trees, 0) << arch << ": a sampled request verified no tree";
    }
  }
}

// A second request with the prompt of a first one, through the same Generator, is proposed the
// first one's output: suffix speculation's shared tree. Without it (cache_tokens 0) the request
// has only its own prompt to copy from.
TEST(Exactness, SuffixSpeculationRemembersEarlierOutputs) {
  const Pair p = pair_for(3);
  const auto prompt = prompt_for(3, 6);
  GenerationConfig cfg;
  cfg.max_new_tokens = 40;
  cfg.eos_token_ids = {95};
  const auto want = Generator(p.target).generate(prompt, cfg).tokens;
  cfg.suffix_speculation = true;
  cfg.num_assistant_tokens_schedule = "constant";
  cfg.num_assistant_tokens = 8;
  SuffixOptions wide;
  wide.max_spec_factor = 4;
  Generator remembering(p.target);
  remembering.set_suffix_options(wide);
  const GenerationResult first = remembering.generate(prompt, cfg);
  EXPECT_EQ(first.tokens, want);
  EXPECT_EQ(remembering.suffix_cache()->tokens(),
            static_cast<int64_t>(prompt.size() + want.size()));  // 6 prompt tokens < 8 kept
  const GenerationResult second = remembering.generate(prompt, cfg);
  EXPECT_EQ(second.tokens, want);
  EXPECT_EQ(second.stats.accepted_tokens, second.stats.drafted_tokens);  // all of it, every time
  EXPECT_LE(second.stats.target_passes, 8);  // 40 tokens at up to 9 per pass
  EXPECT_LT(second.stats.target_passes, first.stats.target_passes);
  wide.cache_tokens = 0;
  Generator forgetting(p.target);
  forgetting.set_suffix_options(wide);
  forgetting.generate(prompt, cfg);
  const GenerationResult alone = forgetting.generate(prompt, cfg);
  EXPECT_EQ(alone.tokens, want);
  EXPECT_EQ(alone.stats.target_passes, first.stats.target_passes);
  EXPECT_EQ(forgetting.suffix_cache()->tokens(), 0);
}

TEST(Exactness, DraftEqualToTargetAcceptsEverything) {
  const Pair p = pair_for(4);
  const auto prompt = prompt_for(4, 3);
  for (int64_t k : {1, 2, 5, 8}) {
    for (int64_t n : {int64_t{1}, k, k + 1, int64_t{37}}) {
      GenerationConfig cfg;
      cfg.max_new_tokens = n;
      cfg.num_assistant_tokens = k;
      // constant: goodput, the greedy default, sees a draft as costly as the target never pay
      cfg.num_assistant_tokens_schedule = "constant";
      cfg.eos_token_ids = {95};
      const auto want = Generator(p.target).generate(prompt, cfg).tokens;
      const auto got = Generator(p.target, p.target).generate(prompt, cfg);
      EXPECT_EQ(got.tokens, want);
      if (static_cast<int64_t>(want.size()) == n) {
        EXPECT_LE(got.stats.target_passes, (n + k) / (k + 1)) << "K " << k << " n " << n;
        EXPECT_EQ(got.stats.accepted_tokens, got.stats.drafted_tokens);
      }
    }
  }
}

TEST(Exactness, UnrelatedDraftIsRarelyAcceptedButStillExact) {
  const Pair p = pair_for(5);
  const auto prompt = prompt_for(5, 4);
  GenerationConfig cfg;
  cfg.max_new_tokens = 37;
  cfg.num_assistant_tokens = 5;
  cfg.num_assistant_tokens_schedule = "constant";  // goodput, the greedy default, may not draft
  cfg.eos_token_ids = {95};
  const auto got = Generator(p.target, p.unrelated).generate(prompt, cfg);
  EXPECT_EQ(got.tokens, Generator(p.target).generate(prompt, cfg).tokens);
  EXPECT_LT(got.stats.acceptance_rate(), 0.35);
}

TEST(Exactness, EosInsideAnAcceptedBlockEndsGenerationThere) {
  for (const char* arch : {"llama", "t5"}) {
    const auto [p, prompt, probe, free_run] = eos_case(arch);
    ASSERT_GE(free_run.size(), 12u);
    // Make the token at position 9 the EOS: with a draft identical to the target it sits inside a
    // fully accepted block for K = 5 and 8.
    const int64_t eos = free_run[9];
    const size_t first = std::find(free_run.begin(), free_run.end(), eos) - free_run.begin();
    const std::vector<int64_t> expected(free_run.begin(), free_run.begin() + first + 1);
    for (int64_t k : {2, 5, 8}) {
      for (const auto& draft : {p.target, p.early_exit}) {
        GenerationConfig cfg = probe;
        cfg.eos_token_ids = {eos};
        cfg.num_assistant_tokens = k;
        // constant: goodput, the greedy default, may draft no block for the EOS to sit in
        cfg.num_assistant_tokens_schedule = "constant";
        std::vector<int64_t> streamed;
        const auto got =
            Generator(p.target, draft).generate(prompt, cfg, [&](const std::vector<int64_t>& t) {
              streamed.insert(streamed.end(), t.begin(), t.end());
            });
        EXPECT_EQ(got.tokens, expected) << arch << " K " << k;
        EXPECT_EQ(streamed, expected) << "nothing after EOS may be streamed";
        EXPECT_EQ(got.stats.stop_reason, "eos");
      }
    }
  }
}

// min_new_tokens keeps the EOS out until then (Hugging Face's MinNewTokensLengthLogitsProcessor):
// target-only, with a draft and with prompt lookup, the tokens are the slow oracle's, which masks
// the EOS logit by hand.
TEST(Exactness, MinNewTokensKeepsTheEosOutUntilThenUnderSpeculation) {
  for (const char* arch : {"llama", "t5"}) {
    const auto [p, prompt, probe, free_run] = eos_case(arch);
    ASSERT_GE(free_run.size(), 12u);
    const int64_t eos = free_run[2];  // would end the answer by its third token
    const auto want = oracle_greedy(*p.target, prompt, 30, {eos}, 8);
    const size_t first = std::find(want.begin(), want.end(), eos) - want.begin();
    ASSERT_GE(first, 8u) << arch << ": the oracle let the EOS in early";
    for (const bool lookup : {false, true})
      for (const auto& draft : {std::shared_ptr<const Model>(), p.target, p.early_exit}) {
        if (lookup && draft) continue;
        GenerationConfig cfg = probe;
        cfg.eos_token_ids = {eos};
        cfg.min_new_tokens = 8;
        cfg.num_assistant_tokens = 5;
        cfg.prompt_lookup_num_tokens = lookup ? 4 : 0;
        EXPECT_EQ(Generator(p.target, draft).generate(prompt, cfg).tokens, want)
            << arch
            << (lookup  ? " prompt lookup"
                : draft ? " draft"
                        : " target-only");
      }
    // Sampled: prompt lookup's proposals give a seed's target-only tokens, EOS-free until then.
    GenerationConfig sampled = probe;
    sampled.eos_token_ids = {eos};
    sampled.min_new_tokens = 8;
    sampled.do_sample = true;
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      sampled.seed = seed;
      sampled.prompt_lookup_num_tokens = 0;
      const auto alone = Generator(p.target).generate(prompt, sampled).tokens;
      EXPECT_GE(std::find(alone.begin(), alone.end(), eos) - alone.begin(), 8) << arch;
      sampled.prompt_lookup_num_tokens = 4;
      EXPECT_EQ(Generator(p.target).generate(prompt, sampled).tokens, alone)
          << arch << " seed " << seed;
    }
  }
}

TEST(Exactness, StatsAreConsistent) {
  const Pair p = pair_for(1);
  GenerationConfig cfg;
  cfg.max_new_tokens = 37;
  cfg.eos_token_ids = {95};
  cfg.num_assistant_tokens_schedule = "constant";  // goodput, the greedy default, may not draft
  const auto r = Generator(p.target, p.early_exit).generate(prompt_for(1, 5), cfg);
  int64_t drafted = 0, accepted = 0, emitted = 0;
  for (const auto& t : r.stats.trace) drafted += t[0], accepted += t[1], emitted += t[1] + 1;
  EXPECT_EQ(drafted, r.stats.drafted_tokens);
  EXPECT_EQ(accepted, r.stats.accepted_tokens);
  EXPECT_EQ(emitted, r.stats.new_tokens);
  EXPECT_EQ(r.stats.target_passes, static_cast<int64_t>(r.stats.trace.size()));
  EXPECT_EQ(r.stats.draft_passes, r.stats.drafted_tokens);  // greedy draft: one pass per token
  EXPECT_GT(r.stats.accepted_tokens, 0);
  ASSERT_FALSE(r.stats.accepted_at_position.empty());
  EXPECT_EQ(r.stats.accepted_at_position[0] + 0,
            std::count_if(r.stats.trace.begin(), r.stats.trace.end(),
                          [](const auto& t) { return t[1] >= 1; }));
}

TEST(Exactness, BadRequestsAreRejectedClearly) {
  const Pair p = pair_for(1);
  GenerationConfig cfg;
  EXPECT_THROW(Generator(p.target).generate({}, cfg), Error);
  EXPECT_THROW(Generator(p.target).generate({1000}, cfg), Error);
  cfg.max_new_tokens = 0;
  EXPECT_THROW(Generator(p.target).generate({1}, cfg), Error);
  cfg.max_new_tokens = 3000;  // past max_position_embeddings (2048)
  EXPECT_THROW(Generator(p.target).generate({1}, cfg), Error);
  FixtureOptions eos = small_fixture(9, 1);
  eos.eos_token_id = 7;
  const auto wrong_eos = test_model(cached_fixture("eos7", eos));
  EXPECT_THROW(Generator(p.target, wrong_eos), Error);
  // Encoder-decoder with decoder-only, either way round, and a different decoder start token.
  const Pair t5 = pair_for(7, "t5");
  EXPECT_THROW(Generator(p.target, t5.early_exit), Error);
  EXPECT_THROW(Generator(t5.target, p.early_exit), Error);
  FixtureOptions start = small_fixture(9, 1, "t5");
  start.pad_token_id = 3;
  EXPECT_THROW(Generator(t5.target, test_model(cached_fixture("t5start3", start))), Error);
  EXPECT_THROW(p.target->encode(at::zeros({1, 2}, at::kLong)), Error);  // decoder-only: no encoder
  GenerationConfig ok;
  EXPECT_THROW(Generator(t5.target).generate({}, ok), Error);    // empty encoder input
  EXPECT_THROW(Generator(t5.target).generate({96}, ok), Error);  // outside the vocabulary
}

// A copy of the early-exit draft whose vocabulary is cut to `vocab` rows or padded to it with
// random rows (as checkpoints padded to a multiple of 64 or 128 are).
std::shared_ptr<const Model> resized_draft(uint64_t seed, int64_t vocab) {
  const std::string from = temp_dir("resize_from");
  make_draft_of(cached_fixture("t" + std::to_string(seed) + "llama", small_fixture(seed, 3)), from,
                1);
  const std::string dir = temp_dir("resized_" + std::to_string(vocab));
  WeightStore w(from);
  std::map<std::string, at::Tensor> t;
  for (const std::string& name : w.names()) {
    at::Tensor x = w.load(name, at::kFloat, c10::Device(c10::kCPU));
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
      x = vocab <= x.size(0) ? x.narrow(0, 0, vocab).clone()
                             : at::cat({x, 0.1 * at::randn({vocab - x.size(0), x.size(1)})});
    }
    t[name] = x;
  }
  save_safetensors(dir + "/model.safetensors", t);
  nlohmann::json c = read_json(from + "/config.json");
  c["vocab_size"] = vocab;
  write_file(dir + "/config.json", c.dump());
  return load_model(dir, test_load_options());
}

TEST(Exactness, DraftVocabularyPaddedOrCutStaysExact) {
  // Target vocabulary 96. A draft with 64 ids cannot propose ids 64-95 (q = 0 there) and stops
  // proposing once the sequence holds one; a draft with 128 ids has padding rows the target never
  // uses. Both stay exact and are accepted where they agree.
  const Pair p = pair_for(1);
  for (int64_t vocab : {64, 128}) {
    const auto draft = resized_draft(1, vocab);
    for (bool sample : {false, true}) {
      GenerationConfig cfg;
      cfg.max_new_tokens = 37;
      cfg.eos_token_ids = {95};
      cfg.do_sample = sample;
      cfg.seed = 5;
      // constant (sampling's default too): goodput, the greedy default, may not draft
      cfg.num_assistant_tokens_schedule = "constant";
      const std::vector<int64_t> prompt = {3, 10, 21, 33, 40, 52, 63};  // ids every draft has
      const auto got = Generator(p.target, draft).generate(prompt, cfg);
      if (!sample) EXPECT_EQ(got.tokens, Generator(p.target).generate(prompt, cfg).tokens) << vocab;
      for (int64_t id : got.tokens) EXPECT_LT(id, 96);
      EXPECT_GT(got.stats.accepted_tokens, 0) << vocab << (sample ? " sampling" : " greedy");
    }
  }
}

// A prompt longer than a chunk goes in before the first iteration in passes of at most 256 tokens
// (kPrefillChunk: masks of chunk x context, not prompt x prompt), the draft's share too, and the
// output is the one the slow oracle gives: target-only, with a draft, with prompt lookup, and as a
// row of a batch beside a short prompt.
TEST(Exactness, ALongPromptIsPrefilledInChunks) {
  const Pair p = pair_for(1);
  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < 600; ++i) prompt.push_back((i * 37 + i / 7) % 90);
  GenerationConfig cfg;
  cfg.max_new_tokens = 12;
  cfg.eos_token_ids = {95};
  const auto want = oracle_greedy(*p.target, prompt, 12, {95});
  GenerationConfig lookup = cfg;
  lookup.prompt_lookup_num_tokens = 4;
  for (const char* name : {"target only", "draft", "prompt lookup"}) {
    const bool draft = name[0] == 'd', prompt_lookup = name[0] == 'p';
    const auto got = Generator(p.target, draft ? p.early_exit : nullptr)
                         .generate(prompt, prompt_lookup ? lookup : cfg);
    EXPECT_EQ(got.tokens, want) << name;
    EXPECT_EQ(got.stats.prefill_passes, 3) << name;  // 599 tokens: 256 + 256 + 87
  }
  const std::vector<int64_t> short_prompt = {3, 10, 21};
  const auto batch =
      Generator(p.target, p.early_exit).generate_batch({short_prompt, prompt}, {cfg});
  EXPECT_EQ(batch.results[1].tokens, want);
  EXPECT_EQ(batch.results[0].tokens, oracle_greedy(*p.target, short_prompt, 12, {95}));
  // A prompt within one chunk keeps Hugging Face's first pass over all of it.
  EXPECT_EQ(Generator(p.target).generate(short_prompt, cfg).stats.prefill_passes, 0);
}

// A request the draft cannot follow (its prompt holds an id the draft has no row for) proposes
// nothing; under "heuristic" it leaves the lookahead where it was, so the next request starts from
// num_assistant_tokens (counted as all accepted, it grew by 2 per iteration and was carried on).
TEST(Exactness, ARowTheDraftCannotFollowLeavesTheHeuristicLookahead) {
  const Pair p = pair_for(1);
  const Generator g(p.target, resized_draft(1, 64));
  GenerationConfig cfg;
  cfg.max_new_tokens = 30;
  cfg.eos_token_ids = {95};
  cfg.num_assistant_tokens = 3;
  cfg.num_assistant_tokens_schedule = "heuristic";
  const auto lost = g.generate({3, 70, 21}, cfg);  // 70: not in the draft's vocabulary
  EXPECT_EQ(lost.stats.drafted_tokens, 0);
  EXPECT_EQ(lost.tokens, Generator(p.target).generate({3, 70, 21}, cfg).tokens);
  const auto next = g.generate({3, 10, 21, 33}, cfg);
  ASSERT_FALSE(next.stats.trace.empty());
  EXPECT_LE(next.stats.trace[0][0], 3);
}

}  // namespace
}  // namespace specdec::test
