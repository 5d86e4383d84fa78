#include "serve/protocol.hpp"

#include "json.hpp"
#include "proposer_choice.hpp"
#include "util.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <random>
#include <set>

using nlohmann::json;

namespace specdec::serve {

json error_json(int status, const std::string& message, const std::string& param,
                const std::string& code) {
  const char* type = status >= 500                   ? "server_error"
                     : status == 401                 ? "authentication_error"
                     : status == 404 && code.empty() ? "not_found_error"
                     : status == 429                 ? "rate_limit_error"
                                                     : "invalid_request_error";
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param, "invalid_value");
}

// The top-level fields of the request being parsed on this thread that the parser looked at (the
// rest are ignored: ParsedRequest::ignored).
thread_local struct {
  const json* body = nullptr;
  std::set<std::string> read;
} t_fields;

const json* field(const json& body, const char* name) {
  if (&body == t_fields.body) t_fields.read.insert(name);
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// The values a number field may take: [lo, hi], either end open.
struct Bounds {
  double lo, hi;
  bool lo_open = false, hi_open = false;
};

using detail::integral;

// A number field within its bounds (an integer when `integer`).
std::optional<double> number(const json& body, const char* name, Bounds b, bool integer = false) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number() || (integer && !integral(*v)))
    bad(name, std::string("'") + name + "' must be " + (integer ? "an integer" : "a number") +
                  ", got " + v->dump());
  const double x = v->get<double>();
  const auto text = [](double d) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.15g", d);
    return std::string(buf);
  };
  if (!(b.lo_open ? x > b.lo : x >= b.lo) || !(b.hi_open ? x < b.hi : x <= b.hi))
    bad(name, std::string("'") + name + "' must be in " + (b.lo_open ? "(" : "[") + text(b.lo) +
                  ", " + text(b.hi) + (b.hi_open ? ")" : "]") + ", got " + v->dump());
  return x;
}

std::optional<bool> boolean(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean())
    bad(name, std::string("'") + name + "' must be a boolean, got " + v->dump());
  return v->get<bool>();
}

std::optional<std::string> string(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad(name, std::string("'") + name + "' must be a string, got " + v->dump());
  return v->get<std::string>();
}

std::vector<int64_t> ids_of(const json& list, const char* param, int64_t vocab_size) {
  std::vector<int64_t> ids;
  for (const json& v : list) {
    if (!v.is_number() || !integral(v))
      bad(param, std::string("'") + param + "' holds a non-integer token id: " + v.dump());
    const double d = v.get<double>();  // (exact for every id a vocabulary can hold)
    if (vocab_size > 0 && (d < 0 || d >= static_cast<double>(vocab_size)))
      bad(param, std::string("'") + param + "' holds " + v.dump() +
                     ", not a token id of this model (0 to " + std::to_string(vocab_size - 1) +
                     ")");
    ids.push_back(v.is_number_float() ? static_cast<int64_t>(d) : v.get<int64_t>());
  }
  return ids;
}

// vLLM's add_special_tokens: the tokenizer's BOS (and EOS, as it is configured) around a
// completion's prompt (default true) or a chat's rendered messages (default false: the template
// writes its own).
bool special_tokens(const json& body, bool fallback) {
  return boolean(body, "add_special_tokens").value_or(fallback);
}

std::vector<int64_t> encode_text(const std::string& text, const Context& ctx, const char* param,
                                 bool special) {
  if (!ctx.tokenizer) bad(param, "this model has no tokenizer: send token ids");
  std::vector<int64_t> ids = ctx.tokenizer->encode(text, special);
  if (ids.empty()) bad(param, std::string("'") + param + "' is empty");
  return ids;
}

std::vector<ChatMessage> messages_of(const json& body, const Context& ctx) {
  const json* v = field(body, "messages");
  if (!v) bad("messages", "'messages' is required");
  if (!ctx.chat)
    throw ApiError(400, "this model ships no chat template: start the server with --chat-template",
                   "messages", "no_chat_template");
  return chat_messages(*v, *ctx.chat);
}

