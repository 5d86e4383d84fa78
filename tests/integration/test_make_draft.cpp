// make-draft: a draft distilled from a small generated target, end to end in seconds. Training must
// lower the KL measured through the inference path on text it did not see; a reduced head keeps
// greedy output exact; an interrupted run resumes to bitwise the draft of an uninterrupted one; bad
// input leaves no folder behind.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <random>
#include <set>
#include <sstream>

#include "test_util.hpp"
#include "tooling/checkpoint.hpp"
#include "tooling/draft_net.hpp"
#include "util.hpp"

namespace specdec::test {
namespace {

// Pseudo-English text from a fixed word list (seeded): repeated patterns a small draft can learn.
std::string text(uint32_t seed, int words) {
  static const char* kWords[] = {"the",   "cat",  "sat", "on",  "a",   "mat",   "and",
                                 "dog",   "ran",  "to",  "big", "red", "house", "in",
                                 "small", "town", "we",  "saw", "it",  "."};
  std::mt19937 rng(seed);
  std::string s;
  int prev = 0;
  for (int i = 0; i < words; ++i) {
    // Each word strongly predicts the next one (a Markov chain with a favourite successor).
    const int w = rng() % 4 == 0 ? static_cast<int>(rng() % 20) : (prev * 7 + 3) % 20;
    s += kWords[w];
    s += ' ';
    prev = w;
  }
  return s;
}

struct Setup {
  std::string target, train_file;
  std::vector<std::vector<int64_t>> held_out;
};

// A 4-layer target of `arch` with the tiny BPE tokenizer (263 ids), peaked outputs, no early-exit
// scaling, cached as `name`.
std::string small_target(const std::string& name, const std::string& arch = "llama") {
  FixtureOptions o = small_fixture(5, 4, arch);
  o.exit_layers = -1;
  o.exit_scale = 1.0;
  o.init_std = 0.15;
  o.tokenizer_dir = test_data("tiny_bpe");
  return cached_fixture(name, o);
}

const Setup& setup() {
  static const Setup s = [] {
    Setup r;
    r.target = small_target("make_draft_target");
    const std::string dir = temp_dir("make_draft_text");
    r.train_file = dir + "/train.txt";
    write_file(r.train_file, text(1, 3000));
    const auto tok = load_tokenizer(r.target);
    for (uint32_t seed : {101u, 102u, 103u})
      r.held_out.push_back(tok->encode(text(seed, 60), false));
    return r;
  }();
  return s;
}

MakeDraftOptions options(const std::string& out) {
  MakeDraftOptions o;
  o.target = setup().target;
  o.out = out;
  o.data_files = {setup().train_file};
  o.steps = 40;
  o.seq_len = 32;
  o.batch = 4;
  o.lr = 3e-3;
  o.checkpoint_every = 10;
  return o;
}

TEST(MakeDraft, TrainingLowersTheHeldOutKLThroughTheInferencePath) {
  const std::string root = temp_dir("make_draft_kl");
  MakeDraftOptions o = options(root + "/untrained");
  o.steps = 0;
  const MakeDraftResult r0 = make_draft(o);
  EXPECT_EQ(r0.steps_done, 0);
  o.out = root + "/trained";
  o.steps = 80;
  const MakeDraftResult r = make_draft(o);
  EXPECT_EQ(r.steps_done, 80);
  EXPECT_FALSE(r.interrupted);
  EXPECT_LT(r.after.kl, r.before.kl);

  const auto target = load_model(setup().target);
  const DraftQuality before =
      evaluate_draft(*target, *load_model(root + "/untrained"), setup().held_out);
  const DraftQuality after =
      evaluate_draft(*target, *load_model(root + "/trained"), setup().held_out);
  EXPECT_GT(before.positions, 100);
  EXPECT_LT(after.kl, 0.85 * before.kl) << before.kl << " -> " << after.kl;
  EXPECT_GT(after.acceptance, before.acceptance);
  // An ordinary checkpoint folder: the target's tokenizer files came along.
  EXPECT_TRUE(path_exists(root + "/trained/tokenizer.json"));
  EXPECT_EQ(load_model(root + "/trained")->config().num_hidden_layers, 1);
}

// Greedy output with `draft` at lookahead `k` on the held-out texts' first 8 tokens equals the
// target's own (the slow step-by-step oracle's); returns the draft tokens accepted.
int64_t accepted_if_exact(const std::shared_ptr<const Model>& target,
                          const std::shared_ptr<const Model>& draft, int64_t k) {
  const Generator assisted(target, draft);
  GenerationConfig g;
  g.max_new_tokens = 24;
  g.num_assistant_tokens = k;
  g.num_assistant_tokens_schedule = "constant";  // goodput, the greedy default, may not draft
  int64_t accepted = 0;
  for (const auto& seq : setup().held_out) {
    const std::vector<int64_t> prompt(seq.begin(), seq.begin() + 8);
    const GenerationResult a = assisted.generate(prompt, g);
    EXPECT_EQ(a.tokens,
              oracle_greedy(*target, prompt, g.max_new_tokens, target->config().eos_token_ids));
    accepted += a.stats.accepted_tokens;
  }
  return accepted;
}

TEST(MakeDraft, AllLayersUntrainedIsTheTarget) {
  MakeDraftOptions o = options(temp_dir("make_draft_all") + "/d");
  o.layer_ids = {0, 1, 2, 3};
  o.steps = 0;
  // The labels are the target's own distributions, so the whole target agrees with every one.
  EXPECT_EQ(make_draft(o).before.greedy_agreement, 1.0);
  const DraftQuality q =
      evaluate_draft(*load_model(setup().target), *load_model(o.out), setup().held_out);
  EXPECT_LT(q.kl, 1e-6);
  EXPECT_EQ(q.greedy_agreement, 1.0);
}

TEST(MakeDraft, AReducedHeadKeepsGreedyOutputExact) {
  MakeDraftOptions o = options(temp_dir("make_draft_head") + "/d");
  o.vocab_subset = 30;
  make_draft(o);
  const auto draft = load_model(o.out);
  const auto& ids = draft->config().head_token_ids;
  const auto target = load_model(setup().target);
  ASSERT_GE(ids.size(), 30u);
  ASSERT_LE(ids.size(), 31u);  // plus EOS when it is not among the 30
  EXPECT_TRUE(std::find(ids.begin(), ids.end(), target->config().eos_token_ids[0]) != ids.end());
  EXPECT_GT(accepted_if_exact(target, draft, 4), 0);
}

std::map<std::string, at::Tensor> tensors_of(const std::string& dir) {
  const WeightStore w(dir);
  std::map<std::string, at::Tensor> t;
  for (const std::string& name : w.names())
    t[name] = w.load(name, at::kFloat, c10::Device(c10::kCPU));
  return t;
}

TEST(MakeDraft, AnInterruptedRunResumesToTheSameDraft) {
  const std::string root = temp_dir("make_draft_resume");
  MakeDraftOptions o = options(root + "/whole");
  o.steps = 16;
  o.checkpoint_every = 4;
  o.vocab_subset = 40;
  make_draft(o);

  o.out = root + "/parts";
  std::atomic<bool> stop{false};
  const MakeDraftResult first = make_draft(
      o, [&](const MakeDraftProgress& p) { stop = p.phase == "train" && p.done == 6; }, &stop);
  EXPECT_TRUE(first.interrupted);
  EXPECT_EQ(first.steps_done, 6);
  EXPECT_EQ(read_json(o.out + "/training/state.json")["step"], 6);
  EXPECT_FALSE(path_exists(o.out + ".next"));
  EXPECT_FALSE(path_exists(o.out + ".prev"));
  o.resume = true;
  o.data_files.clear();
  const MakeDraftResult rest = make_draft(o);
  EXPECT_EQ(rest.steps_done, 16);
  const auto whole = tensors_of(root + "/whole"), parts = tensors_of(root + "/parts");
  ASSERT_EQ(whole.size(), parts.size());
  for (const auto& [name, t] : whole) EXPECT_TRUE(at::equal(t, parts.at(name))) << name;
}

// A run made before the target's fingerprint was a checksum stored the float sum of its first
// 64 embedding rows: it still resumes with its target (the sum within rounding), not with another.
TEST(MakeDraft, ARunWithTheEarlierFingerprintResumes) {
  MakeDraftOptions o = options(temp_dir("make_draft_old_print") + "/d");
  o.steps = 1;
  make_draft(o);
  const std::string state_path = o.out + "/training/state.json";
  nlohmann::json state = read_json(state_path);
  const std::string print = state["target"];
  const size_t at = print.find(" embed-fnv1a:");
  ASSERT_NE(at, std::string::npos) << print;
  const at::Tensor embed =
      WeightStore(o.target).load("model.embed_tokens.weight", at::kFloat, c10::Device(c10::kCPU));
  const double sum = embed.narrow(0, 0, 64).sum().item<double>();
  const auto resume_with = [&](double stored_sum) {
    std::ostringstream old;
    old.precision(17);
    old << print.substr(0, at) << " embed:" << stored_sum;
    state["target"] = old.str();
    write_file(state_path, state.dump());
    MakeDraftOptions r = o;
    r.resume = true;
    r.data_files.clear();
    r.steps = 2;
    return make_draft(r).steps_done;
  };
  EXPECT_EQ(resume_with(sum * (1 + 1e-7)), 2);  // (a sum another thread count rounded otherwise)
  try {
    resume_with(sum + 1);
    ADD_FAILURE() << "another target's sum was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("was made from a different target"), std::string::npos)
        << e.what();
  }
}

// --features: the untrained draft (fc = [I, 0]) is the plain one through the inference path;
// training lowers its held-out KL there (its features coming from the target's cache); greedy
// output stays exact; the data keeps the target's hidden states, and runs without them refuse
// --features.
TEST(MakeDraft, AFeatureFedDraftTrainsAndKeepsGreedyOutputExact) {
  const std::string root = temp_dir("make_draft_features");
  MakeDraftOptions plain = options(root + "/plain");
  plain.steps = 0;
  make_draft(plain);
  MakeDraftOptions o = options(root + "/untrained");
  o.features = true;
  o.steps = 0;
  make_draft(o);
  const auto target = load_model(setup().target);
  const auto untrained = load_model(o.out);
  EXPECT_EQ(untrained->config().feature_size, target->config().hidden_size);
  const DraftQuality p0 = evaluate_draft(*target, *load_model(plain.out), setup().held_out);
  const DraftQuality f0 = evaluate_draft(*target, *untrained, setup().held_out);
  EXPECT_EQ(f0.kl, p0.kl);
  EXPECT_EQ(f0.greedy_agreement, p0.greedy_agreement);

  o.out = root + "/trained";
  o.steps = 80;
  o.data_from = root + "/untrained";
  o.data_files.clear();
  const MakeDraftResult r = make_draft(o);
  EXPECT_LT(r.after.kl, r.before.kl);
  const auto draft = load_model(o.out);
  const DraftQuality f1 = evaluate_draft(*target, *draft, setup().held_out);
  EXPECT_LT(f1.kl, 0.85 * f0.kl) << f0.kl << " -> " << f1.kl;

  EXPECT_GT(accepted_if_exact(target, draft, 3), 0);

  MakeDraftOptions bad = options(root + "/bad");
  bad.features = true;
  bad.data_files.clear();
  bad.data_from = plain.out;
  expect_error(bad, "holds no target hidden states");
  MakeDraftOptions resume = options(o.out);
  resume.resume = true;
  resume.data_files.clear();
  resume.steps = 90;
  expect_error(resume, "resume it the same way");
}

// make-draft's network (plain differentiable ATen ops) against the inference model, logit for
// logit, on a held-out text longer than Gemma's sliding window: targets made like setup()'s, then
// every norm weight drawn at random (so that a norm applied to the wrong tensor or after the
// rotation shows), Llama given every bias it can have and Gemma's query_pre_attn_scalar set apart
// from head_dim.
TEST(MakeDraft, TheDraftNetworkComputesWhatTheInferenceModelComputes) {
  for (const std::string arch : {"llama", "qwen3", "gemma3"}) {
    SCOPED_TRACE(arch);
    const std::string base = small_target("make_draft_" + arch, arch);
    const detail::SourceCheckpoint src = detail::open_checkpoint(base);
    at::manual_seed(11);
    std::map<std::string, at::Tensor> tensors;
    for (const std::string& name : src.weights->names()) {
      at::Tensor t = src.weights->load(name, at::kFloat, c10::Device(c10::kCPU));
      if (name.find("norm") != std::string::npos) t = t + 0.5 * at::randn_like(t);
      tensors[name] = t;
    }
    nlohmann::json c = src.config_json;
    if (arch == "llama") {  // Llama's attention_bias (o_proj's bias too) and mlp_bias
      c["attention_bias"] = c["mlp_bias"] = true;
      for (int64_t i = 0; i < src.config.num_hidden_layers; ++i)
        for (const char* m :
             {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
          const std::string p = "model.layers." + std::to_string(i) + "." + m;
          tensors[p + ".bias"] = 0.5 * at::randn({tensors.at(p + ".weight").size(0)});
        }
    }
    if (arch == "gemma3") {
      ASSERT_EQ(c.at("query_pre_attn_scalar").get<double>(), src.config.head_dim);
      c["query_pre_attn_scalar"] = 3 * src.config.head_dim;
    }
    const std::string dir = temp_dir("make_draft_net_" + arch);
    detail::write_checkpoint(dir, c, tensors);
    detail::copy_tokenizer_files(base, dir);
    const auto target = load_model(dir);
    const detail::DraftNet net =
        detail::load_draft_net(detail::open_checkpoint(dir), {0, 1, 2, 3}, {});
    const std::vector<int64_t>& seq = setup().held_out[0];
    ASSERT_GT(static_cast<int64_t>(seq.size()), 2 * target->config().sliding_window);
    const at::Tensor ids = at::tensor(seq, at::kLong).view({1, -1});
    KVCache cache = target->make_cache(ids.size(1));
    const at::Tensor want = target->forward(ids, cache);
    at::Tensor got;
    {
      c10::InferenceMode guard;
      got = net.forward(ids);
    }
    EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-4))
        << "max |difference| " << (got - want).abs().max().item<float>();
  }
}

// Qwen3 (q/k norms) and Gemma 3 (its sandwich layer, (1 + w) norms, scaled embeddings, sliding
// and global layers with their own rotary bases), on targets made like setup()'s: the draft network
// of all the target's layers, untrained, is the target through the inference path (which the
// Hugging Face fixtures check); a draft of layers 1 and 2 (Gemma: a global and a sliding one) keeps
// their kinds, and, feature-fed with a reduced head, trains to a lower held-out KL through the
// inference path and keeps greedy output exact.
TEST(MakeDraft, QwenAndGemmaTargets) {
  for (const std::string arch : {"qwen3", "gemma3"}) {
    SCOPED_TRACE(arch);
    const std::string root = temp_dir("make_draft_" + arch);
    const std::string base = small_target("make_draft_" + arch, arch);
    const auto target = load_model(base);
    MakeDraftOptions o = options(root + "/all");
    o.target = base;
    o.layer_ids = {0, 1, 2, 3};
    o.steps = 0;
    EXPECT_EQ(make_draft(o).before.greedy_agreement, 1.0);
    const DraftQuality all = evaluate_draft(*target, *load_model(o.out), setup().held_out);
    EXPECT_LT(all.kl, 1e-6);
    EXPECT_EQ(all.greedy_agreement, 1.0);

    o.out = root + "/untrained";
    o.layer_ids = {1, 2};
    o.vocab_subset = 40;
    o.features = true;
    make_draft(o);
    o.out = root + "/trained";
    o.steps = 80;
    o.data_from = root + "/untrained";
    o.data_files.clear();
    const MakeDraftResult r = make_draft(o);
    EXPECT_LT(r.after.kl, r.before.kl);
    const auto draft = load_model(o.out);
    EXPECT_EQ(draft->config().num_hidden_layers, 2);
    if (arch == "gemma3")
      EXPECT_EQ(draft->config().layer_types,
                (std::vector<std::string>{"full_attention", "sliding_attention"}));
    const DraftQuality before =
        evaluate_draft(*target, *load_model(root + "/untrained"), setup().held_out);
    const DraftQuality after = evaluate_draft(*target, *draft, setup().held_out);
    EXPECT_LT(after.kl, 0.85 * before.kl) << before.kl << " -> " << after.kl;
    const Generator assisted(target, draft);
    GenerationConfig g;
    g.max_new_tokens = 24;
    g.num_assistant_tokens = 3;
    for (const auto& seq : setup().held_out) {
      const std::vector<int64_t> prompt(seq.begin(), seq.begin() + 8);
      EXPECT_EQ(assisted.generate(prompt, g).tokens,
                oracle_greedy(*target, prompt, g.max_new_tokens, target->config().eos_token_ids));
    }
  }
}

// The real tokens of every training chunk a make-draft run wrote to `out`.
std::multiset<std::vector<int64_t>> training_chunks(const std::string& out) {
  std::vector<at::Tensor> data;
  torch::load(data, out + "/training/data.pt");
  const at::Tensor ids = data.at(0), lengths = data.at(1);  // [N, S], [N]
  std::multiset<std::vector<int64_t>> chunks;
  for (int64_t i = 0; i < ids.size(0); ++i) {
    const at::Tensor row = ids[i].narrow(0, 0, lengths[i].item<int64_t>()).contiguous();
    chunks.insert(
        std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel()));
  }
  return chunks;
}

