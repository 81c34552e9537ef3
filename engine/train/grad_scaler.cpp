#include "engine/train/grad_scaler.h"

#include "engine/core/check.h"
#include "engine/trace/context.h"

namespace dtlab {

bool GradScaler::local_found_inf(Model& model) {
  DTLAB_CHECK(model.mixed(), "the loss scaler checks a mixed-precision model's gradients");
  for (const Parameter& p : model.parameters())  // each where it lives (a DDP bucket's view, or the flat buffer)
    if (!model.device().half_all_finite(p.grad16, p.numel, model.half_format())) return true;
  return false;
}

bool GradScaler::agree(Communicator* comm, bool found_inf, Device& dev) {
  if (!comm || comm->world_size() == 1) return found_inf;
  return all_reduce_value(*comm, found_inf ? 1.0f : 0.0f, ReduceOp::Max, dev) != 0.0f;
}

bool GradScaler::unscale_grads(Model& model) {
  if (model.mixed()) return local_found_inf(model);
  Device& dev = model.device();
  bool found = false;
  for (const Parameter& p : model.parameters()) {
    if (!p.grad || p.numel == 0) continue;
    dev.scale(p.grad, p.numel, inv_scale());
    found = found || !dev.all_finite(p.grad, p.numel);
  }
  return found;
}

bool ShardedGradScaler::unscale_grads(Model&) { return fsdp_.unscale_shard_grads(inv_scale()); }

std::unique_ptr<GradScaler> make_grad_scaler(FullyShardedDataParallel* fsdp) {
  if (fsdp) return std::make_unique<ShardedGradScaler>(*fsdp);
  return std::make_unique<GradScaler>();
}

void GradScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ = static_cast<float>(scale_ * config_.backoff_factor);
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ == config_.growth_interval) {
    scale_ = static_cast<float>(scale_ * config_.growth_factor);
    growth_tracker_ = 0;
  }
}

bool scaler_allows_step(GradScaler& scaler, Model& model, Communicator* comm, RankContext* ctx) {
  // FSDP's scaler checks this rank's shard
  return scaler_allows_step(scaler, scaler.unscale_grads(model), model.device(), comm, ctx);
}

bool scaler_allows_step(GradScaler& scaler, bool found, Device& dev, Communicator* comm, RankContext* ctx) {
  const bool any = GradScaler::agree(comm, found, dev);
  const float before = scaler.scale();
  scaler.update(any);
  if (ctx && ctx->recorder()) {
    const int64_t now = ctx->recorder()->now_ns();
    const double tm = ctx->compute_clock();
    Event e(EventKind::LossScale, Lane::Compute, now, now, tm, tm);
    e.scaler = LossScaleInfo{before, scaler.scale(), static_cast<uint8_t>(found), static_cast<uint8_t>(any), scaler.growth_tracker()};
    ctx->record(e);
  }
  return !any;
}

}  // namespace dtlab
