#include "engine/comm/socket_mesh.h"

#include "engine/comm/plan.h"  // algorithm_step_count
#include "engine/comm/tcp.h"
#include "engine/comm/watchdog.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "engine/core/check.h"
#include "engine/core/format.h"

namespace dtlab {

namespace {

constexpr uint32_t kMagic = 0x424c5444;  // "DTLB"

using namespace tcp;

// The first thing on every connection: who is speaking.
struct Hello {
  uint32_t magic = kMagic;
  int32_t rank = 0, world_size = 0, port = 0;
  char ip[48] = {};
};
static_assert(sizeof(Hello) == 64, "Hello is sent as raw bytes");

// Rank 0's answer to a joining rank: status 0 and the address table, or an error sentence.
enum ReplyStatus : int32_t { kReplyOk = 0, kReplyBadInput = 1, kReplyFailed = 2 };
struct ReplyHeader {
  int32_t status = kReplyOk;
  uint32_t bytes = 0;  // the table (world_size Hellos) or the sentence
};

// The longest sentence a rank sends (rank 0's refusal, an abort's reason); a longer one is not a
// dtlab message, and a receiver refuses it before allocating anything.
constexpr size_t kMaxSentenceBytes = 16384;
// A message's payload at most (a 128 Ti-element float32 chunk: far beyond any run's).
constexpr uint64_t kMaxPayloadBytes = uint64_t{1} << 40;
// A payload grows as its bytes arrive, this much at a time: a header claiming a terabyte costs
// only what the peer really sends.
constexpr size_t kPayloadChunk = size_t{1} << 20;

// What is wrong with an address a peer sent in a Hello (every byte came from the network), or "".
std::string address_problem(const Hello& h) {
  if (!std::memchr(h.ip, 0, sizeof h.ip)) return "an address field of 48 bytes with no terminating NUL";
  in_addr a{};
  if (::inet_pton(AF_INET, h.ip, &a) != 1)
    return "the address '" + peer_text(h.ip, sizeof h.ip, 60) + "', which is not a dotted IPv4 address";
  if (h.port < 1 || h.port > 65535) return "port " + std::to_string(h.port) + ", outside 1..65535";
  return "";
}

// "3 entries" or "100 bytes (not a whole number of 64-byte entries)": the size of a table a peer sent.
std::string table_size_text(uint64_t bytes) {
  if (bytes % sizeof(Hello) != 0)
    return std::to_string(bytes) + " bytes (not a whole number of " + std::to_string(sizeof(Hello)) + "-byte entries)";
  const uint64_t entries = bytes / sizeof(Hello);
  return std::to_string(entries) + (entries == 1 ? " entry" : " entries");
}

// What is wrong with a message header from `peer` in a world of n ranks, or "": the kind, the call
// and the sizes must be ones a dtlab rank sends, since the receiver indexes and allocates by them.
std::string header_problem(const WireHeader& h, int peer, int n) {
  if (h.magic != kMagic) return "a message that does not start with dtlab's mark";
  if (h.kind > WireKind::Abort) return "a message of kind " + std::to_string(static_cast<int>(h.kind));
  if (h.src != peer) return "a message signed by rank " + std::to_string(h.src);
  if (h.kind == WireKind::Abort)
    return h.bytes > kMaxSentenceBytes ? "an abort reason of " + std::to_string(h.bytes) + " bytes" : "";
  if (h.op > CollectiveOp::AllToAll || h.algo > kLastAlgorithm || h.reduce > ReduceOp::Max || h.dtype > DType::F16 ||
      h.proto > Protocol::LL128)
    return "a call no dtlab rank makes (operation " + std::to_string(static_cast<int>(h.op)) + ", algorithm " +
           std::to_string(static_cast<int>(h.algo)) + ", reduction " + std::to_string(static_cast<int>(h.reduce)) +
           ", type " + std::to_string(static_cast<int>(h.dtype)) + ", protocol " + std::to_string(static_cast<int>(h.proto)) + ")";
  if (h.count < 0 || static_cast<uint64_t>(h.count) > kMaxPayloadBytes)
    return "a call of " + std::to_string(h.count) + " elements";
  // Every message carries at most the call's count of elements (a ring chunk, a block, the buffer).
  if (h.bytes > static_cast<uint64_t>(h.count) * static_cast<uint64_t>(dtype_size(h.dtype)))
    return std::to_string(h.bytes) + " bytes for a call of " + std::to_string(h.count) + " " + dtype_word(h.dtype);
  if (h.root < -1 || h.root >= n) return "root rank " + std::to_string(h.root) + " in a world of " + std::to_string(n);
  if (h.step < 0 || h.step >= std::max(1, algorithm_step_count(h.op, h.algo, n)))
    return "step " + std::to_string(int64_t{h.step} + 1) + " of a collective of " +
           std::to_string(algorithm_step_count(h.op, h.algo, n)) + " steps";
  if (!std::isfinite(h.model_t) || h.model_t < 0) return "the modeled time " + std::to_string(h.model_t);
  return "";
}

// A sentence refused or cut to what a rank sends at most.
std::string bounded(const std::string& text) { return text.size() > kMaxSentenceBytes ? text.substr(0, kMaxSentenceBytes) : text; }

void send_reply(int fd, ReplyStatus status, const void* data, size_t bytes, double deadline) {
  if (status != kReplyOk) bytes = std::min(bytes, kMaxSentenceBytes);
  ReplyHeader h{status, static_cast<uint32_t>(bytes)};
  std::string why;
  if (write_all(fd, &h, sizeof h, deadline, 0, why)) write_all(fd, data, bytes, deadline, 0, why);
}

[[noreturn]] void throw_status(ReplyStatus status, const std::string& text) {
  if (status == kReplyBadInput) throw Error(text);
  throw CommError(text);
}

}  // namespace

std::string resolve_ipv4(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res)
    throw Error("MASTER_ADDR '" + host + "' does not resolve to an IPv4 address (" + ::gai_strerror(rc) +
                "); use an address such as 127.0.0.1 or a host name of rank 0's machine");
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof buf);
  ::freeaddrinfo(res);
  return buf;
}