// vLLM's add_generation_prompt (default true: the answer's header follows the messages) and
// continue_final_message (the answer continues the last, assistant, message instead).
std::vector<int64_t> encode_chat(const json& body, const Context& ctx) {
  const std::vector<ChatMessage> messages = messages_of(body, ctx);
  const bool header = boolean(body, "add_generation_prompt").value_or(true);
  const bool continued = boolean(body, "continue_final_message").value_or(false);
  if (continued && field(body, "add_generation_prompt") && header)
    bad("continue_final_message",
        "'continue_final_message' and 'add_generation_prompt' cannot both be true");
  if (continued && (messages.back().role != "assistant" || messages.back().content.empty()))
    bad("continue_final_message",
        "'continue_final_message' needs a last message from the assistant with content");
  std::string text, marked;
  // A continued message's rendering ends where the same rendering with a mark for its text puts
  // what follows the mark: the template may trim the text, and the text may occur earlier.
  const std::string mark = "specdec-final-message-mark";
  try {
    text = ctx.chat->render(messages, header && !continued);
    if (continued) {
      std::vector<ChatMessage> with_mark = messages;
      with_mark.back().content = mark;
      marked = ctx.chat->render(with_mark, false);
    }
  } catch (const Error& e) {
    bad("messages", e.what());
  }
  if (continued) {
    const size_t at = marked.rfind(mark);
    const size_t tail = at == std::string::npos ? 0 : marked.size() - at - mark.size();
    if (at == std::string::npos || text.size() < at + tail ||
        text.compare(0, at, marked, 0, at) != 0 ||
        text.compare(text.size() - tail, tail, marked, at + mark.size(), tail) != 0)
      bad("continue_final_message", "the chat template does not render the final message apart");
    text.resize(text.size() - tail);
  }
  return ctx.tokenizer->encode(text, special_tokens(body, false));
}

std::vector<int64_t> completion_prompt(const json& body, const Context& ctx) {
  const json* p = field(body, "prompt");
  if (!p) bad("prompt", "'prompt' is required");
  const bool special = special_tokens(body, true);
  if (p->is_string()) return encode_text(p->get<std::string>(), ctx, "prompt", special);
  if (p->is_array() && !p->empty()) {
    if ((*p)[0].is_number()) return ids_of(*p, "prompt", ctx.vocab_size);
    if (p->size() > 1)
      bad("prompt", "one prompt per request (got a list of " + std::to_string(p->size()) + ")");
    if ((*p)[0].is_string()) return encode_text((*p)[0].get<std::string>(), ctx, "prompt", special);
    if ((*p)[0].is_array() && !(*p)[0].empty()) return ids_of((*p)[0], "prompt", ctx.vocab_size);
  }
  bad("prompt", "'prompt' must be a string or a list of token ids, got " + p->dump());
}

