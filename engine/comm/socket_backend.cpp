#include "engine/comm/socket_backend.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <thread>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/comm/plan.h"
#include "engine/comm/reduce_kernels.h"
#include "engine/comm/ring_order.h"  // chunk_begin
#include "engine/comm/socket_mesh.h"
#include "engine/core/format.h"

namespace dtlab {

namespace {

int64_t env_int(const char* name, int64_t lo, int64_t hi) {
  const std::string text = std::getenv(name);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size() || v < lo || v > hi)
    throw Error(std::string(name) + "='" + text + "' is not a whole number in " + std::to_string(lo) + ".." +
                std::to_string(hi) + "; 'dtlab-cli launch' sets it for each process");
  return v;
}

}  // namespace

SocketOptions socket_options_from_env() {
  std::string missing;
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
    if (!std::getenv(name)) missing += (missing.empty() ? "" : ", ") + std::string(name);
  if (!missing.empty())
    throw Error("--backend socket runs one rank per process and needs RANK, WORLD_SIZE, MASTER_ADDR and "
                "MASTER_PORT in the environment (missing: " + missing +
                "); start it with 'dtlab-cli launch --nproc-per-node N -- train ...'");
  SocketOptions o;
  o.world_size = static_cast<int>(env_int("WORLD_SIZE", 1, 1024));
  o.rank = static_cast<int>(env_int("RANK", 0, o.world_size - 1));
  o.master_port = static_cast<int>(env_int("MASTER_PORT", 1, 65535));
  o.master_addr = std::getenv("MASTER_ADDR");
  if (std::getenv("LOCAL_RANK")) o.local_rank = static_cast<int>(env_int("LOCAL_RANK", 0, 1023));
  if (std::getenv("LOCAL_WORLD_SIZE")) o.local_world_size = static_cast<int>(env_int("LOCAL_WORLD_SIZE", 1, 1024));
  return o;
}

// ---------------------------------------------------------------------------------------------
// One rank's part of a running collective: sends and receives of its steps, each message checked
// against this rank's call, and the step's event on the modeled clock.

struct SocketCommunicator::Call {
  SocketMesh& mesh;
  const CommJob& job;
  RankContext* ctx;
  int rank, n, steps;
  double model_t;  // running modeled time of this collective's steps
  std::string what;
  std::vector<bool> heard = std::vector<bool>(static_cast<size_t>(n));  // per peer: sent us a step already
  SocketCommunicator* comm = nullptr;  // for its status

  // The stepper's gate before ring step `step`.
  void step_gate(int step) {
    if (comm) comm->set_status("in " + what + at(step), static_cast<int64_t>(job.seq), step);
    OpRef op;
    op.group = 0;
    op.seq = static_cast<int64_t>(job.seq);
    op.members = n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
    if (ctx && !ctx->gate_ring(kCommLane, op, step, 0, job.iteration, model_t, "world " + what + ", step " + std::to_string(step)))
      throw CommError("rank " + std::to_string(rank) + ": the run was stopped in collective " + what + at(step));
  }

  std::string who() const { return "rank " + std::to_string(rank) + ": collective " + what; }
  std::string at(int step) const {
    return steps > 0 ? " at step " + std::to_string(step + 1) + " of " + std::to_string(steps) : "";
  }

  void send(int peer, int step, const void* data, int64_t elems) {
    WireHeader h;
    h.kind = WireKind::Collective;
    h.op = job.desc.op;
    h.algo = job.desc.algo;
    h.proto = job.desc.proto;
    h.reduce = job.desc.reduce;
    h.dtype = job.desc.dtype;
    h.root = job.desc.root;
    h.count = job.desc.count;
    h.seq = job.seq;
    h.step = step;
    h.bytes = static_cast<uint64_t>(elems * dtype_size(job.desc.dtype));
    h.model_t = model_t;
    std::string why;
    if (!mesh.send(peer, h, data, why)) {
      if (mesh.aborted()) throw CommError(mesh.abort_reason());
      throw CommError(who() + " failed" + at(step) + " sending to rank " + std::to_string(peer) + ": " + why);
    }
  }

