#include "serve/connection.hpp"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <strings.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace specdec::serve {
namespace {

// An end of a socket (getpeername or getsockname) as cpp-httplib writes a request's
// (getnameinfo, numeric host), or port -1.
template <class GetName>
std::pair<std::string, int> end_of(int sock, GetName get_name) {
  sockaddr_storage a{};
  socklen_t size = sizeof a;
  char host[NI_MAXHOST] = "";
  if (get_name(sock, reinterpret_cast<sockaddr*>(&a), &size) != 0 ||
      (a.ss_family != AF_INET && a.ss_family != AF_INET6) ||
      getnameinfo(reinterpret_cast<sockaddr*>(&a), size, host, sizeof host, nullptr, 0,
                  NI_NUMERICHOST) != 0)
    return {"", -1};
  const int port = ntohs(a.ss_family == AF_INET ? reinterpret_cast<sockaddr_in&>(a).sin_port
                                                : reinterpret_cast<sockaddr_in6&>(a).sin6_port);
  return {host, port};
}

}  // namespace

int connection_socket(const std::string& remote_addr, int remote_port,
                      const std::string& local_addr, int local_port) {
  // cpp-httplib names the remote end as getpeername gives it when it reads the request: a client
  // that reset the connection by then has none (and a listening socket's would match it).
  if (remote_addr.empty() || remote_port < 0) return kConnectionGone;
  // A client that resets the connection after that has none any more either: then no socket
  // matches, and a connected socket of this local end has lost its remote one (ENOTCONN; not the
  // listening socket, which never had one).
  bool lost_its_peer = false;
  const std::unique_ptr<DIR, int (*)(DIR*)> fds(opendir("/proc/self/fd"), closedir);
  if (!fds) return kConnectionUnknown;
  while (const dirent* e = readdir(fds.get())) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    struct stat st {};
    if (end == e->d_name || *end != '\0' || fstat(static_cast<int>(fd), &st) != 0 ||
        !S_ISSOCK(st.st_mode))
      continue;
    const int sock = static_cast<int>(fd);
    if (end_of(sock, getsockname) != std::make_pair(local_addr, local_port)) continue;
    if (end_of(sock, getpeername) == std::make_pair(remote_addr, remote_port)) return sock;
    sockaddr_storage a{};
    socklen_t size = sizeof a;
    int listening = 0;
    socklen_t length = sizeof listening;
    if (getpeername(sock, reinterpret_cast<sockaddr*>(&a), &size) != 0 && errno == ENOTCONN &&
        getsockopt(sock, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) == 0 && !listening)
      lost_its_peer = true;
  }
  // (otherwise not found by a named end: not taken for a client that left)
  return lost_its_peer ? kConnectionGone : kConnectionUnknown;
}

std::optional<ApiError> framing_refusal(const httplib::Request& req) {
  // A field name is a token (RFC 9110 5.1): "Transfer-Encoding : chunked" or a folded line, which
  // cpp-httplib keeps under a name of their own, would be read otherwise by a proxy in front
  // (RFC 9112 5.1 answers them 400).
  const auto tchar = [](unsigned char ch) {
    return std::isalnum(ch) || (ch != 0 && std::strchr("!#$%&'*+-.^_`|~", ch));
  };
  for (const auto& header : req.headers)
    if (header.first.empty() || !std::all_of(header.first.begin(), header.first.end(), tchar))
      return ApiError(400, "a header field name must be a token, without spaces (RFC 9110 5.1)");
  if (req.has_header("Transfer-Encoding"))
    return ApiError(411, "a request body needs a Content-Length (no chunked bodies)", "",
                    "length_required");
  // Differing lengths (RFC 9112 6.3): a proxy in front may have framed the body otherwise.
  for (size_t i = 1; i < req.get_header_value_count("Content-Length"); ++i)
    if (req.get_header_value("Content-Length", i) != req.get_header_value("Content-Length", 0))
      return ApiError(400, "the request has differing Content-Length headers");
  const std::string text = req.get_header_value("Content-Length");
  if (req.has_header("Content-Length") &&
      (text.empty() || text.size() > 18 ||
       text.find_first_not_of("0123456789") != std::string::npos))
    return ApiError(400, "Content-Length must be a number of bytes, got '" + text + "'");
  const long long length = std::atoll(text.c_str());
  const std::string encoding = req.get_header_value("Content-Encoding");
  if (length > 0 && !encoding.empty() && ::strcasecmp(encoding.c_str(), "identity") != 0)
    return ApiError(
        415, "a request body must be sent uncompressed (got Content-Encoding: " + encoding + ")",
        "", "unsupported_media_type");
  const bool reads_body = req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
                          req.method == "DELETE" || req.method == "PRI";
  if (!reads_body && length != 0)
    return ApiError(400, "a " + req.method + " request takes no body");
  // Without one (or with an empty value, which cpp-httplib drops), cpp-httplib would read the body
  // until the connection ends: the client waited for the read timeout, then got a bare 400.
  if (reads_body && !req.has_header("Content-Length"))
    return ApiError(411, "a " + req.method + " request needs a Content-Length (0 for no body)", "",
                    "length_required");
  // A browser sends Origin, and sends a text/plain or form body from any web page without asking
  // (no CORS preflight): a page the user visits could have a keyless local server generate. A JSON
  // body is preflighted (and refused there unless --cors allows the page). curl sends no Origin:
  // its `curl -d` (a form type) stays served.
  if (length > 0 && req.has_header("Origin")) {
    std::string type = req.get_header_value("Content-Type");
    type = type.substr(0, type.find(';'));
    type.erase(std::remove(type.begin(), type.end(), ' '), type.end());
    const bool json =
        ::strcasecmp(type.c_str(), "application/json") == 0 ||
        (type.size() > 5 && ::strcasecmp(type.c_str() + type.size() - 5, "+json") == 0);
    if (!json)
      return ApiError(415,
                      "a request from a browser (it has an Origin header) must send its body as "
                      "Content-Type: application/json",
                      "", "unsupported_media_type");
  }
  // cpp-httplib would parse a multipart body as form fields and answer a bare 400 when it is not.
  if (length > 0 &&
      ::strncasecmp(req.get_header_value("Content-Type").c_str(), "multipart/", 10) == 0)
    return ApiError(415, "a request body must be JSON, not multipart (send it as application/json)",
                    "", "unsupported_media_type");
  return std::nullopt;
}

void end_connection(int sock) {
  ::shutdown(sock, SHUT_RDWR);
  // Bytes that arrived before the shutdown can still be read after it: dropped here. (Later ones
  // get a reset.)
  char buf[16384];
  while (::recv(sock, buf, sizeof buf, MSG_DONTWAIT) > 0) {
  }
}

// Equal strings in time independent of where they differ (the API key).
bool same_secret(const std::string& given, const std::string& key) {
  if (key.empty()) return false;
  unsigned char diff = given.size() == key.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ key[i % key.size()]);
  return diff == 0;
}

const char* status_text(int status) {
  switch (status) {
    case 400:
      return "bad request";
    case 404:
      return "not found";
    case 405:
      return "method not allowed";
    case 413:
      return "the request body is over the server's limit (--max-body)";
    case 414:
      return "the request URI is too long";
    case 431:
      return "the request headers are too large";
    default:
      return status >= 500 ? "internal server error" : "request refused";
  }
}

bool client_left(int sock) {
  if (sock < 0) return sock == kConnectionGone;
  pollfd p{sock, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return true;
  char byte = 0;
  return (p.revents & POLLIN) && recv(sock, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

}  // namespace specdec::serve
