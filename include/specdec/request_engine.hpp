// RequestEngine: requests that join and leave one running batch (continuous batching), for a
// server or any application that receives requests over time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "specdec/config.hpp"
#include "specdec/error.hpp"
#include "specdec/generator.hpp"

namespace specdec {

// A generated token with the target's own log-probability of it (log-softmax of the raw logits of
// the verification pass, before any sampling processor) and the `top` most likely alternatives.
struct TokenLogprob {
  int64_t token = 0;
  double logprob = 0;
  std::vector<std::pair<int64_t, double>> top;  // most likely first
};

struct Request {
  using TokenSink = std::function<void(const std::vector<int64_t>& tokens,
                                       const std::vector<TokenLogprob>& logprobs)>;
  std::vector<int64_t> prompt;  // non-empty, ids < the target's vocabulary
  GenerationConfig config;
  int64_t top_logprobs = -1;  // -1: no log-probabilities; k in [0, 20]: each token's, and the top k
  // Called on the engine's thread with each group of newly verified tokens, in order (and their
  // log-probabilities, when asked for). It must not block: it hands the tokens over and returns.
  // Throwing Cancelled(n) from it ends the request keeping the first n of these tokens (stop_reason
  // "cancelled"); any other exception ends it with stop_reason "error" and result.error its
  // message. Either way the other requests go on.
  TokenSink on_tokens;
  // Called once when the request leaves the batch, with its result (stop_reason "eos",
  // "max_new_tokens", "cancelled" or "error"). Also on the engine's thread (cancel's, for a request
  // still queued); must not block. An exception from it is dropped: the request is over, and the
  // others go on.
  std::function<void(const GenerationResult& result)> on_finished;
};

// Thrown by RequestEngine::submit when the queue holds max_queue requests (a server's 429).
class QueueFull : public Error {
 public:
  using Error::Error;
};

class RequestEngine {
 public:
  struct Options {
    int64_t max_rows = 8;    // requests generated at once; the others wait in the queue
    int64_t context = 2048;  // positions per request (prompt + new tokens), the caches' capacity
    // Requests waiting for a row at most, beside those the free rows take at the next step
    // (submit throws QueueFull past it). 0: a request is taken only when a row is free.
    int64_t max_queue = 64;
    // Finished requests whose sequences (prompt and answer) and target caches are kept, least
    // recently used dropped first: a request that begins with one (the next turn of a chat, a
    // shared system prompt) computes only the rest (GenerationStats::cached_prompt_tokens). Each
    // holds its positions' keys and values. 0: off.
    int64_t prefix_cache = 8;
    // The prompts that join while other requests decode go in this many tokens per step in all
    // (the first to come first), each step also decoding the running rows, so that neither a long
    // prompt nor many arriving at once stall them.
    int64_t prefill_chunk = 256;
  };
  using Id = uint64_t;

  // Any model pair the Generator takes (an encoder-decoder model's request runs its encoder pass
  // as it joins). A request that sets prompt_lookup_num_tokens drafts by prompt lookup, one that
  // sets suffix_speculation by suffix speculation; the others
  // draft with the Generator's draft model (its num_assistant_tokens and schedule), or run
  // target-only without one; all share the running batch. The Generator must outlive this (it is
  // kept by reference: a temporary is refused). Throws Error for options out of range, and for a
  // context past a decoder-only target's max_position_embeddings (GPT-2's 1024 is less than the
  // default).
  RequestEngine(const Generator& generator, Options options);
  RequestEngine(const Generator&&, Options) = delete;
  // Drops the requests still queued or running without calling their on_finished (stop() and
  // let run() return, or cancel them and step() until it returns false, to finish them first).
  ~RequestEngine();
  RequestEngine(const RequestEngine&) = delete;
  RequestEngine& operator=(const RequestEngine&) = delete;

  // Validates the request (specdec::Error for a bad one, naming the limit it breaks; QueueFull when
  // the queue is full) and queues it; it joins the running batch at the next step with a free row.
  // Thread-safe. Its output is the one Generator::generate gives for it alone (greedy: token for
  // token; sampling: the same tokens for the same seed), whatever else runs beside it.
  Id submit(Request request);
  // The request leaves the batch at the next step (stop_reason "cancelled"; its result holds the
  // tokens its sink was given, none of that step's), or the queue at once; its on_finished is
  // called either way. Thread-safe; an id that is done already is ignored.
  void cancel(Id id);

  // One iteration: the queued requests take the free rows (each prefilled), then every running
  // row drafts, is verified in one target pass and gets its tokens. Returns false, at once, when no
  // request is queued or running. Call it from one thread, best the one that loaded the models:
  // libgomp keeps a team of OpenMP threads per thread that starts parallel regions, and passes
  // run from a second thread, beside the loader's idle team, measured half the speed on 2 cores.
  // A step while another runs (a second thread) is refused with specdec::Error.
  bool step();
  // Calls step() until stop(), waiting while there is nothing to do.
  void run();
  // Makes run() return after its current step (the requests left stay queued or running); made
  // while run() is not running, the next run() returns at once.
  void stop();

  struct Load {
    int64_t waiting = 0, running = 0;
  };
  Load load() const;  // thread-safe
  const Options& options() const { return options_; }

 private:
  struct Impl;
  Options options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specdec
