// Where a run's ranks execute, whatever the device: one interface over the in-process worlds of every
// backend, so the trainer, the DDP reducer, FSDP and the pipeline runtime are written once:
//   threads  ThreadsWorld: ranks as threads, host memory (cpu_device)
//   cuda     CudaWorld: ranks as threads sharing the GPU(s), device memory, the same step-by-step
//            algorithms on device buffers (engine/cuda/cuda_backend.h; made by engine/cuda/platform.h)
//   nccl     NcclWorld: one GPU per rank, NCCL's collectives (engine/cuda/nccl_backend.h; likewise)
// Every world keeps a ThreadsWorld underneath (rendezvous, stepper gates, recorder, contexts, memory
// trackers, watchdog, status), which is what the lab's views read.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "engine/comm/threads_backend.h"
#include "engine/core/device.h"

namespace dtlab {

class RankWorld {
 public:
  virtual ~RankWorld() = default;
  virtual const char* backend() const = 0;  // "threads", "cuda", "nccl"
  virtual ThreadsWorld& threads() = 0;
  virtual Communicator& comm(int rank) = 0;  // moves device(rank)'s memory
  virtual Device& device(int rank) = 0;
  // Runs fn on one thread per rank (bound to its device); rethrows the first failure, the watchdog's
  // diagnosis first.
  virtual void run(const std::function<void(int rank, Communicator& comm, RankContext& ctx, Device& dev)>& fn) = 0;
  virtual void abort(const std::string& reason) { threads().abort(reason); }
  int world_size() { return threads().world_size(); }
};

// The CPU world: ThreadsWorld with the host device.
std::unique_ptr<RankWorld> make_threads_world(int world_size, WorldOptions options);

// A test's seam: while set, the trainer makes its in-process worlds with this instead of its
// backend's (tests/hostless.h: ranks whose memory the host cannot read, so a host loop over device
// memory fails on the CPU as it would on a GPU). Null in the programs.
using TestWorldFactory = std::unique_ptr<RankWorld> (*)(int world_size, WorldOptions options);
void set_test_world(TestWorldFactory f);
TestWorldFactory test_world();

}  // namespace dtlab
