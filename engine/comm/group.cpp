#include "engine/comm/group.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <string>

#include "engine/comm/queued_comm.h"  // CollDesc, payload_bytes
#include "engine/comm/reduce_kernels.h"  // the threads backend's 16-bit sums
#include "engine/comm/ring_order.h"
#include "engine/core/arith.h"
#include "engine/core/check.h"
#include "engine/core/tensor.h"
#include "engine/trace/context.h"

namespace dtlab {

struct GroupExecutor::Task : Work {
  uint64_t seq_ = 0;
  std::function<WorkTimes()> fn;
  RankContext* ctx = nullptr;
  mutable std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  WorkTimes t;

  bool is_completed() const override {
    std::lock_guard<std::mutex> lock(mu);
    return done;
  }
  void wait() override {
    std::unique_lock<std::mutex> lock(mu);
    // Bounded: the task's every receive is under the parent's watchdog, so it ends or fails.
    cv.wait(lock, [&] { return done; });
    if (error) std::rethrow_exception(error);
    lock.unlock();
    if (ctx) ctx->advance_compute_clock(t.model_end);  // the compute lane waited for the group's op
  }
  uint64_t seq() const override { return seq_; }
  WorkTimes times() const override {
    std::lock_guard<std::mutex> lock(mu);
    return t;
  }
};

GroupExecutor::GroupExecutor() : thread_([this] { loop(); }) {}

GroupExecutor::~GroupExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

WorkPtr GroupExecutor::submit(uint64_t seq, std::function<WorkTimes()> fn, RankContext* ctx) {
  auto task = std::make_shared<Task>();
  task->seq_ = seq;
  task->fn = std::move(fn);
  task->ctx = ctx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(task);
  }
  cv_.notify_all();
  return task;
}

void GroupExecutor::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void GroupExecutor::loop() {
  for (;;) {
    std::shared_ptr<Task> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    std::exception_ptr error;
    WorkTimes times;
    try {
      times = task->fn();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(task->mu);
      task->t = times;
      task->done = true;
      task->error = error;
      task->fn = nullptr;
    }
    task->cv.notify_all();
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
    idle_cv_.notify_all();
  }
}

namespace {

// `p` advanced by `elems` elements of `dt`.
void* elems_at(void* p, int64_t elems, DType dt) { return static_cast<char*>(p) + elems * dtype_size(dt); }
const void* elems_at(const void* p, int64_t elems, DType dt) { return static_cast<const char*>(p) + elems * dtype_size(dt); }

// What a group records of the operation its executor runs (one at a time): the Collective span
// covers the steps, each step's span is its transfer's on the modeled clock.
struct OpTrace {
  CollectiveInfo info{};
  int32_t iteration = -1;
  int steps = 0, next_step = 0;
  bool stepped = false;
  WorkTimes span;
};

class GroupComm : public Communicator {
 public:
  GroupComm(Communicator& parent, std::vector<int> ranks, int tag, std::shared_ptr<GroupExecutor> ex, Device& dev,
            std::string name)
      : parent_(parent), ranks_(std::move(ranks)), tag_(tag), ex_(std::move(ex)), dev_(dev),
        ctx_(parent.trace_context()) {
    DTLAB_CHECK(ex_ != nullptr, "new_group needs a GroupExecutor");
    DTLAB_CHECK(!ranks_.empty(), "a process group needs at least one rank");
    DTLAB_CHECK(tag_ >= 0 && tag_ < kGroupStepTag, "a process group's tag must be in [0, 2^30)");
    std::vector<int> sorted = ranks_;
    std::sort(sorted.begin(), sorted.end());
    DTLAB_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
                "a process group lists a rank twice; give each rank once");
    for (int r : ranks_)
      DTLAB_CHECK(r >= 0 && r < parent.world_size(), "process group rank " + std::to_string(r) +
                                                           " is outside the world of " + std::to_string(parent.world_size()));
    auto it = std::find(ranks_.begin(), ranks_.end(), parent.rank());
    DTLAB_CHECK(it != ranks_.end(), "rank " + std::to_string(parent.rank()) + " created a process group it is not in");
    me_ = static_cast<int>(it - ranks_.begin());
    if (name.empty()) name = "group" + std::to_string(tag_);
    name_ = name;
    for (int r : ranks_) members_ |= uint64_t{1} << r;
    if (ctx_ && ctx_->recorder()) group_ = 1 + ctx_->recorder()->intern(group_label(name, ranks_));
    if (ctx_ && ctx_->stepper()) ctx_->stepper()->name_group(1 + tag_, members_, name_);
  }
  // Queued operations capture this group; they finish (or fail under the watchdog) first.
  ~GroupComm() override { ex_->drain(); }