// On-policy text: every prompt answered once per temperature; the greedy answer is the target's
// own greedy output for that prompt.
TEST(MakeDraft, PromptsAreAnsweredOncePerTemperature) {
  const std::string root = temp_dir("make_draft_prompts");
  const std::vector<std::string> lines = {"the cat sat", "a big red house", "we saw it"};
  std::string file;
  for (const auto& l : lines) file += l + "\n\n";
  write_file(root + "/prompts.txt", file);
  MakeDraftOptions o = options(root + "/d");
  o.data_files.clear();
  o.prompts_file = root + "/prompts.txt";
  o.gen_temperatures = {0, 0.7};
  o.gen_tokens = 6;
  o.steps = 0;
  make_draft(o);
  const auto chunks = training_chunks(o.out);
  ASSERT_EQ(chunks.size(), 6u);
  const auto tok = load_tokenizer(setup().target);
  const Generator gen(load_model(setup().target));
  GenerationConfig g;
  g.max_new_tokens = 6;
  for (const auto& l : lines) {
    std::vector<int64_t> seq = tok->encode(l, true);
    const size_t prompt = seq.size();
    const auto answer = gen.generate(seq, g).tokens;
    seq.insert(seq.end(), answer.begin(), answer.end());
    EXPECT_EQ(chunks.count(seq), 1u) << l << ": its greedy answer is not among the chunks";
    // ... and one sampled answer of the same prompt.
    EXPECT_EQ(std::count_if(chunks.begin(), chunks.end(),
                            [&](const std::vector<int64_t>& c) {
                              return c.size() > prompt &&
                                     std::equal(c.begin(),
                                                c.begin() + static_cast<std::ptrdiff_t>(prompt),
                                                seq.begin());
                            }),
              2)
        << l;
  }
  o = options(root + "/x");
  o.gen_temperatures = {};
  expect_error(o, "--gen-temperature");
  o.gen_temperatures = {0.7, -1};
  expect_error(o, "--gen-temperature must be a finite number >= 0");
}

