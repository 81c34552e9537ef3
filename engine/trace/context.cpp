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

void RankContext::compute_begin(ComputeKind kind, int layer, double flops) {
  open_kind_ = kind;
  open_layer_ = layer;
  open_flops_ = flops;
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
    e.compute = ComputeInfo{open_kind_, static_cast<int16_t>(open_layer_), open_flops_};
    record(e);
  }
}

bool RankContext::begin_iteration(int32_t iteration, uint64_t next_collective_seq) {
  iteration_.store(iteration, std::memory_order_relaxed);
  bool ok = true;
  if (stepper_) {
    set_activity("at the start of iteration " + std::to_string(iteration));
    ok = stepper_->gate(rank_, 0, GateKind::Iteration,
                        GatePos{static_cast<int64_t>(next_collective_seq), -2, iteration}, iteration,
                        compute_clock());
  }
  iter_wall_ = recorder_ ? recorder_->now_ns() : 0;
  iter_model_ = compute_clock();
  return ok;
}

bool RankContext::gate_action(int32_t step, uint64_t next_collective_seq, const std::string& what) {
  if (!stepper_) return true;
  set_activity("at the gate of pipeline action " + what);
  const int32_t it = iteration();
  return stepper_->gate(rank_, 0, GateKind::Action, GatePos{static_cast<int64_t>(next_collective_seq), -2, it, step}, it,
                        compute_clock());
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
