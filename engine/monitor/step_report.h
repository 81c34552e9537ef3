// What one training step reports to its front ends (CLI, app) and, through the monitor, to a viewer
// of a launched run. The trainer (engine/train) fills it; the monitor's wire format carries it.
#pragma once
#include <cstdint>
#include <vector>

namespace dtlab {

struct StepReport {
  int64_t step = 0;         // 1-based
  int64_t total_steps = 0;
  int64_t epoch = 0;        // the sampler's epoch (set_epoch value)
  int64_t batch_size = 0;   // this step's batch (the last one of an epoch may be partial)
  float loss = 0;           // mean cross-entropy over the step's samples on every rank
  double accuracy = 0;      // fraction of them classified correctly (before the update)
  double step_seconds = 0;  // wall time of forward + backward + step
  double samples_per_sec = 0;  // all ranks together
  int64_t samples = 0;      // this step's samples over every rank and micro-batch
  double overlap = -1;      // ddp: share of all-reduce time hidden behind backward (modeled), mean over ranks;
                            // dp: share of rank 0's gradient reduce hidden behind its backward
  bool branch_taken = false;  // the model's skip branch was taken this step
  std::vector<double> bubble;  // pipeline: each world rank's bubble this step (modeled idle / makespan)
  float loss_scale = 0;        // fp16: the loss scale this step's gradients carried (0: no scaler)
  bool step_skipped = false;   // fp16: the ranks found an inf/NaN and skipped the optimizer step
  // --clip-grad-norm: the whole model's gradient norm before clipping (clip_grad_norm_'s return
  // value) and the factor every gradient was multiplied by (1: not clipped); -1: no clipping this step.
  double grad_norm = -1;
  double clip_coef = -1;
};

}  // namespace dtlab
