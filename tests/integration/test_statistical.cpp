// Speculative sampling keeps the target's distribution: chi-square goodness of fit of the 1st, 2nd
// and 3rd generated token under assisted sampling against the exact target probabilities,
// computed from the model by enumerating every prefix. Fixed seeds: deterministic in CI, but for
// goodput with a draft model, whose K (and so which draws a seed's tokens take) follows measured
// timings: those runs draw new samples each time and are judged at 0.01% (kTimed), not 0.1%, so
// that a correct run fails about once in 3000 rather than 300. A negative control (a verifier that
// accepts every draft token) must be rejected by the 0.1% test.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include <cmath>

#include "test_util.hpp"

namespace specdec::test {
namespace {

constexpr int64_t kVocab = 16;
constexpr int kSamples = 3000;

FixtureOptions tiny(uint64_t seed, int64_t layers) {
  FixtureOptions o;
  o.seed = seed;
  o.layers = layers;
  o.hidden = 32;
  o.heads = 2;
  o.intermediate = 64;
  o.vocab = kVocab;
  o.init_std = 0.35;  // spread-out but non-uniform next-token distributions
  o.eos_token_id = 15;
  return o;
}

// Exact marginal distributions of generated tokens 1..3 of the target alone under `cfg`.
// Encoder-decoder models: the prompt is encoded once and the decoder starts from its start token.
std::vector<std::vector<double>> exact_marginals(const Model& m,
                                                 const std::vector<int64_t>& encoder_prompt,
                                                 const GenerationConfig& cfg) {
  c10::InferenceMode guard;
  const LogitsProcessorChain chain(cfg);
  const bool enc_dec = m.config().is_encoder_decoder;
  const at::Tensor states =
      enc_dec ? m.encode(at::tensor(encoder_prompt, at::kLong).view({1, -1})) : at::Tensor();
  const std::vector<int64_t> prompt =
      enc_dec ? std::vector<int64_t>{*m.config().decoder_start_token_id} : encoder_prompt;
  const auto next = [&](const std::vector<int64_t>& seq) {
    KVCache cache = m.make_cache(static_cast<int64_t>(seq.size()));
    if (enc_dec) m.attach_encoder(states, cache);
    at::Tensor s = m.forward(at::tensor(seq, at::kLong).view({1, -1}), cache, 1)[0];  // [1, V]
    s = chain.apply(s, seq).softmax(-1)[0].to(at::kDouble).cpu();
    return std::vector<double>(s.data_ptr<double>(), s.data_ptr<double>() + kVocab);
  };
  std::vector<std::vector<double>> marg(3, std::vector<double>(kVocab, 0.0));
  const auto p1 = next(prompt);
  for (int64_t a = 0; a < kVocab; ++a) {
    if (p1[a] == 0) continue;
    marg[0][a] += p1[a];
    if (a == 15) continue;  // EOS ends the sequence: no 2nd/3rd token on that branch
    auto s1 = prompt;
    s1.push_back(a);
    const auto p2 = next(s1);
    for (int64_t b = 0; b < kVocab; ++b) {
      if (p2[b] == 0) continue;
      marg[1][b] += p1[a] * p2[b];
      if (b == 15) continue;
      auto s2 = s1;
      s2.push_back(b);
      const auto p3 = next(s2);
      for (int64_t c = 0; c < kVocab; ++c) marg[2][c] += p1[a] * p2[b] * p3[c];
    }
  }
  return marg;
}

// Upper quantiles of N(0, 1): 0.1% (every fixed-seed run) and 0.01% (runs whose samples follow
// timings).
constexpr double kFixed = 3.090, kTimed = 3.719;

// Chi-square statistic and its critical value at the level of `z` (Wilson-Hilferty), pooling cells
// with an expected count below 5. `total` is the number of sequences that reached this position.
bool chi_square_passes(const std::vector<int>& observed, const std::vector<double>& probs,
                       std::string* report, double z = kFixed) {
  double mass = 0;
  int total = 0;
  for (size_t i = 0; i < probs.size(); ++i) mass += probs[i], total += observed[i];
  double stat = 0, pooled_e = 0, pooled_o = 0;
  int bins = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double e = total * probs[i] / mass;
    if (e < 5) {
      pooled_e += e, pooled_o += observed[i];
      if (e == 0 && observed[i] > 0) {
        *report = "token " + std::to_string(i) + " has probability 0 but was drawn";
        return false;
      }
      continue;
    }
    stat += (observed[i] - e) * (observed[i] - e) / e;
    ++bins;
  }
  if (pooled_e >= 5) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++bins;
  }
  const double df = std::max(1, bins - 1);
  const double crit = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
  *report = "chi2 " + std::to_string(stat) + " critical " + std::to_string(crit) + " df " +
            std::to_string(static_cast<int>(df)) + " n " + std::to_string(total);
  return stat <= crit;
}

