// A request's connection, for a handler that waits: cpp-httplib 0.11 (Debian 12's) tells a
// handler neither its socket nor whether its client is still there.
#pragma once

#include <string>

namespace specdec::serve {

// The socket of this process connected from remote_addr:remote_port to local_addr:local_port
// (addresses as cpp-httplib writes them in a Request), or -1.
int connection_socket(const std::string& remote_addr, int remote_port,
                      const std::string& local_addr, int local_port);

// Whether the client closed its end of the connection (or it broke). A client that has sent
// more bytes (a pipelined request) is still there; one that only shut down its sending side
// (a half-close, as `nc -N` does) counts as gone.
bool client_left(int sock);

}  // namespace specdec::serve
