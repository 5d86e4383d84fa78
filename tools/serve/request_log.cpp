#include "serve/request_log.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

namespace specdec::serve {
namespace {

std::string printable(const std::string& s) {
  std::string out;
  for (const unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
      continue;
    }
    char hex[5];
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += hex;
  }
  return out;
}

// The time now as 2026-01-02T03:04:05.678Z.
std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[40];
  std::snprintf(out, sizeof out, "%s.%03dZ", buf, static_cast<int>(ms.count()));
  return out;
}

// A JSON log line (invalid UTF-8 replaced, not thrown on).
std::string json_line(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

// The names of the ignored fields as the log shows them.
std::vector<std::string> ignored_names(const std::vector<std::string>& ignored) {
  std::vector<std::string> names;
  for (size_t i = 0; i < ignored.size() && i < 8; ++i) names.push_back(ignored[i].substr(0, 64));
  if (ignored.size() > 8) names.push_back("...");
  return names;
}

}  // namespace

std::string request_log_line(const std::string& format, const std::string& method,
                             const std::string& path, int status, double ms, const LogFields& f) {
  if (format == "json") {
    nlohmann::ordered_json line = {{"time", utc_now()},
                                   {"method", method},
                                   {"path", path},
                                   {"status", status},
                                   {"ms", std::round(ms * 10) / 10}};
    if (f.prompt_tokens >= 0) {
      line["prompt_tokens"] = f.prompt_tokens;
      line["completion_tokens"] = f.completion_tokens;
    }
    if (f.cancelled) line["cancelled"] = true;
    if (f.aborted) line["aborted"] = true;
    if (!f.error.empty()) line["error"] = f.error;
    if (!f.param.empty()) line["param"] = f.param;
    if (!f.ignored.empty()) line["ignored"] = ignored_names(f.ignored);
    return json_line(line);
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f ms", ms);
  std::string text =
      printable(method) + " " + printable(path) + " " + std::to_string(status) + " " + buf;
  if (f.prompt_tokens >= 0)
    text += " prompt " + std::to_string(f.prompt_tokens) + " completion " +
            std::to_string(f.completion_tokens);
  if (f.cancelled) text += " cancelled";
  if (f.aborted) text += " aborted";
  if (!f.error.empty()) text += " error " + printable(f.error);
  if (!f.param.empty()) text += " (" + printable(f.param) + ")";
  if (!f.ignored.empty()) {
    // (a name's spaces and commas escaped too: a made-up key cannot pass for more of the line)
    const char* separator = " ignored ";
    for (const std::string& name : ignored_names(f.ignored)) {
      std::string shown;
      for (const char c : printable(name))
        shown += c == ' ' ? "\\x20" : c == ',' ? "\\x2c" : std::string(1, c);
      text += separator + shown;
      separator = ",";
    }
  }
  return text + "\n";
}

std::string server_log_line(const std::string& format, const std::string& text) {
  if (format != "json") return text + "\n";
  return json_line({{"time", utc_now()}, {"message", text}});
}

void note_error(LogFields& f, const std::string& error, const std::string& param) {
  const auto a_name = [](const std::string& p) {
    return p.size() <= 64 && std::all_of(p.begin(), p.end(), [](char c) {
             return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '[' || c == ']';
           });
  };
  f.error = error;
  const std::string field = param.substr(0, param.find('.'));  // (stream_options.KEY: its field)
  f.param = a_name(field) ? field : "";
}

void write_log(const std::string& line) {
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace specdec::serve
