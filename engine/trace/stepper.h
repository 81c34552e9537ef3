// The stepper: lets a person pause the ranks and advance them one ring step, one collective or one
// iteration at a time. Ranks call gate() at three kinds of points; each gate has a position in the
// one order every rank follows:
//     iteration gate i before issuing collective k (k, -2, i)  compute lane
//     collective gate before running collective k  (k, -1)     comm lane
//     ring step s of collective k                  (k,  s)     comm lane
//     pipeline action at grid step t of iteration i (k, -2, i, t)  compute lane (before its input
//       is received; a dependency is always at an earlier grid step, so it is never held back)
// While paused, a gate opens iff its position <= `allowed`. `allowed` never drops below the furthest
// gate any rank has passed, so a rank never waits inside a collective for a peer held at a gate:
// pausing can never deadlock, and the watchdog only ever sees real hangs.
// Commands: run (optionally paced: `speed` modeled seconds per wall second), pause, step(kind):
//   step(RingStep)   release the pending ring step (or collective start); stop at the next ring
//                    step or collective gate
//   step(Collective) release the pending collective; stop at the next collective gate
//   step(Iteration)  release the pending iteration; stop at the next iteration gate
//   step(Action)     release the pending pipeline time step (every rank's action at that step of
//                    the schedule's grid); stop at the next action or collective gate
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace dtlab {

enum class GateKind : uint8_t { RingStep, Collective, Iteration, Action };
const char* gate_kind_name(GateKind k);

struct GatePos {
  int64_t seq = 0;   // collective sequence number
  int32_t sub = 0;   // -2 iteration gate, -1 collective gate, >= 0 ring step
  int32_t iter = 0;  // iteration gates: the iteration (orders iterations that issue no collective)
  int32_t action = -1;  // action gates: the pipeline action's time step in the schedule's grid
  auto operator<=>(const GatePos&) const = default;
};

struct RankGateState {
  bool blocked = false;  // waiting at a gate right now
  GateKind kind = GateKind::Collective;
  GatePos pos;
  int32_t iteration = -1;
  int lane = 0;          // 0 compute, 1 comm
};

struct StepperState {
  bool paused = false;
  double speed = 0;                       // 0: as fast as possible
  GatePos allowed;                        // while paused: gates at or before this are open
  GatePos frontier;                       // furthest gate any rank has passed
  std::vector<RankGateState> gates;       // per rank and lane: index rank * 2 + lane
  uint64_t generation = 0;                // bumps on every command and gate change
};

// Where a rank's gates go when the stepper that decides is in another process (a launched world:
// rank 0's process holds it, engine/monitor). gate() forwards and returns the answer.
class GateRelay {
 public:
  virtual ~GateRelay() = default;
  virtual bool gate(int rank, int lane, GateKind kind, GatePos pos, int32_t iteration, double model_time) = 0;
  virtual void cancel() = 0;  // every waiting and future gate returns false
  // A gate of this process waits for the deciding stepper's answer: what paused() reports here,
  // so watchdogs of this process do not take the remote pause for a hang.
  virtual bool holding() const = 0;
};

class Stepper {
 public:
  explicit Stepper(int world_size, bool start_paused = false);

  void run(double speed = 0);
  void pause();
  void step(GateKind kind);
  void abort();  // releases every gate for good (the world is shutting down or failed)

  // Called by rank threads. Blocks while the gate is closed; paces a running world when speed > 0
  // (`model_time` is the rank's modeled clock at the gate). Returns false once aborted.
  bool gate(int rank, int lane, GateKind kind, GatePos pos, int32_t iteration, double model_time);

  // From now on gate() asks `relay` instead of deciding here (null: decide here again). The relay
  // must outlive its use; abort() cancels it.
  void set_relay(GateRelay* relay);

  StepperState state() const;
  bool paused() const;  // with a relay: one of this process's gates is held by the deciding stepper
  bool aborted() const;
  // Waits until every rank is blocked at a gate or `timeout` passed; for tests and scripted runs.
  bool wait_until_all_blocked(int lanes_per_rank_min, std::chrono::milliseconds timeout) const;

 private:
  bool open_locked(GateKind kind, GatePos pos) const;
  bool stops_locked(GateKind kind) const;  // would a closed gate of this kind hold a rank now?
  void release_open_gates_locked();        // gates a command opened no longer count as blocked
  int world_size_;
  std::atomic<GateRelay*> relay_{nullptr};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool paused_;
  bool aborted_ = false;
  double speed_ = 0;
  GatePos allowed_{-1, 0};
  GatePos frontier_{-1, 0};
  GateKind stop_kind_ = GateKind::RingStep;  // which kinds block, with pause_all_
  bool pause_all_ = true;                    // pause(): every kind blocks
  std::vector<RankGateState> gates_;
  uint64_t generation_ = 0;
  int credits_ = 0;  // step commands given while no rank waited: each opens the next gate reached
  // pacing: wall time at which modeled time `pace_model0_` was current
  std::chrono::steady_clock::time_point pace_wall0_;
  double pace_model0_ = -1;
};

}  // namespace dtlab