struct Outcome {
  bool all_pass = true;
  std::string report;
  double acceptance = 0;
  int64_t rejections = 0;   // iterations that rejected a candidate, EOS endings excluded
  int64_t tree_passes = 0;  // iterations that verified a tree (GenerationStats::tree_passes)
};

// `batch` > 1: the samples run through generate_batch, batch - 1 of them per call beside a longer
// distractor prompt (its own seed and lookahead), so rows of different lengths share every pass.
// `suffix`: the Generator's suffix speculation options.
Outcome run(const std::shared_ptr<const Model>& target, const std::shared_ptr<const Model>& draft,
            const GenerationConfig& base, std::shared_ptr<const Verifier> verifier = nullptr,
            int batch = 1, const SuffixOptions& suffix = {}, double z = kFixed) {
  const std::vector<int64_t> prompt = {3, 7, 1};
  const auto marg = exact_marginals(*target, prompt, base);
  Generator gen(target, draft);
  gen.set_suffix_options(suffix);
  if (verifier) gen.set_verifier(std::move(verifier));
  std::vector<std::vector<int>> counts(3, std::vector<int>(kVocab, 0));
  int64_t drafted = 0, accepted = 0, rejections = 0, tree_passes = 0;
  std::vector<GenerationResult> results;
  for (int i = 0; i < kSamples; i += std::max(1, batch - 1)) {
    GenerationConfig cfg = base;
    cfg.seed = 1000 + i;
    if (batch == 1) {
      results.push_back(gen.generate(prompt, cfg));
      continue;
    }
    std::vector<std::vector<int64_t>> prompts = {{2, 9, 4, 11, 6, 5, 8}};
    GenerationConfig distractor = base;
    distractor.seed = 7 + i;
    distractor.num_assistant_tokens = base.num_assistant_tokens + 3;
    distractor.max_new_tokens = 1 + i % 5;
    std::vector<GenerationConfig> configs = {distractor};
    for (int j = i; j < std::min(kSamples, i + batch - 1); ++j) {
      prompts.push_back(prompt);
      configs.push_back(cfg);
      configs.back().seed = 1000 + j;
    }
    BatchResult b = gen.generate_batch(prompts, configs);
    results.insert(results.end(), b.results.begin() + 1, b.results.end());
  }
  for (const GenerationResult& r : results) {
    for (size_t pos = 0; pos < r.tokens.size() && pos < 3; ++pos) ++counts[pos][r.tokens[pos]];
    drafted += r.stats.drafted_tokens;
    accepted += r.stats.accepted_tokens;
    tree_passes += r.stats.tree_passes;
    for (size_t t = 0; t < r.stats.trace.size(); ++t) {
      const bool eos_end = t + 1 == r.stats.trace.size() && r.stats.stop_reason == "eos";
      if (r.stats.trace[t][1] < r.stats.trace[t][0] && !eos_end) ++rejections;
    }
  }
  Outcome o;
  o.acceptance = drafted ? static_cast<double>(accepted) / drafted : 0;
  o.rejections = rejections;
  o.tree_passes = tree_passes;
  for (int pos = 0; pos < 3; ++pos) {
    std::string rep;
    const bool ok = chi_square_passes(counts[pos], marg[pos], &rep, z);
    o.all_pass = o.all_pass && ok;
    o.report +=
        "token " + std::to_string(pos + 1) + ": " + rep + (ok ? "" : "  <-- REJECTED") + "\n";
  }
  return o;
}

