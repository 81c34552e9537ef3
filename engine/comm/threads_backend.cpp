#include "engine/comm/threads_backend.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <system_error>
#include <new>  // std::bad_alloc

#include "engine/comm/ring_order.h"  // ring_pred, ring_succ
#include "engine/comm/threads_internal.h"
#include "engine/comm/watchdog.h"
#include "engine/core/format.h"

namespace dtlab {

Fault parse_fault(std::string_view text) {
  const std::string how =
      "; write skip:rank=R,collective=K or delay:rank=R,collective=K,ms=M";
  Fault f;
  size_t colon = text.find(':');
  std::string_view kind = text.substr(0, colon);
  if (kind == "skip") f.kind = FaultKind::Skip;
  else if (kind == "delay") f.kind = FaultKind::Delay;
  else throw Error("fault '" + std::string(text) + "' has unknown kind '" + std::string(kind) + "'" + how);
  if (colon == std::string_view::npos) throw Error("fault '" + std::string(text) + "' names no rank" + how);
  bool has_rank = false, has_seq = false, has_ms = false;
  std::string_view rest = text.substr(colon + 1);
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view kv = rest.substr(0, comma);
    size_t eq = kv.find('=');
    std::string_view key = kv.substr(0, eq);
    int64_t v = -1;
    if (eq != std::string_view::npos) {
      std::string_view val = kv.substr(eq + 1);
      auto [p, ec] = std::from_chars(val.data(), val.data() + val.size(), v);
      if (ec != std::errc() || p != val.data() + val.size() || v < 0) v = -1;
    }
    if (v < 0 || (key == "rank" && v > 65535))  // 4294967297 must not become rank 1
      throw Error("fault '" + std::string(text) + "' has a bad part '" + std::string(kv) + "'" + how);
    if (key == "rank") f.rank = static_cast<int>(v), has_rank = true;
    else if (key == "collective") f.seq = static_cast<uint64_t>(v), has_seq = true;
    else if (key == "ms" && f.kind == FaultKind::Delay) {
      // An hour at most: longer is no lesson, and a deadline of now + 2^63 ms overflows the clock.
      if (v > 3600000) throw Error("fault '" + std::string(text) + "' delays " + std::string(kv) + "; use at most ms=3600000 (an hour)");
      f.delay_s = static_cast<double>(v) / 1000.0, has_ms = true;
    }
    else throw Error("fault '" + std::string(text) + "' has unknown key '" + std::string(key) + "'" + how);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  if (!has_rank || !has_seq || (f.kind == FaultKind::Delay && !has_ms))
    throw Error("fault '" + std::string(text) + "' is incomplete" + how);
  return f;
}

namespace threads {

// ---------------------------------------------------------------------------------------------
// The per-rank communicator: the queue and worker are QueuedCommunicator's; a job runs here.

class RankComm : public QueuedCommunicator {
 public:
  RankComm(World* w, int rank)
      : QueuedCommunicator(rank, w->n_, w->ctx_[static_cast<size_t>(rank)].get(),
                           {w->opt_.allreduce_algo, w->opt_.broadcast_algo, w->opt_.reduce_algo, w->opt_.protocol, w->opt_.alltoall_algo}),
        w_(w), rank_(rank) {
    start_worker();
  }
  ~RankComm() override { stop_worker(); }
  const char* backend_name() const override { return "threads"; }
  // One job, as NCCL's group: the stepper gates the send and the receive together, so the ranks of a
  // ring (context parallelism's K/V steps) each waiting at theirs are released together. (send_recv
  // stays a send and a receive: the pipeline's stepping releases a stage's receive with its action.)
  WorkPtr ring_send_recv(const void* send_buf, int64_t send_count, int to, int send_tag, void* recv_buf, int64_t recv_count, int from,
                         int recv_tag, DType dt) override {
    return fused_send_recv(send_buf, send_count, to, send_tag, recv_buf, recv_count, from, dt, recv_tag);
  }

 private:
  void check_runs(const CollDesc& d) const override {
    if (d.op == CollectiveOp::AllReduce) check_algorithm_topology(d.algo, w_->n_, w_->cost_->profile());
  }
  WorkTimes run_job(CommJob& j) override {
    MoverJob on_device(*w_->mover_, rank_, job_label(j.desc.op, j.seq));
    if (w_->aborted()) throw CommError(w_->abort_reason_);
    return j.p2p ? run_p2p(j) : run_collective_job(j);
  }
  void after_job(const std::string& error, bool internal) override {
    if (internal) w_->abort(error);
    w_->set_comm_activity(rank_, error.empty() ? "idle" : "failed");
  }

