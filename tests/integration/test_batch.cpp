// Batched generation (Generator::generate_batch): every row's output equals the same request run
// alone (greedy: the target-only output; sampling: the same seed's tokens), whatever the batch
// size, the other rows, their lengths, schedules, limits and EOS; rows leave the batch when done;
// bad batches are clear errors.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "test_util.hpp"

namespace specdec::test {
namespace {

struct Pair {
  std::shared_ptr<const Model> target, draft;
};

Pair pair_for(const std::string& arch, uint64_t seed) {
  const std::string t =
      cached_fixture("batch_t" + arch + std::to_string(seed), small_fixture(seed, 3, arch));
  static std::map<std::string, std::string> drafts;
  const std::string key = arch + std::to_string(seed);
  if (!drafts.count(key)) {
    drafts[key] = temp_dir("batch_d" + key);
    make_draft_of(t, drafts[key], 1, 0.0, seed);
  }
  return {test_model(t), test_model(drafts[key])};
}

// A 1-layer target and a draft that costs many times as much (8 layers, 4x wider) and that the
// target rejects, so that goodput's choice not to draft holds even when a loaded machine skews
// one timing by several times.
Pair rejected_draft_pair() {
  FixtureOptions big = small_fixture(101, 8, "llama");
  big.hidden = 256;
  big.intermediate = 1024;
  return {test_model(cached_fixture("batch_g1", small_fixture(1, 1, "llama"))),
          test_model(cached_fixture("batch_g101", big))};
}

// The goodput tests below assert choices made from timed passes, so they compute on one thread (as
// ctest runs every test: OMP_NUM_THREADS=1) whatever the caller set: with several threads on an
// oversubscribed machine one pass can wait at the threads' join for a whole scheduler slice, tens
// of times its cost, which turned those choices in runs with two busy processes beside a 2-thread
// run on 2 cores; on one thread 30 such runs passed.

// goodput with up to 4 drafted tokens, 16 new tokens.
// A 12-layer target whose layers after the first add nothing (exit scale 0) and a draft that is
// its first layer, so the target accepts every drafted token (made once per test program).
Pair accepted_draft_pair() {
  FixtureOptions o = small_fixture(7, 12, "llama");
  o.hidden = 256;
  o.intermediate = 1024;
  o.exit_scale = 0.0;
  const std::string t = cached_fixture("batch_explore_t", o);
  static const std::string d = [&] {
    const std::string dir = temp_dir("batch_explore_d");
    make_draft_of(t, dir, 1, 0.0, 7);
    return dir;
  }();
  return {test_model(t), test_model(d)};
}

GenerationConfig goodput_config() {
  GenerationConfig c;
  c.max_new_tokens = 16;
  c.num_assistant_tokens = 4;
  c.num_assistant_tokens_schedule = "goodput";
  return c;
}

// Prompts of lengths 1, 4, 7, ... (ragged), different per row.
std::vector<std::vector<int64_t>> prompts_for(size_t rows, uint64_t seed) {
  std::vector<std::vector<int64_t>> out;
  for (size_t r = 0; r < rows; ++r) {
    std::vector<int64_t> p;
    for (size_t i = 0; i < 1 + 3 * r; ++i)
      p.push_back(static_cast<int64_t>((seed * 31 + r * 7 + i * 17 + 3) % 90) + 3);
    out.push_back(p);
  }
  return out;
}

}  // namespace

TEST(Batch, EveryRowEqualsItsRequestAloneAcrossArchitecturesSchedulesAndSizes) {
  int64_t rows_checked = 0;
  const std::pair<const char*, uint64_t> runs[] = {{"llama", 1},  {"llama", 2},    {"gpt2", 3},
                                                   {"opt", 4},    {"gpt_neox", 5}, {"t5", 6},
                                                   {"gemma3", 7}, {"qwen3", 8}};
  for (const auto& [arch, seed] : runs) {
    const Pair p = pair_for(arch, seed);
    const Generator target_only(p.target);
    // One assisted Generator for every batch of the architecture: what one request carries to the
    // next (heuristic lookahead, goodput's costs and acceptance) must not change any output.
    Generator assisted(p.target, p.draft);
    for (const size_t b : {1u, 3u, 8u}) {
      const auto prompts = prompts_for(b, seed);
      for (const std::string schedule :
           {"constant", "heuristic", "dynamic", "goodput", "lookup", "lookup goodput", "suffix",
            "suffix tree", "constant tree", "goodput tree"}) {
        SuffixOptions suffix;  // "suffix tree": trees with branches down to 2% of the mass
        suffix.tree = schedule == "suffix tree";
        suffix.min_token_prob = suffix.tree ? 0.02 : suffix.min_token_prob;
        assisted.set_suffix_options(suffix);
        // Different limits per row (1 to 29 tokens), a lookahead per row, an EOS that some rows
        // hit.
        std::vector<GenerationConfig> configs;
        for (size_t r = 0; r < b; ++r) {
          GenerationConfig c;
          c.max_new_tokens = 1 + static_cast<int64_t>((r * 7 + seed) % 29);
          c.num_assistant_tokens = 1 + static_cast<int64_t>(r % 6);
          c.eos_token_ids = {static_cast<int64_t>(40 + seed)};
          if (schedule.rfind("lookup", 0) == 0) c.prompt_lookup_num_tokens = c.num_assistant_tokens;
          c.suffix_speculation = schedule.rfind("suffix", 0) == 0;
          // "... tree": the draft's 3 most probable tokens at each position.
          const auto tree = schedule.find(" tree");
          if (tree != std::string::npos && !c.suffix_speculation) c.draft_tree_width = 3;
          if (schedule != "lookup" && !c.suffix_speculation)
            c.num_assistant_tokens_schedule =
                schedule == "lookup goodput" ? "goodput" : schedule.substr(0, tree);
          configs.push_back(c);
        }
        const BatchResult got = assisted.generate_batch(prompts, configs);
        // The 8 prompts also through 3 rows at a time (continuous batching).
        BatchOptions three;
        three.max_rows = 3;
        const BatchResult continuous =
            b == 8 ? assisted.generate_batch(prompts, configs, {}, three) : got;
        ASSERT_EQ(got.results.size(), b);
        ASSERT_EQ(continuous.results.size(), b);
        int64_t total = 0;
        for (size_t r = 0; r < b; ++r) {
          GenerationConfig alone = configs[r];
          alone.prompt_lookup_num_tokens = 0;
          alone.suffix_speculation = false;
          const auto want = target_only.generate(prompts[r], alone).tokens;
          EXPECT_EQ(got.results[r].tokens, want)
              << arch << " seed " << seed << " batch " << b << " " << schedule << " row " << r;
          EXPECT_EQ(continuous.results[r].tokens, want)
              << arch << " seed " << seed << " 3 rows at a time " << schedule << " row " << r;
          total += static_cast<int64_t>(got.results[r].tokens.size());
          ++rows_checked;
        }
        EXPECT_EQ(got.stats.new_tokens, total);
        EXPECT_EQ(continuous.stats.new_tokens, total);
        EXPECT_EQ(got.stats.rows, static_cast<int64_t>(b));
      }
    }
  }
  EXPECT_EQ(rows_checked, 8 * 10 * (1 + 3 + 8));
}

// goodput in a Generator that has measured its costs: after a request whose draft the target
// rejected, the next request (alone or in a batch) does not draft from its first iteration on, so
// it pays neither the draft's prefill nor drafted tokens; its output stays the target's.
TEST(Batch, GoodputSkipsARejectedDraftFromTheNextRequestsFirstIteration) {
  const ThreadsGuard one_thread(1);  // timed passes: see above
  const Pair p = rejected_draft_pair();
  const Generator target_only(p.target);
  const Generator g(p.target, p.draft);
  const GenerationConfig c = goodput_config();
  const auto prompts = prompts_for(4, 5);
  const GenerationResult first = g.generate(prompts[0], c);
  EXPECT_EQ(first.tokens, target_only.generate(prompts[0], c).tokens);
  ASSERT_GT(first.stats.drafted_tokens, 0);  // the first request of a Generator tries the draft
  EXPECT_LT(first.stats.accepted_tokens, first.stats.drafted_tokens);

  const GenerationResult alone = g.generate(prompts[1], c);
  EXPECT_EQ(alone.tokens, target_only.generate(prompts[1], c).tokens);
  EXPECT_EQ(alone.stats.drafted_tokens, 0);
  EXPECT_EQ(alone.stats.draft_passes, 0);

  const BatchResult batch = g.generate_batch({prompts[1], prompts[2], prompts[3]}, {c});
  EXPECT_EQ(batch.stats.draft_passes, 0);  // no draft prefill either
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(batch.results[r].tokens, target_only.generate(prompts[r + 1], c).tokens)
        << "row " << r;
    EXPECT_EQ(batch.results[r].stats.drafted_tokens, 0) << "row " << r;
  }
}

