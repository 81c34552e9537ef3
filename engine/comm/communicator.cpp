// The Communicator's one default method (send_recv as a send and a receive), and all_reduce_value.
#include "engine/comm/communicator.h"

#include "engine/core/device.h"

#include <algorithm>

namespace dtlab {

namespace {

// Both halves of a send_recv: complete when both are, the receive's sequence number and times.
class PairWork final : public Work {
 public:
  PairWork(WorkPtr send, WorkPtr recv) : send_(std::move(send)), recv_(std::move(recv)) {}
  bool is_completed() const override { return send_->is_completed() && recv_->is_completed(); }
  void wait() override {
    send_->wait();
    recv_->wait();
  }
  uint64_t seq() const override { return recv_->seq(); }
  WorkTimes times() const override {
    WorkTimes s = send_->times(), r = recv_->times();
    r.wall_begin_ns = std::min(s.wall_begin_ns, r.wall_begin_ns);
    r.wall_end_ns = std::max(s.wall_end_ns, r.wall_end_ns);
    r.model_begin = std::min(s.model_begin, r.model_begin);
    r.model_end = std::max(s.model_end, r.model_end);
    return r;
  }

 private:
  WorkPtr send_, recv_;
};

}  // namespace

WorkPtr Communicator::send_recv(const void* send_buf, int64_t send_count, int to, int send_tag, void* recv_buf,
                                int64_t recv_count, int from, int recv_tag, DType dtype) {
  WorkPtr s = send(send_buf, send_count, dtype, to, send_tag);
  WorkPtr r = recv(recv_buf, recv_count, dtype, from, recv_tag);
  return std::make_shared<PairWork>(std::move(s), std::move(r));
}

WorkPtr Communicator::all_to_all_v(void*, const std::vector<int64_t>&, const void*, const std::vector<int64_t>&, DType) {
  throw Error(std::string("all_to_all_v with split sizes runs in a process group; the ") + backend_name() +
              " world communicator has none: make one with new_group over every rank");
}

float all_reduce_value(Communicator& comm, float value, ReduceOp op, Device& dev) {
  Tensor t({1}, MemCategory::Other, nullptr, DType::F32, dev);
  dev.upload(t.f32(), &value, sizeof value);
  comm.all_reduce(t.f32(), 1, op)->wait();
  float out = 0;
  dev.download(&out, t.f32(), sizeof out);
  return out;
}

}  // namespace dtlab