  WorkTimes run_collective_job(CommJob& j) {
    RankContext* ctx = w_->ctx_[static_cast<size_t>(rank_)].get();
    const std::string what = describe(j.desc, j.seq);
    double late = 0;  // a delay fault also shows on the modeled clock, as a straggler would
    for (const Fault& f : w_->opt_.faults) {
      if (f.rank != rank_ || f.seq != j.seq) continue;
      if (f.kind == FaultKind::Skip) {
        std::lock_guard<std::mutex> lock(w_->mu_);
        w_->skipped_[static_cast<size_t>(rank_)] = "it skipped #" + std::to_string(j.seq) + " (fault injection)";
        const int64_t now = w_->recorder_->now_ns();
        return WorkTimes{now, now, ctx->comm_clock(), ctx->comm_clock()};
      }
      w_->set_comm_activity(rank_, "delayed before " + what + " (fault injection)");
      late += f.delay_s;
      std::unique_lock<std::mutex> lock(w_->mu_);
      w_->cv_.wait_for(lock, std::chrono::duration<double>(f.delay_s), [&] { return w_->aborted_; });
    }
    double arrive_t = std::max(ctx->comm_clock(), j.issue_model) + late;
    int64_t wall0 = w_->recorder_->now_ns();
    Rendezvous& rv = w_->arrive(rank_, j.seq, j.desc, j.buf, j.in, arrive_t);
    // From here on the other ranks know this rank's buffers: failing before the algorithm, it must
    // not let its caller free them while a rank already in the algorithm reads them.
    double start = 0;
    try {
      // The stepper's gate for this collective was at its issue (QueuedCommunicator::gate): every
      // rank released it together, so the others are on their way here.
      w_->set_comm_activity(rank_, "in " + what + ", waiting for the other ranks to arrive");
      start = w_->wait_all_arrived(rank_, rv);
      w_->set_comm_activity(rank_, "in " + what);
      w_->enter_algorithm(rv);
    } catch (...) {
      w_->abandon(rv);
      throw;
    }
    Call c{w_, &rv, rank_, w_->n_, ctx, start, j.iteration};
    try {
      run_collective(c);
    } catch (const std::exception& e) {
      // Neighbours may still be reading this rank's buffers (or scratch about to be freed by the
      // unwinding): stop them, then wait until every rank is out of the algorithm.
      if (!w_->aborted()) w_->abort("rank " + std::to_string(rank_) + " failed in " + what + ": " + e.what());
      w_->exit_algorithm(rv, true);
      throw;
    }
    w_->exit_algorithm(rv, false);
    c.scratch.clear();  // every reader is done (the algorithms drain before returning): freed before the Collective event
    double dur = w_->cost_->collective_time(j.desc.op, j.desc.algo, static_cast<double>(payload_bytes(j.desc, w_->n_)));
    double end = rv.steps > 0 ? c.model_t : start + dur;
    double begin = start;
    w_->leave(rv);
    return finish_job(j, wall0, begin, end);
  }

