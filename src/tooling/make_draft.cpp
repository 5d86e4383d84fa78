// make-draft: distilling a small draft out of a llama-family or Gemma 3 target with libtorch
// autograd.
//
// The target labels the training sequences once, as generation runs it (its top kTopK next-token
// probabilities at every position). The draft trains as a plain, differentiable float32 decoder
// (DraftNet, draft_net.hpp: ATen ops only, none of the inference kernels, which have no gradients)
// and minimises KL(p || q) over those entries with AdamW.
#include "specdec/make_draft.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>
#include <tuple>

#include "checkpoint.hpp"
#include "draft_net.hpp"
#include "json.hpp"
#include "layers.hpp"
#include "specdec/chat.hpp"
#include "specdec/error.hpp"
#include "specdec/generator.hpp"
#include "specdec/model.hpp"
#include "specdec/tokenizer.hpp"
#include "tokenizers/tokenizer_base.hpp"
#include "util.hpp"

namespace specdec {

using nlohmann::json;

namespace {

constexpr int64_t kTopK = 32;  // target probabilities kept per position

using Net = detail::DraftNet;
using detail::load_draft_net;

// The first 64 embedding rows: what a target's fingerprint reads of its weights.
at::Tensor fingerprint_rows(const at::Tensor& embed) {
  return embed.narrow(0, 0, std::min<int64_t>(64, embed.size(0)));
}

// Identifies a target: its configuration and a checksum (64-bit FNV-1a) of the bytes of its first
// embedding rows, the same whatever the thread count (a float sum was not).
std::string fingerprint(const detail::SourceCheckpoint& src, const at::Tensor& embed) {
  json c = src.config_json;
  c.erase("torch_dtype");
  const at::Tensor rows = fingerprint_rows(embed).to(at::kFloat).contiguous();
  return c.dump() + " embed-fnv1a:" +
         tok::fnv1a_hex({static_cast<const char*>(rows.data_ptr()), rows.nbytes()});
}

// Whether `stored` (a run's state.json) names the target whose fingerprint is `print`: equal, or
// the float sum of `embed`'s first rows that runs made before the checksum stored (the
// configuration equal, the sum within rounding).
bool made_from(const std::string& stored, const std::string& print, const at::Tensor& embed) {
  if (stored == print) return true;
  const size_t at_sum = stored.rfind(" embed:");
  if (at_sum == std::string::npos ||
      stored.compare(0, at_sum, print, 0, print.rfind(" embed-fnv1a:")) != 0)
    return false;
  const double sum = std::strtod(stored.c_str() + at_sum + 7, nullptr);
  const at::Tensor rows = fingerprint_rows(embed);
  const double fresh = rows.sum().item<double>(), scale = rows.abs().sum().item<double>();
  return std::abs(sum - fresh) <= 1e-5 * std::max(1.0, scale);
}

// A prompt's ids: as a user turn in the chat template when there is one, else the plain text.
std::vector<int64_t> prompt_ids(const std::string& line, const Tokenizer& tok,
                                const std::optional<ChatTemplate>& chat) {
  return chat ? tok.encode(chat->render({{"user", line}}, true), false) : tok.encode(line, true);
}

std::optional<ChatTemplate> target_chat(const std::string& target) {
  if (auto text = read_chat_template(target)) return ChatTemplate::recognise(*text, target);
  return std::nullopt;
}

// The non-blank lines of a prompts file (`flag` names it in errors).
std::vector<std::string> prompt_lines(const std::string& file, const std::string& flag) {
  std::ifstream in(file);
  SPECDEC_CHECK(in.good(), "make-draft: ", flag, " ", file, ": cannot read the file");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) lines.push_back(line);
  SPECDEC_CHECK(!lines.empty(), "make-draft: ", flag, " ", file, " has no prompt (one per line)");
  return lines;
}

// The training data: fixed-length chunks with the target's top-k labels.
struct Data {
  at::Tensor ids;       // [N, S] int64 (padding: 0)
  at::Tensor lengths;   // [N] int64: real tokens of each chunk
  at::Tensor top_ids;   // [N, S, kTopK] int32
  at::Tensor top_p;     // [N, S, kTopK] float32
  at::Tensor head_ids;  // [V'] int64, or empty for a full head
  int64_t train = 0;    // chunks [0, train) train, the rest are held out
  at::Tensor features;  // [N, S, H] 16-bit: the target's hidden states (--features), or undefined
  std::vector<at::Tensor> tensors() const {
    std::vector<at::Tensor> t = {ids, lengths, top_ids, top_p, head_ids, at::tensor(train)};
    if (features.defined()) t.push_back(features);
    return t;
  }
  static Data from(const std::vector<at::Tensor>& t) {
    SPECDEC_CHECK(t.size() == 6 || t.size() == 7,
                  "make-draft: training/data.pt is not a make-draft data file");
    return {
        t[0], t[1], t[2], t[3], t[4], t[5].item<int64_t>(), t.size() == 7 ? t[6] : at::Tensor()};
  }
  // The feature-fed draft's inputs for chunks `rows` ([n] int64), or undefined.
  at::Tensor features_of(const at::Tensor& rows) const {
    return features.defined() ? features.index_select(0, rows).to(at::kFloat) : at::Tensor();
  }
};

// Splits sequences into chunks of `s` tokens (a last piece shorter than 2 tokens is dropped) and
// shuffles them with `seed`.
std::pair<at::Tensor, at::Tensor> chunk(const std::vector<std::vector<int64_t>>& seqs, int64_t s,
                                        uint64_t seed) {
  std::vector<std::vector<int64_t>> pieces;
  for (const auto& q : seqs)
    for (size_t at = 0; at + 2 <= q.size(); at += static_cast<size_t>(s))
      pieces.emplace_back(
          q.begin() + static_cast<std::ptrdiff_t>(at),
          q.begin() + static_cast<std::ptrdiff_t>(std::min(q.size(), at + static_cast<size_t>(s))));
  at::Tensor ids = at::zeros({static_cast<int64_t>(pieces.size()), s}, at::kLong);
  at::Tensor lengths = at::empty({static_cast<int64_t>(pieces.size())}, at::kLong);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const auto n = static_cast<int64_t>(pieces[i].size());
    ids[static_cast<int64_t>(i)].narrow(0, 0, n).copy_(at::tensor(pieces[i], at::kLong));
    lengths[static_cast<int64_t>(i)] = n;
  }
  const at::Tensor order =
      at::randperm(ids.size(0), at::detail::createCPUGenerator(seed), at::kLong);
  return {ids.index_select(0, order), lengths.index_select(0, order)};
}