// --eval-prompts: after training the target answers the prompts greedily and the draft is scored on
// the answers' positions only. Oracle: the greedy answers made through the public API, and the
// argmaxes of each model's logits over the whole sequence in one forward pass, compared by hand.
TEST(MakeDraft, EvalPromptsScoreTheAnswersOnly) {
  const std::string root = temp_dir("make_draft_eval");
  const std::vector<std::string> lines = {"the dog ran to", "a small town and",
                                          "it sat on the mat"};
  std::string file;
  for (const auto& l : lines) file += l + "\n";
  write_file(root + "/eval.txt", file);
  MakeDraftOptions o = options(root + "/d");
  o.eval_prompts = root + "/eval.txt";
  o.gen_tokens = 9;
  o.steps = 20;
  const MakeDraftResult r = make_draft(o);
  const auto target = load_model(setup().target), draft = load_model(o.out);
  const auto tok = load_tokenizer(setup().target);
  const Generator gen(target);
  GenerationConfig g;
  g.max_new_tokens = 9;
  int64_t positions = 0, agree = 0;
  for (const auto& l : lines) {
    std::vector<int64_t> seq = tok->encode(l, true);
    const auto prompt = static_cast<int64_t>(seq.size());
    const auto answer = gen.generate(seq, g).tokens;
    seq.insert(seq.end(), answer.begin(), answer.end());
    const auto n = static_cast<int64_t>(seq.size());
    const at::Tensor ids = at::tensor(seq, at::kLong).view({1, n});
    KVCache tc = target->make_cache(n), dc = draft->make_cache(n);
    const at::Tensor best_t = target->forward(ids, tc)[0].argmax(-1),
                     best_d = draft->forward(ids, dc)[0].argmax(-1);
    for (int64_t p = prompt - 1; p < n - 1; ++p)
      agree += best_t[p].item<int64_t>() == best_d[p].item<int64_t>();
    positions += n - prompt;
  }
  EXPECT_EQ(r.eval.positions, positions);
  EXPECT_DOUBLE_EQ(r.eval.greedy_agreement,
                   static_cast<double>(agree) / static_cast<double>(positions));
  EXPECT_GT(r.eval.kl, 0);
  MakeDraftOptions plain = options(root + "/plain");
  plain.steps = 0;
  EXPECT_EQ(make_draft(plain).eval.positions, 0) << "no eval prompts, no measurement";
}