int pick_free_port(const std::string& host) {
  int port = 0;
  std::string why;
  int fd = listen_on(resolve_ipv4(host), port, 1, why);
  if (fd < 0) throw Error("cannot find a free TCP port on " + host + " (" + why + "); pass --master-port");
  ::close(fd);
  return port;
}

int listen_on_free_port(const std::string& host, int backlog, int& port) {
  port = 0;
  std::string why;
  const int fd = listen_on(resolve_ipv4(host), port, backlog, why);
  if (fd < 0) throw Error("cannot find a free TCP port on " + host + " (" + why + "); pass --master-port");
  return fd;
}

namespace {

// Rank 0 under dtlab-cli launch: the listening socket the launcher bound on MASTER_PORT (kMasterFdEnv),
// or -1 when there is none or it is not a socket listening on `port` (then rank 0 binds it itself).
int inherited_master_fd(int port) {
  const char* text = std::getenv(kMasterFdEnv);
  if (!text || !*text) return -1;
  char* end = nullptr;
  const long fd = std::strtol(text, &end, 10);
  if (*end != '\0' || fd < 0 || fd > 1 << 20 || ::fcntl(static_cast<int>(fd), F_GETFD) < 0) return -1;
  int listening = 0;
  socklen_t len = sizeof listening;
  sockaddr_in a{};
  socklen_t alen = sizeof a;
  if (::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening ||
      ::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&a), &alen) != 0 || ntohs(a.sin_port) != port)
    return -1;
  ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);  // (not into this rank's own children)
  return static_cast<int>(fd);
}

}  // namespace