// The `n` most frequent ids of the training chunks, plus the EOS ids, ascending.
std::vector<int64_t> frequent_ids(const Data& d, int64_t n, const ModelConfig& c) {
  const at::Tensor mask =
      at::arange(d.ids.size(1)).unsqueeze(0) < d.lengths.narrow(0, 0, d.train).unsqueeze(1);
  const at::Tensor counts =
      at::bincount(d.ids.narrow(0, 0, d.train).masked_select(mask), {}, c.vocab_size);
  std::vector<int64_t> order(static_cast<size_t>(c.vocab_size));
  std::iota(order.begin(), order.end(), 0);
  const auto* cnt = counts.data_ptr<int64_t>();
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return cnt[a] > cnt[b]; });
  std::vector<int64_t> ids(order.begin(), order.begin() + n);
  for (int64_t e : c.eos_token_ids)
    if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
  std::sort(ids.begin(), ids.end());
  return ids;
}

// The ids of a head over the `n` most frequent tokens (empty tensor: n = 0, the full head).
at::Tensor head_ids(const Data& d, int64_t n, const ModelConfig& c) {
  return n > 0 ? at::tensor(frequent_ids(d, n, c), at::kLong) : at::empty({0}, at::kLong);
}

// KL(p' || q) per position [.., S] over the labelled entries: top_p [.., S, K] the target's
// probabilities, pos their places in the head (-1: outside it), logq [.., S, K] the draft's
// log-probabilities there; p' is p over the entries in the head, renormalised.
at::Tensor label_kl(const at::Tensor& top_p, const at::Tensor& pos, const at::Tensor& logq) {
  const at::Tensor p = top_p * (pos >= 0);
  const at::Tensor pn = p / p.sum(-1, true).clamp_min(1e-30);
  return (at::xlogy(pn, pn) - pn * logq).sum(-1);
}

// KL, acceptance and greedy agreement of a draft's logits against the stored top-k labels, over
// the real positions of `rows` (the acceptance counts only the top-k entries: a lower bound).
DraftQuality label_quality(const Net& net, const Data& d, const at::Tensor& head_pos, int64_t begin,
                           int64_t end, int64_t batch) {
  torch::NoGradGuard no_grad;
  DraftQuality q;
  double kl = 0, acc = 0, agree = 0;
  for (int64_t b = begin; b < end; b += batch) {
    const int64_t n = std::min(batch, end - b);
    const at::Tensor logq = at::log_softmax(
        net.forward(d.ids.narrow(0, b, n), d.features_of(at::arange(b, b + n))), -1);  // [n, S, Vh]
    const at::Tensor mask =
        at::arange(d.ids.size(1)).unsqueeze(0) < d.lengths.narrow(0, b, n).unsqueeze(1);
    const at::Tensor pos =
        head_pos.index_select(0, d.top_ids.narrow(0, b, n).reshape(-1).to(at::kLong))
            .view({n, d.ids.size(1), kTopK});  // [n, S, K]: -1 outside the head
    const at::Tensor valid = pos >= 0;
    const at::Tensor lq = logq.gather(-1, pos.clamp_min(0));
    kl += label_kl(d.top_p.narrow(0, b, n), pos, lq).masked_select(mask).sum().item<double>();
    acc += at::minimum(d.top_p.narrow(0, b, n) * valid, lq.exp() * valid)
               .sum(-1)
               .masked_select(mask)
               .sum()
               .item<double>();
    const at::Tensor top1 =
        head_pos.index_select(0, d.top_ids.narrow(0, b, n).select(-1, 0).reshape(-1).to(at::kLong))
            .view({n, d.ids.size(1)});
    agree += (logq.argmax(-1) == top1).masked_select(mask).sum().item<double>();
    q.positions += mask.sum().item<int64_t>();
  }
  if (q.positions > 0)
    q.kl = kl / q.positions, q.acceptance = acc / q.positions,
    q.greedy_agreement = agree / q.positions;
  return q;
}

