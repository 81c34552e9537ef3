// Training on GPUs: `dtlab-cli train --device cuda`. The same run as engine/train's Trainer (same
// data, sampler, batches, model init, loss, optimizer formulas, DDP's bucket assignment, reported
// figures), with the model, its gradients, the optimizer state and the activations in device memory
// (cuda::DeviceModel, DeviceOptimizer) and the ranks' collectives on device buffers:
//   backend cuda   ranks as threads sharing the GPU(s) (CudaWorld: the lab's step-by-step ring)
//   backend nccl   one GPU per rank: NcclWorld in one process, or NcclProcess per process under
//                  `dtlab-cli launch` (device LOCAL_RANK)
// Strategies single and ddp. DDP here all-reduces each bucket (the construction-time assignment:
// contiguous ranges of the flat gradient, bucket 0 the last layers) after the backward pass: the
// device model's backward is one call, so there is no overlap with backward on the GPU yet.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/cuda/device.h"
#include "engine/cuda/rank_device.h"
#include "engine/trace/cost_model.h"
#include "engine/train/train.h"

namespace dtlab {

class CudaWorld;
class NcclWorld;

class CudaTrainer {
 public:
  // `config.device` must be "cuda" and `config.backend` cuda or nccl (resolve_device() picks them);
  // dtlab::Error with a sentence for anything that cannot run here (no device, a strategy the GPU
  // engine does not have, more ranks than GPUs for nccl).
  explicit CudaTrainer(const TrainConfig& config);
  ~CudaTrainer();

  const TrainConfig& config() const { return config_; }
  const Dataset& dataset() const { return blueprint_->dataset(); }
  int64_t total_steps() const { return blueprint_->total_steps(); }
  int64_t batches_per_epoch() const { return blueprint_->batches_per_epoch(); }
  int64_t effective_batch() const { return blueprint_->effective_batch(); }
  std::vector<std::string> planned_buckets() const { return blueprint_->planned_buckets(); }
  // "CUDA runtime 13.0, driver 13.0; device 0: NVIDIA H100 ..." and where the ranks run.
  std::string describe() const;

  // Trainer's accessors, so the lab shows a GPU run as it shows a CPU one (app/session.h).
  Model& model() { return blueprint_->model(); }  // rank 0's host model: the trained parameters after run()
  const PipelinePlan* pipeline_plan() const { return nullptr; }
  TraceRecorder& recorder();
  Stepper& stepper();
  ThreadsWorld* world();   // the ranks of the cuda or (one-process) nccl backend; null for one rank
  RankContext& context();  // rank 0 (launched: this process's rank)
  MemoryTracker& memory(); // rank 0's tracker: its device memory
  void abort(const std::string& reason);
  // The device's own figure for `rank`'s GPU (cudaMemGetInfo: every process and context on it).
  cuda::DeviceMemory device_memory(int rank) const;

  TrainSummary run(const std::function<void(const StepReport&)>& on_step = {});

 private:
  struct Rank;
  void run_rank(int rank, Communicator* comm, RankContext* ctx, MemoryTracker& mem, cuda::RankDevice& dev,
                TrainSummary& sum, const std::function<void(const StepReport&)>& on_step);
  TrainConfig config_;
  bool launched_ = false;               // one process per rank (dtlab-cli launch)
  std::unique_ptr<Trainer> blueprint_;  // checks, data, and each rank's host model (init, --init)
  // where the ranks run: a world of threads (cuda, nccl in one process), or one rank of this process
  std::unique_ptr<CudaWorld> cuda_world_;
#if DTLAB_HAVE_NCCL
  std::unique_ptr<NcclWorld> nccl_world_;
#endif
  std::unique_ptr<MemoryTracker> mem_;
  std::unique_ptr<TraceRecorder> rec_;
  std::unique_ptr<CostModel> cost_;
  std::unique_ptr<Stepper> stepper_;
  std::unique_ptr<RankContext> ctx_;
  std::vector<MemoryStats> rank_memory_;
  double total_samples_ = 0;
};

}  // namespace dtlab
