// The cuda backend: N ranks as threads sharing one GPU (or several), each rank with its buffers in
// device memory and its own compute and comm streams (cuda::RankDevice). Collectives are the threads
// backend's: the same world (rendezvous, stepper gates, events, watchdog) and the same ring, tree
// and naive algorithms, with a device DataMover underneath. A step's receive is a device-to-device
// copy or the reduction kernel on the receiving rank's comm stream, and the host waits for it before
// it marks the step done, so each step is still one gate and one event: the stepper, the ring view
// and the watchdog work unchanged on a GPU. (NCCL cannot help here: it refuses two ranks on one GPU.)
//
// Ordering with compute, as with a CUDA comm stream: a call records an event on the rank's compute
// stream when it is issued, and the comm worker waits for that event before the collective touches
// the buffer; compute enqueued after the call overlaps the collective. Work::wait() returns with the
// result in device memory, so compute enqueued after it reads the result.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "engine/comm/threads_backend.h"
#include "engine/cuda/rank_device.h"

namespace dtlab {

class CudaWorld {
 public:
  static constexpr int kMaxWorldSize = 16;

  // Rank r runs on devices[r % devices.size()]; by default every rank shares device 0. Throws
  // dtlab::Error without a CUDA device, for a world larger than kMaxWorldSize, or for devices that
  // cannot reach each other's memory (peer access). `options.mover` is set here.
  CudaWorld(int world_size, WorldOptions options = {}, std::vector<int> devices = {0});
  ~CudaWorld();
  CudaWorld(const CudaWorld&) = delete;
  CudaWorld& operator=(const CudaWorld&) = delete;

  int world_size() const;
  Communicator& comm(int rank);  // backend_name() "cuda"; buffers are device pointers
  RankContext& context(int rank);
  MemoryTracker& memory(int rank);
  cuda::RankDevice& device(int rank);
  ThreadsWorld& world();  // recorder, stepper, cost model, status(), abort()

  // ThreadsWorld::run with each rank's thread bound to its device.
  void run(const std::function<void(int rank, Communicator& comm, RankContext& ctx, cuda::RankDevice& dev)>& fn);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtlab
