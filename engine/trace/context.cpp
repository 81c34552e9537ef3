#include "engine/trace/context.h"

#include <algorithm>

#include "engine/core/device.h"

namespace dtlab {

RankContext::RankContext(int rank, TraceRecorder* recorder, const CostModel* cost, Stepper* stepper,
                         MemoryTracker* memory)
    : rank_(rank), recorder_(recorder), cost_(cost), stepper_(stepper), memory_(memory) {
  if (memory_ && recorder_) {
    memory_->set_listener([this](MemCategory c, int64_t delta, const MemoryStats& s) {
      const int64_t now = recorder_->now_ns();
      const double t = compute_clock();
      Event e(delta > 0 ? EventKind::MemAlloc : EventKind::MemFree, Lane::Compute, now, now, t, t);
      e.mem = MemInfo{c, delta > 0 ? delta : -delta, s.current_of(c), s.total_current};
      record(e);
    });
  }
}

RankContext::~RankContext() {
  if (memory_ && recorder_) memory_->set_listener({});
}

void RankContext::record(Event& e) {
  if (!recorder_ || !recorder_->enabled()) return;
  e.rank = rank_;
  if (e.iteration < 0) e.iteration = iteration();  // comm-lane events carry their issue iteration
  recorder_->record(e);
}

void RankContext::compute_begin(ComputeKind kind, int layer, OpCost cost) {
  open_kind_ = kind;
  open_layer_ = layer;
  open_flops_ = cost.flops;
  open_bytes_ = cost.bytes;
  open_wall_ = recorder_ ? recorder_->now_ns() : 0;
  open_model_ = compute_clock();
  set_activity(std::string(compute_kind_name(kind)) + (layer >= 0 ? " " + std::to_string(layer) : ""));
}

void RankContext::compute_end() {
  double dur = cost_ ? cost_->compute_time(open_flops_) : 0.0;
  double end;
  {
    std::lock_guard<std::mutex> lock(mu_);
    compute_clock_ = std::max(compute_clock_, open_model_ + dur);
    end = compute_clock_;
  }
  if (recorder_ && recorder_->enabled()) {
    Event e(EventKind::Compute, Lane::Compute, open_wall_, recorder_->now_ns(), open_model_, end);
    e.compute = ComputeInfo{open_kind_, static_cast<int16_t>(open_layer_), open_flops_, open_bytes_};
    record(e);
  }
}

bool RankContext::begin_iteration(int32_t iteration) {
  iteration_.store(iteration, std::memory_order_relaxed);
  action_ = -1;
  bool ok = true;
  if (stepper_) {
    set_activity("at the start of iteration " + std::to_string(iteration));
    GateInfo g;
    g.kind = GateKind::Iteration;
    g.iteration = iteration;
    g.model_time = compute_clock();
    g.label = "iteration " + std::to_string(iteration);
    before_wait();
    ok = stepper_->gate(rank_, kComputeLane, g);
  }
  iter_wall_ = recorder_ ? recorder_->now_ns() : 0;
  iter_model_ = compute_clock();
  return ok;
}

bool RankContext::gate_action(int32_t step, const std::string& what) {
  action_ = step;
  if (!stepper_) return true;
  set_activity("at the gate of pipeline action " + what);
  GateInfo g;
  g.kind = GateKind::Action;
  g.iteration = iteration();
  g.action = step;
  g.model_time = compute_clock();
  g.label = "action " + what + " (time step " + std::to_string(step) + ")";
  before_wait();
  return stepper_->gate(rank_, kComputeLane, g);
}

bool RankContext::gate_op(const OpRef& op, CollectiveOp coll, int64_t bytes, const std::string& label, const OpRef* op2,
                          int32_t trace_group) {
  if (!stepper_) return true;
  GateInfo g;
  g.kind = GateKind::Collective;
  g.iteration = iteration();
  g.action = action_;
  g.op = op;
  if (op2) g.op2 = *op2;
  g.model_time = compute_clock();
  g.label = label;
  g.trace_group = trace_group;
  g.coll = coll;
  g.bytes = bytes;
  const std::string before = activity();
  set_activity("at the gate of " + label);
  before_wait();
  const bool ok = stepper_->gate(rank_, kComputeLane, g);
  set_activity(before);
  return ok;
}

bool RankContext::gate_ring(int lane, const OpRef& op, int step, uint64_t participants, int32_t iteration,
                            double model_time, const std::string& label, int32_t trace_group) {
  if (!stepper_) return true;
  GateInfo g;
  g.kind = GateKind::RingStep;
  g.iteration = iteration;
  g.op = op;
  g.step = step;
  g.participants = participants;
  g.model_time = model_time;
  g.label = label;
  g.trace_group = trace_group;
  return stepper_->gate(rank_, lane, g);
}

void RankContext::before_layer(int layer, bool backward) {
  if (!stepper_) return;
  GateInfo g;
  g.kind = GateKind::Layer;
  g.iteration = iteration();
  g.action = action_;
  g.step = layer;
  g.backward = backward;
  g.model_time = compute_clock();
  g.label = "layer " + std::to_string(layer) + (backward ? " backward" : " forward");
  before_wait();
  stepper_->gate(rank_, kComputeLane, g);
}

bool RankContext::gate_grad(int param, const std::string& label) {
  if (!stepper_) return true;
  GateInfo g;
  g.kind = GateKind::Grad;
  g.iteration = iteration();
  g.action = action_;
  g.step = param;
  g.model_time = compute_clock();
  g.label = label;
  before_wait();
  return stepper_->gate(rank_, kComputeLane, g);
}

void RankContext::lane_work(int lane, int delta, bool p2p) {
  if (stepper_) stepper_->lane_work(rank_, lane, delta, p2p);
}

void RankContext::p2p_wait(bool waiting, uint64_t peers) {
  if (stepper_) stepper_->p2p_wait(rank_, waiting, peers);
}

void RankContext::end_iteration() {
  if (recorder_ && recorder_->enabled()) {
    Event e(EventKind::Iteration, Lane::Compute, iter_wall_, recorder_->now_ns(), iter_model_,
            std::max(compute_clock(), comm_clock()));
    record(e);
  }
}

double RankContext::compute_clock() const {
  std::lock_guard<std::mutex> lock(mu_);
  return compute_clock_;
}

void RankContext::advance_compute_clock(double t) {
  std::lock_guard<std::mutex> lock(mu_);
  compute_clock_ = std::max(compute_clock_, t);
}

double RankContext::comm_clock() const {
  std::lock_guard<std::mutex> lock(mu_);
  return comm_clock_;
}

void RankContext::set_comm_clock(double t) {
  std::lock_guard<std::mutex> lock(mu_);
  comm_clock_ = t;
}

void RankContext::attach_timer(DeviceTimer* timer) {
  std::lock_guard<std::mutex> lock(mu_);
  timer_ = timer;
  timer_thread_ = std::this_thread::get_id();
}

// A paused world shows the compute that already ran: a GPU rank's timer hands its finished ops over
// before the rank waits at a compute-lane gate or for its comm lane.
void RankContext::before_wait() {
  DeviceTimer* t = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (timer_ && timer_thread_ == std::this_thread::get_id()) t = timer_;
  }
  // Only the attaching thread gets here with a timer, and it detaches it itself: no other thread
  // can use `t` meanwhile.
  if (t && stepper_ && stepper_->paused()) t->flush();
}

void RankContext::set_activity(std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  activity_ = std::move(what);
}

std::string RankContext::activity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return activity_;
}

}  // namespace dtlab