// goodput in a fresh Generator: one row, the shortest, probes the draft with one token; the others
// wait for what it shows, so a draft the target rejects never runs on them, not even its prefill.
TEST(Batch, GoodputProbesAFreshDraftWithOneRow) {
  const ThreadsGuard one_thread(1);  // timed passes: see above
  const Pair p = rejected_draft_pair();
  const GenerationConfig c = goodput_config();
  auto prompts = prompts_for(4, 7);
  std::swap(prompts[0], prompts[2]);  // the shortest prompt is not the first row
  const BatchResult batch = Generator(p.target, p.draft).generate_batch(prompts, {c});
  const Generator target_only(p.target);
  for (size_t r = 0; r < prompts.size(); ++r) {
    EXPECT_EQ(batch.results[r].tokens, target_only.generate(prompts[r], c).tokens) << "row " << r;
    if (r == 2) continue;
    EXPECT_EQ(batch.results[r].stats.drafted_tokens, 0) << "row " << r;
    EXPECT_EQ(batch.results[r].stats.draft_passes, 0) << "row " << r;
  }
  ASSERT_GT(batch.results[2].stats.drafted_tokens, 0);
  EXPECT_LT(batch.results[2].stats.accepted_tokens, batch.results[2].stats.drafted_tokens);
  EXPECT_EQ(batch.results[2].stats.trace.at(0)[0], 1);  // the probe: one drafted token
  EXPECT_EQ(batch.stats.draft_passes, batch.results[2].stats.draft_passes);
}

