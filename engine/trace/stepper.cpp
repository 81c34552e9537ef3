#include "engine/trace/stepper.h"

#include <algorithm>
#include <bit>
#include <map>
#include <tuple>

namespace dtlab {

const char* gate_kind_name(GateKind k) {
  switch (k) {
    case GateKind::RingStep: return "ring step";
    case GateKind::Collective: return "operation";
    case GateKind::Iteration: return "iteration";
    case GateKind::Action: return "pipeline action";
    case GateKind::Layer: return "layer";
    case GateKind::Grad: return "gradient";
  }
  return "?";
}

namespace {

uint64_t bit(int r) { return uint64_t{1} << r; }

// op_keys' first field: 0 a collective, 1 a send/recv, this: an iteration gate.
constexpr int64_t kIterationKey = 2;

int lowest(uint64_t mask) { return mask ? std::countr_zero(mask) : -1; }

bool is_p2p(const GateInfo& g) { return g.kind == GateKind::Collective && (g.op.p2p || g.op2.p2p); }

std::vector<int> ranks_of(uint64_t mask) {
  std::vector<int> v;
  for (int r = 0; r < 64; r++)
    if (mask & bit(r)) v.push_back(r);
  return v;
}

// "ranks 2, 3" / "rank 5"
std::string ranks_text(uint64_t mask) {
  std::vector<int> v = ranks_of(mask);
  std::string s = v.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < v.size(); i++) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

// The order of kinds at one point of an iteration (the key's third field).
int kind_order(GateKind k) {
  switch (k) {
    case GateKind::Iteration: return 0;
    case GateKind::Action: return 1;
    case GateKind::Layer: return 2;
    case GateKind::Grad: return 3;
    case GateKind::Collective: return 4;
    case GateKind::RingStep: return 5;
  }
  return 6;
}

// Forward layers in order, then backward from the last layer down.
int64_t layer_order(const GateInfo& g) { return g.backward ? 1'000'000 - g.step : g.step; }

}  // namespace

Stepper::Stepper(int world_size, bool start_paused)
    : world_size_(world_size),
      paused_(start_paused),
      lanes_(static_cast<size_t>(world_size) * kStepperLanes),
      work_(static_cast<size_t>(world_size) * kStepperLanes, 0),
      p2p_work_(static_cast<size_t>(world_size) * kStepperLanes, 0),
      live_(static_cast<size_t>(world_size), true) {}

void Stepper::run(double speed) {
  std::lock_guard<std::mutex> lock(mu_);
  paused_ = false;
  owed_ = 0;
  chasing_ = false;
  for (Lane& l : lanes_)
    if (l.blocked) {
      l.blocked = false;
      l.released_ticket = l.ticket;
    }
  have_pending_ = false;
  waiting_.clear();
  speed_ = speed;
  pace_model0_ = -1;  // re-anchor pacing at the next gate
  generation_++;
  cv_.notify_all();
}

void Stepper::pause() {
  std::lock_guard<std::mutex> lock(mu_);
  paused_ = true;
  pause_all_ = true;
  owed_ = 0;
  chasing_ = false;
  decide_locked();
  generation_++;
  cv_.notify_all();
}

void Stepper::step(GateKind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool was_settled = paused_ && have_pending_;
  paused_ = true;
  pause_all_ = false;
  mode_ = kind;
  // The settled world's pending item goes if this command stops at its kind; gates of kinds it
  // does not stop at open (the world then runs to the next gate this command stops at). A command
  // given while the world still moves is kept for the item it settles at.
  // With a focus, a command runs to the focus's next item: other ranks' and groups' items on the
  // way go without a stop (chasing_), and a settled item that is not the focus's is not the one the
  // command releases.
  const bool focus = focus_waits_locked();  // a focus that has nothing left to wait at steps like none
  chasing_ = focus;
  if (was_settled && stops_locked(pending_.kind, !pending_.lanes.empty() && is_p2p(lanes_[pending_.lanes.front()].gate))) {
    if (!focus || involves_focus_locked(pending_)) owed_++;
  } else if (!was_settled) {
    owed_++;
  }
  release_non_stopping_locked();
  decide_locked();
  generation_++;
  cv_.notify_all();
}

void Stepper::abort() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    for (Lane& l : lanes_) l.blocked = false;
    have_pending_ = false;
    generation_++;
    cv_.notify_all();
  }
  if (GateRelay* r = relay_.load()) r->cancel();
}

