// A hook for instrumentation: the model reports each compute op here, and engine/trace turns the
// reports into events and modeled time. Lives in core so the model needs no trace include.
#pragma once
#include <cstdint>

#include "engine/core/op_cost.h"

namespace dtlab {

// Recompute: a layer's forward run again in backward (activation checkpointing), charged as a forward.
enum class ComputeKind : uint8_t { LayerForward, LayerBackward, Loss, LossBackward, OptimizerStep, ZeroGrad, Other, Recompute };

class ComputeObserver {
 public:
  virtual ~ComputeObserver() = default;
  // `layer`: torch Sequential index or -1; `cost`: its FLOPs (the modeled clock charges them) and the
  // bytes it moves (with the FLOPs, its place on the roofline).
  virtual void compute_begin(ComputeKind kind, int layer, OpCost cost) = 0;
  virtual void compute_end() = 0;
};

// Where a stepped run may pause inside the model: before each layer's forward and backward (the
// trace layer's RankContext implements it with the stepper's Layer gates).
class LayerGate {
 public:
  virtual ~LayerGate() = default;
  virtual void before_layer(int layer, bool backward) = 0;
};

// RAII pair of compute_begin/compute_end; a null observer costs one branch.
class ComputeScope {
 public:
  ComputeScope(ComputeObserver* obs, ComputeKind kind, int layer, OpCost cost) : obs_(obs) {
    if (obs_) obs_->compute_begin(kind, layer, cost);
  }
  ~ComputeScope() {
    if (obs_) obs_->compute_end();
  }
  ComputeScope(const ComputeScope&) = delete;
  ComputeScope& operator=(const ComputeScope&) = delete;

 private:
  ComputeObserver* obs_;
};

}  // namespace dtlab
