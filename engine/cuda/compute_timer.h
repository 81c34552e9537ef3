// Compute events for work that runs on a GPU. The host only enqueues kernels, so its clock says
// nothing about how long a layer took: each op is bracketed by two CUDA events on the rank's compute
// stream, and flush() (at a synchronization point: the end of an iteration) waits for the last one
// and turns every pair into the same Compute event the CPU engine records, on the recorder's wall
// clock through an anchor event taken while the stream was idle. The modeled clock advances exactly
// as RankContext does for CPU ops. Each op is also an NVTX range named like the event's activity
// ("forward 2", "backward 2"), so Nsight Systems shows the lab's names.
#pragma once
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/trace/context.h"

namespace dtlab::cuda {

// An NVTX range on the calling thread (RAII); NVTX costs nothing unless a tool is attached.
class NvtxRange {
 public:
  explicit NvtxRange(const std::string& name);
  ~NvtxRange();
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// "forward 2", "loss": what RankContext names a compute op.
std::string compute_op_name(ComputeKind kind, int layer);

class DeviceComputeTimer : public DeviceTimer {
 public:
  // `ctx` receives the events; the stream must be idle now (it anchors the clocks).
  DeviceComputeTimer(RankContext* ctx, cudaStream_t stream);
  ~DeviceComputeTimer() override;
  DeviceComputeTimer(const DeviceComputeTimer&) = delete;
  DeviceComputeTimer& operator=(const DeviceComputeTimer&) = delete;

  void compute_begin(ComputeKind kind, int layer, OpCost cost) override;
  void compute_end() override;
  // Waits for the ops timed so far and records their events; returns how many.
  int flush() override;

 private:
  struct Op {
    ComputeInfo info;
    cudaEvent_t begin, end;
    double model_begin, model_end;
    int32_t iteration;
  };
  void anchor();  // the stream is idle: anchor_ completes now on the host's clock
  cudaEvent_t take_event();
  RankContext* ctx_;
  cudaStream_t stream_;
  cudaEvent_t anchor_ = nullptr;
  int64_t anchor_ns_ = 0;
  std::vector<Op> pending_;
  std::vector<cudaEvent_t> spare_;
  bool open_ = false;
};

}  // namespace dtlab::cuda
