#include "specdec/suffix.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "specdec/error.hpp"
#include "util.hpp"

namespace specdec {

void SuffixOptions::validate() const {
  SPECDEC_CHECK(max_depth >= 2 && max_depth <= 1024, "suffix speculation: max_depth must be in ",
                "[2, 1024], got ", max_depth);
  SPECDEC_CHECK(min_token_prob >= 0 && min_token_prob <= 1,
                "suffix speculation: min_token_prob must be in [0, 1], got ", min_token_prob);
  SPECDEC_CHECK(max_spec_factor > 0 && max_spec_factor <= 1024,
                "suffix speculation: max_spec_factor must be in (0, 1024], got ", max_spec_factor);
  SPECDEC_CHECK(cache_tokens >= 0 && cache_tokens <= (int64_t{1} << 26),
                "suffix speculation: cache_tokens must be in [0, 67108864], got ", cache_tokens);
}

SuffixTree::SuffixTree(int64_t max_depth) : max_depth_(max_depth), nodes_(1) {
  SPECDEC_CHECK(max_depth >= 1, "SuffixTree: max_depth must be >= 1");
}

int32_t SuffixTree::find(int32_t parent, int64_t token) const {
  if (parent == 0) {
    const auto it = root_children_.find(token);
    return it == root_children_.end() ? -1 : it->second;
  }
  for (int32_t c = nodes_[parent].child; c >= 0; c = nodes_[c].sibling)
    if (nodes_[c].token == token) return c;
  return -1;
}

int32_t SuffixTree::find_or_add(int32_t parent, int64_t token) {
  const int32_t found = find(parent, token);
  if (found >= 0) return found;
  SPECDEC_CHECK(token >= 0 && token <= std::numeric_limits<int32_t>::max(), "SuffixTree: token ",
                token, " out of range");
  int32_t n;
  if (!free_.empty()) {
    n = free_.back();
    free_.pop_back();
  } else {
    SPECDEC_CHECK(nodes_.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                  "SuffixTree: too many nodes");
    n = static_cast<int32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& node = nodes_[n];
  node = Node{};
  node.token = static_cast<int32_t>(token);
  node.depth = nodes_[parent].depth + 1;
  if (parent == 0) {
    root_children_.emplace(token, n);
  } else {
    node.sibling = nodes_[parent].child;
    nodes_[parent].child = n;
  }
  return n;
}

void SuffixTree::unlink(int32_t parent, int32_t node) {
  if (parent == 0) {
    root_children_.erase(nodes_[node].token);
  } else {
    int32_t* link = &nodes_[parent].child;
    while (*link != node) link = &nodes_[*link].sibling;
    *link = nodes_[node].sibling;
  }
  std::vector<int32_t> stack{node};
  while (!stack.empty()) {
    const int32_t n = stack.back();
    stack.pop_back();
    for (int32_t c = nodes_[n].child; c >= 0; c = nodes_[c].sibling) stack.push_back(c);
    nodes_[n] = Node{};
    free_.push_back(n);
  }
}

void SuffixTree::extend(int64_t id, const std::vector<int64_t>& tokens) {
  Sequence& seq = sequences_[id];
  std::vector<int32_t> open;
  for (const int64_t t : tokens) {
    // The suffixes ending at t: each open one (shorter than max_depth) followed by t, and t alone.
    open.clear();
    seq.open.push_back(0);
    for (const int32_t n : seq.open) {
      const int32_t c = find_or_add(n, t);
      ++nodes_[c].count;
      if (nodes_[c].depth < max_depth_) open.push_back(c);
    }
    seq.open.swap(open);
    seq.tokens.push_back(t);
  }
  tokens_ += static_cast<int64_t>(tokens.size());
}

void SuffixTree::remove(int64_t id) {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return;
  const std::vector<int64_t>& s = it->second.tokens;
  const auto n = static_cast<int64_t>(s.size());
  for (int64_t i = 0; i < n; ++i) {
    int32_t parent = 0;
    for (int64_t j = i; j < std::min(n, i + max_depth_); ++j) {
      const int32_t node = find(parent, s[j]);
      // Every string under a node occurs at most as often as the node's: once its count is 0, so
      // are those below it, which go with it.
      if (--nodes_[node].count == 0) {
        unlink(parent, node);
        break;
      }
      parent = node;
    }
  }
  tokens_ -= n;
  sequences_.erase(it);
}

int64_t SuffixTree::count(const std::vector<int64_t>& s) const {
  if (s.empty() || static_cast<int64_t>(s.size()) > max_depth_) return 0;
  int32_t node = 0;
  for (const int64_t t : s)
    if ((node = find(node, t)) < 0) return 0;
  return nodes_[node].count;
}

namespace {
// A continuation's probability: `count` of the `total` times its context occurred, with a
// pseudo-count for what the tree has not seen that shrinks as the context grows (x: the match's
// length plus the continuation's depth), so that one occurrence gives copy_goes_on(x).
double continues(int64_t count, int64_t total, int64_t x) {
  const double unseen = 1.0 / copy_goes_on(static_cast<double>(x)) - 1.0;
  return static_cast<double>(count) / (static_cast<double>(total) + unseen);
}
}  // namespace

int32_t SuffixTree::match_node(const std::vector<int64_t>& context, int64_t m) const {
  int32_t node = 0;
  for (auto j = static_cast<int64_t>(context.size()) - m;
       j < static_cast<int64_t>(context.size()) && node >= 0; ++j)
    node = find(node, context[j]);
  return node;
}

int64_t SuffixTree::depth_limit(int64_t m, int64_t max_tokens, double factor) const {
  return std::min<int64_t>(
      max_tokens,
      std::max<int64_t>(1, static_cast<int64_t>(std::floor(factor * static_cast<double>(m)))));
}

SuffixTree::Proposal SuffixTree::propose(const std::vector<int64_t>& context, int64_t max_tokens,
                                         double min_prob, double factor,
                                         const std::vector<int64_t>& stop_ids) const {
  Proposal best;
  if (max_tokens <= 0) return best;
  const auto len = static_cast<int64_t>(context.size());
  // Every suffix of the context that occurs followed by something, shortest first (a longer one
  // occurs only where a shorter one does): its continuation, the best score kept.
  for (int64_t m = 1; m <= std::min(len, max_depth_ - 1); ++m) {
    int32_t node = match_node(context, m);
    if (node < 0 || nodes_[node].child < 0) break;
    Proposal p;
    p.match = m;
    const int64_t limit = depth_limit(m, max_tokens, factor);
    double prob = 1.0;
    while (static_cast<int64_t>(p.tokens.size()) < limit && nodes_[node].child >= 0) {
      int32_t next = -1;
      int64_t total = 0;
      for (int32_t c = nodes_[node].child; c >= 0; c = nodes_[c].sibling) {
        total += nodes_[c].count;
        if (next < 0 || nodes_[c].count > nodes_[next].count ||
            (nodes_[c].count == nodes_[next].count && nodes_[c].token < nodes_[next].token))
          next = c;
      }
      const double own =
          continues(nodes_[next].count, total, m + static_cast<int64_t>(p.tokens.size()));
      prob *= own;
      if (prob < min_prob) break;
      p.tokens.push_back(nodes_[next].token);
      p.probs.push_back(own);
      p.score += prob;
      if (std::find(stop_ids.begin(), stop_ids.end(), nodes_[next].token) != stop_ids.end()) break;
      node = next;
    }
    if (p.score >= best.score && !p.tokens.empty()) best = std::move(p);
  }
  return best;
}

SuffixTree::Proposal SuffixTree::propose_tree(const std::vector<int64_t>& context,
                                              int64_t max_tokens, double min_prob, double factor,
                                              const std::vector<int64_t>& stop_ids) const {
  Proposal best;
  if (max_tokens <= 0) return best;
  const auto len = static_cast<int64_t>(context.size());
  struct Open {      // a continuation not yet in the tree
    double prob;     // its path's
    double own;      // its own, given its parent
    int64_t order;   // when it was found (ties)
    int64_t parent;  // its parent's index in the proposal, -1: the match
    int32_t node;    // its node in this tree
    int64_t depth;   // 1 for the match's children
    bool operator<(const Open& o) const {
      return prob != o.prob ? prob < o.prob : order > o.order;  // a max-heap on prob
    }
  };
  for (int64_t m = 1; m <= std::min(len, max_depth_ - 1); ++m) {
    const int32_t match = match_node(context, m);
    if (match < 0 || nodes_[match].child < 0) break;
    Proposal p;
    p.match = m;
    const int64_t limit = depth_limit(m, max_tokens, factor);
    std::vector<Open> open;
    int64_t found = 0;
    // The children of `node` (by count, then token, as propose() ranks them) under `parent`.
    const auto expand = [&](int32_t node, int64_t parent, double prob, int64_t depth) {
      std::vector<int32_t> kids;
      int64_t total = 0;
      for (int32_t c = nodes_[node].child; c >= 0; c = nodes_[c].sibling) {
        kids.push_back(c);
        total += nodes_[c].count;
      }
      std::sort(kids.begin(), kids.end(), [&](int32_t a, int32_t b) {
        return nodes_[a].count != nodes_[b].count ? nodes_[a].count > nodes_[b].count
                                                  : nodes_[a].token < nodes_[b].token;
      });
      for (const int32_t c : kids) {
        const double own = continues(nodes_[c].count, total, m + depth - 1);
        if (prob * own < min_prob) break;  // the rest are less probable still
        open.push_back({prob * own, own, found++, parent, c, depth});
        std::push_heap(open.begin(), open.end());
      }
    };
    expand(match, -1, 1.0, 1);
    while (!open.empty() && static_cast<int64_t>(p.tokens.size()) < max_tokens) {
      std::pop_heap(open.begin(), open.end());
      const Open o = open.back();
      open.pop_back();
      const int64_t index = static_cast<int64_t>(p.tokens.size());
      p.tokens.push_back(nodes_[o.node].token);
      p.parents.push_back(o.parent);
      p.probs.push_back(o.own);
      p.score += o.prob;
      const bool stop =
          std::find(stop_ids.begin(), stop_ids.end(), nodes_[o.node].token) != stop_ids.end();
      if (!stop && o.depth < limit && nodes_[o.node].child >= 0)
        expand(o.node, index, o.prob, o.depth + 1);
    }
    if (p.score >= best.score && !p.tokens.empty()) best = std::move(p);
  }
  return best;
}

SuffixCache::SuffixCache(const SuffixOptions& options)
    : options_(options), tree_((options.validate(), options.max_depth)) {}

void SuffixCache::add(const std::vector<int64_t>& tokens, int64_t prompt_length) {
  const auto n = static_cast<int64_t>(tokens.size());
  prompt_length = std::clamp<int64_t>(prompt_length, 0, n);
  if (options_.cache_tokens == 0 || prompt_length == n) return;
  // The output, with the prompt's last tokens before it, at most cache_tokens in all (its end).
  const int64_t begin =
      std::max(std::max<int64_t>(0, prompt_length - kContextTokens), n - options_.cache_tokens);
  const std::vector<int64_t> kept(tokens.begin() + begin, tokens.end());
  std::lock_guard<std::mutex> lock(mutex_);
  while (!order_.empty() &&
         tree_.tokens() + static_cast<int64_t>(kept.size()) > options_.cache_tokens) {
    tree_.remove(order_.front().first);
    order_.pop_front();
  }
  tree_.extend(next_id_, kept);
  order_.emplace_back(next_id_++, static_cast<int64_t>(kept.size()));
}

namespace {
// A chain, or a tree when `tree`, under the options' limits.
SuffixTree::Proposal propose_from(const SuffixTree& t, const SuffixOptions& o, bool tree,
                                  const std::vector<int64_t>& context, int64_t max_tokens,
                                  const std::vector<int64_t>& stop_ids) {
  return tree ? t.propose_tree(context, max_tokens, o.min_token_prob, o.max_spec_factor, stop_ids)
              : t.propose(context, max_tokens, o.min_token_prob, o.max_spec_factor, stop_ids);
}
}  // namespace

SuffixTree::Proposal SuffixCache::propose(const std::vector<int64_t>& context, int64_t max_tokens,
                                          const std::vector<int64_t>& stop_ids, bool tree) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return propose_from(tree_, options_, tree, context, max_tokens, stop_ids);
}

int64_t SuffixCache::tokens() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tree_.tokens();
}

