#include "engine/comm/queued_comm.h"

#include <algorithm>
#include <chrono>

#include "engine/core/format.h"
#include "engine/trace/tuning.h"

namespace dtlab {

const char* dtype_word(DType d) {
  switch (d) {
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    case DType::F64: return "float64";
    default: return "int64";
  }
}

std::string describe(const CollDesc& d, uint64_t seq) {
  std::string s = "#" + std::to_string(seq) + " " + collective_name(d.op);
  if (d.op == CollectiveOp::Barrier) return s;
  s += " of " + std::to_string(d.count) + " " + dtype_word(d.dtype);
  if (d.op == CollectiveOp::AllToAll) s += d.split_sizes ? " in all" : " to each rank";  // the count's meaning differs
  s += " (";
  if (collective_traits(d.op).reduces) s += std::string(reduce_op_name(d.reduce)) + ", ";
  if (d.root >= 0) s += "root " + std::to_string(d.root) + ", ";
  return s + algorithm_name(d.algo) + ")";
}

int64_t payload_bytes(const CollDesc& d, int n) {
  return collective_traits(d.op).payload_count(d.count, n) * dtype_size(d.dtype);
}

// A Work the comm worker completes; wait() also moves the compute lane's clock past the op.
class AsyncWork : public Work {
 public:
  // p2p: a send or receive of the rank's own program, whose wait may be for a peer held at a gate.
  // peers: those ranks (bits; 0 for a collective).
  AsyncWork(uint64_t seq, RankContext* ctx, std::string what, bool p2p = false, uint64_t peers = 0)
      : seq_(seq), ctx_(ctx), what_(std::move(what)), p2p_(p2p), peers_(peers) {}
  bool is_completed() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!done_ && ctx_) {
      lock.unlock();
      ctx_->set_activity("waiting for " + what_);  // what the watchdog reports of this thread
      ctx_->before_wait();  // a paused GPU rank shows the compute that already ran
      lock.lock();
      // A send/recv still waiting after 100 ms waits for a peer that does not move: the stepper may
      // then settle without this lane (Stepper::p2p_wait). Data on its way arrives well before.
      if (p2p_ && !cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return done_; })) {
        flagged_ = true;
        lock.unlock();
        ctx_->p2p_wait(true, peers_);
        lock.lock();
      }
    }
    cv_.wait(lock, [&] { return done_; });  // the backend bounds every job by its timeout
    const bool unflag = flagged_;
    flagged_ = false;
    lock.unlock();
    if (unflag) ctx_->p2p_wait(false, peers_);
    if (!error_.empty()) throw CommError(error_);
    if (ctx_) {
      ctx_->advance_compute_clock(times_.model_end);  // the compute lane waited for the comm lane
      ctx_->set_activity("running (after " + what_ + ")");
    }
  }
  uint64_t seq() const override { return seq_; }
  WorkTimes times() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return times_;
  }
  void finish(const WorkTimes& t, std::string error = {}) {
    std::unique_lock<std::mutex> lock(mu_);
    if (flagged_) {  // the waiting lane moves again before the comm lane reports the work done
      lock.unlock();
      ctx_->p2p_wait(false, peers_);
      lock.lock();
    }
    times_ = t;
    error_ = std::move(error);
    done_ = true;
    cv_.notify_all();
  }

 private:
  uint64_t seq_;
  RankContext* ctx_;
  std::string what_;
  bool p2p_ = false;
  uint64_t peers_ = 0;
  bool flagged_ = false;  // its waiter told the stepper it waits for a peer
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  WorkTimes times_;
  std::string error_;
};

QueuedCommunicator::QueuedCommunicator(int rank, int world_size, RankContext* ctx, AlgorithmDefaults defaults)
    : rank_(rank), world_size_(world_size), ctx_(ctx), defaults_(defaults) {}

QueuedCommunicator::~QueuedCommunicator() { stop_worker(); }

void QueuedCommunicator::start_worker() { worker_ = std::thread([this] { loop(); }); }

void QueuedCommunicator::stop_worker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

int64_t QueuedCommunicator::now_ns() const {
  return ctx_ && ctx_->recorder() ? ctx_->recorder()->now_ns() : 0;
}

std::string QueuedCommunicator::job_name(const CommJob& j) {
  if (!j.p2p) return describe(j.desc, j.seq);
  if (j.fused)
    return "send #" + std::to_string(j.seq) + " to rank " + std::to_string(j.peer) + " with recv from rank " +
           std::to_string(j.recv_peer);
  return std::string(collective_name(j.desc.op)) + " #" + std::to_string(j.seq) + " with rank " + std::to_string(j.peer);
}