SocketMesh::SocketMesh(const MeshOptions& opt) : opt_(opt) {
  const int n = opt_.world_size, r = opt_.rank;
  if (n < 1 || n > 1024) throw Error("WORLD_SIZE " + std::to_string(n) + " is out of range; use 1 to 1024");
  if (r < 0 || r >= n)
    throw Error("RANK " + std::to_string(r) + " is out of range for WORLD_SIZE " + std::to_string(n) +
                "; use 0 to " + std::to_string(n - 1));
  if (!(opt_.timeout_s > 0)) throw Error("the socket timeout must be positive");
  opt_.master_addr = resolve_ipv4(opt_.master_addr);
  fd_.assign(static_cast<size_t>(n), -1);
  partial_.resize(static_cast<size_t>(n));
  closed_.assign(static_cast<size_t>(n), false);
  closed_why_.assign(static_cast<size_t>(n), "");
  last_.assign(static_cast<size_t>(n), "");
  last_seq_.assign(static_cast<size_t>(n), -1);
  for (int q = 0; q < n; q++) send_mu_.push_back(std::make_unique<std::mutex>());
  if (n > 1) {
    std::string why;
    int port = r == 0 ? opt_.master_port : 0;
    // Rank 0 listens where everyone looks for it; the others on any port of any interface, which
    // they announce to rank 0 with the address their route to rank 0 used.
    int listen_fd = r == 0 ? inherited_master_fd(port) : -1;
    if (listen_fd < 0) listen_fd = listen_on(r == 0 ? opt_.master_addr : "0.0.0.0", port, n, why);
    if (listen_fd < 0)
      throw Error("rank " + std::to_string(r) + " cannot listen on " +
                  (r == 0 ? opt_.master_addr + ":" + std::to_string(port) : "a TCP port") + " (" + why +
                  "); choose another MASTER_PORT");
    try {
      if (r == 0) rendezvous_master(listen_fd);
      else rendezvous_peer(listen_fd, port);
    } catch (...) {
      ::close(listen_fd);
      for (int fd : fd_)
        if (fd >= 0) ::close(fd);
      throw;
    }
    ::close(listen_fd);
    for (int fd : fd_) {
      if (fd < 0) continue;
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
  }
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) throw Error(std::string("cannot create a pipe: ") + std::strerror(errno));
  receiver_ = std::thread([this] { receive_loop(); });
}

void SocketMesh::rendezvous_master(int listen_fd) {
  const int n = opt_.world_size;
  const double deadline = Deadline(opt_.timeout_s).at_s();  // in tcp's seconds, for its poll-based waits
  const std::string where = opt_.master_addr + ":" + std::to_string(opt_.master_port);
  std::vector<Hello> table(static_cast<size_t>(n));
  table[0].world_size = n;
  table[0].port = opt_.master_port;
  std::snprintf(table[0].ip, sizeof table[0].ip, "%s", opt_.master_addr.c_str());
  // Tells every rank that joined why the rendezvous failed, then fails here with the same words.
  auto fail = [&](ReplyStatus status, const std::string& text) {
    for (int fd : fd_)
      if (fd >= 0) send_reply(fd, status, text.data(), text.size(), now_s() + 1.0);
    throw_status(status, text);
  };
  for (int joined = 1; joined < n;) {
    int fd = accept_one(listen_fd, deadline);
    if (fd < 0) {
      std::vector<int> missing;
      for (int q = 1; q < n; q++)
        if (fd_[static_cast<size_t>(q)] < 0) missing.push_back(q);
      fail(kReplyFailed, "rank 0: the rendezvous on " + where + " timed out after " + seconds_text(opt_.timeout_s) + ": " +
                             ranks_text(missing) + " never connected; start all WORLD_SIZE=" + std::to_string(n) +
                             " ranks with the same MASTER_ADDR and MASTER_PORT");
    }
    Hello h;
    std::string why;
    if (!read_all(fd, &h, sizeof h, std::min(deadline, now_s() + 5.0), why) || h.magic != kMagic) {
      ::close(fd);  // not one of ours (a port scan, a stale process): keep waiting for the ranks
      continue;
    }
    std::string bad;
    if (h.world_size != n)
      bad = "rank " + std::to_string(h.rank) + " joined with WORLD_SIZE=" + std::to_string(h.world_size) +
            " but rank 0 has WORLD_SIZE=" + std::to_string(n) + "; give every rank the same WORLD_SIZE";
    else if (h.rank <= 0 || h.rank >= n)
      bad = "a process joined as rank " + std::to_string(h.rank) + ", outside 1.." + std::to_string(n - 1) +
            "; give every process its own RANK in 0.." + std::to_string(n - 1);
    else if (fd_[static_cast<size_t>(h.rank)] >= 0)
      bad = "two processes joined as rank " + std::to_string(h.rank) + "; give every process its own RANK";
    else if (const std::string p = address_problem(h); !p.empty())
      bad = "the process at " + peer_address(fd) + " joined as rank " + std::to_string(h.rank) + " with " + p +
            ", which no dtlab rank sends; is another program connecting to MASTER_PORT?";
    if (!bad.empty()) {
      send_reply(fd, kReplyBadInput, bad.data(), bad.size(), now_s() + 1.0);
      ::close(fd);
      fail(kReplyBadInput, "rank 0: " + bad);
    }
    fd_[static_cast<size_t>(h.rank)] = fd;
    table[static_cast<size_t>(h.rank)] = h;
    joined++;
  }
  for (int q = 1; q < n; q++)
    send_reply(fd_[static_cast<size_t>(q)], kReplyOk, table.data(), table.size() * sizeof(Hello), deadline);
}

