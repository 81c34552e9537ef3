// Expert parallelism (--ep; Megatron-core's MoE with expert_model_parallel_size, docs/course_sources.md
// §6i): the MoE blocks' experts split over the ranks of an EP group, the rest of the model replicated.
// Groups follow Megatron's order with tp = cp = 1: EP groups are runs of `ep` consecutive data-parallel
// ranks; the expert-data-parallel group of a rank is every rank holding the same experts (one per EP
// group). An expert's gradient is already the sum over its EP group's tokens (the all-to-alls brought
// them); scaled by 1 / (data-parallel world) and summed over the expert-data-parallel group it is the
// same average DDP gives every replicated parameter (Megatron's expert_gradient_scaling_factor).
#pragma once
#include <utility>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/core/model.h"

namespace dtlab {

// The GPT's dispatch and combine over an EP process group.
class GroupExpertParallelComm : public ExpertParallelComm {
 public:
  explicit GroupExpertParallelComm(Communicator& group) : group_(group) {}
  void all_to_all(void* out, const void* in, int64_t count, DType dtype, int layer) override;
  void all_to_all_v(void* out, const std::vector<int64_t>& recv_counts, const void* in, const std::vector<int64_t>& send_counts,
                    DType dtype, int layer) override;
  Communicator& group() const { return group_; }

 private:
  Communicator& group_;
};

// Group ranks of data-parallel rank `rank`'s EP group (ep consecutive ranks) and expert-data-parallel
// group (rank % ep, rank % ep + ep, ...), of a world of `world` data-parallel ranks.
std::vector<int> ep_group_ranks(int rank, int ep);
std::vector<int> expert_dp_group_ranks(int rank, int ep, int world);

// Indices into model.parameters() of the MoE blocks' experts (empty without MoE): the parameters DDP
// leaves out of its buckets (torch's _ddp_params_and_buffers_to_ignore), reduced by
// reduce_expert_gradients instead.
std::vector<int> expert_parameters(const Model& model);

// The ranges [offset, end) of the flat gradients that hold the experts (experts true) or every other
// parameter, adjacent parameters merged: what one collective each reduces.
std::vector<std::pair<int64_t, int64_t>> parameter_runs(const Model& model, bool experts);

// After backward: each expert gradient multiplied by 1 / world (the data-parallel world) and summed
// over `expert_dp` (null: a group of one, the scaling alone); one all-reduce per run of expert
// parameters that lie side by side in the flat gradients.
void reduce_expert_gradients(Model& model, Communicator* expert_dp, int world);

// Collective over the EP group (every member calls it): the model's (or pipeline stage's) parameters
// with every expert, float32 on the host, in the layout of the spec's whole() (GptSpec::whole, the
// same GptRange and TP degree): the experts from the members that hold them, the rest the caller's
// own (a TP shard: the members may be different TP ranks, whose dense shards differ).
std::vector<float> gather_expert_parallel_params(const Model& model, Communicator& ep_group, Device& dev);

// Under --tp as well: `values` (gather_expert_parallel_params' on each rank of `tp_group`) put together
// over the TP group (every member calls it), the whole model (or stage) on every member, in the
// layout gather_tensor_parallel_params gives a model without --ep.
std::vector<float> gather_expert_tensor_parallel_params(const Model& model, const std::vector<float>& values, Communicator& tp_group);

}  // namespace dtlab
