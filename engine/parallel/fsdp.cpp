#include "engine/parallel/fsdp.h"

#include <algorithm>

#include "engine/core/check.h"

namespace dtlab {

int64_t FlatShard::real(int rank) const {
  return std::clamp<int64_t>(numel - static_cast<int64_t>(rank) * chunk, 0, chunk);
}

FlatShard flat_shard(int64_t numel, int world) {
  DTLAB_CHECK(numel >= 0 && world >= 1, "flat_shard needs numel >= 0 and world >= 1");
  FlatShard s;
  s.numel = numel;
  s.world = world;
  s.chunk = (numel + world - 1) / world;
  s.padded = s.chunk * world;
  return s;
}

BackwardPrefetch parse_backward_prefetch(std::string_view t) {
  if (t == "none") return BackwardPrefetch::None;
  if (t == "pre") return BackwardPrefetch::Pre;
  if (t == "post") return BackwardPrefetch::Post;
  throw Error("--backward-prefetch " + std::string(t) + " is not an option; use none, pre (BACKWARD_PRE) or post (BACKWARD_POST)");
}

const char* backward_prefetch_name(BackwardPrefetch p) {
  switch (p) {
    case BackwardPrefetch::None: return "none";
    case BackwardPrefetch::Pre: return "BACKWARD_PRE";
    case BackwardPrefetch::Post: return "BACKWARD_POST";
  }
  return "?";
}

int fsdp_predivide_factor(int world) {
  int f = 1;
  while (world % f == 0 && world / f > f) f *= 2;
  return f;
}

namespace {

void scale(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(Model& model, Communicator& comm, RankContext* ctx,
                                                   const FsdpOptions& opt, const OptimizerConfig& optimizer)
    : model_(model),
      comm_(comm),
      ctx_(ctx),
      opt_(opt),
      world_(comm.world_size()),
      rank_(comm.rank()) {
  if (opt_.sharding == Sharding::Hybrid)
    throw Error("--sharding hybrid needs node-local process groups, which this version does not have yet; "
                "use full, grad-op, no-shard or zero1");
  MemoryTracker* mem = ctx_ ? ctx_->memory() : nullptr;
  // Every rank starts from rank 0's parameters (sync_module_states).
  comm_.broadcast(model_.params(), model_.num_params(), DType::F32, 0)->wait();
  const auto& ps = model_.parameters();
  layer_unit_.assign(static_cast<size_t>(model_.num_layers()), -1);
  if (opt_.wrap_layers) {
    for (int i = 0; i < model_.num_layers(); i++) {
      const Layer& L = model_.layer(i);
      if (L.kind != LayerKind::Linear) continue;
      Unit u;
      u.params = {L.weight, L.bias};
      u.first_layer = u.last_layer = i;
      layer_unit_[static_cast<size_t>(i)] = static_cast<int>(units_.size());
      units_.push_back(std::move(u));
    }
  } else {
    Unit u;
    for (int p = 0; p < static_cast<int>(ps.size()); p++) u.params.push_back(p);
    u.first_layer = 0;
    u.last_layer = model_.num_layers() - 1;
    for (int i = 0; i < model_.num_layers(); i++) layer_unit_[static_cast<size_t>(i)] = 0;
    units_.push_back(std::move(u));
  }
  // A unit's parameters are contiguous in the model's flat buffer, so its flat parameter is that range.
  for (Unit& u : units_) {
    const int64_t base = ps[static_cast<size_t>(u.params.front())].offset;
    int64_t n = 0;
    for (int p : u.params) {
      u.offsets.push_back(ps[static_cast<size_t>(p)].offset - base);
      n += ps[static_cast<size_t>(p)].numel;
    }
    u.split = flat_shard(n, world_);
    u.shard_offset = shard_numel_;
    shard_numel_ += u.split.chunk;
  }
  zero1_split_ = flat_shard(model_.num_params(), world_);
  // Sharded strategies step their shards (padding included: it stays zero); ZeRO-1 its slice of the
  // flat parameters; NO_SHARD everything.
  const int64_t owned = sharded() ? shard_numel_
                        : opt_.sharding == Sharding::Zero1 ? zero1_split_.real(rank_) : model_.num_params();
  optimizer_.emplace(optimizer, owned, mem);
  if (sharded()) {
    shard_params_ = Tensor({shard_numel_}, MemCategory::Parameters, mem);
    shard_grads_ = Tensor({shard_numel_}, MemCategory::Gradients, mem);
    shard_params_.zero();
    shard_grads_.zero();
    for (Unit& u : units_) {
      const float* flat = ps[static_cast<size_t>(u.params.front())].data;
      const int64_t real = u.split.real(rank_);
      if (real > 0)
        std::copy(flat + rank_ * u.split.chunk, flat + rank_ * u.split.chunk + real, shard_params_.f32() + u.shard_offset);
    }
    model_.release_parameter_storage();  // what FSDP saves: no rank holds the full model any more
  }
  model_.set_layer_hooks(this);
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  if (attached_) model_.set_layer_hooks(nullptr);
}

int FullyShardedDataParallel::unit_of_layer(int layer) const { return layer_unit_[static_cast<size_t>(layer)]; }

void FullyShardedDataParallel::bind_params(Unit& u, const float* base) {
  auto& ps = model_.parameters();
  for (size_t k = 0; k < u.params.size(); k++)
    ps[static_cast<size_t>(u.params[k])].data = base ? const_cast<float*>(base) + u.offsets[k] : nullptr;
}

void FullyShardedDataParallel::issue_gather(Unit& u) {
  if (!u.gathered.empty()) return;
  u.gathered = Tensor({u.split.padded}, MemCategory::GatheredParameters, ctx_ ? ctx_->memory() : nullptr);
  u.gathering = comm_.all_gather(u.gathered.f32(), shard_params_.f32() + u.shard_offset, u.split.chunk, DType::F32);
}

void FullyShardedDataParallel::gather(Unit& u) {
  issue_gather(u);
  if (u.gathering) {
    if (ctx_) ctx_->set_activity("FSDP: waiting for a unit's all-gather");
    u.gathering->wait();
    u.gathering.reset();
  }
  bind_params(u, u.gathered.f32());
}

void FullyShardedDataParallel::prefetch(int unit) {
  if (unit < 0 || unit >= static_cast<int>(units_.size())) return;
  issue_gather(units_[static_cast<size_t>(unit)]);
}

void FullyShardedDataParallel::free_gathered(Unit& u) {
  bind_params(u, nullptr);
  u.gathered = Tensor();
}

void FullyShardedDataParallel::before_forward(int layer) {
  const int ui = unit_of_layer(layer);
  if (ui < 0 || !sharded()) return;
  Unit& u = units_[static_cast<size_t>(ui)];
  if (layer != u.first_layer) return;
  gather(u);
  if (opt_.forward_prefetch) prefetch(ui + 1);  // the next unit's parameters arrive during this forward
}

void FullyShardedDataParallel::after_forward(int layer) {
  const int ui = unit_of_layer(layer);
  if (ui < 0 || !sharded()) return;
  Unit& u = units_[static_cast<size_t>(ui)];
  // FULL_SHARD reshards after forward; the root unit (the whole model) keeps its parameters for
  // the backward that follows at once, as torch's root FSDP instance does.
  if (layer == u.last_layer && opt_.sharding == Sharding::FullShard && opt_.wrap_layers) free_gathered(u);
}

void FullyShardedDataParallel::before_backward(int layer) {
  const int ui = unit_of_layer(layer);
  if (ui < 0 || !sharded()) return;
  Unit& u = units_[static_cast<size_t>(ui)];
  if (layer != u.last_layer) return;
  gather(u);  // FULL_SHARD gathers again; SHARD_GRAD_OP still holds the forward's copy
  // BACKWARD_PRE: the next unit's all-gather goes out before this unit's gradients are computed.
  if (opt_.backward_prefetch == BackwardPrefetch::Pre) prefetch(ui - 1);
  u.full_grad = Tensor({u.split.padded}, MemCategory::Gradients, ctx_ ? ctx_->memory() : nullptr);
  u.full_grad.zero();
  auto& ps = model_.parameters();
  for (size_t k = 0; k < u.params.size(); k++) ps[static_cast<size_t>(u.params[k])].grad = u.full_grad.f32() + u.offsets[k];
}

void FullyShardedDataParallel::after_backward(int layer) {
  const int ui = unit_of_layer(layer);
  if (ui < 0) return;
  Unit& u = units_[static_cast<size_t>(ui)];
  if (layer != u.first_layer) return;
  const float pre = 1.0f / static_cast<float>(fsdp_predivide_factor(world_));
  auto& ps = model_.parameters();
  // BACKWARD_POST: after this unit's gradients, before its reduce-scatter.
  if (sharded() && opt_.backward_prefetch == BackwardPrefetch::Post) prefetch(ui - 1);
  if (sharded()) {
    scale(u.full_grad.f32(), u.split.padded, pre);
    u.reduce = comm_.reduce_scatter(shard_grads_.f32() + u.shard_offset, u.full_grad.f32(), u.split.chunk,
                                    DType::F32, ReduceOp::Sum);
    for (int p : u.params) ps[static_cast<size_t>(p)].grad = nullptr;
    free_gathered(u);
  } else {
    float* g = ps[static_cast<size_t>(u.params.front())].grad;
    scale(g, u.split.numel, pre);
    u.reduce = comm_.all_reduce(g, u.split.numel, ReduceOp::Sum);
  }
}

void FullyShardedDataParallel::zero_grad() {
  if (sharded()) shard_grads_.zero();
  else model_.zero_grad();
}

void FullyShardedDataParallel::finalize_backward() {
  const int f = fsdp_predivide_factor(world_);
  const float post = static_cast<float>(f) / static_cast<float>(world_);
  for (Unit& u : units_) {
    if (!u.reduce) continue;  // a unit the forward skipped: its gradient stays zero
    u.reduce->wait();
    u.reduce.reset();
    if (sharded()) {
      scale(shard_grads_.f32() + u.shard_offset, u.split.chunk, post);
      u.full_grad = Tensor();
    } else {
      scale(model_.parameters()[static_cast<size_t>(u.params.front())].grad, u.split.numel, post);
    }
  }
}

void FullyShardedDataParallel::step() {
  switch (opt_.sharding) {
    case Sharding::NoShard: optimizer_->step(model_.params(), model_.grads()); return;
    case Sharding::Zero1: {
      // Update this rank's slice with its optimizer shard, then everyone gathers the slices.
      const int64_t c = zero1_split_.chunk, real = zero1_split_.real(rank_);
      if (real > 0) optimizer_->step(model_.params() + rank_ * c, model_.grads() + rank_ * c);
      Tensor mine({c}, MemCategory::CommBuffers, ctx_ ? ctx_->memory() : nullptr);
      mine.zero();
      if (real > 0) std::copy(model_.params() + rank_ * c, model_.params() + rank_ * c + real, mine.f32());
      Tensor all({zero1_split_.padded}, MemCategory::CommBuffers, ctx_ ? ctx_->memory() : nullptr);
      comm_.all_gather(all.f32(), mine.f32(), c, DType::F32)->wait();
      std::copy(all.f32(), all.f32() + model_.num_params(), model_.params());
      return;
    }
    default: optimizer_->step(shard_params_.f32(), shard_grads_.f32()); return;
  }
}

void FullyShardedDataParallel::materialize() {
  model_.set_layer_hooks(nullptr);
  attached_ = false;
  if (!sharded()) return;
  std::vector<float> full(static_cast<size_t>(model_.num_params()));
  int64_t base = 0;
  for (Unit& u : units_) {
    gather(u);
    std::copy(u.gathered.f32(), u.gathered.f32() + u.split.numel, full.begin() + base);
    base += u.split.numel;
    free_gathered(u);
  }
  shard_params_ = Tensor();
  shard_grads_ = Tensor();
  model_.restore_storage(full.data());
}

}  // namespace dtlab
