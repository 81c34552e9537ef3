#include "app/alltoall_tracker.h"

#include <algorithm>

#include "engine/comm/queued_comm.h"  // dtype_word
#include "engine/core/format.h"

namespace dtlab::app {

void AllToAllTracker::reset() {
  tracks_.clear();
  newest_ = {0, 0};
  newest_order_ = 0;
  any_ = false;
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
      if (!any_ || e.order > newest_order_) newest_ = k, newest_order_ = e.order, any_ = true;
      // Forget the oldest beyond kKept (never the newest).
      while (tracks_.size() > kKept) {
        auto oldest = std::min_element(tracks_.begin(), tracks_.end(),
                                       [](const auto& a, const auto& b) { return a.second.order < b.second.order; });
        tracks_.erase(oldest);
      }
    }
    t.in_bytes[rank] = e.coll.in_count * dtype_size(e.coll.dtype);
    t.out_bytes[rank] = e.coll.bytes;
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

void AllToAllTracker::build(const std::map<int32_t, std::vector<int>>& group_ranks,
                            const std::map<int32_t, std::string>& group_names, int world, AllToAllView& out) const {
  out = AllToAllView{};
  auto it = tracks_.find(newest_);
  if (!any_ || it == tracks_.end()) return;
  const Track& t = it->second;
  std::vector<int> members;
  if (newest_.first != 0) {
    auto g = group_ranks.find(newest_.first);
    if (g == group_ranks.end()) return;  // its label not read yet
    members = g->second;
  } else {
    for (int r = 0; r < world; r++) members.push_back(r);
  }
  const int n = static_cast<int>(members.size());
  out.valid = true;
  out.seq = newest_.second;
  out.group = newest_.first;
  if (auto nm = group_names.find(newest_.first); nm != group_names.end()) out.group_name = nm->second;
  out.members = members;
  out.dtype = t.dtype;
  out.n = n;
  out.steps = n - 1;
  out.bytes.assign(static_cast<size_t>(n * n), -1);
  out.sent.assign(static_cast<size_t>(n), -1);
  out.steps_done = out.steps;
  bool all_done = true;
  for (int i = 0; i < n; i++) {
    const int g = members[static_cast<size_t>(i)];
    auto in = t.in_bytes.find(g);
    auto left = t.out_bytes.find(g);
    if (in != t.in_bytes.end() && left != t.out_bytes.end()) {
      out.sent[static_cast<size_t>(i)] = left->second;
      // A rank's own block never leaves it: all_to_all_v's bytes count only what leaves.
      const int64_t self = in->second - left->second;
      if (self >= 0) out.bytes[static_cast<size_t>(i * n + i)] = self;
    }
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
              " all_to_all of " + dtype_word(out.dtype) + ", " + human_bytes(out.total) + (out.in_flight ? " so far" : "");
}

}  // namespace dtlab::app