// Continuous batching: rows that join after goodput dropped a rejected draft start from the
// running rows' evidence and do not run the draft, not even its prefill, so the whole run drafts
// exactly what a batch of its first two rows alone does (one row's probe in the first iteration).
TEST(Batch, GoodputJoiningRowsSkipARejectedDraft) {
  const ThreadsGuard one_thread(1);  // timed passes: see above
  const Pair p = rejected_draft_pair();
  const GenerationConfig c = goodput_config();
  const auto prompts = prompts_for(6, 5);
  BatchOptions two;
  two.max_rows = 2;
  const BatchResult run = Generator(p.target, p.draft).generate_batch(prompts, {c}, {}, two);
  const BatchResult pair =
      Generator(p.target, p.draft).generate_batch({prompts[0], prompts[1]}, {c});
  ASSERT_GT(pair.stats.draft_passes, 0);
  EXPECT_EQ(run.stats.draft_passes, pair.stats.draft_passes);
  const Generator target_only(p.target);
  for (size_t r = 0; r < prompts.size(); ++r) {
    EXPECT_EQ(run.results[r].tokens, target_only.generate(prompts[r], c).tokens) << "row " << r;
    if (r >= 2) EXPECT_EQ(run.results[r].stats.drafted_tokens, 0) << "row " << r;
  }
}

// A model that runs another one, sleeping `ms` before each of its first `stalled` passes: a draft
// whose first passes ran beside other busy processes on an oversubscribed machine, or a target
// whose passes cost far more than the draft's whatever the machine's load (timed tests).
class StalledModel final : public Model {
 public:
  StalledModel(std::shared_ptr<const Model> inner, int stalled, int ms)
      : Model(inner->config(), inner->device(), inner->dtype()),
        inner_(std::move(inner)),
        stalled_(stalled),
        ms_(ms) {}
  at::Tensor forward(const at::Tensor& ids, KVCache& cache, int64_t keep_last,
                     const std::vector<int64_t>& row_tokens,
                     const std::vector<TokenTree>& trees) const override {
    if (calls_++ < stalled_) std::this_thread::sleep_for(std::chrono::milliseconds(ms_));
    return inner_->forward(ids, cache, keep_last, row_tokens, trees);
  }

 private:
  std::shared_ptr<const Model> inner_;
  int stalled_, ms_;
  mutable std::atomic<int> calls_{0};
};

