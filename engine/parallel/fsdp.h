// FullyShardedDataParallel, FSDP1-style (torch/distributed/fsdp, flat parameters), FSDP2's fully_shard
// (per-parameter shards, below) and ZeRO-1:
//   - units: one per Linear layer (auto-wrap; a GPT: one per block and the root's embeddings, ln_f
//     and tied head, Model::wrap_units) or the whole model; each unit's parameters are
//     flattened into one buffer of N elements, split in W chunks of ceil(N/W) with zero padding at
//     the end; rank r keeps chunk r (its shard) and the optimizer state for it;
//   - FULL_SHARD: all-gather a unit's parameters before its forward and free them after; all-gather
//     again before its backward; reduce-scatter its gradient after, then free;
//   - SHARD_GRAD_OP: the forward's gathered parameters stay until the unit's backward is done;
//   - NO_SHARD: parameters and optimizer state replicated, each unit's gradient all-reduced;
//   - HYBRID_SHARD: FULL_SHARD inside a node group of K ranks (shard r % K), replicated across the
//     W/K groups: the shard's gradient is reduce-scattered in the node, then all-reduced across
//     nodes among the ranks holding the same shard (process groups: engine/comm/group.h);
//   - ZeRO-1: parameters replicated, gradients all-reduced, optimizer state sharded: each rank
//     updates its slice of the flat parameters, then an all-gather brings everyone the result.
// FSDP2 (FsdpOptions::api 2, torch's fully_shard, docs/course_sources.md §11b): the same units, but
// each parameter is split on dim 0 on its own (Dim0Shard: torch.chunk's rows, padded to chunk 0's);
// a unit's shard is its parameters' padded chunks one after another, the all-gather output W such
// blocks rank by rank, copied out into each parameter's padded unsharded tensor; the gradients are
// copied in the other way (chunk_cat) before the reduce-scatter. reshard_after_forward true / false /
// N (keep a 1/N shard, all-gathered in backward over N consecutive ranks); HYBRID_SHARD is HSDP's
// (replicate, shard) mesh. float32 and bfloat16 gradients are averaged as ReduceOp.AVG does.
// Each unit runs FSDP2's state machine (IDLE -> FORWARD -> IDLE -> PRE_BACKWARD -> POST_BACKWARD
// -> IDLE) through verbs named as in torch (unshard, wait_for_unshard, reshard, post_backward);
// every verb is recorded as an FsdpUnit event, so views draw who holds what, live.
// Gradients are averaged the FSDP1 way: divided by f before the reduction and by W/f after (f
// starts at 1 and doubles while W % f == 0 and W / f > f).
// Prefetch (torch's options): forward_prefetch issues the next unit's all-gather before the current
// unit's forward; backward_prefetch Pre issues the next (in backward order) unit's all-gather before
// the current unit's gradient computation (most overlap, two gathered units live), Post after it.
// Mixed precision (a model after Model::set_precision; torch's MixedPrecision(param_dtype,
// reduce_dtype), docs/course_sources.md §6e and §11), every sharding strategy:
//   - FULL_SHARD, SHARD_GRAD_OP and HYBRID_SHARD: the shard stays float32 and is the master copy the
//     optimizer steps (charged as MasterWeights); unshard casts it to the 16-bit param dtype and
//     all-gathers 16-bit bytes, so forward and backward run the model's 16-bit layers on 16-bit
//     gathered parameters and 16-bit gradients; the gradient is pre-divided, reduce-scattered (HYBRID:
//     in the node group, then all-reduced across the replica group) and post-divided in the reduce
//     dtype (the param dtype, or float32 with reduce_fp32), then cast to the fp32 gradient shard;
//   - NO_SHARD: the model keeps its full 16-bit parameters (the cast of the fp32 flat parameter that
//     torch's FSDP computes with); the fp32 master and gradient live here; each unit's 16-bit gradient
//     is all-reduced in the reduce dtype and cast to the fp32 gradient; the step casts the master back;
//   - ZeRO-1: as NO_SHARD, but the fp32 master, gradient and optimizer state are this rank's slice;
//     the updated slice is cast to 16 bits and all-gathered in the param dtype.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <string_view>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/comm/group.h"
#include "engine/core/model.h"
#include "engine/core/optim.h"
#include "engine/core/tensor.h"
#include "engine/io/sharded_checkpoint.h"
#include "engine/parallel/memory_plan.h"
#include "engine/trace/context.h"
#include "engine/trace/event.h"