void SocketMesh::rendezvous_peer(int listen_fd, int listen_port) {
  const int n = opt_.world_size, r = opt_.rank;
  const double deadline = Deadline(opt_.timeout_s).at_s();  // in tcp's seconds, for its poll-based waits
  const std::string me = "rank " + std::to_string(r);
  const std::string where = opt_.master_addr + ":" + std::to_string(opt_.master_port);
  std::string why;
  int master = connect_retry(opt_.master_addr, opt_.master_port, deadline, why);
  if (master < 0)
    throw CommError(me + ": could not connect to rank 0 at " + where + " within " + seconds_text(opt_.timeout_s) + " (" +
                    why + "); start rank 0 with the same MASTER_ADDR and MASTER_PORT");
  fd_[0] = master;
  Hello h;
  h.rank = r;
  h.world_size = n;
  h.port = listen_port;
  sockaddr_in self{};
  socklen_t len = sizeof self;
  ::getsockname(master, reinterpret_cast<sockaddr*>(&self), &len);  // this host as rank 0 reaches it
  ::inet_ntop(AF_INET, &self.sin_addr, h.ip, sizeof h.ip);
  if (!write_all(master, &h, sizeof h, deadline, 0, why))
    throw CommError(me + ": could not introduce itself to rank 0 at " + where + " (" + why + ")");
  // Rank 0 waits for every rank up to the same timeout and then says who is missing: give its
  // sentence a moment to arrive before blaming rank 0 itself.
  ReplyHeader rh;
  if (!read_all(master, &rh, sizeof rh, deadline + 2.0, why))
    throw CommError(me + ": rank 0 at " + where + " did not send the address table within " + seconds_text(opt_.timeout_s) +
                    " (" + why + "); rank 0 failed or other ranks never started");
  // Everything below came from the network: sizes are checked before anything is allocated, and
  // every field before it is used.
  const std::string from = me + ": the process at " + where + " sent ";
  const std::string stranger = "; is another program listening on MASTER_PORT?";
  const size_t table_bytes = static_cast<size_t>(n) * sizeof(Hello);
  if (rh.status != kReplyOk && rh.status != kReplyBadInput && rh.status != kReplyFailed)
    throw CommError(from + "a rendezvous answer of status " + std::to_string(rh.status) + ", which no dtlab rank 0 sends" + stranger);
  if (rh.status == kReplyOk && rh.bytes != table_bytes)
    throw CommError(from + "an address table of " + table_size_text(rh.bytes) + " for a world of " + std::to_string(n) + stranger);
  if (rh.status != kReplyOk && rh.bytes > kMaxSentenceBytes)
    throw CommError(from + "a refusal of " + std::to_string(rh.bytes) + " bytes, longer than any dtlab sentence" + stranger);
  std::vector<char> body(rh.bytes);
  if (!read_all(master, body.data(), body.size(), deadline + 2.0, why))
    throw CommError(me + ": the rendezvous with rank 0 at " + where + " broke off (" + why + ")");
  if (rh.status != kReplyOk)
    throw_status(static_cast<ReplyStatus>(rh.status), peer_text(body.data(), body.size(), kMaxSentenceBytes));
  std::vector<Hello> table(static_cast<size_t>(n));
  std::memcpy(table.data(), body.data(), body.size());
  for (int q = 0; q < n; q++) {
    const Hello& t = table[static_cast<size_t>(q)];
    std::string bad = t.magic != kMagic ? "no dtlab mark"
                      : t.rank != q     ? "rank " + std::to_string(t.rank)
                      : t.world_size != n ? "WORLD_SIZE=" + std::to_string(t.world_size)
                                          : address_problem(t);
    if (!bad.empty())
      throw CommError(from + "an address table whose entry for rank " + std::to_string(q) + " has " + bad + stranger);
  }
  // Lower ranks (except 0, already connected) accept; this rank connects to them.
  for (int q = 1; q < r; q++) {
    const Hello& t = table[static_cast<size_t>(q)];
    int fd = connect_retry(t.ip, t.port, deadline, why);
    if (fd < 0)
      throw CommError(me + ": could not connect to rank " + std::to_string(q) + " at " + t.ip + ":" +
                      std::to_string(t.port) + " within " + seconds_text(opt_.timeout_s) + " (" + why + ")");
    fd_[static_cast<size_t>(q)] = fd;
    if (!write_all(fd, &h, sizeof h, deadline, 0, why))
      throw CommError(me + ": could not introduce itself to rank " + std::to_string(q) + " (" + why + ")");
  }
  accept_peers(listen_fd, r + 1, deadline);
}

