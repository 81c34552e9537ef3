// Gradient clipping by the global norm: torch.nn.utils.clip_grad_norm_(params, max_norm) with
// norm_type 2, for gradients that no rank may hold whole. Every strategy names the pieces of
// gradient this rank holds and the groups whose sum makes the whole model's; this file does the rest
// once:
//   sum of squares of the counted pieces (double, on the host) -> summed over each group (one float
//   all-reduce each, as FSDP1's clip_grad_norm_ all-reduces its local norm squared) -> / copies ->
//   sqrt = total_norm -> clip_coef = max_norm / (total_norm + 1e-6), clamped at 1 -> every float32
//   piece multiplied by it (16-bit gradients: the caller folds it into the optimizer's unscale).
// Where the pieces come from: ddp, single, dp the module's gradients; fsdp the owned slices of the flat
// shards (no padding); the pipeline its stages' gradients over the world; --tp counts a split
// parameter on every TP rank and a replicated one on TP rank 0 only (Megatron's get_grad_norm).
#pragma once
#include <cstdint>
#include <vector>

#include "engine/core/half.h"
#include "engine/monitor/step_report.h"

namespace dtlab {

class Communicator;
class Device;
class Model;
class RankContext;

// A stretch of this rank's gradient the norm counts: float32 (f32) or 16-bit (h16, times `unscale`
// to be the fp32 gradient: fp16's loss scale removed).
struct GradPiece {
  const float* f32 = nullptr;
  const uint16_t* h16 = nullptr;
  int64_t numel = 0;
};

// A float32 gradient the optimizer then reads, multiplied by the clip coefficient in place.
struct GradSpan {
  float* data = nullptr;
  int64_t numel = 0;
};

struct GradClipInput {
  std::vector<GradPiece> pieces;  // counted once over the groups (a replica's copy is left out)
  std::vector<GradSpan> scaled;   // every float32 gradient the step reads (counted or not)
  HalfFormat format = HalfFormat::BF16;  // of the 16-bit pieces
  float unscale = 1.0f;                  // fp16: 1 / the loss scale; 1 otherwise
  std::vector<Communicator*> sum_over;   // groups whose all-reduce (sum) completes the norm; nulls skipped
  double copies = 1;                     // how many times the summed squares count every element
};

struct GradClipResult {
  double total_norm = -1;  // before clipping: clip_grad_norm_'s return value; -1: no clipping this step
  float coef = 1;          // what every gradient was (or, 16-bit, is to be) multiplied by
};
// The step report's figures of `c` (grad_norm, clip_coef; -1 when the step was not clipped).
void annotate_clip(StepReport& r, const GradClipResult& c);

// torch's clip_coef_clamped: min(1, max_norm / (total_norm + 1e-6)), in float as torch computes it.
float clip_coefficient(double total_norm, double max_norm);

// The whole model's gradient norm over `in`, and in.scaled multiplied by the coefficient; recorded as a
// GradClip event on `ctx` (null: none). A collective on every group of in.sum_over: every rank of them
// calls it at the same point.
GradClipResult clip_grad_norm(const GradClipInput& in, double max_norm, Device& dev, RankContext* ctx);

// Per parameter of `model`: whether this rank counts it in the norm (all but a tensor-parallel
// shard's replicated parameters off TP rank 0).
std::vector<bool> tp_counted_params(const Model& model);

// The model's own gradients (parameters(): under LoRA only the adapters), each where it lives (a
// DDP bucket's view, or the flat buffer); with --tp a replicated parameter counts on TP rank 0 only.
void add_model_grads(GradClipInput& in, const Model& model);

// add_model_grads under --ep, for a norm summed over the whole world: each parameter counted on one
// rank, a dense one on the first replica (on TP rank 0 when it is whole on its TP group; never
// lm_head's copy of the tied weight), an expert on the first EP group (Megatron sums the
// expert-parallel parameters' squares apart, over their own groups: the same total).
void add_expert_parallel_grads(GradClipInput& in, const Model& model, bool first_replica, bool first_ep_group);

}  // namespace dtlab