WorkPtr QueuedCommunicator::all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, Algorithm algo) {
  return collective({CollectiveOp::AllReduce, resolve(CollectiveOp::AllReduce, algo), op, dt, count, -1}, buf, buf);
}
WorkPtr QueuedCommunicator::reduce_scatter(void* out, const void* in, int64_t count, DType dt, ReduceOp op, Algorithm algo) {
  return collective({CollectiveOp::ReduceScatter, resolve(CollectiveOp::ReduceScatter, algo), op, dt, count, -1}, out, in);
}
WorkPtr QueuedCommunicator::all_gather(void* out, const void* in, int64_t count, DType dt, Algorithm algo) {
  return collective({CollectiveOp::AllGather, resolve(CollectiveOp::AllGather, algo), ReduceOp::Sum, dt, count, -1}, out, in);
}
WorkPtr QueuedCommunicator::broadcast(void* buf, int64_t count, DType dt, int root, Algorithm algo) {
  check_rank(root, "broadcast root");
  return collective({CollectiveOp::Broadcast, resolve(CollectiveOp::Broadcast, algo), ReduceOp::Sum, dt, count, root}, buf, buf);
}
WorkPtr QueuedCommunicator::reduce(void* buf, int64_t count, DType dt, ReduceOp op, int root, Algorithm algo) {
  check_rank(root, "reduce root");
  return collective({CollectiveOp::Reduce, resolve(CollectiveOp::Reduce, algo), op, dt, count, root}, buf, buf);
}
WorkPtr QueuedCommunicator::barrier() {
  return collective({CollectiveOp::Barrier, Algorithm::Ring, ReduceOp::Sum, DType::F32, 0, -1}, nullptr, nullptr);
}
WorkPtr QueuedCommunicator::all_to_all(void* out, const void* in, int64_t count, DType dt, Algorithm algo) {
  return collective({CollectiveOp::AllToAll, resolve(CollectiveOp::AllToAll, algo), ReduceOp::Sum, dt, count, -1}, out, in);
}
WorkPtr QueuedCommunicator::send(const void* buf, int64_t count, DType dt, int peer, int tag) {
  return p2p(CollectiveOp::Send, const_cast<void*>(buf), count, dt, peer, tag);
}
WorkPtr QueuedCommunicator::recv(void* buf, int64_t count, DType dt, int peer, int tag) {
  return p2p(CollectiveOp::Recv, buf, count, dt, peer, tag);
}

void QueuedCommunicator::check_rank(int r, const char* what) const {
  if (r < 0 || r >= world_size_)
    throw Error(std::string(what) + " " + std::to_string(r) + " is out of range for world size " +
                std::to_string(world_size_));
}

Algorithm QueuedCommunicator::resolve(CollectiveOp op, Algorithm a) const {
  if (a == Algorithm::Default) {
    if (op == CollectiveOp::AllReduce) a = defaults_.allreduce;  // Default again: auto, tune() picks
    else if (op == CollectiveOp::Broadcast) a = defaults_.broadcast;
    else if (op == CollectiveOp::Reduce) a = defaults_.reduce;
    else if (op == CollectiveOp::AllToAll) a = defaults_.alltoall;
    else a = collective_traits(op).default_algorithm;
  }
  check_algorithm(op, a);
  return a;
}

WorkPtr QueuedCommunicator::collective(CollDesc d, void* buf, const void* in) {
  if (d.count < 0) throw Error("a collective's count cannot be negative");
  if (d.dtype != DType::F32 && d.reduce == ReduceOp::Avg)
    throw Error(std::string("avg is defined for float32 only; reduce ") + dtype_word(d.dtype) + " with sum or max");
  tune(d);
  check_runs(d);
  CommJob j;
  j.desc = d;
  j.seq = next_seq_++;
  j.buf = buf;
  j.in = in;
  return enqueue(std::move(j));
}

void QueuedCommunicator::tune(CollDesc& d) const {
  const CostModel* cost = ctx_ ? ctx_->cost() : nullptr;
  if (!cost) {  // nothing to predict with: the table's algorithm, the protocol as forced
    if (d.algo == Algorithm::Default) d.algo = collective_traits(d.op).default_algorithm;
    d.proto = defaults_.protocol;
    return;
  }
  // Every rank predicts the same from the same profile, world and bytes, so they agree.
  const Prediction p = select(cost->profile(), world_size_, d.op, static_cast<double>(payload_bytes(d, world_size_)),
                              d.algo, defaults_.protocol);
  d.algo = p.algo;
  d.proto = p.proto;
}

