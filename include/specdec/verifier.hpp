// Verifier: decides how many candidates the target keeps and which token follows them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "specdec/candidates.hpp"
#include "specdec/sampling.hpp"

namespace specdec {

struct Verdict {
  int64_t accepted = 0;    // leading candidates kept (0..K)
  int64_t next_token = 0;  // the target's token after them (correction or bonus)
};

class Verifier {
 public:
  virtual ~Verifier() = default;
  // `scores` [K+1, V]: processed target scores; row i is the target's distribution for the
  // position of candidate i (row K: the position after the last candidate).
  virtual Verdict verify(const at::Tensor& scores, const Candidates& candidates, Rng& rng) const = 0;

  // The same decision in two halves, so that a batch brings every row's verdict to the host in one
  // copy (one synchronisation per pass on a GPU): decide() leaves {accepted, next_token} on the
  // device as an int64 tensor [2]; settle() gets the values back and advances `rng` past the draws
  // the decision used, where decide() drew them ahead from a copy. The defaults run verify() in
  // decide() (a copy per row) and do nothing in settle().
  virtual at::Tensor decide(const at::Tensor& scores, const Candidates& candidates, Rng& rng) const;
  virtual void settle(const Verdict& verdict, const Candidates& candidates, Rng& rng) const;

 protected:
  // verify() through decide() and settle(), for verifiers that implement those.
  Verdict decide_and_settle(const at::Tensor& scores, const Candidates& candidates, Rng& rng) const;
};

// Keeps the longest prefix equal to the target's argmax, then the target's argmax after it.
class GreedyVerifier final : public Verifier {
 public:
  Verdict verify(const at::Tensor& scores, const Candidates& candidates, Rng& rng) const override;
  at::Tensor decide(const at::Tensor& scores, const Candidates& candidates, Rng& rng) const override;
};

// Leviathan et al. (2211.17192) / Chen et al. (2302.01318): accept candidate i with probability
// min(1, p_i / q_i); at the first rejection draw from norm(max(0, p - q)); when all are accepted,
// draw the bonus from p at the next position. Keeps the target's distribution exactly. A
// deterministic proposal (undefined q) is treated as one-hot q.
class RejectionSamplingVerifier final : public Verifier {
 public:
  Verdict verify(const at::Tensor& scores, const Candidates& candidates, Rng& rng) const override;
  at::Tensor decide(const at::Tensor& scores, const Candidates& candidates, Rng& rng) const override;
  void settle(const Verdict& verdict, const Candidates& candidates, Rng& rng) const override;
};

}  // namespace specdec
