// Feature-fed (EAGLE-style) drafts: the target's cache keeps each position's last-layer hidden
// state, and the draft's input at position p is fc([embed(x_p); h_{p-1}]), with the target's h
// where it has verified the sequence and the draft's own output past that, RMS-normed. Checked
// against oracles that do not use the draft code: the hidden states against the target's logits and
// embeddings; the proposals against the draft's math by hand (layers that add nothing) and against
// fresh runs on the verified sequence; generation against the target-only greedy output and bad
// pairs.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "test_util.hpp"

namespace specdec::test {
namespace {

const c10::Device kCpu(c10::kCPU);

// A bigram target: its layers add nothing to the residual stream (exit_layers 0, scale 0), so its
// last-layer hidden state at p is embed(x_p) exactly and its next token depends on x_p only.
std::string bigram_target() {
  FixtureOptions o = small_fixture(41, 2);
  o.exit_layers = 0;
  o.exit_scale = 0.0;
  return cached_fixture("ff_bigram_target", o);
}

// A 1-layer feature-fed draft of `target` whose layer adds nothing: the target's embeddings, final
// norm and head, and fc = [I, mix * M] (M random): its output at p is embed(x_p) + mix * M
// n(h_{p-1}), n the RMS norm with a random weight (fc_norm).
std::string passive_draft(const std::string& target, double mix, const std::string& name) {
  const std::string dir = temp_dir(name);
  const WeightStore w(target);
  std::map<std::string, at::Tensor> t;
  for (const std::string& n : w.names())
    if (n.rfind("model.layers.", 0) != 0 || n.rfind("model.layers.0.", 0) == 0)
      t[n] = w.load(n, at::kFloat, kCpu);
  t["model.layers.0.self_attn.o_proj.weight"].zero_();
  t["model.layers.0.mlp.down_proj.weight"].zero_();
  const int64_t h = t["model.norm.weight"].size(0);
  at::manual_seed(7);
  t["fc_norm.weight"] = 0.5 + at::rand({h});
  t["fc.weight"] =
      at::cat({at::eye(h), mix * at::randn({h, h}) / std::sqrt(static_cast<double>(h))}, 1)
          .contiguous();
  save_safetensors(dir + "/model.safetensors", t);
  nlohmann::json c = read_json(target + "/config.json");
  c["num_hidden_layers"] = 1;
  c["specdec_feature_size"] = h;
  write_file(dir + "/config.json", c.dump());
  write_file(dir + "/generation_config.json", read_file(target + "/generation_config.json"));
  return dir;
}

std::vector<int64_t> ids(uint64_t seed, size_t n) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back(static_cast<int64_t>((seed * 31 + i * 17 + 7) % 90) + 3);
  return out;
}

at::Tensor row_ids(const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).view({1, -1}); }

// Options for a feature-fed draft reading `target`'s hidden states.
DraftModelGenerator::Options fed_by(const KVCache& target) {
  DraftModelGenerator::Options o;
  o.target_cache = &target;
  return o;
}

template <class F>
void expect_error(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one saying '" << part << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

}  // namespace

// The hidden states a cache keeps are the last layer's output: through the final norm and head
// they give the logits (computed here from the stored weights), and for the bigram target they are
// its embeddings bitwise. One prefill and one-token steps keep the same values.
TEST(FeatureDraft, CacheKeepsTheLastLayersHiddenStates) {
  c10::InferenceMode guard;
  for (const std::string& dir :
       {cached_fixture("ff_target", small_fixture(43, 2)), bigram_target()}) {
    const auto model = load_model(dir, test_load_options());
    const WeightStore w(dir);
    const std::vector<int64_t> seq = ids(3, 9);
    KVCache whole = model->make_cache(16, 1, true), steps = model->make_cache(16, 1, true);
    ASSERT_TRUE(whole.keeps_hidden());
    EXPECT_FALSE(model->make_cache(16).keeps_hidden());
    const at::Tensor logits = model->forward(row_ids(seq), whole).cpu();  // [1, T, V]
    for (const int64_t id : seq) (void)model->forward(row_ids({id}), steps);
    const auto n = static_cast<int64_t>(seq.size());
    const at::Tensor h = whole.hidden()[0].narrow(0, 0, n).cpu().to(at::kDouble);  // [T, H]
    EXPECT_TRUE(at::equal(whole.hidden().narrow(1, 0, n), steps.hidden().narrow(1, 0, n))) << dir;
    const at::Tensor norm = w.load("model.norm.weight", at::kDouble, kCpu);
    const at::Tensor head = w.load("lm_head.weight", at::kDouble, kCpu);
    const double eps = model->config().rms_norm_eps;
    const at::Tensor normed = h * at::rsqrt(h.pow(2).mean(-1, true) + eps) * norm;
    EXPECT_TRUE(at::allclose(normed.matmul(head.t()), logits[0].to(at::kDouble), 1e-4, 1e-4))
        << dir;
    if (dir == bigram_target()) {
      const at::Tensor embed = w.load("model.embed_tokens.weight", at::kFloat, kCpu);
      EXPECT_TRUE(at::equal(whole.hidden()[0].narrow(0, 0, n).cpu(),
                            embed.index_select(0, at::tensor(seq))));
    }
    whole.crop(0, 4);
    KVCache copy = model->make_cache(16, 2, true);
    copy.copy_row(whole, 0, 1);
    EXPECT_TRUE(at::equal(copy.hidden()[1].narrow(0, 0, 4), whole.hidden()[0].narrow(0, 0, 4)));
  }
}

