#include "engine/parallel/tensor_parallel.h"

#include <algorithm>

#include "engine/core/check.h"
#include "engine/core/mesh.h"

namespace dtlab {

void GroupTensorParallelComm::all_reduce(void* buf, int64_t n, DType dtype, int layer) {
  last_layer_ = layer;
  group_.all_reduce(buf, n, dtype, ReduceOp::Sum)->wait();
}

void GroupTensorParallelComm::all_gather(void* out, const void* in, int64_t n, DType dtype, int layer) {
  last_layer_ = layer;
  group_.all_gather(out, in, n, dtype)->wait();
}

void GroupTensorParallelComm::reduce_scatter(void* out, const void* in, int64_t n, DType dtype, int layer) {
  last_layer_ = layer;
  group_.reduce_scatter(out, in, n, dtype, ReduceOp::Sum)->wait();
}

namespace {

// The full parameters' length, and TP rank r's shard values (`local`, its flat buffer) placed there:
// the inverse of shard_full_params.
int64_t full_length(const Model& shard) {
  int64_t total = 0;
  for (const TpPiece& p : tp_pieces(shard, 0)) total = std::max(total, p.full_offset + p.rows * p.cols);
  return total;
}

void place_shard(const Model& shard, int r, const float* local, float* full) {
  for (const TpPiece& p : tp_pieces(shard, r)) {
    const float* src = local + p.local_offset;
    float* dst = full + p.full_offset;
    for (int64_t row = p.row_begin; row < p.row_end; row++)
      for (int64_t c = p.col_begin; c < p.col_end; c++) dst[row * p.cols + c] = *src++;
  }
}

}  // namespace

std::vector<float> gather_tensor_parallel_params(const Model& shard, Communicator& tp_group) {
  const TensorParallelSpec& tp = shard.tensor_parallel();
  if (tp.degree == 1) return shard.host_params();
  DTLAB_CHECK(tp_group.world_size() == tp.degree && tp_group.rank() == tp.rank,
              "gather_tensor_parallel_params() needs the shard's own TP group");
  DTLAB_CHECK(shard.owns_parameters(), "gather_tensor_parallel_params() while the parameters are sharded");
  const int64_t P = shard.num_params();
  Device& dev = shard.device();
  // A mixed-precision shard gathers its 16-bit parameters (the model's own values), widened here.
  const DType dtype = shard.param_dtype();
  Tensor all({P * tp.degree}, MemCategory::CommBuffers, nullptr, dtype, dev);
  const void* mine = shard.mixed() ? static_cast<const void*>(shard.params16()) : static_cast<const void*>(shard.params());
  tp_group.all_gather(all.raw(), mine, P, dtype)->wait();
  std::vector<float> host(static_cast<size_t>(P * tp.degree));
  if (shard.mixed()) {
    std::vector<uint16_t> bits(host.size());
    dev.download(bits.data(), all.raw(), all.nbytes());
    half_to_floats(host.data(), bits.data(), P * tp.degree, shard.half_format());
  } else {
    dev.download(host.data(), all.raw(), all.nbytes());
  }

  std::vector<float> full(static_cast<size_t>(full_length(shard)));
  for (int r = 0; r < tp.degree; r++) place_shard(shard, r, host.data() + r * P, full.data());
  return full;
}

std::vector<float> assemble_tensor_parallel_params(const std::vector<const Model*>& shards) {
  DTLAB_CHECK(!shards.empty() && static_cast<int>(shards.size()) == shards.front()->tensor_parallel().degree,
              "assemble_tensor_parallel_params() takes every shard of one TP group");
  if (shards.size() == 1) return shards.front()->host_params();
  std::vector<float> full(static_cast<size_t>(full_length(*shards.front())));
  for (size_t r = 0; r < shards.size(); r++) {
    DTLAB_CHECK(shards[r]->owns_parameters() && !shards[r]->mixed(), "a shard to assemble holds its float32 parameters");
    place_shard(*shards[r], static_cast<int>(r), shards[r]->host_params().data(), full.data());
  }
  return full;
}

namespace {

TpCollective tp_op(CollectiveOp op, int l, bool backward, int64_t count, int degree, DType dtype, const char* what) {
  const int64_t payload = collective_traits(op).payload_count(count, degree);
  return TpCollective{op, 2 * l, backward, count, payload * dtype_size(dtype), what};
}

}  // namespace

std::vector<TpCollective> tp_collectives(const ModelSpec& spec, int first, int end, const TensorParallelSpec& tp,
                                         int64_t B, bool input_grad, bool recompute, const LoraSpec& lora, DType dtype) {
  std::vector<TpCollective> list;
  const int t = tp.degree;
  if (t <= 1) return list;
  const std::vector<TpRole> roles = tp_roles(first, end, t);
  const auto role = [&](int l) { return roles[static_cast<size_t>(l - first)]; };
  const auto width = [&](int l) { return spec.dims[static_cast<size_t>(l)]; };
  const bool sp = tp.sequence_parallel;
  const int64_t local = (B + t - 1) / t;  // Bl: this rank's rows under sequence parallelism
  // Linear l's forward collectives; `again`: its recompute in backward.
  const auto forward = [&](int l, bool again) {
    if (!sp && role(l) == TpRole::Row)
      list.push_back(tp_op(CollectiveOp::AllReduce, l, again, B * width(l + 1), t, dtype,
                           again ? "recompute: g again" : "g: sum the row-parallel partial outputs"));
    if (sp && role(l) == TpRole::Column)
      list.push_back(tp_op(CollectiveOp::AllGather, l, again, local * width(l), t, dtype,
                           again ? "recompute: f again" : "f: gather the rows before the column-parallel Linear"));
    if (sp && role(l) == TpRole::Row)
      list.push_back(tp_op(CollectiveOp::ReduceScatter, l, again, local * width(l + 1), t, dtype,
                           again ? "recompute: g again" : "g: sum the partial outputs, keep this rank's rows"));
  };
  for (int l = first; l < end; l++) forward(l, false);
  if (sp) list.push_back(tp_op(CollectiveOp::AllGather, end - 1, false, local * width(end), t, dtype, "gather every rank's rows of the logits"));
  for (int l = end - 1; l >= first; l--) {
    if (recompute) forward(l, true);
    const bool dinp = l > first || input_grad;
    const bool adapted = lora.adapts(2 * l);
    const bool frozen = lora.rank > 0;  // LoRA freezes every base Linear: no base gradient to sum
    if (sp && role(l) == TpRole::Row)
      list.push_back(tp_op(CollectiveOp::AllGather, l, true, local * width(l + 1), t, dtype, "g backward: gather the output gradient's rows"));
    if (role(l) == TpRole::Column && dinp)
      list.push_back(sp ? tp_op(CollectiveOp::ReduceScatter, l, true, local * width(l), t, dtype, "f backward: sum the input gradient, keep this rank's rows")
                        : tp_op(CollectiveOp::AllReduce, l, true, B * width(l), t, dtype, "f backward: sum the input gradient's partial sums"));
    if (adapted && role(l) == TpRole::Column)
      list.push_back(tp_op(CollectiveOp::AllReduce, l, true, lora.rank * width(l), t, dtype, "sum lora_A's gradient (whole on every rank)"));
    if (adapted && role(l) == TpRole::Row)
      list.push_back(tp_op(CollectiveOp::AllReduce, l, true, width(l + 1) * lora.rank, t, dtype, "sum lora_B's gradient (whole on every rank)"));
    if (adapted && sp && role(l) == TpRole::Replicated)
      list.push_back(tp_op(CollectiveOp::AllReduce, l, true, lora.rank * (width(l + 1) + width(l)), t, dtype,
                           "sum lora_B's and lora_A's gradients over the rows"));
    if (!sp || frozen) continue;
    if (role(l) == TpRole::Row)
      list.push_back(tp_op(CollectiveOp::AllReduce, l, true, width(l + 1), t, dtype, "sum the bias gradient over the rows"));
    if (role(l) == TpRole::Replicated)
      list.push_back(tp_op(CollectiveOp::AllReduce, l, true, width(l + 1) * (width(l) + 1), t, dtype, "sum the replicated Linear's gradients over the rows"));
  }
  return list;
}

std::vector<TpCollective> gpt_tp_collectives(const GptSpec& g, GptRange r, const TensorParallelSpec& tp, int64_t B, bool recompute) {
  std::vector<TpCollective> list;
  const int t = tp.degree;
  if (t <= 1) return list;
  const bool sp = tp.sequence_parallel;
  const int64_t C = g.embd, N = B * g.ctx, Nl = N / t;
  const int L = static_cast<int>(g.layers);
  auto add = [&](CollectiveOp op, int layer, bool backward, int64_t count, const char* what) {
    const int64_t payload = collective_traits(op).payload_count(count, t);
    list.push_back(TpCollective{op, layer, backward, count, payload * 4, what});
  };
  auto block_forward = [&](int layer, bool again) {
    if (!sp) {
      add(CollectiveOp::AllReduce, layer, again, N * C, again ? "recompute: attn g again" : "g: sum attn.c_proj's partial outputs");
      add(CollectiveOp::AllReduce, layer, again, N * C, again ? "recompute: mlp g again" : "g: sum mlp.c_proj's partial outputs");
      return;
    }
    add(CollectiveOp::AllGather, layer, again, Nl * C, again ? "recompute: f again" : "f: gather ln_1's positions for c_attn");
    add(CollectiveOp::ReduceScatter, layer, again, Nl * C, again ? "recompute: g again" : "g: sum attn.c_proj's outputs, keep this rank's positions");
    if (g.moe.in_block(layer - 1)) {  // the router and the experts run on this rank's positions, whole
      add(CollectiveOp::AllReduce, layer, again, 2 * g.moe.experts,
          again ? "recompute: the router's counts again" : "sum the router's token counts and probabilities (the aux loss's)");
      return;
    }
    add(CollectiveOp::AllGather, layer, again, Nl * C, again ? "recompute: f again" : "f: gather ln_2's positions for c_fc");
    add(CollectiveOp::ReduceScatter, layer, again, Nl * C, again ? "recompute: g again" : "g: sum mlp.c_proj's outputs, keep this rank's positions");
  };
  for (int l = r.first_block(); l < r.end_block(g); l++) block_forward(1 + l, false);
  if (r.heads(g) && sp) add(CollectiveOp::AllGather, L + 1, false, Nl * C, "gather ln_f's positions for the head");
  if (r.heads(g) && sp) {
    if (!r.embeds()) add(CollectiveOp::AllReduce, L + 1, true, g.vocab * C, "sum lm_head's gradient over the positions");
    add(CollectiveOp::AllReduce, L + 1, true, 2 * C, "sum ln_f's gradients over the positions");
  }
  for (int l = r.end_block(g) - 1; l >= r.first_block(); l--) {
    const int layer = 1 + l;
    if (recompute) block_forward(layer, true);
    if (!sp) {
      add(CollectiveOp::AllReduce, layer, true, N * C, "f backward: sum c_fc's input gradient");
      add(CollectiveOp::AllReduce, layer, true, N * C, "f backward: sum c_attn's input gradient");
      continue;
    }
    if (g.moe.in_block(l)) {
      for (int64_t e = g.moe.local_experts() - 1; e >= 0 && g.moe.ep == 1; e--)  // (under EP: the trainer's, over their holders)
        add(CollectiveOp::AllReduce, layer, true, 8 * C * C + 5 * C, "sum an expert's gradients over the positions");
      add(CollectiveOp::AllReduce, layer, true, g.moe.experts * C, "sum the router's gradient over the positions");
      add(CollectiveOp::AllReduce, layer, true, 2 * C, "sum ln_2's gradients over the positions");
    } else {
      add(CollectiveOp::AllGather, layer, true, Nl * C, "g backward: gather mlp.c_proj's output gradient");
      add(CollectiveOp::AllReduce, layer, true, C, "sum mlp.c_proj.bias' gradient over the positions");
      add(CollectiveOp::AllGather, layer, true, Nl * C, "gather ln_2's output again for c_fc's weight gradient");
      add(CollectiveOp::ReduceScatter, layer, true, Nl * C, "f backward: sum c_fc's input gradient, keep this rank's positions");
      add(CollectiveOp::AllReduce, layer, true, 2 * C, "sum ln_2's gradients over the positions");
    }
    add(CollectiveOp::AllGather, layer, true, Nl * C, "g backward: gather attn.c_proj's output gradient");
    add(CollectiveOp::AllReduce, layer, true, C, "sum attn.c_proj.bias' gradient over the positions");
    add(CollectiveOp::AllGather, layer, true, Nl * C, "gather ln_1's output again for c_attn's weight gradient");
    add(CollectiveOp::ReduceScatter, layer, true, Nl * C, "f backward: sum c_attn's input gradient, keep this rank's positions");
    add(CollectiveOp::AllReduce, layer, true, 2 * C, "sum ln_1's gradients over the positions");
  }
  if (r.embeds() && sp) {
    add(CollectiveOp::AllReduce, 0, true, g.ctx * C, "sum wpe's gradient over the positions");
    add(CollectiveOp::AllReduce, 0, true, g.vocab * C, "sum wte's gradient (the head's and the embedding's) over the positions");
  }
  return list;
}

int64_t tp_collective_bytes(const std::vector<TpCollective>& list) {
  int64_t bytes = 0;
  for (const TpCollective& c : list) bytes += c.bytes;
  return bytes;
}

}  // namespace dtlab
