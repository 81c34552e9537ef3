// Internals of the threads backend shared by threads_backend.cpp (world, workers, rendezvous,
// watchdog) and threads_algorithms.cpp (the step-by-step collective algorithms).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/data_mover.h"
#include "engine/comm/plan.h"  // StepTransfer
#include "engine/comm/queued_comm.h"  // CollDesc, describe, payload_bytes
#include "engine/comm/threads_backend.h"
#include "engine/comm/watchdog.h"  // RankDoing

namespace dtlab::threads {

// One collective as seen by all ranks: created by the first rank to arrive, erased by the last
// to leave. Guarded by the world mutex.
struct Rendezvous {
  CollDesc desc;
  uint64_t seq = 0;
  int world = 0;
  std::vector<int> arrivals;                // in order
  std::vector<void*> buf;                   // per rank: in-place or output buffer
  std::vector<const void*> in;              // per rank: input buffer (out-of-place ops)
  std::vector<void*> scratch;               // per rank: scratch (reduce-scatter partials, tree accumulators)
  std::vector<double> arrival_model;        // per rank: modeled time of arrival
  // Ring protocol, per rank, in units (step * slices + slice). Atomics: a neighbour polls them
  // without the world lock, which every slice hand-off would otherwise contend for.
  std::vector<std::atomic<int64_t>> done, consumed;
  int slices = 1;                           // units per ring step (all-reduce pipelines slices)
  std::vector<int> steps_finished;          // per rank, every algorithm (for status())
  int barrier_count = 0;                    // step barrier (tree, naive, all-to-all)
  int64_t barrier_gen = 0;
  int left = 0;                             // ranks still inside
  int running = 0;                          // ranks inside run_collective (reading peers' memory)
  int steps = 0;
  int node_size = 0;                        // ranks per node (the profile's), for hierarchical all-reduce
};

class World;

// One rank's side of a running collective: what an algorithm needs.
struct Call {
  World* world;
  Rendezvous* rv;
  int rank;
  int n;
  RankContext* ctx;
  double model_t;     // running modeled time of this collective's steps
  int32_t iteration;  // the iteration the op was issued in (events go there)
  // Scratch the algorithm published to the other ranks (rv->scratch): owned by the Call, not by the
  // algorithm's frame, so a rank that fails mid-algorithm keeps it alive until exit_algorithm has
  // seen every rank leave; freeing it while unwinding let a neighbour read freed memory.
  std::vector<std::unique_ptr<CommScratch>> scratch = {};
};

class World {
 public:
  World(int n, WorldOptions opt);
  ~World();

  // Rendezvous and waiting (every wait is bounded by the watchdog).
  Rendezvous& arrive(int rank, uint64_t seq, const CollDesc& d, void* buf, const void* in,
                     double model_t);
  double wait_all_arrived(int rank, Rendezvous& rv);  // returns the modeled start
  void leave(Rendezvous& rv);
  // Bracket run_collective; on failure exit_algorithm waits for the other ranks to leave the
  // algorithm (so none reads memory about to be freed) and gives up this rank's place.
  // enter_algorithm throws CommError instead once the world is aborted, so no rank starts reading
  // after a peer may have given up its buffers.
  void enter_algorithm(Rendezvous& rv);
  void exit_algorithm(Rendezvous& rv, bool failed);
  // A rank that arrived at rv but fails before entering its algorithm (aborted at a gate or while
  // waiting for the others): waits until no rank is in the algorithm, where one may still read
  // this rank's buffers, before its caller frees them.
  void abandon(Rendezvous& rv);
  // Ring neighbour protocol (see threads_algorithms.cpp).
  void ring_wait_ready(Call& c, int64_t unit);
  void ring_mark_done(Call& c, int64_t unit);
  void ring_wait_drained(Call& c);
  template <class Pred>
  void ring_wait(Call& c, Pred ready, const char* what);
  void step_barrier(Call& c);

  // Gate before step `step` of the current collective; false if aborted.
  bool step_gate(Call& c, int step);
  // Charges one step on the modeled clock and records it.
  void finish_step(Call& c, int step, RingPhase phase, int chunk, int src, int dst, int64_t bytes,
                   const std::vector<std::pair<int, int>>& transfers, double model_bytes, bool reduce,
                   int64_t wall_begin);
  // The same for a step of a planned algorithm (plan.h): charged by the plan's transfers, each
  // carrying its chunk's share of the buffer; one event per planned transfer this rank receives or
  // sends to the switch (bytes as transfer_elements cuts them), or one empty event when it has none.
  void finish_plan_step(Call& c, int step, const std::vector<StepTransfer>& plan, int64_t wall_begin);

  [[noreturn]] void fail(const std::string& msg);  // abort the world and throw CommError
  [[noreturn]] void fail_aborted();                // after a gate refused: throw the abort reason
  void abort(const std::string& reason);
  bool aborted() const;
  void set_comm_activity(int rank, std::string what);
  std::string diagnose_missing(const Rendezvous& rv);  // call with mu_ held
  RankDoing doing(int rank) const;                     // what the watchdog says of it; mu_ held

  int n_;
  WorldOptions opt_;
  std::shared_ptr<DataMover> mover_;  // how the algorithms touch rank memory (WorldOptions::mover)
  std::unique_ptr<TraceRecorder> recorder_;
  std::unique_ptr<CostModel> cost_;
  std::unique_ptr<Stepper> stepper_;
  std::vector<std::unique_ptr<MemoryTracker>> memory_;
  std::vector<std::unique_ptr<RankContext>> ctx_;
  std::vector<std::unique_ptr<Communicator>> comms_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Ring waits sleep on their own rank's mutex and condition variable: only neighbours wake them.
  std::vector<std::unique_ptr<std::mutex>> rank_mu_;
  std::vector<std::unique_ptr<std::condition_variable>> rank_cv_;
  std::atomic<bool> aborted_flag_{false};  // mirrors aborted_ for lock-free checks
  std::map<uint64_t, Rendezvous> rv_;
  std::vector<std::string> comm_activity_;
  std::vector<std::string> skipped_;  // per rank: a note about injected faults
  bool aborted_ = false;
  std::string abort_reason_;
  // point to point: (src, dst, tag) -> queued messages
  struct Message {
    std::vector<uint8_t> data;
    double model_sent = 0;  // sender's modeled time: the transfer cannot start before it
  };
  std::map<std::tuple<int, int, int>, std::deque<Message>> mailbox_;
};

// Number of steps the algorithm takes for this collective on n ranks, `node_size` ranks per node.
int algorithm_steps(const CollDesc& d, int n, int node_size);
// Units each step is cut into so that neighbours work on one chunk in a pipeline (1 if not sliced).
int algorithm_slices(const CollDesc& d, int n);
// Algorithms: run one rank's part of the collective `c.rv` (all ranks have arrived).
void run_collective(Call& c);

}  // namespace dtlab::threads
