// FullyShardedDataParallel, FSDP1-style (torch/distributed/fsdp, flat parameters), and ZeRO-1:
//   - units: one per Linear layer (auto-wrap) or the whole model; each unit's parameters are
//     flattened into one buffer of N elements, split in W chunks of ceil(N/W) with zero padding at
//     the end; rank r keeps chunk r (its shard) and the optimizer state for it;
//   - FULL_SHARD: all-gather a unit's parameters before its forward and free them after; all-gather
//     again before its backward; reduce-scatter its gradient after, then free;
//   - SHARD_GRAD_OP: the forward's gathered parameters stay until the unit's backward is done;
//   - NO_SHARD: parameters and optimizer state replicated, each unit's gradient all-reduced;
//   - ZeRO-1: parameters replicated, gradients all-reduced, optimizer state sharded: each rank
//     updates its slice of the flat parameters, then an all-gather brings everyone the result.
// Gradients are averaged the FSDP1 way: divided by f before the reduction and by W/f after (f
// starts at 1 and doubles while W % f == 0 and W / f > f).
// Prefetch (torch's options): forward_prefetch issues the next unit's all-gather before the current
// unit's forward; backward_prefetch Pre issues the next (in backward order) unit's all-gather before
// the current unit's gradient computation (most overlap, two gathered units live), Post after it.
// Not yet: HYBRID_SHARD (needs sub-communicators), sharded checkpoints.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/core/model.h"
#include "engine/core/optim.h"
#include "engine/core/tensor.h"
#include "engine/parallel/memory_plan.h"
#include "engine/trace/context.h"

namespace dtlab {

enum class BackwardPrefetch : uint8_t { None, Pre, Post };
BackwardPrefetch parse_backward_prefetch(std::string_view text);  // "none" | "pre" | "post"
const char* backward_prefetch_name(BackwardPrefetch p);           // torch: "BACKWARD_PRE", ...

struct FsdpOptions {
  Sharding sharding = Sharding::FullShard;
  bool wrap_layers = true;  // one unit per Linear (auto-wrap); false: the whole model is one unit
  BackwardPrefetch backward_prefetch = BackwardPrefetch::Pre;  // torch's default
  bool forward_prefetch = false;
};

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
  FullyShardedDataParallel(Model& model, Communicator& comm, RankContext* ctx, const FsdpOptions& opt,
                           const OptimizerConfig& optimizer);
  ~FullyShardedDataParallel() override;

  void zero_grad();
  // After Model::backward(): waits for the gradient reductions and applies the post-divide.
  void finalize_backward();
  // The optimizer step over what this rank owns (ZeRO-1 then all-gathers the parameters).
  void step();
  // Collective: gathers the full parameters back into the model's own buffers (for evaluation and
  // checkpoints) and detaches from the model.
  void materialize();

  int num_units() const { return static_cast<int>(units_.size()); }
  const FlatShard& unit_shard(int u) const { return units_[static_cast<size_t>(u)].split; }
  int64_t shard_numel() const { return shard_numel_; }

  // LayerHooks
  void before_forward(int layer) override;
  void after_forward(int layer) override;
  void before_backward(int layer) override;
  void after_backward(int layer) override;

 private:
  struct Unit {
    std::vector<int> params;       // indices into model.parameters(), model order
    std::vector<int64_t> offsets;  // each parameter's offset in the flat buffer
    int first_layer = 0, last_layer = 0;
    FlatShard split;
    int64_t shard_offset = 0;      // where this unit's shard starts in the rank's shard buffers
    Tensor gathered;               // GatheredParameters (padded), while gathered
    WorkPtr gathering;             // its all-gather, until waited
    Tensor full_grad;              // Gradients (padded), during its backward and reduction
    WorkPtr reduce;
  };
  bool sharded() const { return opt_.sharding == Sharding::FullShard || opt_.sharding == Sharding::ShardGradOp; }
  int unit_of_layer(int layer) const;
  void gather(Unit& u);        // issue (if not yet) and wait
  void issue_gather(Unit& u);  // allocate and issue the all-gather; gather() waits for it
  void prefetch(int unit);     // issue unit's all-gather early, if it is a unit and not gathered
  void bind_params(Unit& u, const float* base);
  void free_gathered(Unit& u);

  Model& model_;
  Communicator& comm_;
  RankContext* ctx_;
  FsdpOptions opt_;
  int world_, rank_;
  std::vector<Unit> units_;
  std::vector<int> layer_unit_;   // per model layer: its unit, or -1 (ReLU)
  int64_t shard_numel_ = 0;
  Tensor shard_params_, shard_grads_;  // this rank's shards of every unit (sharded strategies)
  std::optional<Optimizer> optimizer_;  // over what this rank owns; built once the units are known
  FlatShard zero1_split_;         // ZeRO-1: the whole flat parameter vector's split
  bool attached_ = true;
};

}  // namespace dtlab