// goodput in a fresh Generator times every pass its plans can make up to cap / 2 + 1 tokens with
// real iterations, K = 1, 2, ..., 6 in turn (cap 12), before it plans on the cost curve: between
// observed sizes the curve would be interpolated, and a pass over more tokens can cost less than
// one over fewer. The draft is the target's first layer and the target's other layers add nothing
// (exit scale 0), so every drafted token is accepted; each target pass sleeps 40 ms, so that the
// draft's pass (under a millisecond; a few under the sanitizers) costs far less whatever else the
// machine runs, and drafting pays: goodput explores only while it does.
TEST(Batch, GoodputTimesEveryPassSizeBeforePlanningOnTheCurve) {
  const ThreadsGuard one_thread(1);  // timed passes: see above
  const Pair p = accepted_draft_pair();
  GenerationConfig c;
  c.max_new_tokens = 40;
  c.num_assistant_tokens = 12;
  c.num_assistant_tokens_schedule = "goodput";
  const std::vector<int64_t> prompt{5, 9, 14, 3};
  const auto slow_target = std::make_shared<StalledModel>(p.target, 1 << 30, 40);
  const GenerationResult r = Generator(slow_target, p.draft).generate(prompt, c);
  EXPECT_EQ(r.tokens, Generator(p.target).generate(prompt, c).tokens);
  EXPECT_EQ(r.stats.accepted_tokens, r.stats.drafted_tokens);
  ASSERT_GE(r.stats.trace.size(), 7u);
  for (int64_t k = 1; k <= 6; ++k)
    EXPECT_EQ(r.stats.trace[static_cast<size_t>(k)][0], k) << "pass " << k;
}

// goodput times the draft on its passes, and at K = 0 it runs none: a draft whose first timed pass
// stalled (400 ms against a target pass of a few milliseconds, tens under the sanitizers on a busy
// machine) looks too slow to pay, and without re-timing it
// would stay off for the Generator's life. After Generator::kRetimeFirst iterations at K = 0 that
// the draft's cost alone decides, goodput drafts 2 tokens (the first probe's shape), which times
// the draft again. The pair: accepted_draft_pair.
TEST(Batch, GoodputTimesADraftAgainThatLookedTooSlow) {
  const ThreadsGuard one_thread(1);  // timed passes: see above
  const Pair p = accepted_draft_pair();
  GenerationConfig c;
  c.max_new_tokens = Generator::kRetimeFirst + 40;
  c.num_assistant_tokens = 4;
  c.num_assistant_tokens_schedule = "goodput";
  const std::vector<int64_t> prompt{5, 9, 14, 3};
  // The probe's prefill and its two draft passes (the second one timed) stall.
  const auto stalled = std::make_shared<StalledModel>(p.draft, 3, 400);
  const GenerationResult r = Generator(p.target, stalled).generate(prompt, c);
  EXPECT_EQ(r.tokens, Generator(p.target).generate(prompt, c).tokens);
  ASSERT_GE(r.stats.trace.size(), 2u);
  EXPECT_EQ(r.stats.trace[0][0], 2);  // the probe
  // then K = 0 for kRetimeFirst iterations (one token each), then the re-timing's 2 tokens
  for (int64_t i = 1; i <= Generator::kRetimeFirst; ++i)
    ASSERT_EQ(r.stats.trace.at(static_cast<size_t>(i))[0], 0) << i;
  EXPECT_EQ(r.stats.trace.at(Generator::kRetimeFirst + 1)[0], 2);
  EXPECT_GE(r.stats.drafted_tokens, 4);
  EXPECT_EQ(r.stats.accepted_tokens, r.stats.drafted_tokens);
  // Whether drafting then pays rests on that second timing, which a machine as busy as the first
  // one was (ctest -j beside other work) can stall again: not asserted here. Quiet, the draft
  // (one layer of twelve) drafts from then on.
}

TEST(Batch, SampledRowsGiveTheirSeedsTokensWhateverTheOtherRows) {
  const Pair p = pair_for("llama", 1);
  const Generator g(p.target, p.draft);
  const auto prompts = prompts_for(5, 9);
  std::vector<GenerationConfig> configs;
  for (size_t r = 0; r < prompts.size(); ++r) {
    GenerationConfig c;
    c.do_sample = r != 2;  // row 2 greedy among sampled rows
    c.temperature = 0.8;
    c.top_k = r == 1 ? 10 : 0;
    c.seed = 100 + r;
    c.max_new_tokens = 12 + static_cast<int64_t>(r) * 3;
    c.num_assistant_tokens = 2 + static_cast<int64_t>(r);
    c.draft_tree_width = r >= 3 ? 3 : 1;  // rows 3 and 4 draft trees
    configs.push_back(c);
  }
  const BatchResult batch = g.generate_batch(prompts, configs);
  for (size_t r = 0; r < prompts.size(); ++r)
    EXPECT_EQ(batch.results[r].tokens, g.generate(prompts[r], configs[r]).tokens) << "row " << r;
  // The same rows in another order and company.
  const BatchResult reversed =
      g.generate_batch({prompts[4], prompts[0], prompts[3]}, {configs[4], configs[0], configs[3]});
  EXPECT_EQ(reversed.results[0].tokens, batch.results[4].tokens);
  EXPECT_EQ(reversed.results[1].tokens, batch.results[0].tokens);
  EXPECT_EQ(reversed.results[2].tokens, batch.results[3].tokens);
  // Two rows at a time: later rows join as others finish.
  BatchOptions two;
  two.max_rows = 2;
  const BatchResult continuous = g.generate_batch(prompts, configs, {}, two);
  for (size_t r = 0; r < prompts.size(); ++r)
    EXPECT_EQ(continuous.results[r].tokens, batch.results[r].tokens) << "row " << r;
}