// OpenAI fields that would change the answer and that this server does not serve: refused by
// name, so that a client never takes an answer made without them for one made with them. Their
// neutral values (a text response format, no tools) pass.
void refuse_unserved(const json& body, bool chat) {
  const auto given = [&](const char* name) {
    const json* v = field(body, name);
    return v && !(v->is_array() && v->empty()) && !(v->is_object() && v->empty()) &&
           !(v->is_string() && v->get<std::string>().empty());
  };
  const auto refuse = [](const std::string& name, const std::string& what) {
    bad(name, "'" + name + "' is not supported: " + what);
  };
  if (const json* f = field(body, "response_format");
      f && !(f->is_object() && f->value("type", json()) == "text"))
    refuse("response_format", "answers are free text (only {\"type\": \"text\"})");
  // vLLM's and llama-server's extensions of the same kind
  for (const char* name : {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                           "structured_outputs", "grammar", "json_schema"})
    if (given(name)) refuse(name, "answers are free text (no constrained decoding)");
  if (const json* v = field(body, "use_beam_search"); v && *v != false)
    refuse("use_beam_search", "generation is greedy or sampled");
  for (const char* name : {"bad_words", "allowed_token_ids"})
    if (given(name)) refuse(name, "logit_bias raises or lowers tokens");
  if (given("truncate_prompt_tokens"))
    refuse("truncate_prompt_tokens", "a prompt is never truncated");
  if (given("prompt_logprobs")) refuse("prompt_logprobs", "logprobs are the answer's");
  for (const char* name : {"structural_tag", "logits_processors", "vllm_xargs"})
    if (given(name)) refuse(name, "no processors but the OpenAI fields and the ones listed");
  if (const json* v = field(body, "return_tokens_as_token_ids"); v && *v != false)
    refuse("return_tokens_as_token_ids", "logprobs name tokens by their text");
  // llama-server's samplers, at values other than their neutral ones. Its repeat_penalty covers the
  // last repeat_last_n tokens, unlike repetition_penalty (the whole sequence, as Hugging Face's).
  const auto past = [&](const char* name, double neutral) {
    const json* v = field(body, name);
    return v && !(v->is_number() && v->get<double>() == neutral);
  };
  if (past("repeat_penalty", 1))
    refuse("repeat_penalty",
           "use 'repetition_penalty' (over the whole sequence, as Hugging Face's)");
  for (const auto& [name, neutral] : {std::pair<const char*, double>{"typical_p", 1},
                                      {"mirostat", 0},
                                      {"dynatemp_range", 0},
                                      {"dry_multiplier", 0},
                                      {"xtc_probability", 0},
                                      {"top_n_sigma", -1}})
    if (past(name, neutral)) refuse(name, "not one of this server's samplers");
  if (past("n_probs", 0)) refuse("n_probs", "use 'logprobs' and 'top_logprobs'");
  if (!chat) {
    if (given("suffix")) refuse("suffix", "no insertion: the answer continues the prompt");
    return;
  }
  for (const char* name : {"chat_template", "chat_template_kwargs", "documents"})
    if (given(name)) refuse(name, "messages are rendered with the model's template");
  // OpenAI's reasoning and search options (its reasoning models' and search models' own)
  if (given("reasoning_effort")) refuse("reasoning_effort", "this model does not reason apart");
  if (const json* v = field(body, "verbosity"); v && *v != "medium")
    refuse("verbosity", "the answer's length is max_tokens");
  if (given("web_search_options")) refuse("web_search_options", "this server does not search");
  for (const char* name : {"tools", "functions"})
    if (given(name)) refuse(name, "this server does not call tools");
  for (const char* name : {"tool_choice", "function_call"})
    if (const json* v = field(body, name); v && !(v->is_string() && (*v == "none" || *v == "auto")))
      refuse(name, "this server does not call tools");
  if (given("prediction")) refuse("prediction", "use prompt_lookup_num_tokens or speculate");
  if (given("audio")) refuse("audio", "answers are text");
  if (const json* m = field(body, "modalities");
      m && *m != json::array() && *m != json::array({"text"}))
    refuse("modalities", "answers are text (only [\"text\"])");
}

}  // namespace

