// torch.cuda.amp.GradScaler's dynamic loss scaling for fp16 training (docs/course_sources.md §6e):
// the loss gradient is multiplied by scale() before backward, so small fp16 gradients do not flush to
// zero; after backward every rank checks its gradients for inf/NaN and the ranks agree by an
// all-reduce (MAX of a flag), so they all skip the same step or all take it. A skipped step leaves the
// weights and the optimizer state as they were and multiplies the scale by backoff (0.5); after
// growth_interval (2000) steps in a row without inf/NaN the scale grows by growth (2.0). The optimizer
// divides the gradients by the scale before its update (unscale_).
#pragma once
#include <cstdint>

#include "engine/comm/communicator.h"
#include "engine/core/model.h"

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
  float scale() const { return scale_; }
  float inv_scale() const { return 1.0f / scale_; }  // torch: scaler._scale.double().reciprocal().float()
  int64_t growth_tracker() const { return growth_tracker_; }
  // This rank's gradients hold an inf or NaN (16-bit: the model's flat gradient buffer).
  static bool local_found_inf(Model& model);
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

}  // namespace dtlab
