// Suffix speculation (SuffixDecoding, Oliaro et al., 2024): proposals that need no model, from
// counts of what followed the sequence's last tokens in this request and in earlier ones.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "specdec/candidates.hpp"

namespace specdec {

// The Generator-wide settings of suffix speculation (Generator::set_suffix_options).
struct SuffixOptions {
  // The longest token string the trees count: a match and its continuation together.
  int64_t max_depth = 32;
  // A proposal stops once the estimated probability that all of it is accepted (the product of
  // each token's share among what followed) falls below this.
  double min_token_prob = 0.1;
  // A proposal is at most this many times the length of the match it continues (at least 1).
  double max_spec_factor = 1.0;
  // Propose a tree: the most probable continuations of the match, branches included (the node
  // budget being the schedule's K), instead of the single most frequent one.
  bool tree = false;
  // Tokens of earlier requests' outputs the shared tree holds at most; the oldest sequences are
  // evicted first (0: none are kept, each request's own tree only).
  int64_t cache_tokens = 65536;
  // Throws specdec::Error naming the first invalid field.
  void validate() const;
};

// How many times each token string of up to max_depth tokens occurs in a set of sequences: a trie
// of every suffix of every sequence, cut at max_depth, each node counting the occurrences of the
// string on its path. A sequence grows at its end (extend, O(max_depth) per token) and is removed
// whole (remove, O(length x max_depth)). Not thread-safe.
class SuffixTree {
 public:
  explicit SuffixTree(int64_t max_depth);
  int64_t max_depth() const { return max_depth_; }

  // Appends `tokens` to sequence `id` (a new id starts a sequence).
  void extend(int64_t id, const std::vector<int64_t>& tokens);
  // Removes sequence `id` and every count it added (nothing if it is not held).
  void remove(int64_t id);
  // Tokens held over all sequences, and live nodes (the root excluded).
  int64_t tokens() const { return tokens_; }
  int64_t nodes() const { return static_cast<int64_t>(nodes_.size() - free_.size()) - 1; }
  // Occurrences of `s` (1 to max_depth tokens) in the sequences; 0 for longer strings.
  int64_t count(const std::vector<int64_t>& s) const;

  struct Proposal {
    std::vector<int64_t> tokens;
    std::vector<int64_t> parents;  // a tree's (Candidates::parents); empty: a chain
    std::vector<double> probs;     // each token's probability given its parent (Candidates::probs)
    double score = 0;   // the expected accepted tokens: the sum of each prefix's probability
    int64_t match = 0;  // the length of the matched suffix of the context
  };
  // For each suffix of `context` (up to max_depth - 1 tokens) that occurs followed by something,
  // its most frequent continuation, token by token (ties: the smaller id): each token's
  // probability is its count over the counts of its siblings plus 1 / (x - 0.8), x the match
  // length plus the token's depth (an unseen continuation's room: one occurrence after a match
  // of x tokens gives (x - 0.8) / (x + 0.2), how often such a copy goes on in SmolLM2's answers,
  // as PromptLookupGenerator estimates), and the continuation stops before
  // the product of them drops below `min_prob`, after `max_tokens` tokens, after
  // max(1, floor(factor x match length)) tokens, at the tree's depth, or after a token of
  // `stop_ids` (which it keeps). Of these, the one with the highest score (ties: the longer match).
  Proposal propose(const std::vector<int64_t>& context, int64_t max_tokens, double min_prob,
                   double factor, const std::vector<int64_t>& stop_ids = {}) const;
  // The same with a tree for each suffix: up to `max_tokens` nodes, best first (each continuation's
  // probability is the product along its path; ties: the one found first), none below
  // `min_prob`, none deeper than the chain's limit, none under a stop token; the score is the sum
  // of the nodes' probabilities. Parents come before their children.
  Proposal propose_tree(const std::vector<int64_t>& context, int64_t max_tokens, double min_prob,
                        double factor, const std::vector<int64_t>& stop_ids = {}) const;

 private:
  struct Node {
    int32_t token = -1;
    int32_t count = 0;
    int32_t child = -1;    // first child
    int32_t sibling = -1;  // next child of the same parent
    int32_t depth = 0;
  };
  struct Sequence {
    std::vector<int64_t> tokens;
    std::vector<int32_t> open;  // the nodes of its suffixes shorter than max_depth
  };
  int32_t find(int32_t parent, int64_t token) const;
  // The node of the context's last m tokens (-1: they do not occur); the depth limit of a
  // continuation of it.
  int32_t match_node(const std::vector<int64_t>& context, int64_t m) const;
  int64_t depth_limit(int64_t m, int64_t max_tokens, double factor) const;
  int32_t find_or_add(int32_t parent, int64_t token);
  void unlink(int32_t parent, int32_t node);  // frees node and everything under it

  int64_t max_depth_;
  std::vector<Node> nodes_;  // [0]: the root
  std::vector<int32_t> free_;
  std::unordered_map<int64_t, int32_t> root_children_;  // the root may have a vocabulary's
  std::unordered_map<int64_t, Sequence> sequences_;
  int64_t tokens_ = 0;
};

// The tree one Generator's requests share: finished requests' outputs (each with the last prompt
// tokens before it, so that an answer's start can be matched), SuffixOptions::cache_tokens tokens
// at most, oldest sequences out first. Thread-safe.
class SuffixCache {
 public:
  explicit SuffixCache(const SuffixOptions& options = {});
  const SuffixOptions& options() const { return options_; }
  // Adds a finished request: `tokens` is its prompt and output, `prompt_length` its prompt's.
  void add(const std::vector<int64_t>& tokens, int64_t prompt_length);
  // SuffixTree::propose, or propose_tree when `tree`.
  SuffixTree::Proposal propose(const std::vector<int64_t>& context, int64_t max_tokens,
                               const std::vector<int64_t>& stop_ids, bool tree = false) const;
  int64_t tokens() const;
  int64_t nodes() const;
  // Prompt tokens kept before each output.
  static constexpr int64_t kContextTokens = 8;

 private:
  SuffixOptions options_;
  mutable std::mutex mutex_;
  SuffixTree tree_;
  std::deque<std::pair<int64_t, int64_t>> order_;  // (id, tokens), oldest first
  int64_t next_id_ = 0;
};

// One request's proposer: a tree over its prompt and output, grown as tokens are verified, and
// the shared cache (null: none); the proposal with the higher score wins. Deterministic proposals
// (Candidates::q undefined), so that rejection sampling treats them as a point-mass draft; trees
// of them (Candidates::parents) when the options ask and `trees` allows (a target that verifies
// chains only does not).
class SuffixGenerator final : public SequenceProposer {
 public:
  SuffixGenerator(std::shared_ptr<const SuffixCache> shared, std::vector<int64_t> eos_ids,
                  bool trees = true);
  Candidates propose(const std::vector<int64_t>& tokens, int64_t max_tokens) override;

 private:
  std::shared_ptr<const SuffixCache> shared_;
  SuffixOptions options_;
  std::vector<int64_t> eos_ids_;
  bool tree_;
  SuffixTree own_;
  size_t seen_ = 0;  // tokens of the sequence own_ holds
};

}  // namespace specdec