std::vector<ChatMessage> chat_messages(const json& messages, const ChatTemplate& chat) {
  if (!messages.is_array() || messages.empty())
    bad("messages", "'messages' must be a non-empty array");
  std::vector<ChatMessage> out;
  for (const json& m : messages) {
    if (!m.is_object()) bad("messages", "each message must be an object, got " + m.dump());
    const json* role = field(m, "role");
    if (!role) bad("messages", "a message has no 'role'");
    if (!role->is_string())
      bad("messages", "a message's 'role' must be a string, got " + role->dump());
    const json* content = field(m, "content");
    const std::string given = role->get<std::string>();
    const auto holds = [&](const char* name) {
      const json* f = field(m, name);
      return f && !(f->is_array() && f->empty()) && !(f->is_object() && f->empty());
    };
    if (given == "tool" || given == "function" || holds("tool_calls") || holds("function_call"))
      bad("messages",
          "messages with tool calls or their results are not supported: specdec does not "
          "call tools");
    const std::string r = given == "developer" ? "system" : given;
    if (r != "system" && r != "user" && r != "assistant")
      bad("messages",
          "unknown role '" + given + "' (expected system, developer, user or assistant)");
    std::string text;
    if (content && content->is_string()) {
      text = content->get<std::string>();
    } else if (content && content->is_array()) {  // [{"type": "text", "text": ...}, ...]
      if (content->empty()) bad("messages", "a message's 'content' is an empty list of parts");
      std::vector<std::string> parts;
      for (const json& part : *content) {
        if (!part.is_object() || part.value("type", json()) != "text")
          bad("messages", "only text content parts are supported, got " + part.dump());
        if (!part.contains("text") || !part["text"].is_string())
          bad("messages", "a text content part needs 'text' (a string), got " + part.dump());
        parts.push_back(part["text"].get<std::string>());
      }
      text = chat.join_parts(r, parts);
    } else if (content) {
      bad("messages",
          "a message's 'content' must be a string or a list of text parts, got " + content->dump());
    } else {
      bad("messages", "a message has no 'content'");
    }
    out.push_back({r, text});
  }
  return out;
}

std::string random_id() {
  thread_local std::mt19937_64 rng{(uint64_t{std::random_device{}()} << 32) ^
                                   std::random_device{}()};
  char buf[25];
  std::snprintf(buf, sizeof buf, "%08llx%016llx",
                static_cast<unsigned long long>(rng() & 0xffffffffu),
                static_cast<unsigned long long>(rng()));
  return buf;
}

std::string allowed_headers(const std::string& requested) {
  const bool names = !requested.empty() && requested.size() <= 1024 &&
                     std::all_of(requested.begin(), requested.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ||
                              c == ',' || c == ' ';
                     });
  return names ? requested : "Authorization, Content-Type";
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size() || (n == 2 && c < 0xC2)) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
      return false;
    i += n;
  }
  return true;
}