int64_t SuffixCache::nodes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tree_.nodes();
}

SuffixGenerator::SuffixGenerator(std::shared_ptr<const SuffixCache> shared,
                                 std::vector<int64_t> eos_ids, bool trees)
    : shared_(std::move(shared)),
      options_(shared_ ? shared_->options() : SuffixOptions{}),
      eos_ids_(std::move(eos_ids)),
      tree_(trees && options_.tree),
      own_(options_.max_depth) {}

Candidates SuffixGenerator::propose(const std::vector<int64_t>& tokens, int64_t max_tokens) {
  Candidates out;
  if (tokens.size() > seen_) {
    own_.extend(0,
                std::vector<int64_t>(tokens.begin() + static_cast<int64_t>(seen_), tokens.end()));
    seen_ = tokens.size();
  }
  if (max_tokens <= 0) return out;
  SuffixTree::Proposal best = propose_from(own_, options_, tree_, tokens, max_tokens, eos_ids_);
  if (shared_) {
    SuffixTree::Proposal other = shared_->propose(tokens, max_tokens, eos_ids_, tree_);
    if (other.score > best.score) best = std::move(other);
  }
  out.tokens = std::move(best.tokens);
  out.probs = std::move(best.probs);
  out.parents = std::move(best.parents);
  out.chain_if_unbranched();
  return out;
}

}  // namespace specdec