// The target as make-draft runs it.
std::shared_ptr<const Model> load_target(const MakeDraftOptions& o) {
  LoadOptions lo;
  lo.int8_activations = o.int8_activations;
  return load_model(o.target, lo);
}

using Progress = std::function<void(const MakeDraftProgress&)>;
using Stopped = std::function<bool()>;

// The target's outputs for `prompts` (one config each), 8 a batch; nullopt when stopped. `phase`
// names the work in progress reports.
std::optional<std::vector<std::vector<int64_t>>> generate_all(
    const Generator& gen, const std::vector<std::vector<int64_t>>& prompts,
    const std::vector<GenerationConfig>& configs, const std::string& phase,
    const Progress& progress, const Stopped& stopped) {
  std::vector<std::vector<int64_t>> out;
  const auto t0 = Clock::now();
  int64_t made = 0;
  for (size_t b = 0; b < prompts.size(); b += 8) {
    if (stopped()) return std::nullopt;
    const auto first = static_cast<std::ptrdiff_t>(b),
               last = static_cast<std::ptrdiff_t>(std::min(prompts.size(), b + 8));
    const BatchResult r = gen.generate_batch({prompts.begin() + first, prompts.begin() + last},
                                             {configs.begin() + first, configs.begin() + last});
    for (const GenerationResult& g : r.results) {
      made += static_cast<int64_t>(g.tokens.size());
      out.push_back(g.tokens);
    }
    const double dt = seconds_since(t0);
    progress({phase, last, static_cast<int64_t>(prompts.size()), 0, made / dt,
              dt / static_cast<double>(last) *
                  static_cast<double>(static_cast<std::ptrdiff_t>(prompts.size()) - last)});
  }
  return out;
}

// The start of a user turn in `chat`: what the target sees before it writes a user's message.
std::string user_turn_prefix(const ChatTemplate& chat) {
  const std::string marker = "\x01specdec-user-message\x01";
  const std::string text = chat.render({{"user", marker}}, false);
  return text.substr(0, text.find(marker));
}

// The training sequences: the --data files, then the prompts (--prompts, and --self-prompts written
// by the target) with the target's own answers. nullopt when stopped.
std::optional<std::vector<std::vector<int64_t>>> training_text(const MakeDraftOptions& o,
                                                               const Progress& progress,
                                                               const Stopped& stopped) {
  for (const std::string& f : o.data_files) {
    SPECDEC_CHECK(!std::filesystem::is_directory(f), "make-draft: --data ", f,
                  " is a folder: give the text files in it (--data a.txt b.txt ...)");
    SPECDEC_CHECK(std::ifstream(f).good(), "make-draft: --data ", f, ": cannot read the file");
  }
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(o.target);
  std::vector<std::vector<int64_t>> seqs;
  for (const std::string& f : o.data_files) {
    seqs.push_back(tok->encode(read_text_file(f), false));
    SPECDEC_CHECK(!seqs.back().empty(), "make-draft: --data ", f, " holds no text");
  }
  if (o.prompts_file.empty() && o.self_prompts == 0) return seqs;
  const std::optional<ChatTemplate> chat = target_chat(o.target);
  std::vector<std::string> lines;
  if (!o.prompts_file.empty()) lines = prompt_lines(o.prompts_file, "--prompts");
  // The target writes its prompts itself: a chat model user messages, from its chat template up
  // to the start of a user turn until the turn ends (as in Magpie, Xu et al. 2024); a base model
  // (no chat template) the start of a text, from BOS alone.
  const std::vector<int64_t> start = o.self_prompts == 0 ? std::vector<int64_t>()
                                     : chat ? tok->encode(user_turn_prefix(*chat), false)
                                            : tok->encode("", true);
  SPECDEC_CHECK(o.self_prompts == 0 || !start.empty(), "make-draft: --self-prompts needs a target ",
                "with a chat template or a BOS token; ", o.target,
                " has neither (give --prompts or --data)");
  const Generator gen(load_target(o));
  if (o.self_prompts > 0) {
    // Sampled at temperature 1, at most 64 tokens; repeats and empty prompts are dropped.
    const std::vector<std::vector<int64_t>> starts(static_cast<size_t>(o.self_prompts), start);
    std::vector<GenerationConfig> configs(starts.size());
    for (size_t i = 0; i < configs.size(); ++i) {
      configs[i].max_new_tokens = 64;
      configs[i].do_sample = true;
      configs[i].seed = o.seed + 1000003 * (i + 1);
    }
    const auto written = generate_all(gen, starts, configs, "self-prompts", progress, stopped);
    if (!written) return std::nullopt;
    std::set<std::string> seen(lines.begin(), lines.end());
    for (const auto& ids : *written) {
      std::string text = tok->decode(ids, true);
      const size_t begin = text.find_first_not_of(" \t\r\n"),
                   end = text.find_last_not_of(" \t\r\n");
      if (begin == std::string::npos) continue;
      text = text.substr(begin, end - begin + 1);
      if (seen.insert(text).second) lines.push_back(text);
    }
  }
  // Every prompt once per temperature, each answer with its own seed.
  std::vector<std::vector<int64_t>> prompts;
  std::vector<GenerationConfig> configs;
  for (double t : o.gen_temperatures)
    for (const std::string& line : lines) {
      prompts.push_back(prompt_ids(line, *tok, chat));
      GenerationConfig g;
      g.max_new_tokens = o.gen_tokens;
      g.do_sample = t > 0;
      if (g.do_sample) g.temperature = t;
      g.seed = o.seed + prompts.size() - 1;
      configs.push_back(g);
    }
  const auto answers = generate_all(gen, prompts, configs, "generate", progress, stopped);
  if (!answers) return std::nullopt;
  for (size_t i = 0; i < prompts.size(); ++i) {
    seqs.push_back(prompts[i]);
    seqs.back().insert(seqs.back().end(), (*answers)[i].begin(), (*answers)[i].end());
  }
  return seqs;
}

// The draft in o.out against the target on the target's greedy answers (o.gen_tokens new tokens)
// to `lines`, answer positions only; nullopt when stopped.
std::optional<DraftQuality> measure_on_prompts(const MakeDraftOptions& o,
                                               const std::vector<std::string>& lines,
                                               const Progress& progress, const Stopped& stopped) {
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(o.target);
  const std::optional<ChatTemplate> chat = target_chat(o.target);
  const auto target = load_target(o);
  std::vector<std::vector<int64_t>> seqs;
  for (const std::string& line : lines) seqs.push_back(prompt_ids(line, *tok, chat));
  GenerationConfig greedy;
  greedy.max_new_tokens = o.gen_tokens;
  const auto answers =
      generate_all(Generator(target), seqs, std::vector<GenerationConfig>(seqs.size(), greedy),
                   "evaluate", progress, stopped);
  if (!answers) return std::nullopt;
  std::vector<int64_t> first;
  for (size_t i = 0; i < seqs.size(); ++i) {
    first.push_back(static_cast<int64_t>(seqs[i].size()));
    seqs[i].insert(seqs[i].end(), (*answers)[i].begin(), (*answers)[i].end());
  }
  return evaluate_draft(*target, *load_model(o.out), seqs, first);
}

// Fills data.top_ids / top_p with the target's top-k next-token probabilities at every position,
// computed by the target as generation runs it (its own kernels and weight format, `batch` chunks a
// pass; a chunk's padding comes after its real tokens, so it changes none of their logits).
// False when stopped.
bool label(Data& data, const Model& target, int64_t batch, bool features, const Progress& progress,
           const Stopped& stopped) {
  const int64_t n = data.ids.size(0), s = data.ids.size(1);
  data.top_ids = at::empty({n, s, kTopK}, at::kInt);
  data.top_p = at::empty({n, s, kTopK}, at::kFloat);
  // float16, except for Gemma, whose hidden states outgrow its range (as its activations do):
  // bfloat16 there.
  if (features)
    data.features =
        at::zeros({n, s, target.config().hidden_size},
                  target.config().model_type == "gemma3_text" ? at::kBFloat16 : at::kHalf);
  c10::InferenceMode guard;
  const auto t0 = Clock::now();
  for (int64_t b = 0; b < n; b += batch) {
    if (stopped()) return false;
    const int64_t m = std::min(batch, n - b);
    KVCache cache = target.make_cache(s, m, features);
    const at::Tensor logits =
        target.forward(data.ids.narrow(0, b, m).to(target.device()), cache).cpu();  // [m, S, V]
    if (features) data.features.narrow(0, b, m).copy_(cache.hidden().narrow(0, 0, m));
    const auto [p, i] = at::log_softmax(logits, -1).topk(kTopK, -1);
    data.top_p.narrow(0, b, m).copy_(p.exp());
    data.top_ids.narrow(0, b, m).copy_(i);
    const double dt = seconds_since(t0);
    progress({"label", b + m, n, 0, static_cast<double>((b + m) * s) / dt,
              dt / static_cast<double>(b + m) * static_cast<double>(n - b - m)});
  }
  return true;
}

// The data of an earlier run's output folder.
Data read_data(const std::string& folder) {
  std::vector<at::Tensor> t;
  torch::load(t, folder + "/training/data.pt");
  return Data::from(t);
}

