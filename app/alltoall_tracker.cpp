#include "app/alltoall_tracker.h"

#include <algorithm>

#include "engine/comm/queued_comm.h"  // dtype_word
#include "engine/core/format.h"

namespace dtlab::app {

void AllToAllTracker::reset() {
  tracks_.clear();
  newest_.clear();
}

void AllToAllTracker::ingest(int rank, const Event& e) {
  if (e.kind == EventKind::CollectiveIssue || e.kind == EventKind::Collective) {
    if (e.coll.op != CollectiveOp::AllToAll) return;
    const Key k{e.coll.group, e.coll.seq};
    auto [it, fresh] = tracks_.try_emplace(k);
    Track& t = it->second;
    if (fresh) {
      t.order = e.order;
      t.dtype = e.coll.dtype;
      t.split_sizes = e.coll.split_sizes;
      t.algo = e.coll.algo;
      auto nw = newest_.find(k.first);
      if (nw == newest_.end() || tracks_.at(nw->second).order < e.order) newest_[k.first] = k;
      // Forget the oldest beyond kKept, never a group's newest. That may be this one (a rank's old
      // issue read after newer ones): then there is nothing left to record it in.
      bool forgotten = false;
      while (tracks_.size() > kKept + newest_.size()) {
        auto oldest = tracks_.end();
        for (auto c = tracks_.begin(); c != tracks_.end(); ++c)
          if (newest_.at(c->first.first) != c->first && (oldest == tracks_.end() || c->second.order < oldest->second.order)) oldest = c;
        if (oldest == tracks_.end()) break;
        forgotten = forgotten || oldest == it;
        tracks_.erase(oldest);
      }
      if (forgotten) return;
    }
    const int64_t size = dtype_size(e.coll.dtype);
    t.kept_bytes[rank] = e.coll.kept_count * size;
    t.sent_bytes[rank] = (e.coll.in_count - e.coll.kept_count) * size;
    if (e.kind == EventKind::Collective) t.done[rank] = true;
    return;
  }
  if (e.kind != EventKind::RingStep) return;
  auto it = tracks_.find(Key{e.step.group, e.step.seq});
  if (it == tracks_.end()) return;  // not an all-to-all's step (or one already forgotten)
  Track& t = it->second;
  t.pairs[{e.step.src, e.step.dst}] = e.step.bytes;
  int& s = t.steps[rank];
  s = std::max(s, static_cast<int>(e.step.step) + 1);
}

bool AllToAllTracker::view_of(const Key& k, const Track& t, const std::map<int32_t, std::vector<int>>& group_ranks,
                              const std::map<int32_t, std::string>& group_names, int world, AllToAllView& out) const {
  out = AllToAllView{};
  std::vector<int> members;
  if (k.first != 0) {
    auto g = group_ranks.find(k.first);
    if (g == group_ranks.end()) return false;  // its label not read yet
    members = g->second;
  } else {
    for (int r = 0; r < world; r++) members.push_back(r);
  }
  const int n = static_cast<int>(members.size());
  out.valid = true;
  out.seq = k.second;
  out.group = k.first;
  if (auto nm = group_names.find(k.first); nm != group_names.end()) out.group_name = nm->second;
  out.members = members;
  out.dtype = t.dtype;
  out.split_sizes = t.split_sizes;
  out.n = n;
  out.algo = t.algo;
  out.steps = t.algo == Algorithm::Grouped ? std::min(n - 1, 1) : n - 1;
  out.bytes.assign(static_cast<size_t>(n * n), -1);
  out.sent.assign(static_cast<size_t>(n), -1);
  out.steps_done = out.steps;
  bool all_done = true;
  for (int i = 0; i < n; i++) {
    const int g = members[static_cast<size_t>(i)];
    // A rank's own block never leaves it: its issue says how large it is and what goes to the others.
    if (auto kept = t.kept_bytes.find(g); kept != t.kept_bytes.end()) out.bytes[static_cast<size_t>(i * n + i)] = kept->second;
    if (auto sent = t.sent_bytes.find(g); sent != t.sent_bytes.end()) out.sent[static_cast<size_t>(i)] = sent->second;
    auto d = t.done.find(g);
    const bool done = d != t.done.end() && d->second;
    all_done = all_done && done;
    auto s = t.steps.find(g);
    const int steps = done ? out.steps : s != t.steps.end() ? s->second : 0;
    out.steps_done = std::min(out.steps_done, steps);
    if (s != t.steps.end()) out.newest_step = std::max(out.newest_step, s->second - 1);
  }
  for (const auto& [pair, b] : t.pairs) {
    const auto src = std::find(members.begin(), members.end(), pair.first);
    const auto dst = std::find(members.begin(), members.end(), pair.second);
    if (src == members.end() || dst == members.end() || src == dst) continue;
    out.bytes[static_cast<size_t>((src - members.begin()) * n + (dst - members.begin()))] = b;
    out.total += b;
  }
  out.in_flight = !all_done;
  out.label = (out.group_name.empty() ? std::string("world") : out.group_name) + " #" + std::to_string(out.seq) +
              (out.split_sizes ? " all_to_all_v of " : " all_to_all of ") + dtype_word(out.dtype) + ", " + human_bytes(out.total) +
              (out.in_flight ? " so far" : "");
  return true;
}

void AllToAllTracker::build(const std::map<int32_t, std::vector<int>>& group_ranks, const std::map<int32_t, std::string>& group_names,
                            int world, const PendingItem& held, std::vector<AllToAllView>& groups, AllToAllView& shown,
                            bool& follows_held) const {
  groups.clear();
  shown = AllToAllView{};
  follows_held = false;
  std::vector<std::pair<uint64_t, Key>> by_age;  // (order, key), the newest first
  for (const auto& [group, k] : newest_) by_age.emplace_back(tracks_.at(k).order, k);
  std::sort(by_age.begin(), by_age.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [order, k] : by_age) {
    AllToAllView v;
    if (view_of(k, tracks_.at(k), group_ranks, group_names, world, v)) groups.push_back(std::move(v));
  }
  if (groups.empty()) return;
  shown = groups.front();
  const bool held_collective = held.valid && (held.kind == GateKind::Collective || held.kind == GateKind::RingStep) &&
                               !held.gate.op.p2p && !held.gate.op2.p2p;
  if (!held_collective) return;
  for (const AllToAllView& v : groups)
    if (v.group == held.gate.trace_group) {
      shown = v;
      follows_held = true;
    }
}

const AllToAllView& pick_alltoall(const Snapshot& s, int32_t group) {
  if (!s.alltoall_held && group >= 0)
    for (const AllToAllView& v : s.alltoall_groups)
      if (v.group == group) return v;
  return s.alltoall;
}

}  // namespace dtlab::app
