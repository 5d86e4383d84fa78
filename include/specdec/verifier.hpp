// Verifier: decides how many candidates the target keeps and which token follows them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "specdec/candidates.hpp"
#include "specdec/sampling.hpp"

namespace specdec {

struct Verdict {
  int64_t accepted = 0;       // leading candidates kept (0..K); of a tree, the path's length
  int64_t next_token = 0;     // the target's token after them (correction or bonus)
  std::vector<int64_t> path;  // the kept candidates' indices, from the root down (a chain's: 0..)
};

// The verdict in decide()'s values, read on the host (`values`: its [2] or, for a tree, [2 + K];
// a chain's path is 0..accepted-1), checked: a verifier of one's own whose values name a candidate
// past the proposal, a path that does not follow the tree, or no token of the `vocab` is an Error.
Verdict verdict_of(const int64_t* values, const Candidates& candidates, int64_t vocab);

// The override points are decide() and settle(), the two halves of one decision, so that a batch
// brings every row's verdict to the host in one copy (one synchronisation per pass on a GPU):
// the engine calls decide() per row, copies, then settle() per row. verify() is one row's run.
class Verifier {
 public:
  virtual ~Verifier() = default;
  // `scores` [K+1, V]: processed target scores; row i is the target's distribution for the
  // position of candidate i (row K: the position after the last candidate). Returns {accepted,
  // next_token} as an int64 tensor [2] on any device. Draws from `rng` are taken either here or,
  // when drawn ahead from a copy (to stay on the device), by settle(). A tree of candidates
  // (Candidates::parents): row 0 is the position after the verified tokens, row 1 + i the one
  // after candidate i; the tensor is [2 + K], {accepted, next_token, the path's indices, -1...}.
  virtual at::Tensor decide(const at::Tensor& scores, const Candidates& candidates,
                            Rng& rng) const = 0;
  // Gets decide()'s values on the host and advances `rng` past the draws it took from a copy.
  // The default does nothing.
  virtual void settle(const Verdict& verdict, const Candidates& candidates, Rng& rng) const;

  // decide(), one copy to the host, settle().
  Verdict verify(const at::Tensor& scores, const Candidates& candidates, Rng& rng) const;
  // Whether decide() takes trees of candidates (else the rows it verifies propose chains).
  virtual bool verifies_trees() const { return false; }
};

// Keeps the longest prefix equal to the target's argmax, then the target's argmax after it. A
// tree: from the root, the child holding the target's argmax, while there is one.
class GreedyVerifier final : public Verifier {
 public:
  at::Tensor decide(const at::Tensor& scores, const Candidates& candidates,
                    Rng& rng) const override;
  bool verifies_trees() const override { return true; }
};

// Leviathan et al. (2211.17192) / Chen et al. (2302.01318): accept candidate i with probability
// min(1, p_i / q_i); at the first rejection draw from norm(max(0, p - q)); when all are accepted,
// draw the bonus from p at the next position. Keeps the target's distribution exactly.
// Deterministic candidates (undefined q; a chain or a tree): at each position the target's token
// is drawn from p with one uniform, as target-only sampling draws it, and the candidate (child)
// holding it continues the path: one-hot q's rejection sampling, one draw per token, so a seed
// gives target-only sampling's tokens whatever the candidates.
class RejectionSamplingVerifier final : public Verifier {
 public:
  at::Tensor decide(const at::Tensor& scores, const Candidates& candidates,
                    Rng& rng) const override;
  void settle(const Verdict& verdict, const Candidates& candidates, Rng& rng) const override;
  bool verifies_trees() const override { return true; }
};

namespace detail {
// decide()'s result as verify() and the engine take it: int64 [2], or [2 + K] for a tree of K
// candidates (a specdec::Error otherwise).
void check_decision(const at::Tensor& decision, const Candidates& candidates);
// A deterministic chain's verdict {accepted, next} from p [K+1, V]: the token of each position
// drawn with the next uniform of `rng` until one differs from its candidate (one uniform per
// token). On the CPU one position at a time; on a device all at once, without leaving it.
at::Tensor draw_along_chain(const at::Tensor& p, const std::vector<int64_t>& tokens, Rng& rng);
}  // namespace detail

}  // namespace specdec