struct Models {
  std::shared_ptr<const Model> target, unrelated;
};
Models models() {
  return {test_model(cached_fixture("stat_target", tiny(21, 2))),
          test_model(cached_fixture("stat_unrelated", tiny(99, 1)))};
}

GenerationConfig sampling(double temperature, int64_t top_k, double top_p) {
  GenerationConfig c;
  c.do_sample = true;
  c.temperature = temperature;
  c.top_k = top_k;
  c.top_p = top_p;
  c.max_new_tokens = 3;
  c.num_assistant_tokens = 2;
  return c;
}

struct Case {
  const char* name;
  GenerationConfig cfg;
};
const Case kCases[] = {{"temperature 1", sampling(1.0, 0, 1.0)},
                       {"temperature 0.7 top-k 4", sampling(0.7, 4, 1.0)},
                       {"top-p 0.8", sampling(1.0, 0, 0.8)}};

TEST(Statistical, TargetOnlySamplingMatchesExactProbabilities) {
  const Models m = models();
  const Outcome o = run(m.target, nullptr, kCases[0].cfg);
  EXPECT_TRUE(o.all_pass) << o.report;
}

TEST(Statistical, DraftEqualToTargetKeepsDistribution) {
  const Models m = models();
  for (const auto& c : kCases) {
    const Outcome o = run(m.target, m.target, c.cfg);
    EXPECT_TRUE(o.all_pass) << c.name << "\n" << o.report;
    // p and q agree up to float rounding (one multi-token pass vs cached single steps), so
    // min(1, p/q) is 1 or within ~1e-6 of it: a rejection not caused by EOS is all but impossible.
    EXPECT_LE(o.rejections, 1) << c.name;
  }
}

TEST(Statistical, UnrelatedDraftKeepsDistribution) {
  const Models m = models();
  for (const auto& c : kCases) {
    const Outcome o = run(m.target, m.unrelated, c.cfg);
    EXPECT_TRUE(o.all_pass) << c.name << "\n" << o.report;
    EXPECT_LT(o.acceptance, 0.9) << c.name;
  }
}

// goodput picks each iteration's K from measured timings and the acceptance so far (0 allowed):
// a choice made before the iteration's draws, so the distribution must stay the target's.
TEST(Statistical, GoodputScheduleKeepsDistribution) {
  const Models m = models();
  GenerationConfig c = kCases[1].cfg;
  c.num_assistant_tokens_schedule = "goodput";
  const Outcome o = run(m.target, m.unrelated, c, nullptr, 1, {}, kTimed);
  EXPECT_TRUE(o.all_pass) << o.report;
}

// Batches of 4 rows (3 samples and a longer distractor): each row's own seed, ragged passes.
TEST(Statistical, BatchedRowsKeepDistribution) {
  const Models m = models();
  for (const auto& c : {kCases[0], kCases[1]}) {
    const Outcome o = run(m.target, m.unrelated, c.cfg, nullptr, 4);
    EXPECT_TRUE(o.all_pass) << c.name << "\n" << o.report;
  }
  GenerationConfig g = kCases[1].cfg;
  g.num_assistant_tokens_schedule = "goodput";
  const Outcome o = run(m.target, m.unrelated, g, nullptr, 4, {}, kTimed);
  EXPECT_TRUE(o.all_pass) << "goodput\n" << o.report;
}

