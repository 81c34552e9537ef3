// The model on a GPU: the host Model's Linear/ReLU stack (engine/core/model.h) with its flat
// parameters and gradients, activations and activation gradients in device memory, run with the
// CUDA ops on the rank's compute stream. Same parameter layout and order (so a checkpoint, an
// optimizer or a bucket is the same range), same accumulate-into-gradients contract, and every layer
// reported to the observer as the CPU model reports it (give it a DeviceComputeTimer).
#pragma once
#include <cstdint>
#include <vector>

#include "engine/core/model.h"
#include "engine/cuda/device_tensor.h"
#include "engine/cuda/rank_device.h"

namespace dtlab::cuda {

class DeviceModel {
 public:
  // Copies `host`'s parameters to the device. `host` describes the layers and their costs and must
  // outlive this model; its own buffers are not used afterwards.
  DeviceModel(const Model& host, MemoryTracker* tracker, const RankDevice& dev);

  int64_t num_params() const { return host_.num_params(); }
  float* params() { return params_.f32(); }  // (P,) device
  float* grads() { return grads_.f32(); }    // (P,) device
  void zero_grad();
  // x (B, D0) on the device, alive until backward() returns; returns the logits (B, Dk) on the device.
  const float* forward(const float* x, int64_t B);
  void backward(const float* dlogits);  // dlogits (B, Dk) on the device
  // Parameters back into a host model of the same spec (checkpoints, parity checks). Waits.
  void download_params(Model& host) const;
  void set_observer(ComputeObserver* obs) { observer_ = obs; }

 private:
  void ensure_activations(int64_t B);
  const Model& host_;
  MemoryTracker* tracker_;
  const RankDevice& dev_;
  DeviceTensor params_, grads_;    // (P,)
  std::vector<DeviceTensor> acts_;  // acts_[i]: output of layer i, (B, out_i)
  DeviceTensor dbuf_[2];            // ping-pong activation gradients, (B, widest)
  const float* input_ = nullptr;
  int64_t batch_ = 0, capacity_ = 0;
  ComputeObserver* observer_ = nullptr;
};

}  // namespace dtlab::cuda