struct RunState {
  std::string target_fingerprint;
  std::vector<int64_t> layer_ids;
  int64_t seq_len = 0, step = 0;
  bool features = false, int8_activations = false;  // how the data was labelled
  json to_json() const {
    return {{"target", target_fingerprint}, {"layer_ids", layer_ids},
            {"seq_len", seq_len},           {"step", step},
            {"features", features},         {"int8_activations", int8_activations}};
  }
  // A training/state.json (to_json's); an error names the file.
  static RunState read(const std::string& path) {
    try {
      const json s = detail::parse_json_bounded(read_text_file(path), path);
      RunState r;
      r.target_fingerprint = s.at("target").get<std::string>();
      r.layer_ids = s.at("layer_ids").get<std::vector<int64_t>>();
      r.seq_len = s.at("seq_len").get<int64_t>();
      r.step = s.at("step").get<int64_t>();
      r.features = s.value("features", false);
      r.int8_activations = s.value("int8_activations", false);
      return r;
    } catch (const json::exception& e) {
      throw Error(path + ": " + detail::json_message(e));
    }
  }
};

// Writes the draft folder `out` as a whole: built beside it as `out`.next, then swapped in.
void write_draft_folder(const std::string& out, const detail::SourceCheckpoint& src,
                        const std::string& target, const Net& net, const Data& data,
                        torch::optim::Optimizer& opt, const RunState& state) {
  const std::string next = out + ".next", prev = out + ".prev";
  remove_tree(next);
  json c = src.config_json;
  c["num_hidden_layers"] = static_cast<int64_t>(net.layers.size());
  if (net.gemma()) {  // each kept layer keeps its kind (layer_types: transformers 4.53+ and 5)
    std::vector<std::string> types;
    for (const auto& l : net.layers)
      types.push_back(l.sliding ? "sliding_attention" : "full_attention");
    c["layer_types"] = types;
    c.erase("sliding_window_pattern");
  }
  c["tie_word_embeddings"] = false;
  c["torch_dtype"] = "float32";
  c.erase("head_token_ids");
  c.erase("specdec_feature_size");
  if (net.fc.defined()) c["specdec_feature_size"] = src.config.hidden_size;
  if (data.head_ids.numel() > 0)
    c["head_token_ids"] =
        std::vector<int64_t>(data.head_ids.data_ptr<int64_t>(),
                             data.head_ids.data_ptr<int64_t>() + data.head_ids.numel());
  detail::make_dir(next + "/training");
  if (!src.gguf) detail::copy_tokenizer_files(target, next);
  const std::string old_data = out + "/training/data.pt";
  if (path_exists(old_data)) {
    hard_link(old_data, next + "/training/data.pt");
  } else {
    torch::save(data.tensors(), next + "/training/data.pt");
  }
  torch::save(opt, next + "/training/optimizer.pt");
  write_file_atomic(next + "/training/state.json", state.to_json().dump(2) + "\n");
  detail::write_checkpoint(next, c, net.named());
  remove_tree(prev);
  if (path_exists(out)) rename_path(out, prev);
  rename_path(next, out);
  remove_tree(prev);
}

}  // namespace

void MakeDraftOptions::validate() const {
  SPECDEC_CHECK(!target.empty(), "make-draft: --target is required");
  SPECDEC_CHECK(!out.empty(), "make-draft: --out is required");
  SPECDEC_CHECK(layer_ids.empty() ? layers >= 1 : true, "make-draft: --layers must be >= 1, got ",
                layers);
  for (size_t i = 0; i < layer_ids.size(); ++i) {
    SPECDEC_CHECK(layer_ids[i] >= 0, "make-draft: --layer-ids must be >= 0, got ", layer_ids[i]);
    SPECDEC_CHECK(std::count(layer_ids.begin(), layer_ids.end(), layer_ids[i]) == 1,
                  "make-draft: --layer-ids lists layer ", layer_ids[i], " twice");
  }
  SPECDEC_CHECK(vocab_subset >= 0, "make-draft: --vocab-subset must be >= 1, got ", vocab_subset);
  SPECDEC_CHECK(self_prompts >= 0, "make-draft: --self-prompts must be >= 0, got ", self_prompts);
  SPECDEC_CHECK(
      resume || !data_files.empty() || !prompts_file.empty() || self_prompts > 0 ||
          !data_from.empty(),
      "make-draft: give training text: --data FILE..., --prompts FILE and/or --self-prompts N, or "
      "--data-from DIR");
  SPECDEC_CHECK(
      data_from.empty() || (data_files.empty() && prompts_file.empty() && self_prompts == 0),
      "make-draft: --data-from reuses another run's text and labels; it cannot be combined with "
      "--data, "
      "--prompts or --self-prompts");
  SPECDEC_CHECK(gen_tokens >= 1, "make-draft: --gen-tokens must be >= 1");
  SPECDEC_CHECK(!gen_temperatures.empty(),
                "make-draft: --gen-temperature needs at least one value");
  for (double t : gen_temperatures)
    SPECDEC_CHECK(t >= 0 && std::isfinite(t),
                  "make-draft: --gen-temperature must be a finite number >= 0, got ", t);
  SPECDEC_CHECK(steps >= 0, "make-draft: --steps must be >= 0");
  SPECDEC_CHECK(seq_len >= 2, "make-draft: --seq-len must be >= 2");
  SPECDEC_CHECK(batch >= 1, "make-draft: --batch must be >= 1");
  SPECDEC_CHECK(lr > 0 && std::isfinite(lr), "make-draft: --lr must be > 0");
  SPECDEC_CHECK(threads >= 0, "make-draft: --threads must be >= 0");
  SPECDEC_CHECK(checkpoint_every >= 1, "make-draft: --checkpoint-every must be >= 1");
}