  // Sends are eager (copied into the peer's mailbox, as gloo does), so they never block the worker;
  // a receive waits for its message under the watchdog.
  WorkTimes run_p2p(CommJob& j) {
    RankContext* ctx = w_->ctx_[static_cast<size_t>(rank_)].get();
    size_t bytes = static_cast<size_t>(j.desc.count * dtype_size(j.desc.dtype));
    int64_t wall0 = w_->recorder_->now_ns();
    double begin = std::max(ctx->comm_clock(), j.issue_model);
    const Link& link = w_->cost_->link(j.desc.op == CollectiveOp::Send ? rank_ : j.peer,
                                       j.desc.op == CollectiveOp::Send ? j.peer : rank_);
    double end = begin + link.alpha + static_cast<double>(bytes) * link.beta;
    if (j.desc.op == CollectiveOp::Send) {
      World::Message msg;
      msg.data.resize(bytes);
      msg.model_sent = begin;
      if (bytes) w_->mover_->copy(rank_, msg.data.data(), j.fused ? j.in : j.buf, static_cast<int64_t>(bytes));
      std::lock_guard<std::mutex> lock(w_->mu_);
      w_->mailbox_[{rank_, j.peer, j.tag}].push_back(std::move(msg));
      w_->cv_.notify_all();
    }
    if (j.desc.op != CollectiveOp::Send || j.fused) {  // a receive, or a send_recv's receive after its send
      const int peer = j.fused ? j.recv_peer : j.peer, tag = j.fused ? j.recv_tag : j.tag;
      const int64_t count = j.fused ? j.recv_count : j.desc.count;
      bytes = static_cast<size_t>(count * dtype_size(j.desc.dtype));
      const Link& in = w_->cost_->link(peer, rank_);
      std::string what = "recv #" + std::to_string(j.seq) + " of " + std::to_string(count) +
                         " elements from rank " + std::to_string(peer) + " (tag " + std::to_string(tag) + ")";
      w_->set_comm_activity(rank_, "in " + what);
      std::unique_lock<std::mutex> lock(w_->mu_);
      auto key = std::make_tuple(peer, rank_, tag);
      // Its send was released at or before this receive's gate; a paused world stops the watchdog's clock.
      Deadline deadline(w_->opt_.timeout_s, w_->stepper_.get());
      bool ok = wait_under(w_->cv_, lock, deadline, [&] { return w_->aborted_ || !w_->mailbox_[key].empty(); });
      if (w_->aborted_) throw CommError(w_->abort_reason_);
      if (!ok) {
        std::string msg = diagnose_recv(what, rank_, w_->opt_.timeout_s, w_->doing(peer));
        lock.unlock();
        w_->fail(msg);
      }
      World::Message m = std::move(w_->mailbox_[key].front());
      w_->mailbox_[key].pop_front();
      lock.unlock();
      std::vector<uint8_t>& msg = m.data;
      end = std::max(end, std::max(begin, m.model_sent) + in.alpha + static_cast<double>(bytes) * in.beta);
      if (msg.size() != bytes) {
        w_->fail("recv on rank " + std::to_string(rank_) + " expected " + std::to_string(bytes) +
                 " bytes from rank " + std::to_string(peer) + " (tag " + std::to_string(tag) +
                 ") but the matching send carried " + std::to_string(msg.size()));
      }
      if (bytes) w_->mover_->copy(rank_, j.buf, msg.data(), static_cast<int64_t>(bytes));
    }
    return finish_job(j, wall0, begin, end);
  }

  World* w_;
  int rank_;
};

// ---------------------------------------------------------------------------------------------
// World: shared state, rendezvous, watchdog.

World::World(int n, WorldOptions opt) : n_(n), opt_(std::move(opt)), mover_(opt_.mover ? opt_.mover : host_mover()) {
  if (n < 1 || n > 64) throw Error("world size " + std::to_string(n) + " is out of range; use 1 to 64");
  if (!(opt_.timeout_s > 0)) throw Error("the collective timeout must be positive");
  for (const Fault& f : opt_.faults)
    if (f.rank < 0 || f.rank >= n)
      throw Error("fault names rank " + std::to_string(f.rank) + " but ranks are 0.." + std::to_string(n - 1));
  recorder_ = std::make_unique<TraceRecorder>(n, opt_.trace_capacity);
  recorder_->set_enabled(opt_.record);
  cost_ = std::make_unique<CostModel>(opt_.hardware ? *opt_.hardware : find_profile(opt_.profile), n);
  stepper_ = std::make_unique<Stepper>(n, opt_.start_paused);
  comm_activity_.assign(static_cast<size_t>(n), "idle");
  for (int r = 0; r < n; r++) {
    rank_mu_.push_back(std::make_unique<std::mutex>());
    rank_cv_.push_back(std::make_unique<std::condition_variable>());
  }
  skipped_.assign(static_cast<size_t>(n), "");
  for (int r = 0; r < n; r++) {
    memory_.push_back(std::make_unique<MemoryTracker>(r));
    ctx_.push_back(std::make_unique<RankContext>(r, recorder_.get(), cost_.get(), stepper_.get(),
                                                 memory_.back().get()));
  }
  for (int r = 0; r < n; r++) comms_.push_back(std::make_unique<RankComm>(this, r));
}

World::~World() {
  abort("the world is shutting down");
  comms_.clear();  // joins the workers before the contexts they use go away
}

bool World::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

void World::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_) {
      aborted_ = true;
      abort_reason_ = reason;
    }
  }
  aborted_flag_.store(true);
  cv_.notify_all();
  for (size_t r = 0; r < rank_cv_.size(); r++) {
    { std::lock_guard<std::mutex> lock(*rank_mu_[r]); }
    rank_cv_[r]->notify_all();
  }
  stepper_->abort();
}

void World::fail(const std::string& msg) {
  abort(msg);
  throw CommError(msg);
}

