#include "serve/connection.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <memory>

namespace specdec::serve {
namespace {

// The address and port of a socket's end (getpeername or getsockname), or port -1.
template <class GetName>
std::pair<std::string, int> end_of(int sock, GetName get_name) {
  sockaddr_storage a{};
  socklen_t size = sizeof a;
  if (get_name(sock, reinterpret_cast<sockaddr*>(&a), &size) != 0) return {"", -1};
  char text[INET6_ADDRSTRLEN] = "";
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &v4.sin_addr, text, sizeof text);
    return {text, ntohs(v4.sin_port)};
  }
  if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof text);
    return {text, ntohs(v6.sin6_port)};
  }
  return {"", -1};
}

}  // namespace

int connection_socket(const std::string& remote_addr, int remote_port, int local_port) {
  const std::unique_ptr<DIR, int (*)(DIR*)> fds(opendir("/proc/self/fd"), closedir);
  if (!fds) return -1;
  while (const dirent* e = readdir(fds.get())) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    struct stat st {};
    if (end == e->d_name || *end != '\0' || fstat(static_cast<int>(fd), &st) != 0 ||
        !S_ISSOCK(st.st_mode))
      continue;
    const int sock = static_cast<int>(fd);
    if (end_of(sock, getpeername) == std::make_pair(remote_addr, remote_port) &&
        end_of(sock, getsockname).second == local_port)
      return sock;
  }
  return -1;
}

bool client_left(int sock) {
  pollfd p{sock, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return true;
  char byte = 0;
  return (p.revents & POLLIN) && recv(sock, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

}  // namespace specdec::serve