  // The message `peer` sent for this collective's step `step`, after checking it is for the same call.
  WireMessage recv(int peer, int step, int64_t elems) {
    WireMessage m;
    WaitEnd end = mesh.take(WireKind::Collective, peer, static_cast<int64_t>(job.seq), m);
    // A peer that already sent earlier steps of this collective is most likely stuck behind the
    // real culprit (a rank that never arrived), whose own wait ends first: give that rank's
    // diagnosis a moment to arrive, so every rank reports the root cause.
    if (end == WaitEnd::Timeout && heard[static_cast<size_t>(peer)])
      end = mesh.take(WireKind::Collective, peer, static_cast<int64_t>(job.seq), m, std::min(mesh.timeout_s(), 2.0));
    switch (end) {
      case WaitEnd::Ok: break;
      case WaitEnd::Aborted: throw CommError(mesh.abort_reason());
      case WaitEnd::Timeout: {
        // Who skipped a collective is clear from the collective numbers: a peer whose messages are
        // for a later collective than this one went on without it; a peer still in one this rank
        // skipped waits for this rank. Both ranks then name the same culprit.
        const int64_t theirs = mesh.last_collective_seq(peer), mine = static_cast<int64_t>(job.seq);
        const int64_t skipped = comm ? comm->skipped_before(job.seq) : -1;
        if (theirs > mine)
          throw CommError("rank " + std::to_string(peer) + " skipped collective " + what + ": rank " + std::to_string(rank) +
                          " waited " + seconds_text(mesh.timeout_s()) + " in it" + at(step) + " for rank " +
                          std::to_string(peer) + "'s data, but " + mesh.last_from(peer));
        if (skipped >= 0 && theirs <= skipped)
          throw CommError("rank " + std::to_string(rank) + " skipped collective #" + std::to_string(skipped) +
                          " (fault injection): " + mesh.last_from(peer) + ", so rank " + std::to_string(peer) +
                          " still waits in it, and rank " + std::to_string(rank) + "'s collective " + what +
                          " timed out after " + seconds_text(mesh.timeout_s()) + at(step));
        throw CommError(who() + " timed out after " + seconds_text(mesh.timeout_s()) + at(step) +
                        " waiting for data from rank " + std::to_string(peer) + "; " + mesh.last_from(peer));
      }
      case WaitEnd::Closed:
        throw CommError(who() + " lost rank " + std::to_string(peer) + at(step) +
                        ": it exited or failed before sending its data; " + mesh.last_from(peer));
    }
    if (!(m.h.desc() == job.desc))
      throw CommError("desync: collective #" + std::to_string(job.seq) + " differs across ranks: rank " +
                      std::to_string(peer) + " called " + describe(m.h.desc(), m.h.seq) + " but rank " +
                      std::to_string(rank) + " called " + what + "; every rank must issue the same collectives in the same order");
    const uint64_t bytes = static_cast<uint64_t>(elems * dtype_size(job.desc.dtype));
    if (m.h.step != step || m.h.bytes != bytes)
      throw CommError(who() + at(step) + ": rank " + std::to_string(peer) + " sent step " + std::to_string(m.h.step + 1) +
                      " with " + std::to_string(m.h.bytes) + " bytes where " + std::to_string(bytes) +
                      " were due; the ranks run different dtlab builds");
    model_t = std::max(model_t, m.h.model_t);  // the data cannot arrive before it was sent
    heard[static_cast<size_t>(peer)] = true;
    return m;
  }