// Proposals through generation-like rounds (the target verifies, some candidates are rejected)
// against the draft's math done by hand: with a passive layer and the bigram target, the first
// token at position p comes from embed(x_p) + mix * M embed(x_{p-1}) and each later one from its
// own predecessor's output. Tokens are compared where the oracle's best score leads by a margin.
TEST(FeatureDraft, ProposalsFollowTheTargetsHiddenStatesThenTheDraftsOwn) {
  c10::InferenceMode guard;
  const std::string tdir = bigram_target();
  const std::string ddir = passive_draft(tdir, 1.5, "ff_passive_mixed");
  const auto target = load_model(tdir, test_load_options());
  const auto draft = load_model(ddir, test_load_options());
  const WeightStore w(ddir);
  const at::Tensor embed = w.load("model.embed_tokens.weight", at::kDouble, kCpu);
  const at::Tensor fc = w.load("fc.weight", at::kDouble, kCpu);
  const at::Tensor fc_norm = w.load("fc_norm.weight", at::kDouble, kCpu);
  const at::Tensor norm = w.load("model.norm.weight", at::kDouble, kCpu);
  const at::Tensor head = w.load("lm_head.weight", at::kDouble, kCpu);
  const double eps = draft->config().rms_norm_eps;
  const auto step = [&](int64_t token, const at::Tensor& feature) {  // -> (output [H], scores [V])
    const at::Tensor normed = feature * at::rsqrt(feature.pow(2).mean() + eps) * fc_norm;
    const at::Tensor out = fc.matmul(at::cat({embed[token], normed}));
    return std::make_pair(out, (out * at::rsqrt(out.pow(2).mean() + eps) * norm).matmul(head.t()));
  };

  GenerationConfig cfg;
  cfg.max_new_tokens = 40;
  cfg.num_assistant_tokens_schedule = "constant";  // 4 per round (goodput would probe with 2)
  LookaheadSchedule schedule(cfg);
  Rng rng(0);
  std::vector<int64_t> seq = ids(5, 7);
  KVCache cache = target->make_cache(64, 1, true);
  DraftModelGenerator gen(draft, {{&cfg, &schedule, &rng}}, 64, fed_by(cache));
  int64_t compared = 0, rounds_with_proposals = 0, rejections = 0;
  for (int round = 0; round < 12; ++round) {
    const Candidates c = gen.propose_batch({&seq}, {4})[0];
    if (round == 0) EXPECT_EQ(c.size(), 0u) << "no proposals before the target's first pass";
    if (c.size() > 0) {
      ++rounds_with_proposals;
      at::Tensor feature =
          embed[seq[seq.size() - 2]];  // the target's h at the second-to-last position
      int64_t token = seq.back();
      for (const int64_t proposed : c.tokens) {
        auto [out, scores] = step(token, feature);
        const auto top = scores.topk(2);
        const at::Tensor values = std::get<0>(top);
        if ((values[0] - values[1]).item<double>() > 1e-3) {
          EXPECT_EQ(proposed, std::get<1>(top)[0].item<int64_t>()) << "round " << round;
          ++compared;
        }
        feature = out;
        token = proposed;
      }
    }
    // The target verifies: [uncached tokens, candidates]; greedy prefix match plus its own token.
    std::vector<int64_t> input(seq.begin() + cache.length(0), seq.end());
    input.insert(input.end(), c.tokens.begin(), c.tokens.end());
    const int64_t before = static_cast<int64_t>(seq.size());
    const at::Tensor best =
        target->forward(row_ids(input), cache, static_cast<int64_t>(c.size()) + 1)[0]
            .argmax(-1)
            .cpu();
    int64_t accepted = 0;
    while (accepted < static_cast<int64_t>(c.size()) &&
           best[accepted].item<int64_t>() == c.tokens[accepted])
      ++accepted;
    rejections += accepted < static_cast<int64_t>(c.size());
    cache.crop(0, before + accepted);
    seq.insert(seq.end(), c.tokens.begin(), c.tokens.begin() + accepted);
    seq.push_back(best[accepted].item<int64_t>());
    gen.on_verified_row(0, c, accepted, seq);
  }
  EXPECT_GE(rounds_with_proposals, 11);
  EXPECT_GT(rejections, 0);
  EXPECT_GT(compared, 20);
}