TEST(Batch, StreamingPerRowAndCancellingOneRowLeavesTheOthers) {
  const Pair p = pair_for("llama", 2);
  const Generator g(p.target, p.draft);
  const auto prompts = prompts_for(4, 2);
  GenerationConfig c;
  c.max_new_tokens = 20;
  c.eos_token_ids = {95};
  c.num_assistant_tokens_schedule = "constant";  // goodput, the greedy default, may not draft
  std::vector<std::vector<int64_t>> streamed(4);
  const BatchResult r =
      g.generate_batch(prompts, {c}, [&](size_t row, const std::vector<int64_t>& fresh) {
        streamed[row].insert(streamed[row].end(), fresh.begin(), fresh.end());
        if (row == 1 && streamed[row].size() >= 3) throw Cancelled();
      });
  for (size_t row = 0; row < 4; ++row) {
    EXPECT_EQ(streamed[row], r.results[row].tokens) << row;
    if (row == 1) continue;
    EXPECT_EQ(r.results[row].tokens, Generator(p.target).generate(prompts[row], c).tokens) << row;
    EXPECT_EQ(r.results[row].stats.stop_reason, "max_new_tokens");
  }
  EXPECT_EQ(r.results[1].stats.stop_reason, "cancelled");
  EXPECT_GE(r.results[1].tokens.size(), 3u);
  EXPECT_LT(r.results[1].tokens.size(), 20u);
  // Per-row stats add up; the batch made one target pass per step, as many as its longest row.
  int64_t longest = 0;
  for (const auto& res : r.results) {
    EXPECT_EQ(res.stats.new_tokens, static_cast<int64_t>(res.tokens.size()));
    EXPECT_EQ(static_cast<int64_t>(res.stats.trace.size()), res.stats.target_passes);
    longest = std::max(longest, res.stats.target_passes);
  }
  EXPECT_EQ(r.stats.target_passes, longest);
  EXPECT_GT(r.stats.draft_passes, 0);
}

// A row whose callback throws (anything but Cancelled), or whose on_finished throws, fails alone:
// the batch returns, the other rows give what they give alone, every row is finished once, and
// the failed row keeps the tokens delivered before its failure. A Cancelled thrown at a row's
// last tokens leaves its stop reason as it was.
TEST(Batch, AFailingCallbackFailsItsRowAlone) {
  const Pair p = pair_for("llama", 2);
  const Generator g(p.target, p.draft);
  const auto prompts = prompts_for(4, 2);
  GenerationConfig c;
  c.max_new_tokens = 12;
  c.eos_token_ids = {95};
  // constant K (5): goodput, the greedy default, may verify up to 12 in one pass, the whole answer
  c.num_assistant_tokens_schedule = "constant";
  for (const int64_t max_rows : {0, 2}) {
    std::vector<std::vector<int64_t>> streamed(4);
    std::vector<int> finished(4, 0);
    BatchOptions o;
    o.max_rows = max_rows;
    o.on_finished = [&](size_t row, const GenerationResult&) {
      ++finished[row];
      if (row == 2) throw std::runtime_error("sink of row 2 closed");
    };
    const BatchResult r = g.generate_batch(
        prompts, {c},
        [&](size_t row, const std::vector<int64_t>& fresh) {
          streamed[row].insert(streamed[row].end(), fresh.begin(), fresh.end());
          if (row == 1 && streamed[row].size() >= 3) throw std::runtime_error("client gone");
          if (row == 3 && streamed[row].size() >= 12) throw Cancelled();  // after its last token
        },
        o);
    ASSERT_EQ(r.results.size(), 4u);
    for (size_t row = 0; row < 4; ++row) {
      EXPECT_EQ(streamed[row], r.results[row].tokens) << row;
      EXPECT_EQ(finished[row], row == 1 ? 0 : 1)
          << row;  // a row that failed in its callback is not finished
      if (row == 1) continue;
      EXPECT_EQ(r.results[row].tokens, Generator(p.target).generate(prompts[row], c).tokens) << row;
    }
    EXPECT_EQ(r.results[0].stats.stop_reason, "max_new_tokens");
    EXPECT_EQ(r.results[0].error, "");
    EXPECT_EQ(r.results[1].stats.stop_reason, "error");
    EXPECT_EQ(r.results[1].error, "client gone");
    EXPECT_GE(r.results[1].tokens.size(), 3u);
    EXPECT_LT(r.results[1].tokens.size(), 12u);
    EXPECT_EQ(r.results[2].stats.stop_reason, "error");
    EXPECT_EQ(r.results[2].error, "sink of row 2 closed");
    EXPECT_EQ(r.results[3].stats.stop_reason, "max_new_tokens");
  }
  // The Generator goes on.
  EXPECT_EQ(g.generate(prompts[1], c).tokens, Generator(p.target).generate(prompts[1], c).tokens);
}