CommJob QueuedCommunicator::p2p_job(CollectiveOp op, int64_t count, DType dt, int peer, int tag) {
  check_rank(peer, op == CollectiveOp::Send ? "send peer" : "recv peer");
  if (count < 0) throw Error("a send or recv count cannot be negative");
  if (peer == rank_) throw Error("rank " + std::to_string(rank_) + " cannot send to or receive from itself");
  CommJob j;
  j.p2p = true;
  j.desc = {op, Algorithm::Naive, ReduceOp::Sum, dt, count, peer};
  j.seq = next_p2p_++;
  j.peer = peer;
  j.tag = tag;
  return j;
}

WorkPtr QueuedCommunicator::p2p(CollectiveOp op, void* buf, int64_t count, DType dt, int peer, int tag) {
  CommJob j = p2p_job(op, count, dt, peer, tag);
  j.buf = buf;
  return enqueue(std::move(j));
}

WorkPtr QueuedCommunicator::fused_send_recv(const void* send_buf, int64_t send_count, int to, int send_tag,
                                            void* recv_buf, int64_t recv_count, int from, DType dt, int recv_tag) {
  check_rank(from, "recv peer");
  if (recv_count < 0) throw Error("a send or recv count cannot be negative");
  if (from == rank_) throw Error("rank " + std::to_string(rank_) + " cannot send to or receive from itself");
  CommJob j = p2p_job(CollectiveOp::Send, send_count, dt, to, send_tag);
  j.fused = true;
  j.in = send_buf;
  j.buf = recv_buf;
  j.recv_peer = from;
  j.recv_count = recv_count;
  j.recv_tag = recv_tag;
  return enqueue(std::move(j));
}

WorkPtr QueuedCommunicator::grouped_send_recv(const std::vector<P2PPair>& pairs, int tag, DType dt) {
  DTLAB_CHECK(!pairs.empty(), "grouped_send_recv needs at least one pair");
  for (const P2PPair& p : pairs) {
    check_rank(p.to, "send peer");
    check_rank(p.from, "recv peer");
    if (p.from == rank_ || p.to == rank_) throw Error("rank " + std::to_string(rank_) + " cannot send to or receive from itself");
    if (p.send_count < 0 || p.recv_count < 0) throw Error("a send or recv count cannot be negative");
  }
  CommJob j = p2p_job(CollectiveOp::Send, pairs.front().send_count, dt, pairs.front().to, tag);
  j.fused = true;
  j.in = pairs.front().send;
  j.buf = pairs.front().recv;
  j.recv_peer = pairs.front().from;
  j.recv_count = pairs.front().recv_count;
  j.recv_tag = tag;
  j.group = pairs;
  return enqueue(std::move(j));
}

uint64_t QueuedCommunicator::next_on_channel(int src, int dst, int tag) { return channel_[{src, dst, tag}]++; }

void QueuedCommunicator::gate(CommJob& j) {
  // A process group's own transfers (its ring steps) pass: the group gates its operation and steps.
  if (!ctx_ || !ctx_->stepper() || (j.p2p && (j.tag & kGroupStepTag))) return;
  // A user's tag is part of what the stepper shows; the engine's own (the pipeline's, from 2^24 on)
  // say nothing to a reader, who sees the ranks and the bytes.
  auto tag_text = [](int tag) { return tag != 0 && tag < (1 << 24) ? ", tag " + std::to_string(tag) : std::string(); };
  auto pair_ref = [&](int src, int dst) {
    OpRef r;
    r.p2p = true;
    r.src = static_cast<int16_t>(src);
    r.dst = static_cast<int16_t>(dst);
    r.tag = j.tag;
    r.seq = static_cast<int64_t>(next_on_channel(src, dst, j.tag));
    r.members = (uint64_t{1} << src) | (uint64_t{1} << dst);
    return r;
  };
  OpRef op, op2;
  std::string label;
  const int64_t bytes = j.desc.count * dtype_size(j.desc.dtype);
  if (!j.p2p) {
    op.group = 0;
    op.seq = static_cast<int64_t>(j.seq);
    op.members = world_size_ >= 64 ? ~uint64_t{0} : (uint64_t{1} << world_size_) - 1;
    label = "world " + describe(j.desc, j.seq);
  } else if (j.desc.op == CollectiveOp::Send) {
    op = pair_ref(rank_, j.peer);
    label = "send " + std::to_string(rank_) + "->" + std::to_string(j.peer) + " (" + human_bytes(bytes) + tag_text(j.tag) + ")";
    if (j.fused) {
      op2 = pair_ref(j.recv_peer, rank_);
      label += " with recv " + std::to_string(j.recv_peer) + "->" + std::to_string(rank_);
    }
  } else {
    op = pair_ref(j.peer, rank_);
    label = "recv " + std::to_string(j.peer) + "->" + std::to_string(rank_) + " (" + human_bytes(bytes) + tag_text(j.tag) + ")";
  }
  const int64_t payload = j.p2p ? bytes : payload_bytes(j.desc, world_size_);
  if (!ctx_->gate_op(op, j.desc.op, payload, label, j.fused ? &op2 : nullptr))
    throw CommError("rank " + std::to_string(rank_) + " stopped before " + label + ": the run was aborted");
}

