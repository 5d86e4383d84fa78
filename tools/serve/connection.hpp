// A request's connection, for a handler that waits: cpp-httplib 0.11 (Debian 12's) tells a
// handler neither its socket nor whether its client is still there.
#pragma once

#include <string>

namespace specdec::serve {

// The socket of this process connected from remote_addr:remote_port to local_port, or -1.
int connection_socket(const std::string& remote_addr, int remote_port, int local_port);

// Whether the client closed its end of the connection (or it broke). A client that has sent
// more bytes (a pipelined request) is still there.
bool client_left(int sock);

}  // namespace specdec::serve
