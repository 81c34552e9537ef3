// The Communicator: what a rank calls to talk to the others. Calls are asynchronous: each returns a
// Work handle at once and the rank's communication worker (its "comm stream") runs the operations
// in issue order, so communication overlaps compute until wait(). The backends (threads and socket
// in engine/comm, cuda and nccl in engine/cuda) implement this interface; DDP, FSDP and pipelines
// only see this file.
//
// Buffer contracts follow torch.distributed / NCCL:
//   all_reduce(buf, count)             in place, every rank ends with the reduction
//   reduce_scatter(out, in, count)     in: count * world elements; out: count, block `rank` reduced
//   all_gather(out, in, count)         in: count; out: count * world, block r from rank r
//   broadcast(buf, count, root)        root's buf copied to everyone
//   reduce(buf, count, op, root)       result in root's buf; other ranks' bufs left unchanged
//   all_to_all(out, in, count)         block j of rank i's in -> block i of rank j's out
//   send/recv(buf, count, peer, tag)   point to point; sends are buffered (never block the worker)
// Buffers must stay valid and untouched until the Work completes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/check.h"
#include "engine/core/collective.h"  // CollectiveOp, ReduceOp, Algorithm
#include "engine/core/tensor.h"

namespace dtlab {

class RankContext;  // engine/trace/context.h

// A process group's own transfers (the steps of its ring, engine/comm/group.h) carry this bit in
// their tag: the group records them as its collective's RingStep events, so the backend records no
// Send/Recv event for them (the trace shows the group's collective, not the point-to-point parts).
inline constexpr int kGroupStepTag = 1 << 30;

// A failed collective: watchdog timeout, desync between ranks, or an aborted world. The message is
// the full diagnosis (which collective, which ranks arrived, which are missing and what they do).
struct CommError : Error {
  using Error::Error;
};

// When the communication worker ran an operation: wall clock (the recorder's ns) and modeled clock.
struct WorkTimes {
  int64_t wall_begin_ns = 0, wall_end_ns = 0;
  double model_begin = 0, model_end = 0;
};

class Work {
 public:
  virtual ~Work() = default;
  virtual bool is_completed() const = 0;
  // Blocks until the operation finished; throws CommError if it failed. Never waits forever: the
  // watchdog fails every collective that is not complete within the configured timeout.
  virtual void wait() = 0;
  virtual uint64_t seq() const = 0;  // this rank's sequence number of the operation
  virtual WorkTimes times() const = 0;  // meaningful once completed
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual const char* backend_name() const = 0;
  // Collectives this rank has issued so far (the next one's sequence number); call from the rank's
  // own thread. The stepper's iteration gates use it to place themselves in the global order.
  virtual uint64_t collectives_issued() const = 0;
  // The rank's instrumentation (events, modeled clocks) that process groups built on this
  // communicator record into; null when the rank records nothing.
  virtual RankContext* trace_context() const { return nullptr; }

  virtual WorkPtr all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op,
                             Algorithm algo = Algorithm::Default) = 0;
  virtual WorkPtr reduce_scatter(void* out, const void* in, int64_t count, DType dtype, ReduceOp op,
                                 Algorithm algo = Algorithm::Default) = 0;
  virtual WorkPtr all_gather(void* out, const void* in, int64_t count, DType dtype,
                             Algorithm algo = Algorithm::Default) = 0;
  virtual WorkPtr broadcast(void* buf, int64_t count, DType dtype, int root,
                            Algorithm algo = Algorithm::Default) = 0;
  virtual WorkPtr reduce(void* buf, int64_t count, DType dtype, ReduceOp op, int root,
                         Algorithm algo = Algorithm::Default) = 0;
  virtual WorkPtr barrier() = 0;
  virtual WorkPtr send(const void* buf, int64_t count, DType dtype, int peer, int tag = 0) = 0;
  virtual WorkPtr recv(void* buf, int64_t count, DType dtype, int peer, int tag = 0) = 0;
  // `algo`: Pairwise or Grouped (collective.h); Default: the communicator's alltoall_default().
  virtual WorkPtr all_to_all(void* out, const void* in, int64_t count_per_rank, DType dtype,
                             Algorithm algo = Algorithm::Default) = 0;
  // torch's all_to_all_single with split sizes (MoE's token dispatch): send_counts[j] elements of
  // `in` (packed in rank order) to rank j, recv_counts[i] elements from rank i into `out` (packed).
  // Process groups (new_group) run it as pairwise exchange, one step per distance, or grouped, every
  // pair in one step; a world communicator refuses it (make a group of every rank).
  virtual WorkPtr all_to_all_v(void* out, const std::vector<int64_t>& recv_counts, const void* in,
                               const std::vector<int64_t>& send_counts, DType dtype, Algorithm algo = Algorithm::Default);
  // The all-to-all algorithm a call with Algorithm::Default runs (a process group: its parent's).
  virtual Algorithm alltoall_default() const { return collective_traits(CollectiveOp::AllToAll).default_algorithm; }
  // A send to `to` and a receive from `from` that must progress together, as one operation: the
  // Work completes when both have. Backends whose sends are buffered just issue the two (this
  // default); NCCL's sends wait for the peer's receive, so it posts both in one ncclGroupStart/End
  // (as torch's batch_isend_irecv), which is what lets two ranks exchange in a ring or a pipeline
  // without each waiting on the other's send.
  virtual WorkPtr send_recv(const void* send_buf, int64_t send_count, int to, int send_tag, void* recv_buf,
                            int64_t recv_count, int from, int recv_tag, DType dtype);
  // True when send_recv() is one operation of this backend (NCCL), not a send and a receive.
  virtual bool send_recv_fused() const { return false; }
  // Many sends and receives as one operation, every pair posted before any completes (torch's
  // batch_isend_irecv; NCCL's ncclGroupStart/End around them): a grouped all-to-all in a process
  // group. Backends whose sends are buffered issue the sends, then the receives (this default).
  struct P2PPair {
    const void* send = nullptr;
    int64_t send_count = 0;
    int to = -1;
    void* recv = nullptr;
    int64_t recv_count = 0;
    int from = -1;
  };
  virtual WorkPtr group_send_recv(const std::vector<P2PPair>& pairs, int tag, DType dtype);
  // send_recv as one operation for the stepper too: a step of a ring where every rank sends to the
  // next and receives from the previous at once (context parallelism's K/V blocks). As a send then a
  // receive, each rank of a stepped ring would wait at its send for its peer, held at its own; the
  // threads backend fuses the two into one gated job, as NCCL's send_recv is (this default).
  virtual WorkPtr ring_send_recv(const void* send_buf, int64_t send_count, int to, int send_tag, void* recv_buf,
                                 int64_t recv_count, int from, int recv_tag, DType dtype) {
    return send_recv(send_buf, send_count, to, send_tag, recv_buf, recv_count, from, recv_tag, dtype);
  }

  // float32 conveniences
  WorkPtr all_reduce(float* buf, int64_t count, ReduceOp op = ReduceOp::Sum,
                     Algorithm algo = Algorithm::Default) {
    return all_reduce(buf, count, DType::F32, op, algo);
  }
};

class Device;
// One float reduced over `comm` (staged through a tensor on `dev`, where the communicator moves
// memory) and read back on the host: a flag (GradScaler's found-inf, Join's "not joined yet") or a
// sum (clipping's squared norm). A collective: every rank of `comm` calls it.
float all_reduce_value(Communicator& comm, float value, ReduceOp op, Device& dev);

}  // namespace dtlab
