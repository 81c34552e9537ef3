#include "app/pipeline_tracker.h"

#include <optional>

#include <algorithm>
#include <iterator>

#include "engine/core/format.h"

namespace dtlab::app {

namespace {

constexpr size_t kKeepPipelineIterations = 3;

// Mean durations per action type over `its` on one clock; types that did not run borrow from the
// others (I and W halves of B, B their sum), so a schedule compared with this run can be timed too.
// `fixed`: --unit-costs' costs, which stand for the types not measured yet.
ActionCosts mean_costs(const std::vector<const std::vector<PipelineActionView>*>& rows, bool model, bool& measured,
                       const std::optional<ActionCosts>& fixed) {
  double sum[4] = {}, count[4] = {};
  for (const auto* row : rows)
    for (const PipelineActionView& a : *row) {
      const int t = static_cast<int>(a.action.type);
      if (t > 3) continue;
      sum[t] += model ? a.model_end - a.model_begin : static_cast<double>(a.wall_end_ns - a.wall_begin_ns) * 1e-9;
      count[t] += 1;
    }
  measured = count[0] > 0;
  ActionCosts c = fixed.value_or(ActionCosts{});
  double* field[4] = {&c.forward, &c.backward, &c.backward_input, &c.backward_weight};
  for (int t = 0; t < 4; t++)
    if (count[t] > 0) *field[t] = sum[t] / count[t];
  if (count[1] == 0 && count[2] > 0 && count[3] > 0) c.backward = c.backward_input + c.backward_weight;
  if (count[1] > 0 && count[2] == 0) c.backward_input = c.backward / 2;
  if (count[1] > 0 && count[3] == 0) c.backward_weight = c.backward / 2;
  // Forwards measured, no backward yet (stepping the warm-up): a Linear's backward computes two
  // products where its forward computes one (docs/course_sources.md §14), so the plan's unrun
  // actions are drawn at 2 T_F (I and W at T_F each), not the placeholder 1 s that stretched the
  // time axis to 10 s around nanosecond forwards.
  if (!fixed && count[0] > 0 && count[1] == 0 && count[2] == 0 && count[3] == 0) {
    c.backward = 2 * c.forward;
    c.backward_input = c.backward_weight = c.forward;
  }
  return c;
}

}  // namespace

void PipelineTracker::reset(const PipelinePlan* plan, int world_size, int tp, PipelineView& out) {
  out = PipelineView{};
  iterations_.clear();
  reported_.clear();
  planned_.clear();
  dirty_ = false;
  if (!plan) return;
  const PipelineOptions& o = plan->options;
  p_ = o.stages;
  tp_ = std::max(1, tp);
  world_ = world_size;
  out.valid = true;
  out.kind = o.schedule;
  out.p = o.stages, out.m = o.microbatches, out.v = o.chunks, out.dp = o.dp, out.tp = tp_;
  out.unit_costs = o.fixed_costs.has_value();
  fixed_ = o.fixed_costs;
  out.plan = plan->schedule;
  if (o.fixed_costs) out.model_costs = out.wall_costs = *o.fixed_costs;
  out.formula = formula_bubble(o.schedule, o.stages, o.microbatches, o.chunks, out.model_costs);
  for (int r = 0; r < p_; r++) {
    const auto& row = plan->schedule.order[static_cast<size_t>(r)];
    planned_.push_back(static_cast<int>(std::count_if(row.begin(), row.end(), [](const auto& a) { return a.has_value(); })));
    out.formula_peak.push_back(formula_peak_inflight(o.schedule, r, o.stages, o.microbatches, o.chunks));
  }
  out.ranks.resize(static_cast<size_t>(world_size));
  const MeshShape mesh{world_size / (p_ * tp_), p_, tp_};
  for (int r = 0; r < world_size; r++) {
    const MeshCoord c = mesh_coord(mesh, r);
    out.ranks[static_cast<size_t>(r)].pipe_rank = c.pp, out.ranks[static_cast<size_t>(r)].replica = c.dp;
  }
  stage_names_.clear();
  for (int r = 0; r < p_; r++) {
    std::vector<std::string> stages;
    for (int st : plan->stages_of_rank(r)) stages.push_back(std::to_string(st));
    stage_names_.push_back((stages.size() == 1 ? "stage " : "stages ") + join(stages, ", "));
  }
  set_rows(0, 0, out);
}

// The chart's rows: one replica's pipeline ranks (at one TP coordinate), each named by its stages
// and its TP group's ranks.
void PipelineTracker::set_rows(int replica, int tp_rank, PipelineView& out) {
  const MeshShape mesh{world_ / (p_ * tp_), p_, tp_};
  out.replica = replica;
  out.rows.clear();
  for (int r = 0; r < p_; r++) {
    PipelineRowView row;
    row.rank = mesh_rank(mesh, MeshCoord{replica, r, tp_rank});
    row.ranks = rank_runs_text(mesh_group(mesh, MeshDim::TP, row.rank));
    row.label = stage_names_[static_cast<size_t>(r)] + ": " + row.ranks;
    out.rows.push_back(std::move(row));
  }
  out.replica_ranks = rank_runs_text(mesh_ranks_at(mesh, MeshDim::DP, replica));
}

void PipelineTracker::ingest(int rank, const Event& e) {
  if (e.kind != EventKind::PipelineAction || e.iteration < 0 || rank < 0 || rank >= world_) return;
  Iteration& it = iterations_[e.iteration];
  if (it.empty()) it.resize(static_cast<size_t>(world_));
  const PipelineActionInfo& pi = e.pipe;
  it[static_cast<size_t>(rank)].push_back({Action{pi.stage, pi.type, pi.mb}, pi.step, e.model_begin, e.model_end,
                                           e.wall_begin_ns, e.wall_end_ns, pi.bytes});
  while (iterations_.size() > kKeepPipelineIterations) iterations_.erase(iterations_.begin());
  dirty_ = true;
}

void PipelineTracker::add_report(const StepReport& r) {
  if (r.bubble.empty()) return;
  reported_[static_cast<int32_t>(r.step - 1)] = r.bubble;
  while (reported_.size() > kKeepPipelineIterations) reported_.erase(reported_.begin());
  dirty_ = true;
}

bool PipelineTracker::complete(const Iteration& it) const {
  for (size_t r = 0; r < it.size(); r++)
    if (static_cast<int>(it[r].size()) < planned_[r / static_cast<size_t>(tp_) % static_cast<size_t>(p_)]) return false;
  return it.size() == static_cast<size_t>(world_);
}

// Bubbles of a finished iteration, by the runtime's own formula over the same modeled times.
void PipelineTracker::measure(const Iteration& it, PipelineView& out) const {
  std::vector<PipelineRankIteration> world(it.size());
  for (size_t r = 0; r < it.size(); r++) {
    if (it[r].empty()) continue;
    world[r].first_begin = it[r].front().model_begin;
    world[r].last_end = it[r].back().model_end;
    for (const PipelineActionView& a : it[r]) world[r].busy += a.model_end - a.model_begin;
  }
  const std::vector<double> bubbles = pipeline_bubbles(world, p_ * tp_);
  auto rep = reported_.find(out.bubble_iteration);
  for (size_t r = 0; r < it.size(); r++) {
    out.ranks[r].bubble = bubbles[r];
    out.ranks[r].reported_bubble = rep != reported_.end() && r < rep->second.size() ? rep->second[r] : -1;
  }
}

void PipelineTracker::build(const StepperState& st, PipelineView& out) {
  if (!out.valid) return;
  // The rows follow the focus: the focused rank's replica (and TP rank), or the focused group's
  // lowest member's; replica 0 without a focus.
  int focus = st.focus_rank;
  if (focus < 0 && !st.focus_group.empty() && st.focused.valid && !st.focused.members.empty()) focus = st.focused.members.front();
  const MeshShape mesh{world_ / (p_ * tp_), p_, tp_};
  const MeshCoord fc = focus >= 0 && focus < world_ ? mesh_coord(mesh, focus) : MeshCoord{0, 0, 0};
  if (fc.dp != out.replica || out.rows.empty() || out.rows.front().rank != mesh_rank(mesh, MeshCoord{fc.dp, 0, fc.tp}))
    set_rows(fc.dp, fc.tp, out);
  for (size_t r = 0; r < out.ranks.size(); r++) {
    const size_t g = r * kStepperLanes;  // the compute lane's gate
    out.ranks[r].at_gate = g < st.gates.size() && st.gates[g].blocked && st.gates[g].gate.kind == GateKind::Action;
  }
  if (!dirty_ || iterations_.empty()) return;
  dirty_ = false;
  const auto shown = std::prev(iterations_.end());
  out.iteration = shown->first;
  out.complete = complete(shown->second);
  for (size_t r = 0; r < out.ranks.size(); r++) {
    PipelineRankView& rv = out.ranks[r];
    rv.done = shown->second[r];
    rv.next = static_cast<int>(rv.done.size());
    int inflight = 0;
    rv.peak_inflight = 0;
    for (const PipelineActionView& a : rv.done) {
      if (a.action.type == ActionType::Forward) inflight++;
      if (a.action.type == ActionType::Backward || a.action.type == ActionType::BackwardInput) inflight--;
      rv.peak_inflight = std::max(rv.peak_inflight, inflight);
    }
  }
  // The bubbles: of the shown iteration once finished, else of the one before it.
  const Iteration* finished = out.complete ? &shown->second : nullptr;
  out.bubble_iteration = out.complete ? shown->first : -1;
  if (!finished && shown != iterations_.begin()) {
    const auto prev = std::prev(shown);
    if (complete(prev->second)) finished = &prev->second, out.bubble_iteration = prev->first;
  }
  if (finished) measure(*finished, out);
  // Mean action costs over the shown iteration and the finished one.
  std::vector<const std::vector<PipelineActionView>*> rows;
  for (const auto& row : shown->second) rows.push_back(&row);
  if (finished && finished != &shown->second)
    for (const auto& row : *finished) rows.push_back(&row);
  bool measured = false, wall_measured = false;
  const ActionCosts model = mean_costs(rows, true, measured, fixed_), wall = mean_costs(rows, false, wall_measured, fixed_);
  if (measured) {
    out.model_costs = model, out.wall_costs = wall, out.costs_measured = true;
    out.formula = formula_bubble(out.kind, out.p, out.m, out.v, out.model_costs);
  }
}

}  // namespace dtlab::app