json parse_body(const std::string& body) {
  if (!valid_utf8(body)) throw ApiError(400, "the body is not valid UTF-8", "", "invalid_utf8");
  json j;
  try {
    j = detail::parse_json_bounded(body, "");
  } catch (const Error& e) {  // nested too deep
    throw ApiError(400, std::string("the body is not valid JSON: ") + e.what(), "", "invalid_json");
  } catch (const json::exception& e) {
    throw ApiError(400, "the body is not valid JSON: " + detail::json_message(e), "",
                   "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "the body must be a JSON object", "", "invalid_json");
  return j;
}

TokenizeRequest parse_tokenize(const json& body, const Context& ctx) {
  TokenizeRequest r;
  r.with_pieces = boolean(body, "with_pieces").value_or(false);
  if (field(body, "messages")) {
    r.ids = encode_chat(body, ctx);
    return r;
  }
  const char* name = field(body, "prompt") && !field(body, "content") ? "prompt" : "content";
  const std::optional<std::string> content = string(body, name);
  if (!content) bad("content", "'content' (text) or 'messages' is required");
  if (!ctx.tokenizer) bad("content", "this model has no tokenizer");
  // vLLM's add_special_tokens or llama-server's add_special; with neither, as `generate --prompt`
  const std::optional<bool> special = field(body, "add_special_tokens")
                                          ? boolean(body, "add_special_tokens")
                                          : boolean(body, "add_special");
  r.ids = ctx.tokenizer->encode(*content, special.value_or(true));
  return r;
}

std::vector<int64_t> parse_detokenize(const json& body, const Context& ctx) {
  const json* tokens = field(body, "tokens");
  if (!tokens) bad("tokens", "'tokens' (a list of token ids) is required");
  if (!tokens->is_array())
    bad("tokens", "'tokens' must be a list of token ids, got " + tokens->dump());
  std::vector<int64_t> ids = ids_of(*tokens, "tokens", ctx.tokenizer->size());
  for (const int64_t id : ids)  // (decode would show it as nothing)
    if (!ctx.tokenizer->contains(id))
      bad("tokens", "'tokens' holds " + std::to_string(id) + ", which names no token");
  return ids;
}

ParsedRequest parse_request(const json& body, bool chat, const Context& ctx) {
  ParsedRequest r;
  r.chat = chat;
  t_fields.body = &body;
  t_fields.read.clear();
  struct Untrack {
    ~Untrack() { t_fields.body = nullptr; }
  } untrack;
  // An empty name, as an absent one, is the served model (vLLM's rule).
  if (const auto model = string(body, "model"); model && !model->empty() && *model != ctx.model_id)
    throw ApiError(
        404, "the model '" + *model + "' does not exist (this server has '" + ctx.model_id + "')",
        "model", "model_not_found");
  if (const auto n = number(body, "n", {-1e18, 1e18}, true); n && *n < 1)
    bad("n", "'n' must be at least 1, got " + field(body, "n")->dump());
  else if (n && *n != 1)
    bad("n", "only n = 1 is supported (one choice per request)");
  if (boolean(body, "echo").value_or(false))
    bad("echo", "'echo' is not supported (the answer never repeats the prompt)");
  if (const auto b = number(body, "best_of", {-1e18, 1e18}, true); b && *b != 1)
    bad("best_of", "only best_of = 1 is supported (one candidate per request)");
  refuse_unserved(body, chat);
  r.prompt = chat ? encode_chat(body, ctx) : completion_prompt(body, ctx);

  GenerationConfig& c = r.config;
  c = ctx.defaults;
  if (chat)
    for (const int64_t id : ctx.chat_eos)
      if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
        c.eos_token_ids.push_back(id);
  const double room = static_cast<double>(ctx.context) - static_cast<double>(r.prompt.size());
  // (max_completion_tokens is the chat API's name; a completion takes it too, as the same thing)
  std::optional<double> max_tokens = number(body, "max_tokens", {1, 1e9}, true);
  if (const auto m = number(body, "max_completion_tokens", {1, 1e9}, true)) max_tokens = m;
  // llama-server's name for it, where neither is given (-1: the rest of the context)
  if (const auto n = number(body, "n_predict", {-1, 1e9}, true); n && !max_tokens) {
    if (*n == 0) bad("n_predict", "'n_predict' must be -1 or at least 1");
    max_tokens = *n > 0 ? n : std::max(1.0, room);
  }
  // OpenAI's code and its chat API's sentence ("This model's maximum context length is N tokens"),
  // which agent frameworks look for to shorten a conversation.
  const std::string input = chat ? "messages" : "prompt";
  const auto too_long = [&](const std::string& param, const std::string& what) {
    throw ApiError(400,
                   "This model's maximum context length is " + std::to_string(ctx.context) +
                       " tokens (--ctx). However, " + what,
                   param, "context_length_exceeded");
  };
  const auto prompt_tokens = static_cast<int64_t>(r.prompt.size());
  const std::string reduce = "Please reduce the length of the " + input;
  if (room <= 0)
    too_long(input, "your " + input + " resulted in " + std::to_string(prompt_tokens) +
                        " tokens, which leave no room for an answer. " + reduce + ".");
  if (max_tokens && *max_tokens > room) {
    const auto completion = static_cast<int64_t>(*max_tokens);
    too_long(field(body, "max_completion_tokens") ? "max_completion_tokens"
             : field(body, "max_tokens")          ? "max_tokens"
                                                  : "n_predict",
             "you requested " + std::to_string(prompt_tokens + completion) + " tokens (" +
                 std::to_string(prompt_tokens) + " in the " + input + ", " +
                 std::to_string(completion) + " in the completion). " + reduce + " or completion.");
  }
  // OpenAI's default is 16 tokens for a completion; a chat answer may fill the context.
  const auto fits = static_cast<int64_t>(room);
  c.max_new_tokens = max_tokens       ? static_cast<int64_t>(*max_tokens)
                     : ctx.max_tokens ? std::min(*ctx.max_tokens, fits)
                     : chat           ? fits
                                      : std::min<int64_t>(16, fits);
  // A request without a temperature gets the server's --temperature (1 by default, as OpenAI's).
  if (const auto t = number(body, "temperature", {0, kMaxTemperature})) c.temperature = *t;
  c.do_sample = c.temperature > 0;
  if (const auto v = number(body, "top_p", {0, 1})) c.top_p = *v;
  if (const auto v = number(body, "top_k", {-1, 1e9}, true))
    c.top_k = *v < 0 ? 0 : static_cast<int64_t>(*v);
  if (const auto v = number(body, "min_p", {0, 1, false, true})) c.min_p = *v;
  if (const auto v =
          number(body, "repetition_penalty", {GenerationConfig::kMinRepetitionPenalty, 1e9}))
    c.repetition_penalty = *v;
  if (const auto v = number(body, "frequency_penalty", {-2, 2})) c.frequency_penalty = *v;
  if (const auto v = number(body, "presence_penalty", {-2, 2})) c.presence_penalty = *v;
  if (const json* b = field(body, "logit_bias")) {
    if (!b->is_object())
      bad("logit_bias", "'logit_bias' must be an object of token ids and biases, got " + b->dump());
    for (const auto& [key, value] : b->items()) {
      const std::string what = "'logit_bias' key \"" + key + "\"";
      const bool digits = !key.empty() && key.size() < 19 &&
                          key.find_first_not_of("0123456789") == std::string::npos;
      const int64_t id = digits ? std::stoll(key) : -1;
      if (id < 0 || id >= ctx.vocab_size)
        bad("logit_bias", what + " is not a token id of this model (0 to " +
                              std::to_string(ctx.vocab_size - 1) + ")");
      if (!value.is_number() || value.get<double>() < -100 || value.get<double>() > 100)
        bad("logit_bias", what + ": the bias must be a number in [-100, 100], got " + value.dump());
      c.logit_bias.emplace_back(id, value.get<double>());
    }
  }
  if (const json* seed = field(body, "seed")) {
    // A 64-bit signed integer, as OpenAI's and vLLM's (a double of 2^63 is past it; so is one of
    // -2^63, which is what -9223372036854775809 reads as: the integer -2^63 is read as an integer).
    const bool fits =
        seed->is_number_float()
            ? integral(*seed) && seed->get<double>() > -0x1p63 && seed->get<double>() < 0x1p63
        : seed->is_number_unsigned() ? seed->get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
                                     : seed->is_number_integer();
    if (!fits)
      bad("seed", "'seed' must be an integer in [-9223372036854775808, 9223372036854775807], got " +
                      seed->dump());
    c.seed = static_cast<uint64_t>(
        seed->is_number_float() ? static_cast<int64_t>(seed->get<double>()) : seed->get<int64_t>());
  } else {
    // Unseeded sampled requests draw distinct seeds (each its own random stream).
    static std::mt19937_64 seeds{std::random_device{}()};
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    c.seed = seeds();
  }
  if (const auto v =
          number(body, "num_assistant_tokens", {0, GenerationConfig::kMaxLookahead}, true))
    c.num_assistant_tokens = *v;
  if (const auto v = number(body, "draft_tree_width", {1, 16}, true)) {
    if (*v > 1 && !ctx.has_draft)
      bad("draft_tree_width", "'draft_tree_width' needs a server with a draft model (--draft)");
    c.draft_tree_width = *v;
  }
  if (const auto v = string(body, "num_assistant_tokens_schedule"))
    c.num_assistant_tokens_schedule = *v;
  // The request's choice of proposer over the server's default.
  const auto lookup =
      number(body, "prompt_lookup_num_tokens", {0, GenerationConfig::kMaxLookahead}, true);
  if (lookup) c.prompt_lookup_num_tokens = *lookup;
  const auto speculate = string(body, "speculate");
  if (speculate) {
    if (*speculate != "suffix" && *speculate != "none")
      bad("speculate", "'speculate' must be \"suffix\" or \"none\", got \"" + *speculate + "\"");
    c.suffix_speculation = *speculate == "suffix";
    if (c.suffix_speculation && lookup.value_or(0) > 0)
      bad("speculate",
          "'speculate': \"suffix\" and 'prompt_lookup_num_tokens' above 0: give one of them");
  }
  choose_proposer(c, lookup.has_value(), speculate.has_value());
  // vLLM's: ignore_eos (the answer runs to max_tokens) and stop_token_ids (more ids that end it,
  // counted in it as an EOS is, their text left out: TextStream).
  if (boolean(body, "ignore_eos").value_or(false)) c.eos_token_ids.clear();
  if (const json* ids = field(body, "stop_token_ids")) {
    if (!ids->is_array())
      bad("stop_token_ids", "'stop_token_ids' must be a list of token ids, got " + ids->dump());
    for (const int64_t id : ids_of(*ids, "stop_token_ids", ctx.vocab_size))
      c.eos_token_ids.push_back(id);
  }
  if (c.eos_token_ids.empty()) c.eos_token_ids = {-1};  // (empty would mean the model's)
  if (const auto v = number(body, "min_tokens", {0, 1e9}, true)) {
    if (*v > static_cast<double>(c.max_new_tokens))
      bad("min_tokens", "'min_tokens' (" + std::to_string(static_cast<int64_t>(*v)) +
                            ") exceeds max_tokens (" + std::to_string(c.max_new_tokens) + ")");
    c.min_new_tokens = static_cast<int64_t>(*v);
  }
  r.include_stop = boolean(body, "include_stop_str_in_output").value_or(false);
  r.skip_special_tokens = boolean(body, "skip_special_tokens").value_or(true);

  if (const json* s = field(body, "stop")) {
    if (s->is_string()) {
      r.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (const json& v : *s) {
        if (!v.is_string())
          bad("stop", "'stop' must be a string or a list of strings, got " + s->dump());
        r.stop.push_back(v.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of strings, got " + s->dump());
    }
    // (OpenAI takes 4; vLLM and llama-server any number, and clients of local servers send more)
    if (r.stop.size() > kMaxStopStrings)
      bad("stop", "'stop' holds at most " + std::to_string(kMaxStopStrings) + " strings, got " +
                      std::to_string(r.stop.size()));
    r.stop.erase(std::remove(r.stop.begin(), r.stop.end(), ""), r.stop.end());
  }
  if (chat) {
    r.logprobs = boolean(body, "logprobs").value_or(false);
    const auto k = number(body, "top_logprobs", {0, 20}, true);
    if (r.logprobs)
      r.top_logprobs = static_cast<int64_t>(k.value_or(0));
    else if (k.value_or(0) > 0)  // (0, the neutral value, passes: vLLM's rule)
      bad("top_logprobs", "'top_logprobs' above 0 needs 'logprobs': true");
  } else if (const json* v = field(body, "logprobs"); v && *v == false) {
    // (a boolean "off", as a chat request's, from clients that send the same fields to both)
  } else if (const auto k = number(body, "logprobs", {0, 20}, true)) {
    r.logprobs = true;
    r.top_logprobs = static_cast<int64_t>(*k);
  }
  r.stream = boolean(body, "stream").value_or(false);
  if (const json* o = field(body, "stream_options")) {
    if (!o->is_object()) bad("stream_options", "'stream_options' must be an object");
    if (!r.stream && !o->empty())
      bad("stream_options", "'stream_options' is only allowed with 'stream': true");
    const json* u = field(*o, "include_usage");
    if (u && !u->is_boolean())
      bad("stream_options.include_usage",
          "'stream_options.include_usage' must be a boolean, got " + u->dump());
    r.include_usage = u && u->get<bool>();
    // include_obfuscation (OpenAI's padding of chunks against length side channels, on by
    // default there) changes no answer and is ignored; others (vLLM's continuous_usage_stats, ...)
    // pass only at their neutral values.
    if (const json* ob = field(*o, "include_obfuscation"); ob && !ob->is_boolean())
      bad("stream_options.include_obfuscation",
          "'stream_options.include_obfuscation' must be a boolean, got " + ob->dump());
    for (const auto& [key, value] : o->items())
      if (key != "include_usage" && key != "include_obfuscation" && !value.is_null() &&
          value != false)
        bad("stream_options." + key, "'stream_options." + key + "' is not supported");
  }
  try {
    c.validate();
  } catch (const Error& e) {
    // "GenerationConfig.top_k must be ...": the request's field of the same name
    std::string message = e.what(), param;
    const std::string prefix = "GenerationConfig.";
    if (const size_t at = message.find(prefix); at != std::string::npos) {
      message.erase(at, prefix.size());
      const size_t end = message.find_first_not_of("abcdefghijklmnopqrstuvwxyz_", at);
      param = message.substr(at, end - at);
      if (param == "max_new_tokens") param = "max_tokens";
    }
    bad(param, message);
  }
  for (const auto& [key, value] : body.items())
    if (!value.is_null() && !t_fields.read.count(key)) r.ignored.push_back(key);
  return r;
}

TextStream::TextStream(const Tokenizer& tokenizer, const ParsedRequest& request)
    : decoder_(tokenizer, request.skip_special_tokens),
      stop_(request.stop),
      tokenizer_(tokenizer),
      end_ids_(request.config.eos_token_ids),
      skip_special_(request.skip_special_tokens),
      include_stop_(request.include_stop),
      min_tokens_(request.config.min_new_tokens) {}

bool TextStream::ends(int64_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

bool TextStream::shows(int64_t id) const {
  return !(ends(id) && !include_stop_) && !(skip_special_ && tokenizer_.is_special(id));
}

std::string TextStream::release(std::string text, bool last) {
  if (stopped_) return "";
  held_ += text;
  // Stop strings are looked for in the decoder's held-back tail too (trailing whitespace, say):
  // the token that completes one ends the answer. Not in its U+FFFD at the end, which stands for
  // a character whose bytes are still to come (a stop string's own U+FFFD must not match it).
  std::string pending = decoder_.pending();
  const std::string replacement = "\xEF\xBF\xBD";
  while (pending.size() >= 3 && pending.compare(pending.size() - 3, 3, replacement) == 0)
    pending.resize(pending.size() - 3);
  const std::string hay = held_ + pending;
  if (pushed_ <= min_tokens_) min_end_ = released_ + hay.size();
  // A stop string begins at or after `from - s.size()` when it ends past min_end_.
  const size_t from = min_end_ > released_ ? min_end_ - released_ + 1 : 0;
  size_t first = std::string::npos, end = 0;  // where the first stop string begins and ends
  for (const std::string& s : stop_) {
    const size_t at = hay.find(s, from > s.size() ? from - s.size() : 0);
    if (at == std::string::npos) continue;
    if (at < first || (at == first && at + s.size() < end)) first = at, end = at + s.size();
  }
  if (first != std::string::npos) {
    stopped_ = true;
    held_.clear();
    return hay.substr(0, include_stop_ ? end : first);
  }
  if (last) return std::move(held_);
  // Hold back the longest tail that begins a stop string (it starts at a stop string's first
  // byte, so what is shown still ends at a whole character).
  size_t keep = 0;
  for (const std::string& s : stop_)
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n)
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  released_ += out.size();
  return out;
}

std::string TextStream::push(const std::vector<int64_t>& ids, size_t* taken) {
  std::string out;
  size_t n = 0;
  for (; n < ids.size() && !stopped_; ++n) {
    ++pushed_;
    if (!ends(ids[n]) || include_stop_) out += release(decoder_.push({ids[n]}), false);
  }
  if (taken) *taken = n;
  return out;
}

std::string TextStream::finish() { return release(decoder_.finish(), true); }

std::string token_text(const Tokenizer& tokenizer, int64_t id) {
  return tokenizer.decode({id}, false);
}

}  // namespace specdec::serve
