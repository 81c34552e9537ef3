#include "engine/train/grad_clip.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/core/device.h"
#include "engine/core/model.h"
#include "engine/core/tensor.h"
#include "engine/parallel/expert_parallel.h"
#include "engine/trace/context.h"

namespace dtlab {

namespace {

// Sum of squares in double of n values at `p` on `dev`: read in place on the host, else downloaded
// (a few KiB of gradient; the lab's models are small).
template <class T, class F>
double sum_squares(Device& dev, const T* p, int64_t n, F to_float) {
  std::vector<T> host;
  if (!dev.is_host()) {
    host.resize(static_cast<size_t>(n));
    dev.download(host.data(), p, n * static_cast<int64_t>(sizeof(T)));
    p = host.data();
  }
  double s = 0;
  for (int64_t i = 0; i < n; i++) {
    const double v = to_float(p[i]);
    s += v * v;
  }
  return s;
}

}  // namespace

std::vector<bool> tp_counted_params(const Model& model) {
  std::vector<bool> counted(model.parameters().size(), true);
  const TensorParallelSpec& tp = model.tensor_parallel();
  if (tp.degree == 1 || tp.rank == 0) return counted;
  std::fill(counted.begin(), counted.end(), false);
  for (const TpPiece& p : tp_pieces(model, tp.rank))
    if (p.param >= 0 && static_cast<size_t>(p.param) < counted.size()) counted[static_cast<size_t>(p.param)] = counted[static_cast<size_t>(p.param)] || p.split();
  return counted;
}

float clip_coefficient(double total_norm, double max_norm) {
  const float coef = static_cast<float>(max_norm) / (static_cast<float>(total_norm) + 1e-6f);
  return coef > 1.0f ? 1.0f : coef;  // torch.clamp(max=1.0) keeps a NaN
}

void annotate_clip(StepReport& r, const GradClipResult& c) {
  r.grad_norm = c.total_norm;
  r.clip_coef = c.total_norm < 0 ? -1 : c.coef;
}

GradClipResult clip_grad_norm(const GradClipInput& in, double max_norm, Device& dev, RankContext* ctx) {
  double local = 0;
  for (const GradPiece& g : in.pieces) {
    if (g.numel == 0) continue;
    if (g.f32) local += sum_squares(dev, g.f32, g.numel, [](float v) { return v; });
    else {
      const double u = in.unscale;
      local += u * u * sum_squares(dev, g.h16, g.numel, [f = in.format](uint16_t h) { return half_to_float(h, f); });
    }
  }
  double total = local;
  for (Communicator* group : in.sum_over) {
    if (!group || group->world_size() == 1) continue;
    total = all_reduce_value(*group, static_cast<float>(total), ReduceOp::Sum, dev);
  }
  GradClipResult r;
  r.total_norm = std::sqrt(total / in.copies);
  r.coef = clip_coefficient(r.total_norm, max_norm);
  // != 1, not < 1: a non-finite norm gives a NaN factor, which torch multiplies in too
  // (error_if_nonfinite=False); the run's non-finite check then stops it.
  if (r.coef != 1.0f)
    for (const GradSpan& g : in.scaled)
      if (g.numel > 0) dev.scale(g.data, g.numel, r.coef);
  if (ctx && ctx->recorder()) {
    const int64_t now = ctx->recorder()->now_ns();
    const double tm = ctx->compute_clock();
    Event e(EventKind::GradClip, Lane::Compute, now, now, tm, tm);
    e.clip = GradClipInfo{r.total_norm, static_cast<float>(max_norm), r.coef};
    ctx->record(e);
  }
  return r;
}

void add_model_grads(GradClipInput& in, const Model& model) {
  const std::vector<bool> counted = tp_counted_params(model);
  const auto& ps = model.parameters();
  for (size_t k = 0; k < ps.size(); k++) {
    const Parameter& p = ps[k];
    if (!model.mixed()) in.scaled.push_back({p.grad, p.numel});
    if (!counted[k]) continue;  // TP rank 0 counts it
    // A GPT pipeline's last stage holds the tied weight's copy; the first stage's wte counts it
    // (Megatron leaves shared parameters out of the norm on all but one stage).
    if (p.name == "lm_head.weight") continue;
    in.pieces.push_back(model.mixed() ? GradPiece{nullptr, p.grad16, p.numel} : GradPiece{p.grad, nullptr, p.numel});
  }
  if (model.mixed()) in.format = model.half_format();
}

void add_expert_parallel_grads(GradClipInput& in, const Model& model, bool first_replica, bool first_ep_group) {
  const std::vector<bool> counted = tp_counted_params(model);
  const auto& ps = model.parameters();
  std::vector<char> expert(ps.size(), 0);
  for (int i : expert_parameters(model)) expert[static_cast<size_t>(i)] = 1;
  for (size_t k = 0; k < ps.size(); k++) {
    const Parameter& p = ps[k];
    if (!model.mixed()) in.scaled.push_back({p.grad, p.numel});
    // (An expert is whole on its rank, and under --tp the TP ranks hold different ones.)
    const bool count = expert[k] ? first_ep_group : first_replica && counted[k] && p.name != "lm_head.weight";
    if (count) in.pieces.push_back(model.mixed() ? GradPiece{nullptr, p.grad16, p.numel} : GradPiece{p.grad, nullptr, p.numel});
  }
  if (model.mixed()) in.format = model.half_format();
}

}  // namespace dtlab
