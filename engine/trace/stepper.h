// The stepper: lets a person pause the ranks and advance them one operation at a time: one
// communication operation of any process group (a world or group collective, a send/recv), one
// ring step, one layer's forward or backward, one gradient landing in a DDP bucket, one pipeline
// action or one iteration.
//
// Gates. Ranks call gate() before each of these points, on one of three lanes per rank:
//   compute lane (0, the rank's own thread), in program order:
//     Iteration   before an iteration
//     Action      before a pipeline action (at a time step of the schedule's grid)
//     Layer       before a layer's forward or backward
//     Grad        right after a gradient landed in its DDP bucket
//     Collective  before a communication operation is issued: a collective of the world or of a
//                 process group, or one send/recv (its two halves, on two ranks, are one operation)
//   comm lane (1, the comm worker, world collectives) and group lane (2, the group executor):
//     RingStep    before each step of a released collective's algorithm (ring, tree, naive)
// A gate of a kind the current command does not stop at is open. A run that is not paused, or
// aborted, opens every gate.
//
// The one global order. While paused, the stepper releases one *item* at a time:
//   - a collective's issue gates once every member has arrived (all of them together, so no rank
//     ever waits inside a collective for a peer held at a gate);
//   - a send/recv once both halves arrived (a fused send+recv joins its partners' gates into one
//     item); a lone send only when nothing else can be released (sends are eager: its receive
//     still waits for its data);
//   - a ring step of an operation once its members reached that step;
//   - an iteration gate once every live rank reached it; a pipeline action step, a layer or a
//     gradient (of all ranks at that same point, or of the focused rank alone).
// Which item is next is decided only when the world has *settled*: every live rank's compute lane
// is at a gate and every collective a step released has finished on the comm and group lanes
// (a released send/recv in flight runs on by itself), or, while ring steps stop, some operation
// waits at a ring step. Then the ready items are ordered by
//     (iteration, pipeline time step, kind: iteration < action < layer < grad < operation,
//      lowest member rank, group, the group's sequence number, step)
// and the first one involving the focus (a rank or a group), else the first one, is *pending*.
// With a focus, one command advances the focus by one item: items of other ranks and groups that
// settle first are released on the way without a stop, until the focus's next item is pending.
// Every rank runs its program in a fixed order and the choice waits for the settled state, so the
// sequence of released items is the same in every run of the same program and focus commands:
// in-process, on the cuda backend, and for a launched world whose gates are relayed to rank 0's
// stepper (--attach). Nothing can deadlock as long as the program itself cannot: an item is only
// released whole, and when the world has settled with nothing ready the stepper says so in
// state().waiting (which ranks wait where, and for whom).
//
// Commands: run (optionally paced: `speed` modeled seconds per wall second), pause, step(kind):
// release the pending item (when the world has settled, or as soon as it has: quick commands add
// up) and stop at the next gate of that kind. What each kind stops at:
//   step(RingStep)    ring steps, operations and pipeline actions
//   step(Collective)  operations
//   step(Iteration)   iterations
//   step(Action)      pipeline actions and collectives (a time step's sends and receives run with it)
//   step(Layer)       layers and operations
//   step(Grad)        gradients landing in buckets, and operations
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/core/collective.h"  // CollectiveOp

