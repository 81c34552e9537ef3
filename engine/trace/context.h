// RankContext: one rank's instrumentation hub. It is the model's ComputeObserver (compute events and
// the compute lane's modeled clock), listens to the rank's memory tracker (memory events), carries
// the comm lane's modeled clock, the current iteration, and a line saying what the rank is doing
// (for the watchdog's diagnosis). Every pointer may be null: a plain run records nothing.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "engine/core/memory.h"
#include "engine/core/observer.h"
#include "engine/trace/cost_model.h"
#include "engine/trace/recorder.h"
#include "engine/trace/stepper.h"

namespace dtlab {

class DeviceTimer;  // engine/core/device.h

class RankContext : public ComputeObserver, public LayerGate {
 public:
  RankContext(int rank, TraceRecorder* recorder, const CostModel* cost, Stepper* stepper,
              MemoryTracker* memory);
  ~RankContext() override;
  RankContext(const RankContext&) = delete;
  RankContext& operator=(const RankContext&) = delete;

  int rank() const { return rank_; }
  TraceRecorder* recorder() const { return recorder_; }
  const CostModel* cost() const { return cost_; }
  Stepper* stepper() const { return stepper_; }
  MemoryTracker* memory() const { return memory_; }

  // ComputeObserver: records a Compute event and advances the compute lane's modeled clock.
  void compute_begin(ComputeKind kind, int layer, OpCost cost) override;
  void compute_end() override;

  // The stepper's gates on this rank (engine/trace/stepper.h); each returns false if the run was
  // aborted while it waited. Every compute-lane gate carries the rank's iteration and pipeline time
  // step, so the stepper can order them.
  // Iterations: begin_iteration passes the rank's iteration gate and opens an Iteration event;
  // end_iteration closes it.
  bool begin_iteration(int32_t iteration);
  void end_iteration();
  // Pipelines: the gate before the action at time step `step` of the schedule's grid (`what`: its
  // name, for the rank's activity and the gate's label).
  bool gate_action(int32_t step, const std::string& what);
  // Before the rank issues a communication operation (every Communicator's issue path): `op` is it,
  // `op2` the receive of a fused send+recv (null otherwise).
  // `coll` and `bytes` say what it is (bytes: nccl-tests' payload S, a send/recv's message).
  bool gate_op(const OpRef& op, CollectiveOp coll, int64_t bytes, const std::string& label, const OpRef* op2 = nullptr,
               int32_t trace_group = 0);
  // Before step `step` of a released operation, on the comm or group lane (`participants`: the ranks
  // of this step, 0 for every member).
  bool gate_ring(int lane, const OpRef& op, int step, uint64_t participants, int32_t iteration, double model_time,
                 const std::string& label, int32_t trace_group = 0);
  // LayerGate: before a layer's forward or backward (the model calls it; on abort it just returns,
  // and the next communication fails with the abort's reason).
  void before_layer(int layer, bool backward) override;
  // Right after parameter `param`'s gradient landed in its DDP bucket.
  bool gate_grad(int param, const std::string& label);
  // A comm or group lane took (+1) or finished (-1) an operation (Stepper::lane_work).
  void lane_work(int lane, int delta, bool p2p = false);
  // The compute lane starts (true) or ends (false) waiting for a send or receive of its program
  // (Stepper::p2p_wait).
  // `peers`: the ranks it sends to or receives from (bits of world ranks).
  void p2p_wait(bool waiting, uint64_t peers);
  int32_t iteration() const { return iteration_.load(std::memory_order_relaxed); }

  // Modeled clocks (seconds). The compute lane is advanced by compute ops and by waiting for
  // collectives; the comm lane by the collectives the comm worker runs.
  double compute_clock() const;
  void advance_compute_clock(double t);  // max(current, t)
  double comm_clock() const;
  void set_comm_clock(double t);

  void set_activity(std::string what);
  std::string activity() const;

  void record(Event& e);  // fills rank and iteration, then records (no-op without a recorder)

  // A GPU rank's compute events come from its device timer, which hands them over at the end of
  // each iteration (engine/cuda/compute_timer.h). So that a paused run shows the forward and backward
  // that already ran, the thread that attached `timer` (the rank's own; null detaches) calls
  // before_wait() when it is about to block for the comm lane (a Work's wait()) or at a stepper gate:
  // while the stepper is paused, the timer's finished ops are recorded then. A running world is left alone (a wait there
  // must not add a host synchronisation with the compute stream), as are other threads' waits.
  void attach_timer(DeviceTimer* timer);
  void before_wait();

  // Detaches on scope exit: declare after the timer it attaches, so it goes first.
  struct TimerAttachment {
    RankContext* ctx;
    TimerAttachment(RankContext* c, DeviceTimer* t) : ctx(t ? c : nullptr) {
      if (ctx) ctx->attach_timer(t);
    }
    ~TimerAttachment() {
      if (ctx) ctx->attach_timer(nullptr);
    }
    TimerAttachment(const TimerAttachment&) = delete;
    TimerAttachment& operator=(const TimerAttachment&) = delete;
  };

 private:
  int rank_;
  TraceRecorder* recorder_;
  const CostModel* cost_;
  Stepper* stepper_;
  MemoryTracker* memory_;
  std::atomic<int32_t> iteration_{-1};
  int32_t action_ = -1;  // the pipeline time step the rank is in (compute thread only)
  mutable std::mutex mu_;
  double compute_clock_ = 0, comm_clock_ = 0;
  std::string activity_ = "idle";
  DeviceTimer* timer_ = nullptr;  // attach_timer's, with its thread
  std::thread::id timer_thread_;
  // the open compute op (compute ops do not nest) and iteration
  ComputeKind open_kind_ = ComputeKind::Other;
  int open_layer_ = -1;
  double open_flops_ = 0, open_bytes_ = 0;
  int64_t open_wall_ = 0;
  double open_model_ = 0;
  int64_t iter_wall_ = 0;
  double iter_model_ = 0;
};

}  // namespace dtlab