// A long prompt goes in 256 tokens per pass, and after each but the last the callback is called
// with no tokens, so that it can cancel the request (Ctrl-C in the program) seconds before its
// first token: generate() returns at once with nothing, the passes left not run. A callback that
// does not cancel changes nothing; a batch row that cancels during the prefill (the batch's first
// rows, or one joining later) leaves the others as they are alone; and a PromptCache keeps the
// cancelled prompt's prefilled part, which the next request continues.
TEST(Batch, ACallbackCanCancelALongPrefill) {
  const Pair p = pair_for("llama", 2);
  const Generator g(p.target);
  std::vector<int64_t> long_prompt;
  for (int64_t i = 0; i < 700; ++i) long_prompt.push_back(3 + (i * 37) % 90);  // 3 chunks
  GenerationConfig c;
  c.max_new_tokens = 6;
  const GenerationResult alone = g.generate(long_prompt, c);
  ASSERT_EQ(alone.stats.prefill_passes, 3);
  int empty_calls = 0;
  std::vector<int64_t> streamed;
  const GenerationResult watched = g.generate(long_prompt, c, [&](const std::vector<int64_t>& t) {
    if (t.empty()) EXPECT_TRUE(streamed.empty()) << "no empty call once tokens come";
    empty_calls += t.empty();
    streamed.insert(streamed.end(), t.begin(), t.end());
  });
  EXPECT_EQ(empty_calls, 2);  // after the first and second chunks
  EXPECT_EQ(watched.tokens, alone.tokens);
  EXPECT_EQ(streamed, alone.tokens);

  const GenerationResult cancelled = g.generate(long_prompt, c, [&](const std::vector<int64_t>& t) {
    EXPECT_TRUE(t.empty());
    throw Cancelled();
  });
  EXPECT_EQ(cancelled.stats.stop_reason, "cancelled");
  EXPECT_TRUE(cancelled.tokens.empty());
  EXPECT_EQ(cancelled.stats.prefill_passes, 1);
  EXPECT_EQ(cancelled.stats.target_passes, 0);
  // Another exception leaves generate() as it does from a token group.
  EXPECT_THROW(g.generate(long_prompt, c,
                          [](const std::vector<int64_t>&) { throw std::runtime_error("gone"); }),
               std::runtime_error);

  // Batches: row 1 (long) cancels in the batch's first prefill, row 3 (long) as it joins later.
  const std::vector<std::vector<int64_t>> prompts = {{5, 6, 7}, long_prompt, {8, 9}, long_prompt};
  for (const int64_t max_rows : {0, 2}) {
    const BatchResult r = g.generate_batch(
        prompts, {c},
        [&](size_t row, const std::vector<int64_t>& t) {
          if (t.empty() && (row == 1 || row == 3)) throw Cancelled();
        },
        BatchOptions{max_rows, {}});
    for (const size_t row : {size_t{0}, size_t{2}})
      EXPECT_EQ(r.results[row].tokens, g.generate(prompts[row], c).tokens) << row;
    for (const size_t row : {size_t{1}, size_t{3}}) {
      EXPECT_EQ(r.results[row].stats.stop_reason, "cancelled") << max_rows << " " << row;
      EXPECT_TRUE(r.results[row].tokens.empty()) << max_rows << " " << row;
    }
  }

  PromptCache cache;
  (void)g.generate(long_prompt, c, cache, [](const std::vector<int64_t>& t) {
    if (t.empty()) throw Cancelled();
  });
  EXPECT_EQ(cache.positions(), 256);
  const GenerationResult resumed = g.generate(long_prompt, c, cache);
  EXPECT_EQ(resumed.stats.cached_prompt_tokens, 256);
  EXPECT_EQ(resumed.tokens, alone.tokens);
}

// Continuous batching (BatchOptions::max_rows): 10 requests of ragged prompts and limits, at most 3
// rows at once; each finished row makes room for the next request. Every output is the request's
// alone, the callbacks see each row start after an earlier one finished, never more than 3 rows at
// once, and the run takes fewer target passes than consecutive groups of 3 would.
TEST(Batch, ContinuousBatchingAdmitsTheNextRequestAsARowFinishes) {
  const Pair p = pair_for("llama", 2);
  const auto prompts = prompts_for(10, 4);
  std::vector<GenerationConfig> configs;
  for (size_t r = 0; r < prompts.size(); ++r) {
    GenerationConfig c;
    c.max_new_tokens = 2 + static_cast<int64_t>((r * 11) % 17);
    c.num_assistant_tokens = 1 + static_cast<int64_t>(r % 4);
    configs.push_back(c);
  }
  for (const bool assisted : {false, true}) {
    const Generator g(p.target, assisted ? p.draft : nullptr);
    BatchOptions options;
    options.max_rows = 3;
    std::vector<int> state(prompts.size(), 0);  // 0 waiting, 1 running, 2 finished
    int running = 0, most = 0;
    std::vector<GenerationResult> finished(prompts.size());
    options.on_finished = [&](size_t row, const GenerationResult& r) {
      EXPECT_EQ(state[row], 1) << row;
      state[row] = 2;
      --running;
      finished[row] = r;
    };
    const BatchResult got = g.generate_batch(
        prompts, configs,
        [&](size_t row, const std::vector<int64_t>&) {
          if (state[row] == 0) {
            state[row] = 1;
            most = std::max(most, ++running);
          }
        },
        options);
    EXPECT_EQ(most, 3);
    int64_t grouped_passes = 0;
    for (size_t first = 0; first < prompts.size(); first += 3) {
      int64_t longest = 0;
      for (size_t r = first; r < std::min(prompts.size(), first + 3); ++r) {
        const GenerationResult alone = g.generate(prompts[r], configs[r]);
        EXPECT_EQ(got.results[r].tokens, alone.tokens) << "assisted " << assisted << " row " << r;
        longest = std::max(longest, alone.stats.target_passes);
      }
      grouped_passes += longest;
    }
    for (size_t r = 0; r < prompts.size(); ++r) {
      EXPECT_EQ(state[r], 2) << r;
      EXPECT_EQ(finished[r].tokens, got.results[r].tokens) << r;
      EXPECT_EQ(finished[r].stats.total_seconds, got.results[r].stats.total_seconds) << r;
      EXPECT_LE(got.results[r].stats.total_seconds, got.stats.total_seconds) << r;
    }
    if (!assisted) EXPECT_LT(got.stats.target_passes, grouped_passes);
    EXPECT_EQ(got.stats.rows, 10);
  }
}

// Without a draft model, prompt-lookup and target-only rows share one batch, each as it is alone.
TEST(Batch, PromptLookupAndTargetOnlyRowsShareABatch) {
  const Pair p = pair_for("llama", 2);
  const Generator g(p.target);
  const std::vector<std::vector<int64_t>> prompts = {
      {5, 6, 7, 5, 6, 7, 5}, {9, 3, 9, 3, 9}, {4, 4, 8}};
  std::vector<GenerationConfig> configs(3);
  for (GenerationConfig& c : configs) c.max_new_tokens = 10;
  configs[0].prompt_lookup_num_tokens = 3;
  configs[2].prompt_lookup_num_tokens = 2;
  const BatchResult got = g.generate_batch(prompts, configs);
  for (size_t r = 0; r < prompts.size(); ++r)
    EXPECT_EQ(got.results[r].tokens, g.generate(prompts[r], configs[r]).tokens) << "row " << r;
  EXPECT_EQ(got.results[1].stats.drafted_tokens, 0);
}

