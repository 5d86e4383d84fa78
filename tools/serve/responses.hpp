// The OpenAI response objects of `specdec serve`: choices, logprobs (chat-style and legacy),
// usage and the speculative counters, from what a generation produced.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "specdec/specdec.hpp"

namespace specdec::serve {

using ojson = nlohmann::ordered_json;  // responses keep their fields in the order written

// A string's bytes as an array of numbers (the "bytes" of a logprobs entry).
ojson bytes_of(const std::string& s);
// A kept token's chat-style logprobs entry: {"token", "logprob", "bytes", "top_logprobs"}.
ojson logprob_entry(const Tokenizer& tokenizer, const TokenLogprob& t);
// Unicode characters that begin in an entry's UTF-8 "bytes" (a legacy completion's text_offset
// counts them, as Python's string indices do).
size_t characters(const ojson& bytes);
// Chat-style entries (each with its "text_offset") as the legacy completions logprobs object.
ojson legacy_logprobs(const std::vector<ojson>& entries);

// One choice: a chat message (or a stream's delta) or a completion's text, with its logprobs
// (null: none asked) and finish reason (null in a stream's middle chunks).
ojson choice(bool chat, const std::string& text, const std::vector<ojson>* logprobs, bool delta,
             const ojson& finish);
// "stop" (EOS or a stop string), "length", or "abort" (vLLM's word: cancelled before its end by
// the shutdown deadline or an engine error).
std::string finish_reason(bool stopped_by_string, const std::string& stop_reason);

ojson usage(const GenerationStats& s);
ojson speculative(const GenerationStats& s);

}  // namespace specdec::serve
