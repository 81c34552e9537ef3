// Small TCP helpers shared by the socket mesh (engine/comm/socket_mesh.cpp) and the monitor
// (engine/monitor): non-blocking sockets whose every wait is bounded by a deadline, so nothing
// here can wait forever. Deadlines are seconds on the steady clock (now_s()).
#pragma once
#include <netinet/in.h>

#include <cstddef>
#include <string>

namespace dtlab::tcp {

double now_s();
int ms_left(double deadline);  // for poll(): milliseconds left until `deadline`, at least 1
// Waits until fd is ready for `events` (POLLIN/POLLOUT) or the deadline; false at the deadline.
bool wait_fd(int fd, short events, double deadline);
// Moves exactly len bytes (sends when `out`, else receives) on a non-blocking socket; false with
// `why` on end of stream, error or deadline.
bool transfer_all(int fd, char* p, size_t len, bool out, int flags, double deadline, std::string& why);
bool write_all(int fd, const void* data, size_t len, double deadline, int flags, std::string& why);
bool read_all(int fd, void* data, size_t len, double deadline, std::string& why);
sockaddr_in ipv4_address(const std::string& ip, int port);
int new_socket();  // non-blocking, close-on-exec; dtlab::Error when the system refuses
// A listening socket on ip:port (port 0: any); returns the fd and sets `port` to the bound one,
// or -1 with `why`.
int listen_on(const std::string& ip, int& port, int backlog, std::string& why);
// Connects to ip:port, retrying while nobody listens yet (the peer may start later), until the
// deadline. Returns the fd or -1 with `why`.
int connect_retry(const std::string& ip, int port, double deadline, std::string& why);
int accept_one(int listen_fd, double deadline);  // -1 at the deadline
// "127.0.0.1:29500": the other end of a connected socket, for sentences that name a peer.
std::string peer_address(int fd);
// Bytes a peer sent as text (a field, a reason), fit to quote in a sentence: up to the first NUL,
// control bytes as spaces (so a peer cannot start a line of its own), at most `max` bytes.
std::string peer_text(const char* data, size_t len, size_t max);

}  // namespace dtlab::tcp