void SocketMesh::accept_peers(int listen_fd, int from, double deadline) {
  const int n = opt_.world_size;
  for (int joined = from; joined < n;) {
    int fd = accept_one(listen_fd, deadline);
    if (fd < 0) {
      std::vector<int> missing;
      for (int q = from; q < n; q++)
        if (fd_[static_cast<size_t>(q)] < 0) missing.push_back(q);
      throw CommError("rank " + std::to_string(opt_.rank) + ": " + ranks_text(missing) + " did not connect within " +
                      seconds_text(opt_.timeout_s) + " after the rendezvous (a firewall between the ranks' hosts?)");
    }
    Hello h;
    std::string why;
    if (!read_all(fd, &h, sizeof h, std::min(deadline, now_s() + 5.0), why) || h.magic != kMagic ||
        h.world_size != n || h.rank < from || h.rank >= n || fd_[static_cast<size_t>(h.rank)] >= 0) {
      ::close(fd);  // not one of this world's ranks: keep waiting for them
      continue;
    }
    fd_[static_cast<size_t>(h.rank)] = fd;
    joined++;
  }
}

SocketMesh::~SocketMesh() {
  const int n = opt_.world_size;
  if (!aborted()) {
    // End of stream to every peer, then wait for theirs: closing with unread data would reset the
    // connection and could destroy messages a peer has not read yet.
    for (int q = 0; q < n; q++)
      if (fd_[static_cast<size_t>(q)] >= 0) ::shutdown(fd_[static_cast<size_t>(q)], SHUT_WR);
    std::unique_lock<std::mutex> lock(mu_);
    Deadline deadline(opt_.timeout_s);
    wait_under(cv_, lock, deadline, [&] {
      for (int q = 0; q < n; q++)
        if (q != opt_.rank && !closed_[static_cast<size_t>(q)]) return aborted_;
      return true;
    });
  }
  if (receiver_.joinable()) {
    char c = 1;
    (void)!::write(wake_[1], &c, 1);
    receiver_.join();
  }
  for (int fd : fd_)
    if (fd >= 0) ::close(fd);
  for (int fd : wake_)
    if (fd >= 0) ::close(fd);
}

