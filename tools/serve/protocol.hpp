// The OpenAI protocol of `specdec serve`: request bodies to engine requests, errors in OpenAI's
// shape, and the text a request streams (stop strings held back, whole UTF-8 characters only).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "specdec/specdec.hpp"

namespace specdec::serve {

// The highest temperature a request may ask for (OpenAI's range is [0, 2]); --temperature, the
// default of a request that sets none, is held to it too.
constexpr double kMaxTemperature = 2;
constexpr size_t kMaxStopStrings = 16;  // a request's stop strings

// An error answered as {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError : std::runtime_error {
  ApiError(int status, const std::string& message, std::string param = "", std::string code = "")
      : std::runtime_error(message),
        status(status),
        message(message),
        param(std::move(param)),
        code(std::move(code)) {}
  int status;
  // The whole message: what() ends at a NUL, which a quoted request value may hold.
  std::string message, param, code;
};
// The error object of a status: "invalid_request_error" for 4xx, "server_error" for 5xx.
nlohmann::json error_json(int status, const std::string& message, const std::string& param = "",
                          const std::string& code = "");

// What the server knows when it reads a request.
struct Context {
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat = nullptr;  // null: the model ships none (chat requests are refused)
  std::string model_id;
  int64_t context = 0;            // positions per request
  int64_t vocab_size = 0;         // the target's: the token ids a prompt may hold
  bool has_draft = false;         // a draft model (draft_tree_width needs one)
  GenerationConfig defaults;      // the server's flags (EOS ids filled in)
  std::vector<int64_t> chat_eos;  // a chat answer ends at these too (the template's end of turn)
  // --max-new-tokens when given: the max_tokens of a request that sets none (else OpenAI's
  // defaults: 16 for a completion, the rest of the context for a chat answer).
  std::optional<int64_t> max_tokens;
};

// One OpenAI request, read and checked (ApiError 400/404 naming the field otherwise).
struct ParsedRequest {
  bool chat = false;
  bool stream = false, include_usage = false;
  bool logprobs = false;
  std::vector<int64_t> prompt;
  GenerationConfig config;
  int64_t top_logprobs = -1;  // the engine's: -1 none
  std::vector<std::string> stop;
  bool skip_special_tokens = true;  // vLLM's: the answer's text without special tokens
  bool include_stop = false;        // vLLM's include_stop_str_in_output
  std::vector<std::string> ignored;  // top-level fields not served nor refused (`user`, a typo)
};
// `chat`: /v1/chat/completions (messages), else /v1/completions (prompt).
ParsedRequest parse_request(const nlohmann::json& body, bool chat, const Context& ctx);
// A /tokenize body: {"content": text} (or vLLM's "prompt"; encoded as `generate --prompt` does,
// unless "add_special_tokens" or llama-server's "add_special" says otherwise) or {"messages":
// [...]} (the chat prompt, with its generation header unless "add_generation_prompt" is false);
// "with_pieces": each token with its text, as llama-server answers.
struct TokenizeRequest {
  std::vector<int64_t> ids;
  bool with_pieces = false;
};
TokenizeRequest parse_tokenize(const nlohmann::json& body, const Context& ctx);
// The ids of a /detokenize body, {"tokens": [...]}, each a token id of the tokenizer.
std::vector<int64_t> parse_detokenize(const nlohmann::json& body, const Context& ctx);
// The body as JSON: ApiError 400 for malformed JSON or invalid UTF-8, or not an object.
nlohmann::json parse_body(const std::string& body);
// A chat request's "messages" (a non-empty array) as `chat` renders them: roles system, developer
// (read as system), user and assistant; content a string or text parts (ChatTemplate::join_parts);
// ApiError 400 naming "messages" otherwise (tool calls included). Also --prompts-file's.
std::vector<ChatMessage> chat_messages(const nlohmann::json& messages, const ChatTemplate& chat);

// The text of a generation as the client sees it: decoded incrementally, never a partial UTF-8
// character, never any part of a stop string, nor the text of the EOS or stop token id that ended
// it (as vLLM, unless include_stop_str_in_output); generation stops at the first stop string
// that ends in the text of a token past the request's first min_tokens (vLLM's rule: one that ends
// within them is not a stop, though a later one may begin in their text).
class TextStream {
 public:
  TextStream(const Tokenizer& tokenizer, const ParsedRequest& request);
  // The text that became safe to show with these tokens, put in one at a time as if generated
  // one by one; `taken` (optional): how many went in, up to the one that completed a stop string.
  std::string push(const std::vector<int64_t>& ids, size_t* taken = nullptr);
  // What was held back, once generation ended (nothing after a stop string).
  std::string finish();
  bool stopped() const { return stopped_; }
  // Whether token `id`'s text is part of the text (not a skipped special token, nor the EOS or
  // stop token id that ends it).
  bool shows(int64_t id) const;

 private:
  std::string release(std::string text, bool last);
  bool ends(int64_t id) const;  // an EOS or stop token id
  StreamDecoder decoder_;
  std::vector<std::string> stop_;
  const Tokenizer& tokenizer_;
  std::vector<int64_t> end_ids_;  // EOS and stop token ids: their text is not shown
  bool skip_special_, include_stop_;
  std::string held_;     // a tail that could begin a stop string
  size_t released_ = 0;  // bytes of text before held_
  int64_t min_tokens_, pushed_ = 0;
  size_t min_end_ = 0;  // bytes of text once min_tokens tokens were in: a stop must end past it
  bool stopped_ = false;
};

// A response id's random part: 24 hex digits, distinct across requests and restarts.
std::string random_id();

// What a CORS preflight allows: the requested headers (comma-separated header names), or
// "Authorization, Content-Type" when there are none or they are not header names.
std::string allowed_headers(const std::string& requested);

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool valid_utf8(const std::string& s);

// A token's text for the logprobs objects (its "bytes" are Tokenizer::token_bytes).
std::string token_text(const Tokenizer& tokenizer, int64_t id);

}  // namespace specdec::serve