// With a draft model, rows that ask for prompt lookup draft by it and the others with the draft
// (under different schedules), in one batch whose rows join and leave as others finish.
TEST(Batch, DraftModelAndPromptLookupRowsShareABatch) {
  const Pair p = pair_for("llama", 2);
  const Generator g(p.target, p.draft), alone(p.target);
  const std::vector<std::vector<int64_t>> prompts = {
      {5, 6, 7, 5, 6, 7, 5}, {9, 3, 9, 3, 9}, {4, 4, 8}, {11, 12, 11, 12}, {7}, {20, 21, 20}};
  std::vector<GenerationConfig> configs(prompts.size());
  for (size_t r = 0; r < configs.size(); ++r) {
    configs[r].max_new_tokens = 6 + 3 * static_cast<int64_t>(r % 3);
    if (r % 3 == 0) configs[r].prompt_lookup_num_tokens = 3;
    // constant: goodput, the greedy default, may not draft on a tiny model
    if (r % 3 != 0) configs[r].num_assistant_tokens_schedule = "constant";
    if (r % 3 == 2) configs[r].num_assistant_tokens = 2;
  }
  BatchOptions options;
  options.max_rows = 3;
  const BatchResult got = g.generate_batch(prompts, configs, {}, options);
  for (size_t r = 0; r < prompts.size(); ++r) {
    EXPECT_EQ(got.results[r].tokens, alone.generate(prompts[r], configs[r]).tokens) << "row " << r;
    // The draft model never ran for a lookup row; it drafted for the others.
    if (r % 3 == 0) EXPECT_EQ(got.results[r].stats.draft_passes, 0) << "row " << r;
    if (r % 3 != 0) EXPECT_GT(got.results[r].stats.draft_passes, 0) << "row " << r;
  }
  EXPECT_GT(got.results[0].stats.drafted_tokens, 0);  // the repeated prompt gives lookup matches
  // A seeded sampled lookup row beside sampled draft rows: the tokens it gets alone.
  std::vector<GenerationConfig> sampled = configs;
  for (size_t r = 0; r < sampled.size(); ++r) {
    sampled[r].do_sample = true;
    sampled[r].seed = 100 + r;
  }
  const BatchResult mixed = g.generate_batch(prompts, sampled, {}, options);
  for (size_t r = 0; r < prompts.size(); ++r)
    EXPECT_EQ(mixed.results[r].tokens, g.generate(prompts[r], sampled[r]).tokens) << "row " << r;
  // goodput plans the lookup rows and the draft rows apart; greedy tokens stay the target's.
  std::vector<GenerationConfig> goodput = configs;
  for (GenerationConfig& c : goodput) c.num_assistant_tokens_schedule = "goodput";
  const BatchResult planned = g.generate_batch(prompts, goodput, {}, options);
  for (size_t r = 0; r < prompts.size(); ++r)
    EXPECT_EQ(planned.results[r].tokens, got.results[r].tokens) << "row " << r;
}

TEST(Batch, BadBatchesAreClearErrors) {
  const Pair p = pair_for("llama", 1);
  const Generator g(p.target, p.draft);
  GenerationConfig c;
  c.max_new_tokens = 4;
  const auto message = [&](const std::vector<std::vector<int64_t>>& prompts,
                           const std::vector<GenerationConfig>& configs) {
    try {
      g.generate_batch(prompts, configs);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({}, {c}).find("the batch is empty"), std::string::npos);
  EXPECT_NE(message({{3}, {4}, {}}, {c}).find("row 2: the prompt is empty"), std::string::npos);
  EXPECT_NE(
      message({{3}, {4, 96}}, {c}).find("row 1: prompt token id 96 is outside the vocabulary"),
      std::string::npos);
  EXPECT_NE(message({{3}, {4}, {5}}, {c, c}).find("2 configs for 3 prompts"), std::string::npos);
  GenerationConfig bad = c;
  bad.max_new_tokens = 0;
  EXPECT_NE(message({{3}, {4}}, {c, bad}).find("row 1: GenerationConfig.max_new_tokens"),
            std::string::npos);
  GenerationConfig long_one = c;
  long_one.max_new_tokens = p.target->config().max_position_embeddings;
  EXPECT_NE(message({{3}, {4}}, {c, long_one}).find("row 1: the prompt"), std::string::npos);
  // check() refuses a request as generate() would, before anything runs (a prompts file is
  // checked line by line with it)
  const auto checked = [&](const std::vector<int64_t>& prompt, const GenerationConfig& config) {
    try {
      g.check(prompt, config);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(checked({3, 4}, c), "no error");
  EXPECT_EQ(checked({4}, long_one).find("the prompt (1 token) plus max_new_tokens"), 0u);
  EXPECT_EQ(checked({96}, c).find("prompt token id 96 is outside the vocabulary"), 0u);
  EXPECT_EQ(checked({}, c).find("the prompt is empty"), 0u);
  BatchOptions negative;
  negative.max_rows = -1;
  try {
    g.generate_batch({{3}}, {c}, {}, negative);
    ADD_FAILURE() << "max_rows -1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_rows must be >= 0"), std::string::npos) << e.what();
  }
}

}  // namespace specdec::test
