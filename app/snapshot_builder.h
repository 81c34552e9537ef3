// Turns what a run records into the Snapshot the views read (app/snapshot.h): every rank's events
// as they arrive, the world's status, the step reports. It keeps what is derived from them (which
// collective is shown and what its buffers hold, the buckets' states, FSDP units, the pipeline as it
// ran, the data's owners) and knows nothing of threads or of where the run runs: the Session feeds it
// once a frame from a Trainer or a monitor connection; a test feeds it a TraceRecorder it filled.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "app/alltoall_tracker.h"
#include "app/pipeline_tracker.h"
#include "app/snapshot.h"
#include "engine/monitor/monitor.h"
#include "engine/train/train.h"

namespace dtlab::app {

// The stepper's held item in a line: "tp1 #3 allreduce of 4096 float32 (sum, ring) [ranks 2, 3]",
// with the members still missing when there are ("... [ranks 0, 1; waiting for 1]").
std::string pending_text(const PendingItem& p);

// One line under the toolbar's status: what the paused world does next, why (DDP's constructor
// checks, a bucket's all-reduce, ...), and which key does what from here ("Next: bucket 0's
// all-reduce ... C runs it whole; R enters it and stops before ring step 1; I finishes iteration 1").
// "" while running, finished or not settled.
std::string next_hint(const Snapshot& s);

// What each transfer of step `plan` of the collective `cv` moves on the modeled clock: a ring chunk
// S/n; the whole buffer for the binomial tree and naive; a double-tree chunk S/2K; an in-network
// chunk S/K; hierarchical S/G inside a node and S/(G N) across nodes (docs/course_sources.md §6b).
double modeled_step_bytes(const CollectiveView& cv, const CostModel& cost, const std::vector<StepTransfer>& plan);

// What the builder reads of a run besides its events, fixed for the run's life. The objects must
// outlive the builder's use of them (until the next reset).
struct RunSources {
  const TrainConfig* config = nullptr;
  const Model* model = nullptr;            // parameter names and sizes (FSDP frees the storage; counts stay)
  const Dataset* dataset = nullptr;
  const PipelinePlan* pipeline = nullptr;  // pipeline runs; else null
  const CostModel* cost = nullptr;         // the collective's prediction; null: none
  int64_t total_steps = 0;
  std::string backend;                     // threads | socket | cuda | nccl
  std::string attached;                    // HOST:PORT of a launched run's monitor; "" for a run here
  int node_size = 0;                       // HYBRID_SHARD: ranks per shard group
  Roof roof;                               // what a rank's kernels are held to (engine/trace/roofline.h)
};

// At kHistoryExact + kHistoryThinned points (app/snapshot.h), the points older than the newest
// kHistoryExact are thinned to every second.
void thin_history(std::vector<StepPoint>& history);

class SnapshotBuilder {
 public:
  // Starts over for a new run: an empty Snapshot with the run's configuration and parameters.
  void reset(const RunSources& run);
  const Snapshot& snapshot() const { return snap_; }
  // The data view's set_epoch switch: false shows every epoch with epoch 0's order.
  void set_data_set_epoch(bool on) { data_set_epoch_ = on; }

  // One frame: begin_frame, then what the run reports, then finish_frame.
  void begin_frame(std::shared_ptr<const ImportedTrace> trace);
  void add_events(const TraceRecorder& rec);  // every rank's events since the last call
  void set_stepper(StepperState st);
  size_t collectives_kept() const { return issued_.size(); }  // what prune_collectives bounds (tests)
  // The reports since the last call (the builder keeps what the views need, bounded), the run's
  // failure, and whether it ended.
  void set_reports(const std::vector<StepReport>& fresh, const std::string& error, bool done);
  // The in-process world: activities, and which ranks the oldest collective in flight waits for.
  void set_world_status(const WorldStatus& ws);
  // A launched world: each rank's own status (activities, memory, the collective it is in).
  void set_rank_statuses(const std::vector<RankMonitorStatus>& ranks);
  void set_activities(std::vector<std::string> compute, std::vector<std::string> comm);
  void set_memory(int rank, const MemoryStats& stats);
  void set_device_memory(int rank, int64_t used, int64_t total);  // -1: not a GPU
  // MoE runs: the routing the Session read while the run stood still (the Experts view).
  void set_experts(ExpertsView v) { snap_.experts = std::move(v); }
  void set_experts_current(bool current) { snap_.experts.current = current; }
  // --cp runs: the chunks and ring passes the Session read while the run stood still (the Context view).
  void set_context(ContextView v) { snap_.context = std::move(v); }
  // Derives the shown collective, the data's owners and the pipeline's rows.
  const Snapshot& finish_frame();

