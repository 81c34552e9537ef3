// The threads backend: N ranks in one process, one thread per rank plus one communication worker
// per rank, each rank with its own memory (its own tracker, its own buffers). Collectives are
// explicit algorithms run step by step: ring (NCCL's chunk order), binomial tree, and naive (gather
// to rank 0, then send back), where a receiving rank reads the sender's chunk in place and reduces
// or copies it into its own buffer: real bytes moved between ranks' memories, one step at a time,
// with a stepper gate before each step and an event after it.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/trace/context.h"
#include "engine/trace/cost_model.h"
#include "engine/trace/recorder.h"
#include "engine/trace/stepper.h"

namespace dtlab {

class DataMover;  // engine/comm/data_mover.h

enum class FaultKind : uint8_t { Skip, Delay };

// Fault injection, for lessons that show a hang or a straggler on purpose.
struct Fault {
  FaultKind kind = FaultKind::Skip;
  int rank = 0;
  uint64_t seq = 0;     // the rank's collective sequence number to act on
  double delay_s = 0;   // Delay: how long the rank arrives late
};
// "skip:rank=3,collective=5" or "delay:rank=1,collective=2,ms=500"; dtlab::Error otherwise.
Fault parse_fault(std::string_view text);

struct WorldOptions {
  // Algorithm used when a call says Algorithm::Default (allreduce_algo Default: the tuning model's
  // pick per call, engine/trace/tuning.h), and the protocol (Default: the tuning model's).
  Algorithm allreduce_algo = collective_traits(CollectiveOp::AllReduce).default_algorithm;
  Algorithm broadcast_algo = collective_traits(CollectiveOp::Broadcast).default_algorithm;
  Algorithm reduce_algo = collective_traits(CollectiveOp::Reduce).default_algorithm;
  Protocol protocol = Protocol::Default;
  Algorithm alltoall_algo = collective_traits(CollectiveOp::AllToAll).default_algorithm;  // pairwise or grouped
  double timeout_s = 30;          // watchdog: a collective not complete by then fails, diagnosed
  std::vector<Fault> faults;
  std::string profile = "nvlink8";  // hardware profile of the modeled clock
  // A profile given whole, used instead of `profile` when set: a made-up topology (nodes of G GPUs,
  // a switch that reduces) the built-in names do not cover.
  std::optional<HardwareProfile> hardware;
  bool record = true;             // trace events
  size_t trace_capacity = size_t{1} << 16;
  bool start_paused = false;      // stepper starts paused (the GUI's default)
  // Where the ranks' buffers live: null is host memory (memcpy and CPU loops); the cuda backend
  // (engine/cuda/cuda_backend.h) passes its device mover, and the algorithms stay the same.
  std::shared_ptr<DataMover> mover;
  // Once the world has failed, how long its ranks have to return from run()'s function; one that has
  // not is stuck where no abort reaches it (OpenBLAS retrying a failed allocation forever). A thread
  // cannot be cancelled, so by default (on_stuck empty) run() prints the diagnosis and ends the
  // process with exit code 3. A test gives on_stuck to read the diagnosis and free its stuck rank.
  double return_limit_s = 60;
  std::function<void(const std::string& diagnosis)> on_stuck;
};

// What the app and the watchdog see of a collective in flight.
struct CollectiveStatus {
  uint64_t seq = 0;
  CollectiveOp op = CollectiveOp::AllReduce;
  Algorithm algo = Algorithm::Ring;
  DType dtype = DType::F32;
  int64_t bytes = 0;
  std::vector<int> arrived;  // in arrival order
  std::vector<int> missing;
  int steps_done = 0;        // by the slowest rank
  int steps = 0;
};

struct WorldStatus {
  std::vector<CollectiveStatus> in_flight;    // oldest first
  std::vector<std::string> compute_activity;  // per rank
  std::vector<std::string> comm_activity;     // per rank
  bool failed = false;
  std::string error;
};

class ThreadsWorld {
 public:
  ThreadsWorld(int world_size, WorldOptions options = {});
  ~ThreadsWorld();
  ThreadsWorld(const ThreadsWorld&) = delete;
  ThreadsWorld& operator=(const ThreadsWorld&) = delete;

  int world_size() const;
  const WorldOptions& options() const;
  Communicator& comm(int rank);
  RankContext& context(int rank);
  MemoryTracker& memory(int rank);
  TraceRecorder& recorder();
  Stepper& stepper();
  const CostModel& cost() const;

  // Runs fn on one thread per rank and returns when all are done. If any rank fails, the world is
  // aborted (every wait ends) and the most telling error is rethrown: the watchdog's or desync
  // diagnosis (CommError) first.
  void run(const std::function<void(int rank, Communicator& comm, RankContext& ctx)>& fn);

  WorldStatus status() const;
  void abort(const std::string& reason);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtlab
