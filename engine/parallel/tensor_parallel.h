// Megatron tensor parallelism over a process group: the TP group's collectives as the model's layers
// call them (engine/core/model.h runs f and g inside its layers), the full parameters gathered back
// from the shards (checkpoints, parity checks), and the exact list of collectives one forward and
// backward issues, with their bytes, for the planner, the lessons and the tests.
// Facts and formulas: docs/course_sources.md §6c (Shoeybi et al. 2019; Korthikanti et al. 2022).
#pragma once
#include <cstdint>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/core/gpt_spec.h"
#include "engine/core/model.h"

namespace dtlab {

// The TP group's collectives on a Communicator whose world is the TP group (a world of its own, or a
// process group from new_group): each call issues the collective (sum) and waits for it.
class GroupTensorParallelComm : public TensorParallelComm {
 public:
  explicit GroupTensorParallelComm(Communicator& group) : group_(group) {}
  using TensorParallelComm::all_gather;
  using TensorParallelComm::all_reduce;
  using TensorParallelComm::reduce_scatter;
  void all_reduce(void* buf, int64_t n, DType dtype, int layer) override;
  void all_gather(void* out, const void* in, int64_t n, DType dtype, int layer) override;
  void reduce_scatter(void* out, const void* in, int64_t n, DType dtype, int layer) override;
  Communicator& group() const { return group_; }
  int last_layer() const { return last_layer_; }  // the Sequential index of the latest caller (-1: none)

 private:
  Communicator& group_;
  int last_layer_ = -1;
};

// Collective over the TP group (every TP rank calls it): the FULL parameters of the shard's stage, in
// the full model's flat order (what torch_init_values lays out and shard_full_params cuts), on the
// host, on every TP rank; under LoRA the full adapters, in the one-rank LoRA model's parameters() order
// (tp_pieces says where each shard's piece goes). Degree 1: the model's own values. The shard must own
// its parameters.
std::vector<float> gather_tensor_parallel_params(const Model& shard, Communicator& tp_group);
// The same full parameters put together on the host from every shard of one TP group, in TP rank
// order (threads of one process: no collective). Each shard must own its parameters, in float32.
std::vector<float> assemble_tensor_parallel_params(const std::vector<const Model*>& shards);

// One collective a tensor-parallel layer issues per forward and backward, as the model issues it.
struct TpCollective {
  CollectiveOp op = CollectiveOp::AllReduce;
  int layer = 0;          // Sequential index of the Linear that issues it
  bool backward = false;  // issued during backward
  int64_t count = 0;      // what the layer passes: all-reduce's buffer, all-gather's input and
                          // reduce-scatter's output (this rank's part), in elements
  int64_t bytes = 0;      // the payload events record (nccl-tests' S): all-reduce count x element size,
                          // all-gather and reduce-scatter count x degree x element size
  const char* what = "";  // "g: sum the row-parallel partial outputs", ...
};

// Every TP collective of one forward and one backward of Linear layers [first, end) of `spec` on a
// batch of B rows, in the order each TP rank issues them (forward in layer order, then backward in
// reverse). `input_grad`: the stage's first layer computes its input gradient (a pipeline stage after
// the first); Model::backward() never does, so the first column layer's f then moves nothing.
//   without sequence parallelism, per pair: forward 1 all-reduce of B x out (g), backward 1 all-reduce
//     of B x in (f, when the input gradient is needed);
//   sequence parallel (rows padded to Bp = degree x ceil(B / degree), Bl = Bp / degree per rank):
//     forward: all-gather Bl x in before each column layer, reduce-scatter Bl x out after each row
//     layer, and one all-gather of the logits (Bl x classes) at the end of forward(); backward:
//     per row layer an all-gather of Bl x out and an all-reduce of its bias gradient (out), per column
//     layer a reduce-scatter of Bl x in (when needed), per replicated Linear an all-reduce of its
//     weight and bias gradients.
// `recompute` (activation checkpointing): backward first runs each Linear's forward again, so its
// forward collective (g, or under sequence parallelism f's all-gather and g's reduce-scatter) is issued
// once more, just before that Linear's backward collectives (the logits' gather is not: it is outside
// the blocks).
// `lora` (rank > 0): each adapted split Linear all-reduces its whole adapter factor's gradient after
// its backward (Model::enable_lora): lora_A (r x in) of a column-parallel Linear, lora_B (out x r) of
// a row-parallel one; under sequence parallelism an adapted replicated Linear all-reduces lora_B's
// and lora_A's (it saw this rank's rows only), and the frozen base sums nothing. The forward adds
// nothing: the adapters ride f and g.
// `dtype`: what the layers compute in (--precision bf16/fp16 moves 2-byte elements, the same counts).
// Degree 1: none.
std::vector<TpCollective> tp_collectives(const ModelSpec& spec, int first, int end, const TensorParallelSpec& tp,
                                         int64_t B, bool input_grad, bool recompute = false,
                                         const LoraSpec& lora = LoraSpec{}, DType dtype = DType::F32);
int64_t tp_collective_bytes(const std::vector<TpCollective>& list);  // the sum of their bytes

// The same list for a GPT shard (engine/core/gpt.h's GptCore says why each is there) running layers
// `range` on B samples of T tokens, float32; `layer` is the GPT's layer number (1 + block, L + 1 the
// head, 0 the embeddings). With N = B T, Nl = N / t and C the width:
//   without sequence parallelism, per block: forward 2 all-reduces of N x C (g after attn.c_proj and
//     mlp.c_proj), backward 2 all-reduces of N x C (f's: c_fc's and c_attn's input gradients);
//   sequence parallel, per block: forward all-gather (Nl x C in) before c_attn and before c_fc,
//     reduce-scatter (Nl x C out) after each c_proj; backward per c_proj an all-gather of the output
//     gradient and an all-reduce of its bias' gradient (C), per column layer an all-gather of its
//     LayerNorm's output again and a reduce-scatter of its input gradient, per LayerNorm an all-reduce
//     of its weight and bias gradients (2C); the head gathers ln_f's output (Nl x C) in forward and
//     all-reduces ln_f's gradients (2C) and, on a last stage without the embeddings, lm_head's copy
//     (V x C) in backward; the embeddings all-reduce wpe's (T x C) and wte's (V x C) gradients.
// `recompute`: each block's forward collectives again just before its backward ones.
std::vector<TpCollective> gpt_tp_collectives(const GptSpec& spec, GptRange range, const TensorParallelSpec& tp, int64_t B,
                                             bool recompute = false);

}  // namespace dtlab
