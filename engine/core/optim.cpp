#include "engine/core/optim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "engine/core/check.h"

namespace dtlab {

OptimizerKind parse_optimizer_kind(std::string_view name) {
  if (name == "sgd") return OptimizerKind::SGD;
  if (name == "adamw") return OptimizerKind::AdamW;
  throw Error("optimizer '" + std::string(name) + "' is not supported; use sgd or adamw");
}

OptimizerConfig default_optimizer_config(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  c.lr = kind == OptimizerKind::SGD ? 0.1 : 0.01;
  c.weight_decay = kind == OptimizerKind::SGD ? 0.0 : 0.01;
  return c;
}

const char* optimizer_name(OptimizerKind k) { return k == OptimizerKind::SGD ? "sgd" : "adamw"; }

std::string OptimizerConfig::str() const {
  char buf[200];
  if (kind == OptimizerKind::SGD)
    std::snprintf(buf, sizeof buf, "sgd(lr=%g, momentum=%g, dampening=%g, weight_decay=%g)", lr,
                  momentum, dampening, weight_decay);
  else
    std::snprintf(buf, sizeof buf, "adamw(lr=%g, betas=(%g, %g), eps=%g, weight_decay=%g)", lr,
                  beta1, beta2, eps, weight_decay);
  return buf;
}

Optimizer::Optimizer(const OptimizerConfig& config, int64_t numel, MemoryTracker* tracker, Device& device)
    : config_(config), numel_(numel), tracker_(tracker), device_(device) {
  DTLAB_CHECK(numel >= 0, "optimizer over a negative number of parameters");
}

int64_t Optimizer::state_bytes_per_param() const {
  if (config_.kind == OptimizerKind::AdamW) return 8;
  return config_.momentum != 0.0 ? 4 : 0;
}

void Optimizer::step(float* params, const float* grads) {
  step(std::vector<Segment>{{params, grads, 0, numel_}});
}

void Optimizer::step(const std::vector<Segment>& segments) {
  int64_t covered = 0;
  for (const Segment& s : segments) {
    DTLAB_CHECK(s.offset >= 0 && s.numel >= 0 && s.offset + s.numel <= numel_,
                "optimizer segment outside the managed range");
    covered += s.numel;
  }
  DTLAB_CHECK(covered == numel_, "optimizer segments do not cover the managed range");
  steps_++;
  const bool first = state_a_.empty();  // SGD's momentum buffer starts as a copy of d_p
  ensure_state();
  if (config_.kind == OptimizerKind::SGD) {
    const SgdCoeffs k = sgd_coeffs(config_);
    for (const Segment& s : segments)
      device_.sgd_step(s.params, s.grads, state_a_.empty() ? nullptr : state_a_.f32() + s.offset, s.numel, k, first);
  } else {
    const AdamWCoeffs k = adamw_coeffs(config_, steps_);
    for (const Segment& s : segments)
      device_.adamw_step(s.params, s.grads, state_a_.f32() + s.offset, state_b_.f32() + s.offset, s.numel, k);
  }
}

void Optimizer::init_master(const uint16_t* params16, HalfFormat format) {
  format_ = format;
  master_ = Tensor({numel_}, MemCategory::MasterWeights, tracker_, DType::F32, device_);
  device_.widen_half(master_.f32(), params16, numel_, format);
}

void Optimizer::step_mixed(uint16_t* params16, const uint16_t* grads16, float inv_scale) {
  step_mixed(std::vector<Segment16>{{params16, grads16, 0, numel_}}, inv_scale);
}

// The element updates are independent, so any cover of the range gives the same bits. Each chunk's
// 16-bit gradients are widened into float32 scratch on the device (and unscaled there: GradScaler's
// unscale_, grad * (1 / scale)), the fp32 master weights step, and the 16-bit parameters are their rounding.
void Optimizer::step_mixed(const std::vector<Segment16>& segments, float inv_scale) {
  DTLAB_CHECK(!master_.empty(), "step_mixed() before init_master()");
  int64_t covered = 0;
  for (const Segment16& s : segments) covered += s.numel;
  DTLAB_CHECK(covered == numel_, "optimizer segments do not cover the managed range");
  steps_++;
  const bool first = state_a_.empty();
  ensure_state();
  const SgdCoeffs ks = sgd_coeffs(config_);
  const AdamWCoeffs ka = adamw_coeffs(config_, steps_);
  // The host's chunk stays in cache; a GPU takes a segment at once (one launch per op).
  const int64_t chunk = device_.is_host() ? 2048 : numel_;
  if (grad32_.numel() < std::min(chunk, numel_))
    grad32_ = Tensor({std::min(chunk, numel_)}, MemCategory::Other, device_.is_host() ? nullptr : tracker_, DType::F32, device_);
  float* const g = grad32_.f32();
  for (const Segment16& s : segments) {
    for (int64_t done = 0; done < s.numel; done += chunk) {
      const int64_t n = std::min(chunk, s.numel - done), lo = s.offset + done;
      float* const master = master_.f32() + lo;
      device_.widen_half(g, s.grads + done, n, format_);
      if (inv_scale != 1.0f) device_.scale(g, n, inv_scale);
      if (config_.kind == OptimizerKind::SGD)
        device_.sgd_step(master, g, state_a_.empty() ? nullptr : state_a_.f32() + lo, n, ks, first);
      else
        device_.adamw_step(master, g, state_a_.f32() + lo, state_b_.f32() + lo, n, ka);
      device_.narrow_half(s.params + done, master, n, format_);
    }
  }
}

void Optimizer::ensure_state() {
  if (!state_a_.empty()) return;
  if (config_.kind == OptimizerKind::AdamW) {
    state_a_ = Tensor({numel_}, MemCategory::OptimizerState, tracker_, DType::F32, device_);
    state_b_ = Tensor({numel_}, MemCategory::OptimizerState, tracker_, DType::F32, device_);
  } else if (config_.momentum != 0.0) {
    state_a_ = Tensor({numel_}, MemCategory::OptimizerState, tracker_, DType::F32, device_);
  }
}

SgdCoeffs sgd_coeffs(const OptimizerConfig& c) {
  return {static_cast<float>(c.lr), static_cast<float>(c.weight_decay), static_cast<float>(c.momentum),
          static_cast<float>(1.0 - c.dampening)};
}

// The Python-side scalars of torch's _single_tensor_adamw, computed in double and rounded to float
// where the tensor ops consume them, so the float32 roundings happen where torch's do.
AdamWCoeffs adamw_coeffs(const OptimizerConfig& c, int64_t step) {
  const double t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(c.beta1, t);
  const double bc2 = 1.0 - std::pow(c.beta2, t);
  return {static_cast<float>(1.0 - c.lr * c.weight_decay),
          static_cast<float>(c.beta1), static_cast<float>(c.beta2),
          static_cast<float>(1.0 - c.beta1), static_cast<float>(1.0 - c.beta2),
          static_cast<float>(-(c.lr / bc1)), static_cast<float>(std::sqrt(bc2)), static_cast<float>(c.eps)};
}

}  // namespace dtlab
