// The one per-rank training loop's hooks (Trainer::run_rank, engine/train/train.cpp). The loop is
// the same for every strategy:
//
//   for step:  enter the iteration gate, reset the memory peaks
//              zero_grad()
//              for each micro-batch: micro_batch()      (before forward, forward, loss, backward with
//                                                        gradient-ready hooks, after backward)
//              step()                                   (optimizer; false: the loss scaler skipped it)
//              (--uneven-rank: a rank whose data ran out leaves the loop, or with --join shadow_step())
//              exchange()                               (every rank's figures for the report)
//              non-finite loss: every rank stops with diagnose_nonfinite()'s sentence
//              end the iteration, report on rank 0 (annotate())
//   finish(); save
//
// Each strategy implements the hooks: single, ddp and fsdp share the replica's forward/backward
// (ReplicaRank in train_replica.cpp) and differ in zero_grad / before_forward / gradient_ready /
// after_backward / step / finish; DataParallel (train_dp.cpp) and the pipeline (train_pipeline.cpp)
// run their own micro-batch (a scatter/replicate/gather, a schedule's row). The options laid over
// a strategy (--tp, mixed precision, LoRA, recompute) live in the model and the replica's parts, not
// in the loop. Internal to engine/train.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "engine/monitor/step_report.h"
#include "engine/trace/context.h"

namespace dtlab {

class Communicator;
class Device;
class DeviceTimer;
class MemoryTracker;
class Model;
class Trainer;
struct TrainSummary;

// Where one rank runs: what Trainer::run_rank sets up before it builds the rank's strategy.
struct RankEnv {
  Trainer& trainer;
  int rank;
  Communicator* comm;   // the world; null for one rank in this process
  RankContext* ctx;     // null: no instrumentation
  MemoryTracker& mem;
  Device& dev;
  ComputeObserver* obs;  // the device timer on a GPU, else ctx
  DeviceTimer* timer;    // a GPU's stream timing; null on the CPU
};

// What one rank's micro-batches of a step add up to.
struct StepTally {
  int64_t samples = 0;     // this rank's samples (a rank that computes no loss: 0)
  int64_t last_batch = 0;  // the step's last micro-batch size (the last of an epoch may be partial)
  bool input_bad = false;  // a micro-batch held NaN or infinity (checked on the host)
};

// The step's figures as the report needs them: summed over the ranks that compute the loss.
struct StepSums {
  double loss_sum = 0, correct = 0, samples = 0;
  double mine = 0;  // this rank's own loss sum (NaN when its input was bad)
};

class RankStrategy {
 public:
  virtual ~RankStrategy() = default;
  virtual int64_t micro_batches() const { return 1; }
  virtual void zero_grad(int64_t step) = 0;
  virtual void micro_batch(int64_t step, int64_t micro, bool sync, StepTally& tally) = 0;
  virtual bool step(int64_t step) = 0;
  // --join (torch.distributed.algorithms.Join): instead of zero_grad, micro_batch and step, a step of
  // the others that this rank, its data run out, shadows with zero contributions to their
  // collectives. Only DDP has a join hook; validation refuses --join elsewhere.
  virtual void shadow_step(int64_t step) { (void)step; }
  virtual StepSums exchange(int64_t step, const StepTally& tally) = 0;
  // The sentence every rank stops with when the step's loss is non-finite (may make a collective).
  virtual std::string diagnose_nonfinite(int64_t step, const StepSums& sums, const StepTally& tally) = 0;
  // Whether this rank writes the step report (rank 0, or DataParallel's module).
  virtual bool reports() const = 0;
  virtual void annotate(StepReport& r, const StepSums& sums) = 0;
  virtual int64_t epoch() const = 0;
  virtual int64_t epochs_started() const = 0;
  // After the last step: gather what is sharded, fill the summary (on the reporting rank), and name
  // the model evaluated and saved.
  virtual const Model& finish(TrainSummary& sum) = 0;
};

// The rank's part of the run's strategy (engine/train/strategy.h's Strategy).
std::unique_ptr<RankStrategy> make_replica_rank(const RankEnv& env);         // single, ddp, fsdp
std::unique_ptr<RankStrategy> make_data_parallel_rank(const RankEnv& env);   // dp
std::unique_ptr<RankStrategy> make_pipeline_rank(const RankEnv& env);        // pipeline

}  // namespace dtlab