void World::fail_aborted() {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reason = aborted_ ? abort_reason_ : "stepping was stopped (the stepper was aborted)";
  }
  fail(reason);
}

void World::enter_algorithm(Rendezvous& rv) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) throw CommError(abort_reason_);
  rv.running++;
}

void World::abandon(Rendezvous& rv) {
  std::unique_lock<std::mutex> lock(mu_);
  // Every rank in the algorithm sees the abort within one slice or step (as in exit_algorithm).
  Deadline deadline(opt_.timeout_s);
  wait_under(cv_, lock, deadline, [&] { return rv.running == 0; });
}

void World::exit_algorithm(Rendezvous& rv, bool failed) {
  std::unique_lock<std::mutex> lock(mu_);
  rv.running--;
  cv_.notify_all();
  if (!failed) return;
  // Every other rank in the algorithm sees the abort within one slice or step; the bound only
  // guards against a rank stuck in something that never checks it.
  Deadline deadline(opt_.timeout_s);
  wait_under(cv_, lock, deadline, [&] { return rv.running == 0; });
  if (--rv.left == 0) rv_.erase(rv.seq);
}

void World::set_comm_activity(int rank, std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  comm_activity_[static_cast<size_t>(rank)] = std::move(what);
}

Rendezvous& World::arrive(int rank, uint64_t seq, const CollDesc& d, void* buf, const void* in,
                          double model_t) {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) throw CommError(abort_reason_);
  auto [it, fresh] = rv_.try_emplace(seq);
  Rendezvous& rv = it->second;
  if (fresh) {
    rv.desc = d;
    rv.seq = seq;
    rv.world = n_;
    rv.buf.assign(static_cast<size_t>(n_), nullptr);
    rv.in.assign(static_cast<size_t>(n_), nullptr);
    rv.scratch.assign(static_cast<size_t>(n_), nullptr);
    rv.arrival_model.assign(static_cast<size_t>(n_), 0.0);
    rv.done = std::vector<std::atomic<int64_t>>(static_cast<size_t>(n_));
    rv.steps_finished.assign(static_cast<size_t>(n_), 0);
    rv.consumed = std::vector<std::atomic<int64_t>>(static_cast<size_t>(n_));
    rv.left = n_;
    rv.node_size = cost_->profile().gpus_per_node;
    rv.steps = algorithm_steps(d, n_, rv.node_size);
    rv.slices = mover_->slice_ring_steps() ? algorithm_slices(d, n_) : 1;
  } else if (!(rv.desc == d)) {
    std::string msg = "desync: collective #" + std::to_string(seq) + " differs across ranks: rank " +
                      std::to_string(rv.arrivals.front()) + " called " + describe(rv.desc, seq) +
                      " but rank " + std::to_string(rank) + " called " + describe(d, seq) +
                      "; every rank must issue the same collectives in the same order";
    lock.unlock();
    fail(msg);
  }
  rv.arrivals.push_back(rank);
  rv.buf[static_cast<size_t>(rank)] = buf;
  rv.in[static_cast<size_t>(rank)] = in;
  rv.arrival_model[static_cast<size_t>(rank)] = model_t;
  cv_.notify_all();
  return rv;
}

RankDoing World::doing(int rank) const {
  return RankDoing{rank, comm_activity_[static_cast<size_t>(rank)], ctx_[static_cast<size_t>(rank)]->activity(),
                   skipped_[static_cast<size_t>(rank)]};
}

std::string World::diagnose_missing(const Rendezvous& rv) {
  std::vector<RankDoing> missing;
  for (int r : missing_ranks(rv.arrivals, n_)) missing.push_back(doing(r));
  return dtlab::diagnose_missing(describe(rv.desc, rv.seq), payload_bytes(rv.desc, n_), opt_.timeout_s, rv.arrivals,
                                 missing);
}

double World::wait_all_arrived(int rank, Rendezvous& rv) {
  std::unique_lock<std::mutex> lock(mu_);
  Deadline deadline(opt_.timeout_s);
  bool ok = wait_under(cv_, lock, deadline, [&] { return aborted_ || static_cast<int>(rv.arrivals.size()) == n_; });
  if (aborted_) throw CommError(abort_reason_);
  if (!ok) {
    // Diagnose the oldest collective still missing ranks: later ones stall only because of it
    // (a rank that skipped #1 waits alone in #2 while the others wait for it in #1).
    const Rendezvous* oldest = &rv;
    for (const auto& [seq, other] : rv_)
      if (static_cast<int>(other.arrivals.size()) < n_) {
        oldest = &other;
        break;
      }
    std::string msg = diagnose_missing(*oldest);
    lock.unlock();
    fail(msg);
  }
  // The collective starts (on the modeled clock) when the last rank arrives.
  return *std::max_element(rv.arrival_model.begin(), rv.arrival_model.end());
}

