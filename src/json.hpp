// JSON parsing for every file specdec reads: nlohmann's parser with nesting bounded.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <exception>
#include <string>

#include "specdec/error.hpp"

namespace specdec::detail {

// Deeper than any real config, tokenizer or safetensors header (serde_json's limit). Each level
// costs tens of bytes once parsed, so a document of nothing but brackets would otherwise cost
// about 40 times its size: a 100 MB header, 4 GB.
constexpr int kMaxJsonDepth = 128;

// nlohmann::json::parse of [first, last); throws a nlohmann::json::exception (what the callers
// already turn into their own messages) for text that is not JSON, and specdec::Error saying
// "<source>: JSON nested deeper than 128 levels" past kMaxJsonDepth (without "<source>: " when
// `source` is empty).
inline nlohmann::json parse_json_bounded(const char* first, const char* last,
                                         const std::string& source) {
  return nlohmann::json::parse(
      first, last, [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
        if (depth > kMaxJsonDepth)
          throw Error((source.empty() ? "" : source + ": ") + "JSON nested deeper than " +
                      std::to_string(kMaxJsonDepth) + " levels");
        return true;
      });
}
inline nlohmann::json parse_json_bounded(const std::string& text, const std::string& source) {
  return parse_json_bounded(text.data(), text.data() + text.size(), source);
}

// Whether a JSON number is an integer: a float with an integral value counts (2.0, as pydantic's
// lax mode takes it for vLLM).
inline bool integral(const nlohmann::json& v) {
  return v.is_number_integer() ||
         (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()));
}

// An exception's text without nlohmann::json's tag ("[json.exception.parse_error.101] parse error
// at ...": the id is the library's, not the reader's).
inline std::string json_message(const std::exception& e) {
  const std::string what = e.what();
  const size_t end = what.find("] ");
  return what.rfind("[json.exception.", 0) == 0 && end != std::string::npos ? what.substr(end + 2)
                                                                            : what;
}

}  // namespace specdec::detail