void Stepper::set_focus(int rank, const std::string& group) {
  std::lock_guard<std::mutex> lock(mu_);
  focus_rank_ = rank >= 0 && rank < world_size_ ? rank : -1;
  focus_group_ = group;
  decide_locked();
  generation_++;
  cv_.notify_all();
}

void Stepper::name_group(int32_t group, uint64_t members, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  group_names_[{group, members}] = name;
}

std::string Stepper::group_name(int32_t group, uint64_t members) const {
  std::lock_guard<std::mutex> lock(mu_);
  return group_name_locked(group, members);
}

std::string Stepper::group_name_locked(int32_t group, uint64_t members) const {
  if (group == 0) return "world";
  auto it = group_names_.find({group, members});
  return it != group_names_.end() ? it->second : "group" + std::to_string(group - 1);
}

void Stepper::set_relay(GateRelay* relay) { relay_.store(relay); }

void Stepper::rank_started(int rank) {
  if (rank < 0 || rank >= world_size_) return;
  std::lock_guard<std::mutex> lock(mu_);
  live_[static_cast<size_t>(rank)] = true;
  generation_++;
}

void Stepper::rank_done(int rank) {
  if (GateRelay* r = relay_.load()) {
    r->rank_done(rank);
    return;
  }
  if (rank < 0 || rank >= world_size_) return;
  std::lock_guard<std::mutex> lock(mu_);
  live_[static_cast<size_t>(rank)] = false;
  for (auto it = passed_.begin(); it != passed_.end();) {  // an iteration no longer owed to it
    if (it->first[0] == kIterationKey) it->second.members &= ~bit(rank);
    if (it->first[0] == kIterationKey && (it->second.members & ~it->second.passed) == 0)
      it = passed_.erase(it);
    else
      ++it;
  }
  decide_locked();
  generation_++;
  cv_.notify_all();
}

void Stepper::lane_work(int rank, int lane, int delta, bool p2p) {
  if (rank < 0 || rank >= world_size_ || lane <= 0 || lane >= kStepperLanes) return;
  std::lock_guard<std::mutex> lock(mu_);
  const size_t i = static_cast<size_t>(rank) * kStepperLanes + static_cast<size_t>(lane);
  int& w = work_[i];
  w = std::max(0, w + delta);
  if (p2p) p2p_work_[i] = std::max(0, p2p_work_[i] + delta);
  // Only a finished operation can settle a waiting world; a new one never does.
  if (delta < 0 && w == 0 && paused_ && !aborted_) {
    decide_locked();
    generation_++;
    cv_.notify_all();
  }
}

