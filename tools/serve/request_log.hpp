// The server's log: one line per request on stderr, as text or JSON.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace specdec::serve {

// The per-request fields of the log line, filled by the handler on its thread.
struct LogFields {
  std::chrono::steady_clock::time_point start;
  int64_t prompt_tokens = -1, completion_tokens = -1;
  bool cancelled = false;    // its client left before the answer's end
  bool counted = false;      // in Server::in_flight_ (a request that reached routing)
  bool aborted = false;      // its answer was cut short by the server (the shutdown deadline)
  std::string error, param;  // a failed request's error code (else type) and param
  std::vector<std::string> ignored;  // the request's fields that nothing read (names only)
};

// A request's line (ending in "\n"): method, path, status, milliseconds, the generation routes'
// tokens, whether the client left or the server cut the answer short, a failure's error code and
// param, the names of the fields it ignored (the first 8, each cut to 64 bytes); JSON lines begin
// with the time written (UTC, ISO 8601). `format`: "text" (the client's bytes outside printable
// ASCII as \xNN, so that a decoded %0a cannot start a forged line and the log stays ASCII) or
// "json".
std::string request_log_line(const std::string& format, const std::string& method,
                             const std::string& path, int status, double ms, const LogFields& f);

// A line of the server's own (ready, shutting down, ...): `text`, or in JSON {"time", "message"}.
std::string server_log_line(const std::string& format, const std::string& text);

// Records why a request failed on `f`: `error`, its error's code (else its type), and `param`'s
// top-level field only (stream_options.KEY, where the client made KEY up, is stream_options; a
// param that is no field's name is left out).
void note_error(LogFields& f, const std::string& error, const std::string& param);

// Writes `line` to stderr in one write: the HTTP threads log at once, their lines never
// interleave.
void write_log(const std::string& line);

}  // namespace specdec::serve