bool SocketMesh::send(int peer, WireHeader h, const void* payload, std::string& why) {
  h.magic = kMagic;
  h.src = opt_.rank;
  const double deadline = Deadline(opt_.timeout_s).at_s();  // in tcp's seconds, for its poll-based waits
  std::lock_guard<std::mutex> lock(*send_mu_[static_cast<size_t>(peer)]);
  const int fd = fd_[static_cast<size_t>(peer)];
  return write_all(fd, &h, sizeof h, deadline, h.bytes > 0 ? MSG_MORE : 0, why) &&
         write_all(fd, payload, h.bytes, deadline, 0, why);
}

WaitEnd SocketMesh::take(WireKind kind, int peer, int64_t id, WireMessage& out, double timeout_s) {
  const auto key = std::make_tuple(kind, peer, id);
  std::unique_lock<std::mutex> lock(mu_);
  Deadline deadline(timeout_s >= 0 ? timeout_s : opt_.timeout_s);
  auto it = inbox_.find(key);
  auto has = [&] {
    it = inbox_.find(key);
    return it != inbox_.end() && !it->second.empty();
  };
  wait_under(cv_, lock, deadline, [&] { return aborted_ || has() || closed_[static_cast<size_t>(peer)]; });
  if (aborted_) return WaitEnd::Aborted;
  if (has()) {
    out = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) inbox_.erase(it);
    return WaitEnd::Ok;
  }
  return closed_[static_cast<size_t>(peer)] ? WaitEnd::Closed : WaitEnd::Timeout;
}

std::string SocketMesh::last_from(int peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string& last = last_[static_cast<size_t>(peer)];
  std::string s = last.empty() ? "nothing has arrived from rank " + std::to_string(peer)
                               : "the last message from rank " + std::to_string(peer) + " was " + last;
  if (closed_[static_cast<size_t>(peer)]) s += "; then it " + closed_why_[static_cast<size_t>(peer)];
  return s;
}

int64_t SocketMesh::last_collective_seq(int peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_seq_[static_cast<size_t>(peer)];
}

void SocketMesh::abort(const std::string& why) {
  const std::string reason = bounded(why);  // what a peer accepts
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = reason;
  }
  cv_.notify_all();
  // Best effort and brief: a peer that is gone or stuck must not hold this rank's exit.
  WireHeader h;
  h.kind = WireKind::Abort;
  h.bytes = reason.size();
  h.magic = kMagic;
  h.src = opt_.rank;
  for (int q = 0; q < opt_.world_size; q++) {
    const int fd = fd_[static_cast<size_t>(q)];
    if (fd < 0) continue;
    std::unique_lock<std::mutex> lock(*send_mu_[static_cast<size_t>(q)], std::defer_lock);
    const double deadline = now_s() + 1.0;
    while (!lock.try_lock() && now_s() < deadline) ::usleep(1000);
    if (!lock.owns_lock()) continue;
    std::string why;
    if (write_all(fd, &h, sizeof h, deadline, MSG_MORE, why)) write_all(fd, reason.data(), reason.size(), deadline, 0, why);
  }
}

bool SocketMesh::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

std::string SocketMesh::abort_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_reason_;
}

void SocketMesh::mark_closed(int peer, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_[static_cast<size_t>(peer)] = true;
    closed_why_[static_cast<size_t>(peer)] = why;
  }
  cv_.notify_all();
}