void Stepper::p2p_wait(int rank, bool waiting, uint64_t peers) {
  if (rank < 0 || rank >= world_size_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (p2p_peers_.empty()) p2p_peers_.assign(static_cast<size_t>(world_size_), 0);
  if (waiting) p2p_waiting_ |= bit(rank);
  else p2p_waiting_ &= ~bit(rank);
  p2p_peers_[static_cast<size_t>(rank)] = waiting ? peers : 0;
  if (waiting && paused_ && !aborted_) {  // it may be the last rank the world waited for
    decide_locked();
    generation_++;
    cv_.notify_all();
  }
}

bool Stepper::stops_locked(GateKind kind, bool p2p) const {
  if (aborted_ || !paused_) return false;
  if (pause_all_) return true;
  switch (mode_) {
    case GateKind::RingStep:
      return kind == GateKind::RingStep || kind == GateKind::Collective || kind == GateKind::Action;
    case GateKind::Collective: return kind == GateKind::Collective;
    case GateKind::Iteration: return kind == GateKind::Iteration;
    // A pipeline time step includes its sends and receives: they are part of the actions.
    case GateKind::Action: return kind == GateKind::Action || (kind == GateKind::Collective && !p2p);
    case GateKind::Layer: return kind == GateKind::Layer || kind == GateKind::Collective;
    case GateKind::Grad: return kind == GateKind::Grad || kind == GateKind::Collective;
  }
  return true;
}

std::vector<std::pair<std::vector<int64_t>, Stepper::Passage>> Stepper::op_keys(const GateInfo& g) {
  std::vector<std::pair<std::vector<int64_t>, Passage>> keys;
  auto op_key = [](const OpRef& o) {
    return std::vector<int64_t>{o.p2p, o.group, static_cast<int64_t>(o.members), o.seq, o.src, o.dst, o.tag};
  };
  if (g.kind == GateKind::Collective) {
    for (const OpRef* o : {&g.op, &g.op2})
      if (o->valid()) keys.push_back({op_key(*o), Passage{.members = o->members}});
  } else if (g.kind == GateKind::RingStep && g.op.valid()) {
    std::vector<int64_t> k = op_key(g.op);
    k.push_back(g.step);
    keys.push_back({k, Passage{.members = g.participants ? g.participants : g.op.members, .ring = true}});
  } else if (g.kind == GateKind::Iteration) {
    // An iteration is released to every live rank at once, so one passed alone (pause() landed
    // while the ranks crossed it) is owed to the rest: held there, they would wait for ranks
    // already held at the next operation. Members: the live ranks (note_passage_locked).
    keys.push_back({{kIterationKey, g.iteration, 0, 0, 0, -1, 0}, Passage{}});
  }
  return keys;
}

void Stepper::note_passage_locked(int rank, const GateInfo& g) {
  for (auto& [k, fresh] : op_keys(g)) {
    if (k[0] == kIterationKey)
      for (int r = 0; r < world_size_; r++)
        if (live_[static_cast<size_t>(r)]) fresh.members |= bit(r);
    if (!(fresh.members & bit(rank))) continue;
    auto [it, added] = passed_.emplace(k, fresh);
    it->second.passed |= bit(rank);
    if (k[0] == 0 || k[5] == rank) it->second.waiting |= bit(rank);  // key: p2p, group, members, seq, src, dst, ...
    if ((it->second.members & ~it->second.passed) == 0) passed_.erase(it);  // every member is through
  }
}

bool Stepper::owes_locked(int rank, int lane, const GateInfo& g) const {
  if (passed_.empty()) return false;
  for (const auto& [k, fresh] : op_keys(g))  // a peer already passed this very gate
    if (passed_.count(k)) return true;
  for (const auto& [k, p] : passed_) {
    if (!(p.members & bit(rank)) || (p.passed & bit(rank))) continue;
    // The rank still has to issue an op a peer waits in (a peer's eager send waits for nobody).
    // Owing a send/recv, it still stops at a collective of others: passing it alone, it would wait
    // inside for members held at its gate (a pipeline stage owing its send stopped in a
    // tensor-parallel all-reduce whose other rank was held). The peer waiting for the send counts
    // as still meanwhile (p2p_wait), so the world settles with that collective pending.
    if (!p.ring && lane == kComputeLane && p.waiting && !(k[0] == 1 && g.kind == GateKind::Collective && !is_p2p(g)))
      return true;
    // On a comm or group lane: a ring step of this same operation that a peer is past.
    if (p.ring && lane != kComputeLane && g.kind == GateKind::RingStep && k.size() == 8 &&
        std::equal(k.begin(), k.end() - 1, op_keys(g).front().first.begin()))
      return true;
  }
  return false;
}

void Stepper::release_locked(const Item& item) {
  for (size_t i : item.lanes) {
    Lane& l = lanes_[i];
    if (!l.blocked) continue;
    l.blocked = false;
    l.released_ticket = l.ticket;
  }
  released_++;
  have_pending_ = false;
  generation_++;
  cv_.notify_all();
}

void Stepper::release_non_stopping_locked() {
  for (Lane& l : lanes_)
    if (l.blocked && !stops_locked(l.gate.kind, is_p2p(l.gate))) {
      l.blocked = false;
      l.released_ticket = l.ticket;
    }
}

void Stepper::decide_locked() {
  for (;;) {
    Item it;
    std::string why;
    const bool ok = !aborted_ && paused_ && choose_locked(it, why);
    have_pending_ = ok;
    waiting_ = ok || aborted_ || !paused_ ? std::string() : why;
    if (ok) pending_ = it;
    if (!ok) return;
    if (chasing_ && !involves_focus_locked(it) && focus_waits_locked()) {  // on the way to the focus's next item
      release_locked(it);
      continue;
    }
    if (owed_ <= 0) {
      chasing_ = false;  // stopped at the focus's item (or the focus has nothing left to wait at)
      return;
    }
    owed_--;
    release_locked(it);
  }
}

// The candidates among the blocked gates, each with the lanes it would open.
std::vector<Stepper::Item> Stepper::candidates_locked() const {
  // Grouping key -> item. Keys are tuples of small integers rendered into a vector.
  std::map<std::vector<int64_t>, Item> items;
  uint64_t live = 0;
  for (int r = 0; r < world_size_; r++)
    if (live_[static_cast<size_t>(r)]) live |= bit(r);
  std::vector<size_t> p2p;  // p2p issue gates: joined below
  for (size_t i = 0; i < lanes_.size(); i++) {
    const Lane& l = lanes_[i];
    if (!l.blocked) continue;
    const int rank = static_cast<int>(i / kStepperLanes);
    const GateInfo& g = l.gate;
    std::vector<int64_t> group_key;
    uint64_t members = bit(rank);
    bool all_present_needed = false;
    switch (g.kind) {
      case GateKind::RingStep:
        group_key = {0, g.op.group, static_cast<int64_t>(g.op.members), g.op.seq, g.step};
        members = g.participants ? g.participants : g.op.members;
        all_present_needed = true;
        break;
      case GateKind::Iteration:
        group_key = {1, g.iteration};
        members = live | bit(rank);
        all_present_needed = true;
        break;
      case GateKind::Action:
        group_key = {2, g.iteration, g.action};
        break;
      case GateKind::Layer:
      case GateKind::Grad:
        group_key = {3, static_cast<int64_t>(g.kind), g.iteration, g.action, layer_order(g), g.backward,
                     focus_rank_ >= 0 ? rank : -1};
        break;
      case GateKind::Collective:
        if (g.op.p2p || g.op2.p2p) {
          p2p.push_back(i);
          continue;
        }
        group_key = {4, g.op.group, static_cast<int64_t>(g.op.members), g.op.seq};
        members = g.op.members ? g.op.members : bit(rank);
        all_present_needed = true;
        break;
    }
    Item& it = items[group_key];
    it.kind = g.kind;
    it.lanes.push_back(i);
    it.arrived |= bit(rank);
    it.members |= all_present_needed ? members : bit(rank);
  }
  // Whole when every member is there (actions, layers and gradients: whoever is there).
  std::vector<Item> out;
  for (auto& [k, it] : items) {
    it.ready = (it.members & ~it.arrived) == 0;
    out.push_back(std::move(it));
  }
  // Sends and receives: a gate's parts (its op, and op2 for a fused pair) each need their other
  // half; the item is the closure of gates joined by parts, ready when every part's other half is
  // at a gate in it.
  std::vector<bool> used(p2p.size(), false);
  auto other_half = [&](const OpRef& part, int rank) -> int {
    const int peer = part.src == rank ? part.dst : part.src;
    for (size_t j = 0; j < p2p.size(); j++) {
      if (static_cast<int>(p2p[j] / kStepperLanes) != peer) continue;
      const GateInfo& h = lanes_[p2p[j]].gate;
      if ((h.op.p2p && h.op.same_op(part)) || (h.op2.p2p && h.op2.same_op(part))) return static_cast<int>(j);
    }
    return -1;
  };
  for (size_t s = 0; s < p2p.size(); s++) {
    if (used[s]) continue;
    Item it;
    it.kind = GateKind::Collective;
    it.ready = true;
    std::vector<size_t> todo = {s};
    used[s] = true;
    bool has_send = false;
    while (!todo.empty()) {
      const size_t j = todo.back();
      todo.pop_back();
      const size_t lane = p2p[j];
      const int rank = static_cast<int>(lane / kStepperLanes);
      const GateInfo& g = lanes_[lane].gate;
      it.lanes.push_back(lane);
      it.arrived |= bit(rank);
      for (const OpRef* part : {&g.op, &g.op2}) {
        if (!part->p2p) continue;
        it.members |= bit(part->src) | bit(part->dst);
        if (part->src == rank) has_send = true;
        const int h = other_half(*part, rank);
        if (h < 0) {
          it.ready = false;
          continue;
        }
        if (!used[static_cast<size_t>(h)]) {
          used[static_cast<size_t>(h)] = true;
          todo.push_back(static_cast<size_t>(h));
        }
      }
    }
    // Alone, a gate with a send can go first (sends are eager); a fused pair's receive then waits for its data.
    it.lone_send = !it.ready && it.lanes.size() == 1 && has_send;
    out.push_back(std::move(it));
  }
  // Order keys: (iteration, action, kind, lowest member, group, seq, step); ring steps first (an
  // operation in flight finishes before the next one starts).
  for (Item& it : out) {
    const GateInfo& g = lanes_[it.lanes.front()].gate;
    int64_t iteration = g.iteration, action = g.action;
    for (size_t i : it.lanes) {  // the earliest point among its gates
      iteration = std::min<int64_t>(iteration, lanes_[i].gate.iteration);
      action = std::min<int64_t>(action, lanes_[i].gate.action);
    }
    const int64_t ring_first = it.kind == GateKind::RingStep ? 0 : 1;
    it.key = {ring_first, iteration, action, kind_order(it.kind), lowest(it.members), g.op.group, g.op.seq,
              it.kind == GateKind::Layer || it.kind == GateKind::Grad ? layer_order(g) : g.step};
  }
  return out;
}

// Does the focus wait at some gate (its item not ready yet, or ready)? Chasing stops when it does not.
bool Stepper::focus_waits_locked() const {
  if (focus_rank_ < 0 && focus_group_.empty()) return false;
  for (const Item& it : candidates_locked())
    if (involves_focus_locked(it)) return true;
  return false;
}

bool Stepper::involves_focus_locked(const Item& it) const {
  if (focus_rank_ >= 0 && (it.members & bit(focus_rank_))) return true;
  if (!focus_group_.empty() && (it.kind == GateKind::Collective || it.kind == GateKind::RingStep)) {
    const GateInfo& g = lanes_[it.lanes.front()].gate;
    if (!g.op.p2p && group_name_locked(g.op.group, g.op.members) == focus_group_) return true;
  }
  return false;
}

bool Stepper::choose_locked(Item& out, std::string& why) const {
  // Settled? Every live rank's compute lane at a gate, and every comm and group lane with a
  // collective in flight idle or at a gate too (a released operation would reach its next ring step). Ring steps of
  // operations in flight go first and need only the comm and group lanes settled: the compute
  // lanes may wait for those very operations.
  uint64_t compute_moving = 0, comm_moving = 0, live = 0, blocked_any = 0, p2p_busy = 0;
  // Stepping pipeline actions, a stage's sends and receives run with its action while a collective
  // inside another stage's action (a tensor-parallel all-reduce) stops: a receive may then wait for
  // a peer held at a gate, also after the next command changed what steps stop at. A lane waiting
  // that way (p2p_wait) counts as still once each of its peers is still: held at a gate with no
  // send/recv of its own in flight (else data may be on its way), finished, or waiting so itself.
  for (int r = 0; r < world_size_; r++)
    for (int l = 1; l < kStepperLanes; l++) {
      const size_t i = static_cast<size_t>(r) * kStepperLanes + static_cast<size_t>(l);
      if (p2p_work_[i] > 0 && !lanes_[i].blocked) p2p_busy |= bit(r);
    }
  uint64_t still = p2p_waiting_;
  for (bool changed = true; changed;) {
    changed = false;
    for (int r = 0; r < world_size_; r++) {
      if (!(still & bit(r))) continue;
      for (int q = 0; q < world_size_; q++) {
        if (!(p2p_peers_[static_cast<size_t>(r)] & bit(q))) continue;
        const bool held = lanes_[static_cast<size_t>(q) * kStepperLanes].blocked && !(p2p_busy & bit(q));
        if ((still & bit(q)) || held || !live_[static_cast<size_t>(q)]) continue;
        still &= ~bit(r);
        changed = true;
        break;
      }
    }
  }
  for (int r = 0; r < world_size_; r++) {
    const size_t base = static_cast<size_t>(r) * kStepperLanes;
    for (int l = 0; l < kStepperLanes; l++)
      if (lanes_[base + static_cast<size_t>(l)].blocked) blocked_any |= bit(r);
    // A collective in flight finishes by itself (every member issued it), so the world waits for
    // it: otherwise a step's snapshot could miss its last ring steps (issue 34's CI: "sent" read one
    // chunk short). A send/recv of the program is never waited for, in any mode: its receive may wait
    // for a send still held at the peer's gate (the random-step test found an interleaved pipeline
    // with fused sends and receives stuck that way under ring steps: stage 1 received in its comm
    // lane while stage 0's send waited behind its next pipeline action's gate).
    for (int l = 1; l < kStepperLanes; l++) {
      const size_t i = base + static_cast<size_t>(l);
      if (work_[i] > 0 && !lanes_[i].blocked && p2p_work_[i] == 0) comm_moving |= bit(r);
    }
    if (!live_[static_cast<size_t>(r)]) continue;
    live |= bit(r);
    if (!lanes_[base].blocked && !(still & bit(r))) compute_moving |= bit(r);
  }
  std::vector<Item> items = candidates_locked();
  const bool ring_pending = std::any_of(items.begin(), items.end(), [](const Item& it) { return it.kind == GateKind::RingStep; });
  const uint64_t moving = comm_moving | (ring_pending ? 0 : compute_moving);
  if (moving) {
    why = "waiting for " + ranks_text(moving) + " to reach a gate";
    return false;
  }
  if (!live && !blocked_any) {
    why = "every rank has finished";
    return false;
  }
  const Item* best = nullptr;
  const Item* best_focus = nullptr;
  for (const Item& it : items) {
    if (!it.ready) continue;
    if (ring_pending && it.kind != GateKind::RingStep) continue;
    if (!best || it.key < best->key) best = &it;
    if (involves_focus_locked(it) && (!best_focus || it.key < best_focus->key)) best_focus = &it;
  }
  if (best_focus) best = best_focus;
  if (!best && !ring_pending) {  // settled, nothing whole: a send may go ahead of its receive (sends are eager)
    for (const Item& it : items)
      if (it.lone_send && (!best || it.key < best->key)) best = &it;
  }
  if (best) {
    out = *best;
    return true;
  }
  // Nothing can be released: say who waits for whom.
  why.clear();
  for (const Item& it : items) {
    const uint64_t missing = it.members & ~it.arrived;
    if (!missing) continue;
    const GateInfo& g = lanes_[it.lanes.front()].gate;
    if (!why.empty()) why += "; ";
    why += (g.label.empty() ? std::string(gate_kind_name(g.kind)) : g.label) + " waits for " + ranks_text(missing);
  }
  if (why.empty()) why = "no gate can open";
  return false;
}

PendingItem Stepper::pending_of_locked(const Item& it) const {
  PendingItem p;
  p.valid = true;
  p.kind = it.kind;
  size_t first = it.lanes.front();
  for (size_t i : it.lanes) first = std::min(first, i);
  p.gate = lanes_[first].gate;
  p.members = ranks_of(it.members);
  p.arrived = ranks_of(it.arrived & it.members);
  p.missing = ranks_of(it.members & ~it.arrived);
  return p;
}

bool Stepper::gate(int rank, int lane, const GateInfo& g) {
  if (GateRelay* r = relay_.load()) return !aborted() && r->gate(rank, lane, g);
  if (rank < 0 || rank >= world_size_ || lane < 0 || lane >= kStepperLanes) return !aborted();
  std::unique_lock<std::mutex> lock(mu_);
  if (stops_locked(g.kind, is_p2p(g)) && !owes_locked(rank, lane, g)) {
    Lane& l = lanes_[static_cast<size_t>(rank) * kStepperLanes + static_cast<size_t>(lane)];
    l.blocked = true;
    l.gate = g;
    const uint64_t mine = l.ticket = ++tickets_;
    generation_++;
    decide_locked();
    cv_.notify_all();  // wait_until_settled() watchers
    cv_.wait(lock, [&] { return aborted_ || l.released_ticket >= mine; });
    pace_model0_ = -1;
  }
  if (aborted_) return false;
  // A gate passed alone (a running world, an owed one, a send ahead of its receive) leaves its
  // operation owed by the members not through yet; a whole item passes all of them at once.
  note_passage_locked(rank, g);
  // Pacing a running world: one modeled second takes 1/speed wall seconds. A command (pause, step,
  // run) interrupts the sleep.
  if (!paused_ && speed_ > 0) {
    auto now = std::chrono::steady_clock::now();
    if (pace_model0_ < 0 || g.model_time < pace_model0_) {
      pace_model0_ = g.model_time;
      pace_wall0_ = now;
    } else {
      auto due = pace_wall0_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>((g.model_time - pace_model0_) / speed_));
      uint64_t gen = generation_;
      cv_.wait_until(lock, due, [&] { return generation_ != gen || aborted_; });
    }
  }
  return !aborted_;
}

