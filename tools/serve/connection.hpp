// A request's connection, for a handler that waits: cpp-httplib 0.11 (Debian 12's) tells a
// handler neither its socket nor whether its client is still there.
#pragma once

#include <httplib.h>

#include <optional>
#include <string>

#include "serve/protocol.hpp"

namespace specdec::serve {

// Why a request's body cannot be read as this server needs, or none: a chunked one (cpp-httplib
// bounds a body by its Content-Length only, and would read a chunked one whole), differing or
// malformed Content-Length headers, none where a body is read, a compressed body (--max-body bounds
// the bytes sent, which cpp-httplib would inflate a thousandfold), and one cpp-httplib leaves
// unread (it reads the bodies of POST, PUT, PATCH, DELETE and PRI only) and would then parse as the
// next request; and a browser's body (it sends Origin) that is not JSON, which a web page may send
// cross-site without a CORS preflight. Such a request is refused unread, and its connection ends
// after the answer (end_connection).
std::optional<ApiError> framing_refusal(const httplib::Request& req);

// Ends a connection whose request body was left unread: what the client already sent is dropped
// and the socket shut down both ways. cpp-httplib keeps serving a connection whatever the answer
// said; its next read then sees the end, not the body as a request.
void end_connection(int sock);

// The socket of this process connected from remote_addr:remote_port to local_addr:local_port
// (addresses as cpp-httplib writes them in a Request); kConnectionGone where cpp-httplib could
// name no remote end (its client reset the connection before the request was read), or where no
// socket matches and one of this local end lost its remote end (a reset since then),
// kConnectionUnknown where no socket matches otherwise or this process's sockets cannot be listed.
constexpr int kConnectionGone = -1, kConnectionUnknown = -2;
int connection_socket(const std::string& remote_addr, int remote_port,
                      const std::string& local_addr, int local_port);

// Whether the client of a connection_socket() closed its end of the connection, or it broke, or
// it was gone already (kConnectionGone). A client that has sent more bytes (a pipelined request)
// is still there; one that only shut down its sending side (a half-close, as `nc -N` does)
// counts as gone.
bool client_left(int sock);

// Whether `given` equals `key` (the API key), in a time that does not depend on where they differ;
// never for an empty key.
bool same_secret(const std::string& given, const std::string& key);

// The message of a refusal status that cpp-httplib made, or a route refused without one of its
// own ("bad request", "the request URI is too long", ...).
const char* status_text(int status);

}  // namespace specdec::serve
