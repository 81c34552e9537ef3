// The optimizers on a GPU: engine/core/optim.h's Optimizer with its state in device memory (charged
// to the rank's tracker as optimizer state, created lazily on the first step as torch does) and its
// update as one kernel on the rank's compute stream. The scalars come from the same sgd_coeffs /
// adamw_coeffs and the kernel runs the same optim_math.h element update as the CPU loop.
#pragma once
#include <cstdint>

#include "engine/core/optim.h"
#include "engine/cuda/device_tensor.h"
#include "engine/cuda/rank_device.h"

namespace dtlab::cuda {

class DeviceOptimizer {
 public:
  DeviceOptimizer(const OptimizerConfig& config, int64_t numel, MemoryTracker* tracker, const RankDevice& dev);

  // One update of params[0, numel) from grads[0, numel), both device memory; returns once enqueued.
  void step(float* params, const float* grads);

  const OptimizerConfig& config() const { return config_; }
  void set_lr(double lr) { config_.lr = lr; }
  int64_t numel() const { return numel_; }
  int64_t steps_taken() const { return steps_; }
  const DeviceTensor& momentum_buffer() const { return state_a_; }  // SGD (empty until first step)
  const DeviceTensor& exp_avg() const { return state_a_; }          // AdamW
  const DeviceTensor& exp_avg_sq() const { return state_b_; }       // AdamW

 private:
  OptimizerConfig config_;
  int64_t numel_;
  MemoryTracker* tracker_;
  const RankDevice& dev_;
  int64_t steps_ = 0;
  DeviceTensor state_a_, state_b_;
};

}  // namespace dtlab::cuda
