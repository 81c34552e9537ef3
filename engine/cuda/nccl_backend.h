// The nccl backend: one rank per GPU, collectives by NCCL (all-reduce, reduce-scatter, all-gather,
// broadcast, reduce, send/recv; all-to-all as grouped sends and receives). NCCL runs its own
// algorithms inside one kernel, so the lab steps it one collective at a time: a stepper gate before
// each collective (not inside it), a Collective event per call timed on the host around the kernel,
// and no RingStep events. The watchdog works here too: the comm worker polls its stream and
// ncclCommGetAsyncError against the timeout, and on expiry calls ncclCommAbort with a diagnosis (the
// world's other ranks stop with the same sentence). NCCL ignores the `algo` argument (the modeled
// clock still uses it) and point-to-point tags (messages between two ranks match in issue order);
// a send completes when the peer receives, as with torch's NCCL backend.
//
// Two ways in, as in docs/course_sources.md §6: NcclWorld, one process driving several GPUs
// (ncclCommInitAll; ranks are threads, like the other worlds), and NcclProcess, one process per rank
// on any node (ncclGetUniqueId on rank 0, sent over the socket backend's TCP rendezvous at
// MASTER_ADDR:MASTER_PORT, then ncclCommInitRank).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "engine/comm/socket_backend.h"   // SocketOptions: rank, world, MASTER_ADDR/PORT, timeout
#include "engine/comm/threads_backend.h"  // WorldOptions
#include "engine/cuda/rank_device.h"

namespace dtlab {

std::string nccl_version();  // "2.28.9", the library's own

class NcclWorld {
 public:
  // Rank r runs on device r. dtlab::Error when the machine has fewer GPUs than ranks (NCCL up to
  // 2.29 refuses two ranks on one GPU: the cuda backend is the one-GPU world).
  NcclWorld(int world_size, WorldOptions options = {});
  ~NcclWorld();
  NcclWorld(const NcclWorld&) = delete;
  NcclWorld& operator=(const NcclWorld&) = delete;

  int world_size() const;
  Communicator& comm(int rank);  // backend_name() "nccl"; buffers are device pointers
  RankContext& context(int rank);
  MemoryTracker& memory(int rank);
  cuda::RankDevice& device(int rank);
  TraceRecorder& recorder();
  Stepper& stepper();
  ThreadsWorld& world();  // ranks, contexts, status() for the lab
  void abort(const std::string& reason);  // every rank's NCCL communicator is aborted

  // Runs fn on one thread per rank (bound to its device); rethrows the first failure, the watchdog's
  // diagnosis (CommError) first.
  void run(const std::function<void(int rank, Communicator& comm, RankContext& ctx, cuda::RankDevice& dev)>& fn);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

class NcclProcess {
 public:
  // Joins the world (TCP rendezvous, then ncclCommInitRank on `device`'s GPU, ordered after its
  // compute stream). `device` must outlive this. `ctx` may be null; its stepper, if any, gates each
  // collective. `timeout_s` bounds the rendezvous and every collective.
  NcclProcess(const SocketOptions& opt, const cuda::RankDevice& device, RankContext* ctx);
  ~NcclProcess();
  NcclProcess(const NcclProcess&) = delete;
  NcclProcess& operator=(const NcclProcess&) = delete;

  Communicator& comm();
  const cuda::RankDevice& device();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtlab
