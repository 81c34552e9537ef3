// The Session runs one training run (engine/train Trainer) on a worker thread and turns what the
// engine records into one Snapshot per frame. It is the only app file that touches engine objects;
// views read the Snapshot. Restarting (a new configuration, or reset) aborts the run cleanly — every
// rank's wait returns — joins the worker and starts a fresh Trainer.
#pragma once
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "app/pipeline_tracker.h"
#include "app/snapshot.h"
#include "engine/train/train.h"

namespace dtlab::app {

class Session {
 public:
  // Throws dtlab::Error for a configuration the engine rejects (before any thread starts).
  explicit Session(const TrainConfig& config);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const TrainConfig& config() const { return config_; }
  // Stops the current run and starts `config` (same start state: paused or running). Throws
  // dtlab::Error for a rejected configuration, keeping the current run.
  void restart(const TrainConfig& config);
  void reset() { restart(config_); }

  // Controls (the stepper's commands).
  void run(double speed = 0);
  void pause();
  void step(GateKind kind);
  bool paused() const;
  double speed() const { return speed_; }

  // The data view's set_epoch switch.
  void set_data_set_epoch(bool on) { data_set_epoch_ = on; }

  // Pulls what happened since the last call; call once per frame from the UI thread.
  const Snapshot& update();
  const Snapshot& snapshot() const { return snap_; }

  // True when every rank waits at a gate, or the run ended: nothing moves until a command.
  bool settled() const;
  // Waits (polling the engine) until settled() or the timeout; for scripts and tests.
  bool wait_settled(std::chrono::milliseconds timeout) const;
  bool finished() const { return done_.load(); }

 private:
  void start();
  void stop();
  void ingest(int rank, const Event& e);
  void ingest_unit(int rank, const FsdpInfo& f);
  void build_collective();
  void build_data();
  void reset_derived();

  TrainConfig config_;
  std::unique_ptr<Trainer> trainer_;
  std::thread worker_;
  std::atomic<bool> done_{false};
  mutable std::mutex mu_;  // guards reports_, error_
  std::vector<StepReport> reports_;
  std::string error_;
  double speed_ = 0;
  bool data_set_epoch_ = true;

  // derived state, UI thread only
  Snapshot snap_;
  std::vector<uint64_t> next_order_;       // per rank: first recorder order not yet seen
  std::map<uint64_t, CollectiveInfo> issued_;  // seq -> what was issued (rank 0's issue event)
  std::map<uint64_t, std::vector<int>> coll_done_;  // seq -> per rank: 1 once its Collective event came
  std::map<uint64_t, std::vector<int>> coll_steps_;  // seq -> per rank steps finished
  std::map<uint64_t, double> coll_wall_s_;          // seq -> rank 0's wall duration
  uint64_t shown_seq_ = UINT64_MAX;
  int32_t bucket_iteration_ = -1;
  int ready_counter_ = 0, launch_counter_ = 0;
  int64_t data_epoch_ = -1;
  std::map<std::string, int64_t> param_numel_;  // parameter name -> elements (FSDP unit layouts)
  bool data_set_epoch_built_ = true;
  PipelineTracker pipeline_;  // pipeline runs: the schedule as planned and as it ran
};

}  // namespace dtlab::app