namespace dtlab {

enum class BackwardPrefetch : uint8_t { None, Pre, Post };
BackwardPrefetch parse_backward_prefetch(std::string_view text);  // "none" | "pre" | "post"
const char* backward_prefetch_name(BackwardPrefetch p);           // torch: "BACKWARD_PRE", ...

struct FsdpOptions {
  Sharding sharding = Sharding::FullShard;
  bool wrap_layers = true;  // one unit per Linear (auto-wrap); false: the whole model is one unit
  BackwardPrefetch backward_prefetch = BackwardPrefetch::Pre;  // torch's default
  bool forward_prefetch = false;
  int node_size = 0;  // HYBRID_SHARD: ranks per shard group; must divide the world (> 0 for hybrid)
  // 1: FullyShardedDataParallel (FSDP1, flat parameters); 2: fully_shard (FSDP2, each parameter its own
  // Shard(0) DTensor; sharding FullShard or Hybrid, the latter as HSDP's (replicate, shard) mesh).
  int api = 1;
  // FSDP2's reshard_after_forward: kReshardTrue frees a unit's parameters after its forward, 0 (False)
  // keeps them until its backward, N keeps a 1/N shard over groups of N consecutive ranks (the node)
  // so the backward's all-gather runs inside that group. The root unit never reshards after forward.
  int reshard_after_forward = -1;
  // FSDP2's explicit prefetch (set_modules_to_forward_prefetch / set_modules_to_backward_prefetch with
  // the next N units): how many units ahead forward_prefetch and BACKWARD_PRE gather; FSDP1 gathers one.
  int prefetch = 1;
  // Expert parallelism (--ep; torchtitan's apply_fsdp, docs/course_sources.md §6i): each MoE block's
  // experts are a unit of their own, sharded over `expert_group` (the ranks holding the same experts: the
  // expert-data-parallel group, one rank or more) beside the block's unit over the FSDP group, gathered
  // and reduced with it in the same hooks. Their gradients are averaged over `expert_divide` ranks (the
  // data-parallel world, as torchtitan's set_gradient_divide_factor and Megatron's expert gradient
  // scaling), so an expert's step is the one DDP with --ep takes. Fully sharded layouts only (FULL_SHARD,
  // SHARD_GRAD_OP, fully_shard); an expert unit reshards after forward as the others do, but fully where
  // fully_shard's reshard_after_forward=N would keep a post-forward group's share (its group is not the
  // shard group). Null: no expert units.
  Communicator* expert_group = nullptr;
  int expert_divide = 1;
  // HYBRID_SHARD (HSDP): `expert_group` is then the node's ranks holding this rank's experts, and the
  // experts' shard is all-reduced over `expert_replicate` (the ranks at this rank's place in every node).
  Communicator* expert_replicate = nullptr;
  // Where FSDP's own process groups (HYBRID_SHARD's, reshard_after_forward=N's) run: an executor the
  // rank's other groups share (one rank's group operations run in program order on one executor), or
  // null for one of FSDP's own.
  std::shared_ptr<GroupExecutor> executor;
};
inline constexpr int kReshardTrue = -1;
// "true" | "false" | N; the text parse_reshard_after_forward() takes back.
std::string reshard_after_forward_text(int r);
int parse_reshard_after_forward(std::string_view text);  // throws Error naming the flag

// FSDP2's split of one parameter of `rows` x `cols` (dim 0 and the rest) over W ranks: torch.chunk's
// ceil(rows / W) rows a rank, the last ranks' chunks padded (or all padding) to that size; the
// unsharded all-gather output is W chunks, so it holds chunk * W rows, padding last.
struct Dim0Shard {
  int64_t rows = 0, cols = 1, chunk_rows = 0;
  int world = 1;
  int64_t shard_numel() const { return chunk_rows * cols; }             // padded, every rank
  int64_t padded_numel() const { return shard_numel() * world; }        // the all-gather output
  int64_t real_rows(int rank) const;                                     // unpadded rows on `rank`
};
Dim0Shard dim0_shard(const Shape& shape, int world);

// Per-rank parameter bytes (float32 shards, padding included) of one model under FSDP1's flat split of
// each unit and FSDP2's per-parameter dim-0 split; what the lab's FSDP1/FSDP2 comparison draws.
struct FsdpLayoutBytes {
  int64_t fsdp1_shard_elems = 0, fsdp2_shard_elems = 0;  // per rank, all units
  int64_t fsdp1_gather_elems = 0, fsdp2_gather_elems = 0;  // all-gather output per forward, all units
  int64_t real_elems = 0;                                   // the model's parameters
};
FsdpLayoutBytes fsdp_layout_bytes(const std::vector<std::vector<Shape>>& units, int world);

// A piece of one model parameter that a rank owns: what its sharded checkpoint file stores.
using OwnedSlice = ParamSlice;

// FSDP1's flat-parameter split of N elements over W ranks: chunk ceil(N/W); rank r holds
// [r*chunk, min(N, (r+1)*chunk)) and zeros for the rest ("N=5, W=4 -> 2,2,1,0 real + padding").
struct FlatShard {
  int64_t chunk = 0, padded = 0;
  int64_t real(int rank) const;  // real (unpadded) elements on `rank`
  int64_t numel = 0;
  int world = 1;
};
FlatShard flat_shard(int64_t numel, int world);
// The pre-divide factor f of FSDP1's gradient averaging (post-divide is W / f).
int fsdp_predivide_factor(int world);

class FullyShardedDataParallel : public LayerHooks {
 public:
  // Collective: broadcasts rank 0's parameters, then shards them (the model gives up its own
  // buffers for the sharded strategies).
  // reduce_fp32: a mixed-precision model's gradients are reduced in float32 (reduce_dtype=float32),
  // not in its 16-bit dtype; no effect on a float32 model.
  FullyShardedDataParallel(Model& model, Communicator& comm, RankContext* ctx, const FsdpOptions& opt,
                           const OptimizerConfig& optimizer, bool reduce_fp32 = false);
  ~FullyShardedDataParallel() override;

