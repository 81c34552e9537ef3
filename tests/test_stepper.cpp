// The stepper driving a threads world: ranks run in the background while the test thread pauses
// them and advances one iteration, one collective or one ring step at a time, reading the gates,
// the collectives in flight and the trace after each command. Every wait here is bounded: on a
// timeout the world is aborted (which opens every gate) and the test fails instead of hanging.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/comm/group.h"
#include "engine/comm/threads_backend.h"
#include "engine/core/device.h"
#include "engine/trace/event.h"

using namespace dtlab;

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kPatience = 15;  // seconds; generous for sanitizer builds
constexpr auto kPatienceMs = std::chrono::milliseconds(15000);

using RankFn = std::function<void(int, Communicator&, RankContext&)>;

// w.run(fn) on a background thread. finish() waits a bounded time; the destructor never hangs.
class Background {
 public:
  Background(ThreadsWorld& w, RankFn fn) : w_(w), fn_(std::move(fn)), t_([this] { body(); }) {}
  ~Background() {
    if (!done_) w_.abort("the test ended early");
    t_.join();
  }
  // True if run() returned within the patience; error() then says whether it threw.
  bool finish(double timeout_s = kPatience) {
    auto t0 = Clock::now();
    while (!done_ && std::chrono::duration<double>(Clock::now() - t0).count() < timeout_s)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!done_) w_.abort("the test timed out waiting for run() to finish");
    return done_;
  }
  bool done() const { return done_; }
  std::string error() const { return done_ ? error_ : "still running"; }

 private:
  void body() {
    try {
      w_.run(fn_);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    done_ = true;
  }
  ThreadsWorld& w_;
  RankFn fn_;
  std::string error_;
  std::atomic<bool> done_{false};
  std::thread t_;
};

