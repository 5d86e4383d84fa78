// goodput's planning state of one Generator (private): what its models' passes cost, measured.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "specdec/candidates.hpp"
#include "specdec/generator.hpp"
#include "specdec/kv_cache.hpp"
#include "specdec/lookahead.hpp"
#include "specdec/model.hpp"

namespace specdec::detail {

// What proposes a row's candidates; goodput measures each one's acceptance apart.
enum Proposer : int { kDraftModel = 0, kPromptLookup = 1, kSuffix = 2 };

// The target's pass cost by rows (with a draft model, one timed pass over B tokens in the first
// request, then every real pass) and the draft's cost per token, measured on one Generator's
// models and shared by its concurrent requests (every member guarded).
class GoodputPlanner {
 public:
  explicit GoodputPlanner(const Model& target) : target_(target) {}

  // Sets the K of every goodput schedule of the running rows for the next pass, whose `rows` rows
  // may hold others that goodput does not plan. `cache`, `tokens`: row 0's, where a draft model's
  // calibration pass is timed (appended after what it holds, then cropped away); `free_drafts`:
  // prompt lookup or suffix speculation, whose proposals cost nothing beside a pass and which run
  // no calibration pass (cut() times the curve on real passes); `may_calibrate`: whether this call
  // may run the calibration pass (not before the request's first pass). kUnknownDraft while the
  // draft's cost is unknown (K then stays where it is); kExploring while draft-model rows draft K =
  // 1, 2, ... in turn to time each pass size.
  enum class Plan { kUnknownDraft, kPlanned, kExploring };
  Plan plan(const std::vector<LookaheadSchedule*>& schedules, KVCache& cache,
            const std::vector<int64_t>& tokens, int64_t rows, bool free_drafts, bool may_calibrate);
  // A proposal that cut() may cut: its proposer, its candidates, and the tokens its row puts in
  // before its last one (0 but in a pass that prefills the row: its prompt or a chunk of it).
  struct Cuttable {
    Proposer kind;
    Candidates* candidates;
    int64_t before = 0;
  };
  // Cuts the proposals `rows` (goodput rows whose candidates carry probabilities and no
  // distribution: a draft's trees, prompt lookup's and suffix speculation's proposals) to their
  // first n candidates (best first), for the n in [fewest, the longest] with the most expected
  // tokens per second of the pass: every one of its `batch` rows gains one token, and each row of
  // `rows` the reach of its kept candidates (Candidates::reach) times the kept / estimated ratio
  // measured for that kind at their depth and rank (observe_kept), for a pass over batch x (L + 1)
  // tokens, L the most tokens a row puts in after its last one: `others` (the rows not cut) or a
  // row of `rows`, its `before` and its kept candidates. A chain is cut where its next token does
  // not pay, a tree's branches go where they do not: the shape (one token, a chain, a tree)
  // follows the measured costs and acceptance. `fewest` is 0 (the cut may drop every candidate,
  // once a pass over batch x 2 tokens was timed) when every row is prompt lookup's or suffix
  // speculation's, whose estimates price in a continuation not seen yet, so that a weak lone
  // candidate is not verified for nothing; a draft's trees keep their first candidate, which the
  // draft has paid for. Proposals without a model are priced on real passes only: in a pass of
  // such rows alone, none is verified until a pass over `batch` tokens was timed (the pass
  // target-only runs), then a proposal longer than every timed pass is verified whole, up to a
  // pass over timed_pass_tokens(cap) tokens, until such a pass was timed (above its longest pass
  // the curve is extrapolated, and a cost overstated there would never be timed again). In a pass
  // that prefills a row of `rows` (a `before` > 0) the pass yields its one token per row slowly
  // whatever is cut: the n kept is the one whose expected tokens save the most time, each worth a
  // pass over `batch` tokens per `batch` of them, less what the candidates add to the pass (none
  // before a pass was timed). The calibration learns only from what is verified, so estimates that
  // start too low and are never verified would stay low: after recheck_after_ passes whose
  // candidates were all cut (none of them prefilling), the next keeps each row's first candidate
  // (recheck_after_ starts at Generator::kRetimeFirst, doubles with each such pass up to
  // kRetimeLast, and starts again once a cut keeps candidates of its own accord). Otherwise
  // nothing is cut until a pass was timed.
  void cut(const std::vector<Cuttable>& rows, int64_t batch, int64_t others);
  // A proposal of `kind` that cut() saw kept the candidates `path` (Verdict::path).
  void observe_kept(Proposer kind, const Candidates& c, const std::vector<int64_t>& path);
  // A real target pass over `rows` tokens took `seconds`.
  void observe_target(int64_t rows, double seconds);
  // The draft drafted one token for each of `rows` rows in `seconds` per pass.
  void observe_draft(int64_t rows, double seconds);

 private:
  // goodput at B = 1, after plan() planned `schedule`: the draft's cost rests on the passes it
  // timed, and at K = 0 none are timed, so one pass stalled by a busy machine could keep drafting
  // off for the Generator's life. When the draft's cost is what plans K = 0 (a free draft would
  // draft on this curve at these acceptances), the iteration after retime_after_ such iterations
  // since the draft last drafted drafts min(2, cap) tokens instead, which times it again;
  // retime_after_ starts at Generator::kRetimeFirst, doubles with each re-timing up to
  // kRetimeLast, and starts again once drafting pays, so a draft that is too slow costs one such
  // iteration per 64, 128, ... without drafting.
  // A draft model's calibration, once per Generator: a target pass over `n` tokens (as many as the
  // batch has rows: what K = 0 costs), timed on row 0 of `cache` after what it holds (`tokens`:
  // row 0's), then cropped away; every real pass refines the curve after that.
  void calibrate(KVCache& cache, const std::vector<int64_t>& tokens, int64_t n);
  void retime_draft(LookaheadSchedule& schedule, const std::function<double(int64_t)>& target_cost,
                    const std::vector<double>& alphas);

  // By proposer kind, then by depth and rank (slot 2 depth for its parent's first child, 2 depth
  // + 1 for a later sibling), decayed: candidates kept, and the sum of their estimated reach.
  struct Calibration {
    std::vector<double> kept, estimated;
    double factor(size_t slot) const;  // (kept + 1) / (estimated + 1)
  };
  static std::vector<size_t> slots(const Candidates& c);  // each candidate's Calibration slot
  std::map<Proposer, Calibration> calibration_;
  const Model& target_;
  std::mutex mutex_;
  PassCost target_cost_, draft_cost_;
  int64_t costly_draft_iterations_ = 0, retime_after_ = Generator::kRetimeFirst;
  int64_t empty_cuts_ = 0, recheck_after_ = Generator::kRetimeFirst;  // cut()'s
  bool calibrated_first_ = false;                                     // calibrate() ran
  int64_t timed_free_ = 0;  // the pass cut() times for proposals without a model, in tokens
};

}  // namespace specdec::detail