void World::leave(Rendezvous& rv) {
  std::lock_guard<std::mutex> lock(mu_);
  if (--rv.left == 0) rv_.erase(rv.seq);
}

// The watchdog's message for a collective that stalled inside its algorithm.
static std::string stall_message(World& w, Rendezvous& rv, int rank, const char* what) {
  return diagnose_stall(describe(rv.desc, rv.seq), rank, w.opt_.timeout_s, what, rv.steps_finished);
}

// Waits on `cv` (with the world lock held), under the watchdog, until `pred` holds.
template <class Pred>
static void bounded_wait(World& w, std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                         Rendezvous& rv, int rank, const char* what, Pred pred) {
  Deadline deadline(w.opt_.timeout_s);
  bool ok = wait_under(cv, lock, deadline, [&] { return w.aborted_ || pred(); });
  if (w.aborted_) throw CommError(w.abort_reason_);
  if (!ok) {
    std::string msg = stall_message(w, rv, rank, what);
    lock.unlock();
    w.fail(msg);
  }
}

// A ring wait: a few yields first (with more ranks than cores the neighbour often just needs the
// core), then sleep on this rank's own condition variable, under the watchdog.
constexpr int kRingYields = 8;
template <class Pred>
void World::ring_wait(Call& c, Pred ready, const char* what) {
  for (int i = 0; i < kRingYields; i++) {
    if (ready() || aborted_flag_.load()) break;
    std::this_thread::yield();
  }
  if (!ready()) {
    std::unique_lock<std::mutex> lock(*rank_mu_[static_cast<size_t>(c.rank)]);
    Deadline deadline(opt_.timeout_s);
    bool ok = wait_under(*rank_cv_[static_cast<size_t>(c.rank)], lock, deadline, [&] { return aborted_flag_.load() || ready(); });
    lock.unlock();
    if (!ok && !aborted_flag_.load()) {
      std::string msg;
      {
        std::lock_guard<std::mutex> wlock(mu_);
        msg = stall_message(*this, *c.rv, c.rank, what);
      }
      fail(msg);
    }
  }
  if (aborted_flag_.load()) {
    std::lock_guard<std::mutex> wlock(mu_);
    throw CommError(abort_reason_);
  }
}

// Unit u = step * slices + slice. Before working on u a rank needs the predecessor's result for the
// same slice one step earlier (done), and its successor to have finished reading what this rank
// sent one step earlier (consumed), because the chunk it writes may be one the successor still reads.
void World::ring_wait_ready(Call& c, int64_t unit) {
  const int pred = ring_pred(c.rank, n_);
  const int64_t need = unit - c.rv->slices + 1;
  auto ready = [&] {
    return c.rv->done[static_cast<size_t>(pred)].load(std::memory_order_acquire) >= need &&
           c.rv->consumed[static_cast<size_t>(c.rank)].load(std::memory_order_acquire) >= need;
  };
  ring_wait(c, ready, "its ring neighbours");
}

void World::ring_mark_done(Call& c, int64_t unit) {
  const int pred = ring_pred(c.rank, n_), succ = ring_succ(c.rank, n_);
  c.rv->done[static_cast<size_t>(c.rank)].store(unit + 1, std::memory_order_release);
  c.rv->consumed[static_cast<size_t>(pred)].store(unit + 1, std::memory_order_release);
  for (int t : {succ, pred}) {
    // Taking the waiter's mutex orders this store before its predicate check: no lost wake-up.
    { std::lock_guard<std::mutex> lock(*rank_mu_[static_cast<size_t>(t)]); }
    rank_cv_[static_cast<size_t>(t)]->notify_one();
  }
}

void World::ring_wait_drained(Call& c) {
  const int64_t total = static_cast<int64_t>(c.rv->steps) * c.rv->slices;
  ring_wait(c, [&] { return c.rv->consumed[static_cast<size_t>(c.rank)].load(std::memory_order_acquire) >= total; },
            "its successor to finish reading");
}

