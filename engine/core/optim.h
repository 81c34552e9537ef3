// Optimizers with exactly torch's update formulas (torch.optim.SGD with nesterov off, and
// torch.optim.AdamW), over ONE contiguous range of parameters: the whole flat parameter buffer for
// a replicated model, or a rank's shard for ZeRO/FSDP, which is why they take raw pointers.
// State is created lazily on the first step, as torch does, so memory views show it appearing then.
// The update runs on the device the parameters live on (engine/core/device.h): the CPU's loops or one
// CUDA kernel per range, both the element updates of optim_math.h.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/half.h"
#include "engine/core/optim_math.h"
#include "engine/core/tensor.h"

namespace dtlab {

enum class OptimizerKind : uint8_t { SGD, AdamW };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::AdamW;
  double lr = 1e-3;
  double weight_decay = 0.0;  // SGD: added to the gradient (L2); AdamW: decoupled decay
  double momentum = 0.0;      // SGD
  double dampening = 0.0;     // SGD
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // AdamW

  std::string str() const;  // "adamw(lr=0.01, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01)"
};

// dtlab's defaults: torch's, except the learning rate, which torch does not choose for SGD and which
// at torch's 1e-3 makes AdamW slow for a classroom demo: SGD lr 0.1, wd 0; AdamW lr 0.01, wd 0.01.
OptimizerConfig default_optimizer_config(OptimizerKind kind);

OptimizerKind parse_optimizer_kind(std::string_view name);  // "sgd" | "adamw"; dtlab::Error otherwise
const char* optimizer_name(OptimizerKind k);

// The scalars of one step (`step` counts from 1), rounded to float where torch's ops consume them;
// optim.cpp's loops and the CUDA kernels both use these with optim_math.h's element updates.
SgdCoeffs sgd_coeffs(const OptimizerConfig& c);
AdamWCoeffs adamw_coeffs(const OptimizerConfig& c, int64_t step);

class Optimizer {
 public:
  // Manages `numel` contiguous parameters on `device`; state tensors are charged to `tracker` (may be null).
  Optimizer(const OptimizerConfig& config, int64_t numel, MemoryTracker* tracker, Device& device = cpu_device());

  // One update of params[0, numel) from grads[0, numel).
  void step(float* params, const float* grads);
  // One update where the gradients are not contiguous (DDP's gradient_as_bucket_view: each
  // parameter's gradient lives in its bucket). Segment i covers elements [offset, offset + numel)
  // of the managed range; together the segments must cover it exactly once.
  struct Segment {
    float* params;
    const float* grads;
    int64_t offset, numel;
  };
  void step(const std::vector<Segment>& segments);

  // Mixed precision (--precision bf16/fp16; docs/course_sources.md §6e; Micikevicius et al.'s master
  // copy): init_master() keeps a float32 copy of the 16-bit parameters (MemCategory::MasterWeights);
  // step_mixed() then updates the master weights from the 16-bit gradients times `inv_scale` (the
  // loss scaler's unscale; 1 without one), with the same element updates as step(), and rounds each
  // updated master weight into params16. The gradients are widened in small chunks: no float32
  // gradient buffer is allocated (2 + 2 + 4 + state bytes per parameter).
  void init_master(const uint16_t* params16, HalfFormat format);
  void step_mixed(uint16_t* params16, const uint16_t* grads16, float inv_scale);
  // The same where the 16-bit gradients are not contiguous (DDP's gradient_as_bucket_view).
  struct Segment16 {
    uint16_t* params;
    const uint16_t* grads;
    int64_t offset, numel;
  };
  void step_mixed(const std::vector<Segment16>& segments, float inv_scale);
  const Tensor& master_weights() const { return master_; }

  const OptimizerConfig& config() const { return config_; }
  void set_lr(double lr) { config_.lr = lr; }
  int64_t numel() const { return numel_; }
  int64_t steps_taken() const { return steps_; }
  // Bytes of state per parameter once created: SGD with momentum 4, AdamW 8, plain SGD 0.
  int64_t state_bytes_per_param() const;
  const Tensor& momentum_buffer() const { return state_a_; }  // SGD (empty until first step)
  const Tensor& exp_avg() const { return state_a_; }          // AdamW
  const Tensor& exp_avg_sq() const { return state_b_; }       // AdamW

 private:
  void ensure_state();
  OptimizerConfig config_;
  int64_t numel_;
  MemoryTracker* tracker_;
  Device& device_;
  int64_t steps_ = 0;
  Tensor state_a_, state_b_;
  Tensor master_;  // mixed precision: the float32 master weights
  Tensor grad32_;  // mixed precision: a chunk of widened (and unscaled) gradients
  HalfFormat format_ = HalfFormat::BF16;
};

}  // namespace dtlab
