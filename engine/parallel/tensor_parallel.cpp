#include "engine/parallel/tensor_parallel.h"

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

  int64_t total = 0;
  for (const TpPiece& p : tp_pieces(shard, 0)) total += p.rows * p.cols;
  std::vector<float> full(static_cast<size_t>(total));
  for (int r = 0; r < tp.degree; r++) {
    const float* local = host.data() + r * P;
    float* dst = full.data();  // the inverse of shard_full_params' walk, for TP rank r's pieces
    for (const TpPiece& p : tp_pieces(shard, r)) {
      for (int64_t row = p.row_begin; row < p.row_end; row++)
        for (int64_t c = p.col_begin; c < p.col_end; c++) dst[row * p.cols + c] = *local++;
      dst += p.rows * p.cols;
    }
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

int64_t tp_collective_bytes(const std::vector<TpCollective>& list) {
  int64_t bytes = 0;
  for (const TpCollective& c : list) bytes += c.bytes;
  return bytes;
}

}  // namespace dtlab
