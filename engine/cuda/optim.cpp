#include "engine/cuda/optim.h"

#include "engine/cuda/device.h"
#include "engine/cuda/kernels.h"

namespace dtlab::cuda {

DeviceOptimizer::DeviceOptimizer(const OptimizerConfig& config, int64_t numel, MemoryTracker* tracker,
                                 const RankDevice& dev)
    : config_(config), numel_(numel), tracker_(tracker), dev_(dev) {
  DTLAB_CHECK(numel >= 0, "optimizer over a negative number of parameters");
}

void DeviceOptimizer::step(float* params, const float* grads) {
  steps_++;
  const bool first = state_a_.empty();
  if (first && config_.kind == OptimizerKind::AdamW) {
    state_a_ = DeviceTensor({numel_}, MemCategory::OptimizerState, tracker_, dev_.device());
    state_b_ = DeviceTensor({numel_}, MemCategory::OptimizerState, tracker_, dev_.device());
  } else if (first && config_.momentum != 0.0) {
    state_a_ = DeviceTensor({numel_}, MemCategory::OptimizerState, tracker_, dev_.device());
  }
  if (config_.kind == OptimizerKind::SGD)
    launch_sgd_step(dev_.compute(), params, grads, state_a_.empty() ? nullptr : state_a_.f32(), numel_,
                    sgd_coeffs(config_), first);
  else
    launch_adamw_step(dev_.compute(), params, grads, state_a_.f32(), state_b_.f32(), numel_,
                      adamw_coeffs(config_, steps_));
  DTLAB_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dtlab::cuda
