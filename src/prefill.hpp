// Passes over rows of different lengths (private): padded ids, chunked prefill.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "specdec/kv_cache.hpp"
#include "specdec/model.hpp"

namespace specdec {

// Ids [B, T] (int64, CPU) of rows of different lengths, each padded with 0 up to T = the longest
// (at least 1); `counts` receives each row's length (Model::forward's row_tokens).
at::Tensor padded_ids(const std::vector<std::vector<int64_t>>& rows, std::vector<int64_t>& counts);

// A pass over one row's prompt takes at most this many tokens: its attention mask is then
// kPrefillChunk x context, not prompt x prompt (a 32k-token prompt in one pass needed 8 GiB of
// masks). Chunks give the logits one pass gives, bitwise (batch invariance).
constexpr int64_t kPrefillChunk = 256;

// Appends all but the last token of each sequence to its row of `cache` (row b: *seqs[b], after
// what the row holds), in passes of at most `chunk` tokens per row, kPrefillChunk once one row is
// left (nothing is padded then). The sequences must be sorted by their uncached length, longest
// first: each pass then runs on the rows [0, b') that still have tokens, so no row is padded by
// more than chunk - 1 positions. `stop` (if set) is asked after each pass but the last: true ends
// the prefill there. Returns the number of passes.
int64_t prefill_rows(const Model& model, KVCache& cache,
                     const std::vector<const std::vector<int64_t>*>& seqs, int64_t chunk = 16,
                     const std::function<bool()>& stop = {});

// Admits sequences into rows `slots` of a running batch's `cache` (decoder-only): all but the last
// token of each *seqs[i] goes into a scratch cache of seqs.size() rows (prefill_rows, longest rest
// first), and each scratch row is then copied over row slots[i]. The running rows are not in the
// passes (in the batch's own cache they would be padded to the prompts). `held` (empty: none):
// the positions row slots[i] already holds of *seqs[i] (a cached prefix), which the scratch row
// starts from; the other rows start empty whatever their row holds. Returns the passes.
int64_t prefill_into(const Model& model, KVCache& cache, const std::vector<int64_t>& slots,
                     const std::vector<const std::vector<int64_t>*>& seqs,
                     const std::vector<int64_t>& held = {});

}  // namespace specdec