TEST(Statistical, DraftWithALargerPaddedVocabularyKeepsDistribution) {
  // 20 ids against the target's 16: the draft's 4 extra rows are cut off before it samples.
  FixtureOptions o = tiny(99, 1);
  o.vocab = 20;
  const auto padded = test_model(cached_fixture("stat_padded", o));
  const Outcome r = run(models().target, padded, kCases[0].cfg);
  EXPECT_TRUE(r.all_pass) << r.report;
}

TEST(Statistical, DraftWithZerosWhereTargetIsPositiveKeepsDistribution) {
  // top-k 3 truncates each side to its own 3 best tokens: the unrelated draft's q is 0 on tokens
  // the target's p keeps, and positive where p is 0.
  const Models m = models();
  const Outcome o = run(m.target, m.unrelated, sampling(1.0, 3, 1.0));
  EXPECT_TRUE(o.all_pass) << o.report;
}

// A reduced-vocabulary head (make-draft --vocab-subset): the unrelated draft's head cut to 9 of the
// 16 ids, so q is exactly 0 on the other 7, which the target reaches.
TEST(Statistical, DraftWithAReducedVocabularyHeadKeepsDistribution) {
  const std::string from = cached_fixture("stat_unrelated", tiny(99, 1));
  const std::string dir = temp_dir("stat_reduced_head");
  const std::vector<int64_t> ids = {0, 1, 3, 4, 6, 9, 10, 12, 15};
  std::map<std::string, at::Tensor> t;
  const WeightStore w(from);
  for (const std::string& name : w.names())
    t[name] = w.load(name, at::kFloat, c10::Device(c10::kCPU));
  t["lm_head.weight"] =
      t["lm_head.weight"].index_select(0, at::tensor(ids, at::kLong)).contiguous();
  save_safetensors(dir + "/model.safetensors", t);
  nlohmann::json c = read_json(from + "/config.json");
  c["head_token_ids"] = ids;
  write_file(dir + "/config.json", c.dump());
  write_file(dir + "/generation_config.json", read_file(from + "/generation_config.json"));
  const auto draft = load_model(dir, test_load_options());
  {
    c10::InferenceMode guard;
    KVCache cache = draft->make_cache(4);
    const at::Tensor logits =
        draft->forward(at::tensor(std::vector<int64_t>{3, 7, 1}, at::kLong).view({1, 3}), cache);
    EXPECT_EQ(logits.size(2), kVocab);
    EXPECT_EQ(at::isinf(logits[0][0]).sum().item<int64_t>(),
              kVocab - static_cast<int64_t>(ids.size()));
  }
  for (const auto& c : {kCases[0], kCases[2]}) {
    const Outcome o = run(models().target, draft, c.cfg);
    EXPECT_TRUE(o.all_pass) << c.name << "\n" << o.report;
    EXPECT_GT(o.rejections, 0) << c.name;
  }
}

// A feature-fed draft: its q depends on the target's hidden states, which come from the pass
// that verified the tokens before; single requests and batches.
TEST(Statistical, FeatureFedDraftKeepsDistribution) {
  FixtureOptions o = tiny(77, 1);
  o.feature_fed = true;
  const auto draft = test_model(cached_fixture("stat_feature_fed", o));
  const Outcome one = run(models().target, draft, kCases[1].cfg);
  EXPECT_TRUE(one.all_pass) << one.report;
  EXPECT_GT(one.rejections, 0);
  const Outcome batch = run(models().target, draft, kCases[0].cfg, nullptr, 4);
  EXPECT_TRUE(batch.all_pass) << batch.report;
}