StepperState Stepper::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  StepperState s;
  s.paused = paused_;
  s.pause_all = pause_all_;
  s.mode = mode_;
  s.speed = speed_;
  s.gates.resize(lanes_.size());
  for (size_t i = 0; i < lanes_.size(); i++) {
    s.gates[i].blocked = lanes_[i].blocked;
    s.gates[i].lane = static_cast<int>(i % kStepperLanes);
    s.gates[i].gate = lanes_[i].gate;
  }
  if (have_pending_) s.pending = pending_of_locked(pending_);
  // The focus's own next item, ready or not (who it still waits for).
  if (focus_rank_ >= 0 || !focus_group_.empty()) {
    std::vector<Item> items = candidates_locked();
    const Item* f = nullptr;
    for (const Item& it : items)
      if (involves_focus_locked(it) && (!f || it.key < f->key)) f = &it;
    if (f) s.focused = pending_of_locked(*f);
  }
  s.focus_rank = focus_rank_;
  s.focus_group = focus_group_;
  s.waiting = waiting_;
  s.live = live_;
  s.released = released_;
  s.generation = generation_;
  return s;
}

bool Stepper::paused() const {
  if (GateRelay* r = relay_.load()) return r->holding();
  std::lock_guard<std::mutex> lock(mu_);
  return paused_;
}

bool Stepper::holding() const {
  if (GateRelay* r = relay_.load()) return r->holding();
  std::lock_guard<std::mutex> lock(mu_);
  if (!paused_) return false;
  for (const Lane& l : lanes_)
    if (l.blocked) return true;
  return false;
}

bool Stepper::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

bool Stepper::wait_until_settled(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] {
    if (aborted_ || have_pending_) return true;
    bool any_live = false, any_blocked = false;
    for (size_t r = 0; r < live_.size(); r++) any_live = any_live || live_[r];
    for (const Lane& l : lanes_) any_blocked = any_blocked || l.blocked;
    return !any_live && !any_blocked;
  });
}

}  // namespace dtlab
