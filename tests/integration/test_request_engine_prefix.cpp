// RequestEngine and prompts: a request that continues an earlier one reuses its cached prefix;
// prompts go in in chunks, beside rows that decode and together with one another; each output
// equals Generator::generate of that request alone.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "request_engine_cases.hpp"
#include "test_util.hpp"

namespace specdec::test {
namespace {

// A request that continues an earlier one (its prompt and answer, then more: a chat's next turn)
// computes only what follows the cached prefix, and its tokens are those it gets alone; the LRU
// keeps at most prefix_cache sequences.
TEST(RequestEngine, ARequestContinuingAnEarlierOneReusesItsCache) {
  const Models m = models();
  for (const bool draft : {false, true}) {
    SCOPED_TRACE(draft ? "with a draft" : "target-only");
    const Generator gen(m.target, draft ? m.draft : nullptr);
    RequestEngine::Options o;
    o.context = 96;
    o.prefix_cache = 2;
    RequestEngine engine(gen, o);
    const GenerationConfig c = config_of(2, false);
    std::vector<int64_t> next = answered(engine, prompt_of(2), c);
    // The cache holds every position but the answer's last token (no pass computed it yet).
    const int64_t held = static_cast<int64_t>(next.size()) - 1;
    next.insert(next.end(), {5, 9, 11});
    Output second, unrelated;
    engine.submit(request(next, c, second));
    engine.submit(request(prompt_of(4), c, unrelated));  // beside it, from nothing cached
    run_all(engine);
    EXPECT_EQ(second.cached, held);
    EXPECT_EQ(second.finished, gen.generate(next, c).tokens);
    EXPECT_EQ(unrelated.cached, 0);
    EXPECT_EQ(unrelated.finished, gen.generate(prompt_of(4), c).tokens);
    // Two more sequences push the first conversation out of a 2-entry cache.
    for (const int64_t i : {5, 6}) {
      run_alone(engine, prompt_of(i), c);
    }
    const Output again = run_alone(engine, next, c);
    EXPECT_EQ(again.cached, 0);
    EXPECT_EQ(again.finished, second.finished);
  }
}

// A continuation longer than a prefill chunk goes in in chunks after the cached prefix, alone or
// beside a decoding request; its tokens are those it gets alone.
TEST(RequestEngine, ALongContinuationReusesItsPrefixAndGoesInInChunks) {
  const Models m = models();
  for (const bool draft : {false, true}) {
    SCOPED_TRACE(draft ? "with a draft" : "target-only");
    const Generator gen(m.target, draft ? m.draft : nullptr);
    RequestEngine::Options o;
    o.context = 128;
    o.prefill_chunk = 8;
    RequestEngine engine(gen, o);
    const GenerationConfig c = config_of(2, false);
    const std::vector<int64_t> turn = answered(engine, prompt_of(2), c);
    const int64_t held = static_cast<int64_t>(turn.size()) - 1;
    for (const bool beside : {false, true}) {
      SCOPED_TRACE(beside ? "beside a decoding request" : "alone");
      // 31 uncached positions (4 chunks), different after the shared turn in each round.
      std::vector<int64_t> next = turn;
      for (int64_t i = 0; i < 30; ++i) next.push_back((i * 7) % 50 + 3 + beside);
      Output second, other;
      if (beside) {
        engine.submit(request(prompt_of(4), c, other));
        engine.step();
      }
      engine.submit(request(next, c, second));
      // 31 positions at 8 per step: no token for 3 steps, while the other request decodes.
      for (int s = 0; s < 3; ++s) {
        const size_t before = other.streamed.size();
        engine.step();
        EXPECT_TRUE(second.streamed.empty()) << "step " << s;
        if (beside) EXPECT_GT(other.streamed.size(), before) << "step " << s;
      }
      run_all(engine);
      // (The first round computed the turn's last token too.)
      EXPECT_EQ(second.cached, held + beside);
      EXPECT_EQ(second.finished, gen.generate(next, c).tokens);
      if (beside) EXPECT_EQ(other.finished, gen.generate(prompt_of(4), c).tokens);
    }
  }
}

// Continuations of cached sequences (rests of 3 and 9 after prefixes of different lengths) and a
// fresh prompt, arriving together while a request decodes, go in together in one batched prefill
// (each from its own prefix; the rows ordered by their rests, not their lengths): all three start
// at the next step, and every output is the one it gets alone.
TEST(RequestEngine, ContinuationsArrivingTogetherGoInTogether) {
  const Models m = models();
  for (const bool draft : {false, true}) {
    SCOPED_TRACE(draft ? "with a draft" : "target-only");
    const Generator gen(m.target, draft ? m.draft : nullptr);
    RequestEngine::Options o;
    o.context = 96;
    o.prefill_chunk = 64;
    o.prefix_cache = 4;
    RequestEngine engine(gen, o);
    GenerationConfig c = config_of(1, false);
    c.max_new_tokens = 8;
    std::vector<std::vector<int64_t>> next;
    for (const int64_t i : {2, 5}) {
      std::vector<int64_t> turn = answered(engine, prompt_of(i), c);
      for (int64_t j = 0; j < (i == 2 ? 3 : 9); ++j) turn.push_back((i * 7 + j * 3) % 50 + 3);
      next.push_back(turn);
    }
    std::vector<int64_t> fresh;
    for (int64_t j = 0; j < 6; ++j) fresh.push_back((j * 11) % 50 + 4);
    next.push_back(fresh);
    Output running;
    engine.submit(request(prompt_of(1), c, running));
    engine.step();
    std::vector<Output> out(3);
    for (size_t i = 0; i < 3; ++i) engine.submit(request(next[i], c, out[i]));
    engine.step();
    for (size_t i = 0; i < 3; ++i) EXPECT_FALSE(out[i].streamed.empty()) << "request " << i;
    run_all(engine);
    EXPECT_GT(out[0].cached, 0);
    EXPECT_GT(out[1].cached, 0);
    EXPECT_EQ(out[2].cached, 0);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_EQ(out[i].finished, gen.generate(next[i], c).tokens) << "request " << i;
    EXPECT_EQ(running.finished, gen.generate(prompt_of(1), c).tokens);
  }
}

// A long prompt that joins while a request decodes goes in a chunk per step: the running request
// gets tokens during that prefill, and both outputs are those they get alone.
TEST(RequestEngine, ALongPromptJoinsInChunksWhileTheOthersDecode) {
  const Models m = models();
  for (const bool draft : {false, true}) {
    SCOPED_TRACE(draft ? "with a draft" : "target-only");
    const Generator gen(m.target, draft ? m.draft : nullptr);
    RequestEngine::Options o;
    o.context = 160;
    o.prefill_chunk = 16;
    RequestEngine engine(gen, o);
    GenerationConfig c = config_of(1, false);
    c.max_new_tokens = 40;
    std::vector<int64_t> longer;
    for (int64_t i = 0; i < 100; ++i) longer.push_back((i * 13) % 60 + 2);
    Output running, joining;
    engine.submit(request(prompt_of(1), c, running));
    engine.step();
    const size_t before = running.streamed.size();
    engine.submit(request(longer, c, joining));
    // 99 prompt positions at 16 per step: the joining row has no token for 6 steps.
    for (int s = 0; s < 6; ++s) {
      engine.step();
      EXPECT_TRUE(joining.streamed.empty()) << "step " << s;
    }
    EXPECT_GT(running.streamed.size(), before + 3) << "the running row waited for the prefill";
    run_all(engine);
    EXPECT_EQ(running.finished, gen.generate(prompt_of(1), c).tokens);
    EXPECT_EQ(joining.finished, gen.generate(longer, c).tokens);
  }
}

// Prompts that arrive together while a request decodes share prefill_chunk prompt tokens per step,
// in the order they came: 16 per step for prompts of 11, 11 and 11 positions to put in lets the
// first start at once, the second in the next step (5 + 6) and the third in the one after
// (5 + 6 wait, then the last). A prompt whose prefix is cached goes in apart from the decoding rows
// too. The running request gets a token at every step, and every output is the one it gets alone.
TEST(RequestEngine, PromptsArrivingTogetherShareThePrefillTokensOfAStep) {
  const Models m = models();
  for (const bool draft : {false, true}) {
    SCOPED_TRACE(draft ? "with a draft" : "target-only");
    const Generator gen(m.target, draft ? m.draft : nullptr);
    RequestEngine::Options o;
    o.context = 96;
    o.prefill_chunk = 16;
    RequestEngine engine(gen, o);
    GenerationConfig c = config_of(1, false);
    c.max_new_tokens = 12;
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t i = 0; i < 3; ++i) {
      std::vector<int64_t> p;
      for (int64_t j = 0; j < 12; ++j) p.push_back((i * 11 + j * 5) % 50 + 3);
      prompts.push_back(p);
    }
    Output running;
    engine.submit(request(prompt_of(1), c, running));
    engine.step();
    std::vector<Output> out(3);
    for (int64_t i = 0; i < 3; ++i) engine.submit(request(prompts[i], c, out[i]));
    const std::vector<std::vector<bool>> started = {
        {true, false, false}, {true, true, false}, {true, true, true}};
    for (size_t s = 0; s < started.size(); ++s) {
      const size_t before = running.streamed.size();
      engine.step();
      EXPECT_GT(running.streamed.size(), before) << "step " << s;
      for (int64_t i = 0; i < 3; ++i)
        EXPECT_EQ(!out[i].streamed.empty(), started[s][i]) << "step " << s << ", prompt " << i;
    }
    run_all(engine);
    EXPECT_EQ(running.finished, gen.generate(prompt_of(1), c).tokens);
    for (int64_t i = 0; i < 3; ++i)
      EXPECT_EQ(out[i].finished, gen.generate(prompts[i], c).tokens) << "prompt " << i;
    // The first prompt's sequence is cached: a continuation of it joins beside a decoding request.
    std::vector<int64_t> next = prompts[0];
    next.insert(next.end(), out[0].finished.begin(), out[0].finished.end());
    next.insert(next.end(), {7, 8, 9, 10});
    Output other, continued;
    engine.submit(request(prompt_of(2), c, other));
    engine.step();
    engine.submit(request(next, c, continued));
    run_all(engine);
    EXPECT_GT(continued.cached, 0);
    EXPECT_EQ(continued.finished, gen.generate(next, c).tokens);
    EXPECT_EQ(other.finished, gen.generate(prompt_of(2), c).tokens);
  }
}

TEST(RequestEngine, ARequestCancelledWhileItsPromptGoesInLeavesAtTheNextStep) {
  const Models m = models();
  const Generator gen(m.target, m.draft);
  RequestEngine::Options o;
  o.context = 160;
  o.prefill_chunk = 16;
  RequestEngine engine(gen, o);
  GenerationConfig c = config_of(1, false);
  c.max_new_tokens = 30;
  Output running, joining;
  engine.submit(request(prompt_of(1), c, running));
  engine.step();
  const RequestEngine::Id id = engine.submit(request(std::vector<int64_t>(100, 7), c, joining));
  engine.step();
  engine.step();
  EXPECT_EQ(engine.load().running, 2) << "the joining request holds its place";
  engine.cancel(id);
  engine.step();
  EXPECT_TRUE(joining.done);
  EXPECT_EQ(joining.stop_reason, "cancelled");
  EXPECT_TRUE(joining.streamed.empty());
  run_all(engine);
  EXPECT_EQ(running.finished, gen.generate(prompt_of(1), c).tokens);
}

// A prompt longer than a chunk goes in a chunk per step even when nothing else runs: a step never
// runs longer than a chunk's prefill, so a cancel (a client that leaves, a shutdown's deadline)
// is met between chunks, not after the whole prompt.
TEST(RequestEngine, ALongPromptAloneGoesInAChunkPerStep) {
  const Models& m = models();
  const Generator gen(m.target, nullptr);
  RequestEngine::Options o;
  o.context = 64;
  o.prefill_chunk = 4;
  RequestEngine engine(gen, o);
  GenerationConfig c = config_of(0, false);
  std::vector<int64_t> prompt;
  for (int64_t j = 0; j < 21; ++j) prompt.push_back(j % 50 + 3);
  Output cancelled, whole;
  const RequestEngine::Id id = engine.submit(request(prompt, c, cancelled));
  engine.step();  // its first chunk
  engine.cancel(id);
  run_all(engine);
  EXPECT_EQ(cancelled.stop_reason, "cancelled");
  EXPECT_TRUE(cancelled.finished.empty()) << "no token before the prompt is in";
  // Uncancelled: nothing streams while the 20 positions before the last go in, 4 a step; then the
  // chunks give generate()'s tokens.
  engine.submit(request(prompt, c, whole));
  for (int s = 0; s < 4; ++s) {
    engine.step();
    EXPECT_TRUE(whole.streamed.empty()) << "a token after " << s + 1 << " steps";
  }
  run_all(engine);
  EXPECT_EQ(whole.finished, gen.generate(prompt, c).tokens);
}

}  // namespace
}  // namespace specdec::test
