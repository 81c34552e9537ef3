// The pipeline view's data, kept by the SnapshotBuilder: the planned schedule, and per iteration
// every rank's finished actions from PipelineAction events (ingested as they arrive), turned once a
// frame into Snapshot::pipeline. Measured bubbles use the runtime's own formula (pipeline_bubbles),
// so the view and the StepReport agree to the bit.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "app/snapshot.h"
#include "engine/train/train.h"

namespace dtlab::app {

class PipelineTracker {
 public:
  // `plan` null: not a pipeline run (the view stays invalid). `tp`: world ranks per pipeline rank
  // (--tp); world rank = (replica x p + pipeline rank) x tp + tp rank.
  void reset(const PipelinePlan* plan, int world_size, int tp, PipelineView& out);
  void ingest(int rank, const Event& e);  // PipelineAction events; others are ignored
  void add_report(const StepReport& r);   // the runtime's bubbles of step r.step (iteration step - 1)
  // Refreshes `out`: the shown iteration's actions, bubbles and costs when something arrived, and
  // which ranks wait at an action gate (every frame).
  void build(const StepperState& st, PipelineView& out);

 private:
  using Iteration = std::vector<std::vector<PipelineActionView>>;  // [world rank] finished actions
  void set_rows(int replica, int tp_rank, PipelineView& out);  // the chart's rows: that replica's pipeline ranks
  bool complete(const Iteration& it) const;
  void measure(const Iteration& it, PipelineView& out) const;

  int p_ = 1, tp_ = 1, world_ = 0;
  std::vector<std::string> stage_names_;     // per pipeline rank: "stage 1", "stages 0, 2"
  std::vector<int> planned_;                 // per pipeline rank: actions in its row
  std::map<int32_t, Iteration> iterations_;  // the last few, by iteration
  std::map<int32_t, std::vector<double>> reported_;  // iteration -> StepReport.bubble
  bool dirty_ = false;
  std::optional<ActionCosts> fixed_;         // --unit-costs: what an action type not measured yet costs
};

}  // namespace dtlab::app
