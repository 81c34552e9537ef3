// Stream order for an asynchronous communicator on a GPU. A collective must read its buffer only
// after the compute that produced it, yet must not wait for compute enqueued after the call (that
// is the overlap). So each call records an event on the rank's compute stream when it is issued,
// and the comm worker takes the events in issue order, one per job: the cuda backend waits for it
// on the host (its steps read peers' memory), the nccl backend makes its comm stream wait for it.
#pragma once
#include <cuda_runtime.h>

#include <deque>
#include <mutex>
#include <vector>

#include "engine/comm/communicator.h"

namespace dtlab::cuda {

class IssueEvents {
 public:
  explicit IssueEvents(cudaStream_t compute) : compute_(compute) {}
  ~IssueEvents();
  IssueEvents(const IssueEvents&) = delete;
  IssueEvents& operator=(const IssueEvents&) = delete;

  void record();       // the rank's thread, when a call is issued
  void forget_last();  // the call threw before it queued a job
  // The comm worker, at the start of each job: that job's event (null when the call bypassed the
  // recording communicator). Hand it back with recycle() once waited for or waited on.
  cudaEvent_t take();
  void recycle(cudaEvent_t e);

 private:
  cudaStream_t compute_;
  std::mutex mu_;
  std::deque<cudaEvent_t> issued_;
  std::vector<cudaEvent_t> spare_;
};

// A Communicator that records the issue event of every call, then forwards it to `inner`.
class IssueRecordingComm : public Communicator {
 public:
  IssueRecordingComm(Communicator& inner, IssueEvents& events, const char* backend)
      : inner_(inner), events_(events), backend_(backend) {}
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  const char* backend_name() const override { return backend_; }
  uint64_t collectives_issued() const override { return inner_.collectives_issued(); }

  WorkPtr all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, Algorithm algo) override;
  WorkPtr reduce_scatter(void* out, const void* in, int64_t count, DType dt, ReduceOp op, Algorithm algo) override;
  WorkPtr all_gather(void* out, const void* in, int64_t count, DType dt, Algorithm algo) override;
  WorkPtr broadcast(void* buf, int64_t count, DType dt, int root, Algorithm algo) override;
  WorkPtr reduce(void* buf, int64_t count, DType dt, ReduceOp op, int root, Algorithm algo) override;
  WorkPtr barrier() override;
  WorkPtr send(const void* buf, int64_t count, DType dt, int peer, int tag) override;
  WorkPtr recv(void* buf, int64_t count, DType dt, int peer, int tag) override;
  WorkPtr all_to_all(void* out, const void* in, int64_t count, DType dt, Algorithm algo) override;
  Algorithm alltoall_default() const override { return inner_.alltoall_default(); }
  // One event when the inner backend runs it as one job (NCCL); else a send and a receive, an event each.
  WorkPtr send_recv(const void* send_buf, int64_t send_count, int to, int send_tag, void* recv_buf, int64_t recv_count,
                    int from, int recv_tag, DType dt) override;
  bool send_recv_fused() const override { return inner_.send_recv_fused(); }
  // The inner backend's one gated job (the threads backend's fused ring step), one event.
  WorkPtr ring_send_recv(const void* send_buf, int64_t send_count, int to, int send_tag, void* recv_buf, int64_t recv_count,
                         int from, int recv_tag, DType dt) override;
  // One event when the inner backend posts them as one group (NCCL); else its sends and receives.
  WorkPtr group_send_recv(const std::vector<P2PPair>& pairs, int tag, DType dt) override;
  using Communicator::all_reduce;

 private:
  template <class F>
  WorkPtr issue(F call);
  Communicator& inner_;
  IssueEvents& events_;
  const char* backend_;
  std::mutex issue_mu_;
};

}  // namespace dtlab::cuda