namespace dtlab {

enum class GateKind : uint8_t { RingStep, Collective, Iteration, Action, Layer, Grad };
const char* gate_kind_name(GateKind k);  // "ring step", "operation", "iteration", ...

constexpr int kStepperLanes = 3;  // per rank: 0 compute, 1 comm worker, 2 group executor
enum : int { kComputeLane = 0, kCommLane = 1, kGroupLane = 2 };

// The communication operation a Collective or RingStep gate stands before.
struct OpRef {
  int32_t group = 0;    // 0: the world; a process group: 1 + its tag (groups that share a tag differ in members)
  int64_t seq = -1;     // a collective: the group's own count from 0; a send/recv: its message on the channel
  bool p2p = false;     // a send/recv: `src` -> `dst` with `tag`
  int16_t src = -1, dst = -1;
  int32_t tag = 0;
  uint64_t members = 0;  // global ranks taking part, bit r for rank r (worlds of up to 64)
  bool valid() const { return seq >= 0; }
  bool same_op(const OpRef& o) const {
    return group == o.group && members == o.members && seq == o.seq && p2p == o.p2p && src == o.src &&
           dst == o.dst && tag == o.tag;
  }
};

// What one gate stands before (one plain struct for every kind; fields not used by a kind stay -1).
struct GateInfo {
  GateKind kind = GateKind::Collective;
  int32_t iteration = -1;
  int32_t action = -1;    // the rank's pipeline time step in this iteration (-1: none)
  OpRef op;               // Collective and RingStep: the operation (a fused send+recv: the send)
  OpRef op2;              // a fused send+recv: the receive
  int32_t step = -1;      // RingStep: the step; Layer: the layer; Grad: the parameter's index
  uint64_t participants = 0;  // RingStep: the ranks that take part in this step (0: every member)
  bool backward = false;  // Layer: the backward pass
  double model_time = 0;  // the rank's modeled clock there (pacing a running world)
  std::string label;      // "tp1 #3 allreduce of 4096 float32", "layer 2 backward", "send #1 0->2"
  int32_t trace_group = 0;  // Collective and RingStep: the op's CollectiveInfo::group in the trace (0: world)
  CollectiveOp coll = CollectiveOp::AllReduce;  // Collective and RingStep: which operation
  int64_t bytes = 0;        // Collective: its payload (nccl-tests' S; a send/recv: the message)
};

struct RankGateState {
  bool blocked = false;  // waiting at a gate right now
  int lane = 0;
  GateInfo gate;
};

// The item the next step releases (valid once the world has settled).
struct PendingItem {
  bool valid = false;
  GateKind kind = GateKind::Collective;
  GateInfo gate;              // one of its gates (the lowest rank's)
  std::vector<int> members;   // the ranks it involves
  std::vector<int> arrived;   // those at its gate
  std::vector<int> missing;   // those not there yet (a focused operation that is not ready)
};

struct StepperState {
  bool paused = false;
  bool pause_all = false;                 // pause(): every kind of gate stops
  GateKind mode = GateKind::Collective;   // the last step's kind: what gates stop at
  double speed = 0;                       // 0: as fast as possible
  std::vector<RankGateState> gates;       // per rank and lane: index rank * kStepperLanes + lane
  PendingItem pending;                    // what the next step releases (invalid: not settled yet)
  PendingItem focused;                    // the focus's next item (a rank's or group's), if any
  int focus_rank = -1;                    // -1: no rank focus
  std::string focus_group;                // "" : no group focus ("tp1", "dp0", "world")
  std::string waiting;                    // not settled: who the stepper waits for, and where
  std::vector<bool> live;                 // per rank: its thread runs (between rank_started and rank_done)
  uint64_t released = 0;                  // items released since the start
  uint64_t generation = 0;                // bumps on every command and gate change
  bool settled() const { return pending.valid; }
};

// Where a rank's gates go when the stepper that decides is in another process (a launched world:
// rank 0's process holds it, engine/monitor). gate() forwards and returns the answer.
class GateRelay {
 public:
  virtual ~GateRelay() = default;
  virtual bool gate(int rank, int lane, const GateInfo& g) = 0;
  virtual void rank_done(int rank) = 0;  // the rank's program ended: the deciding stepper stops waiting for it
  virtual void cancel() = 0;             // every waiting and future gate returns false
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
  // The focus: a rank (-1: none) or a group by name ("" none). Pending items involving it go first,
  // and a step runs on to the focus's next item; step(Layer)/step(Grad) with a rank focus release
  // that rank's gate alone.
  void set_focus(int rank, const std::string& group);
  // Group names for focus and labels: a group (OpRef::group and its members) -> "tp1". The world
  // is "world".
  void name_group(int32_t group, uint64_t members, const std::string& name);
  std::string group_name(int32_t group, uint64_t members) const;

  // Called by rank threads. Blocks while the gate is closed; paces a running world when speed > 0
  // (`g.model_time` is the rank's modeled clock at the gate). Returns false once aborted.
  bool gate(int rank, int lane, const GateInfo& g);
  // A rank's program starts and ends (ThreadsWorld::run, a launched rank): only live ranks are
  // waited for when the world settles. Every rank is live from construction.
  void rank_started(int rank);
  void rank_done(int rank);
  // A comm or group lane took work (+1, when an operation is queued) or finished one (-1); `p2p`:
  // a send or receive of the rank's own program. The world has settled only once every such lane
  // is idle or at a gate, so what a step shows includes the whole of the operations it released.
  // A lane holding a send/recv is never waited for: its receive may wait for a send still held at
  // the peer's gate.
  void lane_work(int rank, int lane, int delta, bool p2p = false);
  // The rank's compute lane has waited 100 ms (true) or no longer waits (false) for a send or
  // receive of its program with `peers` (bits of ranks), past that operation's gate. The world then
  // settles without it once each peer is still too (at a gate with no send/recv in flight, or
  // waiting so itself): its peer may be held at a gate (a stage's receive, released with its action, while
  // the previous stage's forward waits at a tensor-parallel all-reduce); it reaches its next gate
  // once the data came. The random-step test found such runs stuck for good.
  void p2p_wait(int rank, bool waiting, uint64_t peers);