TEST(Statistical, EncoderDecoderKeepsDistribution) {
  // T5 pairs: an unrelated draft with its own encoder, and an early-exit draft that shares the
  // target's encoder pass.
  FixtureOptions t = tiny(21, 2), u = tiny(99, 1);
  t.arch = u.arch = "t5";
  const auto target = test_model(cached_fixture("stat_t5_target", t));
  const std::string shared = temp_dir("stat_t5_early_exit");
  make_draft_of(cached_fixture("stat_t5_target", t), shared, 1);
  const auto early_exit = test_model(shared);
  const auto unrelated = test_model(cached_fixture("stat_t5_unrelated", u));
  Outcome o = run(target, unrelated, kCases[0].cfg);
  EXPECT_TRUE(o.all_pass) << "unrelated draft\n" << o.report;
  EXPECT_LT(o.acceptance, 0.9);
  o = run(target, early_exit, kCases[1].cfg);
  EXPECT_TRUE(o.all_pass) << "early-exit draft, shared encoder\n" << o.report;
  EXPECT_GT(o.acceptance, 0.0);
}

TEST(Statistical, PromptLookupOneHotProposalsKeepDistribution) {
  const Models m = models();
  GenerationConfig c = kCases[0].cfg;
  c.prompt_lookup_num_tokens = 2;
  c.max_matching_ngram_size = 1;
  const Outcome o = run(m.target, nullptr, c);
  EXPECT_TRUE(o.all_pass) << o.report;
}

// Suffix speculation proposing up to 3 tokens every iteration, over the first case's sampling.
GenerationConfig suffix_config() {
  GenerationConfig c = kCases[0].cfg;
  c.suffix_speculation = true;
  c.num_assistant_tokens_schedule = "constant";
  c.num_assistant_tokens = 3;
  return c;
}

// Suffix speculation's point-mass proposals come from the earlier samples' outputs (one Generator):
// the most frequent continuation so far, which rejection sampling must not let bias the output.
TEST(Statistical, SuffixPointMassProposalsKeepDistribution) {
  const Models m = models();
  const GenerationConfig c = suffix_config();
  const Outcome o = run(m.target, nullptr, c);
  EXPECT_TRUE(o.all_pass) << o.report;
  EXPECT_GT(o.acceptance, 0.0);
  EXPECT_GT(o.rejections, 0);
}

// Suffix speculation proposing trees of up to 4 candidates, branches down to a tenth of the
// continuations' mass (the samples' outputs differ: the shared tree branches everywhere).
SuffixOptions suffix_trees() {
  SuffixOptions o;
  o.tree = true;
  o.max_spec_factor = 2;
  return o;
}

TEST(Statistical, SuffixTreesOfPointMassProposalsKeepDistribution) {
  const Models m = models();
  GenerationConfig c = suffix_config();
  c.num_assistant_tokens = 4;
  const Outcome o = run(m.target, nullptr, c, nullptr, 1, suffix_trees());
  EXPECT_TRUE(o.all_pass) << o.report;
  EXPECT_GT(o.acceptance, 0.0);
  EXPECT_GT(o.rejections, 0);
  EXPECT_GT(o.tree_passes, kSamples / 2) << "the proposals were hardly trees";
}

TEST(Statistical, SuffixTreesInABatchKeepDistribution) {
  const Models m = models();
  GenerationConfig c = suffix_config();
  c.num_assistant_tokens = 4;
  const Outcome o = run(m.target, nullptr, c, nullptr, 4, suffix_trees());
  EXPECT_TRUE(o.all_pass) << o.report;
  EXPECT_GT(o.tree_passes, kSamples / 2) << "the proposals were hardly trees";
}

// Accepts every draft token (of a tree: the first child at each level) and adds a bonus from p:
// the output then follows the draft.
class AlwaysAccept final : public Verifier {
 public:
  at::Tensor decide(const at::Tensor& scores, const Candidates& c, Rng& rng) const override {
    if (!c.tree()) {
      const auto accepted = static_cast<int64_t>(c.size());
      const int64_t next = sample_index(scores[accepted].softmax(-1), rng.uniform());
      return at::tensor(std::vector<int64_t>{accepted, next}, at::kLong);
    }
    std::vector<int64_t> path;
    for (int64_t node = -1;;) {
      const auto child = std::find(c.parents.begin(), c.parents.end(), node);
      if (child == c.parents.end()) break;
      node = child - c.parents.begin();
      path.push_back(node);
    }
    const int64_t row = path.empty() ? 0 : path.back() + 1;
    std::vector<int64_t> out{static_cast<int64_t>(path.size()),
                             sample_index(scores[row].softmax(-1), rng.uniform())};
    out.insert(out.end(), path.begin(), path.end());
    out.resize(2 + c.size(), -1);
    return at::tensor(out, at::kLong);
  }
  bool verifies_trees() const override { return true; }
};