// With a draft whose layer attends (so stale keys and values would show), every proposal equals the
// one a fresh draft makes on the verified sequence beside a fresh target cache, bitwise-exact
// kernels making the two the same: positions computed from the draft's own predicted hidden states
// are recomputed from the target's once it has verified them.
TEST(FeatureDraft, ProposalsEqualAFreshRunOnTheVerifiedSequence) {
  c10::InferenceMode guard;
  const auto target = test_model(cached_fixture("ff_target", small_fixture(43, 2)));
  FixtureOptions d = small_fixture(44, 1);
  d.feature_fed = true;
  const auto draft = test_model(cached_fixture("ff_draft", d));
  GenerationConfig cfg;
  cfg.max_new_tokens = 40;
  cfg.num_assistant_tokens_schedule = "constant";  // 3 per round (goodput would probe with 2)
  LookaheadSchedule schedule(cfg), fresh_schedule(cfg);
  Rng rng(0);
  std::vector<int64_t> seq = ids(9, 6);
  KVCache cache = target->make_cache(64, 1, true);
  DraftModelGenerator gen(draft, {{&cfg, &schedule, &rng}}, 64, fed_by(cache));
  int64_t checked = 0;
  for (int round = 0; round < 10; ++round) {
    const Candidates c = gen.propose_batch({&seq}, {3})[0];
    if (c.size() > 0) {
      KVCache fresh_cache = target->make_cache(64, 1, true);
      (void)target->forward(row_ids(std::vector<int64_t>(seq.begin(), seq.end() - 1)), fresh_cache,
                            Model::kCacheOnly);
      DraftModelGenerator fresh(draft, {{&cfg, &fresh_schedule, &rng}}, 64, fed_by(fresh_cache));
      EXPECT_EQ(fresh.propose_batch({&seq}, {3})[0].tokens, c.tokens) << "round " << round;
      ++checked;
    }
    std::vector<int64_t> input(seq.begin() + cache.length(0), seq.end());
    input.insert(input.end(), c.tokens.begin(), c.tokens.end());
    const int64_t before = static_cast<int64_t>(seq.size());
    const at::Tensor best =
        target->forward(row_ids(input), cache, static_cast<int64_t>(c.size()) + 1)[0]
            .argmax(-1)
            .cpu();
    // Accept one candidate when there are several, whatever the target says: the draft must
    // recompute what it drafted past the verified sequence (the target's tokens decide nothing
    // here).
    const int64_t accepted = std::min<int64_t>(1, static_cast<int64_t>(c.size()));
    cache.crop(0, before + accepted);
    seq.insert(seq.end(), c.tokens.begin(), c.tokens.begin() + accepted);
    seq.push_back(best[accepted].item<int64_t>());
    gen.on_verified_row(0, c, accepted, seq);
  }
  EXPECT_GE(checked, 9);
}