  void zero_grad();
  // After Model::backward(): waits for the gradient reductions and applies the post-divide.
  // Gradient accumulation (several backwards between zero_grad() and step(), torch FSDP without
  // no_sync()): every backward reduce-scatters its own gradient, and from the second one on the
  // reduced shard is added to the shard's gradient instead of replacing it (FSDP1's
  // _accumulate_sharded_gradient); NO_SHARD and ZeRO-1 all-reduce the accumulated .grad, whose
  // earlier part every rank already holds averaged.
  void finalize_backward();
  // The optimizer step over what this rank owns (ZeRO-1 then all-gathers the parameters).
  void step();
  // fp16 (ShardedGradScaler, engine/train/grad_scaler.h): after finalize_backward(), multiplies this
  // rank's fp32 gradient (its shard; NO_SHARD: all of it; ZeRO-1: its slice) by inv_scale and says
  // whether it holds an inf or NaN.
  bool unscale_shard_grads(float inv_scale);
  // What the collectives move: the 16-bit param dtype or float32 (all-gathers), the reduce dtype
  // (gradient reductions).
  DType gather_dtype() const { return gather_dtype_; }
  DType reduce_dtype() const { return reduce_dtype_; }
  // Collective: gathers the full parameters back into the model's own buffers (for evaluation and
  // checkpoints) and detaches from the model.
  void materialize();

  int num_units() const { return static_cast<int>(units_.size()); }
  const FlatShard& unit_shard(int u) const { return units_[static_cast<size_t>(u)].split; }
  FsdpState unit_state(int u) const { return units_[static_cast<size_t>(u)].state; }
  int64_t shard_numel() const { return shard_numel_; }
  int shard_world() const { return shard_world_; }  // W, or K for HYBRID_SHARD
  // The parameter values this rank owns (sharded: its shard of each unit; ZeRO-1 and NO_SHARD: its
  // ZeRO-1 slice of the flat parameters; HYBRID_SHARD: its node-group shard, on the first node
  // only, since the other nodes hold copies). Together the ranks' slices cover every parameter once.
  std::vector<OwnedSlice> owned_slices() const;
  // The same slices of the gradients step() reads, after finalize_backward() (and fp16's unscale):
  // their squares summed over the ranks are the whole model's squared gradient norm, padding and
  // HYBRID_SHARD's copies left out (FSDP1's clip_grad_norm_).
  std::vector<OwnedSlice> owned_grad_slices() const;
  // Every float32 gradient element step() reads on this rank (padding included, zeros): what
  // clipping multiplies.
  std::pair<float*, int64_t> step_grads();

  // LayerHooks
  void before_forward(int layer) override;
  void after_forward(int layer) override;
  void before_backward(int layer) override;
  void after_backward(int layer) override;
  // Activation checkpointing's recompute in backward: a unit not yet in its backward gathers its
  // parameters again for the layer (and reshards after it, as after a forward; FSDP2 skips its
  // pre-forward only once the unit's pre-backward ran); the next unit is not prefetched. A unit already
  // in its backward (a whole-model unit) recomputes with the parameters it holds.
  void before_recompute(int layer) override;
  void after_recompute(int layer) override;