 private:
  void ingest(const TraceRecorder& rec, int rank, const Event& e);
  void ingest_collective(int rank, const Event& e);
  void ingest_unit(const TraceRecorder& rec, int rank, const FsdpInfo& f);
  void lay_out_replicated_units();  // UnitView::steps, once the units' sizes are known
  void ingest_bucket(const TraceRecorder& rec, const Event& e);  // rank 0's reducer
  void trim_events(int32_t newest_iter);
  void build_collective();
  void build_bucket_parts();
  void label_collective(bool all_done);
  void fill_cells();
  void fill_planned_cells();
  void build_data();
  void name_data_owners();
  void assign_dp_owners(int64_t shown);

  RunSources run_;
  int world_ = 1;
  Snapshot snap_;
  bool done_ = false;                      // the run ended (from set_reports)
  int64_t epoch_ = 0;                      // the last report's epoch
  bool data_set_epoch_ = true;
  std::vector<uint64_t> next_order_;       // per rank: first recorder order not yet seen
  // Collectives are keyed by (group, seq): 0 for the world, else CollectiveInfo::group, whose seq
  // counts that process group's own collectives.
  using CollKey = std::pair<int32_t, uint64_t>;
  std::map<CollKey, CollectiveInfo> issued_;  // what was issued (the first issue event seen)
  std::map<CollKey, std::vector<int>> coll_done_;  // per global rank: 1 once its Collective event came
  std::map<CollKey, std::vector<int>> coll_steps_;  // per global rank steps finished
  std::map<CollKey, double> coll_wall_s_;          // the first member's wall duration
  std::map<CollKey, uint64_t> coll_first_order_;   // the recorder order of its first step or end seen
  std::map<int32_t, std::vector<int>> group_ranks_;  // group -> its global ranks (from its label)
  std::map<int32_t, std::string> group_names_;       // group -> "tp0"
  bool held_ = false;  // the shown collective is the one the stepper holds (snap_.held)
  uint64_t shown_seq_ = UINT64_MAX;
  int32_t shown_group_ = 0;
  uint64_t shown_order_ = 0;  // coll_first_order_ of the shown one
  void show_latest(CollKey k, uint64_t order);  // shows k if it started after the shown one
  void hold_stepped_op();   // the stepper's held collective is the one the views show
  void light_mesh_group();  // the mesh view lights the shown collective's group (or the held pair)
  void learn_group(const TraceRecorder& rec, int32_t group);
  // Forgets collectives more than kKeptCollectives older than their group's newest (never the shown
  // one): the maps above grew by every collective of the run.
  void prune_collectives();
  std::map<int32_t, uint64_t> newest_seq_;  // group -> the highest seq seen
  void note_seq(int32_t group, uint64_t seq) {
    uint64_t& n = newest_seq_[group];
    n = std::max(n, seq);
  }
  int32_t bucket_iteration_ = -1;
  int ready_counter_ = 0, launch_counter_ = 0;
  int64_t data_epoch_ = -1;
  std::map<std::string, int64_t> param_numel_;  // parameter name -> elements (FSDP unit layouts)
  std::map<std::string, Shape> param_shape_;     // parameter name -> shape (FSDP2's dim-0 split)
  bool data_set_epoch_built_ = true;
  PipelineTracker pipeline_;  // pipeline runs: the schedule as planned and as it ran
  AllToAllTracker alltoall_;  // the newest all-to-alls, pair by pair
};

}  // namespace dtlab::app