MakeDraftResult make_draft(const MakeDraftOptions& o,
                           const std::function<void(const MakeDraftProgress&)>& on_progress,
                           const std::atomic<bool>* stop) {
  o.validate();
  const std::vector<std::string> eval_lines = o.eval_prompts.empty()
                                                  ? std::vector<std::string>()
                                                  : prompt_lines(o.eval_prompts, "--eval-prompts");
  set_num_threads(o.threads > 0 ? o.threads : default_num_threads());
  const Progress progress = [&](const MakeDraftProgress& p) {
    if (on_progress) on_progress(p);
  };
  const Stopped stopped = [&] { return stop != nullptr && stop->load(); };
  const std::string out = o.out;
  // A swap interrupted between its two renames leaves the last checkpoint as `out`.prev.
  if (o.resume && !path_exists(out) && path_exists(out + ".prev")) rename_path(out + ".prev", out);
  if (o.resume) {
    SPECDEC_CHECK(path_exists(out + "/training/state.json"), out,
                  ": nothing to resume (no training/state.json; was it written by make-draft?)");
  } else {
    SPECDEC_CHECK(!path_exists(out), out,
                  ": already exists; remove it, or pass --resume to continue its training");
  }
  const detail::SourceCheckpoint src = detail::open_checkpoint(o.target);
  const ModelConfig& c = src.config;
  SPECDEC_CHECK(
      (llama_family(c.model_type) || c.model_type == "gemma3_text") && c.head_token_ids.empty(),
      "make-draft: ", o.target, " is a ", c.model_type,
      c.head_token_ids.empty() ? "" : " draft with a reduced head",
      " model; make-draft supports llama, mistral, qwen2, qwen3 and gemma3 targets");

  RunState state;
  Data data;
  if (o.resume) {
    state = RunState::read(out + "/training/state.json");
    SPECDEC_CHECK(state.features == o.features, out, ": was made ",
                  state.features ? "with" : "without", " --features; resume it the same way");
    SPECDEC_CHECK(state.int8_activations == o.int8_activations, out, ": was labelled ",
                  state.int8_activations ? "with" : "without",
                  " --int8-activations; resume it the same way");
    data = read_data(out);
  } else {
    SPECDEC_CHECK(!o.layer_ids.empty() || o.layers <= c.num_hidden_layers, "make-draft: --layers ",
                  o.layers, ", but ", o.target, " has ", c.num_hidden_layers, " layers");
    state.layer_ids = o.layer_ids;
    if (state.layer_ids.empty())
      for (int64_t i = 0; i < o.layers; ++i) state.layer_ids.push_back(i);
    state.seq_len = o.seq_len;
    state.features = o.features;
    state.int8_activations = o.int8_activations;
  }
  for (int64_t i : state.layer_ids)
    SPECDEC_CHECK(i < c.num_hidden_layers, "make-draft: layer ", i, " asked for, but ", o.target,
                  " has ", c.num_hidden_layers, " layers (0..", c.num_hidden_layers - 1, ")");
  SPECDEC_CHECK(o.vocab_subset <= c.vocab_size, "make-draft: --vocab-subset ", o.vocab_subset,
                " is larger than the vocabulary (", c.vocab_size, ")");

  if (!o.resume && !o.data_from.empty()) {
    // Another run's sequences and labels (same target, same --seq-len); the head is chosen anew.
    const std::string from = o.data_from + "/training/";
    SPECDEC_CHECK(path_exists(from + "data.pt") && path_exists(from + "state.json"),
                  "make-draft: --data-from ", o.data_from,
                  ": no training/data.pt (not a make-draft output folder)");
    const RunState labelled = RunState::read(from + "state.json");
    SPECDEC_CHECK(labelled.seq_len == state.seq_len, "make-draft: --data-from ", o.data_from,
                  " has sequences of ", labelled.seq_len, " tokens; --seq-len is ", state.seq_len);
    const at::Tensor embed =
        src.weights->load("model.embed_tokens.weight", at::kFloat, c10::Device(c10::kCPU));
    SPECDEC_CHECK(made_from(labelled.target_fingerprint, fingerprint(src, embed), embed),
                  "make-draft: --data-from ", o.data_from,
                  " was labelled by a different target than ", o.target);
    SPECDEC_CHECK(labelled.int8_activations == o.int8_activations, "make-draft: --data-from ",
                  o.data_from, " was labelled ", o.int8_activations ? "without" : "with",
                  " --int8-activations; pass the same");
    data = read_data(o.data_from);
    SPECDEC_CHECK(
        !o.features || data.features.defined(), "make-draft: --data-from ", o.data_from,
        " holds no target hidden states (it was made without --features); --features needs them");
    if (!o.features) data.features = at::Tensor();
    data.head_ids = head_ids(data, o.vocab_subset, c);
  } else if (!o.resume) {
    const auto seqs = training_text(o, progress, stopped);
    if (!seqs) return {0, true, {}, {}, {}};
    auto [ids, lengths] = chunk(*seqs, state.seq_len, o.seed);
    const int64_t n = ids.size(0);
    SPECDEC_CHECK(n >= 2, "make-draft: not enough training text: ", n, " sequence(s) of up to ",
                  state.seq_len, " tokens; at least 2 are needed (one is held out)");
    data.ids = ids;
    data.lengths = lengths;
    data.train = n - std::max<int64_t>(1, n / 20);
    data.head_ids = head_ids(data, o.vocab_subset, c);
    if (!label(data, *load_target(o), o.batch, o.features, progress, stopped))
      return {0, true, {}, {}, {}};
  }

  // 3. The draft, and the run state that must match on --resume.
  Net net = load_draft_net(
      src, state.layer_ids,
      std::vector<int64_t>(data.head_ids.data_ptr<int64_t>(),
                           data.head_ids.data_ptr<int64_t>() + data.head_ids.numel()));
  const at::Tensor target_norm =
      net.norm.detach().clone();  // the feature loss's space (before a resume loads the draft's)
  if (state.features) {
    const int64_t h = c.hidden_size;
    net.fc = at::cat({at::eye(h), at::zeros({h, h})}, 1);  // [I, 0]: the plain draft, to start from
    net.fc_norm = target_norm.clone();
  }
  const std::string print = fingerprint(src, net.embed);  // (before a resume loads the draft's)
  if (o.resume) {
    SPECDEC_CHECK(made_from(state.target_fingerprint, print, net.embed), out,
                  ": was made from a different target than ", o.target,
                  " (configuration or weights differ); resume with the target it was made from");
    const WeightStore saved(out);
    // named() hands out views of the Net's own tensors: copying into them restores the checkpoint.
    for (auto& [name, t] : net.named()) {
      SPECDEC_CHECK(saved.contains(name), out, ": checkpoint has no tensor '", name, "'");
      t.copy_(saved.load(name, at::kFloat, c10::Device(c10::kCPU), t.sizes().vec()));
    }
  }
  state.target_fingerprint = print;
  std::vector<at::Tensor> params = net.trainable();
  for (at::Tensor& p : params) p.set_requires_grad(true);
  // fc and its norm (feature-fed drafts) in a group of their own at a tenth of the rate: Adam moves
  // every entry of fc by about the rate each step, which would soon drown the identity it starts
  // from.
  const std::ptrdiff_t fed = net.fc.defined() ? 2 : 0;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>(params.begin(), params.end() - fed));
  if (fed) groups.emplace_back(std::vector<at::Tensor>(params.end() - fed, params.end()));
  torch::optim::AdamW opt(groups, torch::optim::AdamWOptions(o.lr).weight_decay(0.0));
  constexpr double kFcRate = 0.1;
  if (o.resume) torch::load(opt, out + "/training/optimizer.pt");

  // Position of every vocabulary id in the head (-1: not in it).
  at::Tensor head_pos = at::arange(c.vocab_size, at::kLong);
  if (data.head_ids.numel() > 0) {
    head_pos = at::full({c.vocab_size}, -1, at::kLong);
    head_pos.index_copy_(0, data.head_ids, at::arange(data.head_ids.numel(), at::kLong));
  }
  const int64_t n_held = data.ids.size(0) - data.train;
  MakeDraftResult result;
  result.before = label_quality(net, data, head_pos, data.train, data.ids.size(0), o.batch);

  // 4. Distillation.
  const int64_t s = data.ids.size(1), warmup = std::max<int64_t>(1, o.steps / 20);
  const auto t0 = Clock::now();
  const int64_t first = state.step;
  auto checkpoint = [&] { write_draft_folder(out, src, o.target, net, data, opt, state); };
  while (state.step < o.steps) {
    if (stopped()) {
      result.interrupted = true;
      break;
    }
    const int64_t step = state.step;
    const double progress_frac = static_cast<double>(step) / static_cast<double>(o.steps);
    const double lr = step < warmup
                          ? o.lr * static_cast<double>(step + 1) / static_cast<double>(warmup)
                          : o.lr * (0.1 + 0.45 * (1 + std::cos(M_PI * progress_frac)));
    for (size_t g = 0; g < opt.param_groups().size(); ++g)
      static_cast<torch::optim::AdamWOptions&>(opt.param_groups()[g].options())
          .lr(g == 0 ? lr : kFcRate * lr);
    const at::Tensor rows = at::randint(
        data.train, {o.batch},
        at::detail::createCPUGenerator(o.seed * 1000003 + static_cast<uint64_t>(step)), at::kLong);
    const at::Tensor ids = data.ids.index_select(0, rows);  // [B, S]
    const at::Tensor mask =
        at::arange(s).unsqueeze(0) < data.lengths.index_select(0, rows).unsqueeze(1);  // [B, S]
    const at::Tensor pos =
        head_pos.index_select(0, data.top_ids.index_select(0, rows).reshape(-1).to(at::kLong))
            .view({o.batch, s, kTopK});                  // [B, S, K]
    const at::Tensor features = data.features_of(rows);  // [B, S, H] or undefined
    at::Tensor last;                                     // [B, S, H]
    const at::Tensor logq = at::log_softmax(net.forward(ids, features, &last), -1)
                                .gather(-1, pos.clamp_min(0));  // [B, S, K]
    at::Tensor loss =
        (label_kl(data.top_p.index_select(0, rows), pos, logq) * mask).sum() / mask.sum();
    // Feature-fed: the draft's output also learns the target's hidden state (what it reads back as
    // the next position's feature when it drafts on), smooth L1 as in EAGLE, both through the
    // target's final norm: the raw states have entries in the thousands, which would drown the KL.
    if (features.defined()) {
      const at::Tensor gap =
          at::smooth_l1_loss(net.rms(last, target_norm), net.rms(features, target_norm),
                             at::Reduction::None);  // [B, S, H]
      loss = loss + 0.1 * (gap.mean(-1) * mask).sum() / mask.sum();
    }
    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(params, 1.0);
    opt.step();
    ++state.step;
    const double dt = seconds_since(t0);
    const double per_step = dt / static_cast<double>(state.step - first);
    progress({"train", state.step, o.steps, loss.item<double>(),
              static_cast<double>(o.batch * s) / per_step,
              per_step * static_cast<double>(o.steps - state.step)});
    if (state.step % o.checkpoint_every == 0 && state.step < o.steps) checkpoint();
  }
  checkpoint();
  result.steps_done = state.step;
  result.after = label_quality(net, data, head_pos, data.train, data.train + n_held, o.batch);
  if (!eval_lines.empty() && !result.interrupted) {
    const auto q = measure_on_prompts(o, eval_lines, progress, stopped);
    if (q) result.eval = *q;
    result.interrupted = !q;
  }
  return result;
}

