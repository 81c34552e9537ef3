#include "engine/cuda/issue_events.h"

#include "engine/cuda/runtime.h"

namespace dtlab::cuda {

IssueEvents::~IssueEvents() {
  for (cudaEvent_t e : issued_) cudaEventDestroy(e);
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
}

void IssueEvents::record() {
  std::lock_guard<std::mutex> lock(mu_);
  cudaEvent_t e = nullptr;
  if (spare_.empty()) {
    DTLAB_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  } else {
    e = spare_.back();
    spare_.pop_back();
  }
  DTLAB_CUDA_CHECK(cudaEventRecord(e, compute_));
  issued_.push_back(e);
}

void IssueEvents::forget_last() {
  std::lock_guard<std::mutex> lock(mu_);
  spare_.push_back(issued_.back());
  issued_.pop_back();
}

cudaEvent_t IssueEvents::take() {
  std::lock_guard<std::mutex> lock(mu_);
  if (issued_.empty()) return nullptr;
  cudaEvent_t e = issued_.front();
  issued_.pop_front();
  return e;
}

void IssueEvents::recycle(cudaEvent_t e) {
  // Re-recording it later is safe: a stream wait captures the event's state when it is enqueued.
  std::lock_guard<std::mutex> lock(mu_);
  spare_.push_back(e);
}

template <class F>
WorkPtr IssueRecordingComm::issue(F call) {
  // Event and job enter their queues together: a rank's process-group executor may issue on this
  // communicator while the rank's own thread does.
  std::lock_guard<std::mutex> lock(issue_mu_);
  events_.record();
  try {
    return call();
  } catch (...) {
    events_.forget_last();  // nothing was queued: no job will take this event
    throw;
  }
}

WorkPtr IssueRecordingComm::all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, Algorithm algo) {
  return issue([&] { return inner_.all_reduce(buf, count, dt, op, algo); });
}
WorkPtr IssueRecordingComm::reduce_scatter(void* out, const void* in, int64_t count, DType dt, ReduceOp op, Algorithm algo) {
  return issue([&] { return inner_.reduce_scatter(out, in, count, dt, op, algo); });
}
WorkPtr IssueRecordingComm::all_gather(void* out, const void* in, int64_t count, DType dt, Algorithm algo) {
  return issue([&] { return inner_.all_gather(out, in, count, dt, algo); });
}
WorkPtr IssueRecordingComm::broadcast(void* buf, int64_t count, DType dt, int root, Algorithm algo) {
  return issue([&] { return inner_.broadcast(buf, count, dt, root, algo); });
}
WorkPtr IssueRecordingComm::reduce(void* buf, int64_t count, DType dt, ReduceOp op, int root, Algorithm algo) {
  return issue([&] { return inner_.reduce(buf, count, dt, op, root, algo); });
}
WorkPtr IssueRecordingComm::barrier() {
  return issue([&] { return inner_.barrier(); });
}
WorkPtr IssueRecordingComm::send(const void* buf, int64_t count, DType dt, int peer, int tag) {
  return issue([&] { return inner_.send(buf, count, dt, peer, tag); });
}
WorkPtr IssueRecordingComm::recv(void* buf, int64_t count, DType dt, int peer, int tag) {
  return issue([&] { return inner_.recv(buf, count, dt, peer, tag); });
}
WorkPtr IssueRecordingComm::send_recv(const void* send_buf, int64_t send_count, int to, int send_tag, void* recv_buf,
                                      int64_t recv_count, int from, int recv_tag, DType dt) {
  if (!inner_.send_recv_fused())
    return Communicator::send_recv(send_buf, send_count, to, send_tag, recv_buf, recv_count, from, recv_tag, dt);
  return issue([&] {
    return inner_.send_recv(send_buf, send_count, to, send_tag, recv_buf, recv_count, from, recv_tag, dt);
  });
}
WorkPtr IssueRecordingComm::all_to_all(void* out, const void* in, int64_t count, DType dt, Algorithm algo) {
  return issue([&] { return inner_.all_to_all(out, in, count, dt, algo); });
}
WorkPtr IssueRecordingComm::ring_send_recv(const void* send_buf, int64_t send_count, int to, int send_tag, void* recv_buf,
                                           int64_t recv_count, int from, int recv_tag, DType dt) {
  return issue([&] {
    return inner_.ring_send_recv(send_buf, send_count, to, send_tag, recv_buf, recv_count, from, recv_tag, dt);
  });
}
WorkPtr IssueRecordingComm::group_send_recv(const std::vector<P2PPair>& pairs, int tag, DType dt) {
  if (!inner_.send_recv_fused()) return Communicator::group_send_recv(pairs, tag, dt);
  return issue([&] { return inner_.group_send_recv(pairs, tag, dt); });
}

}  // namespace dtlab::cuda
