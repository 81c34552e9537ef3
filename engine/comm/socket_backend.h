// The socket backend: this process is one rank of a multi-process world (the way torchrun starts
// one process per GPU), and its peers are reached over TCP (engine/comm/socket_mesh.h: rendezvous
// at MASTER_ADDR:MASTER_PORT, then a connection between every pair of ranks). Collectives are the
// threads backend's algorithms run as messages: the same schedule (engine/comm/plan.h, so ring
// chunks follow NCCL's order) and the same reduction kernels (engine/comm/reduce_kernels.h), so a
// 2-process run adds the same floats in the same order as 2 threads and equals it bit for bit.
// Every message of a collective carries the sender's call (seq, op, count, dtype, ...): a receiver
// whose own call differs fails with a desync diagnosis naming both. Every wait is bounded by the
// timeout and fails naming the rank, the collective, its step and the peer it waited for; a
// failing rank tells the others, so the whole world stops with one diagnosis.
#pragma once
#include <memory>
#include <string>

#include "engine/comm/queued_comm.h"
#include "engine/comm/threads_backend.h"  // Fault

namespace dtlab {

class SocketMesh;

struct SocketOptions {
  int rank = 0, world_size = 1;
  int local_rank = 0;                     // rank within this node (LOCAL_RANK)
  int local_world_size = 1;               // ranks this node runs (LOCAL_WORLD_SIZE)
  std::string master_addr = "127.0.0.1";  // where rank 0 listens (MASTER_ADDR)
  int master_port = 29500;                // (MASTER_PORT)
  double timeout_s = 30;                  // every connect, accept and message wait
  AlgorithmDefaults algorithms;
  std::vector<Fault> faults;              // this rank applies those naming it (the lessons' hang, straggler)
};

// The variables torchrun sets: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and LOCAL_RANK if
// present. dtlab::Error (one sentence naming what is missing or malformed) otherwise.
SocketOptions socket_options_from_env();

// What this rank's comm worker is doing, for a viewer (engine/monitor) and diagnoses.
struct SocketCommStatus {
  std::string activity = "idle";
  int64_t current_seq = -1;  // the collective the worker is in (at its gate or running), else -1
  int64_t done_seq = -1;     // the last collective it finished
  CollDesc desc;             // current_seq's call
  int steps_done = 0, steps = 0;
};

class SocketCommunicator : public QueuedCommunicator {
 public:
  // Joins the world: returns once connected to every other rank. `ctx` may be null.
  SocketCommunicator(const SocketOptions& opt, RankContext* ctx);
  ~SocketCommunicator() override;
  const char* backend_name() const override { return "socket"; }
  // Fails every pending and future operation here and on every peer with `reason`.
  void abort(const std::string& reason);
  SocketCommStatus status() const;

  struct Call;  // one running collective (socket_backend.cpp)

 private:
  WorkTimes run_job(CommJob& j) override;
  void after_job(const std::string& error, bool internal) override;
  void check_runs(const CollDesc& d) const override;  // the planned all-reduces run in one process only
  WorkTimes run_collective(CommJob& j);
  WorkTimes run_p2p(CommJob& j);
  void set_status(const std::string& activity, int64_t current, int steps_done);
  // The latest collective before `seq` this rank skipped (fault injection), or -1. The comm
  // worker's own record: only its thread reads and writes skipped_.
  int64_t skipped_before(uint64_t seq) const;
  std::unique_ptr<SocketMesh> mesh_;
  std::vector<Fault> faults_;
  std::vector<uint64_t> skipped_;
  mutable std::mutex status_mu_;
  SocketCommStatus status_;
};

}  // namespace dtlab