  // Charges one step on the modeled clock and records it (as the threads backend's finish_step).
  // `ins`: the transfers this rank received (one event each; one empty event when none), `bytes_in`
  // the bytes of each.
  void finish_step(int step, const std::vector<StepTransfer>& plan, const std::vector<const StepTransfer*>& ins, int64_t bytes_in,
                   double model_bytes, int64_t wall0) {
    if (!ctx) return;
    std::vector<std::pair<int, int>> pairs;
    for (const StepTransfer& t : plan) pairs.push_back({t.src, t.dst});
    const RingPhase phase = plan.empty() ? RingPhase::None : plan.front().phase;
    const bool reduce = !plan.empty() && plan.front().reduce;
    const double dt = ctx->cost() ? ctx->cost()->step_time(pairs, model_bytes, reduce) : 0.0;
    const int64_t now = ctx->recorder() ? ctx->recorder()->now_ns() : 0;
    auto record = [&](const StepTransfer* in) {
      Event e(EventKind::RingStep, Lane::Comm, wall0, now, model_t, model_t + dt);
      e.step = RingStepInfo{job.seq, phase, static_cast<int16_t>(step), static_cast<int16_t>(steps),
                            static_cast<int16_t>(in ? in->chunk : -1), static_cast<int16_t>(in ? in->src : -1),
                            static_cast<int16_t>(in ? rank : -1), in ? bytes_in : 0, 0};
      e.iteration = job.iteration;
      ctx->record(e);
    };
    if (ins.empty()) record(nullptr);
    for (const StepTransfer* in : ins) record(in);
    model_t += dt;
  }

  int64_t now() const { return ctx && ctx->recorder() ? ctx->recorder()->now_ns() : 0; }
};

