// What the UI sees of the engine in one frame. The Session builds it once per frame from the live
// run (recorder events, stepper state, world status, memory trackers, step reports); views read it
// and nothing else, so every picture comes from what the engine really did. Plain data: no engine
// object is reachable from here, no lock is needed to read it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/comm/plan.h"
#include "engine/core/memory.h"
#include "engine/core/optim.h"
#include "engine/parallel/memory_plan.h"
#include "engine/trace/event.h"
#include "engine/trace/stepper.h"

namespace dtlab::app {

// The collective a ring/tree/naive view draws: the one in flight, else the last one that ran.
struct CollectiveView {
  bool valid = false;
  bool in_flight = false;     // some rank has arrived and not every rank has finished
  uint64_t seq = 0;
  CollectiveOp op = CollectiveOp::AllReduce;
  Algorithm algo = Algorithm::Ring;
  DType dtype = DType::F32;
  ReduceOp reduce = ReduceOp::Sum;
  int root = -1;
  int world = 1;
  int64_t count = 0;          // elements per rank buffer (in_count)
  int64_t bytes = 0;          // payload (nccl-tests S)
  int steps = 0;              // total algorithm steps
  int steps_done = 0;         // steps every rank has finished (the pending step's index)
  std::vector<int> rank_steps_done;  // per rank
  std::vector<int> arrived;   // ranks that arrived, in arrival order (while in flight)
  std::vector<int> missing;
  std::vector<StepTransfer> last;     // transfers of step steps_done - 1 (what just moved)
  std::vector<StepTransfer> pending;  // transfers of step steps_done (what moves next)
  RingPhase phase = RingPhase::None;  // of the pending step (or the last one when done)
  // Buffer cells, [rank][chunk]: how many ranks' contributions the chunk holds (1 = only its
  // own data, world = the final sum; 0 = not yet received, for all-gather outputs). Ring ops have
  // `world` chunks; tree and naive use one cell per rank buffer.
  int chunks = 1;
  std::vector<std::vector<int>> cells;
  // Cost model: predicted duration and bandwidths (GB/s, nccl-tests conventions).
  double predicted_s = 0, algbw_gbs = 0, busbw_gbs = 0;
  double measured_s = -1;     // wall time, once done (rank 0)
  std::string label;          // "DDP bucket 1: 2.bias, 2.weight" when the collective is a bucket
};

// Launched: its all-reduce is issued and queued on the rank's comm worker behind earlier ones;
// AllReducing: that all-reduce is running (ranks arrived, steps under way).
enum class BucketState : uint8_t { Empty, Filling, Ready, Launched, AllReducing, Done };
const char* bucket_state_name(BucketState s);

struct BucketParam {
  int index = -1;             // into the model's parameters
  std::string name;
  int64_t bytes = 0;
  bool ready = false;         // gradient ready in the current backward pass
  int ready_order = -1;       // 0 = first gradient produced in this pass
};

struct BucketView {
  int index = 0;
  int generation = 0;
  int64_t bytes = 0;
  std::vector<BucketParam> params;  // in bucket layout order
  BucketState state = BucketState::Empty;
  int launch_order = -1;      // order launched in this pass (always == index: torch's rule)
  uint64_t seq = 0;           // its all-reduce, once launched
  double allreduce_begin = 0, allreduce_end = 0;  // modeled seconds, once done
};

struct RankMemory {
  MemoryStats stats;          // current, and peaks of the current iteration
};

struct StepPoint {
  int64_t step = 0;
  float loss = 0;
  double accuracy = 0;
  double overlap = -1;
  double samples_per_sec = 0;
};

struct DataView {
  bool valid = false;
  std::string name;
  int64_t n = 0;
  int classes = 0;
  std::vector<float> xy;          // (n, 2): the first two features
  std::vector<int32_t> label;     // (n,)
  // Which rank the DistributedSampler gives each sample in the shown epoch (-1: none; a padded
  // duplicate shows its first owner).
  std::vector<int16_t> owner;
  int64_t epoch = 0;              // the epoch the assignment is for
  bool set_epoch = true;          // false: the assignment as if set_epoch were never called
};

struct RunConfigView {
  std::string strategy, model, data, optimizer, profile;
  int world = 1;
  int64_t batch = 0, accum = 1, steps = 0;
  int64_t bucket_cap_bytes = 0, first_bucket_bytes = 0;
  // What the memory planner needs to put the run beside the other strategies (plan_memory).
  Sharding sharding = Sharding::NoShard;  // the run's: fsdp's setting; ddp and single are NO_SHARD
  int64_t num_params = 0;                 // Ψ of the running model
  OptimizerKind optimizer_kind = OptimizerKind::AdamW;
  bool sgd_momentum = false;              // SGD keeps a momentum buffer
  bool wrap_layers = true;                // FSDP units: one per Linear (else the whole model)
  int64_t largest_unit_params = 0;        // the largest unit: biggest Linear (weight + bias) or Ψ
  int units_in_flight = 1;                // 2 with BACKWARD_PRE (the next unit gathered early)
};

struct Snapshot {
  uint64_t frame = 0;
  RunConfigView config;
  // run state
  bool running = false;           // the engine thread is alive
  bool finished = false;
  std::string error;              // the run's failure (watchdog diagnosis), if any
  int64_t step = 0, total_steps = 0;
  int32_t iteration = -1;         // rank 0's current iteration
  StepperState stepper;           // paused, speed, per rank and lane: blocked at which gate
  std::vector<std::string> compute_activity, comm_activity;  // per rank
  // events: per rank, the recent window (last few iterations), oldest first
  std::vector<std::vector<Event>> events;
  std::vector<std::string> labels;  // recorder labels (Event bucket.label ids)
  double clock_now_model = 0;     // furthest modeled time seen
  int64_t clock_now_wall_ns = 0;  // recorder's wall clock now
  // derived views
  CollectiveView collective;      // the current/last stepped collective
  std::vector<BucketView> buckets;  // rank 0's current assignment and states
  int bucket_generation = 0;
  std::vector<RankMemory> memory;   // per rank
  std::vector<StepPoint> history;   // per step (rank 0's report: all-reduced means)
  DataView data;
  std::vector<std::string> param_names;  // model parameters
};

}  // namespace dtlab::app
