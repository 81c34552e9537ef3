// The Session runs one training run (engine/train Trainer) on a worker thread and, once a frame,
// hands what the engine recorded to its SnapshotBuilder (app/snapshot_builder.h), which makes the
// Snapshot the views read. Or it is attached to a launched world of processes (engine/monitor: rank
// 0's hub), whose events, stepper and status arrive over a local socket: the same Snapshot, the same
// controls. It and the builder are the only app files that touch engine objects. Restarting (a new configuration, or reset) aborts the run cleanly — every
// rank's wait returns — joins the worker and starts a fresh Trainer.
#pragma once
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "app/snapshot_builder.h"
#include "engine/monitor/monitor.h"
#include "engine/train/train.h"

namespace dtlab::app {

class Session {
 public:
  // Throws dtlab::Error for a configuration the engine rejects (before any thread starts).
  explicit Session(const TrainConfig& config);
  // Attaches to a launched run's monitor at "HOST:PORT" (dtlab-cli launch ... -- train --monitor
  // PORT). Throws dtlab::Error with a sentence when nothing answers or the run cannot be read.
  static std::unique_ptr<Session> attach(const std::string& address, double timeout_s = 10);
  ~Session();
  bool attached() const { return client_ != nullptr; }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const TrainConfig& config() const { return config_; }
  // Stops the current run and starts `config` (same start state: paused or running). Throws
  // dtlab::Error for a rejected configuration, keeping the current run. Attached: dtlab::Error (the
  // launch command owns the configuration).
  void restart(const TrainConfig& config);
  void reset() { restart(config_); }

  // Controls (the stepper's commands).
  void run(double speed = 0);
  void pause();
  void step(GateKind kind);
  // The stepper's focus: a rank (-1 none) or a group by name ("tp1"; "" none), Stepper::set_focus.
  void set_focus(int rank, const std::string& group);
  bool paused() const;
  double speed() const { return speed_; }

  // An imported trace the lab shows beside (or instead of) the run, for the figures that read it
  // (trace.*); null for none. Fully loaded and immutable (app/trace_loader.h).
  void set_trace(std::shared_ptr<const ImportedTrace> trace) { trace_ = std::move(trace); }

  // The data view's set_epoch switch.
  void set_data_set_epoch(bool on) { builder_.set_data_set_epoch(on); }

  // Pulls what happened since the last call; call once per frame from the UI thread.
  const Snapshot& update();
  const Snapshot& snapshot() const { return builder_.snapshot(); }

  // True when the paused world has settled on its next item (every live rank waits at a gate), or
  // the run ended: nothing moves until a command.
  bool settled() const;
  // Waits (polling the engine) until settled() or the timeout; for tests. The app never blocks on
  // it: its scripts poll a SettleWait once a frame instead.
  bool wait_settled(std::chrono::milliseconds timeout) const;
  bool finished() const;
  StepperState stepper_state() const;  // the stepper's state now, wherever the run runs

  // A GPT run: `tokens` characters sampled after `prompt` from rank 0's parameters as they are now
  // (nanoGPT's generate, engine/core/gpt.h; seed 1337), on a copy of the model, so the run's own
  // buffers are untouched. Only while nothing moves (paused and settled, or finished) and while
  // rank 0 holds the whole model; dtlab::Error with a sentence saying why not otherwise.
  std::string generate(const std::string& prompt, int64_t tokens);
  // A GPT run's attention as its last forward left it on rank 0: block `layer`, head `head`, the
  // batch's first sample: T x T probabilities (row: the query position) into `probs`, the sample's
  // text into `text`. Only while nothing moves; false when there is none (not a GPT, no forward yet,
  // the run moving, or an index out of range).
  bool attention(int layer, int head, std::vector<float>& probs, std::string& text) const;
  // An MoE run's routing on every rank (GptCore::moe_routing and moe_history): fills `v.ranks` and
  // sets `v.read`. Only while nothing moves; false when the run moves or is attached (its models live
  // in its processes).
  bool read_experts(ExpertsView& v) const;
  // The Context view's chunks and ring passes, read from every rank's model while the run stands still.
  bool read_context(ContextView& v) const;

 private:
  Session() = default;  // attach()
  // The GPT activations the Experts (context false) and Context views read for a rank of this process.
  std::vector<const GptCore*> view_cores(int rank, bool context) const;
  // What the views need of the run, wherever it runs.
  const Model& model() const;
  const Dataset& dataset() const;
  TraceRecorder& recorder();
  const CostModel* cost() const;
  void update_status();  // activities, memory and the collective in flight
  void start();
  void stop();
  void reset_builder();

  TrainConfig config_;
  std::shared_ptr<const ImportedTrace> trace_;
  std::unique_ptr<Trainer> trainer_;  // the run here, on whichever device it runs
  // attached: the connection, and what the run's configuration builds here (its model's parameter
  // names and sizes, its data, its pipeline plan, its cost model); nothing of it trains
  std::unique_ptr<MonitorClient> client_;
  std::unique_ptr<Model> plan_model_;
  std::unique_ptr<Dataset> plan_data_;
  std::unique_ptr<PipelinePlan> plan_pipeline_;
  std::unique_ptr<CostModel> plan_cost_;
  std::unique_ptr<Model> sample_model_;  // generate(): the copy it samples from
  uint64_t context_key_ = 0;  // the same for the Context view
  uint64_t experts_key_ = 0;  // update(): the stepper generation (+1, finished: UINT64_MAX) the Experts view was read at
  uint64_t command_generation_ = 0;  // attached: the stepper state's generation when the last command went
  std::thread worker_;
  std::atomic<bool> done_{false};
  mutable std::mutex mu_;  // guards reports_, error_
  static constexpr double kStopLimitS = 30;  // stop(): how long an aborted run may take to end
  std::vector<StepReport> reports_;  // reported since the last update(), not yet handed to the builder
  size_t client_reports_ = 0;        // attached: the monitor client's reports handed on so far
  std::string error_;
  double speed_ = 0;

  SnapshotBuilder builder_;  // UI thread only
};

// Waiting for a Session to settle without blocking: start() after a command, then poll() once a
// frame until it answers Settled or TimedOut. The world counts as still once settled() held twice,
// a few milliseconds apart, and not before released gates had a moment to be left.
class SettleWait {
 public:
  enum State { Waiting, Settled, TimedOut };
  void start(std::chrono::milliseconds timeout);
  State poll(const Session& session);
  bool active() const { return active_; }
  void cancel() { active_ = false; }

 private:
  using Clock = std::chrono::steady_clock;
  bool active_ = false;
  Clock::time_point begun_{}, until_{}, still_since_{};
  bool still_ = false;
};

}  // namespace dtlab::app
