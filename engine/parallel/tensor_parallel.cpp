#include "engine/parallel/tensor_parallel.h"

#include "engine/core/check.h"
#include "engine/core/mesh.h"

namespace dtlab {

void GroupTensorParallelComm::all_reduce(float* buf, int64_t n, int layer) {
  last_layer_ = layer;
  group_.all_reduce(buf, n, DType::F32, ReduceOp::Sum)->wait();
}

void GroupTensorParallelComm::all_gather(float* out, const float* in, int64_t n, int layer) {
  last_layer_ = layer;
  group_.all_gather(out, in, n, DType::F32)->wait();
}

void GroupTensorParallelComm::reduce_scatter(float* out, const float* in, int64_t n, int layer) {
  last_layer_ = layer;
  group_.reduce_scatter(out, in, n, DType::F32, ReduceOp::Sum)->wait();
}

std::vector<float> gather_tensor_parallel_params(const Model& shard, Communicator& tp_group) {
  const TensorParallelSpec& tp = shard.tensor_parallel();
  if (tp.degree == 1) return shard.host_params();
  DTLAB_CHECK(tp_group.world_size() == tp.degree && tp_group.rank() == tp.rank,
              "gather_tensor_parallel_params() needs the shard's own TP group");
  DTLAB_CHECK(shard.owns_parameters(), "gather_tensor_parallel_params() while the parameters are sharded");
  const int64_t P = shard.num_params();
  Device& dev = shard.device();
  Tensor all({P * tp.degree}, MemCategory::CommBuffers, nullptr, DType::F32, dev);
  tp_group.all_gather(all.f32(), shard.params(), P, DType::F32)->wait();
  std::vector<float> host(static_cast<size_t>(P * tp.degree));
  dev.download(host.data(), all.f32(), all.nbytes());

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

TpCollective tp_op(CollectiveOp op, int l, bool backward, int64_t count, int degree, const char* what) {
  const int64_t payload = collective_traits(op).payload_count(count, degree);
  return TpCollective{op, 2 * l, backward, count, payload * static_cast<int64_t>(sizeof(float)), what};
}

}  // namespace

std::vector<TpCollective> tp_collectives(const ModelSpec& spec, int first, int end, const TensorParallelSpec& tp,
                                         int64_t B, bool input_grad, bool recompute, const LoraSpec& lora) {
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
      list.push_back(tp_op(CollectiveOp::AllReduce, l, again, B * width(l + 1), t,
                           again ? "recompute: g again" : "g: sum the row-parallel partial outputs"));
    if (sp && role(l) == TpRole::Column)
      list.push_back(tp_op(CollectiveOp::AllGather, l, again, local * width(l), t,
                           again ? "recompute: f again" : "f: gather the rows before the column-parallel Linear"));
    if (sp && role(l) == TpRole::Row)
      list.push_back(tp_op(CollectiveOp::ReduceScatter, l, again, local * width(l + 1), t,
                           again ? "recompute: g again" : "g: sum the partial outputs, keep this rank's rows"));
  };
  for (int l = first; l < end; l++) forward(l, false);
  if (sp) list.push_back(tp_op(CollectiveOp::AllGather, end - 1, false, local * width(end), t, "gather every rank's rows of the logits"));
  for (int l = end - 1; l >= first; l--) {
    if (recompute) forward(l, true);
    const bool dinp = l > first || input_grad;
    if (role(l) == TpRole::Column && dinp)
      list.push_back(sp ? tp_op(CollectiveOp::ReduceScatter, l, true, local * width(l), t, "f backward: sum the input gradient, keep this rank's rows")
                        : tp_op(CollectiveOp::AllReduce, l, true, B * width(l), t, "f backward: sum the input gradient's partial sums"));
    if (lora.adapts(2 * l) && role(l) == TpRole::Column)
      list.push_back(tp_op(CollectiveOp::AllReduce, l, true, lora.rank * width(l), t, "sum lora_A's gradient (whole on every rank)"));
    if (lora.adapts(2 * l) && role(l) == TpRole::Row)
      list.push_back(tp_op(CollectiveOp::AllReduce, l, true, width(l + 1) * lora.rank, t, "sum lora_B's gradient (whole on every rank)"));
    if (!sp) continue;
    if (role(l) == TpRole::Row) {
      list.push_back(tp_op(CollectiveOp::AllGather, l, true, local * width(l + 1), t, "g backward: gather the output gradient's rows"));
      list.push_back(tp_op(CollectiveOp::AllReduce, l, true, width(l + 1), t, "sum the bias gradient over the rows"));
    }
    if (role(l) == TpRole::Replicated)
      list.push_back(tp_op(CollectiveOp::AllReduce, l, true, width(l + 1) * (width(l) + 1), t, "sum the replicated Linear's gradients over the rows"));
  }
  return list;
}

int64_t tp_collective_bytes(const std::vector<TpCollective>& list) {
  int64_t bytes = 0;
  for (const TpCollective& c : list) bytes += c.bytes;
  return bytes;
}

}  // namespace dtlab