// Polls pred until it holds or the patience runs out.
bool eventually(const std::function<bool()>& pred, double timeout_s = kPatience) {
  auto t0 = Clock::now();
  while (!pred()) {
    if (std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// The stepper's pending item is `kind` (for an operation: the world's collective #seq; for a ring
// step: its step; for an iteration: which), with every one of its members at its gate.
bool pending_is(ThreadsWorld& w, GateKind kind, int64_t seq = -1, int step = -1) {
  StepperState s = w.stepper().state();
  const PendingItem& p = s.pending;
  if (!p.valid || p.kind != kind || !p.missing.empty()) return false;
  if (kind == GateKind::Iteration) return p.gate.iteration == seq;
  if (kind == GateKind::Collective || kind == GateKind::RingStep)
    if (p.gate.op.seq != seq || p.gate.op.group != 0) return false;
  return kind != GateKind::RingStep || p.gate.step == step;
}

bool wait_pending(ThreadsWorld& w, GateKind kind, int64_t seq = -1, int step = -1) {
  return eventually([&] { return pending_is(w, kind, seq, step); });
}

// The world has settled on its next item (what the next step releases).
bool settled(ThreadsWorld& w) { return w.stepper().state().settled(); }

size_t count(ThreadsWorld& w, int rank, EventKind kind) {
  std::vector<Event> evs = w.recorder().events(rank);
  return static_cast<size_t>(std::count_if(evs.begin(), evs.end(), [&](const Event& e) { return e.kind == kind; }));
}

// Every rank has exactly `want` events of this kind.
bool counts_are(ThreadsWorld& w, EventKind kind, size_t want) {
  for (int r = 0; r < w.world_size(); r++)
    if (count(w, r, kind) != want) return false;
  return true;
}

WorldOptions paused_options(double timeout_s = 10) {
  WorldOptions o;
  o.timeout_s = timeout_s;
  o.start_paused = true;
  o.trace_capacity = 4096;
  return o;
}

// Each rank: `iterations` iterations of one all-reduce of `count` floats (sum), checked at the end.
RankFn allreduce_loop(int iterations, int64_t count, std::atomic<int>& wrong) {
  return [=, &wrong](int r, Communicator& c, RankContext& ctx) {
    std::vector<float> buf(static_cast<size_t>(count));
    for (int it = 0; it < iterations; it++) {
      std::fill(buf.begin(), buf.end(), float(r + 1));
      ctx.begin_iteration(it);
      c.all_reduce(buf.data(), count, DType::F32, ReduceOp::Sum, Algorithm::Ring)->wait();
      ctx.end_iteration();
      const int n = c.world_size();
      for (float v : buf) wrong += v != float(n * (n + 1) / 2);
    }
  };
}

}  // namespace

TEST_SUITE("stepper") {

TEST_CASE("paused world: step by iteration, operation and ring step, then run to the end") {
  const int n = 4, steps = 2 * (n - 1);
  ThreadsWorld w(n, paused_options());
  std::atomic<int> wrong{0};
  Background bg(w, allreduce_loop(3, 1000, wrong));

  // Every rank waits at its first iteration gate, before issuing collective #0.
  REQUIRE(w.stepper().wait_until_settled(kPatienceMs));
  REQUIRE(wait_pending(w, GateKind::Iteration, 0));
  StepperState s = w.stepper().state();
  CHECK(s.paused);
  REQUIRE(s.gates.size() == size_t(kStepperLanes * n));
  for (int r = 0; r < n; r++) {
    const RankGateState& g = s.gates[size_t(r * kStepperLanes)];
    CHECK(g.blocked);
    CHECK(g.gate.kind == GateKind::Iteration);
    CHECK(g.gate.iteration == 0);
    CHECK(g.lane == kComputeLane);
    CHECK(!s.gates[size_t(r * kStepperLanes + kCommLane)].blocked);  // nothing issued, the comm worker is idle
  }
  CHECK(s.pending.members == std::vector<int>{0, 1, 2, 3});
  CHECK(counts_are(w, EventKind::Collective, 0));
  CHECK(counts_are(w, EventKind::CollectiveIssue, 0));
  CHECK(w.status().in_flight.empty());

  SUBCASE("iteration, then operation by operation, then ring step by ring step") {
    // step(Iteration): all of iteration 0, stopping at iteration 1's gate.
    w.stepper().step(GateKind::Iteration);
    REQUIRE(wait_pending(w, GateKind::Iteration, 1));
    CHECK(counts_are(w, EventKind::Collective, 1));
    CHECK(counts_are(w, EventKind::RingStep, size_t(steps)));
    CHECK(counts_are(w, EventKind::Iteration, 1));

    // step(Collective) from an iteration gate: up to collective #1's gate, which every rank reached
    // (it issued the call, and waits for the others before any of them runs it).
    w.stepper().step(GateKind::Collective);
    REQUIRE(wait_pending(w, GateKind::Collective, 1));
    CHECK(counts_are(w, EventKind::Collective, 1));
    CHECK(counts_are(w, EventKind::CollectiveIssue, 2));
    for (int k = 1; k <= 2; k++) {
      CAPTURE(k);
      const PendingItem p = w.stepper().state().pending;
      CHECK(p.gate.op.seq == k);
      CHECK(p.gate.label.find("world #" + std::to_string(k) + " allreduce of 1000 float32") == 0);
      CHECK(p.arrived == std::vector<int>{0, 1, 2, 3});
      CHECK(p.members == std::vector<int>{0, 1, 2, 3});
      CHECK(w.status().in_flight.empty());  // held before anyone runs it
      if (k == 2) break;
      // One step(Collective): exactly one more collective completes on every rank.
      w.stepper().step(GateKind::Collective);
      REQUIRE(wait_pending(w, GateKind::Collective, k + 1));
      CHECK(counts_are(w, EventKind::Collective, size_t(k + 1)));
      CHECK(counts_are(w, EventKind::RingStep, size_t((k + 1) * steps)));
    }

    // Collective #2 ring step by ring step: +1 RingStep event per rank per command.
    w.stepper().step(GateKind::RingStep);  // releases the collective, stops before its step 0
    REQUIRE(wait_pending(w, GateKind::RingStep, 2, 0));
    CHECK(counts_are(w, EventKind::RingStep, size_t(2 * steps)));
    for (int st = 0; st < 3; st++) {
      CAPTURE(st);
      w.stepper().step(GateKind::RingStep);
      REQUIRE(wait_pending(w, GateKind::RingStep, 2, st + 1));
      CHECK(counts_are(w, EventKind::RingStep, size_t(2 * steps + st + 1)));
      CHECK(counts_are(w, EventKind::Collective, 2));
      WorldStatus ws = w.status();
      REQUIRE(ws.in_flight.size() == 1);
      CHECK(ws.in_flight[0].steps_done == st + 1);
    }
    const StepperState mid = w.stepper().state();
    for (int r = 0; r < n; r++) {  // the comm workers wait at step 3 (from 0); the compute lanes inside wait()
      CHECK(mid.gates[size_t(r * kStepperLanes + kCommLane)].blocked);
      CHECK(mid.gates[size_t(r * kStepperLanes + kCommLane)].gate.step == 3);
      CHECK(!mid.gates[size_t(r * kStepperLanes)].blocked);
    }
  }

  SUBCASE("ring steps across a collective boundary land on the next collective's gate") {
    w.stepper().step(GateKind::RingStep);  // iteration gate -> collective #0's gate
    REQUIRE(wait_pending(w, GateKind::Collective, 0));
    for (int st = 0; st <= steps; st++) {
      CAPTURE(st);
      w.stepper().step(GateKind::RingStep);
      if (st < steps) REQUIRE(wait_pending(w, GateKind::RingStep, 0, st));
      else REQUIRE(wait_pending(w, GateKind::Collective, 1));
      CHECK(counts_are(w, EventKind::RingStep, size_t(st)));
    }
    CHECK(counts_are(w, EventKind::Collective, 1));
  }

  w.stepper().run();
  REQUIRE(bg.finish());
  CHECK(bg.error() == "");
  CHECK(wrong == 0);
  CHECK(counts_are(w, EventKind::Collective, 3));
  CHECK(counts_are(w, EventKind::RingStep, size_t(3 * steps)));
  CHECK(counts_are(w, EventKind::Iteration, 3));
  CHECK(!w.stepper().state().paused);
}

// Regression: step() once left released gates marked blocked until their threads woke, so a second
// quick step() picked a stale gate as pending and did nothing (two clicks, one ring step). Now
// commands given while the world moves add up.
TEST_CASE("two quick ring steps advance two ring steps") {
  ThreadsWorld w(4, paused_options());
  std::atomic<int> wrong{0};
  Background bg(w, allreduce_loop(1, 1000, wrong));
  REQUIRE(w.stepper().wait_until_settled(kPatienceMs));
  w.stepper().step(GateKind::RingStep);  // iteration gate -> collective gate
  REQUIRE(wait_pending(w, GateKind::Collective, 0));
  w.stepper().step(GateKind::RingStep);
  REQUIRE(wait_pending(w, GateKind::RingStep, 0, 0));
  w.stepper().step(GateKind::RingStep);
  w.stepper().step(GateKind::RingStep);
  CHECK(wait_pending(w, GateKind::RingStep, 0, 2));
  w.stepper().run();
  REQUIRE(bg.finish());
}

// The same regression, seen through wait_until_settled().
TEST_CASE("wait_until_settled after a step reports the next item, not the released one") {
  ThreadsWorld w(4, paused_options());
  std::atomic<int> wrong{0};
  Background bg(w, allreduce_loop(3, 1000, wrong));
  REQUIRE(w.stepper().wait_until_settled(kPatienceMs));
  for (int k = 0; k < 3; k++) {
    CAPTURE(k);
    w.stepper().step(GateKind::Collective);
    REQUIRE(w.stepper().wait_until_settled(kPatienceMs));
    CHECK(pending_is(w, GateKind::Collective, k));
    w.stepper().step(GateKind::Iteration);
    if (k < 2) {
      REQUIRE(w.stepper().wait_until_settled(kPatienceMs));
      CHECK(pending_is(w, GateKind::Iteration, k + 1));
    }
  }
  w.stepper().run();
  REQUIRE(bg.finish());
}

TEST_CASE("tree and naive collectives step one algorithm step at a time, with their progress in status") {
  for (Algorithm algo : {Algorithm::Tree, Algorithm::Naive}) {
    CAPTURE(algorithm_name(algo));
    const int n = 5;
    ThreadsWorld w(n, paused_options());
    std::atomic<int> wrong{0};
    Background bg(w, [&](int r, Communicator& c, RankContext&) {
      std::vector<float> buf(100, float(r));
      c.broadcast(buf.data(), 100, DType::F32, 2, algo)->wait();
      for (float v : buf) wrong += v != 2.0f;
    });
    const int steps = algo == Algorithm::Tree ? 3 : n - 1;
    REQUIRE(wait_pending(w, GateKind::Collective, 0));  // every rank called it; none runs it yet
    w.stepper().step(GateKind::RingStep);
    REQUIRE(wait_pending(w, GateKind::RingStep, 0, 0));
    for (int st = 0; st + 1 < steps; st++) {
      CAPTURE(st);
      w.stepper().step(GateKind::RingStep);
      REQUIRE(wait_pending(w, GateKind::RingStep, 0, st + 1));
      CHECK(counts_are(w, EventKind::RingStep, size_t(st + 1)));
      WorldStatus ws = w.status();
      REQUIRE(ws.in_flight.size() == 1);
      CHECK(ws.in_flight[0].steps == steps);
      CHECK(ws.in_flight[0].steps_done == st + 1);
    }
    w.stepper().run();
    REQUIRE(bg.finish());
    CHECK(bg.error() == "");
    CHECK(wrong == 0);
    CHECK(counts_are(w, EventKind::RingStep, size_t(steps)));
  }
}

// Regression: steps_done ("by the slowest rank") once followed only the ring protocol's counters,
// so tree, naive and all-to-all collectives showed 0 steps done throughout.
TEST_CASE("status steps_done advances for tree steps too") {
  const int n = 4;
  ThreadsWorld w(n, paused_options());
  Background bg(w, [&](int r, Communicator& c, RankContext&) {
    std::vector<float> buf(100, float(r));
    c.broadcast(buf.data(), 100, DType::F32, 0, Algorithm::Tree)->wait();
  });
  REQUIRE(wait_pending(w, GateKind::Collective, 0));
  w.stepper().step(GateKind::RingStep);
  REQUIRE(wait_pending(w, GateKind::RingStep, 0, 0));
  w.stepper().step(GateKind::RingStep);
  REQUIRE(wait_pending(w, GateKind::RingStep, 0, 1));
  WorldStatus ws = w.status();
  REQUIRE(ws.in_flight.size() == 1);
  CHECK(ws.in_flight[0].steps_done == 1);
  w.stepper().run();
  REQUIRE(bg.finish());
}

TEST_CASE("determinism: the same program twice, free-running or stepped, gives the same trace") {
  // (rank, kind, seq, step, chunk, src) per event, and the modeled times.
  using Key = std::tuple<int, int, uint64_t, int, int, int, double, double>;
  auto program = [](int r, Communicator& c, RankContext& ctx) {
    const int n = c.world_size();
    std::vector<float> a(1001, float(r)), in(static_cast<size_t>(300 * n), 1.0f), out(300);
    for (int it = 0; it < 2; it++) {
      ctx.begin_iteration(it);
      c.all_reduce(a.data(), 1001, DType::F32, ReduceOp::Sum, Algorithm::Ring)->wait();
      c.all_reduce(a.data(), 1001, DType::F32, ReduceOp::Max, Algorithm::Tree)->wait();
      c.reduce_scatter(out.data(), in.data(), 300, DType::F32, ReduceOp::Sum)->wait();
      c.broadcast(a.data(), 1001, DType::F32, 1, Algorithm::Naive)->wait();
      c.reduce(a.data(), 1001, DType::F32, ReduceOp::Sum, 2, Algorithm::Tree)->wait();
      ctx.end_iteration();
    }
  };
  auto trace = [&](bool stepped) {
    WorldOptions o = paused_options();
    o.start_paused = stepped;
    ThreadsWorld w(4, o);
    Background bg(w, program);
    if (stepped) {  // one ring step at a time until the program ends
      auto t0 = Clock::now();
      while (!bg.done() && std::chrono::duration<double>(Clock::now() - t0).count() < 2 * kPatience) {
        w.stepper().step(GateKind::RingStep);
        eventually([&] { return bg.done() || settled(w); });
      }
    }
    REQUIRE(bg.finish());
    CHECK(bg.error() == "");
    std::vector<std::vector<Key>> per_rank(4);
    for (int r = 0; r < 4; r++)
      for (const Event& e : w.recorder().events(r)) {
        Key k{e.rank, int(e.kind), 0, -9, -9, -9, e.model_begin, e.model_end};
        if (e.kind == EventKind::RingStep) k = {e.rank, int(e.kind), e.step.seq, e.step.step, e.step.chunk, e.step.src, e.model_begin, e.model_end};
        else if (e.kind == EventKind::Collective || e.kind == EventKind::CollectiveIssue) std::get<2>(k) = e.coll.seq;
        per_rank[size_t(r)].push_back(k);
      }
    return per_rank;
  };
  auto first = trace(false);
  auto second = trace(false);
  auto stepped = trace(true);
  for (int r = 0; r < 4; r++) {
    CAPTURE(r);
    CHECK(first[size_t(r)].size() > 40);
    CHECK(first[size_t(r)] == second[size_t(r)]);
    CHECK(first[size_t(r)] == stepped[size_t(r)]);  // pausing never changes the modeled clock
  }
}

TEST_CASE("paused longer than the watchdog timeout: no watchdog, the run completes") {
  const int n = 3;
  ThreadsWorld w(n, paused_options(0.3));
  std::atomic<int> wrong{0};
  Background bg(w, allreduce_loop(2, 1000, wrong));
  REQUIRE(w.stepper().wait_until_settled(kPatienceMs));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // at the iteration gate
  w.stepper().step(GateKind::Collective);
  REQUIRE(wait_pending(w, GateKind::Collective, 0));
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // every rank called it, held at its gate
  w.stepper().step(GateKind::RingStep);
  REQUIRE(wait_pending(w, GateKind::RingStep, 0, 0));
  w.stepper().step(GateKind::RingStep);
  REQUIRE(wait_pending(w, GateKind::RingStep, 0, 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // mid-ring
  CHECK(!w.status().failed);
  w.stepper().run();
  REQUIRE(bg.finish());
  CHECK(bg.error() == "");
  CHECK(wrong == 0);
}

TEST_CASE("pause() in the middle of a running world holds it without tripping the watchdog") {
  const int n = 4;
  WorldOptions o = paused_options(0.3);
  o.start_paused = false;
  ThreadsWorld w(n, o);
  std::atomic<int> wrong{0}, stop{0};
  // Loops until the test raises `stop`; the flag rides in the all-reduce so all ranks agree when.
  Background bg(w, [&](int r, Communicator& c, RankContext& ctx) {
    std::vector<float> buf(4097);
    for (int it = 0;; it++) {
      std::fill(buf.begin(), buf.end() - 1, float(r + 1));
      buf.back() = float(stop.load());
      ctx.begin_iteration(it);
      c.all_reduce(buf.data(), 4097)->wait();
      ctx.end_iteration();
      for (size_t i = 0; i + 1 < buf.size(); i++) wrong += buf[i] != float(n * (n + 1) / 2);
      if (buf.back() > 0) break;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  w.stepper().pause();
  // Wherever the ranks were, each comes to rest at some gate on some lane.
  CHECK((bg.done() || w.stepper().wait_until_settled(kPatienceMs)));
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  CHECK(!w.status().failed);
  CHECK(!bg.done());
  w.stepper().run();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  stop = 1;
  REQUIRE(bg.finish());
  CHECK(bg.error() == "");
  CHECK(wrong == 0);
  CHECK(count(w, 0, EventKind::Collective) > 1);
}

// Issue 34's CI: pause() landed while the ranks crossed an iteration's gate. The two that had
// passed went on to the all-reduce's gate and were held there; the two behind were held at the
// iteration's, which waited for the first two: nothing could ever be released. An iteration passed
// alone is now owed to the rest, like an operation.
TEST_CASE("pause() between the ranks' iteration gates still settles on the next operation") {
  const int n = 4;
  WorldOptions o = paused_options();
  o.start_paused = false;
  ThreadsWorld w(n, o);
  std::atomic<int> wrong{0}, past{0}, go{0};
  auto hold = [&] { return eventually([&] { return go.load() > 0; }); };
  Background bg(w, [&](int r, Communicator& c, RankContext& ctx) {
    std::vector<float> buf(64, float(r + 1));
    if (r >= 2 && !hold()) return;  // ranks 2 and 3 reach the iteration only after the pause
    ctx.begin_iteration(0);
    if (r < 2) {
      past++;
      if (!hold()) return;
    }
    c.all_reduce(buf.data(), 64)->wait();
    ctx.end_iteration();
    for (float v : buf) wrong += v != float(n * (n + 1) / 2);
  });
  REQUIRE(eventually([&] { return past.load() == 2; }));  // ranks 0 and 1 are past iteration 0's gate
  w.stepper().pause();
  go = 1;
  REQUIRE(w.stepper().wait_until_settled(kPatienceMs));
  CHECK(pending_is(w, GateKind::Collective, 0));
  CHECK(w.stepper().state().waiting == "");
  w.stepper().run();
  REQUIRE(bg.finish());
  CHECK(bg.error() == "");
  CHECK(wrong == 0);
}

// Issue 34's CI: a lesson read the bytes rank 0 sent in the all-reduce a step released, and found
// one ring step missing: the compute lanes had already reached the next operation's gate while
// the comm workers still ran the last ring step. A settled world has finished what it released.
TEST_CASE("after step(Collective) every ring step of the released all-reduce is in the trace") {
  const int n = 4;
  ThreadsWorld w(n, paused_options());
  Background bg(w, [&](int r, Communicator& c, RankContext& ctx) {
    std::vector<float> a(1 << 16, float(r)), b(8, float(r));
    ctx.begin_iteration(0);
    WorkPtr big = c.all_reduce(a.data(), static_cast<int64_t>(a.size()));  // async: the rank goes on
    c.all_reduce(b.data(), 8)->wait();
    big->wait();
    ctx.end_iteration();
  });
  REQUIRE(wait_pending(w, GateKind::Iteration, 0));
  w.stepper().step(GateKind::Collective);
  REQUIRE(wait_pending(w, GateKind::Collective, 0));
  w.stepper().step(GateKind::Collective);  // releases #0, the big one; stops before #1
  REQUIRE(wait_pending(w, GateKind::Collective, 1));
  // 2(n-1) ring steps, each recorded by its receiver: every rank received all of them.
  for (int r = 0; r < n; r++) CHECK(count(w, r, EventKind::RingStep) == size_t(2 * (n - 1)));
  w.stepper().run();
  REQUIRE(bg.finish());
  CHECK(bg.error() == "");
}

TEST_CASE("a running stepper with speed > 0 paces the ranks and completes") {
  const int n = 3;
  WorldOptions o = paused_options();
  ThreadsWorld w(n, o);
  std::atomic<int> wrong{0};
  Background bg(w, allreduce_loop(5, 1000, wrong));
  w.stepper().run(0.05);  // 0.05 modeled seconds per wall second: ~20 us modeled per step -> ~0.4 ms
  StepperState s = w.stepper().state();
  CHECK(!s.paused);
  CHECK(s.speed == doctest::Approx(0.05));
  REQUIRE(bg.finish());
  CHECK(bg.error() == "");
  CHECK(wrong == 0);
  CHECK(counts_are(w, EventKind::Collective, 5));
}

}  // TEST_SUITE

namespace {

// A stand-in for the monitor's feed: records what it is asked, answers `open`.
struct FakeRelay : dtlab::GateRelay {
  std::vector<dtlab::GateInfo> asked;
  std::vector<int> done;
  bool open = true, held = false, cancelled = false;
  bool gate(int, int, const dtlab::GateInfo& g) override {
    asked.push_back(g);
    return open && !cancelled;
  }
  void rank_done(int rank) override { done.push_back(rank); }
  void cancel() override { cancelled = true; }
  bool holding() const override { return held; }
};

dtlab::GateInfo world_op_gate(int64_t seq, dtlab::GateKind kind = dtlab::GateKind::Collective, int step = -1) {
  dtlab::GateInfo g;
  g.kind = kind;
  g.op.seq = seq;
  g.op.members = 3;
  g.step = step;
  return g;
}

}  // namespace

TEST_SUITE("stepper") {

TEST_CASE("a relayed stepper forwards its gates, reports the remote hold as paused, and cancels on abort") {
  dtlab::Stepper st(2);
  FakeRelay relay;
  st.set_relay(&relay);
  CHECK(st.gate(1, 1, world_op_gate(3)));
  REQUIRE(relay.asked.size() == 1);
  CHECK(relay.asked[0].op.seq == 3);
  CHECK(relay.asked[0].kind == dtlab::GateKind::Collective);
  relay.open = false;
  CHECK_FALSE(st.gate(1, 1, world_op_gate(3, dtlab::GateKind::RingStep, 0)));
  st.rank_done(1);
  CHECK(relay.done == std::vector<int>{1});
  // Watchdogs ask paused(): with a relay it is "one of my gates waits for the deciding stepper".
  CHECK_FALSE(st.paused());
  relay.held = true;
  CHECK(st.paused());
  st.abort();
  CHECK(relay.cancelled);
  CHECK_FALSE(st.gate(1, 1, world_op_gate(4)));
  CHECK(relay.asked.size() == 2);  // an aborted stepper does not ask
  st.set_relay(nullptr);
  CHECK_FALSE(st.paused());
}

// A GPU rank's device timer stands in: it counts the flushes a wait asks for.
struct CountingTimer : DeviceTimer {
  std::atomic<int> flushes{0};
  void compute_begin(ComputeKind, int, OpCost) override {}
  void compute_end() override {}
  int flush() override { return ++flushes; }
};

TEST_CASE("a paused rank about to wait for its comm lane hands over its device timer's events, a running one does not") {
  Stepper st(1, /*start_paused=*/true);
  RankContext ctx(0, nullptr, nullptr, &st, nullptr);
  CountingTimer t;
  ctx.before_wait();  // nothing attached: nothing to do
  {
    const RankContext::TimerAttachment a(&ctx, &t);
    ctx.before_wait();
    CHECK(t.flushes == 1);
    std::thread other([&] { ctx.before_wait(); });  // not the rank's thread: the timer is not its
    other.join();
    CHECK(t.flushes == 1);
    st.run();
    ctx.before_wait();  // running: no host synchronisation added to a wait
    CHECK(t.flushes == 1);
    st.pause();
    ctx.before_wait();
    CHECK(t.flushes == 2);
  }
  ctx.before_wait();  // detached at the attachment's end
  CHECK(t.flushes == 2);
}

TEST_CASE("in a paused world, a rank held before a collective has flushed its device timer first") {
  const int n = 3;
  ThreadsWorld w(n, paused_options());
  std::vector<CountingTimer> timers(n);
  std::atomic<int> waited{0};
  Background bg(w, [&](int r, Communicator& c, RankContext& ctx) {
    const RankContext::TimerAttachment a(&ctx, &timers[size_t(r)]);
    std::vector<float> v(64, float(r));
    WorkPtr work = c.all_reduce(v.data(), 64, DType::F32, ReduceOp::Sum);
    work->wait();
    waited++;
  });
  // The collective is held at its gate: every rank's compute thread waits there, having flushed
  // once on the way in; none got past it.
  REQUIRE(eventually([&] {
    for (const CountingTimer& t : timers)
      if (t.flushes == 0) return false;
    return true;
  }));
  CHECK(waited == 0);
  w.stepper().run();
  REQUIRE(bg.finish());
  CHECK(bg.error() == "");
  CHECK(waited == n);
  for (const CountingTimer& t : timers) CHECK(t.flushes == 1);
}


// ---- every process group, every send/recv, every layer and gradient (issue 32) ----

namespace {

// The items a world stops at, one step(kind) at a time until its program ends: each pending
// item's label and the ranks at its gate.
std::vector<std::pair<std::string, std::vector<int>>> step_through(ThreadsWorld& w, Background& bg, GateKind kind,
                                                                  int most = 200) {
  std::vector<std::pair<std::string, std::vector<int>>> seen;
  for (int i = 0; i < most && !bg.done(); i++) {
    if (!eventually([&] { return bg.done() || settled(w); })) break;
    if (bg.done()) break;
    const PendingItem p = w.stepper().state().pending;
    seen.push_back({p.gate.label, p.arrived});
    w.stepper().step(kind);
  }
  return seen;
}

}  // namespace

TEST_CASE("process groups: each group collective pauses until its members arrive, its ring steps step among them") {
  // Ranks {0,1} form tp0 and {2,3} tp1 (one tag, two groups); each iteration: a group all-reduce,
  // then a world all-reduce.
  const int n = 4;
  ThreadsWorld w(n, paused_options());
  std::atomic<int> wrong{0};
  Background bg(w, [&](int r, Communicator& c, RankContext& ctx) {
    auto ex = std::make_shared<GroupExecutor>();
    const std::vector<int> mine = r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    auto g = new_group(c, mine, 8, ex, cpu_device(), r < 2 ? "tp0" : "tp1");
    std::vector<float> a(1000), b(10);
    for (int it = 0; it < 2; it++) {
      ctx.begin_iteration(it);
      std::fill(a.begin(), a.end(), float(r));
      g->all_reduce(a.data(), 1000, DType::F32, ReduceOp::Sum)->wait();
      for (float v : a) wrong += v != float(mine[0] + mine[1]);
      std::fill(b.begin(), b.end(), 1.0f);
      c.all_reduce(b.data(), 10, DType::F32, ReduceOp::Sum, Algorithm::Ring)->wait();
      for (float v : b) wrong += v != float(n);
    }
  });
  REQUIRE(wait_pending(w, GateKind::Iteration, 0));
  w.stepper().step(GateKind::Collective);  // the iteration gates open; stop at the first operation
  const auto seen = step_through(w, bg, GateKind::Collective);
  REQUIRE(bg.finish());
  CHECK(bg.error() == "");
  CHECK(wrong == 0);
  // One global order: the lowest member first, a group's op before the world op its members then wait at.
  const std::vector<std::pair<std::string, std::vector<int>>> want = {
      {"tp0 #0 allreduce of 1000 float32 (sum, ring)", {0, 1}},
      {"tp1 #0 allreduce of 1000 float32 (sum, ring)", {2, 3}},
      {"world #0 allreduce of 10 float32 (sum, ring)", {0, 1, 2, 3}},
      {"tp0 #1 allreduce of 1000 float32 (sum, ring)", {0, 1}},
      {"tp1 #1 allreduce of 1000 float32 (sum, ring)", {2, 3}},
      {"world #1 allreduce of 10 float32 (sum, ring)", {0, 1, 2, 3}},
  };
  REQUIRE(seen.size() == want.size());
  for (size_t i = 0; i < want.size(); i++) {
    CAPTURE(i);
    CHECK(seen[i].first.rfind(want[i].first, 0) == 0);
    CHECK(seen[i].second == want[i].second);
  }
}

TEST_CASE("a group collective's ring steps are stepped among its members only") {
  const int n = 4;
  ThreadsWorld w(n, paused_options());
  Background bg(w, [&](int r, Communicator& c, RankContext&) {
    auto ex = std::make_shared<GroupExecutor>();
    const std::vector<int> mine = r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    auto g = new_group(c, mine, 8, ex, cpu_device(), r < 2 ? "tp0" : "tp1");
    std::vector<float> a(1000, 1.0f);
    g->all_reduce(a.data(), 1000, DType::F32, ReduceOp::Sum)->wait();
  });
  REQUIRE(w.stepper().wait_until_settled(kPatienceMs));
  PendingItem p = w.stepper().state().pending;
  CHECK(p.gate.label.rfind("tp0 #0 allreduce", 0) == 0);
  CHECK(p.members == std::vector<int>{0, 1});
  // Ring steps: tp0's two steps (2(n-1) for a group of 2), on the group lane of ranks 0 and 1.
  for (int st = 0; st < 2; st++) {
    CAPTURE(st);
    w.stepper().step(GateKind::RingStep);
    REQUIRE(eventually([&] {
      const PendingItem q = w.stepper().state().pending;
      return q.valid && q.kind == GateKind::RingStep && q.gate.step == st;
    }));
    p = w.stepper().state().pending;
    CHECK(p.members == std::vector<int>{0, 1});
    CHECK(p.gate.label.rfind("tp0 #0 allreduce", 0) == 0);
    const StepperState s = w.stepper().state();
    CHECK(s.gates[size_t(0 * kStepperLanes + kGroupLane)].blocked);
    CHECK(s.gates[size_t(1 * kStepperLanes + kGroupLane)].blocked);
    CHECK(!s.gates[size_t(2 * kStepperLanes + kGroupLane)].blocked);  // tp1 has not been released
    CHECK(s.gates[size_t(2 * kStepperLanes)].blocked);                // still at its issue gate
  }
  w.stepper().step(GateKind::RingStep);  // tp0's last step; then tp1 is next
  REQUIRE(eventually([&] {
    const PendingItem q = w.stepper().state().pending;
    return q.valid && q.kind == GateKind::Collective && q.gate.label.rfind("tp1 #0", 0) == 0;
  }));
  w.stepper().run();
  REQUIRE(bg.finish());
  CHECK(bg.error() == "");
}

TEST_CASE("a send and its receive pause as one operation, sends that cross go one ahead, never deadlock") {
  ThreadsWorld w(3, paused_options());
  Background bg(w, [&](int r, Communicator& c, RankContext&) {
    std::vector<float> out(8, float(r)), in(8, -1.0f);
    if (r == 0) {  // a pipeline's hand-off: 0 -> 1 -> 2
      c.send(out.data(), 8, DType::F32, 1, 5)->wait();
    } else if (r == 1) {
      c.recv(in.data(), 8, DType::F32, 0, 5)->wait();
      c.send(in.data(), 8, DType::F32, 2, 5)->wait();
    } else {
      c.recv(in.data(), 8, DType::F32, 1, 5)->wait();
      if (in[0] != 0.0f) throw Error("rank 2 received the wrong data");
    }
    // Both send first, then receive (eager sends make this legal).
    if (r < 2) {
      const int peer = 1 - r;
      WorkPtr s = c.send(out.data(), 8, DType::F32, peer, 6);
      c.recv(in.data(), 8, DType::F32, peer, 6)->wait();
      s->wait();
      if (in[0] != float(peer)) throw Error("crossed sends delivered the wrong data");
    }
  });
  REQUIRE(w.stepper().wait_until_settled(kPatienceMs));
  const auto seen = step_through(w, bg, GateKind::Collective);
  REQUIRE(bg.finish());
  CHECK(bg.error() == "");
  REQUIRE(seen.size() == 4);
  CHECK(seen[0].first.rfind("send 0->1", 0) == 0);  // with rank 1's receive: one item, both there
  CHECK(seen[0].second == std::vector<int>{0, 1});
  CHECK(seen[1].first.rfind("send 1->2", 0) == 0);
  CHECK(seen[1].second == std::vector<int>{1, 2});
  CHECK(seen[2].first.rfind("send 0->1", 0) == 0);  // crossing: rank 0's send goes ahead alone
  CHECK(seen[2].second == std::vector<int>{0});
  CHECK(seen[3].first.rfind("recv 1->0", 0) == 0);  // then rank 1's send with rank 0's receive
  CHECK(seen[3].second == std::vector<int>{0, 1});
  // The receive of the send that went ahead is owed: rank 1 takes it without stopping again.
}

TEST_CASE("layers and gradients: step(Layer) holds every rank before each layer, a focused rank goes alone") {
  const int n = 3;
  ThreadsWorld w(n, paused_options());
  Background bg(w, [&](int, Communicator&, RankContext& ctx) {
    ctx.begin_iteration(0);
    for (int l = 0; l < 3; l++) ctx.before_layer(2 * l, false);
    for (int l = 2; l >= 0; l--) {
      ctx.before_layer(2 * l, true);
      ctx.gate_grad(2 * l + 1, "bias of layer " + std::to_string(2 * l));
    }
  });
  REQUIRE(wait_pending(w, GateKind::Iteration, 0));
  w.stepper().step(GateKind::Layer);  // the iteration gates do not stop a layer step
  REQUIRE(w.stepper().wait_until_settled(kPatienceMs));
  PendingItem p = w.stepper().state().pending;
  CHECK(p.kind == GateKind::Layer);
  CHECK(p.gate.label == "layer 0 forward");
  CHECK(p.members == std::vector<int>{0, 1, 2});
  w.stepper().step(GateKind::Layer);
  REQUIRE(eventually([&] { return w.stepper().state().pending.gate.label == "layer 2 forward"; }));
  // Focus on rank 1: one rank's layer at a time.
  w.stepper().set_focus(1, "");
  REQUIRE(eventually([&] { return w.stepper().state().pending.members == std::vector<int>{1}; }));
  w.stepper().step(GateKind::Layer);
  REQUIRE(eventually([&] {
    const StepperState s = w.stepper().state();
    return s.pending.valid && s.pending.members == std::vector<int>{1} && s.pending.gate.label == "layer 4 forward";
  }));
  StepperState s = w.stepper().state();
  CHECK(s.gates[size_t(0 * kStepperLanes)].gate.label == "layer 2 forward");  // the others stayed
  CHECK(s.gates[size_t(2 * kStepperLanes)].gate.label == "layer 2 forward");
  // Gradients: step(Grad) stops right after each lands.
  w.stepper().set_focus(-1, "");
  w.stepper().step(GateKind::Grad);
  REQUIRE(eventually([&] {
    const PendingItem q = w.stepper().state().pending;
    return q.valid && q.kind == GateKind::Grad && q.gate.label == "bias of layer 4";
  }));
  CHECK(w.stepper().state().pending.members == std::vector<int>{0, 1, 2});
  w.stepper().run();
  REQUIRE(bg.finish());
  CHECK(bg.error() == "");
}

TEST_CASE("when nothing can be released the stepper says who waits for whom") {
  ThreadsWorld w(2, paused_options(30));
  Background bg(w, [&](int r, Communicator& c, RankContext&) {
    if (r == 1) return;  // never calls the all-reduce rank 0 waits in
    std::vector<float> v(4, 1.0f);
    c.all_reduce(v.data(), 4, DType::F32, ReduceOp::Sum)->wait();
  });
  w.stepper().step(GateKind::Collective);
  REQUIRE(eventually([&] { return w.stepper().state().waiting.find("waits for rank 1") != std::string::npos; }));
  const StepperState s = w.stepper().state();
  CHECK(!s.settled());
  CHECK(s.waiting.rfind("world #0 allreduce of 4 float32", 0) == 0);
  CHECK(s.live == std::vector<bool>{true, false});
  w.abort("the test is over");
  REQUIRE(bg.finish());
}

}  // TEST_SUITE
