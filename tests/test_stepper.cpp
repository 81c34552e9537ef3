// The stepper driving a threads world: ranks run in the background while the test thread pauses
// them and advances one iteration, one collective or one ring step at a time, reading the gates,
// the collectives in flight and the trace after each command. Every wait here is bounded: on a
// timeout the world is aborted (which opens every gate) and the test fails instead of hanging.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

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

// Every rank's gate on `lane` (0 compute, 1 comm) is blocked at (kind, pos).
bool all_blocked_at(ThreadsWorld& w, int lane, GateKind kind, GatePos pos) {
  StepperState s = w.stepper().state();
  for (int r = 0; r < w.world_size(); r++) {
    const RankGateState& g = s.gates[static_cast<size_t>(r * 2 + lane)];
    if (!g.blocked || g.kind != kind || g.pos != pos) return false;
  }
  return true;
}

bool wait_blocked_at(ThreadsWorld& w, int lane, GateKind kind, GatePos pos) {
  return eventually([&] { return all_blocked_at(w, lane, kind, pos); });
}

// Every rank rests at a gate that is really closed (past `allowed`), not one just released whose
// thread has not woken yet. Holds for ring-step and collective stops (iteration gates open there).
bool settled(ThreadsWorld& w) {
  StepperState s = w.stepper().state();
  for (int r = 0; r < w.world_size(); r++) {
    bool held = false;
    for (int lane = 0; lane < 2; lane++) {
      const RankGateState& g = s.gates[static_cast<size_t>(r * 2 + lane)];
      held = held || (g.blocked && s.allowed < g.pos);
    }
    if (!held) return false;
  }
  return true;
}

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
      ctx.begin_iteration(it, c.collectives_issued());
      c.all_reduce(buf.data(), count, DType::F32, ReduceOp::Sum, Algorithm::Ring)->wait();
      ctx.end_iteration();
      const int n = c.world_size();
      for (float v : buf) wrong += v != float(n * (n + 1) / 2);
    }
  };
}

}  // namespace