 private:
  // The ranks a unit's flat parameter is split over and how its gradient is averaged: the FSDP group
  // (or HYBRID_SHARD's node group, with its replica group), or the experts' group.
  struct ShardGroup {
    Communicator* comm = nullptr;
    int world = 1, rank = 0;
    float pre = 1.0f, post = 1.0f;          // multiplied before the reduction, after it
    Communicator* replicate = nullptr;      // HYBRID_SHARD: the shard gradient's all-reduce across nodes
  };
  struct Unit {
    std::vector<int> params;       // indices into model.parameters(), model order
    int group = 0;                 // groups_: 0 the FSDP group's, 1 an MoE block's experts
    int experts = -1;              // a block unit: its experts' unit, gathered and reduced beside it (-1: none)
    std::vector<int64_t> offsets;  // each parameter's offset in the flat buffer
    int first_layer = 0, last_layer = 0;
    bool root = false;             // keeps its parameters from forward to backward (a GPT's root unit)
    FlatShard split;
    int64_t shard_offset = 0;      // where this unit's shard starts in the rank's shard buffers
    Tensor gathered;               // GatheredParameters (padded), while gathered; gather_dtype_
    Tensor low_shard;              // mixed precision: the shard cast to 16 bits, while its all-gather runs
    WorkPtr gathering;             // its all-gather, until waited
    Tensor full_grad;              // Gradients (padded, the model's dtype), during its backward and reduction
    Tensor reduce_in;              // reduce_fp32: the 16-bit gradient widened to float32, until reduced
    Tensor reduce_out;             // 16-bit reduction: the reduced shard (chunk), until cast to float32
    WorkPtr reduce;                // its gradient's reduce-scatter (or all-reduce)
    WorkPtr replicate;             // HYBRID_SHARD: the shard gradient's all-reduce across nodes
    bool landed = false;           // its reduced gradient is in the shard; finalize_backward ends its backward
    FsdpState state = FsdpState::Idle;
    int32_t label = -1;            // "0.weight, 0.bias" in the recorder
    // FSDP2 (api 2): offsets are each parameter's place in the padded unsharded buffer (its dim-0
    // all-gather output), and the shard is the parameters' padded chunks one after another.
    std::vector<Dim0Shard> dim0;   // each parameter's split
    std::vector<int64_t> shard_at; // each parameter's chunk in the unit's shard
    Tensor ag_out;                 // the all-gather's rank-major output, until copied out (gather dtype)
    Tensor pf_shard;               // reshard_after_forward=N: this rank's 1/N of `gathered`, until its backward
  };
  bool sharded() const {
    return opt_.sharding == Sharding::FullShard || opt_.sharding == Sharding::ShardGradOp ||
           opt_.sharding == Sharding::Hybrid;
  }
  bool api2() const { return opt_.api == 2; }
  const ShardGroup& group_of(const Unit& u) const { return groups_[static_cast<size_t>(u.group)]; }
  // The units of the k-th primary unit after (k < 0: before) unit `ui`'s, its experts' unit included
  // (prefetch counts blocks, as torch's does modules); unshard() both.
  void unshard_next(int ui, int k);
  // A layer's unit and its experts' unit (--ep; -1 when there is none): every hook acts on both.
  std::array<int, 2> with_experts(int ui) const { return {ui, units_[static_cast<size_t>(ui)].experts}; }
  void begin_forward(int ui);  // forward or recompute: FORWARD, and the parameters gathered
  void end_forward(int ui);    // after it: resharded (unless the root, or SHARD_GRAD_OP) and IDLE
  bool reshard_after_forward() const {
    if (api2()) return opt_.reshard_after_forward != 0 && opt_.wrap_layers;
    return (opt_.sharding == Sharding::FullShard || opt_.sharding == Sharding::Hybrid) && opt_.wrap_layers;
  }
  // FSDP2's chunk_cat and its inverse: between the per-parameter padded buffer at `per_param` (the
  // unit's `offsets`) and G rank-major blocks at `blocks` (block j holds each parameter's j-th
  // 1/G, one after another); `only` >= 0 moves that block alone, `blocks` then holding just it.
  void chunk_copy(const Unit& u, void* per_param, void* blocks, int groups, int only, bool to_blocks, DType dt);
  Device& dev() const { return model_.device(); }  // where the shards, gathers and gradients live
  int unit_of_layer(int layer) const;
  // torch's verbs: unshard issues the all-gather (if not yet), wait_for_unshard binds the full
  // parameters, reshard frees them, post_backward reduces the gradient.
  void unshard(int unit);
  void wait_for_unshard(int unit);
  // post_forward: after a forward, FSDP2's reshard_after_forward=N keeps this rank's 1/N.
  void reshard(int unit, bool post_forward = false);
  void post_backward(int unit);
  void set_state(int unit, FsdpState to);
  void record(int unit, FsdpVerb verb, uint64_t seq = UINT64_MAX);
  // Points the unit's parameters (or, with grads, their gradients) into `base`, the unit's flat buffer
  // in the model's dtype; null unbinds them.
  void bind(Unit& u, void* base, bool grads);
  bool mixed() const { return model_.mixed(); }
  void make_groups();  // HYBRID_SHARD's node group and cross-node group
  void make_post_forward_group();  // FSDP2 reshard_after_forward=N's group of N ranks
  void shard_over_group();  // the shard group: a group of every rank on group_executor_, not the world itself
  std::vector<OwnedSlice> owned(bool grads) const;  // owned_slices of the parameters or the gradients
  // torch's _cast_grad_to_param_dtype onto an fp32 gradient: dst = src, or dst += src with `add`
  // (accumulation); src is in `dt`, 16 bits widened exactly.
  void land_f32(float* dst, const void* src, int64_t n, DType dt, bool add);
  // A sharded unit's gradient reduction waited for and landed in the gradient shard (post-divided,
  // cast to float32), its unsharded gradient and staging freed. post_backward does it for the units
  // reduced before (torch frees an unsharded gradient once its reduce-scatter has run, not at the end
  // of the backward), finalize_backward for the rest.
  void land_reduced(Unit& u);