// A tree verifier that tests each child against p on a draw of its own instead of drawing the
// position's token once: a second child is then kept too rarely.
class SiblingsAgainstP final : public Verifier {
 public:
  at::Tensor decide(const at::Tensor& scores, const Candidates& c, Rng& rng) const override {
    if (!c.tree()) return RejectionSamplingVerifier().decide(scores, c, rng);
    const at::Tensor p = scores.softmax(-1).to(at::kDouble).contiguous();
    std::vector<int64_t> out{0, 0};
    for (int64_t node = -1;;) {
      const int64_t row = node + 1;
      int64_t kept = -1;
      for (int64_t i = node + 1; i < static_cast<int64_t>(c.size()) && kept < 0; ++i)
        if (c.parents[i] == node && rng.uniform() < p[row][c.tokens[i]].item<double>()) kept = i;
      if (kept < 0) {
        at::Tensor r = p[row].clone();
        for (int64_t i = node + 1; i < static_cast<int64_t>(c.size()); ++i)
          if (c.parents[i] == node) r[c.tokens[i]] = 0;
        out[1] = sample_index(r.sum().item<double>() > 0 ? r : p[row], rng.uniform());
        break;
      }
      out.push_back(kept);
      ++out[0];
      node = kept;
    }
    out.resize(2 + c.size(), -1);
    return at::tensor(out, at::kLong);
  }
  void settle(const Verdict& v, const Candidates& c, Rng& rng) const override {
    if (!c.tree()) RejectionSamplingVerifier().settle(v, c, rng);
  }
  bool verifies_trees() const override { return true; }
};

TEST(Statistical, NegativeControlAlwaysAcceptWithSuffixTreesIsDetected) {
  const Models m = models();
  GenerationConfig c = suffix_config();
  c.num_assistant_tokens = 4;
  const Outcome o = run(m.target, nullptr, c, std::make_shared<AlwaysAccept>(), 1, suffix_trees());
  EXPECT_FALSE(o.all_pass) << "the test failed to detect a wrong verifier:\n" << o.report;
}

TEST(Statistical, NegativeControlSiblingsTestedAgainstPIsDetected) {
  const Models m = models();
  GenerationConfig c = suffix_config();
  c.num_assistant_tokens = 4;
  const Outcome o =
      run(m.target, nullptr, c, std::make_shared<SiblingsAgainstP>(), 1, suffix_trees());
  EXPECT_FALSE(o.all_pass) << "the test failed to detect a wrong tree verifier:\n" << o.report;
}

// A draft model's trees under sampling: its 3 most probable tokens at each position, a
// deterministic proposal, verified by drawing each node's token from p and following the child
// holding it. 6 new tokens (the first 3 are tested), so that the first proposal has room for 6
// nodes.
GenerationConfig draft_trees(GenerationConfig c) {
  c.draft_tree_width = 3;
  c.max_new_tokens = 6;
  return c;
}

// An unrelated draft's trees and the target's own (whose siblings hold much of p).
TEST(Statistical, DraftTreesKeepDistribution) {
  const Models m = models();
  for (const auto& [c, draft] :
       {std::pair{kCases[0], m.unrelated}, std::pair{kCases[2], m.target}}) {
    const Outcome o = run(m.target, draft, draft_trees(c.cfg));
    EXPECT_TRUE(o.all_pass) << c.name << "\n" << o.report;
    EXPECT_GT(o.tree_passes, kSamples / 2) << c.name << ": the proposals were hardly trees";
  }
  const Outcome o = run(m.target, m.target, draft_trees(kCases[1].cfg), nullptr, 4);
  EXPECT_TRUE(o.all_pass) << "in a batch\n" << o.report;
}

