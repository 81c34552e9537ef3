// The transport under the socket backend: one process per rank, a TCP connection between every
// pair of ranks, and framed messages on them. Rendezvous follows torch's TCPStore bootstrap: rank 0
// listens on MASTER_ADDR:MASTER_PORT, every other rank connects to it and says which port it
// listens on, rank 0 sends everyone the address table, and each rank r > 0 connects to the ranks
// 1..r-1 (its link to rank 0 is the bootstrap connection itself). A receiver thread per process
// drains every connection into an inbox, so a send never waits for the peer's program to call recv
// and messages for later collectives or other tags simply wait their turn. Every wait (connect,
// accept, a message) is bounded by the timeout and ends in one of the WaitEnd reasons below; the
// caller (socket_backend.cpp) turns that into a diagnosis naming the collective. Every byte a peer
// sends is untrusted input (whatever listens on MASTER_PORT may not be rank 0): sizes are checked
// before anything is allocated, fields before they are used, and a malformed message ends the
// rendezvous or the world with a CommError naming the sender and what was wrong.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/comm/queued_comm.h"

namespace dtlab {

enum class WireKind : uint8_t { Collective, P2P, Abort };

// Every message starts with this (native byte order: every rank runs this same build). The first
// message of each collective step carries the sender's call, so a receiver detects a desync.
struct WireHeader {
  uint32_t magic = 0;
  WireKind kind = WireKind::Collective;
  CollectiveOp op = CollectiveOp::AllReduce;
  Algorithm algo = Algorithm::Ring;
  ReduceOp reduce = ReduceOp::Sum;
  DType dtype = DType::F32;
  Protocol proto = Protocol::Default;
  uint8_t pad[2] = {};
  int32_t root = -1;
  int32_t tag = 0;      // point to point
  int32_t step = 0;     // collectives: the algorithm step
  int32_t src = -1;     // sender rank
  uint32_t pad2 = 0;
  uint64_t seq = 0;     // the sender's collective (or point-to-point) number
  int64_t count = 0;    // the call's count argument
  uint64_t bytes = 0;   // payload bytes that follow the header
  double model_t = 0;   // sender's modeled clock when it sent
  CollDesc desc() const { return {op, algo, reduce, dtype, count, root, proto}; }
};
static_assert(sizeof(WireHeader) == 64, "WireHeader is sent as raw bytes");

struct WireMessage {
  WireHeader h;
  std::vector<uint8_t> payload;
};

struct MeshOptions {
  int rank = 0, world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double timeout_s = 30;
};

enum class WaitEnd { Ok, Timeout, Closed, Aborted };

class SocketMesh {
 public:
  // Rendezvous and full mesh; returns when this rank is connected to every other rank. Throws
  // dtlab::Error for bad addresses or a port in use, CommError when a rank does not show up.
  explicit SocketMesh(const MeshOptions& opt);
  // Closes gracefully (each side sends its end of stream, then waits briefly for the peers') so no
  // message still in flight is lost; after an abort it just closes.
  ~SocketMesh();
  SocketMesh(const SocketMesh&) = delete;
  SocketMesh& operator=(const SocketMesh&) = delete;

  int rank() const { return opt_.rank; }
  int world_size() const { return opt_.world_size; }
  double timeout_s() const { return opt_.timeout_s; }

  // Writes header (magic and src filled in) and payload to `peer`, bounded by the timeout. Returns
  // false (with `why`) when the connection failed or timed out.
  bool send(int peer, WireHeader h, const void* payload, std::string& why);
  // Waits (the timeout, or `timeout_s` when given) for the next message of kind Collective from
  // `peer` with seq `id`, or of kind P2P with tag `id`.
  WaitEnd take(WireKind kind, int peer, int64_t id, WireMessage& out, double timeout_s = -1);
  // What arrived last from `peer`, as a clause for diagnoses ("the last message from rank 0 was
  // step 1 of collective #4 allreduce of ...", or "nothing has arrived from rank 0").
  std::string last_from(int peer) const;
  // The collective number of the last collective message from `peer`; -1 before the first.
  int64_t last_collective_seq(int peer) const;

  // Marks the mesh failed with `reason` and sends it to every peer, whose waits then fail with it.
  void abort(const std::string& reason);
  bool aborted() const;
  std::string abort_reason() const;

 private:
  void rendezvous_master(int listen_fd);
  void rendezvous_peer(int listen_fd, int listen_port);
  void accept_peers(int listen_fd, int from, double deadline_s);
  void receive_loop();
  bool read_ready(int peer);  // false: closed
  void mark_closed(int peer, const std::string& why);

  MeshOptions opt_;
  std::vector<int> fd_;  // per peer (-1 for this rank)
  std::vector<std::unique_ptr<std::mutex>> send_mu_;
  int wake_[2] = {-1, -1};  // pipe that stops the receiver thread

  // Receiver-side state per peer: the message being assembled.
  struct Partial {
    WireHeader h;
    size_t have = 0;  // bytes of header + payload read so far
    std::vector<uint8_t> payload;
  };
  std::vector<Partial> partial_;

  mutable std::mutex mu_;  // inbox, closed, last, aborted
  std::condition_variable cv_;
  std::map<std::tuple<WireKind, int, int64_t>, std::deque<WireMessage>> inbox_;  // FIFO per key
  std::vector<bool> closed_;
  std::vector<std::string> closed_why_;
  std::vector<std::string> last_;
  std::vector<int64_t> last_seq_;  // per peer: seq of its last collective message, -1 none
  bool aborted_ = false;
  std::string abort_reason_;
  std::thread receiver_;
};

// MASTER_ADDR resolved to a dotted IPv4 address; dtlab::Error when it does not resolve.
std::string resolve_ipv4(const std::string& host);
// A TCP port on `host` that nobody listens on right now (bound, read, closed: another process may
// still take it, which the launcher accepts as torchrun does).
int pick_free_port(const std::string& host);
// dtlab-cli launch's way around that race: a socket already listening on a free port of `host`
// (backlog `backlog`), which the launcher hands to rank 0 (kMasterFdEnv names the inherited fd); rank
// 0's SocketMesh accepts on it instead of binding MASTER_PORT itself, so no other process can take
// the port between the pick and the bind. Sets `port`; dtlab::Error when no port can be had.
int listen_on_free_port(const std::string& host, int backlog, int& port);
inline constexpr const char* kMasterFdEnv = "DTLAB_MASTER_FD";

}  // namespace dtlab