DraftQuality evaluate_draft(const Model& target, const Model& draft,
                            const std::vector<std::vector<int64_t>>& sequences,
                            const std::vector<int64_t>& first) {
  SPECDEC_CHECK(first.empty() || first.size() == sequences.size(), "evaluate_draft: ", first.size(),
                " first positions for ", sequences.size(), " sequences");
  SPECDEC_CHECK(target.config().vocab_size == draft.config().vocab_size,
                "evaluate_draft: vocabulary sizes differ (", target.config().vocab_size, " vs ",
                draft.config().vocab_size, ")");
  c10::InferenceMode guard;
  DraftQuality q;
  double kl = 0, acc = 0, agree = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const std::vector<int64_t>& seq = sequences[i];
    const auto n = static_cast<int64_t>(seq.size());
    const int64_t from =
        first.empty() ? 1 : first[i];  // the first token whose prediction is scored
    SPECDEC_CHECK(from >= 1, "evaluate_draft: first positions must be >= 1, got ", from);
    if (from >= n) continue;
    const at::Tensor ids = at::tensor(seq, at::kLong).view({1, n});
    const bool fed = draft.config().feature_size > 0;
    KVCache tc = target.make_cache(n, 1, fed), dc = draft.make_cache(n);
    if (fed) dc.set_feature_source(&tc);  // the target runs first
    // Positions from - 1 .. n - 2 predict tokens from .. n - 1.
    const at::Tensor p = at::softmax(target.forward(ids.to(target.device()), tc).cpu()[0], -1)
                             .narrow(0, from - 1, n - from);  // [T', V]
    const at::Tensor logq = at::log_softmax(draft.forward(ids.to(draft.device()), dc).cpu()[0], -1)
                                .narrow(0, from - 1, n - from);
    const at::Tensor q_ = logq.exp();
    const at::Tensor support = q_ > 0;
    const at::Tensor pr =
        p * support / (p * support).sum(-1, true).clamp_min(1e-30);  // p restricted to q's support
    kl += (at::xlogy(pr, pr) - at::where(support, pr * logq, at::zeros_like(pr)))
              .sum()
              .item<double>();
    acc += at::minimum(p, q_).sum().item<double>();
    agree += (p.argmax(-1) == logq.argmax(-1)).sum().item<double>();
    q.positions += n - from;
  }
  if (q.positions > 0)
    q.kl = kl / q.positions, q.acceptance = acc / q.positions,
    q.greedy_agreement = agree / q.positions;
  return q;
}

}  // namespace specdec
