// Pipeline measurements: per iteration, each rank's bubble (idle time over its replica's makespan,
// on the modeled clock) and its peak in-flight micro-batches, summarised over a run beside the
// formulas of pipeline_schedule.h. The trainer feeds it every world rank's PipelineRankIteration;
// with --tp each pipeline rank is a TP group of neighbouring world ranks (engine/core/mesh.h).
#pragma once
#include <array>
#include <string>
#include <vector>

#include "engine/parallel/pipeline.h"

namespace dtlab {

struct PipelineRankStats {
  int rank = 0;  // world rank = (replica x p + pipe_rank) x tp + tp_rank
  int replica = 0, pipe_rank = 0, tp_rank = 0;
  std::vector<int> stages;
  double bubble = 0;          // mean over iterations of idle / makespan (modeled)
  double formula_bubble = 0;  // formula_bubble(kind, p, m, v, PipelineStats::costs).of_wall
  int peak_inflight = 0, formula_peak_inflight = 0;      // (stage, mb) pairs between F and B or I
  int peak_inflight_w = 0, formula_peak_inflight_w = 0;  // ... between F and B or W (activations held)
};

struct PipelineStats {
  std::string schedule;    // "1F1B"
  int iterations = 0;
  double makespan = 0;     // mean modeled makespan of an iteration's actions, seconds (replica 0)
  ActionCosts costs;       // mean modeled seconds of an F, B, I and W over every rank (1 where none ran)
  std::vector<PipelineRankStats> ranks;  // world rank order
};

// The iteration's bubble of every rank: (makespan - busy) / makespan, where the makespan runs from
// the first action's start to the last action's end over the ranks of the same replica, the
// `ranks_per_replica` consecutive world ranks (p x tp).
std::vector<double> pipeline_bubbles(const std::vector<PipelineRankIteration>& world, int ranks_per_replica);

class PipelineMeter {
 public:
  // `tp`: world ranks per pipeline rank (--tp).
  explicit PipelineMeter(const PipelinePlan& plan, int tp = 1);
  // One iteration: every world rank's record, in world rank order. Returns each rank's bubble.
  std::vector<double> add(const std::vector<PipelineRankIteration>& world);
  PipelineStats stats() const;

 private:
  const PipelinePlan& plan_;
  int tp_ = 1;
  int iterations_ = 0;
  double makespan_sum_ = 0;
  std::vector<double> bubble_sum_, peak_, peak_w_;
  std::array<double, 4> time_{}, count_{};  // per ActionType, over every rank and iteration
};

}  // namespace dtlab