// Greedy output with a feature-fed draft equals the target's own, for one request under every
// schedule, K and tree width (chains and the draft's top 3 per position), for a batch of ragged
// prompts with continuous batching (trees), and through a PromptCache; a draft that copies the
// bigram target's prediction is accepted every time it drafts.
TEST(FeatureDraft, GreedyOutputEqualsTargetOnly) {
  const auto target = test_model(cached_fixture("ff_target", small_fixture(43, 2)));
  FixtureOptions d = small_fixture(44, 1);
  d.feature_fed = true;
  const auto draft = test_model(cached_fixture("ff_draft", d));
  const Generator gen(target, draft);
  const std::vector<int64_t> eos = target->config().eos_token_ids;
  for (const char* schedule : {"constant", "heuristic", "dynamic", "goodput"})
    for (const int64_t k : {1, 2, 5})
      for (const int64_t width : {1, 3}) {
        GenerationConfig cfg;
        cfg.max_new_tokens = 24;
        cfg.num_assistant_tokens = k;
        cfg.num_assistant_tokens_schedule = schedule;
        cfg.draft_tree_width = width;
        const std::vector<int64_t> prompt = ids(k, 5 + k);
        const GenerationResult r = gen.generate(prompt, cfg);
        const std::string where =
            std::string(schedule) + " K=" + std::to_string(k) + " W=" + std::to_string(width);
        EXPECT_EQ(r.tokens, oracle_greedy(*target, prompt, 24, eos)) << where;
        // (goodput may stop drafting once it has seen this random draft's acceptance.)
        if (std::string(schedule) == "goodput") continue;
        EXPECT_GT(r.stats.drafted_tokens, 0) << where;
        if (width > 1) EXPECT_GT(r.stats.tree_passes, 0) << where;
      }
  GenerationConfig cfg;
  cfg.max_new_tokens = 20;
  cfg.num_assistant_tokens = 3;
  cfg.draft_tree_width = 3;
  std::vector<std::vector<int64_t>> prompts;
  for (size_t i = 0; i < 5; ++i) prompts.push_back(ids(20 + i, 3 + 4 * i));
  BatchOptions options;
  options.max_rows = 3;
  const BatchResult b = gen.generate_batch(prompts, {cfg}, {}, options);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(b.results[i].tokens, oracle_greedy(*target, prompts[i], 20, eos)) << "row " << i;
  PromptCache pc;
  std::vector<int64_t> conversation = ids(30, 8);
  for (int turn = 0; turn < 3; ++turn) {
    const GenerationResult r = gen.generate(conversation, cfg, pc);
    EXPECT_EQ(r.tokens, oracle_greedy(*target, conversation, 20, eos)) << "turn " << turn;
    if (turn > 0) EXPECT_GT(r.stats.cached_prompt_tokens, 0);
    conversation.insert(conversation.end(), r.tokens.begin(), r.tokens.end());
    for (const int64_t id : ids(40 + turn, 3)) conversation.push_back(id);
  }

  const std::string bt = bigram_target();
  const auto bigram = test_model(bt);
  const Generator copy(bigram, test_model(passive_draft(bt, 0.0, "ff_passive_copy")));
  cfg.max_new_tokens = 30;
  cfg.draft_tree_width = 1;
  cfg.num_assistant_tokens_schedule = "constant";  // goodput, the greedy default, may not draft
  const GenerationResult r = copy.generate(ids(50, 6), cfg);
  EXPECT_EQ(r.tokens, oracle_greedy(*bigram, ids(50, 6), 30, eos));
  EXPECT_GT(r.stats.drafted_tokens, 0);
  EXPECT_EQ(r.stats.accepted_tokens, r.stats.drafted_tokens);
}

TEST(FeatureDraft, BadPairsAndMissingFeaturesAreClearErrors) {
  FixtureOptions d = small_fixture(44, 1);
  d.feature_fed = true;
  const auto draft = test_model(cached_fixture("ff_draft", d));
  FixtureOptions wide = small_fixture(45, 1);
  wide.hidden = 128;
  const auto other = test_model(cached_fixture("ff_wide_target", wide));
  expect_error([&] { Generator g(other, draft); }, "hidden_size");
  {
    c10::InferenceMode guard;
    KVCache cache = draft->make_cache(8);
    expect_error([&] { (void)draft->forward(row_ids({3, 4}), cache); }, "feature source");
    KVCache plain = test_model(cached_fixture("ff_target", small_fixture(43, 2)))->make_cache(8);
    GenerationConfig cfg;
    LookaheadSchedule s(cfg);
    Rng rng(0);
    expect_error(
        [&] {
          DraftModelGenerator g(draft, {{&cfg, &s, &rng}}, 8, fed_by(plain));
        },
        "keeping hidden states");
  }
  const std::string dir = temp_dir("ff_bad_size");
  const std::string from = cached_fixture("ff_draft", d);
  nlohmann::json c = read_json(from + "/config.json");
  c["specdec_feature_size"] = 32;
  write_file(dir + "/config.json", c.dump());
  expect_error([&] { (void)load_model(dir, test_load_options()); },
               "specdec_feature_size must be 0 or hidden_size");
}

}  // namespace specdec::test