void World::step_barrier(Call& c) {
  std::unique_lock<std::mutex> lock(mu_);
  Rendezvous& rv = *c.rv;
  int64_t gen = rv.barrier_gen;
  if (++rv.barrier_count == n_) {
    rv.barrier_count = 0;
    rv.barrier_gen++;
    cv_.notify_all();
    return;
  }
  bounded_wait(*this, cv_, lock, rv, c.rank, "the other ranks to finish the step", [&] { return rv.barrier_gen != gen; });
}

bool World::step_gate(Call& c, int step) {
  RankContext* ctx = ctx_[static_cast<size_t>(c.rank)].get();
  OpRef op;
  op.group = 0;
  op.seq = static_cast<int64_t>(c.rv->seq);
  op.members = n_ >= 64 ? ~uint64_t{0} : (uint64_t{1} << n_) - 1;
  return ctx->gate_ring(kCommLane, op, step, 0, c.iteration, c.model_t,
                        "world " + describe(c.rv->desc, c.rv->seq) + ", step " + std::to_string(step));
}

namespace {

// One RingStep event: what this rank moved in a step.
struct StepRecord {
  RingPhase phase;
  int chunk, src, dst;
  int64_t bytes;
};

}  // namespace

// Records the step's events on [model_t, model_t + dt] and moves this rank's modeled clock on.
static void record_step(World& w, Call& c, int step, const std::vector<StepRecord>& records, double dt,
                        int64_t wall_begin) {
  const int64_t wall_end = w.recorder_->now_ns();
  for (const StepRecord& r : records) {
    Event e(EventKind::RingStep, Lane::Comm, wall_begin, wall_end, c.model_t, c.model_t + dt);
    e.step = RingStepInfo{c.rv->seq, r.phase, static_cast<int16_t>(step), static_cast<int16_t>(c.rv->steps),
                          static_cast<int16_t>(r.chunk), static_cast<int16_t>(r.src), static_cast<int16_t>(r.dst), r.bytes, 0};
    e.iteration = c.iteration;
    c.ctx->record(e);
  }
  c.model_t += dt;
  std::lock_guard<std::mutex> lock(w.mu_);
  c.rv->steps_finished[static_cast<size_t>(c.rank)] = step + 1;
}

void World::finish_step(Call& c, int step, RingPhase phase, int chunk, int src, int dst, int64_t bytes,
                        const std::vector<std::pair<int, int>>& transfers, double model_bytes,
                        bool reduce, int64_t wall_begin) {
  record_step(*this, c, step, {{phase, chunk, src, dst, bytes}}, cost_->step_time(transfers, model_bytes, reduce),
              wall_begin);
}

void World::finish_plan_step(Call& c, int step, const std::vector<StepTransfer>& plan, int64_t wall_begin) {
  const int64_t count = c.rv->desc.count, esize = dtype_size(c.rv->desc.dtype);
  const bool blocks = c.rv->desc.op == CollectiveOp::AllToAll;  // each transfer moves a whole block of `count`
  std::vector<std::pair<int, int>> pairs;
  std::vector<StepRecord> records;
  bool reduce = false;
  for (const StepTransfer& t : plan) {
    pairs.push_back({t.src, t.dst});
    reduce = reduce || t.reduce;
    if (t.dst != c.rank && !(t.src == c.rank && t.dst == kNetworkSwitch)) continue;
    const auto [lo, hi] = blocks ? std::pair<int64_t, int64_t>{0, count} : transfer_elements(t, count);
    records.push_back({t.phase, t.chunk, t.src, t.dst, (hi - lo) * esize});
  }
  if (records.empty()) records.push_back({plan.empty() ? RingPhase::None : plan.front().phase, -1, -1, -1, 0});
  // Every transfer of a step moves one chunk of the same size (up to an element): the model's S / chunks.
  const double model_bytes = plan.empty() ? 0.0 : blocks ? static_cast<double>(count * esize)
                                                         : static_cast<double>(count * esize) / std::max(1, plan.front().chunks);
  record_step(*this, c, step, records, cost_->step_time(pairs, model_bytes, reduce), wall_begin);
}

}  // namespace threads

// ---------------------------------------------------------------------------------------------
// The public facade.

struct ThreadsWorld::Impl {
  threads::World world;
  Impl(int n, WorldOptions o) : world(n, std::move(o)) {}
};

ThreadsWorld::ThreadsWorld(int world_size, WorldOptions options)
    : impl_(std::make_unique<Impl>(world_size, std::move(options))) {}
ThreadsWorld::~ThreadsWorld() = default;