TEST_SUITE("stepper") {

TEST_CASE("paused world: step by iteration, collective and ring step, then run to the end") {
  const int n = 4, steps = 2 * (n - 1);
  ThreadsWorld w(n, paused_options());
  std::atomic<int> wrong{0};
  Background bg(w, allreduce_loop(3, 1000, wrong));

  // Every rank waits at its first iteration gate, before issuing collective #0.
  REQUIRE(w.stepper().wait_until_all_blocked(1, kPatienceMs));
  REQUIRE(wait_blocked_at(w, 0, GateKind::Iteration, GatePos{0, -2}));
  StepperState s = w.stepper().state();
  CHECK(s.paused);
  REQUIRE(s.gates.size() == size_t(2 * n));
  for (int r = 0; r < n; r++) {
    CHECK(s.gates[size_t(r * 2)].iteration == 0);
    CHECK(s.gates[size_t(r * 2)].lane == 0);
    CHECK(!s.gates[size_t(r * 2 + 1)].blocked);  // nothing issued, the comm worker is idle
  }
  CHECK(counts_are(w, EventKind::Collective, 0));
  CHECK(counts_are(w, EventKind::CollectiveIssue, 0));
  CHECK(w.status().in_flight.empty());

  SUBCASE("iteration, then collective by collective, then ring step by ring step") {
    // step(Iteration): all of iteration 0, stopping at iteration 1's gate.
    w.stepper().step(GateKind::Iteration);
    REQUIRE(wait_blocked_at(w, 0, GateKind::Iteration, GatePos{1, -2, 1}));
    CHECK(counts_are(w, EventKind::Collective, 1));
    CHECK(counts_are(w, EventKind::RingStep, size_t(steps)));
    CHECK(counts_are(w, EventKind::Iteration, 1));
    CHECK(w.stepper().state().gates[0].iteration == 1);  // rank 0's compute lane

    // step(Collective) from an iteration gate: up to collective #1's gate, which every rank has
    // reached, so its rendezvous is complete while it waits there.
    w.stepper().step(GateKind::Collective);
    REQUIRE(wait_blocked_at(w, 1, GateKind::Collective, GatePos{1, -1}));
    CHECK(counts_are(w, EventKind::Collective, 1));
    for (int k = 1; k <= 2; k++) {
      CAPTURE(k);
      WorldStatus st = w.status();
      REQUIRE(st.in_flight.size() == 1);
      CHECK(st.in_flight[0].seq == uint64_t(k));
      CHECK(st.in_flight[0].op == CollectiveOp::AllReduce);
      CHECK(st.in_flight[0].bytes == 4000);
      CHECK(st.in_flight[0].missing.empty());
      std::vector<int> arrived = st.in_flight[0].arrived;
      std::sort(arrived.begin(), arrived.end());
      CHECK(arrived == std::vector<int>{0, 1, 2, 3});
      CHECK(st.in_flight[0].steps == steps);
      CHECK(st.in_flight[0].steps_done == 0);
      if (k == 2) break;
      // One step(Collective): exactly one more collective completes on every rank.
      w.stepper().step(GateKind::Collective);
      REQUIRE(wait_blocked_at(w, 1, GateKind::Collective, GatePos{k + 1, -1}));
      CHECK(counts_are(w, EventKind::Collective, size_t(k + 1)));
      CHECK(counts_are(w, EventKind::RingStep, size_t((k + 1) * steps)));
    }

    // Collective #2 ring step by ring step: +1 RingStep event per rank per command.
    w.stepper().step(GateKind::RingStep);  // releases the collective gate, stops before step 0
    REQUIRE(wait_blocked_at(w, 1, GateKind::RingStep, GatePos{2, 0}));
    CHECK(counts_are(w, EventKind::RingStep, size_t(2 * steps)));
    for (int st = 0; st < 3; st++) {
      CAPTURE(st);
      w.stepper().step(GateKind::RingStep);
      REQUIRE(wait_blocked_at(w, 1, GateKind::RingStep, GatePos{2, st + 1}));
      CHECK(counts_are(w, EventKind::RingStep, size_t(2 * steps + st + 1)));
      CHECK(counts_are(w, EventKind::Collective, 2));
      WorldStatus ws = w.status();
      REQUIRE(ws.in_flight.size() == 1);
      CHECK(ws.in_flight[0].steps_done == st + 1);
    }
    StepperState mid = w.stepper().state();
    CHECK(mid.frontier == GatePos{2, 2});
    CHECK(mid.allowed == GatePos{2, 2});
  }

  SUBCASE("ring steps across a collective boundary land on the next collective's gate") {
    w.stepper().step(GateKind::RingStep);  // iteration gate -> collective #0's gate
    REQUIRE(wait_blocked_at(w, 1, GateKind::Collective, GatePos{0, -1}));
    for (int st = 0; st <= steps; st++) {
      CAPTURE(st);
      w.stepper().step(GateKind::RingStep);
      GatePos next = st < steps ? GatePos{0, st} : GatePos{1, -1};
      REQUIRE(wait_blocked_at(w, 1, st < steps ? GateKind::RingStep : GateKind::Collective, next));
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

// Regression: step() once left released gates marked blocked until their threads woke, so
// wait_until_all_blocked() right after a step returned the old gates at once, and a second quick
// step() picked a stale gate as pending and did nothing (two clicks, one ring step).
TEST_CASE("two quick ring steps advance two ring steps") {
  ThreadsWorld w(4, paused_options());
  std::atomic<int> wrong{0};
  Background bg(w, allreduce_loop(1, 1000, wrong));
  REQUIRE(w.stepper().wait_until_all_blocked(1, kPatienceMs));
  w.stepper().step(GateKind::RingStep);  // iteration gate -> collective gate
  REQUIRE(wait_blocked_at(w, 1, GateKind::Collective, GatePos{0, -1}));
  w.stepper().step(GateKind::RingStep);
  REQUIRE(wait_blocked_at(w, 1, GateKind::RingStep, GatePos{0, 0}));
  w.stepper().step(GateKind::RingStep);
  w.stepper().step(GateKind::RingStep);
  CHECK(eventually([&] { return all_blocked_at(w, 1, GateKind::RingStep, GatePos{0, 2}); }, 2));
  w.stepper().run();
  REQUIRE(bg.finish());
}

// The same regression, seen through wait_until_all_blocked().
TEST_CASE("wait_until_all_blocked after a step reports the next gates, not the released ones") {
  ThreadsWorld w(4, paused_options());
  std::atomic<int> wrong{0};
  Background bg(w, allreduce_loop(3, 1000, wrong));
  REQUIRE(w.stepper().wait_until_all_blocked(1, kPatienceMs));
  for (int k = 0; k < 3; k++) {
    CAPTURE(k);
    w.stepper().step(GateKind::Collective);
    REQUIRE(w.stepper().wait_until_all_blocked(1, kPatienceMs));
    CHECK(all_blocked_at(w, 1, GateKind::Collective, GatePos{k, -1}));
    w.stepper().step(GateKind::Iteration);
    if (k < 2) {
      REQUIRE(w.stepper().wait_until_all_blocked(1, kPatienceMs));
      CHECK(all_blocked_at(w, 0, GateKind::Iteration, GatePos{k + 1, -2, k + 1}));
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
    w.stepper().step(GateKind::RingStep);  // nothing blocked yet or at the collective gate
    REQUIRE(eventually([&] {
      return all_blocked_at(w, 1, GateKind::Collective, GatePos{0, -1}) ||
             all_blocked_at(w, 1, GateKind::RingStep, GatePos{0, 0});
    }));
    if (all_blocked_at(w, 1, GateKind::Collective, GatePos{0, -1})) w.stepper().step(GateKind::RingStep);
    REQUIRE(wait_blocked_at(w, 1, GateKind::RingStep, GatePos{0, 0}));
    for (int st = 0; st + 1 < steps; st++) {
      CAPTURE(st);
      w.stepper().step(GateKind::RingStep);
      REQUIRE(wait_blocked_at(w, 1, GateKind::RingStep, GatePos{0, st + 1}));
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
  REQUIRE(w.stepper().wait_until_all_blocked(1, kPatienceMs));
  w.stepper().step(GateKind::RingStep);
  REQUIRE(wait_blocked_at(w, 1, GateKind::RingStep, GatePos{0, 0}));
  w.stepper().step(GateKind::RingStep);
  REQUIRE(wait_blocked_at(w, 1, GateKind::RingStep, GatePos{0, 1}));
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
      ctx.begin_iteration(it, c.collectives_issued());
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
  REQUIRE(w.stepper().wait_until_all_blocked(1, kPatienceMs));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // at the iteration gate
  w.stepper().step(GateKind::Collective);
  REQUIRE(wait_blocked_at(w, 1, GateKind::Collective, GatePos{0, -1}));
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // rendezvous complete, held at its gate
  w.stepper().step(GateKind::RingStep);
  REQUIRE(wait_blocked_at(w, 1, GateKind::RingStep, GatePos{0, 0}));
  w.stepper().step(GateKind::RingStep);
  REQUIRE(wait_blocked_at(w, 1, GateKind::RingStep, GatePos{0, 1}));
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
      ctx.begin_iteration(it, c.collectives_issued());
      c.all_reduce(buf.data(), 4097)->wait();
      ctx.end_iteration();
      for (size_t i = 0; i + 1 < buf.size(); i++) wrong += buf[i] != float(n * (n + 1) / 2);
      if (buf.back() > 0) break;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  w.stepper().pause();
  // Wherever the ranks were, each comes to rest at some gate on some lane.
  CHECK((bg.done() || w.stepper().wait_until_all_blocked(1, kPatienceMs)));
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
  std::vector<dtlab::GatePos> asked;
  bool open = true, held = false, cancelled = false;
  bool gate(int, int, dtlab::GateKind, dtlab::GatePos pos, int32_t, double) override {
    asked.push_back(pos);
    return open && !cancelled;
  }
  void cancel() override { cancelled = true; }
  bool holding() const override { return held; }
};

}  // namespace

TEST_SUITE("stepper") {

TEST_CASE("a relayed stepper forwards its gates, reports the remote hold as paused, and cancels on abort") {
  dtlab::Stepper st(2);
  FakeRelay relay;
  st.set_relay(&relay);
  CHECK(st.gate(1, 1, dtlab::GateKind::Collective, dtlab::GatePos{3, -1}, 0, 0.0));
  REQUIRE(relay.asked.size() == 1);
  CHECK(relay.asked[0] == dtlab::GatePos{3, -1});
  relay.open = false;
  CHECK_FALSE(st.gate(1, 1, dtlab::GateKind::RingStep, dtlab::GatePos{3, 0}, 0, 0.0));
  // Watchdogs ask paused(): with a relay it is "one of my gates waits for the deciding stepper".
  CHECK_FALSE(st.paused());
  relay.held = true;
  CHECK(st.paused());
  st.abort();
  CHECK(relay.cancelled);
  CHECK_FALSE(st.gate(1, 1, dtlab::GateKind::Collective, dtlab::GatePos{4, -1}, 0, 0.0));
  CHECK(relay.asked.size() == 2);  // an aborted stepper does not ask
  st.set_relay(nullptr);
  CHECK_FALSE(st.paused());
}

// A GPU rank's device timer stands in: it counts the flushes a wait asks for.
struct CountingTimer : DeviceTimer {
  std::atomic<int> flushes{0};
  void compute_begin(ComputeKind, int, double) override {}
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

TEST_CASE("in a paused world, a rank waiting for a held collective has flushed its device timer first") {
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
  // The collective is held at its gate: every rank's compute thread is inside wait(), having
  // flushed once on the way in; none got past it.
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

}  // TEST_SUITE
