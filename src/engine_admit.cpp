// Engine's rows coming and going: retiring finished rows (into the prefix cache), slots, joining
// rows with their chunked prefill, and the prefix cache they start from.
#include <ATen/ATen.h>

#include <algorithm>

#include "engine.hpp"
#include "prefill.hpp"

namespace specdec::detail {

void Engine::retire() {
  for (const int64_t slot : finished_) {
    if (max_prefixes_ > 0 && !slots_[slot]->error) remember(slot);
    slots_[slot] = nullptr;
  }
}

int64_t Engine::take_slot(Row& row) {
  const auto freed = std::find(slots_.begin(), slots_.end(), nullptr);
  const auto slot = static_cast<int64_t>(freed - slots_.begin());
  if (freed == slots_.end())
    slots_.push_back(&row);
  else
    *freed = &row;
  return slot;
}

void Engine::compact() {
  for (size_t s = 0; s < slots_.size(); ++s) {
    while (!slots_.empty() && !slots_.back()) slots_.pop_back();
    if (s >= slots_.size()) break;
    if (slots_[s]) continue;
    const auto last = static_cast<int64_t>(slots_.size()) - 1;
    cache_.copy_row(last, static_cast<int64_t>(s));
    if (drafter_) drafter_->move_row(last, static_cast<int64_t>(s));
    slots_[s] = slots_.back();
    slots_.pop_back();
  }
}

// Continuous batching: the next prompts take the slots finished rows freed (in place), else new
// ones at the end; their last prompt token goes into the next pass. With no row decoding, every
// prompt (or rest after its longest cached prefix) of up to one chunk goes in now: in one batched
// prefill (the draft's at the next pass if it drafts in it), or with the rest in the first
// verification pass; a longer one joins a chunk per step, as below, so that its prefill is split
// over steps and a request cancelled (or a shutdown's deadline) meanwhile is met between its
// chunks. While rows
// decode, a row whose whole prompt is cached but its last token starts at once; the others share
// prefill_chunk_ prompt tokens per step, the rows already joining first (advance_joining): a
// short prompt, or rest after its cached prefix, that fits what is left goes into this step's
// batched prefill (however many arrive: one pass), the rest join in 1-row caches (from their
// cached prefix), so that a step stalls the decoding rows by about one chunk's prefill, and no
// rest of a prompt pads their pass.
int64_t Engine::admit(bool decoding) {
  const auto taken = [&] { return running() + static_cast<int64_t>(joining_.size()); };
  int64_t for_joining = prefill_chunk_;  // what this step's batched prefill leaves
  int64_t left = prefill_chunk_;         // what the rows already joining leave
  for (const Joining& j : joining_) left -= std::min(left, unprefilled(j));
  if (taken() >= width_) return for_joining;
  const auto t1 = Clock::now();
  std::vector<int64_t> joined;
  std::vector<const std::vector<int64_t>*> joined_tokens;
  std::vector<int64_t> joined_held;  // the positions of a cached prefix each joined row holds
  // goodput: a joining row starts from the evidence of the goodput rows of its kind (its proposer)
  // running beside it, else from what the last finished one left, as the next request would.
  std::optional<std::pair<double, double>> evidence[3];
  if (goodput_) {
    std::vector<const LookaheadSchedule*> running[3];
    for (const Row* row : slots_)
      if (row && uses_goodput(*row)) running[proposer_kind(*row)].push_back(row->schedule.get());
    for (int kind = 0; kind < 3; ++kind)
      if (!running[kind].empty()) evidence[kind] = LookaheadSchedule::carry_evidence(running[kind]);
  }
  while (taken() < width_) {
    Row* next = source_.next();
    if (!next) break;
    Row& row = *next;
    set_up(row, evidence[proposer_kind(row)]);
    if (tc_.is_encoder_decoder) {
      // Its encoder pass is its prefill: the decoder starts from one token.
      const int64_t slot = take_slot(row);
      row.result.stats.encoder_passes = encode(row, slot);
      joined.push_back(slot);
      if (drafter_) drafter_->reset_row(slot, draft_row(row));
      continue;
    }
    int64_t longest = 0;
    const auto best = max_prefixes_ > 0 ? longest_prefix(row.tokens, longest) : prefixes_.end();
    const int64_t rest = static_cast<int64_t>(row.tokens.size()) - 1 - longest;
    const bool now = decoding ? rest <= left : rest <= first_pass_limit();
    if (!now) {
      left -= std::min(left, rest);  // (its share comes first)
      // Its prompt's positions (and the cached sequence's, copied before it is cropped), not the
      // whole context: a cache is zeroed as it is made.
      const auto capacity = static_cast<int64_t>(
          std::max(row.tokens.size(), best == prefixes_.end() ? 0 : best->tokens.size()));
      joining_.push_back({&row, m_.target->make_cache(capacity, 1, cache_.keeps_hidden())});
      row.result.stats.cached_prompt_tokens = take_prefix(best, longest, joining_.back().cache, 0);
      continue;
    }
    const int64_t slot = take_slot(row);  // prefill_into and take_prefix overwrite its cache row
    row.result.stats.cached_prompt_tokens = take_prefix(best, longest, cache_, slot);
    // Prompts, and while rows decode rests after a cached prefix, go in together (with nothing
    // decoding a rest goes in with the first verification pass).
    if (longest == 0 || (decoding && rest > 0)) {
      joined.push_back(slot);
      joined_tokens.push_back(&row.tokens);
      joined_held.push_back(longest);
      if (decoding) left -= rest, for_joining -= rest;
    }
    if (drafter_) drafter_->reset_row(slot, draft_row(row));
  }
  if (joined.empty()) return for_joining;
  // The draft prefills them at the next pass if they draft in it.
  const int64_t passes = joined_tokens.empty()
                             ? 0
                             : prefill_into(*m_.target, cache_, joined, joined_tokens, joined_held);
  const double s = seconds_since(t1);
  bs_.prefill_seconds += s;
  for (const int64_t slot : joined) {
    slots_[slot]->prefill_seconds = s;
    slots_[slot]->result.stats.prefill_passes = passes;
  }
  return for_joining;
}

void Engine::remember(int64_t slot) {
  const std::vector<int64_t>& tokens = slots_[slot]->tokens;
  const int64_t n = std::min(cache_.length(slot), static_cast<int64_t>(tokens.size()));
  if (n == 0) return;
  // What this sequence holds in full supersedes the entries that are prefixes of it.
  prefixes_.remove_if([&](const Prefix& p) {
    return static_cast<int64_t>(p.tokens.size()) <= n &&
           std::equal(p.tokens.begin(), p.tokens.end(), tokens.begin());
  });
  Prefix p{std::vector<int64_t>(tokens.begin(), tokens.begin() + n),
           m_.target->make_cache(n, 1, cache_.keeps_hidden())};
  cache_.crop(slot, n);  // (an EOS accepted from the draft can leave positions after it)
  p.cache.copy_row(cache_, slot, 0);
  prefixes_.push_front(std::move(p));
  while (prefixes_.size() > max_prefixes_) prefixes_.pop_back();
}

std::list<Engine::Prefix>::iterator Engine::longest_prefix(const std::vector<int64_t>& tokens,
                                                           int64_t& longest) {
  auto best = prefixes_.end();
  longest = 0;
  for (auto it = prefixes_.begin(); it != prefixes_.end(); ++it) {
    const int64_t common = std::min<int64_t>(
        std::mismatch(it->tokens.begin(), it->tokens.end(), tokens.begin(), tokens.end()).first -
            it->tokens.begin(),
        static_cast<int64_t>(tokens.size()) - 1);  // the pass computes the last token
    if (common > longest) longest = common, best = it;
  }
  return best;
}

int64_t Engine::take_prefix(std::list<Prefix>::iterator entry, int64_t length, KVCache& cache,
                            int64_t row) {
  if (entry == prefixes_.end()) return 0;
  cache.copy_row(entry->cache, 0, row);
  cache.crop(row, length);
  prefixes_.splice(prefixes_.begin(), prefixes_, entry);
  return length;
}

bool Engine::advance_joining(bool decoding, int64_t budget) {
  if (joining_.empty()) return false;
  // A row cancelled while its prompt goes in leaves before the next chunk.
  for (auto it = joining_.begin(); it != joining_.end();) {
    if (!it->row->cancelled.load()) {
      ++it;
      continue;
    }
    it->row->result.stats.stop_reason = "cancelled";
    finish_row(*it->row);
    it = joining_.erase(it);
  }
  const auto t0 = Clock::now();
  for (Joining& j : joining_) {
    // While rows decode the joining rows share this step's prefill tokens in order; otherwise each
    // puts in a chunk.
    const int64_t take = std::min(unprefilled(j), decoding ? budget : prefill_chunk_);
    if (take == 0) continue;
    if (decoding) budget -= take;
    const std::vector<int64_t>& tokens = j.row->tokens;
    // prefill_rows puts in all but the last token of what it is given.
    const std::vector<int64_t> part(tokens.begin(), tokens.begin() + j.cache.length(0) + take + 1);
    j.row->result.stats.prefill_passes += prefill_rows(*m_.target, j.cache, {&part});
  }
  const double s = seconds_since(t0);
  bs_.prefill_seconds += s;
  for (Joining& j : joining_)  // (a row cancelled now leaves before its next chunk)
    if (unprefilled(j) > 0) prefill_progress(*j.row);
  for (auto it = joining_.begin(); it != joining_.end();) {
    Row& row = *it->row;
    row.prefill_seconds += s / static_cast<double>(joining_.size());
    if (unprefilled(*it) > 0) {
      ++it;
      continue;
    }
    const int64_t slot = take_slot(row);
    cache_.copy_row(it->cache, 0, slot);
    if (drafter_) drafter_->reset_row(slot, draft_row(row));
    it = joining_.erase(it);
  }
  return true;
}

}  // namespace specdec::detail