int ThreadsWorld::world_size() const { return impl_->world.n_; }
const WorldOptions& ThreadsWorld::options() const { return impl_->world.opt_; }
Communicator& ThreadsWorld::comm(int rank) { return *impl_->world.comms_.at(static_cast<size_t>(rank)); }
RankContext& ThreadsWorld::context(int rank) { return *impl_->world.ctx_.at(static_cast<size_t>(rank)); }
MemoryTracker& ThreadsWorld::memory(int rank) { return *impl_->world.memory_.at(static_cast<size_t>(rank)); }
TraceRecorder& ThreadsWorld::recorder() { return *impl_->world.recorder_; }
Stepper& ThreadsWorld::stepper() { return *impl_->world.stepper_; }
const CostModel& ThreadsWorld::cost() const { return *impl_->world.cost_; }
void ThreadsWorld::abort(const std::string& reason) { impl_->world.abort(reason); }

namespace {

// Waits until every rank's function has returned. A rank in a collective or at a gate returns soon
// after the world fails (the abort wakes it); one in compute at its next collective. One that has
// not returned within opt_.return_limit_s of the failure is stuck (WorldOptions::return_limit_s).
void wait_for_ranks(threads::World& w, std::mutex& mu, std::condition_variable& cv, const std::vector<char>& returned) {
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> failed_at;
  bool reported = false;
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    if (std::all_of(returned.begin(), returned.end(), [](char c) { return c != 0; })) return;
    cv.wait_for(lock, std::chrono::milliseconds(100));
    if (!failed_at) {
      std::lock_guard<std::mutex> world_lock(w.mu_);
      if (w.aborted_) failed_at = Clock::now();
    }
    if (reported || !failed_at || Clock::now() - *failed_at <= std::chrono::duration<double>(w.opt_.return_limit_s)) continue;
    std::string stuck;
    for (size_t r = 0; r < returned.size(); r++)
      if (!returned[r])
        stuck += (stuck.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " (" + w.ctx_[r]->activity() + ")";
    std::string reason;
    {
      std::lock_guard<std::mutex> world_lock(w.mu_);
      reason = w.abort_reason_;
    }
    char limit[32];
    std::snprintf(limit, sizeof limit, "%g", w.opt_.return_limit_s);
    const std::string diagnosis = "the run failed (" + reason + "), and " + stuck + " did not return within " + limit +
                                  " s of it; a rank stuck where no abort reaches it (out of memory inside OpenBLAS, "
                                  "for one) cannot be stopped, so the process ends here";
    if (!w.opt_.on_stuck) {
      std::fprintf(stderr, "dtlab: %s\n", diagnosis.c_str());
      std::fflush(stderr);
      std::_Exit(3);
    }
    reported = true;
    lock.unlock();  // the handler may free the stuck rank, which then takes this lock to say so
    w.opt_.on_stuck(diagnosis);
    lock.lock();
  }
}

}  // namespace

