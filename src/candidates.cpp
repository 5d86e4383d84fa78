#include "specdec/candidates.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

#include "kernels/kernels.hpp"
#include "prefill.hpp"
#include "specdec/error.hpp"
#include "util.hpp"

namespace specdec {

std::vector<int64_t> Candidates::depths() const {
  std::vector<int64_t> depth(size());
  for (size_t i = 0; i < size(); ++i)
    depth[i] = !tree()          ? static_cast<int64_t>(i)
               : parents[i] < 0 ? 0
                                : depth[static_cast<size_t>(parents[i])] + 1;
  return depth;
}

std::vector<double> Candidates::reach() const {
  std::vector<double> r(probs.size());
  for (size_t i = 0; i < probs.size(); ++i) {
    const int64_t parent = tree() ? parents[i] : static_cast<int64_t>(i) - 1;
    r[i] = probs[i] * (parent < 0 ? 1.0 : r[static_cast<size_t>(parent)]);
  }
  return r;
}

void Candidates::truncate(size_t n) {
  if (n >= size()) return;
  tokens.resize(n);
  if (!probs.empty()) probs.resize(n);
  if (q.defined()) q = q.narrow(0, 0, static_cast<int64_t>(n));
  if (!tree()) return;
  parents.resize(n);
  chain_if_unbranched();
}

void Candidates::chain_if_unbranched() {
  bool chain = true;
  for (size_t i = 0; i < parents.size(); ++i)
    chain = chain && parents[i] == static_cast<int64_t>(i) - 1;
  if (chain) parents.clear();
}

namespace {
bool contains(const std::vector<int64_t>& v, int64_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// A draft tree from its chain `c` (tokens and probabilities) and, at each depth, the other tokens
// the draft ranked next there with their probabilities (children of the chain's token above),
// ordered best first: by reach (ties: the shallower, then the chain's own), parents before
// children.
Candidates chain_with_siblings(const Candidates& c,
                               const std::vector<std::vector<std::pair<int64_t, double>>>& others) {
  struct Node {
    int64_t token;
    double prob, reach;
    int64_t depth, parent;  // parent: an index into `nodes`
    bool chain;
  };
  std::vector<Node> nodes;
  double above = 1.0;
  for (size_t d = 0; d < c.size(); ++d) {
    const int64_t parent = static_cast<int64_t>(nodes.size()) - 1;  // the chain's token above
    for (const auto& [token, p] : others[d])
      nodes.push_back({token, p, above * p, static_cast<int64_t>(d), parent, false});
    above *= c.probs[d];
    nodes.push_back({c.tokens[d], c.probs[d], above, static_cast<int64_t>(d), parent, true});
  }
  std::vector<int64_t> order(nodes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const Node &x = nodes[a], &y = nodes[b];
    if (x.reach != y.reach) return x.reach > y.reach;
    return x.depth != y.depth ? x.depth < y.depth : x.chain > y.chain;
  });
  std::vector<int64_t> index(nodes.size());
  for (size_t i = 0; i < order.size(); ++i) index[order[i]] = static_cast<int64_t>(i);
  Candidates out;
  for (const int64_t i : order) {
    out.tokens.push_back(nodes[i].token);
    out.probs.push_back(nodes[i].prob);
    out.parents.push_back(nodes[i].parent < 0 ? -1 : index[nodes[i].parent]);
  }
  out.chain_if_unbranched();  // no sibling
  return out;
}
}  // namespace

DraftModelGenerator::DraftModelGenerator(std::shared_ptr<const Model> draft, std::vector<Row> rows,
                                         int64_t max_length, Options options)
    : draft_(std::move(draft)),
      vocab_(options.target_vocab > 0 ? options.target_vocab : draft_->config().vocab_size) {
  SPECDEC_CHECK(!rows.empty(), "DraftModelGenerator: no rows");
  for (const Row& r : rows)
    rows_.push_back({r, std::make_shared<const LogitsProcessorChain>(*r.config)});
  const auto b = static_cast<int64_t>(rows_.size());
  KVCache& cache = options.cache;
  if (cache.num_layers() > 0) {
    SPECDEC_CHECK(!draft_->config().is_encoder_decoder && cache.batch() == b &&
                      cache.capacity() >= max_length &&
                      cache.num_layers() == draft_->config().num_hidden_layers,
                  "DraftModelGenerator: the cache to continue does not fit this draft and request");
    cache_ = std::move(cache);
  } else {
    cache_ = draft_->make_cache(max_length, b);
  }
  for (int64_t r = 0; r < b; ++r) attach(r);
  if (draft_->config().feature_size > 0) {
    const KVCache* target_cache = options.target_cache;
    SPECDEC_CHECK(target_cache && target_cache->keeps_hidden() && target_cache->batch() >= b &&
                      target_cache->hidden().size(2) == draft_->config().feature_size,
                  "DraftModelGenerator: a feature-fed draft (specdec_feature_size ",
                  draft_->config().feature_size,
                  ") needs the target's cache keeping hidden states of that size");
    cache_.set_feature_source(target_cache);
  }
}

std::vector<Candidates> DraftModelGenerator::propose_batch(
    const std::vector<const std::vector<int64_t>*>& tokens,
    const std::vector<int64_t>& max_tokens) {
  const auto b = static_cast<int64_t>(tokens.size());
  SPECDEC_CHECK(b <= static_cast<int64_t>(rows_.size()) && max_tokens.size() == tokens.size(),
                "DraftModelGenerator: ", b, " rows proposed for, ", rows_.size(), " held");
  std::vector<Candidates> out(b);
  const int64_t own = draft_->config().vocab_size;
  // Per row: how many to draft, what to feed next (the cache holds a prefix of its tokens; then
  // one drafted token per pass), the processor history (tokens + drafted so far) and q rows.
  std::vector<int64_t> todo(b, 0);
  std::vector<std::vector<int64_t>> pending(b), history(b);
  std::vector<std::vector<at::Tensor>> q_rows(b);
  // A tree row's other tokens at each depth (token, probability), beside its chain's.
  std::vector<std::vector<std::vector<std::pair<int64_t, double>>>> others(b);
  int64_t drafting = 0;
  for (int64_t r = 0; r < b; ++r) {
    State& st = rows_[r];
    const std::vector<int64_t>& seq = *tokens[r];
    pending[r].assign(seq.begin() + cache_.length(r), seq.end());
    // A token the draft has no row for (the target's vocabulary is larger): the draft cannot
    // follow this sequence any more, so the rest of the request runs without proposals.
    for (int64_t id : pending[r]) st.out_of_vocab = st.out_of_vocab || id >= own;
    st.proposed_from = static_cast<int64_t>(seq.size());
    st.chain.clear();
    st.chain_probs.clear();
    // A feature-fed draft waits for the target's hidden state of every position but the last.
    const KVCache* target = cache_.feature_source();
    const bool fed = !target || target->length(r) + 1 >= st.proposed_from;
    const int64_t wanted = std::min(st.row.schedule->num_tokens(), max_tokens[r]);
    todo[r] = st.out_of_vocab || !fed ? 0 : wanted;
    st.unable = todo[r] == 0 && wanted > 0;
    if (todo[r] > 0 && st.processors->reads_history()) history[r] = seq;
    drafting += todo[r] > 0;
  }
  last_steady_ = {};
  while (drafting > 0) {
    bool steady = true;  // every drafting row feeds at most 2 tokens in this pass
    for (int64_t r = 0; r < b; ++r) steady = steady && (todo[r] == 0 || pending[r].size() <= 2);
    const auto start = Clock::now();
    // One pass: row r feeds pending[r] while it drafts, nothing (padding) otherwise.
    std::vector<std::vector<int64_t>> feed(b);
    for (int64_t r = 0; r < b; ++r)
      if (todo[r] > 0) feed[r] = pending[r];
    std::vector<int64_t> counts;
    const at::Tensor ids = padded_ids(feed, counts);
    const at::Tensor logits = draft_->forward(ids, cache_, 1, counts);  // [B, 1, V_draft]
    ++passes_;
    // Every drafting row's token and its draft probability (1 where none is needed), brought to
    // the host in one copy per pass.
    std::vector<at::Tensor> picks;  // [2 W] float64 each: W tokens, then their probabilities
    std::vector<int64_t> picked;    // their rows
    for (int64_t r = 0; r < b; ++r) {
      if (todo[r] == 0) continue;
      State& st = rows_[r];
      ++st.passes;
      at::Tensor scores = logits[r];  // [1, V_draft]
      if (own > vocab_)
        scores = scores.narrow(-1, 0, vocab_);  // [1, V]: the draft's padding rows go
      if (own < vocab_)
        scores = at::constant_pad_nd(scores, {0, vocab_ - own},
                                     -std::numeric_limits<double>::infinity());
      if (!st.processors->empty()) scores = st.processors->apply(scores, history[r]);
      const int64_t width = std::min(st.row.tree_width, vocab_);
      at::Tensor idx, prob;  // [W] each
      if (st.row.config->sampling() && width == 1) {
        const at::Tensor q = scores.softmax(-1)[0];  // [V]
        idx = sample_index_tensor(q, st.row.rng->uniform());
        prob = q.gather(0, idx);
        q_rows[r].push_back(q);
      } else if (width > 1) {
        // Ranked, as argmax ranks the first; a sampled row's tree is deterministic too (the
        // verifier draws each node's token from p and follows the child holding it).
        idx = std::get<1>(scores[0].topk(width));
        prob = (scores[0].index_select(0, idx) - scores[0].logsumexp(0)).exp();
      } else {
        idx = kernels::argmax(scores[0]).view({1});
        // The probability where a schedule reads it (dynamic's stop).
        prob = st.row.schedule->kind() == Schedule::kDynamic
                   ? (scores[0].index_select(0, idx) - scores[0].logsumexp(0)).exp()
                   : at::ones({1}, scores.options());
      }
      picks.push_back(at::cat({idx.to(at::kDouble), prob.to(at::kDouble)}));
      picked.push_back(r);
    }
    const at::Tensor host = at::cat(picks).to(at::kCPU).contiguous();  // every row's [2 W]
    const double* next = host.data_ptr<double>();
    for (size_t j = 0; j < picked.size(); ++j) {
      const int64_t r = picked[j];
      State& st = rows_[r];
      const int64_t width = picks[j].size(0) / 2;
      const double* h = next;
      next += 2 * width;
      const auto tok = static_cast<int64_t>(h[0]);
      const double p = h[width];
      Candidates& c = out[r];
      c.tokens.push_back(tok);
      c.probs.push_back(p);
      if (width > 1) {
        others[r].emplace_back();
        for (int64_t w = 1; w < width; ++w)  // an id the draft cannot produce has probability 0
          if (h[width + w] > 0)
            others[r].back().emplace_back(static_cast<int64_t>(h[w]), h[width + w]);
      }
      if (st.processors->reads_history()) history[r].push_back(tok);
      if (static_cast<int64_t>(c.size()) == todo[r] ||
          contains(st.row.config->eos_token_ids, tok) || st.row.schedule->stop_after(p)) {
        todo[r] = 0;
        --drafting;
      }
      pending[r].assign(1, tok);
    }
    if (steady) {
      ++last_steady_.passes;
      last_steady_.seconds += seconds_since(start);
    }
  }
  for (int64_t r = 0; r < b; ++r) {
    rows_[r].chain = out[r].tokens;
    rows_[r].chain_probs = out[r].probs;
    if (!q_rows[r].empty()) out[r].q = at::stack(q_rows[r]);  // [K, V]
    if (others[r].empty()) continue;
    // A tree holds at most max_tokens[r] nodes (the target's cache has room for no more), its
    // best ones.
    out[r] = chain_with_siblings(out[r], others[r]);
    out[r].truncate(static_cast<size_t>(max_tokens[r]));
  }
  return out;
}

void DraftModelGenerator::prefill(const std::vector<const std::vector<int64_t>*>& tokens,
                                  const std::vector<int64_t>& slots) {
  const int64_t own = draft_->config().vocab_size;
  for (const auto* seq : tokens)
    for (const int64_t id : *seq)
      if (id >= own) return;
  // A feature-fed draft reads the target's rows by its own row numbers, which a scratch cache of
  // joining rows does not share: those rows catch up in their first proposal instead.
  if (cache_.feature_source() && !slots.empty()) return;
  passes_ += slots.empty() ? prefill_rows(*draft_, cache_, tokens)
                           : prefill_into(*draft_, cache_, slots, tokens);
}

void DraftModelGenerator::reset_row(int64_t slot, Row row) {
  SPECDEC_CHECK(slot >= 0 && slot < static_cast<int64_t>(rows_.size()), "DraftModelGenerator: row ",
                slot, " out of range");
  rows_[slot] = {row, std::make_shared<const LogitsProcessorChain>(*row.config)};
  cache_.crop(slot, 0);
  attach(slot);
}

void DraftModelGenerator::attach(int64_t slot) {
  const at::Tensor& states = rows_[slot].row.encoder_states;
  if (draft_->config().is_encoder_decoder && states.defined())
    draft_->attach_encoder(states, cache_, slot);
}

void DraftModelGenerator::on_verified_row(int64_t row, const Candidates& proposed, int64_t accepted,
                                          const std::vector<int64_t>& tokens) {
  // Keep only positions whose tokens the target confirmed; the newest token is never cached yet. A
  // feature-fed draft also drops what it computed from its own predicted hidden states (every
  // position past the sequence it proposed for), to recompute it from the target's.
  // The draft fed its chain after the sequence it proposed for: those positions are kept while
  // the verified sequence agrees with the chain (a tree's path may leave it for another token).
  State& st = rows_[row];
  int64_t valid = static_cast<int64_t>(tokens.size()) - 1;
  if (cache_.feature_source()) valid = std::min(valid, st.proposed_from);
  size_t agree = 0;
  while (agree < st.chain.size() && st.proposed_from + static_cast<int64_t>(agree) < valid &&
         tokens[st.proposed_from + static_cast<int64_t>(agree)] == st.chain[agree])
    ++agree;
  valid = std::min(valid, st.proposed_from + static_cast<int64_t>(agree));
  if (cache_.length(row) > valid) cache_.crop(row, valid);
  // A row the draft could not follow says nothing of the draft: its schedule stays (heuristic
  // counts an empty proposal as all accepted, as Hugging Face's last iteration does, and so grew K
  // by 2 per iteration without bound, padding every row's pass to it). A tree counts as its chain
  // down to the depth it kept.
  if (st.unable) return;
  if (!proposed.tree()) return st.row.schedule->update(proposed.probs, accepted);
  const std::vector<int64_t> depths = proposed.depths();
  const int64_t levels = *std::max_element(depths.begin(), depths.end()) + 1;
  st.row.schedule->update(
      std::vector<double>(st.chain_probs.begin(), st.chain_probs.begin() + levels), accepted);
}

void DraftModelGenerator::move_row(int64_t from, int64_t to) {
  cache_.copy_row(from, to);
  rows_[to] = rows_[from];
}

PromptLookupGenerator::PromptLookupGenerator(int64_t num_tokens, int64_t max_ngram,
                                             std::vector<int64_t> eos_ids, bool most_recent)
    : num_tokens_(num_tokens),
      max_ngram_(max_ngram),
      eos_ids_(std::move(eos_ids)),
      most_recent_(most_recent) {
  SPECDEC_CHECK(num_tokens_ >= 1, "prompt lookup: prompt_lookup_num_tokens must be >= 1");
  SPECDEC_CHECK(max_ngram_ >= 1, "prompt lookup: max_matching_ngram_size must be >= 1");
}

namespace {

// Each copied token's probability given the ones before it, estimated from the sequence itself:
// candidate d follows the context c_d = tokens[s, s + n + d) (the matched n-gram and the d tokens
// copied after it, which are also the sequence's last n + d tokens once the first d are kept).
// Of the N places where c_d occurs followed by a token (in the sequence with the first d
// candidates appended), `hits` are followed by candidate d: its estimate is
// hits / N * copy_goes_on(x), where x is how many tokens the match really spans (the n-gram
// extended back while the tokens before both occurrences agree) plus d. A common token's many
// continuations make a 1-gram's estimate small; the second factor is how often a copy of a match
// that long goes on at all, whatever the counts. [from, to): where the n-gram can occur (the
// leftmost match has no occurrence before s, the most recent one none after it).
std::vector<double> lookup_probs(const std::vector<int64_t>& tokens, int64_t s, int64_t n,
                                 const std::vector<int64_t>& copied, int64_t from, int64_t to) {
  const auto len = static_cast<int64_t>(tokens.size());
  const auto at = [&](int64_t i) { return i < len ? tokens[i] : copied[i - len]; };
  constexpr int64_t kMaxSpan = 64;  // bounds the walk back; a longer span changes little
  int64_t span = n;
  while (span < kMaxSpan && s - 1 - (span - n) >= 0 &&
         tokens[s - 1 - (span - n)] == tokens[len - 1 - span])
    ++span;
  // The places where c_0 (the sequence's last n tokens) occurs followed by a token; each depth
  // keeps those where the next token is the candidate before it (c_d extends c_{d-1} by it).
  std::vector<int64_t> starts;
  for (int64_t i = from; i < to; ++i)
    if (std::equal(tokens.begin() + i, tokens.begin() + i + n, tokens.end() - n))
      starts.push_back(i);
  std::vector<double> probs;
  for (size_t d = 0; d < copied.size(); ++d) {
    const auto depth = static_cast<int64_t>(d);
    if (d > 0)
      starts.erase(
          std::remove_if(starts.begin(), starts.end(),
                         [&](int64_t i) { return at(i + n + depth - 1) != copied[d - 1]; }),
          starts.end());
    const auto hits = std::count_if(starts.begin(), starts.end(),
                                    [&](int64_t i) { return at(i + n + depth) == copied[d]; });
    probs.push_back(static_cast<double>(hits) / static_cast<double>(starts.size()) *
                    copy_goes_on(static_cast<double>(span + depth)));
  }
  return probs;
}

}  // namespace

Candidates PromptLookupGenerator::propose(const std::vector<int64_t>& tokens, int64_t max_tokens) {
  Candidates out;
  const int64_t k = std::min(num_tokens_, max_tokens);
  const auto len = static_cast<int64_t>(tokens.size());
  if (k <= 0) return out;
  // Hugging Face's rule: the longest n-gram first; its leftmost earlier occurrence whose
  // continuation is not empty; the continuation is cut before its first EOS (an empty proposal then
  // means no speculation this step).
  for (int64_t n = std::min(max_ngram_, len - 1); n >= 1; --n) {
    const int64_t tail = len - n;  // the last n tokens are tokens[tail, len)
    for (int64_t i = 0; i < tail; ++i) {
      const int64_t s = most_recent_ ? tail - 1 - i : i;
      if (!std::equal(tokens.begin() + s, tokens.begin() + s + n, tokens.begin() + tail)) continue;
      const int64_t end = std::min(s + n + k, len);
      for (int64_t j = s + n; j < end && !contains(eos_ids_, tokens[j]); ++j)
        out.tokens.push_back(tokens[j]);
      if (!out.tokens.empty())
        out.probs = most_recent_ ? lookup_probs(tokens, s, n, out.tokens, 0, s + 1)
                                 : lookup_probs(tokens, s, n, out.tokens, s, tail);
      return out;
    }
  }
  return out;
}

}  // namespace specdec