  // From now on gate() asks `relay` instead of deciding here (null: decide here again). The relay
  // must outlive its use; abort() cancels it.
  void set_relay(GateRelay* relay);

  StepperState state() const;
  bool paused() const;  // with a relay: one of this process's gates is held by the deciding stepper
  // Paused with a rank held at a gate: what can make a peer's wait as long as the user likes. The
  // watchdog's clock stops only then (paused with every rank inside a wait or finished, the waits are
  // hung: a peer that left the loop, not the user's pause).
  bool holding() const;
  bool aborted() const;
  int world_size() const { return world_size_; }
  // Waits until the world has settled (a pending item is known), every rank is done, or `timeout`
  // passed; for tests and scripted runs. True when settled or done.
  bool wait_until_settled(std::chrono::milliseconds timeout) const;

 private:
  struct Lane {
    bool blocked = false;
    uint64_t ticket = 0, released_ticket = 0;
    GateInfo gate;
  };
  struct Passage {  // an operation (or ring step) and which of its members passed its gate
    uint64_t members = 0, passed = 0;
    uint64_t waiting = 0;  // of those passed, the ones that may wait inside for the rest (not a send's sender: sends are eager)
    bool ring = false;  // a ring step's (owed on the comm and group lanes only)
  };
  struct Item {  // a candidate for release: the lanes it opens
    GateKind kind = GateKind::Collective;
    std::vector<size_t> lanes;  // indices into lanes_
    uint64_t members = 0;       // ranks involved
    uint64_t arrived = 0;       // of them, those at its gates
    bool ready = false;
    bool lone_send = false;     // a send whose receive is not at its gate yet
    std::vector<int64_t> key;
  };
  bool focus_waits_locked() const;
  bool stops_locked(GateKind kind, bool p2p = false) const;  // would a gate of this kind (a send/recv?) hold a rank now?
  // The keys of what a gate passes (its operation's halves, its ring step, or its iteration); none
  // for a rank's own compute gates (action, layer, gradient), which no peer waits on.
  static std::vector<std::pair<std::vector<int64_t>, Passage>> op_keys(const GateInfo& g);
  void note_passage_locked(int rank, const GateInfo& g);
  bool owes_locked(int rank, int lane, const GateInfo& g) const;  // must this gate open at once?
  void release_locked(const Item& item);
  void release_non_stopping_locked();      // after a command: gates it no longer stops at open
  void decide_locked();                    // settle: find the pending item, release what is owed
  bool choose_locked(Item& out, std::string& why) const;
  std::vector<Item> candidates_locked() const;
  bool involves_focus_locked(const Item& it) const;
  PendingItem pending_of_locked(const Item& it) const;
  std::string group_name_locked(int32_t group, uint64_t members) const;

  int world_size_;
  std::atomic<GateRelay*> relay_{nullptr};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool paused_;
  bool aborted_ = false;
  bool pause_all_ = true;                  // pause(): every kind blocks
  GateKind mode_ = GateKind::Collective;   // with !pause_all_: which kinds block
  double speed_ = 0;
  std::vector<Lane> lanes_;
  std::vector<int> work_;     // per lane: queued or running operations (comm and group lanes)
  std::vector<int> p2p_work_; // of them, the program's sends and receives
  uint64_t p2p_waiting_ = 0;  // ranks whose compute lane waits for a send or receive (p2p_wait)
  std::vector<uint64_t> p2p_peers_;  // per rank: the peers it waits for
  std::vector<bool> live_;
  uint64_t tickets_ = 0;
  uint64_t generation_ = 0;
  uint64_t released_ = 0;
  int owed_ = 0;              // releases commanded and not yet done (quick steps add up)
  bool chasing_ = false;      // a command with a focus runs on to the focus's next item
  bool have_pending_ = false;
  Item pending_;
  std::string waiting_;
  int focus_rank_ = -1;
  std::string focus_group_;
  std::map<std::pair<int32_t, uint64_t>, std::string> group_names_;
  // Operations some but not all of their members have passed (while the world ran, or a send that
  // went ahead alone): the others owe them, and no gate holds a rank that owes one, so no rank ever
  // waits inside an operation for a peer held at a gate. Keyed by op_keys(); erased once all passed.
  std::map<std::vector<int64_t>, Passage> passed_;
  // pacing: wall time at which modeled time `pace_model0_` was current
  std::chrono::steady_clock::time_point pace_wall0_;
  double pace_model0_ = -1;
};

}  // namespace dtlab