  Model& model_;
  Communicator& comm_;
  RankContext* ctx_;
  FsdpOptions opt_;
  int world_, rank_;
  DType gather_dtype_ = DType::F32, reduce_dtype_ = DType::F32;
  // Where the flat parameters are split: the world, or HYBRID_SHARD's node group.
  std::shared_ptr<GroupExecutor> group_executor_;
  std::unique_ptr<Communicator> node_group_, replica_group_;
  // FSDP2 reshard_after_forward=N: the N consecutive ranks of this rank's shard group that hold a
  // unit's parameters between its forward and its backward; pf_size_ 0 when there is none.
  std::unique_ptr<Communicator> pf_group_;
  int pf_size_ = 0, pf_rank_ = 0;
  // Gradient averaging: multiplied before the reduction, after it (FSDP1's pre/post-divide; FSDP2's
  // ReduceOp.AVG for float32 and bfloat16, a pre-multiplied sum).
  float pre_scale_ = 1.0f, post_scale_ = 1.0f;
  Communicator* shard_comm_ = nullptr;
  int shard_world_ = 1, shard_rank_ = 0;
  std::vector<Unit> units_;
  std::vector<int> layer_unit_;   // per model layer: its unit, or -1 (ReLU); a block's, not its experts'
  std::vector<int> primary_;      // the units that are no block's experts, in order
  std::vector<int> primary_at_;   // per unit: its place in primary_ (experts: their block's)
  ShardGroup groups_[2];
  int64_t shard_numel_ = 0;
  int64_t backwards_ = 0;  // backwards finalized since zero_grad(): from 1 on, reductions add
  // float32: this rank's shards of every unit (sharded strategies); mixed NO_SHARD and ZeRO-1: the
  // master and gradient of the flat parameters [owned_begin_, owned_begin_ + numel) it steps.
  Tensor shard_params_, shard_grads_;
  int64_t owned_begin_ = 0;
  std::optional<Optimizer> optimizer_;  // over what this rank owns; built once the units are known
  FlatShard zero1_split_;         // ZeRO-1: the whole flat parameter vector's split
  // ZeRO-1 with --ep: each group's parameters (the FSDP group's dense ones, the experts' over their
  // expert group) are split over that group apart, as Megatron-core's distributed optimizer (its ZeRO-1)
  // shards the expert-parallel buffers over the expert-data-parallel group (docs/course_sources.md
  // §6i): `segments` the flat runs the group's
  // parameters occupy, `split` their concatenation's split. `runs_` is what this rank steps, group 0's
  // first, each at `at` in the owned buffers (the optimizer's order).
  struct Zero1Group {
    std::vector<std::pair<int64_t, int64_t>> segments;  // [begin, end) in the flat parameters
    FlatShard split;
  };
  struct OwnedRun {
    int group = 0;
    int64_t begin = 0, length = 0, at = 0;
  };
  Zero1Group zero1_groups_[2];
  std::vector<OwnedRun> runs_;
  bool zero1_by_group() const { return opt_.sharding == Sharding::Zero1 && groups_[1].comm != nullptr; }
  void zero1_layout();      // zero1_groups_ and runs_
  void zero1_step_by_group();
  bool attached_ = true;
};

}  // namespace dtlab
