#include "engine/trace/stepper.h"

#include <algorithm>

namespace dtlab {

const char* gate_kind_name(GateKind k) {
  switch (k) {
    case GateKind::RingStep: return "ring step";
    case GateKind::Collective: return "collective";
    case GateKind::Iteration: return "iteration";
    case GateKind::Action: return "pipeline action";
  }
  return "?";
}

Stepper::Stepper(int world_size, bool start_paused)
    : world_size_(world_size), paused_(start_paused), gates_(static_cast<size_t>(world_size) * 2) {
  for (size_t i = 0; i < gates_.size(); i++) gates_[i].lane = static_cast<int>(i % 2);
}

void Stepper::run(double speed) {
  std::lock_guard<std::mutex> lock(mu_);
  paused_ = false;
  credits_ = 0;
  release_open_gates_locked();
  speed_ = speed;
  pace_model0_ = -1;  // re-anchor pacing at the next gate
  generation_++;
  cv_.notify_all();
}

void Stepper::pause() {
  std::lock_guard<std::mutex> lock(mu_);
  paused_ = true;
  pause_all_ = true;
  credits_ = 0;
  allowed_ = std::max(allowed_, frontier_);
  generation_++;
  cv_.notify_all();
}

void Stepper::step(GateKind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  paused_ = true;
  pause_all_ = false;
  stop_kind_ = kind;
  // The pending gate: the earliest blocked gate of a kind this command stops at; if ranks wait
  // only at other gates, release them all; if none waits (they are still running toward their
  // next gate, e.g. right after another step), keep a credit for the next gate one reaches.
  bool found = false, any = false;
  GatePos pending{}, latest{};
  for (const auto& g : gates_) {
    if (!g.blocked) continue;
    if (!any || latest < g.pos) latest = g.pos;
    any = true;
    if (stops_locked(g.kind) && (!found || g.pos < pending)) {
      pending = g.pos;
      found = true;
    }
  }
  // Whatever some rank already passed stays open for all (the no-deadlock rule), whichever branch.
  allowed_ = std::max(allowed_, frontier_);
  if (found) allowed_ = std::max(allowed_, pending);
  else if (any) allowed_ = std::max(allowed_, latest);
  else credits_++;
  release_open_gates_locked();
  generation_++;
  cv_.notify_all();
}

bool Stepper::stops_locked(GateKind kind) const {
  if (pause_all_) return true;
  switch (stop_kind_) {
    case GateKind::RingStep: return kind != GateKind::Iteration;
    case GateKind::Collective: return kind == GateKind::Collective;
    case GateKind::Iteration: return kind == GateKind::Iteration;
    // Collective gates too: a rank done with its actions waits there, not inside the collective.
    case GateKind::Action: return kind == GateKind::Action || kind == GateKind::Collective;
  }
  return true;
}

void Stepper::release_open_gates_locked() {
  for (auto& g : gates_)
    if (g.blocked && open_locked(g.kind, g.pos)) g.blocked = false;
}

void Stepper::abort() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    generation_++;
    cv_.notify_all();
  }
  if (GateRelay* r = relay_.load()) r->cancel();
}

void Stepper::set_relay(GateRelay* relay) { relay_.store(relay); }

bool Stepper::open_locked(GateKind kind, GatePos pos) const {
  if (aborted_ || !paused_ || pos <= allowed_) return true;
  return !stops_locked(kind);
}

bool Stepper::gate(int rank, int lane, GateKind kind, GatePos pos, int32_t iteration,
                   double model_time) {
  if (GateRelay* r = relay_.load()) return !aborted() && r->gate(rank, lane, kind, pos, iteration, model_time);
  std::unique_lock<std::mutex> lock(mu_);
  if (!open_locked(kind, pos) && credits_ > 0) {  // a step given before anyone got here
    credits_--;
    allowed_ = std::max({allowed_, frontier_, pos});
  }
  if (!open_locked(kind, pos)) {
    RankGateState& g = gates_[static_cast<size_t>(rank) * 2 + static_cast<size_t>(lane)];
    g.blocked = true;
    g.kind = kind;
    g.pos = pos;
    g.iteration = iteration;
    generation_++;
    cv_.notify_all();  // wait_until_all_blocked() watchers
    cv_.wait(lock, [&] { return open_locked(kind, pos); });
    g.blocked = false;
    generation_++;
    pace_model0_ = -1;
  }
  frontier_ = std::max(frontier_, pos);
  if (aborted_) return false;
  // Pacing a running world: modeled time advances `speed` times slower... i.e. one modeled second
  // takes 1/speed wall seconds. A command (pause, step, run) interrupts the sleep.
  if (!paused_ && speed_ > 0) {
    auto now = std::chrono::steady_clock::now();
    if (pace_model0_ < 0 || model_time < pace_model0_) {
      pace_model0_ = model_time;
      pace_wall0_ = now;
    } else {
      auto due = pace_wall0_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>((model_time - pace_model0_) / speed_));
      uint64_t gen = generation_;
      cv_.wait_until(lock, due, [&] { return generation_ != gen || aborted_; });
    }
  }
  return !aborted_;
}

StepperState Stepper::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return StepperState{.paused = paused_, .speed = speed_, .allowed = allowed_, .frontier = frontier_,
                      .gates = gates_, .generation = generation_};
}

bool Stepper::paused() const {
  if (GateRelay* r = relay_.load()) return r->holding();
  std::lock_guard<std::mutex> lock(mu_);
  return paused_;
}

bool Stepper::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

bool Stepper::wait_until_all_blocked(int lanes_per_rank_min, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] {
    for (int r = 0; r < world_size_; r++) {
      int blocked = gates_[static_cast<size_t>(r) * 2].blocked + gates_[static_cast<size_t>(r) * 2 + 1].blocked;
      if (blocked < lanes_per_rank_min) return false;
    }
    return true;
  });
}

}  // namespace dtlab
