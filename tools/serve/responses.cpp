#include "serve/responses.hpp"

#include <algorithm>
#include <cstdio>

#include "serve/protocol.hpp"

namespace specdec::serve {

ojson bytes_of(const std::string& s) {
  ojson out = ojson::array();
  for (const unsigned char c : s) out.push_back(c);
  return out;
}

namespace {

// A token of a legacy completion's logprobs: its text, or for a token whose bytes are not whole
// characters "bytes:\\xNN..." as OpenAI writes it (its U+FFFD would make tokens alike).
std::string legacy_token(const ojson& entry) {
  std::string raw;
  for (const ojson& b : entry["bytes"]) raw += static_cast<char>(b.get<unsigned>());
  if (valid_utf8(raw)) return entry["token"].get<std::string>();
  std::string out = "bytes:";
  char hex[5];
  for (const unsigned char b : raw) {
    std::snprintf(hex, sizeof hex, "\\x%02x", b);
    out += hex;
  }
  return out;
}

}  // namespace

ojson logprob_entry(const Tokenizer& tokenizer, const TokenLogprob& t) {
  ojson top = ojson::array();
  for (const auto& [id, lp] : t.top)
    top.push_back({{"token", token_text(tokenizer, id)},
                   {"logprob", lp},
                   {"bytes", bytes_of(tokenizer.token_bytes(id))}});
  return {{"token", token_text(tokenizer, t.token)},
          {"logprob", t.logprob},
          {"bytes", bytes_of(tokenizer.token_bytes(t.token))},
          {"top_logprobs", std::move(top)}};
}

size_t characters(const ojson& bytes) {
  return static_cast<size_t>(std::count_if(bytes.begin(), bytes.end(), [](const ojson& b) {
    return (b.get<unsigned>() & 0xC0) != 0x80;
  }));
}

ojson legacy_logprobs(const std::vector<ojson>& entries) {
  ojson out = {{"tokens", ojson::array()},
               {"token_logprobs", ojson::array()},
               {"top_logprobs", ojson::array()},
               {"text_offset", ojson::array()}};
  for (const ojson& e : entries) {
    const std::string chosen = legacy_token(e);
    out["tokens"].push_back(chosen);
    out["token_logprobs"].push_back(e["logprob"]);
    ojson top = ojson::object();  // most probable first
    for (const ojson& t : e["top_logprobs"]) top[legacy_token(t)] = t["logprob"];
    // OpenAI's: the sampled token's logprob is always there ("up to logprobs+1 elements").
    if (!top.contains(chosen)) top[chosen] = e["logprob"];
    out["top_logprobs"].push_back(top);
    out["text_offset"].push_back(e["text_offset"]);
  }
  return out;
}

ojson choice(bool chat, const std::string& text, const std::vector<ojson>* logprobs, bool delta,
             const ojson& finish) {
  ojson c = {{"index", 0}, {"finish_reason", finish}};
  if (chat)
    c[delta ? "delta" : "message"] =
        delta ? ojson{{"content", text}} : ojson{{"role", "assistant"}, {"content", text}};
  else
    c["text"] = text;
  if (!logprobs)
    c["logprobs"] = nullptr;
  else if (chat)
    c["logprobs"] = {{"content", *logprobs}};
  else
    c["logprobs"] = legacy_logprobs(*logprobs);
  return c;
}

std::string finish_reason(bool stopped_by_string, const std::string& stop_reason) {
  return stopped_by_string || stop_reason == "eos"              ? "stop"
         : stop_reason == "cancelled" || stop_reason == "error" ? "abort"
                                                                : "length";
}

ojson usage(const GenerationStats& s) {
  return {{"prompt_tokens", s.prompt_tokens},
          {"completion_tokens", s.new_tokens},
          {"total_tokens", s.prompt_tokens + s.new_tokens},
          {"prompt_tokens_details", {{"cached_tokens", s.cached_prompt_tokens}}}};
}

ojson speculative(const GenerationStats& s) {
  return {{"drafted_tokens", s.drafted_tokens},
          {"accepted_tokens", s.accepted_tokens},
          {"acceptance_rate", s.acceptance_rate()},
          {"target_passes", s.target_passes},
          {"tokens_per_target_pass", s.tokens_per_target_pass()}};
}

}  // namespace specdec::serve
