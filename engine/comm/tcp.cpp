#include "engine/comm/tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "engine/core/check.h"

namespace dtlab::tcp {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int ms_left(double deadline) { return static_cast<int>(std::max(0.0, (deadline - now_s()) * 1000.0) + 1); }

bool wait_fd(int fd, short events, double deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0 && now_s() >= deadline) return false;
    if (r < 0 && errno != EINTR) return false;
  }
}

// Moves exactly len bytes (sends when `out`, else receives) on a non-blocking socket, waiting for
// it to be ready until the deadline; false with `why` on end of stream, error or deadline.
bool transfer_all(int fd, char* p, size_t len, bool out, int flags, double deadline, std::string& why) {
  while (len > 0) {
    ssize_t n = out ? ::send(fd, p, len, MSG_NOSIGNAL | flags) : ::recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0 && !out) {
      why = "the connection closed";
      return false;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (wait_fd(fd, out ? POLLOUT : POLLIN, deadline)) continue;
      why = out ? "the send did not finish in time (the peer stopped reading)" : "nothing arrived in time";
      return false;
    }
    why = std::strerror(errno);
    return false;
  }
  return true;
}

bool write_all(int fd, const void* data, size_t len, double deadline, int flags, std::string& why) {
  return transfer_all(fd, const_cast<char*>(static_cast<const char*>(data)), len, true, flags, deadline, why);
}

bool read_all(int fd, void* data, size_t len, double deadline, std::string& why) {
  return transfer_all(fd, static_cast<char*>(data), len, false, 0, deadline, why);
}

sockaddr_in ipv4_address(const std::string& ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  return a;
}

int new_socket() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error(std::string("cannot create a TCP socket: ") + std::strerror(errno));
  return fd;
}

// A listening socket on ip:port (port 0: any); returns the fd and sets `port` to the bound one.
int listen_on(const std::string& ip, int& port, int backlog, std::string& why) {
  int fd = new_socket();
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a = ipv4_address(ip, port);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, backlog) != 0) {
    why = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

// Connects to ip:port, retrying while nobody listens yet (the peer may start later), until the
// deadline. Returns the fd or -1 with `why`.
int connect_retry(const std::string& ip, int port, double deadline, std::string& why) {
  const sockaddr_in a = ipv4_address(ip, port);
  while (true) {
    int fd = new_socket();
    int r = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
    if (r != 0 && errno == EINPROGRESS) {
      int err = ETIMEDOUT;
      if (wait_fd(fd, POLLOUT, std::min(deadline, now_s() + 1.0))) {
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
      r = err == 0 ? 0 : -1;
      errno = err;
    }
    if (r == 0) return fd;
    why = std::strerror(errno);
    ::close(fd);
    if (now_s() + 0.05 >= deadline) return -1;
    ::usleep(50000);
  }
}

int accept_one(int listen_fd, double deadline) {
  if (!wait_fd(listen_fd, POLLIN, deadline)) return -1;
  return ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
}

std::string peer_address(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  char ip[INET_ADDRSTRLEN] = {};
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || !::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip))
    return "an unknown address";
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

std::string peer_text(const char* data, size_t len, size_t max) {
  const char* end = static_cast<const char*>(std::memchr(data, 0, len));
  std::string s(data, end ? static_cast<size_t>(end - data) : len);
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  if (s.size() > max) s = s.substr(0, max) + "...";
  return s;
}

}  // namespace dtlab::tcp