void SocketMesh::receive_loop() {
  const int n = opt_.world_size;
  std::vector<bool> open(static_cast<size_t>(n));
  for (int q = 0; q < n; q++) open[static_cast<size_t>(q)] = fd_[static_cast<size_t>(q)] >= 0;
  std::vector<pollfd> fds;
  std::vector<int> who;
  while (true) {
    fds.assign(1, pollfd{wake_[0], POLLIN, 0});
    who.assign(1, -1);
    for (int q = 0; q < n; q++)
      if (open[static_cast<size_t>(q)]) {
        fds.push_back(pollfd{fd_[static_cast<size_t>(q)], POLLIN, 0});
        who.push_back(q);
      }
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    for (size_t i = 1; i < fds.size(); i++)
      if (fds[i].revents && !read_ready(who[i])) open[static_cast<size_t>(who[i])] = false;
  }
}

bool SocketMesh::read_ready(int peer) {
  const int fd = fd_[static_cast<size_t>(peer)];
  Partial& p = partial_[static_cast<size_t>(peer)];
  constexpr size_t kHead = sizeof(WireHeader);
  while (true) {
    char* dst;
    size_t want;  // never 0: a message is delivered as soon as its last byte is in
    if (p.have < kHead) {
      dst = reinterpret_cast<char*>(&p.h) + p.have;
      want = kHead - p.have;
    } else {
      const size_t done = p.have - kHead;
      if (done == p.payload.size()) p.payload.resize(static_cast<size_t>(std::min<uint64_t>(p.h.bytes, done + kPayloadChunk)));
      dst = reinterpret_cast<char*>(p.payload.data()) + done;
      want = p.payload.size() - done;
    }
    const ssize_t got = ::recv(fd, dst, want, 0);
    if (got == 0) {
      mark_closed(peer, "closed the connection");
      return false;
    }
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      mark_closed(peer, std::string("broke the connection (") + std::strerror(errno) + ")");
      return false;
    }
    p.have += static_cast<size_t>(got);
    if (p.have == kHead) {
      if (const std::string bad = header_problem(p.h, peer, opt_.world_size); !bad.empty()) {
        // Not a message this build sends: the world stops with one sentence naming the sender,
        // rather than acting on fields nobody checked.
        const std::string reason = "rank " + std::to_string(opt_.rank) + ": rank " + std::to_string(peer) + " (the process at " +
                                   peer_address(fd) + ") sent " + bad + ", which no dtlab rank sends; every rank must run the same dtlab build";
        // The abort first: a collective waiting on this peer wakes to the reason, not to a closed
        // peer it would diagnose as lost (the order once raced in the socket_hostile test).
        abort(reason);
        mark_closed(peer, "sent a malformed message");
        return false;
      }
    }
    if (p.have < kHead || p.have < kHead + p.h.bytes) continue;
    WireMessage m{p.h, std::move(p.payload)};
    m.h.src = peer;
    p = Partial{};
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (m.h.kind == WireKind::Abort) {
        if (!aborted_) {
          aborted_ = true;
          abort_reason_ = peer_text(reinterpret_cast<const char*>(m.payload.data()), m.payload.size(), kMaxSentenceBytes);
        }
      } else {
        last_[static_cast<size_t>(peer)] =
            m.h.kind == WireKind::Collective
                ? "step " + std::to_string(m.h.step + 1) + " of collective " + describe(m.h.desc(), m.h.seq)
                : "send #" + std::to_string(m.h.seq) + " of " + std::to_string(m.h.count) + " " + dtype_word(m.h.dtype) +
                      " (tag " + std::to_string(m.h.tag) + ")";
        if (m.h.kind == WireKind::Collective) last_seq_[static_cast<size_t>(peer)] = static_cast<int64_t>(m.h.seq);
        const int64_t id = m.h.kind == WireKind::Collective ? static_cast<int64_t>(m.h.seq) : m.h.tag;
        inbox_[std::make_tuple(m.h.kind, peer, id)].push_back(std::move(m));
      }
    }
    cv_.notify_all();
  }
}

}  // namespace dtlab
