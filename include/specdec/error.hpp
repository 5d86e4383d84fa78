// specdec::Error: the one exception type the library throws for bad input or misuse.
#pragma once

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>

namespace specdec {

// Every error names what is wrong (file, field or parameter) and what was expected.
// A NUL byte in the message (a name read from a file) shows as \0: what() would end at it.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(shown(what)) {}

 private:
  static std::string shown(const std::string& s) {
    if (s.find('\0') == std::string::npos) return s;
    std::string out;  // one pass: a message with many NULs costs its length, not length x NULs
    out.reserve(s.size() + 16);
    for (const char c : s) {
      if (c == '\0')
        out += "\\0";
      else
        out += c;
    }
    return out;
  }
};

// Thrown by a streaming callback to stop its request: Generator::generate then returns the tokens
// delivered so far, with stats.stop_reason "cancelled" (unless the group it keeps had already
// ended the request: then that group's own reason, "eos" or "max_new_tokens"). Cancelled(n) keeps
// only the first n of the tokens the callback was just given (a stop string that ended among them):
// the result, its token counts and its acceptance statistics end there. Any other exception a
// callback throws leaves generate() as it is; in both cases the Generator stays usable.
class Cancelled : public std::exception {
 public:
  Cancelled() = default;
  explicit Cancelled(size_t kept) : kept_(kept) {}
  const char* what() const noexcept override { return "generation cancelled by the callback"; }
  // How many of the tokens just delivered the request keeps (all of them by default).
  size_t kept() const { return kept_; }

 private:
  size_t kept_ = static_cast<size_t>(-1);
};

namespace detail {
[[noreturn]] void throw_error(const std::string& message);

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace specdec

// SPECDEC_CHECK(cond, "field x: expected ", a, ", got ", b) throws specdec::Error when cond is
// false.
#define SPECDEC_CHECK(cond, ...)                                                         \
  do {                                                                                   \
    if (!(cond)) ::specdec::detail::throw_error(::specdec::detail::concat(__VA_ARGS__)); \
  } while (0)