// A copy of setup()'s target with `tokenizer_config` changes (a chat template, BOS added).
std::string target_copy(const std::string& name, const nlohmann::json& tokenizer_config) {
  const std::string target = temp_dir(name);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors",
                        "tokenizer.json", "vocab.json", "merges.txt", "added_tokens.json"})
    write_file(target + "/" + f, read_file(setup().target + "/" + f));
  nlohmann::json tc = read_json(setup().target + "/tokenizer_config.json");
  tc.update(tokenizer_config);
  write_file(target + "/tokenizer_config.json", tc.dump());
  return target;
}

// --self-prompts: a chat target writes its own user messages (sampled from the start of a user
// turn), a base target the start of a text (sampled from BOS), and answers them. Each prompt is
// checked against the same sampling done through the public API.
TEST(MakeDraft, SelfPromptsAreTheTargetsOwnMessages) {
  const std::string root = temp_dir("make_draft_self");
  const std::string chat_target = target_copy(
      "make_draft_self_target",
      {{"chat_template",
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] "
        "}}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}});
  const std::string base_target = target_copy("make_draft_self_base", {{"add_bos_token", true}});
  for (const std::string& target : {chat_target, base_target}) {
    SCOPED_TRACE(target);
    MakeDraftOptions o = options(root + "/d" + std::to_string(target == base_target));
    o.target = target;
    o.data_files.clear();
    o.self_prompts = 5;
    o.seed = 7;
    o.gen_temperatures = {0};
    o.gen_tokens = 4;
    o.steps = 0;
    make_draft(o);
    const auto chunks = training_chunks(o.out);

    const auto tok = load_tokenizer(target);
    const auto chat_text = read_chat_template(target);
    const std::optional<ChatTemplate> chat =
        chat_text ? std::optional<ChatTemplate>(ChatTemplate::recognise(*chat_text, target))
                  : std::nullopt;
    ASSERT_EQ(chat.has_value(), target == chat_target);
    const Generator gen(load_model(target));
    std::set<std::string> messages;
    for (uint64_t i = 0; i < 5; ++i) {
      GenerationConfig g;
      g.max_new_tokens = 64;
      g.do_sample = true;
      g.seed = 7 + 1000003 * (i + 1);
      std::vector<int64_t> start = tok->encode("", true);  // the base target: BOS
      if (chat) {
        const std::string turn = chat->render({{"user", "X"}}, false);
        start = tok->encode(turn.substr(0, turn.find('X')), false);
      }
      ASSERT_FALSE(start.empty());
      std::string text = tok->decode(gen.generate(start, g).tokens, true);
      text.erase(0, text.find_first_not_of(" \t\r\n"));
      text.erase(text.find_last_not_of(" \t\r\n") + 1);
      if (text.empty() || !messages.insert(text).second) continue;
      std::vector<int64_t> seq =
          chat ? tok->encode(chat->render({{"user", text}}, true), false) : tok->encode(text, true);
      GenerationConfig greedy;
      greedy.max_new_tokens = 4;
      const auto answer = gen.generate(seq, greedy).tokens;
      seq.insert(seq.end(), answer.begin(), answer.end());
      seq.resize(std::min<size_t>(seq.size(), static_cast<size_t>(o.seq_len)));
      EXPECT_EQ(chunks.count(seq), 1u)
          << "prompt " << i << " (" << text << ") and its greedy answer";
    }
    EXPECT_GE(messages.size(), 2u);
    EXPECT_GE(chunks.size(), messages.size());
  }

  MakeDraftOptions o = options(root + "/x");
  o.data_files.clear();
  o.self_prompts = 2;  // setup()'s target: no chat template, no BOS
  expect_error(o, "needs a target with a chat template or a BOS token");
  o.self_prompts = -1;
  expect_error(o, "--self-prompts must be >= 0");
}

TEST(MakeDraft, DataFromAnotherRunIsReused) {
  const std::string root = temp_dir("make_draft_reuse");
  MakeDraftOptions o = options(root + "/a");
  o.steps = 2;
  make_draft(o);
  MakeDraftOptions b = options(root + "/b");
  b.data_files.clear();
  b.data_from = o.out;
  b.vocab_subset = 20;
  b.steps = 2;
  make_draft(b);
  EXPECT_GE(load_model(b.out)->config().head_token_ids.size(), 20u);
  b.out = root + "/c";
  b.seq_len = 16;
  EXPECT_THROW(make_draft(b), Error);
  EXPECT_FALSE(path_exists(b.out));
}

TEST(MakeDraft, BadInputIsRefusedAndLeavesNoFolder) {
  const std::string root = temp_dir("make_draft_bad");
  MakeDraftOptions o = options(root + "/x");
  o.layers = 5;
  expect_error(o, "has 4 layers");
  o = options(root + "/x");
  o.layer_ids = {0, 0};
  expect_error(o, "twice");
  o = options(root + "/x");
  o.vocab_subset = 100000;
  expect_error(o, "larger than the vocabulary");
  o = options(root + "/x");
  o.data_files = {root + "/missing.txt"};
  expect_error(o, "cannot read");
  o = options(root + "/x");
  o.data_files.clear();
  expect_error(o, "give training text");
  o = options(root + "/x");
  o.target = cached_fixture("make_draft_gpt2", small_fixture(5, 2, "gpt2"));
  expect_error(o, "supports llama, mistral, qwen2, qwen3 and gemma3 targets");
  o = options(root + "/x");
  o.steps = -1;
  expect_error(o, "--steps");
  o = options(root + "/x");
  o.eval_prompts = root + "/missing_eval.txt";
  expect_error(o, "--eval-prompts");

  // An existing folder is never overwritten; a resume needs a make-draft folder of the same target.
  o = options(root + "/done");
  o.steps = 1;
  make_draft(o);
  expect_error(o, "already exists");
  o.resume = true;
  o.target = cached_fixture("make_draft_other", small_fixture(6, 4));
  expect_error(o, "different target");
  o = options(root + "/x");
  o.resume = true;
  expect_error(o, "nothing to resume");
}

}  // namespace
}  // namespace specdec::test