namespace {

template <class T>
T* as(void* p) { return static_cast<T*>(p); }
template <class T>
const T* as(const void* p) { return static_cast<const T*>(p); }

// Runs the schedule of engine/comm/plan.h: at every step this rank first sends what its outgoing
// transfer needs (data it finished in an earlier step), then receives and reduces or copies its
// incoming one. Each op only says where a transfer's data comes from and where it lands.
template <class T>
void run_plan(SocketCommunicator::Call& c) {
  const CollDesc& d = c.job.desc;
  const int n = c.n, r = c.rank;
  const int64_t count = d.count;
  const int64_t esize = static_cast<int64_t>(sizeof(T));
  T* buf = as<T>(c.job.buf);
  const T* in = as<T>(c.job.in);
  MemoryTracker* mem = c.ctx ? c.ctx->memory() : nullptr;
  const bool ring_ar = d.op == CollectiveOp::AllReduce && d.algo == Algorithm::Ring;
  auto chunk_lo = [&](int k) { return ring_ar ? chunk_begin(count, n, k) : k * count; };
  auto chunk_len = [&](int k) { return ring_ar ? chunk_begin(count, n, k + 1) - chunk_begin(count, n, k) : count; };

  // Where reductions accumulate: reduce's non-root ranks keep their buffers unchanged (scratch);
  // reduce-scatter keeps its running partial sum (scratch); everyone else reduces in place.
  Tensor scratch;
  T* acc = buf;
  if ((d.op == CollectiveOp::Reduce && r != d.root) || d.op == CollectiveOp::ReduceScatter) {
    scratch = Tensor({std::max<int64_t>(count, 1) * esize / 4 + 1}, MemCategory::CommBuffers, mem);
    acc = as<T>(scratch.raw());
    if (d.op == CollectiveOp::Reduce) copy_elems(acc, as<T>(static_cast<const void*>(buf)), count);
  }
  if (d.op == CollectiveOp::AllGather) copy_elems(buf + r * count, in, count);
  if (d.op == CollectiveOp::AllToAll) copy_elems(buf + r * count, in + r * count, count);

  auto outgoing = [&](const StepTransfer& t, int s) -> const T* {
    switch (d.op) {
      case CollectiveOp::AllReduce: return ring_ar ? buf + chunk_lo(t.chunk) : buf;
      case CollectiveOp::ReduceScatter: return s == 0 ? in + t.chunk * count : acc;
      case CollectiveOp::AllGather: return buf + t.chunk * count;
      case CollectiveOp::Reduce: return acc;
      case CollectiveOp::AllToAll: return in + t.dst * count;
      default: return buf;  // broadcast
    }
  };
  auto incoming = [&](const StepTransfer& t, int s, const T* data) {
    switch (d.op) {
      case CollectiveOp::AllReduce: {
        T* dst = ring_ar ? buf + chunk_lo(t.chunk) : buf;
        if (!t.reduce) return copy_elems(dst, data, chunk_len(t.chunk));
        reduce_into(dst, data, chunk_len(t.chunk), d.reduce);
        if (ring_ar && s == n - 2) finish_avg(dst, chunk_len(t.chunk), d.reduce, n);  // chunk r is final
        return;
      }
      case CollectiveOp::ReduceScatter: {
        T* dst = s == n - 2 ? buf : acc;
        reduce_to(dst, in + t.chunk * count, data, count, d.reduce);
        if (s == n - 2) finish_avg(buf, count, d.reduce, n);
        return;
      }
      case CollectiveOp::Reduce: return reduce_into(acc, data, count, d.reduce);
      case CollectiveOp::AllToAll: return copy_elems(buf + t.src * count, data, count);
      case CollectiveOp::AllGather: return copy_elems(buf + t.chunk * count, data, count);
      default: return copy_elems(buf, data, count);  // broadcast
    }
  };
  // The root's sum becomes an average once every contribution is in: tree and naive all-reduce
  // after their gather half, reduce at its end.
  const int gathered_at = d.op == CollectiveOp::AllReduce && d.algo == Algorithm::Tree ? ceil_log2(n) - 1
                          : d.op == CollectiveOp::AllReduce && d.algo == Algorithm::Naive ? n - 2
                          : d.op == CollectiveOp::Reduce ? c.steps - 1 : -1;
  const int avg_root = d.op == CollectiveOp::Reduce ? d.root : 0;

  const double model_bytes = ring_ar ? static_cast<double>(count * esize) / n : static_cast<double>(count * esize);
  for (int s = 0; s < c.steps; s++) {
    c.step_gate(s);
    const int64_t wall0 = c.now();
    const std::vector<StepTransfer> plan = algorithm_step_plan(d.op, d.algo, n, d.root, s);
    // Every schedule gives a rank at most one receive per step, but the grouped all-to-all's, which
    // receives a block from each other rank.
    std::vector<const StepTransfer*> mine;
    for (const StepTransfer& t : plan) {
      if (t.src == r) c.send(t.dst, s, outgoing(t, s), ring_ar ? chunk_len(t.chunk) : count);
      if (t.dst == r) mine.push_back(&t);
    }
    int64_t bytes_in = 0;
    for (const StepTransfer* in : mine) {
      const int64_t len = ring_ar ? chunk_len(in->chunk) : count;
      WireMessage m = c.recv(in->src, s, len);
      incoming(*in, s, as<T>(static_cast<const void*>(m.payload.data())));
      bytes_in = len * esize;
    }
    if (s == gathered_at && r == avg_root && d.op != CollectiveOp::ReduceScatter) finish_avg(buf, count, d.reduce, n);
    c.finish_step(s, plan, mine, bytes_in, model_bytes, wall0);
  }
}

// A barrier has no data: every rank tells every other that it arrived and waits to hear the same.
void run_barrier(SocketCommunicator::Call& c) {
  for (int q = 0; q < c.n; q++)
    if (q != c.rank) c.send(q, 0, nullptr, 0);
  for (int q = 0; q < c.n; q++)
    if (q != c.rank) c.recv(q, 0, 0);
}

template <class T>
void run_typed(SocketCommunicator::Call& c) {
  const CollDesc& d = c.job.desc;
  if (c.n == 1) {  // nothing moves; out-of-place ops still copy, avg divides by one
    if (collective_traits(d.op).out_of_place) copy_elems(as<T>(c.job.buf), as<T>(c.job.in), d.count);
    return;
  }
  if (d.op == CollectiveOp::Barrier) return run_barrier(c);
  run_plan<T>(c);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

SocketCommunicator::SocketCommunicator(const SocketOptions& opt, RankContext* ctx)
    : QueuedCommunicator(opt.rank, opt.world_size, ctx, opt.algorithms), faults_(opt.faults) {
  MeshOptions m;
  m.rank = opt.rank;
  m.world_size = opt.world_size;
  m.master_addr = opt.master_addr;
  m.master_port = opt.master_port;
  m.timeout_s = opt.timeout_s;
  mesh_ = std::make_unique<SocketMesh>(m);
  start_worker();
}

SocketCommunicator::~SocketCommunicator() {
  stop_worker();
  mesh_.reset();
}

void SocketCommunicator::abort(const std::string& reason) { mesh_->abort(reason); }

void SocketCommunicator::check_runs(const CollDesc& d) const {
  if (d.algo == Algorithm::DoubleTree || d.algo == Algorithm::Hierarchical || d.algo == Algorithm::InNetwork)
    throw Error(std::string("the socket backend runs all-reduce as ring, tree or naive, not ") + algorithm_name(d.algo) +
                "; dbtree, hierarchical and nvls run on the threads and cuda backends (--backend threads or cuda)");
}

WorkTimes SocketCommunicator::run_job(CommJob& j) {
  if (mesh_->aborted()) throw CommError(mesh_->abort_reason());
  return j.p2p ? run_p2p(j) : run_collective(j);
}

void SocketCommunicator::after_job(const std::string& error, bool internal) {
  if (!error.empty()) mesh_->abort(error);  // the peers stop with this rank's diagnosis
}

WorkTimes SocketCommunicator::run_collective(CommJob& j) {
  const int64_t wall0 = now_ns();
  const double begin = ctx() ? std::max(ctx()->comm_clock(), j.issue_model) : 0.0;
  Call c{*mesh_, j, ctx(), rank(), world_size(), algorithm_step_count(j.desc.op, j.desc.algo, world_size()),
         begin, describe(j.desc, j.seq)};
  c.comm = this;
  {
    std::lock_guard<std::mutex> lock(status_mu_);
    status_.desc = j.desc;
    status_.steps = c.steps;
  }
  // Fault injection, as in the threads backend: a skipped collective returns at once (its peers
  // wait for this rank until their timeout names it); a delay arrives late.
  for (const Fault& f : faults_) {
    if (f.rank != rank() || f.seq != j.seq) continue;
    if (f.kind == FaultKind::Skip) {
      set_status("skipped " + c.what + " (fault injection)", -1, 0);
      skipped_.push_back(j.seq);
      const double t = ctx() ? ctx()->comm_clock() : 0.0;
      return WorkTimes{now_ns(), now_ns(), t, t};
    }
    set_status("delayed before " + c.what + " (fault injection)", -1, 0);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(f.delay_s);
    while (std::chrono::steady_clock::now() < until && !mesh_->aborted())
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    c.model_t += f.delay_s;  // a straggler is late on the modeled clock too
  }
  // The stepper's gate for this collective was at its issue (QueuedCommunicator::gate), the ring
  // steps' are in run_plan: a launched world pauses and steps as the threads world does; with a
  // viewer attached the gates are rank 0's to open.
  set_status("in " + c.what, static_cast<int64_t>(j.seq), 0);
  // The threads backend's element types (threads_algorithms.cpp): 16-bit sums are rounded once per
  // step by the same reduce_kernels.h, so a launched bf16/fp16 run equals the in-process one.
  switch (j.desc.dtype) {
    case DType::F32: run_typed<float>(c); break;
    case DType::BF16: run_typed<Bf16Bits>(c); break;
    case DType::F16: run_typed<Fp16Bits>(c); break;
    default: run_typed<int64_t>(c); break;
  }
  {
    std::lock_guard<std::mutex> lock(status_mu_);
    status_.activity = "idle";
    status_.current_seq = -1;
    status_.done_seq = static_cast<int64_t>(j.seq);
    status_.steps_done = c.steps;
  }
  return finish_job(j, wall0, begin, c.model_t);
}

int64_t SocketCommunicator::skipped_before(uint64_t seq) const {
  int64_t last = -1;
  for (uint64_t s : skipped_)
    if (s < seq) last = std::max(last, static_cast<int64_t>(s));
  return last;
}

void SocketCommunicator::set_status(const std::string& activity, int64_t current, int steps_done) {
  std::lock_guard<std::mutex> lock(status_mu_);
  status_.activity = activity;
  status_.current_seq = current;
  status_.steps_done = steps_done;
}

SocketCommStatus SocketCommunicator::status() const {
  std::lock_guard<std::mutex> lock(status_mu_);
  return status_;
}

// Sends are eager (the peer's receiver thread takes them whenever they come, as gloo does); a
// receive waits for the next message with its tag from its peer, under the timeout.
WorkTimes SocketCommunicator::run_p2p(CommJob& j) {
  const int64_t wall0 = now_ns();
  const uint64_t bytes = static_cast<uint64_t>(j.desc.count * dtype_size(j.desc.dtype));
  const bool sending = j.desc.op == CollectiveOp::Send;
  const std::string what = std::string(collective_name(j.desc.op)) + " #" + std::to_string(j.seq) + " of " +
                           std::to_string(j.desc.count) + " " + dtype_word(j.desc.dtype) + (sending ? " to" : " from") +
                           " rank " + std::to_string(j.peer) + " (tag " + std::to_string(j.tag) + ")";
  const std::string me = "rank " + std::to_string(rank()) + ": ";
  double begin = ctx() ? std::max(ctx()->comm_clock(), j.issue_model) : 0.0;
  double link_time = 0;
  if (ctx() && ctx()->cost()) {
    const Link& link = ctx()->cost()->link(sending ? rank() : j.peer, sending ? j.peer : rank());
    link_time = link.alpha + static_cast<double>(bytes) * link.beta;
  }
  if (sending) {
    WireHeader h;
    h.kind = WireKind::P2P;
    h.op = CollectiveOp::Send;
    h.dtype = j.desc.dtype;
    h.count = j.desc.count;
    h.seq = j.seq;
    h.tag = j.tag;
    h.bytes = bytes;
    h.model_t = begin;
    std::string why;
    if (!mesh_->send(j.peer, h, j.buf, why)) {
      if (mesh_->aborted()) throw CommError(mesh_->abort_reason());
      throw CommError(me + what + " failed: " + why);
    }
    return finish_job(j, wall0, begin, begin + link_time);
  }
  WireMessage m;
  switch (mesh_->take(WireKind::P2P, j.peer, j.tag, m)) {
    case WaitEnd::Ok: break;
    case WaitEnd::Aborted: throw CommError(mesh_->abort_reason());
    case WaitEnd::Timeout:
      throw CommError(me + what + " timed out after " + seconds_text(mesh_->timeout_s()) + "; " + mesh_->last_from(j.peer));
    case WaitEnd::Closed:
      throw CommError(me + what + " lost rank " + std::to_string(j.peer) + ": it exited or failed before sending; " +
                      mesh_->last_from(j.peer));
  }
  if (m.h.bytes != bytes)
    throw CommError("recv on rank " + std::to_string(rank()) + " expected " + std::to_string(bytes) + " bytes from rank " +
                    std::to_string(j.peer) + " (tag " + std::to_string(j.tag) + ") but the matching send carried " +
                    std::to_string(m.h.bytes));
  if (bytes) std::memcpy(j.buf, m.payload.data(), bytes);
  return finish_job(j, wall0, begin, std::max(begin, m.h.model_t) + link_time);
}

}  // namespace dtlab