  // A group of this group is a group of its parent (new_group): its members' parent ranks, and the
  // tag its own sends would carry through this group.
  Communicator& parent() const { return parent_; }
  int parent_rank(int group_rank) const {
    DTLAB_CHECK(group_rank >= 0 && group_rank < world_size(), "a subgroup lists rank " + std::to_string(group_rank) +
                                                                   " of a group of " + std::to_string(world_size()));
    return ranks_[static_cast<size_t>(group_rank)];
  }
  int parent_tag(int tag) const { return tag_ + 1 + tag; }
  const std::shared_ptr<GroupExecutor>& executor() const { return ex_; }

  int rank() const override { return me_; }
  int world_size() const override { return static_cast<int>(ranks_.size()); }
  const char* backend_name() const override { return parent_.backend_name(); }
  uint64_t collectives_issued() const override { return seq_; }

  WorkPtr all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, Algorithm algo) override {
    check(dt, algo, CollectiveOp::AllReduce, op);
    return run({CollectiveOp::AllReduce, Algorithm::Ring, op, dt, count}, [=, this] {
      // Padded chunks (ring_order.h): the reduce-scatter and all-gather below move equal blocks.
      const int n = world_size();
      const int64_t chunk = padded_chunk(count, n);
      Tensor padded = scratch(chunk * n, dt);  // zero-filled
      dev_.copy(padded.raw(), buf, count * dtype_size(dt));
      Tensor mine = scratch(chunk, dt);
      ring_reduce_scatter(mine.raw(), padded.raw(), chunk, dt, op);
      ring_all_gather(padded.raw(), mine.raw(), chunk, dt);
      dev_.copy(buf, padded.raw(), count * dtype_size(dt));
    });
  }
  WorkPtr reduce_scatter(void* out, const void* in, int64_t count, DType dt, ReduceOp op, Algorithm algo) override {
    check(dt, algo, CollectiveOp::ReduceScatter, op);
    return run({CollectiveOp::ReduceScatter, Algorithm::Ring, op, dt, count}, [=, this] {
      ring_reduce_scatter(out, in, count, dt, op);
    });
  }
  WorkPtr all_gather(void* out, const void* in, int64_t count, DType dt, Algorithm algo) override {
    check(dt, algo, CollectiveOp::AllGather);
    return run({CollectiveOp::AllGather, Algorithm::Ring, ReduceOp::Sum, dt, count}, [=, this] {
      ring_all_gather(out, in, count, dt);
    });
  }
  // Direct sends: step k moves the root's data to (or from) the k-th other rank.
  WorkPtr broadcast(void* buf, int64_t count, DType dt, int root, Algorithm algo) override {
    check(dt, Algorithm::Default, CollectiveOp::Broadcast);
    check_root(root);
    return run({CollectiveOp::Broadcast, Algorithm::Naive, ReduceOp::Sum, dt, count, root}, [=, this] {
      if (me_ == root) {
        for (int r = 0; r < world_size(); r++)
          if (r != root) p2p_send(buf, count, dt, r, RingPhase::Broadcast, turn(r, root));
      } else {
        p2p_recv(buf, count, dt, root, RingPhase::Broadcast, turn(me_, root));
      }
    });
  }
  WorkPtr reduce(void* buf, int64_t count, DType dt, ReduceOp op, int root, Algorithm algo) override {
    check(dt, Algorithm::Default, CollectiveOp::Reduce, op);
    check_root(root);
    return run({CollectiveOp::Reduce, Algorithm::Naive, op, dt, count, root}, [=, this] {
      if (me_ != root) return p2p_send(buf, count, dt, root, RingPhase::Reduce, turn(me_, root));
      Tensor tmp = scratch(count, dt);
      for (int r = 0; r < world_size(); r++) {
        if (r == root) continue;
        p2p_recv(tmp.raw(), count, dt, r, RingPhase::Reduce, turn(r, root));
        reduce_into(buf, tmp.raw(), count, dt, op);
      }
      if (op == ReduceOp::Avg) dev_.scale(static_cast<float*>(buf), count, 1.0f / static_cast<float>(world_size()));
    });
  }
  WorkPtr barrier() override {
    return run({CollectiveOp::Barrier, Algorithm::Ring, ReduceOp::Sum, DType::F32, 0}, [this] {
      Tensor all = scratch(world_size(), DType::F32);
      ring_all_gather(all.raw(), all.f32() + me_, 1, DType::F32);
    });
  }
  WorkPtr send(const void* buf, int64_t count, DType dt, int peer, int tag) override {
    check_root(peer);
    return parent_.send(buf, count, dt, ranks_[static_cast<size_t>(peer)], tag_ + 1 + tag);
  }
  WorkPtr recv(void* buf, int64_t count, DType dt, int peer, int tag) override {
    check_root(peer);
    return parent_.recv(buf, count, dt, ranks_[static_cast<size_t>(peer)], tag_ + 1 + tag);
  }
  Algorithm alltoall_default() const override { return parent_.alltoall_default(); }
  WorkPtr group_send_recv(const std::vector<P2PPair>& pairs, int tag, DType dt) override {
    std::vector<P2PPair> mapped = pairs;  // in the parent's ranks and tags
    for (P2PPair& p : mapped) {
      check_root(p.to);
      check_root(p.from);
      p.to = global(p.to);
      p.from = global(p.from);
    }
    return parent_.group_send_recv(mapped, tag_ + 1 + tag, dt);
  }
  WorkPtr all_to_all(void* out, const void* in, int64_t count, DType dt, Algorithm algo) override {
    check(dt, Algorithm::Default, CollectiveOp::AllToAll);
    const Algorithm a = alltoall_algo(algo);
    return run({CollectiveOp::AllToAll, a, ReduceOp::Sum, dt, count}, [=, this] {
      const int n = world_size();
      dev_.copy(elems_at(out, me_ * count, dt), elems_at(in, me_ * count, dt), count * dtype_size(dt));
      std::vector<int64_t> sat(static_cast<size_t>(n) + 1), counts(static_cast<size_t>(n), count);
      for (int r = 0; r <= n; r++) sat[static_cast<size_t>(r)] = r * count;
      if (a == Algorithm::Grouped) return grouped_exchange(out, sat, counts, in, sat, counts, dt);
      // Round k: send to me + k, receive from me - k, paired (a ring shift of distance k).
      for (int k = 1; k < n; k++) {
        const int to = ring_mod(me_ + k, n), from = ring_mod(me_ - k, n);
        p2p_exchange(elems_at(in, to * count, dt), to, elems_at(out, from * count, dt), from, count, dt, RingPhase::None, from);
      }
    });
  }
  WorkPtr all_to_all_v(void* out, const std::vector<int64_t>& recv_counts, const void* in, const std::vector<int64_t>& send_counts,
                       DType dt, Algorithm algo) override {
    check(dt, Algorithm::Default, CollectiveOp::AllToAll);
    const Algorithm a = alltoall_algo(algo);
    const int n = world_size();
    if (static_cast<int>(recv_counts.size()) != n || static_cast<int>(send_counts.size()) != n)
      throw Error("all_to_all_v needs one send and one receive count per rank of the group of " + std::to_string(n));
    for (size_t i = 0; i < send_counts.size(); i++)
      if (send_counts[i] < 0 || recv_counts[i] < 0) throw Error("all_to_all_v's counts cannot be negative");
    // The call's count: the elements this rank sends (its in), as torch's input split sizes sum.
    int64_t total = 0;
    for (int64_t c : send_counts) total += c;
    CollDesc d{CollectiveOp::AllToAll, a, ReduceOp::Sum, dt, total};
    d.split_sizes = true;
    return run(d, [=, this] {
      std::vector<int64_t> sat(static_cast<size_t>(n) + 1, 0), rat(static_cast<size_t>(n) + 1, 0);  // where each rank's block starts
      for (int r = 0; r < n; r++) {
        sat[static_cast<size_t>(r) + 1] = sat[static_cast<size_t>(r)] + send_counts[static_cast<size_t>(r)];
        rat[static_cast<size_t>(r) + 1] = rat[static_cast<size_t>(r)] + recv_counts[static_cast<size_t>(r)];
      }
      DTLAB_CHECK(send_counts[static_cast<size_t>(me_)] == recv_counts[static_cast<size_t>(me_)],
                  "all_to_all_v: a rank's block to itself must have the same count both ways");
      dev_.copy(elems_at(out, rat[static_cast<size_t>(me_)], dt), elems_at(in, sat[static_cast<size_t>(me_)], dt),
                send_counts[static_cast<size_t>(me_)] * dtype_size(dt));
      if (a == Algorithm::Grouped) return grouped_exchange(out, rat, recv_counts, in, sat, send_counts, dt);
      // Pairwise exchange: round k sends to me + k and receives from me - k (each pair's own sizes).
      for (int k = 1; k < n; k++) {
        const int to = ring_mod(me_ + k, n), from = ring_mod(me_ - k, n);
        p2p_exchange(elems_at(in, sat[static_cast<size_t>(to)], dt), send_counts[static_cast<size_t>(to)], to,
                     elems_at(out, rat[static_cast<size_t>(from)], dt), recv_counts[static_cast<size_t>(from)], from, dt, RingPhase::None,
                     from);
      }
    }, [&](CollectiveInfo& info) {
      int64_t received = 0;
      for (int64_t c : recv_counts) received += c;
      info.in_count = total;
      info.out_count = received;
      info.bytes = (total - send_counts[static_cast<size_t>(me_)]) * dtype_size(dt);  // what leaves this rank
      info.kept_count = send_counts[static_cast<size_t>(me_)];
      info.split_sizes = true;
    });
  }
  WorkPtr send_recv(const void* send_buf, int64_t send_count, int to, int send_tag, void* recv_buf, int64_t recv_count,
                    int from, int recv_tag, DType dt) override {
    return parent_exchange(false, send_buf, send_count, to, send_tag, recv_buf, recv_count, from, recv_tag, dt);
  }
  bool send_recv_fused() const override { return parent_.send_recv_fused(); }
  WorkPtr ring_send_recv(const void* send_buf, int64_t send_count, int to, int send_tag, void* recv_buf, int64_t recv_count,
                         int from, int recv_tag, DType dt) override {
    return parent_exchange(true, send_buf, send_count, to, send_tag, recv_buf, recv_count, from, recv_tag, dt);
  }

 private:
  // float32 and the 16-bit dtypes (mixed-precision HYBRID_SHARD); copies also int64 (DDP all-gathers
  // its int64 parameter check). A 16-bit sum is the threads backend's (reduce_kernels.h: each addition
  // in float, rounded once), by the rank's device (Device::accumulate_half); avg is float32's only, as on the
  // world communicators.
  void check(DType dt, Algorithm algo, CollectiveOp op, ReduceOp reduce = ReduceOp::Sum) const {
    const bool copy = op == CollectiveOp::AllGather || op == CollectiveOp::Broadcast || op == CollectiveOp::AllToAll;
    const bool half = dt == DType::BF16 || dt == DType::F16;
    if (dt != DType::F32 && !half && !(copy && dt == DType::I64))
      throw Error(std::string("process-group ") + collective_name(op) + " supports float32, bfloat16 and float16" +
                  (copy ? " and int64" : ""));
    if (half && !copy && reduce == ReduceOp::Avg)
      throw Error(std::string("avg is defined for float32 only; reduce ") + dtype_word(dt) + " with sum or max");
    if (algo != Algorithm::Default && algo != Algorithm::Ring)
      throw Error(std::string("process-group ") + collective_name(op) + " runs the ring algorithm only, not " +
                  algorithm_name(algo));
  }
  void check_root(int r) const {
    if (r < 0 || r >= world_size())
      throw Error("group rank " + std::to_string(r) + " is out of range for a group of " + std::to_string(world_size()));
  }
  // Which step of a rooted operation moves group rank r's data (the root's turns, in rank order).
  static int turn(int r, int root) { return r < root ? r : r - 1; }

  CollectiveInfo info_of(const CollDesc& d, uint64_t seq) const {
    const int n = world_size();
    CollectiveInfo info{};
    info.op = d.op;
    info.algo = d.algo;
    info.reduce = d.reduce;
    info.dtype = d.dtype;
    info.root = static_cast<int16_t>(d.root);
    info.group_size = static_cast<int16_t>(n);
    info.seq = seq;
    info.in_count = collective_traits(d.op).in_count(d.count, n);
    info.out_count = collective_traits(d.op).out_count(d.count, n);
    info.bytes = payload_bytes(d, n);
    info.proto = Protocol::Default;
    info.group = group_;
    if (d.op == CollectiveOp::AllToAll) info.kept_count = d.count;  // the plain one's equal blocks; all_to_all_v sets its own
    return info;
  }
  static int steps_of(CollectiveOp op, Algorithm algo, int n) {
    if (op == CollectiveOp::AllReduce) return 2 * (n - 1);
    if (op == CollectiveOp::AllToAll && algo == Algorithm::Grouped) return n > 1 ? 1 : 0;
    return n - 1;
  }
  Algorithm alltoall_algo(Algorithm algo) const {
    const Algorithm a = algo == Algorithm::Default ? alltoall_default() : algo;
    check_algorithm(CollectiveOp::AllToAll, a);
    return a;
  }

  // The executor thread enqueues on the rank's device: it binds the device first. The issue is
  // recorded on the calling (compute) thread, the Collective span once its steps ran.
  // `adjust`: a call whose sizes the CollDesc cannot say (all_to_all_v) sets its counts and bytes.
  WorkPtr run(const CollDesc& d, std::function<void()> fn, const std::function<void(CollectiveInfo&)>& adjust = {}) {
    const uint64_t seq = seq_++;
    OpTrace op;
    op.info = info_of(d, seq);
    if (adjust) adjust(op.info);
    op.steps = steps_of(d.op, d.algo, world_size());
    if (ctx_) {
      op.iteration = ctx_->iteration();
      const int64_t now = ctx_->recorder() ? ctx_->recorder()->now_ns() : 0;
      const double t = ctx_->compute_clock();
      Event e(EventKind::CollectiveIssue, Lane::Compute, now, now, t, t);
      e.coll = op.info;
      ctx_->record(e);
      // The call is the issue; a stepped run then holds the rank at the gate until every member called it.
      const std::string label = name_ + " " + describe(d, seq);
      if (!ctx_->gate_op(op_ref(seq), d.op, op.info.bytes, label, nullptr, group_))
        throw CommError("rank " + std::to_string(global(me_)) + " stopped before " + label + ": the run was aborted");
    }
    if (ctx_) ctx_->lane_work(kGroupLane, +1);  // before the compute lane can reach its next gate
    return ex_->submit(
        seq,
        [this, op, fn = std::move(fn)] {
          struct Done {
            RankContext* ctx;
            ~Done() {
              if (ctx) ctx->lane_work(kGroupLane, -1);
            }
          } done{ctx_};
          dev_.bind_thread();
          op_ = op;
          fn();
          return finish_op();
        },
        ctx_);
  }
  OpRef op_ref(uint64_t seq) const {
    OpRef r;
    r.group = 1 + tag_;
    r.seq = static_cast<int64_t>(seq);
    r.members = members_;
    return r;
  }
  // The stepper's gate before one step of the running operation, on the group lane (`participants`:
  // the ranks that move data in it; 0: every member).
  void step_gate(int step, uint64_t participants) {
    if (!ctx_) return;
    const std::string label = name_ + " " + describe_running() + ", step " + std::to_string(step);
    if (!ctx_->gate_ring(kGroupLane, op_ref(op_.info.seq), step, participants, op_.iteration, ctx_->comm_clock(), label, group_))
      throw CommError("rank " + std::to_string(global(me_)) + " stopped in " + label + ": the run was aborted");
  }
  std::string describe_running() const {
    CollDesc d;
    d.op = op_.info.op;
    d.algo = op_.info.algo;
    d.reduce = op_.info.reduce;
    d.dtype = op_.info.dtype;
    d.root = op_.info.root;
    d.count = op_.info.in_count;
    return describe(d, op_.info.seq);
  }
  uint64_t pair(int a, int b) const { return (uint64_t{1} << global(a)) | (uint64_t{1} << global(b)); }
  WorkTimes finish_op() {
    if (!op_.stepped) {  // nothing moved (a group of one): an instant at the comm lane's clock
      const double t = ctx_ ? ctx_->comm_clock() : 0;
      const int64_t now = ctx_ && ctx_->recorder() ? ctx_->recorder()->now_ns() : 0;
      op_.span = WorkTimes{now, now, t, t};
    }
    if (ctx_) {
      Event e(EventKind::Collective, Lane::Comm, op_.span.wall_begin_ns, op_.span.wall_end_ns, op_.span.model_begin,
              op_.span.model_end);
      e.coll = op_.info;
      e.iteration = op_.iteration;
      ctx_->record(e);
    }
    return op_.span;
  }
  // One step of the running operation: a RingStep event on its transfer's span (global ranks).
  void record_step(const WorkPtr& w, RingPhase phase, int chunk, int src, int dst, int64_t bytes, int step) {
    const WorkTimes t = w->times();
    if (!op_.stepped) op_.span = t;
    op_.stepped = true;
    op_.span.wall_begin_ns = std::min(op_.span.wall_begin_ns, t.wall_begin_ns);
    op_.span.wall_end_ns = std::max(op_.span.wall_end_ns, t.wall_end_ns);
    op_.span.model_begin = std::min(op_.span.model_begin, t.model_begin);
    op_.span.model_end = std::max(op_.span.model_end, t.model_end);
    if (!ctx_) return;
    Event e(EventKind::RingStep, Lane::Comm, t.wall_begin_ns, t.wall_end_ns, t.model_begin, t.model_end);
    e.step = RingStepInfo{op_.info.seq, phase, static_cast<int16_t>(step), static_cast<int16_t>(op_.steps),
                          static_cast<int16_t>(chunk), static_cast<int16_t>(src), static_cast<int16_t>(dst), bytes,
                          group_};
    e.iteration = op_.iteration;
    ctx_->record(e);
  }
  int global(int group_rank) const { return ranks_[static_cast<size_t>(group_rank)]; }
  // Untracked scratch on the group's device, zero-filled (the algorithms' partial sums).
  Tensor scratch(int64_t n, DType dt) const { return Tensor({n}, MemCategory::CommBuffers, nullptr, dt, dev_); }
  // acc = acc op x, `n` elements of `dt` (check() kept 16-bit sums to host memory).
  void reduce_into(void* acc, const void* x, int64_t n, DType dt, ReduceOp op) {
    if (dt == DType::F32)
      return dev_.accumulate(static_cast<float*>(acc), static_cast<const float*>(x), n, op == ReduceOp::Max);
    dev_.accumulate_half(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(x), n, op == ReduceOp::Max,
                         dt == DType::BF16 ? HalfFormat::BF16 : HalfFormat::FP16);
  }

  // A grouped all-to-all's one step: every send and receive posted together (the parent's
  // group_send_recv: NCCL's ncclGroupStart/End), one RingStep per block received. `rat`/`sat`: where
  // each rank's block starts in out/in (n + 1 offsets), `rc`/`sc` its length.
  void grouped_exchange(void* out, const std::vector<int64_t>& rat, const std::vector<int64_t>& rc, const void* in,
                        const std::vector<int64_t>& sat, const std::vector<int64_t>& sc, DType dt) {
    const int n = world_size();
    if (n == 1) return;
    step_gate(0, 0);
    std::vector<P2PPair> pairs;
    for (int k = 1; k < n; k++) {
      const int to = ring_mod(me_ + k, n), from = ring_mod(me_ - k, n);
      const auto t = static_cast<size_t>(to), f = static_cast<size_t>(from);
      pairs.push_back({elems_at(in, sat[t], dt), sc[t], global(to), elems_at(out, rat[f], dt), rc[f], global(from)});
    }
    WorkPtr w = parent_.group_send_recv(pairs, tag_ | kGroupStepTag, dt);
    w->wait();
    for (int k = 1; k < n; k++) {
      const int from = ring_mod(me_ - k, n);
      record_step(w, RingPhase::None, from, global(from), global(me_), rc[static_cast<size_t>(from)] * dtype_size(dt), 0);
    }
  }

  // A program's send_recv (or ring step) between group ranks: the parent's, in its ranks and tags.
  WorkPtr parent_exchange(bool ring, const void* send_buf, int64_t send_count, int to, int send_tag, void* recv_buf, int64_t recv_count,
                          int from, int recv_tag, DType dt) {
    check_root(to);
    check_root(from);
    const int gto = ranks_[static_cast<size_t>(to)], gfrom = ranks_[static_cast<size_t>(from)];
    return ring ? parent_.ring_send_recv(send_buf, send_count, gto, tag_ + 1 + send_tag, recv_buf, recv_count, gfrom, tag_ + 1 + recv_tag, dt)
                : parent_.send_recv(send_buf, send_count, gto, tag_ + 1 + send_tag, recv_buf, recv_count, gfrom, tag_ + 1 + recv_tag, dt);
  }

  // Sends are eager on every backend (see communicator.h), so send-then-receive never deadlocks.
  // A sending step records what this rank received: nothing.
  void p2p_send(const void* buf, int64_t count, DType dt, int to, RingPhase phase, int step) {
    step_gate(step, pair(me_, to));
    WorkPtr w = parent_.send(buf, count, dt, global(to), tag_ | kGroupStepTag);
    w->wait();
    record_step(w, phase, -1, global(me_), global(to), 0, step);
  }
  void p2p_recv(void* buf, int64_t count, DType dt, int from, RingPhase phase, int step) {
    step_gate(step, pair(from, me_));
    WorkPtr w = parent_.recv(buf, count, dt, global(from), tag_ | kGroupStepTag);
    w->wait();
    record_step(w, phase, -1, global(from), global(me_), count * dtype_size(dt), step);
  }
  // One ring step: the send and the receive as one operation (NCCL runs them in one group; a
  // lone send there waits for the peer's receive, and every rank of a ring would wait on its own).
  void p2p_exchange(const void* send_buf, int to, void* recv_buf, int from, int64_t count, DType dt, RingPhase phase,
                    int chunk) {
    p2p_exchange(send_buf, count, to, recv_buf, count, from, dt, phase, chunk);
  }
  // The same with a size each way (all_to_all_v); the step's event carries the bytes received.
  void p2p_exchange(const void* send_buf, int64_t send_count, int to, void* recv_buf, int64_t recv_count, int from, DType dt,
                    RingPhase phase, int chunk) {
    const int step = op_.next_step++;
    step_gate(step, 0);
    WorkPtr w = parent_.send_recv(send_buf, send_count, global(to), tag_ | kGroupStepTag, recv_buf, recv_count, global(from),
                                  tag_ | kGroupStepTag, dt);
    w->wait();
    record_step(w, phase, chunk, global(from), global(me_), recv_count * dtype_size(dt), step);
  }

  // in: n blocks of `count`; out: block me_ reduced over the group, in ring_order.h's order (each
  // step adds the predecessor's partial of one block; after n-1 steps block me is complete).
  void ring_reduce_scatter(void* out, const void* in, int64_t count, DType dt, ReduceOp op) {
    const int n = world_size();
    Tensor acc = scratch(count * n, dt);
    dev_.copy(acc.raw(), in, count * n * dtype_size(dt));
    Tensor tmp = scratch(count, dt);
    const int succ = ring_succ(me_, n), pred = ring_pred(me_, n);
    for (int s = 0; s < n - 1; s++) {
      const int send_block = ring_rs_send_chunk(me_, s, n), recv_block = ring_rs_recv_chunk(me_, s, n);
      p2p_exchange(elems_at(acc.raw(), send_block * count, dt), succ, tmp.raw(), pred, count, dt, RingPhase::ReduceScatter,
                   recv_block);
      reduce_into(elems_at(acc.raw(), recv_block * count, dt), tmp.raw(), count, dt, op);
    }
    dev_.copy(out, elems_at(acc.raw(), me_ * count, dt), count * dtype_size(dt));
    if (op == ReduceOp::Avg) dev_.scale(static_cast<float*>(out), count, 1.0f / static_cast<float>(n));
  }
  // in: `count`; out: n blocks, block r from group rank r (ring_order.h's order).
  void ring_all_gather(void* out, const void* in, int64_t count, DType dt) {
    const int n = world_size();
    dev_.copy(elems_at(out, me_ * count, dt), in, count * dtype_size(dt));  // a no-op when `in` is already there
    const int succ = ring_succ(me_, n), pred = ring_pred(me_, n);
    for (int s = 0; s < n - 1; s++) {
      const int send_block = ring_ag_send_chunk(me_, s, n), recv_block = ring_ag_recv_chunk(me_, s, n);
      p2p_exchange(elems_at(out, send_block * count, dt), succ, elems_at(out, recv_block * count, dt), pred, count, dt,
                   RingPhase::AllGather, recv_block);
    }
  }

  Communicator& parent_;
  std::vector<int> ranks_;
  int tag_;
  std::shared_ptr<GroupExecutor> ex_;
  Device& dev_;  // where the group's buffers live (the parent moves that device's memory)
  RankContext* ctx_;  // the parent's: where the group's events go (null: none)
  std::string name_;     // "tp1"
  uint64_t members_ = 0;  // the global ranks, bit r for rank r
  int32_t group_ = 0;  // 1 + the recorder's label id of "name: ranks"
  int me_ = 0;
  uint64_t seq_ = 0;
  OpTrace op_;  // the running operation's; touched only by the executor thread
};

}  // namespace

std::unique_ptr<Communicator> new_group(Communicator& parent, std::vector<int> ranks, int tag,
                                        std::shared_ptr<GroupExecutor> executor, Device& device, std::string name) {
  // A group of a group (HYBRID_SHARD's node and replica groups inside a mesh's DP group) is built on
  // the world with the members' world ranks, as torch's new_group takes global ranks: its events,
  // the stepper's gates and the lab's rings name the ranks that really move the data. It runs on its
  // parent's executor: the world's comm worker runs each rank's sends and receives in issue order (a
  // stream), so two executors of one rank feeding it (the mesh's TP group and FSDP's node group)
  // would interleave differently on different ranks, and a receive of one group would wait forever
  // in front of the other group's. One executor per rank issues every group's operations in program
  // order, the same on every rank.
  if (auto* g = dynamic_cast<GroupComm*>(&parent)) {
    (void)executor;
    for (int& r : ranks) r = g->parent_rank(r);
    return new_group(g->parent(), std::move(ranks), g->parent_tag(tag), g->executor(), device, std::move(name));
  }
  return std::make_unique<GroupComm>(parent, std::move(ranks), tag, std::move(executor), device, std::move(name));
}

}  // namespace dtlab
