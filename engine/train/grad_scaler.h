// torch.cuda.amp.GradScaler's dynamic loss scaling for fp16 training (docs/course_sources.md §6e):
// the loss gradient is multiplied by scale() before backward, so small fp16 gradients do not flush to
// zero; after backward every rank checks its gradients for inf/NaN and the ranks agree by an
// all-reduce (MAX of a flag), so they all skip the same step or all take it. A skipped step leaves the
// weights and the optimizer state as they were and multiplies the scale by backoff (0.5); after
// growth_interval (2000) steps in a row without inf/NaN the scale grows by growth (2.0). The optimizer
// divides the gradients by the scale before its update (unscale_).
//
// Under FSDP the gradients a rank holds are its fp32 shard, not the model's: ShardedGradScaler (torch's
// torch.distributed.fsdp.ShardedGradScaler) unscales and checks that shard instead, and the found-inf
// all-reduce is what makes every rank skip together (an inf lands in one rank's shard only).
#pragma once
#include <cstdint>
#include <memory>

#include "engine/comm/communicator.h"
#include "engine/core/model.h"
#include "engine/parallel/fsdp.h"

namespace dtlab {

struct GradScalerConfig {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class GradScaler {
 public:
  explicit GradScaler(const GradScalerConfig& c = {}) : config_(c), scale_(static_cast<float>(c.init_scale)) {}
  virtual ~GradScaler() = default;
  float scale() const { return scale_; }
  float inv_scale() const { return 1.0f / scale_; }  // torch: scaler._scale.double().reciprocal().float()
  int64_t growth_tracker() const { return growth_tracker_; }
  // This rank's gradients hold an inf or NaN (16-bit: the model's flat gradient buffer).
  static bool local_found_inf(Model& model);
  // torch's _unscale_grads_: does this rank's part of the gradients hold an inf or NaN? Here the
  // model's 16-bit gradients, whose division by the scale Optimizer::step_mixed fuses into the update.
  // Call before update(): the division uses the scale the gradients carry.
  // Under --amp the float32 gradients are multiplied by 1 / scale in place first, as torch's unscale_ does.
  virtual bool unscale_grads(Model& model);
  // Every rank's finding combined: an all-reduce MAX of one float on `comm` (null: this rank alone).
  // A collective: every rank calls it once per step.
  static bool agree(Communicator* comm, bool found_inf, Device& dev);
  // torch's _amp_update_scale_: after a step with (found_inf) or without an inf.
  void update(bool found_inf);

 private:
  GradScalerConfig config_;
  float scale_;
  int64_t growth_tracker_ = 0;
};

// torch.distributed.fsdp.ShardedGradScaler (docs/course_sources.md §6e): unscale_grads() multiplies this
// rank's fp32 gradient shard by inv_scale() in place (the shard the optimizer then steps) and checks
// only that shard.
class ShardedGradScaler : public GradScaler {
 public:
  explicit ShardedGradScaler(FullyShardedDataParallel& fsdp, const GradScalerConfig& c = {}) : GradScaler(c), fsdp_(fsdp) {}
  bool unscale_grads(Model& model) override;

 private:
  FullyShardedDataParallel& fsdp_;
};

// fp16's scaler for a run: ShardedGradScaler when FSDP holds the gradients (fsdp not null), else GradScaler.
std::unique_ptr<GradScaler> make_grad_scaler(FullyShardedDataParallel* fsdp);

class RankContext;
// GradScaler.step + update for one rank: its inf/NaN check (unscale_grads), the ranks' agreement over
// `comm` (null: one process decides alone), the scale's update, and the decision as a LossScale event
// on `ctx` (null: none). True: take the step; false: every rank skips it.
bool scaler_allows_step(GradScaler& scaler, Model& model, Communicator* comm, RankContext* ctx);
// The same where this rank's gradients are not one Model's (a pipeline rank's stages): `found` is
// its own check, `dev` where the agreement's flag lives.
bool scaler_allows_step(GradScaler& scaler, bool found, Device& dev, Communicator* comm, RankContext* ctx);

}  // namespace dtlab