void ThreadsWorld::run(const std::function<void(int, Communicator&, RankContext&)>& fn) {
  threads::World& w = impl_->world;
  std::vector<std::string> errors(static_cast<size_t>(w.n_));
  std::vector<char> comm_error(static_cast<size_t>(w.n_), 0);  // not vector<bool>: ranks write it at once
  std::vector<char> stopped(static_cast<size_t>(w.n_), 0);     // the rank raised RunStopped
  std::vector<std::thread> ts;
  // Ranks whose function has returned (or thrown), counted as their threads end, so that the wait
  // below has a deadline once the world has failed.
  std::mutex returned_mu;
  std::condition_variable returned_cv;
  std::vector<char> returned(static_cast<size_t>(w.n_), 0);
  // The stepper waits only for live ranks when it settles: each rank is live while its function runs.
  for (int r = 0; r < w.n_; r++) w.stepper_->rank_started(r);
  // The sentence of a rank that ran out of memory (its allocation, or a thread it started), with
  // where it was: the others stop at their next collective.
  auto out_of_memory = [&](int r, const std::string& what) {
    const std::string where = context(r).activity();
    mark_out_of_memory();
    errors[static_cast<size_t>(r)] =
        what + (where.empty() || where == "idle" ? std::string() : " (its last activity: " + where + ")") +
        ": the run needs more memory than this machine gives it; use a smaller --model, --batch or --world";
    w.abort("rank " + std::to_string(r) + " ran " + errors[static_cast<size_t>(r)]);
  };
  const auto body = [&](int r) {
      struct Done {
        threads::World& w;
        int r;
        std::mutex& mu;
        std::condition_variable& cv;
        std::vector<char>& returned;
        ~Done() {
          w.stepper_->rank_done(r);
          std::lock_guard<std::mutex> lock(mu);
          returned[static_cast<size_t>(r)] = 1;
          cv.notify_all();
        }
      } done{w, r, returned_mu, returned_cv, returned};
      try {
        fn(r, comm(r), context(r));
        context(r).set_activity("returned from its rank function");
      } catch (const CommError& e) {
        errors[static_cast<size_t>(r)] = e.what();
        comm_error[static_cast<size_t>(r)] = 1;
        // A diagnosis raised above the communicator (DDP's reducer watchdog) ends the run too.
        w.abort(e.what());
      } catch (const RunStopped& e) {
        errors[static_cast<size_t>(r)] = e.what();
        stopped[static_cast<size_t>(r)] = 1;
        w.abort(e.what());
      } catch (const std::bad_alloc&) {  // its model, optimizer state, buffers
        out_of_memory(r, "out of memory");
      } catch (const std::system_error& e) {
        if (e.code() != std::errc::resource_unavailable_try_again) {
          errors[static_cast<size_t>(r)] = e.what();
          w.abort("rank " + std::to_string(r) + " failed: " + e.what());
        } else {  // a thread it started (a communicator's worker) found no memory for its stack
          out_of_memory(r, "out of memory (no room for a thread's stack)");
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        w.abort("rank " + std::to_string(r) + " failed: " + e.what());
      }
  };
  ts.reserve(static_cast<size_t>(w.n_));
  for (int r = 0; r < w.n_; r++) {
    try {
      ts.emplace_back(body, r);
    } catch (const std::system_error& e) {  // no memory for another thread's stack, or too many threads
      mark_out_of_memory();
      const std::string why = "could not start rank " + std::to_string(r) + "'s thread (" + e.what() +
                              "): out of memory or too many threads; use a smaller --world or --model";
      w.abort(why);
      for (int q = r; q < w.n_; q++) {
        w.stepper_->rank_done(q);
        std::lock_guard<std::mutex> lock(returned_mu);
        returned[static_cast<size_t>(q)] = 1;
      }
      wait_for_ranks(w, returned_mu, returned_cv, returned);
      for (auto& t : ts) t.join();
      throw Error(why);
    }
  }
  wait_for_ranks(w, returned_mu, returned_cv, returned);
  for (auto& t : ts) t.join();
  // The world's own abort reason is the root cause (the watchdog's or desync diagnosis).
  std::string root;
  {
    std::lock_guard<std::mutex> lock(w.mu_);
    root = w.aborted_ ? w.abort_reason_ : "";
  }
  // A stop every rank agreed on (RunStopped) is the run's sentence, not one rank's failure.
  for (int r = 0; r < w.n_; r++)
    if (stopped[static_cast<size_t>(r)]) throw RunStopped(errors[static_cast<size_t>(r)]);
  for (int r = 0; r < w.n_; r++) {
    if (errors[static_cast<size_t>(r)].empty()) continue;
    if (!comm_error[static_cast<size_t>(r)]) throw Error("rank " + std::to_string(r) + ": " + errors[static_cast<size_t>(r)]);
  }
  for (int r = 0; r < w.n_; r++)
    if (!errors[static_cast<size_t>(r)].empty()) throw CommError(root.empty() ? errors[static_cast<size_t>(r)] : root);
}

WorldStatus ThreadsWorld::status() const {
  threads::World& w = impl_->world;
  WorldStatus s;
  std::lock_guard<std::mutex> lock(w.mu_);
  for (const auto& [seq, rv] : w.rv_) {
    CollectiveStatus c;
    c.seq = seq;
    c.op = rv.desc.op;
    c.algo = rv.desc.algo;
    c.dtype = rv.desc.dtype;
    c.bytes = payload_bytes(rv.desc, w.n_);
    c.arrived = rv.arrivals;
    c.missing = missing_ranks(rv.arrivals, w.n_);
    c.steps = rv.steps;
    c.steps_done = *std::min_element(rv.steps_finished.begin(), rv.steps_finished.end());
    s.in_flight.push_back(std::move(c));
  }
  for (int r = 0; r < w.n_; r++) {
    s.compute_activity.push_back(w.ctx_[static_cast<size_t>(r)]->activity());
    s.comm_activity.push_back(w.comm_activity_[static_cast<size_t>(r)]);
  }
  s.failed = w.aborted_;
  s.error = w.abort_reason_;
  return s;
}

}  // namespace dtlab
