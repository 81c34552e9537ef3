// How a backend's collective algorithms touch rank memory. The algorithms (threads_algorithms.cpp)
// decide what moves where and in which step; a DataMover does the moving. The host mover copies with
// memcpy and reduces with the loops of reduce_kernels.h; the cuda backend's mover
// (engine/cuda/cuda_backend.cpp) does device-to-device copies and a reduction kernel on the receiving
// rank's comm stream. Every call acts for `rank` (the rank whose buffer changes) and returns once its
// result is visible to every other rank, so each algorithm step stays one stepper gate + one event
// whatever the memory is.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "engine/comm/communicator.h"

namespace dtlab {

// Scratch a collective needs on one rank (reduce-scatter partial sums, tree accumulators), charged to
// the rank's memory tracker as comm buffers for as long as it lives.
class CommScratch {
 public:
  virtual ~CommScratch() = default;
  virtual void* data() = 0;
};

class DataMover {
 public:
  virtual ~DataMover() = default;
  virtual const char* device_name() const = 0;  // "cpu", "cuda"
  // dst = src (bytes). Any two of the world's buffers; on a device either side may be host memory
  // (point-to-point messages are staged on the host).
  virtual void copy(int rank, void* dst, const void* src, int64_t bytes) = 0;
  // dst = dst op src, and dst = a op b (Sum and Avg add; Max keeps the larger).
  virtual void reduce_into(int rank, void* dst, const void* src, int64_t count, DType dt, ReduceOp op) = 0;
  virtual void reduce_to(int rank, void* dst, const void* a, const void* b, int64_t count, DType dt,
                         ReduceOp op) = 0;
  // Avg is a sum followed by this on the rank holding the final value (a no-op otherwise).
  virtual void finish_avg(int rank, void* buf, int64_t count, DType dt, ReduceOp op, int world_size) = 0;
  // One ring step in one pass, as NCCL's reduce-copy primitives: dst = dst op src (`reduce`) or
  // dst = src, and when `finish_n` > 0 (the chunk is final: plan.h's RingStepWork::finishes)
  // finish_avg over finish_n ranks, with the same roundings as those calls one after another. Here
  // they are those calls (host memory gains nothing from fusing); the cuda mover runs one kernel that
  // reads the peer's chunk from its device buffer and writes the result in place.
  virtual void reduce_copy(int rank, void* dst, const void* src, int64_t count, DType dt, ReduceOp op, bool reduce,
                           int finish_n);
  virtual std::unique_ptr<CommScratch> scratch(int rank, int64_t bytes, MemoryTracker* tracker) = 0;
  // Host memory: cut ring steps into cache-sized slices. A device gains nothing from it and would
  // pay a launch and a synchronization per slice.
  virtual bool slice_ring_steps() const { return true; }
  // Bracket every job on the rank's comm worker, in issue order (the cuda mover waits there for the
  // compute work the call was issued after, and opens an NVTX range named `label`, job_label()).
  virtual void begin_job(int rank, const std::string& label) {}
  virtual void end_job(int rank) {}
};

// A job's name in NVTX ranges, as the trace names it: "allreduce #5", "send #2".
inline std::string job_label(CollectiveOp op, uint64_t seq) {
  return std::string(collective_name(op)) + " #" + std::to_string(seq);
}

// The host mover, shared by every CPU world.
std::shared_ptr<DataMover> host_mover();

// RAII around begin_job/end_job.
class MoverJob {
 public:
  MoverJob(DataMover& m, int rank, const std::string& label) : m_(m), rank_(rank) { m_.begin_job(rank, label); }
  ~MoverJob() { m_.end_job(rank_); }
  MoverJob(const MoverJob&) = delete;
  MoverJob& operator=(const MoverJob&) = delete;

 private:
  DataMover& m_;
  int rank_;
};

}  // namespace dtlab
