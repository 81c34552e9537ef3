// The Communicator's default methods (send_recv as a send and a receive, group_send_recv as sends
// then receives), and all_reduce_value.
#include "engine/comm/communicator.h"

#include "engine/core/device.h"

#include <algorithm>

namespace dtlab {

namespace {

// The Work of many (a send_recv's two halves, a group_send_recv's pairs): done when every one is,
// its span theirs together, its sequence number the last one's.
class ManyWork : public Work {
 public:
  explicit ManyWork(std::vector<WorkPtr> all) : all_(std::move(all)) {}
  bool is_completed() const override {
    for (const WorkPtr& w : all_)
      if (!w->is_completed()) return false;
    return true;
  }
  void wait() override {
    for (const WorkPtr& w : all_) w->wait();
  }
  uint64_t seq() const override { return all_.empty() ? 0 : all_.back()->seq(); }
  WorkTimes times() const override {
    WorkTimes t{};
    for (size_t i = 0; i < all_.size(); i++) {
      const WorkTimes w = all_[i]->times();
      if (i == 0) {
        t = w;
        continue;
      }
      t.wall_begin_ns = std::min(t.wall_begin_ns, w.wall_begin_ns);
      t.wall_end_ns = std::max(t.wall_end_ns, w.wall_end_ns);
      t.model_begin = std::min(t.model_begin, w.model_begin);
      t.model_end = std::max(t.model_end, w.model_end);
    }
    return t;
  }

 private:
  std::vector<WorkPtr> all_;
};

}  // namespace

WorkPtr Communicator::group_send_recv(const std::vector<P2PPair>& pairs, int tag, DType dtype) {
  std::vector<WorkPtr> all;
  for (const P2PPair& p : pairs) all.push_back(send(p.send, p.send_count, dtype, p.to, tag));
  for (const P2PPair& p : pairs) all.push_back(recv(p.recv, p.recv_count, dtype, p.from, tag));
  return std::make_shared<ManyWork>(std::move(all));
}

WorkPtr Communicator::send_recv(const void* send_buf, int64_t send_count, int to, int send_tag, void* recv_buf,
                                int64_t recv_count, int from, int recv_tag, DType dtype) {
  WorkPtr s = send(send_buf, send_count, dtype, to, send_tag);
  WorkPtr r = recv(recv_buf, recv_count, dtype, from, recv_tag);
  return std::make_shared<ManyWork>(std::vector<WorkPtr>{std::move(s), std::move(r)});  // the receive's seq
}

WorkPtr Communicator::all_to_all_v(void*, const std::vector<int64_t>&, const void*, const std::vector<int64_t>&, DType, Algorithm) {
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