WorkPtr QueuedCommunicator::enqueue(CommJob j) {
  j.issue_model = ctx_ ? ctx_->compute_clock() : 0;
  j.iteration = ctx_ ? ctx_->iteration() : -1;
  // A process group's ring step is part of the group's collective, not a send/recv of the program.
  const bool own_p2p = j.p2p && !(j.tag & kGroupStepTag);
  uint64_t peers = 0;
  for (int q : {j.peer, j.fused ? j.recv_peer : -1})
    if (own_p2p && q >= 0 && q < 64) peers |= uint64_t{1} << q;
  j.work = std::make_shared<AsyncWork>(j.seq, ctx_, job_name(j), own_p2p, peers);
  // The call is the issue; a stepped run then holds the rank at the operation's gate until every
  // member has called it too.
  if (!j.p2p && ctx_) {
    const int64_t now = now_ns();
    Event e(EventKind::CollectiveIssue, Lane::Compute, now, now, j.issue_model, j.issue_model);
    fill_info(e.coll, j);
    ctx_->record(e);
  }
  gate(j);
  WorkPtr w = j.work;
  // Before the compute lane can reach its next gate.
  if (ctx_) ctx_->lane_work(kCommLane, +1, own_p2p);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(j));
  }
  cv_.notify_one();
  return w;
}

void QueuedCommunicator::fill_info(CollectiveInfo& info, const CommJob& j) const {
  const int n = world_size_;
  info.op = j.desc.op;
  info.algo = j.desc.algo;
  info.proto = j.desc.proto;
  info.reduce = j.desc.reduce;
  info.dtype = j.desc.dtype;
  info.root = static_cast<int16_t>(j.desc.root);
  info.group_size = static_cast<int16_t>(j.p2p ? 2 : n);
  info.seq = j.seq;
  int64_t c = j.desc.count;
  info.in_count = collective_traits(j.desc.op).in_count(c, n);
  info.out_count = collective_traits(j.desc.op).out_count(c, n);
  info.bytes = payload_bytes(j.desc, j.p2p ? 1 : n);
  info.kept_count = j.desc.op == CollectiveOp::AllToAll ? c : 0;  // its own block, copied locally
}

WorkTimes QueuedCommunicator::finish_job(const CommJob& j, int64_t wall0, double begin, double end) {
  WorkTimes t{wall0, now_ns(), begin, end};
  if (!ctx_) return t;
  ctx_->set_comm_clock(end);
  if (j.p2p && (j.tag & kGroupStepTag)) return t;  // a process group's ring step: the group records it
  Event e(EventKind::Collective, Lane::Comm, t.wall_begin_ns, t.wall_end_ns, begin, end);
  e.iteration = j.iteration;
  fill_info(e.coll, j);
  ctx_->record(e);
  return t;
}

void QueuedCommunicator::loop() {
  while (true) {
    CommJob j;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      j = std::move(queue_.front());
      queue_.pop_front();
    }
    WorkTimes times;
    std::string err;
    bool internal = false;
    try {
      times = run_job(j);
    } catch (const CommError& e) {
      err = e.what();
    } catch (const std::exception& e) {
      err = "rank " + std::to_string(rank_) + ": " + e.what();
      internal = true;
    }
    after_job(err, internal);
    const bool own_p2p = j.p2p && !(j.tag & kGroupStepTag);
    j.work->finish(times, err);
    if (ctx_) ctx_->lane_work(kCommLane, -1, own_p2p);
  }
}

}  // namespace dtlab
