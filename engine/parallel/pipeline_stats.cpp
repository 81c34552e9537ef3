#include "engine/parallel/pipeline_stats.h"

#include <algorithm>

#include "engine/core/check.h"

namespace dtlab {

namespace {

struct Window {
  double begin = 0, end = 0;
};

// The span of replica d's actions in one iteration; its ranks are the `n` from d x n.
Window replica_window(const std::vector<PipelineRankIteration>& world, int n, int d) {
  Window w{world[static_cast<size_t>(d * n)].first_begin, world[static_cast<size_t>(d * n)].last_end};
  for (int r = d * n; r < (d + 1) * n; r++) {
    w.begin = std::min(w.begin, world[static_cast<size_t>(r)].first_begin);
    w.end = std::max(w.end, world[static_cast<size_t>(r)].last_end);
  }
  return w;
}

}  // namespace

std::vector<double> pipeline_bubbles(const std::vector<PipelineRankIteration>& world, int n) {
  DTLAB_CHECK(n >= 1 && world.size() % static_cast<size_t>(n) == 0, "pipeline_bubbles needs whole replicas");
  std::vector<double> out;
  for (size_t r = 0; r < world.size(); r++) {
    const Window w = replica_window(world, n, static_cast<int>(r) / n);
    const double makespan = w.end - w.begin;
    out.push_back(makespan > 0 ? (makespan - world[r].busy) / makespan : 0);
  }
  return out;
}

PipelineMeter::PipelineMeter(const PipelinePlan& plan, int tp) : plan_(plan), tp_(tp) {}

std::vector<double> PipelineMeter::add(const std::vector<PipelineRankIteration>& world) {
  const size_t n = world.size();
  if (bubble_sum_.empty()) bubble_sum_.assign(n, 0), peak_.assign(n, 0), peak_w_.assign(n, 0);
  DTLAB_CHECK(bubble_sum_.size() == n, "every iteration reports the same ranks");
  std::vector<double> bubbles = pipeline_bubbles(world, plan_.ranks() * tp_);
  for (size_t r = 0; r < n; r++) {
    bubble_sum_[r] += bubbles[r];
    peak_[r] = std::max(peak_[r], world[r].peak_inflight);
    peak_w_[r] = std::max(peak_w_[r], world[r].peak_inflight_w);
    for (int t = 0; t < 4; t++) time_[t] += world[r].time[t], count_[t] += world[r].count[t];
  }
  const Window w = replica_window(world, plan_.ranks() * tp_, 0);
  makespan_sum_ += w.end - w.begin;
  iterations_++;
  return bubbles;
}

PipelineStats PipelineMeter::stats() const {
  PipelineStats s;
  s.schedule = plan_.schedule.name;
  s.iterations = iterations_;
  if (iterations_ == 0) return s;
  s.makespan = makespan_sum_ / iterations_;
  double* mean[4] = {&s.costs.forward, &s.costs.backward, &s.costs.backward_input, &s.costs.backward_weight};
  for (int t = 0; t < 4; t++)
    if (count_[t] > 0) *mean[t] = time_[t] / count_[t];
  const PipelineOptions& o = plan_.options;
  const double formula = formula_bubble(o.schedule, o.stages, o.microbatches, o.chunks, s.costs).of_wall;
  for (size_t r = 0; r < bubble_sum_.size(); r++) {
    PipelineRankStats x;
    x.rank = static_cast<int>(r);
    x.replica = x.rank / (o.stages * tp_);
    x.pipe_rank = x.rank / tp_ % o.stages;
    x.tp_rank = x.rank % tp_;
    x.stages = plan_.stages_of_rank(x.pipe_rank);
    x.bubble = bubble_sum_[r] / iterations_;
    x.formula_bubble = formula;
    x.peak_inflight = static_cast<int>(peak_[r]);
    x.peak_inflight_w = static_cast<int>(peak_w_[r]);
    x.formula_peak_inflight = formula_peak_inflight(o.schedule, x.pipe_rank, o.stages, o.microbatches, o.chunks);
    x.formula_peak_inflight_w = formula_peak_inflight(o.schedule, x.pipe_rank, o.stages, o.microbatches, o.chunks,
                                                      InflightUntil::BackwardWeight);
    s.ranks.push_back(std::move(x));
  }
  return s;
}

}  // namespace dtlab
