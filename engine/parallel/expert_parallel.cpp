#include "engine/parallel/expert_parallel.h"

#include <algorithm>
#include <utility>

#include "engine/core/check.h"
#include "engine/core/device.h"
#include "engine/core/gpt.h"
#include "engine/parallel/tensor_parallel.h"

namespace dtlab {

void GroupExpertParallelComm::all_to_all(void* out, const void* in, int64_t count, DType dtype, int) {
  group_.all_to_all(out, in, count, dtype)->wait();
}

void GroupExpertParallelComm::all_to_all_v(void* out, const std::vector<int64_t>& recv_counts, const void* in,
                                           const std::vector<int64_t>& send_counts, DType dtype, int) {
  group_.all_to_all_v(out, recv_counts, in, send_counts, dtype)->wait();
}

std::vector<int> ep_group_ranks(int rank, int ep) {
  std::vector<int> r;
  for (int i = 0; i < ep; i++) r.push_back(rank / ep * ep + i);
  return r;
}

std::vector<int> expert_dp_group_ranks(int rank, int ep, int world) {
  std::vector<int> r;
  for (int i = rank % ep; i < world; i += ep) r.push_back(i);
  return r;
}

std::vector<int> expert_parameters(const Model& model) {
  std::vector<int> ids;
  const auto& ps = model.parameters();
  for (int i = 0; i < static_cast<int>(ps.size()); i++)
    if (ps[static_cast<size_t>(i)].name.find(".mlp.experts.") != std::string::npos) ids.push_back(i);
  return ids;
}

std::vector<std::pair<int64_t, int64_t>> parameter_runs(const Model& model, bool experts) {
  std::vector<char> expert(model.parameters().size(), 0);
  for (int i : expert_parameters(model)) expert[static_cast<size_t>(i)] = 1;
  std::vector<const Parameter*> ps;
  for (size_t k = 0; k < model.parameters().size(); k++)
    if (static_cast<bool>(expert[k]) == experts) ps.push_back(&model.parameters()[k]);
  std::sort(ps.begin(), ps.end(), [](const Parameter* a, const Parameter* b) { return a->offset < b->offset; });
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (const Parameter* p : ps) {
    if (!runs.empty() && runs.back().second == p->offset) runs.back().second += p->numel;
    else runs.push_back({p->offset, p->offset + p->numel});
  }
  return runs;
}

void reduce_expert_gradients(Model& model, Communicator* expert_dp, int world) {
  const std::vector<std::pair<int64_t, int64_t>> runs = parameter_runs(model, true);
  Device& dev = model.device();
  const float scale = 1.0f / static_cast<float>(world);
  for (const auto& [begin, end] : runs) {
    const int64_t n = end - begin;
    if (model.mixed()) {  // divided in float, rounded once, then summed in 16 bits (as DDP's 16-bit buckets)
      uint16_t* g = model.grads16() + begin;
      Tensor wide({n}, MemCategory::Other, nullptr, DType::F32, dev);
      dev.widen_half(wide.f32(), g, n, model.half_format());
      dev.scale(wide.f32(), n, scale);
      dev.narrow_half(g, wide.f32(), n, model.half_format());
      if (expert_dp) expert_dp->all_reduce(g, n, model.param_dtype(), ReduceOp::Sum)->wait();
    } else {
      float* g = model.grads() + begin;
      dev.scale(g, n, scale);
      if (expert_dp) expert_dp->all_reduce(g, n, DType::F32, ReduceOp::Sum)->wait();
    }
  }
}

std::vector<float> gather_expert_parallel_params(const Model& model, Communicator& ep_group, Device& dev) {
  const GptSpec& g = model.spec().gpt;
  const GptRange range = model.gpt_range();
  const int t = model.tensor_parallel().degree;
  const std::vector<float> mine = model.host_params();  // (16 bits: widened, exactly)
  const int64_t n = static_cast<int64_t>(mine.size());   // the same on every member: the same shapes
  const int ep = ep_group.world_size();
  Tensor in({n}, MemCategory::Other, nullptr, DType::F32, dev), out({n * ep}, MemCategory::Other, nullptr, DType::F32, dev);
  dev.upload(in.raw(), mine.data(), n * static_cast<int64_t>(sizeof(float)));
  ep_group.all_gather(out.raw(), in.raw(), n, DType::F32)->wait();
  std::vector<float> all(static_cast<size_t>(n * ep));
  dev.download(all.data(), out.raw(), n * ep * static_cast<int64_t>(sizeof(float)));
  const std::vector<Parameter> to = gpt_stage_parameters(g.whole(), range, t);
  int64_t total = 0;
  for (const Parameter& p : to) total = std::max(total, p.offset + p.numel);
  std::vector<float> values(static_cast<size_t>(total));
  auto place = [&](const Parameter& p, const float* from) {  // by name into the whole layout
    const auto q = std::find_if(to.begin(), to.end(), [&](const Parameter& w) { return w.name == p.name; });
    DTLAB_CHECK(q != to.end() && q->numel == p.numel, "an expert-parallel rank's parameter is not the whole model's");
    std::copy_n(from + p.offset, p.numel, values.begin() + q->offset);
  };
  const auto is_expert = [](const Parameter& p) { return p.name.find(".mlp.experts.") != std::string::npos; };
  for (const Parameter& p : gpt_stage_parameters(g, range, t))
    if (!is_expert(p)) place(p, mine.data());
  for (int r = 0; r < ep; r++) {  // member r's experts
    GptSpec theirs = g;
    theirs.moe.ep_rank = r;
    for (const Parameter& p : gpt_stage_parameters(theirs, range, t))
      if (is_expert(p)) place(p, all.data() + r * n);
  }
  return values;
}

std::vector<float> gather_expert_tensor_parallel_params(const Model& model, const std::vector<float>& values, Communicator& tp_group) {
  // A shard of the whole() spec holding `values` (float32: a 16-bit model's were widened exactly), which
  // the TP gather reads as any shard's parameters.
  const GptRange range = model.gpt_range();
  Model shard(ModelSpec{{}, model.spec().gpt.whole()}, nullptr, 0, range.first, range.end, model.device(), model.tensor_parallel());
  DTLAB_CHECK(static_cast<int64_t>(values.size()) == shard.num_params(), "gather_expert_tensor_parallel_params() takes gather_expert_parallel_params' values");
  shard.upload_params(values.data());
  return gather_tensor_parallel_params(shard, tp_group);
}

}  // namespace dtlab
