#include "engine/core/optim.h"

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

Optimizer::Optimizer(const OptimizerConfig& config, int64_t numel, MemoryTracker* tracker)
    : config_(config), numel_(numel), tracker_(tracker) {
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
  for (const Segment& s : segments) {
    if (config_.kind == OptimizerKind::SGD) step_sgd(s.params, s.grads, s.offset, s.numel, first);
    else step_adamw(s.params, s.grads, s.offset, s.numel);
  }
}

void Optimizer::ensure_state() {
  if (!state_a_.empty()) return;
  if (config_.kind == OptimizerKind::AdamW) {
    state_a_ = Tensor({numel_}, MemCategory::OptimizerState, tracker_);
    state_b_ = Tensor({numel_}, MemCategory::OptimizerState, tracker_);
  } else if (config_.momentum != 0.0) {
    state_a_ = Tensor({numel_}, MemCategory::OptimizerState, tracker_);
  }
}

// Each line mirrors one tensor op of torch's _single_tensor_sgd / _single_tensor_adamw, with the
// Python-side scalars computed in double and rounded to float where the op consumes them, so the
// float32 roundings happen where torch's do.
void Optimizer::step_sgd(float* p, const float* g, int64_t offset, int64_t n, bool first) {
  const float lr = static_cast<float>(config_.lr);
  const float wd = static_cast<float>(config_.weight_decay);
  const float mom = static_cast<float>(config_.momentum);
  const float damp1 = static_cast<float>(1.0 - config_.dampening);
  float* buf = state_a_.empty() ? nullptr : state_a_.f32() + offset;
  for (int64_t i = 0; i < n; i++) {
    float d = g[i];
    if (wd != 0.0f) d = d + wd * p[i];           // d_p = d_p.add(param, alpha=weight_decay)
    if (buf) {
      if (first) buf[i] = d;                      // buf = clone(d_p)
      else buf[i] = buf[i] * mom + damp1 * d;     // buf.mul_(momentum).add_(d_p, alpha=1-dampening)
      d = buf[i];
    }
    p[i] = p[i] + (-lr) * d;                      // param.add_(d_p, alpha=-lr)
  }
}

void Optimizer::step_adamw(float* p, const float* g, int64_t offset, int64_t n) {
  const double t = static_cast<double>(steps_);
  const float decay = static_cast<float>(1.0 - config_.lr * config_.weight_decay);
  const float b1 = static_cast<float>(config_.beta1), b2 = static_cast<float>(config_.beta2);
  const float one_b1 = static_cast<float>(1.0 - config_.beta1);
  const float one_b2 = static_cast<float>(1.0 - config_.beta2);
  const double bc1 = 1.0 - std::pow(config_.beta1, t);
  const double bc2 = 1.0 - std::pow(config_.beta2, t);
  const float neg_step_size = static_cast<float>(-(config_.lr / bc1));
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float eps = static_cast<float>(config_.eps);
  float* m = state_a_.f32() + offset;
  float* v = state_b_.f32() + offset;
  for (int64_t i = 0; i < n; i++) {
    p[i] = p[i] * decay;                          // param.mul_(1 - lr * weight_decay)
    m[i] = m[i] * b1 + one_b1 * g[i];             // exp_avg.mul_(beta1).add_(grad, alpha=1-beta1)
    v[i] = v[i] * b2 + one_b2 * g[i] * g[i];      // exp_avg_sq.mul_(beta2).addcmul_(g, g, 1-beta2)
    float denom = std::sqrt(v[i]) / bc2_sqrt + eps;  // (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
    p[i] = p[i] + neg_step_size * m[i] / denom;      // param.addcdiv_(exp_avg, denom, -step_size)
  }
}

}  // namespace dtlab