// The target's own trees: a second child tested against p is kept well below its probability.
TEST(Statistical, NegativeControlSiblingsTestedAgainstPWithDraftTreesIsDetected) {
  const Models m = models();
  const Outcome o =
      run(m.target, m.target, draft_trees(kCases[0].cfg), std::make_shared<SiblingsAgainstP>());
  EXPECT_FALSE(o.all_pass) << "the test failed to detect a wrong tree verifier:\n" << o.report;
}

TEST(Statistical, NegativeControlAlwaysAcceptWithSuffixProposalsIsDetected) {
  const Models m = models();
  const GenerationConfig c = suffix_config();
  const Outcome o = run(m.target, nullptr, c, std::make_shared<AlwaysAccept>());
  EXPECT_FALSE(o.all_pass) << "the test failed to detect a wrong verifier:\n" << o.report;
}

TEST(Statistical, NegativeControlAlwaysAcceptIsDetected) {
  const Models m = models();
  const Outcome o = run(m.target, m.unrelated, kCases[0].cfg, std::make_shared<AlwaysAccept>());
  EXPECT_FALSE(o.all_pass) << "the test failed to detect a wrong verifier:\n" << o.report;
}

TEST(Statistical, NegativeControlInABatchIsDetected) {
  const Models m = models();
  const Outcome o = run(m.target, m.unrelated, kCases[0].cfg, std::make_shared<AlwaysAccept>(), 4);
  EXPECT_FALSE(o.all_pass) << "the test failed to detect a wrong verifier in a batch:\n"
                           << o.report;
}

TEST(Statistical, SameSeedSameTokens) {
  const Models m = models();
  GenerationConfig c = sampling(1.0, 0, 1.0);
  c.max_new_tokens = 20;
  c.seed = 1234;
  const Generator g(m.target, m.unrelated);
  const auto a = g.generate({3, 7, 1}, c).tokens;
  EXPECT_EQ(a, g.generate({3, 7, 1}, c).tokens);
  EXPECT_EQ(a, Generator(m.target, m.unrelated).generate({3, 7, 1}, c).tokens);
  c.seed = 1235;
  EXPECT_NE(a, g.generate({3, 7, 1}, c).tokens);
}

// The heuristic lookahead carried between requests must not change a seeded request's tokens:
// the same sampled request gives the same tokens on a fresh Generator, after greedy requests that
// moved the carried value, and while other threads run requests on the same Generator.
TEST(Statistical, SameSeedSameTokensWhateverRanBefore) {
  const Models m = models();
  GenerationConfig c = sampling(1.0, 0, 1.0);
  c.max_new_tokens = 24;
  c.seed = 99;
  c.num_assistant_tokens_schedule = "heuristic";
  c.num_assistant_tokens = 4;
  const std::vector<int64_t> prompt = {3, 7, 1};
  const auto fresh = Generator(m.target, m.unrelated).generate(prompt, c).tokens;
  const Generator g(m.target, m.unrelated);  // mostly rejected: greedy requests move K down to 1
  GenerationConfig greedy = c;
  greedy.do_sample = false;
  greedy.max_new_tokens = 40;
  g.generate(prompt, greedy);
  g.generate(prompt, greedy);
  EXPECT_EQ(g.generate(prompt, c).tokens, fresh);
  std::vector<std::thread> others;
  std::vector<std::vector<int64_t>> got(4);
  for (int i = 0; i < 4; ++i)
    others.emplace_back([&, i] {
      got[i] = i % 2 ? g.generate(prompt, greedy).tokens : g.generate(prompt, c).tokens;
    });
  for (auto& t : others) t.join();
  EXPECT_EQ(got[0], fresh);
  EXPECT_EQ(got[2], fresh);
}

}  // namespace
}  // namespace specdec::test
