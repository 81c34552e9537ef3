// The asynchronous half every backend shares: a Communicator whose calls check their arguments,
// become jobs on this rank's queue and return a Work at once, while one comm worker thread runs the
// jobs in issue order (a CUDA comm stream's semantics). A backend (threads_backend.cpp,
// socket_backend.cpp) only says how one job runs, in run_job(); the issue and completion events
// (CollectiveIssue, Collective) and the modeled clocks are kept here, the same for every backend.
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

#include "engine/comm/communicator.h"
#include "engine/trace/context.h"

namespace dtlab {

// What every rank must agree on for one collective. Point to point: `root` is the peer.
struct CollDesc {
  CollectiveOp op = CollectiveOp::AllReduce;
  Algorithm algo = Algorithm::Ring;
  ReduceOp reduce = ReduceOp::Sum;
  DType dtype = DType::F32;
  int64_t count = 0;  // the call's count argument
  int root = -1;
  // The protocol the tuning model (engine/trace/tuning.h) picked for this call's bytes, or the one
  // forced (--proto); Default when the rank has no cost model. NCCL's protocols change how bytes go
  // over the wire, not what a step computes: here it names the choice the views and trace show.
  Protocol proto = Protocol::Default;
  // All-to-all: true for all_to_all_v, whose count is what the rank sends in all (its input split
  // sizes summed); a plain all_to_all's count is one block, sent to each rank.
  bool split_sizes = false;
  bool operator==(const CollDesc&) const = default;
};
std::string describe(const CollDesc& d, uint64_t seq);  // "#5 allreduce of 1000 float32 (sum, ring)"
int64_t payload_bytes(const CollDesc& d, int world_size);  // S, nccl-tests convention
const char* dtype_word(DType d);                           // "float32", "int64"

// Algorithm used when a call says Algorithm::Default. `allreduce` Default: the tuning model's pick
// per call (--algo auto); `protocol` Default: its pick for the call's algorithm (--proto auto).
struct AlgorithmDefaults {
  Algorithm allreduce = collective_traits(CollectiveOp::AllReduce).default_algorithm;
  Algorithm broadcast = collective_traits(CollectiveOp::Broadcast).default_algorithm;
  Algorithm reduce = collective_traits(CollectiveOp::Reduce).default_algorithm;
  Protocol protocol = Protocol::Default;
  Algorithm alltoall = collective_traits(CollectiveOp::AllToAll).default_algorithm;
};

class AsyncWork;

// One queued operation, as the worker receives it.
struct CommJob {
  std::shared_ptr<AsyncWork> work;
  CollDesc desc;
  uint64_t seq = 0;        // collectives and point to point count separately
  bool p2p = false;
  int peer = -1, tag = 0;
  void* buf = nullptr;
  const void* in = nullptr;
  // A send fused with a receive (send_recv on a backend that runs them as one job): the send is
  // `in` to `peer`, the receive `buf` from `recv_peer`.
  bool fused = false;
  int recv_peer = -1, recv_tag = 0;
  int64_t recv_count = 0;
  // group_send_recv on a backend that posts them as one group (NCCL): every pair's send and receive.
  std::vector<Communicator::P2PPair> group;
  double issue_model = 0;  // compute lane's modeled clock at issue
  int32_t iteration = -1;  // compute lane's iteration at issue
};

class QueuedCommunicator : public Communicator {
 public:
  // `ctx` may be null (no events, no modeled clock).
  QueuedCommunicator(int rank, int world_size, RankContext* ctx, AlgorithmDefaults defaults);
  ~QueuedCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  uint64_t collectives_issued() const override { return next_seq_; }
  RankContext* trace_context() const override { return ctx_; }

  WorkPtr all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op, Algorithm algo) override;
  WorkPtr reduce_scatter(void* out, const void* in, int64_t count, DType dtype, ReduceOp op,
                         Algorithm algo) override;
  WorkPtr all_gather(void* out, const void* in, int64_t count, DType dtype, Algorithm algo) override;
  WorkPtr broadcast(void* buf, int64_t count, DType dtype, int root, Algorithm algo) override;
  WorkPtr reduce(void* buf, int64_t count, DType dtype, ReduceOp op, int root, Algorithm algo) override;
  WorkPtr barrier() override;
  WorkPtr send(const void* buf, int64_t count, DType dtype, int peer, int tag) override;
  WorkPtr recv(void* buf, int64_t count, DType dtype, int peer, int tag) override;
  WorkPtr all_to_all(void* out, const void* in, int64_t count_per_rank, DType dtype, Algorithm algo) override;
  Algorithm alltoall_default() const override { return defaults_.alltoall; }
  using Communicator::all_reduce;

 protected:
  // The derived constructor starts the worker once it is fully built; its destructor stops it
  // (joins) before its own members go away.
  void start_worker();
  void stop_worker();
  // Runs one job on the worker thread. A CommError is the diagnosis the job's Work reports; any
  // other exception is an internal failure.
  virtual WorkTimes run_job(CommJob& job) = 0;
  // Refuses a collective this backend cannot run (an algorithm it lacks, a topology that does not
  // fit): dtlab::Error, thrown at the call on every rank, before any data moves.
  virtual void check_runs(const CollDesc& d) const {}
  // After every job, on the worker: error empty on success; `internal` for non-CommError failures.
  virtual void after_job(const std::string& error, bool internal) {}
  // The comm lane's clock moves to `end` and the job becomes a Collective event.
  WorkTimes finish_job(const CommJob& j, int64_t wall_begin, double model_begin, double model_end);
  int64_t now_ns() const;
  RankContext* ctx() const { return ctx_; }
  // "#5 allreduce of ..." or "send #2 with rank 1".
  static std::string job_name(const CommJob& j);
  // For backends that override send_recv() with one job: queues a Send job carrying the receive.
  // `recv_tag`: the receive's (NCCL has no tags; the threads backend's mailboxes do).
  WorkPtr fused_send_recv(const void* send_buf, int64_t send_count, int to, int send_tag, void* recv_buf,
                          int64_t recv_count, int from, DType dt, int recv_tag = 0);
  // group_send_recv as one job (CommJob::group) for such a backend.
  WorkPtr grouped_send_recv(const std::vector<P2PPair>& pairs, int tag, DType dt);

 private:
  void check_rank(int r, const char* what) const;
  Algorithm resolve(CollectiveOp op, Algorithm a) const;
  void tune(CollDesc& d) const;  // auto algorithm and protocol: the tuning model's pick for d's bytes
  WorkPtr collective(CollDesc d, void* buf, const void* in);
  CommJob p2p_job(CollectiveOp op, int64_t count, DType dt, int peer, int tag);  // checked, numbered
  WorkPtr p2p(CollectiveOp op, void* buf, int64_t count, DType dt, int peer, int tag);
  WorkPtr enqueue(CommJob j);
  void fill_info(CollectiveInfo& info, const CommJob& j) const;
  // The stepper's gate before a job is queued (on the issuing thread): the operation it is, and
  // for a send/recv its message number on the (src, dst, tag) channel, which the other half counts
  // the same way. Throws CommError when the run was aborted at the gate.
  void gate(CommJob& j);
  uint64_t next_on_channel(int src, int dst, int tag);
  void loop();

  int rank_, world_size_;
  RankContext* ctx_;
  AlgorithmDefaults defaults_;
  uint64_t next_seq_ = 0, next_p2p_ = 0;  // touched only by the issuing (rank) thread
  std::map<std::tuple<int, int, int>, uint64_t> channel_;  // messages issued per (src, dst, tag), likewise
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CommJob> queue_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace dtlab
