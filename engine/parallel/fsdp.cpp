#include "engine/parallel/fsdp.h"

#include <algorithm>
#include <cmath>

#include "engine/comm/ring_order.h"  // padded_chunk: the shard is one reduce-scatter block
#include "engine/core/check.h"
#include "engine/core/half.h"
#include "engine/parallel/expert_parallel.h"

namespace dtlab {

int64_t FlatShard::real(int rank) const {
  return std::clamp<int64_t>(numel - static_cast<int64_t>(rank) * chunk, 0, chunk);
}

FlatShard flat_shard(int64_t numel, int world) {
  DTLAB_CHECK(numel >= 0 && world >= 1, "flat_shard needs numel >= 0 and world >= 1");
  FlatShard s;
  s.numel = numel;
  s.world = world;
  s.chunk = padded_chunk(numel, world);
  s.padded = s.chunk * world;
  return s;
}

int64_t Dim0Shard::real_rows(int rank) const {
  return std::clamp<int64_t>(rows - static_cast<int64_t>(rank) * chunk_rows, 0, chunk_rows);
}

Dim0Shard dim0_shard(const Shape& shape, int world) {
  DTLAB_CHECK(!shape.empty() && world >= 1, "dim0_shard needs a shape and world >= 1");
  Dim0Shard d;
  d.rows = shape[0];
  d.cols = shape_numel(shape) / std::max<int64_t>(shape[0], 1);
  d.world = world;
  d.chunk_rows = padded_chunk(d.rows, world);  // torch.chunk's first chunk: every shard is padded to it
  return d;
}

std::string reshard_after_forward_text(int r) {
  return r == kReshardTrue ? "true" : r == 0 ? "false" : std::to_string(r);
}

int parse_reshard_after_forward(std::string_view t) {
  if (t == "true") return kReshardTrue;
  if (t == "false") return 0;
  int n = 0;
  for (char ch : t) {
    if (ch < '0' || ch > '9' || n > 100000) { n = -1; break; }
    n = n * 10 + (ch - '0');
  }
  if (t.empty() || n < 1)
    throw Error("--reshard-after-forward " + std::string(t) +
                " is not a choice; use true (free after forward), false (keep until backward) or N (keep a 1/N shard over N ranks)");
  return n;
}

FsdpLayoutBytes fsdp_layout_bytes(const std::vector<std::vector<Shape>>& units, int world) {
  FsdpLayoutBytes b;
  for (const auto& shapes : units) {
    int64_t numel = 0, shard2 = 0;
    for (const Shape& sh : shapes) {
      numel += shape_numel(sh);
      shard2 += dim0_shard(sh, world).shard_numel();
    }
    const FlatShard f = flat_shard(numel, world);
    b.real_elems += numel;
    b.fsdp1_shard_elems += f.chunk;
    b.fsdp1_gather_elems += f.padded;
    b.fsdp2_shard_elems += shard2;
    b.fsdp2_gather_elems += shard2 * world;
  }
  return b;
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

constexpr int64_t kF32 = static_cast<int64_t>(sizeof(float));

HalfFormat format_of_dtype(DType d) { return d == DType::F16 ? HalfFormat::FP16 : HalfFormat::BF16; }

// x *= factor in the gradient's dtype: a 16-bit value rounds once, as torch's div_ on a bf16/fp16
// tensor does (the factors are FSDP1's pre- and post-divide, so a power of two but for odd worlds).
// A 16-bit tensor is widened into float32 scratch (charged to the rank off the host, where it is
// device memory), scaled and rounded back.
void scale_in(void* x, int64_t n, DType dt, float factor, Device& dev, MemoryTracker* mem) {
  if (dt == DType::F32) return dev.scale(static_cast<float*>(x), n, factor);
  if (factor == 1.0f || n <= 0) return;
  const HalfFormat f = format_of_dtype(dt);
  uint16_t* h = static_cast<uint16_t*>(x);
  Tensor wide({n}, MemCategory::CommBuffers, dev.is_host() ? nullptr : mem, DType::F32, dev);
  dev.widen_half(wide.f32(), h, n, f);
  dev.scale(wide.f32(), n, factor);
  dev.narrow_half(h, wide.f32(), n, f);
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(Model& model, Communicator& comm, RankContext* ctx,
                                                   const FsdpOptions& opt, const OptimizerConfig& optimizer, bool reduce_fp32)
    : model_(model),
      comm_(comm),
      ctx_(ctx),
      opt_(opt),
      world_(comm.world_size()),
      rank_(comm.rank()),
      shard_comm_(&comm),
      shard_world_(comm.world_size()),
      shard_rank_(comm.rank()) {
  gather_dtype_ = model_.param_dtype();
  reduce_dtype_ = mixed() && !reduce_fp32 ? model_.param_dtype() : DType::F32;
  DTLAB_CHECK(opt_.api == 1 || (opt_.api == 2 && (opt_.sharding == Sharding::FullShard || opt_.sharding == Sharding::Hybrid)),
              "fully_shard (FSDP2) shards fully or as HSDP; the run's validation refuses the rest");
  if (opt_.sharding == Sharding::Hybrid) make_groups();
  if (api2()) make_post_forward_group();
  // Gradient averaging. FSDP1 divides by f before the reduction and by W / f after (f ~ sqrt W). FSDP2
  // (_get_gradient_divide_factors) reduces float32 and bfloat16 with ReduceOp.AVG, which NCCL runs on
  // floating types as a sum of inputs pre-multiplied by 1 / size (HSDP: 1 / K in the shard group, then
  // 1 / (W / K) across, here one multiply by 1 / W: the same numbers for power-of-two groups); float16
  // keeps FSDP1's split to avoid overflow (docs/course_sources.md §11b).
  if (api2() && reduce_dtype_ != DType::F16) {
    pre_scale_ = 1.0f / static_cast<float>(world_);
  } else {
    const int f = fsdp_predivide_factor(world_);
    pre_scale_ = 1.0f / static_cast<float>(f);
    post_scale_ = static_cast<float>(f) / static_cast<float>(world_);
  }
  // --ep: the experts' units over the expert-data-parallel group, averaged over the data-parallel world
  // (FSDP2's ReduceOp.AVG as a pre-multiply; FSDP1's pre- and post-divide of that world).
  const std::vector<int> expert_ids = opt_.expert_group && !model_.lora() ? expert_parameters(model_) : std::vector<int>();
  const bool experts = !expert_ids.empty();
  groups_[0] = {shard_comm_, shard_world_, shard_rank_, pre_scale_, post_scale_, replica_group_.get()};
  if (experts) {
    DTLAB_CHECK(opt_.wrap_layers && (opt_.sharding == Sharding::Hybrid) == (opt_.expert_replicate != nullptr),
                "FSDP gives experts a unit per block (HSDP: with a replica group); the run's validation refuses the rest");
    ShardGroup& e = groups_[1];
    e.comm = opt_.expert_group;
    e.world = opt_.expert_group->world_size();
    e.rank = opt_.expert_group->rank();
    e.replicate = opt_.expert_replicate;
    const int d = std::max(1, opt_.expert_divide);
    if (api2() && reduce_dtype_ != DType::F16) {
      e.pre = 1.0f / static_cast<float>(d);
    } else {
      const int f = fsdp_predivide_factor(d);
      e.pre = 1.0f / static_cast<float>(f);
      e.post = static_cast<float>(f) / static_cast<float>(d);
    }
  }
  MemoryTracker* mem = ctx_ ? ctx_->memory() : nullptr;
  // Every rank starts from rank 0's parameters (sync_module_states), in the dtype the model holds; under
  // --ep the experts from the first rank holding the same ones (each EP rank holds others).
  void* const own = mixed() ? static_cast<void*>(model_.params16()) : static_cast<void*>(model_.params());
  if (!experts) {
    comm_.broadcast(own, model_.num_params(), model_.param_dtype(), 0)->wait();
  } else {
    const int64_t elem = dtype_size(model_.param_dtype());
    for (const bool ex : {false, true})
      for (const auto& [a, b] : parameter_runs(model_, ex))
        (ex ? *opt_.expert_group : comm_).broadcast(static_cast<char*>(own) + a * elem, b - a, model_.param_dtype(), 0)->wait();
  }
  const auto& ps = model_.parameters();
  std::vector<char> is_expert(ps.size(), 0);
  for (int i : expert_ids) is_expert[static_cast<size_t>(i)] = 1;
  layer_unit_.assign(static_cast<size_t>(model_.hook_layers()), -1);
  if (opt_.wrap_layers) {
    // The model's auto-wrap units: one per Linear, or a GPT's root (embeddings, ln_f, the tied head)
    // and one per block; under --ep an MoE block's experts (its last parameters) follow it as a unit
    // of their own, as torchtitan wraps moe.experts before the block.
    for (Model::WrapUnit& w : model_.wrap_units()) {
      Unit u, ex;
      for (int p : w.params) (is_expert[static_cast<size_t>(p)] ? ex : u).params.push_back(p);
      u.first_layer = ex.first_layer = w.layers.front();
      u.last_layer = ex.last_layer = w.layers.back();
      u.root = w.root;
      for (int layer : w.layers) layer_unit_[static_cast<size_t>(layer)] = static_cast<int>(units_.size());
      if (!ex.params.empty()) {
        ex.group = 1;
        u.experts = static_cast<int>(units_.size()) + 1;
      }
      units_.push_back(std::move(u));
      if (!ex.params.empty()) units_.push_back(std::move(ex));
    }
  } else {
    Unit u;
    for (int p = 0; p < static_cast<int>(ps.size()); p++) u.params.push_back(p);
    u.first_layer = 0;
    u.last_layer = model_.hook_layers() - 1;
    for (int i = 0; i < model_.hook_layers(); i++) layer_unit_[static_cast<size_t>(i)] = 0;
    units_.push_back(std::move(u));
  }
  primary_at_.assign(units_.size(), 0);
  for (int i = 0; i < num_units(); i++) {
    const Unit& u = units_[static_cast<size_t>(i)];
    if (u.group != 0) {
      primary_at_[static_cast<size_t>(i)] = primary_at_[static_cast<size_t>(i - 1)];  // the block's, just before
      continue;
    }
    primary_at_[static_cast<size_t>(i)] = static_cast<int>(primary_.size());
    primary_.push_back(i);
  }
  // A unit's parameters are contiguous in the model's flat buffer, so its flat parameter is that range.
  for (Unit& u : units_) {
    const ShardGroup& g = group_of(u);
    const int64_t base = ps[static_cast<size_t>(u.params.front())].offset;
    int64_t n = 0;
    std::string names;
    for (int p : u.params) {
      u.offsets.push_back(ps[static_cast<size_t>(p)].offset - base);
      n += ps[static_cast<size_t>(p)].numel;
      names += (names.empty() ? "" : ", ") + ps[static_cast<size_t>(p)].name;
    }
    if (api2()) {
      // fully_shard: each parameter split on dim 0 on its own; the unit's shard is their padded chunks
      // in order, and its unsharded buffer their padded all-gather outputs in order.
      u.offsets.clear();
      int64_t at = 0, padded = 0;
      for (int p : u.params) {
        const Dim0Shard d = dim0_shard(ps[static_cast<size_t>(p)].shape, g.world);
        u.dim0.push_back(d);
        u.shard_at.push_back(at);
        u.offsets.push_back(padded);
        at += d.shard_numel();
        padded += d.padded_numel();
      }
      u.split.numel = n;
      u.split.world = g.world;
      u.split.chunk = at;
      u.split.padded = padded;
    } else {
      u.split = flat_shard(n, g.world);
    }
    u.shard_offset = shard_numel_;
    shard_numel_ += u.split.chunk;
    u.label = ctx_ && ctx_->recorder() ? ctx_->recorder()->intern(names) : -1;
  }
  zero1_split_ = flat_shard(model_.num_params(), world_);
  if (zero1_by_group()) zero1_layout();
  // Sharded strategies step their shards (padding included: it stays zero); ZeRO-1 its slice of the
  // flat parameters (under --ep its slice of each group's); NO_SHARD everything.
  int64_t owned = sharded() ? shard_numel_ : opt_.sharding == Sharding::Zero1 ? zero1_split_.real(rank_) : model_.num_params();
  if (zero1_by_group()) owned = runs_.empty() ? 0 : runs_.back().at + runs_.back().length;
  optimizer_.emplace(optimizer, owned, mem, dev());
  if (sharded()) {
    // Mixed precision: the fp32 shard is both FSDP's sharded parameter and the master copy the optimizer
    // steps; it is charged once, as master weights (the memory view sets those beside the optimizer's K = 12).
    shard_params_ = Tensor({shard_numel_}, mixed() ? MemCategory::MasterWeights : MemCategory::Parameters, mem, DType::F32, dev());
    shard_grads_ = Tensor({shard_numel_}, MemCategory::Gradients, mem, DType::F32, dev());
    shard_params_.zero();
    shard_grads_.zero();
    for (Unit& u : units_) {
      const int shard_rank = group_of(u).rank;
      if (api2()) {
        for (size_t k = 0; k < u.params.size(); k++) {
          const Dim0Shard& d = u.dim0[k];
          const int64_t real = d.real_rows(shard_rank) * d.cols;
          if (real <= 0) continue;
          const int64_t at = ps[static_cast<size_t>(u.params[k])].offset + shard_rank * d.shard_numel();
          float* shard = shard_params_.f32() + u.shard_offset + u.shard_at[k];
          if (mixed()) dev().widen_half(shard, model_.params16() + at, real, model_.half_format());
          else dev().copy(shard, model_.params() + at, real * kF32);
        }
        continue;
      }
      const int64_t at = ps[static_cast<size_t>(u.params.front())].offset + shard_rank * u.split.chunk;
      const int64_t real = u.split.real(shard_rank);
      float* shard = shard_params_.f32() + u.shard_offset;
      if (real <= 0) continue;
      // A mixed model was cast to 16 bits when built (as DDP's master weights, the shard starts from
      // those values, widened exactly); torch's FSDP would keep the fp32 init instead.
      if (mixed()) dev().widen_half(shard, model_.params16() + at, real, model_.half_format());
      else dev().copy(shard, model_.params() + at, real * kF32);
    }
    model_.release_parameter_storage();  // what FSDP saves: no rank holds the full model any more
  } else if (mixed()) {
    // NO_SHARD and ZeRO-1 under MixedPrecision: the model keeps the full 16-bit parameters (what torch's
    // FSDP casts the unsharded flat parameter to before each forward); the fp32 master of what this
    // rank steps (all of it, or its ZeRO-1 slice) and that part's fp32 gradient live here.
    owned_begin_ = opt_.sharding == Sharding::Zero1 ? rank_ * zero1_split_.chunk : 0;
    shard_params_ = Tensor({owned}, MemCategory::MasterWeights, mem, DType::F32, dev());
    shard_grads_ = Tensor({owned}, MemCategory::Gradients, mem, DType::F32, dev());
    if (zero1_by_group()) {
      for (const OwnedRun& r : runs_)
        dev().widen_half(shard_params_.f32() + r.at, model_.params16() + r.begin, r.length, model_.half_format());
    } else if (owned > 0) {
      dev().widen_half(shard_params_.f32(), model_.params16() + owned_begin_, owned, model_.half_format());
    }
  }
  for (int u = 0; u < num_units(); u++) record(u, FsdpVerb::Layout);
  model_.set_layer_hooks(this);
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  if (attached_) model_.set_layer_hooks(nullptr);
}

void FullyShardedDataParallel::make_groups() {
  const int K = opt_.node_size;
  if (K < 1 || world_ % K != 0)
    throw Error("HYBRID_SHARD needs a node size that divides the world size " + std::to_string(world_) +
                " (got " + std::to_string(K) + "); pass --node-size K");
  const int node = rank_ / K;
  std::vector<int> in_node, across;
  for (int i = 0; i < K; i++) in_node.push_back(node * K + i);
  for (int j = 0; j < world_ / K; j++) across.push_back(j * K + rank_ % K);
  group_executor_ = opt_.executor ? opt_.executor : std::make_shared<GroupExecutor>();
  // Tags above anything the rest of the engine sends with; one per group.
  node_group_ = new_group(comm_, in_node, (1 << 20) + 2 * node * 1024, group_executor_, dev(), "shard" + std::to_string(node));
  replica_group_ = new_group(comm_, across, (1 << 21) + 2 * (rank_ % K) * 1024, group_executor_, dev(),
                             "replicate" + std::to_string(rank_ % K));
  shard_comm_ = node_group_.get();
  shard_world_ = K;
  shard_rank_ = rank_ % K;
}

void FullyShardedDataParallel::make_post_forward_group() {
  const int n = opt_.reshard_after_forward;
  if (n == kReshardTrue || n == 0 || n == 1 || n == shard_world_) return;  // 1 keeps everything: False's memory
  if (n > shard_world_ || shard_world_ % n != 0)
    throw Error("--reshard-after-forward " + std::to_string(n) + " must divide the " + std::to_string(shard_world_) +
                " ranks a parameter is sharded over (fully_shard's post-forward mesh); use a divisor, true or false");
  // torch views the shard mesh as (-1, N): groups of N consecutive ranks.
  pf_size_ = n;
  pf_rank_ = shard_rank_ % n;
  const int first = rank_ - pf_rank_;
  std::vector<int> members;
  for (int i = 0; i < n; i++) members.push_back(first + i);
  if (!group_executor_) group_executor_ = opt_.executor ? opt_.executor : std::make_shared<GroupExecutor>();
  // One rank's group operations must run on one executor in program order (engine/comm/group.h), so
  // the shard group's collectives move off the world's worker to a group of every rank, beside these.
  if (!node_group_) shard_over_group();
  pf_group_ = new_group(comm_, members, (1 << 22) + 2 * (first / n) * 1024, group_executor_, dev(),
                        "post-forward" + std::to_string(first / n));
}

void FullyShardedDataParallel::shard_over_group() {
  if (!group_executor_) group_executor_ = opt_.executor ? opt_.executor : std::make_shared<GroupExecutor>();
  std::vector<int> all;
  for (int i = 0; i < world_; i++) all.push_back(i);
  node_group_ = new_group(comm_, all, 1 << 20, group_executor_, dev(), "shard");
  shard_comm_ = node_group_.get();
}

void FullyShardedDataParallel::chunk_copy(const Unit& u, void* per_param, void* blocks, int groups, int only, bool to_blocks,
                                          DType dt) {
  const int64_t elem = dtype_size(dt);
  const int64_t block = u.split.padded / groups;  // one rank's share of every parameter
  for (int j = 0; j < groups; j++) {
    if (only >= 0 && j != only) continue;
    char* b = static_cast<char*>(blocks) + (only >= 0 ? 0 : j * block) * elem;
    for (size_t k = 0; k < u.params.size(); k++) {
      const int64_t piece = u.dim0[k].padded_numel() / groups;  // whole rows: groups divides chunk_rows * W
      char* pp = static_cast<char*>(per_param) + (u.offsets[k] + j * piece) * elem;
      char* bp = b + u.shard_at[k] * (u.split.world / groups) * elem;
      if (to_blocks) dev().copy(bp, pp, piece * elem);
      else dev().copy(pp, bp, piece * elem);
    }
  }
}

int FullyShardedDataParallel::unit_of_layer(int layer) const { return layer_unit_[static_cast<size_t>(layer)]; }

void FullyShardedDataParallel::record(int unit, FsdpVerb verb, uint64_t seq) {
  if (!ctx_ || !ctx_->recorder()) return;
  const Unit& u = units_[static_cast<size_t>(unit)];
  const int64_t now = ctx_->recorder()->now_ns();
  const double t = ctx_->compute_clock();
  Event e(EventKind::FsdpUnit, Lane::Compute, now, now, t, t);
  e.fsdp = FsdpInfo{static_cast<int16_t>(unit), static_cast<int16_t>(units_.size()), u.state, verb,
                    static_cast<int16_t>(group_of(u).world), u.label, u.split.numel, u.split.chunk, seq};
  ctx_->record(e);
}

// FSDP2's transitions; anything else means the hooks ran out of order (a bug, not a user error).
void FullyShardedDataParallel::set_state(int unit, FsdpState to) {
  Unit& u = units_[static_cast<size_t>(unit)];
  const FsdpState from = u.state;
  const bool ok = (from == FsdpState::Idle && (to == FsdpState::Forward || to == FsdpState::PreBackward)) ||
                  (from == FsdpState::Forward && to == FsdpState::Idle) ||
                  (from == FsdpState::PreBackward && to == FsdpState::PostBackward) ||
                  (from == FsdpState::PostBackward && to == FsdpState::Idle);
  DTLAB_CHECK(ok, "FSDP unit " + std::to_string(unit) + " cannot go from " + fsdp_state_name(from) + " to " +
                      fsdp_state_name(to) + "; the model's layer hooks ran out of order");
  u.state = to;
  // Every verb carries the state; a transition with no verb (a root unit that stays gathered from
  // forward to backward) gets its own event, so the views never show a stale state.
  record(unit, FsdpVerb::State);
}

void FullyShardedDataParallel::bind(Unit& u, void* base, bool grads) {
  auto& ps = model_.parameters();
  for (size_t k = 0; k < u.params.size(); k++) {
    Parameter& p = ps[static_cast<size_t>(u.params[k])];
    const int64_t at = u.offsets[k];
    if (mixed()) (grads ? p.grad16 : p.data16) = base ? static_cast<uint16_t*>(base) + at : nullptr;
    else (grads ? p.grad : p.data) = base ? static_cast<float*>(base) + at : nullptr;
  }
}

void FullyShardedDataParallel::unshard(int unit) {
  if (unit < 0 || unit >= num_units()) return;  // nothing to prefetch past either end
  Unit& u = units_[static_cast<size_t>(unit)];
  if (!u.gathered.empty() || u.gathering) return;
  MemoryTracker* mem = ctx_ ? ctx_->memory() : nullptr;
  if (api2() && !u.pf_shard.empty()) {
    // reshard_after_forward=N: the backward's all-gather runs in the group of N that kept the shards.
    u.ag_out = Tensor({u.split.padded}, MemCategory::CommBuffers, mem, gather_dtype_, dev());
    u.gathering = pf_group_->all_gather(u.ag_out.raw(), u.pf_shard.raw(), u.split.padded / pf_size_, gather_dtype_);
    record(unit, FsdpVerb::Unshard);
    return;
  }
  // FSDP1 gathers straight into the flat parameter; FSDP2 into an all-gather output it copies out of
  // (foreach_all_gather_copy_out) into each parameter's padded unsharded tensor.
  Tensor& out = api2() ? u.ag_out : u.gathered;
  out = Tensor({u.split.padded}, api2() ? MemCategory::CommBuffers : MemCategory::GatheredParameters, mem, gather_dtype_, dev());
  const float* shard = shard_params_.f32() + u.shard_offset;
  const void* send = shard;
  if (mixed()) {
    // torch's _use_low_precision_shard: the fp32 shard cast to param_dtype, so the all-gather moves 16-bit
    // bytes; freed once gathered.
    u.low_shard = Tensor({u.split.chunk}, MemCategory::CommBuffers, mem, gather_dtype_, dev());
    dev().narrow_half(u.low_shard.u16(), shard, u.split.chunk, model_.half_format());
    send = u.low_shard.raw();
  }
  Communicator* const over = group_of(u).comm;
  const uint64_t seq = over == &comm_ ? comm_.collectives_issued() : UINT64_MAX;
  u.gathering = over->all_gather(out.raw(), send, u.split.chunk, gather_dtype_);
  // An expert unit's collectives run on the rank's group executor, while the rank itself goes on
  // issuing the world's (the other units', a CP ring's sends): left in flight, they would reach the
  // world's comm worker (one queue per rank, a stream) in a different order on different ranks and
  // could wait on each other. So they are waited for as issued, as the EP all-to-alls are.
  if (u.group != 0) u.gathering->wait();
  record(unit, FsdpVerb::Unshard, seq);
}

void FullyShardedDataParallel::wait_for_unshard(int unit) {
  unshard(unit);
  Unit& u = units_[static_cast<size_t>(unit)];
  if (u.gathering) {
    if (ctx_) ctx_->set_activity("FSDP: waiting for unit " + std::to_string(unit) + "'s all-gather");
    u.gathering->wait();
    u.gathering.reset();
    u.low_shard = Tensor();
    if (api2()) {
      MemoryTracker* mem = ctx_ ? ctx_->memory() : nullptr;
      u.gathered = Tensor({u.split.padded}, MemCategory::GatheredParameters, mem, gather_dtype_, dev());
      const int groups = u.pf_shard.empty() ? u.split.world : pf_size_;
      chunk_copy(u, u.gathered.raw(), u.ag_out.raw(), groups, -1, false, gather_dtype_);
      u.ag_out = Tensor();
      u.pf_shard = Tensor();
    }
    record(unit, FsdpVerb::Unsharded);
  }
  bind(u, u.gathered.raw(), false);
}

void FullyShardedDataParallel::reshard(int unit, bool post_forward) {
  Unit& u = units_[static_cast<size_t>(unit)];
  if (u.gathered.empty()) return;
  if (post_forward && api2() && opt_.reshard_after_forward == 1) return;  // a "group" of one keeps it all
  if (post_forward && pf_size_ > 0 && u.group == 0) {  // an expert unit reshards fully: its group is not the shard group
    // torch's to_sharded_post_forward: this rank's 1/N of each padded unsharded parameter.
    u.pf_shard = Tensor({u.split.padded / pf_size_}, MemCategory::GatheredParameters, ctx_ ? ctx_->memory() : nullptr,
                        gather_dtype_, dev());
    chunk_copy(u, u.gathered.raw(), u.pf_shard.raw(), pf_size_, pf_rank_, true, gather_dtype_);
  }
  bind(u, nullptr, false);
  u.gathered = Tensor();
  record(unit, FsdpVerb::Reshard, u.pf_shard.empty() ? UINT64_MAX : static_cast<uint64_t>(pf_size_));
}

void FullyShardedDataParallel::unshard_next(int ui, int k) {
  const int at = primary_at_[static_cast<size_t>(ui)] + k;
  if (at < 0 || at >= static_cast<int>(primary_.size())) return;  // nothing to prefetch past either end
  const int next = primary_[static_cast<size_t>(at)];
  unshard(next);
  if (units_[static_cast<size_t>(next)].experts >= 0) unshard(units_[static_cast<size_t>(next)].experts);
}

// Each hook acts on the layer's unit and then on its experts' unit (--ep), the same way; prefetch
// gathers both of the next block's.
void FullyShardedDataParallel::begin_forward(int ui) {
  for (const int v : with_experts(ui)) {
    if (v < 0) continue;
    set_state(v, FsdpState::Forward);
    if (sharded()) wait_for_unshard(v);
  }
}

// FULL_SHARD reshards after forward; the root unit (the whole model, or a GPT's embeddings and head)
// keeps its parameters for the backward that follows, as torch's root FSDP instance does (FSDP1's
// _post_forward_reshard frees only non-root handles).
void FullyShardedDataParallel::end_forward(int ui) {
  for (const int v : with_experts(ui)) {
    if (v < 0) continue;
    if (sharded() && reshard_after_forward() && !units_[static_cast<size_t>(v)].root) reshard(v, true);
    set_state(v, FsdpState::Idle);
  }
}

void FullyShardedDataParallel::before_forward(int layer) {
  const int ui = unit_of_layer(layer);
  if (ui < 0 || layer != units_[static_cast<size_t>(ui)].first_layer) return;
  begin_forward(ui);
  if (!sharded()) return;
  // The next unit's parameters arrive during this forward (FSDP2: the next opt_.prefetch units, as
  // set_modules_to_forward_prefetch names them).
  if (opt_.forward_prefetch)
    for (int k = 1; k <= opt_.prefetch; k++) unshard_next(ui, k);
}

void FullyShardedDataParallel::before_recompute(int layer) {
  const int ui = unit_of_layer(layer);
  if (ui >= 0 && units_[static_cast<size_t>(ui)].state == FsdpState::Idle) begin_forward(ui);
}

void FullyShardedDataParallel::after_recompute(int layer) {
  const int ui = unit_of_layer(layer);
  if (ui >= 0 && units_[static_cast<size_t>(ui)].state == FsdpState::Forward) end_forward(ui);
}

void FullyShardedDataParallel::after_forward(int layer) {
  const int ui = unit_of_layer(layer);
  if (ui >= 0 && layer == units_[static_cast<size_t>(ui)].last_layer) end_forward(ui);
}

void FullyShardedDataParallel::before_backward(int layer) {
  const int ui = unit_of_layer(layer);
  if (ui < 0 || layer != units_[static_cast<size_t>(ui)].last_layer) return;
  for (const int v : with_experts(ui))
    if (v >= 0) set_state(v, FsdpState::PreBackward);
  if (!sharded()) return;
  // FULL_SHARD gathers again; SHARD_GRAD_OP still holds the forward's copy.
  for (const int v : with_experts(ui))
    if (v >= 0) wait_for_unshard(v);
  // BACKWARD_PRE: the next unit's all-gather goes out before this unit's gradients are computed.
  if (opt_.backward_prefetch == BackwardPrefetch::Pre)
    for (int k = 1; k <= opt_.prefetch; k++) unshard_next(ui, -k);  // FSDP2: set_modules_to_backward_prefetch
  for (const int v : with_experts(ui)) {
    if (v < 0) continue;
    Unit& u = units_[static_cast<size_t>(v)];
    u.full_grad = Tensor({u.split.padded}, MemCategory::Gradients, ctx_ ? ctx_->memory() : nullptr, model_.param_dtype(), dev());
    u.full_grad.zero();
    bind(u, u.full_grad.raw(), true);
  }
}

void FullyShardedDataParallel::after_backward(int layer) {
  const int ui = unit_of_layer(layer);
  if (ui < 0 || layer != units_[static_cast<size_t>(ui)].first_layer) return;
  const int ex = units_[static_cast<size_t>(ui)].experts;
  for (const int v : with_experts(ui))
    if (v >= 0) set_state(v, FsdpState::PostBackward);
  // BACKWARD_POST: after this unit's gradients, before its reduce-scatter.
  if (sharded() && opt_.backward_prefetch == BackwardPrefetch::Post) unshard_next(ui, -1);
  // The experts' gradients are done first (autograd reaches the MLP before the attention), so their
  // reduce-scatter goes out first.
  if (ex >= 0) post_backward(ex);
  post_backward(ui);
}

void FullyShardedDataParallel::post_backward(int unit) {
  Unit& u = units_[static_cast<size_t>(unit)];
  const ShardGroup& g = group_of(u);
  const float pre = g.pre;
  auto& ps = model_.parameters();
  const uint64_t seq = g.comm == &comm_ ? comm_.collectives_issued() : UINT64_MAX;
  if (sharded()) {
    MemoryTracker* mem = ctx_ ? ctx_->memory() : nullptr;
    if (api2()) {
      // foreach_reduce's copy-in (chunk_cat): rank j's block is every parameter's j-th padded chunk;
      // the unsharded gradients are freed once copied.
      bind(u, nullptr, true);
      Tensor in({u.split.padded}, MemCategory::CommBuffers, mem, u.full_grad.dtype(), dev());
      chunk_copy(u, u.full_grad.raw(), in.raw(), u.split.world, -1, true, u.full_grad.dtype());
      u.full_grad = std::move(in);
    }
    void* send = u.full_grad.raw();
    if (u.full_grad.dtype() != reduce_dtype_) {
      // reduce_dtype float32: torch's grad.to(reduce_dtype) replaces the 16-bit gradient.
      u.reduce_in = Tensor({u.split.padded}, MemCategory::CommBuffers, mem, DType::F32, dev());
      dev().widen_half(u.reduce_in.f32(), u.full_grad.u16(), u.split.padded, model_.half_format());
      u.full_grad = Tensor();
      send = u.reduce_in.raw();
    }
    scale_in(send, u.split.padded, reduce_dtype_, pre, dev(), mem);
    // A float32 reduction lands in the gradient shard; a 16-bit one, or one to be added to the
    // gradients of earlier backwards (accumulation), in its own shard until after the wait.
    void* out = shard_grads_.f32() + u.shard_offset;
    if (reduce_dtype_ != DType::F32 || backwards_ > 0) {
      u.reduce_out = Tensor({u.split.chunk}, MemCategory::CommBuffers, mem, reduce_dtype_, dev());
      out = u.reduce_out.raw();
    }
    u.reduce = g.comm->reduce_scatter(out, send, u.split.chunk, reduce_dtype_, ReduceOp::Sum);
    // HYBRID_SHARD: the node's reduced shard is then summed over the nodes holding the same shard
    // (queued behind the reduce-scatter on the same group executor).
    if (g.replicate) u.replicate = g.replicate->all_reduce(out, u.split.chunk, reduce_dtype_, ReduceOp::Sum);
    if (u.group != 0) {  // an expert unit's: waited for as issued (unshard says why)
      u.reduce->wait();
      if (u.replicate) u.replicate->wait();
    }
    bind(u, nullptr, true);
    record(unit, FsdpVerb::ReduceGrad, seq);
    reshard(unit);
    // The units reduced before this one: their reduce-scatters ran while this unit's backward computed;
    // waited for now, their full-size gradients go, so a rank holds at most two (this unit's, in
    // flight, and the next one's as it is computed) instead of every unit's until the backward ends.
    for (Unit& before : units_)
      if (&before != &u && before.reduce) land_reduced(before);
  } else if (mixed()) {
    // NO_SHARD and ZeRO-1: torch's _reduce_grad_no_shard all-reduces the unit's 16-bit gradient in the
    // reduce dtype (widened first for reduce_dtype float32).
    const Parameter& first = ps[static_cast<size_t>(u.params.front())];
    void* g = first.grad16;
    if (reduce_dtype_ == DType::F32) {
      u.reduce_in = Tensor({u.split.numel}, MemCategory::CommBuffers, ctx_ ? ctx_->memory() : nullptr, DType::F32, dev());
      dev().widen_half(u.reduce_in.f32(), first.grad16, u.split.numel, model_.half_format());
      g = u.reduce_in.raw();
    }
    scale_in(g, u.split.numel, reduce_dtype_, pre, dev(), ctx_ ? ctx_->memory() : nullptr);
    // (An expert unit's over its group: waited for as issued, as in unshard.)
    u.reduce = group_of(u).comm->all_reduce(g, u.split.numel, reduce_dtype_, ReduceOp::Sum);
    if (u.group != 0) u.reduce->wait();
    record(unit, FsdpVerb::ReduceGrad, seq);
  } else {
    float* g = ps[static_cast<size_t>(u.params.front())].grad;
    dev().scale(g, u.split.numel, pre);
    u.reduce = group_of(u).comm->all_reduce(g, u.split.numel, ReduceOp::Sum);
    if (u.group != 0) u.reduce->wait();
    record(unit, FsdpVerb::ReduceGrad, seq);
  }
}

void FullyShardedDataParallel::land_f32(float* dst, const void* src, int64_t n, DType dt, bool add) {
  if (n <= 0) return;
  if (dt == DType::F32) {
    if (add) dev().accumulate(dst, static_cast<const float*>(src), n, false);
    else dev().copy(dst, src, n * kF32);
    return;
  }
  if (!add) return dev().widen_half(dst, static_cast<const uint16_t*>(src), n, model_.half_format());
  Tensor wide({n}, MemCategory::CommBuffers, ctx_ ? ctx_->memory() : nullptr, DType::F32, dev());
  dev().widen_half(wide.f32(), static_cast<const uint16_t*>(src), n, model_.half_format());
  dev().accumulate(dst, wide.f32(), n, false);
}

void FullyShardedDataParallel::zero_grad() {
  if (!sharded()) model_.zero_grad();
  shard_grads_.zero();  // the sharded strategies' gradient shard, or mixed NO_SHARD's and ZeRO-1's fp32 gradient
  backwards_ = 0;
}

void FullyShardedDataParallel::land_reduced(Unit& u) {
  u.reduce->wait();
  u.reduce.reset();
  if (u.replicate) u.replicate->wait(), u.replicate.reset();
  float* shard = shard_grads_.f32() + u.shard_offset;
  if (!u.reduce_out.empty()) {
    // Post-divide in the reduce dtype, then torch's _cast_grad_to_param_dtype: the fp32 shard the
    // optimizer steps (docs/course_sources.md §6e); accumulating, added to what it holds.
    scale_in(u.reduce_out.raw(), u.split.chunk, reduce_dtype_, group_of(u).post, dev(), ctx_ ? ctx_->memory() : nullptr);
    land_f32(shard, u.reduce_out.raw(), u.split.chunk, reduce_dtype_, reduce_dtype_ == DType::F32 || backwards_ > 0);
    u.reduce_out = Tensor();
  } else {
    dev().scale(shard, u.split.chunk, group_of(u).post);
  }
  u.full_grad = Tensor();
  u.reduce_in = Tensor();
  u.landed = true;
}

void FullyShardedDataParallel::finalize_backward() {
  for (int ui = 0; ui < num_units(); ui++) {
    Unit& u = units_[static_cast<size_t>(ui)];
    const float post = group_of(u).post;
    if (!u.reduce && !u.landed) continue;  // a unit the forward skipped: its gradient stays zero
    if (sharded()) {
      if (u.reduce) land_reduced(u);
      u.landed = false;
    } else if (mixed()) {
      u.reduce->wait();
      u.reduce.reset();
      // Post-divide in the reduce dtype, then the part this rank steps goes to its fp32 gradient (added
      // to earlier backwards'); the 16-bit gradient is spent, so the next backward starts from zero.
      Parameter& first = model_.parameters()[static_cast<size_t>(u.params.front())];
      void* reduced = u.reduce_in.empty() ? static_cast<void*>(first.grad16) : u.reduce_in.raw();
      scale_in(reduced, u.split.numel, reduce_dtype_, post, dev(), ctx_ ? ctx_->memory() : nullptr);
      const int64_t base = first.offset;
      const std::vector<OwnedRun> whole{{0, owned_begin_, shard_grads_.numel(), 0}};
      for (const OwnedRun& r : zero1_by_group() ? runs_ : whole) {
        const int64_t a = std::max(base, r.begin), b = std::min(base + u.split.numel, r.begin + r.length);
        if (a < b)
          land_f32(shard_grads_.f32() + r.at + (a - r.begin), static_cast<const char*>(reduced) + (a - base) * dtype_size(reduce_dtype_),
                   b - a, reduce_dtype_, backwards_ > 0);
      }
      dev().fill_zero(first.grad16, u.split.numel * 2);
      u.reduce_in = Tensor();
    } else {
      u.reduce->wait();
      u.reduce.reset();
      dev().scale(model_.parameters()[static_cast<size_t>(u.params.front())].grad, u.split.numel, post);
    }
    set_state(ui, FsdpState::Idle);
    record(ui, FsdpVerb::GradReduced);
  }
  backwards_++;
}

void FullyShardedDataParallel::step() {
  for (Unit& u : units_) u.pf_shard = Tensor();  // a forward with no backward left one; the step outdates it
  switch (opt_.sharding) {
    case Sharding::NoShard:
      if (!mixed()) return optimizer_->step(model_.params(), model_.grads());
      // Mixed: the fp32 master steps; the next forward's 16-bit parameters are its cast.
      optimizer_->step(shard_params_.f32(), shard_grads_.f32());
      dev().narrow_half(model_.params16(), shard_params_.f32(), model_.num_params(), model_.half_format());
      return;
    case Sharding::Zero1: {
      if (zero1_by_group()) return zero1_step_by_group();
      // Update this rank's slice with its optimizer shard, then everyone gathers the slices; mixed
      // precision steps the fp32 master slice and gathers its 16-bit cast (the param dtype's bytes).
      const int64_t c = zero1_split_.chunk, real = zero1_split_.real(rank_);
      MemoryTracker* mem = ctx_ ? ctx_->memory() : nullptr;
      Tensor mine({c}, MemCategory::CommBuffers, mem, gather_dtype_, dev());
      if (real > 0 && mixed()) {
        optimizer_->step(shard_params_.f32(), shard_grads_.f32());
        dev().narrow_half(mine.u16(), shard_params_.f32(), real, model_.half_format());
      } else if (real > 0) {
        optimizer_->step(model_.params() + rank_ * c, model_.grads() + rank_ * c);
        dev().copy(mine.f32(), model_.params() + rank_ * c, real * kF32);
      }
      Tensor all({zero1_split_.padded}, MemCategory::CommBuffers, mem, gather_dtype_, dev());
      comm_.all_gather(all.raw(), mine.raw(), c, gather_dtype_)->wait();
      void* own = mixed() ? static_cast<void*>(model_.params16()) : static_cast<void*>(model_.params());
      dev().copy(own, all.raw(), model_.num_params() * dtype_size(gather_dtype_));
      return;
    }
    default: optimizer_->step(shard_params_.f32(), shard_grads_.f32()); return;
  }
}

void FullyShardedDataParallel::zero1_layout() {
  for (int g = 0; g < 2; g++) {
    Zero1Group& z = zero1_groups_[g];
    z.segments = parameter_runs(model_, g == 1);
    int64_t n = 0;
    for (const auto& [a, b] : z.segments) n += b - a;
    z.split = flat_shard(n, groups_[g].world);
    // This rank's part of the group's concatenated parameters, as runs of the flat ones.
    const int64_t lo = groups_[g].rank * z.split.chunk, hi = lo + z.split.real(groups_[g].rank);
    int64_t v = 0;
    for (const auto& [a, b] : z.segments) {
      const int64_t s = std::max(lo, v), e = std::min(hi, v + (b - a));
      if (s < e) {
        const int64_t at = runs_.empty() ? 0 : runs_.back().at + runs_.back().length;
        runs_.push_back({g, a + (s - v), e - s, at});
      }
      v += b - a;
    }
  }
}

void FullyShardedDataParallel::zero1_step_by_group() {
  // Each rank steps its runs (mixed precision: their fp32 master), then each group all-gathers its
  // members' slices of its parameters and writes them back where they sit in the flat vector.
  MemoryTracker* mem = ctx_ ? ctx_->memory() : nullptr;
  const int64_t owned = runs_.empty() ? 0 : runs_.back().at + runs_.back().length;
  Tensor staged;  // float32 without mixed precision: the runs side by side, stepped, copied back
  if (mixed()) {
    if (owned > 0) optimizer_->step(shard_params_.f32(), shard_grads_.f32());
  } else if (owned > 0) {
    staged = Tensor({2 * owned}, MemCategory::Other, mem, DType::F32, dev());
    float* p = staged.f32();
    float* g = p + owned;
    for (const OwnedRun& r : runs_) {
      dev().copy(p + r.at, model_.params() + r.begin, r.length * kF32);
      dev().copy(g + r.at, model_.grads() + r.begin, r.length * kF32);
    }
    optimizer_->step(p, g);
    for (const OwnedRun& r : runs_) dev().copy(model_.params() + r.begin, p + r.at, r.length * kF32);
  }
  const int64_t elem = dtype_size(gather_dtype_);
  char* const own = static_cast<char*>(mixed() ? static_cast<void*>(model_.params16()) : static_cast<void*>(model_.params()));
  for (int gi = 0; gi < 2; gi++) {
    const Zero1Group& z = zero1_groups_[gi];
    if (z.split.numel == 0) continue;
    Tensor mine({z.split.chunk}, MemCategory::CommBuffers, mem, gather_dtype_, dev());
    int64_t at = 0;
    for (const OwnedRun& r : runs_) {
      if (r.group != gi) continue;
      char* dst = static_cast<char*>(mine.raw()) + at * elem;
      if (mixed()) dev().narrow_half(reinterpret_cast<uint16_t*>(dst), shard_params_.f32() + r.at, r.length, model_.half_format());
      else dev().copy(dst, own + r.begin * elem, r.length * elem);
      at += r.length;
    }
    Tensor all({z.split.padded}, MemCategory::CommBuffers, mem, gather_dtype_, dev());
    groups_[gi].comm->all_gather(all.raw(), mine.raw(), z.split.chunk, gather_dtype_)->wait();
    int64_t v = 0;
    for (const auto& [a, b] : z.segments) {
      dev().copy(own + a * elem, static_cast<const char*>(all.raw()) + v * elem, (b - a) * elem);
      v += b - a;
    }
  }
}

bool FullyShardedDataParallel::unscale_shard_grads(float inv_scale) {
  // The float32 gradients this rank steps: its shard (or --precision's fp32 copy of what it owns), or
  // under --amp with NO_SHARD and ZeRO-1 the model's own.
  const bool own = mixed() || sharded();
  float* g = own ? shard_grads_.f32() : model_.grads();
  const int64_t n = own ? shard_grads_.numel() : model_.num_params();
  dev().scale(g, n, inv_scale);
  return !dev().all_finite(g, n);
}

std::vector<OwnedSlice> FullyShardedDataParallel::owned(bool grads) const {
  std::vector<OwnedSlice> out;
  const auto& ps = model_.parameters();
  // The part of [begin, end) (flat coordinates of `params`, starting at `base`) inside each parameter.
  auto cut = [&](const std::vector<int>& params, const std::vector<int64_t>& offsets, int64_t begin, int64_t end,
                 const float* data) {
    for (size_t k = 0; k < params.size(); k++) {
      const int64_t p0 = offsets[k], p1 = p0 + ps[static_cast<size_t>(params[k])].numel;
      const int64_t a = std::max(begin, p0), b = std::min(end, p1);
      if (a < b) out.push_back({params[k], a - p0, b - a, data + (a - begin)});
    }
  };
  if (sharded() && attached_) {
    for (const Unit& u : units_) {
      if (rank_ / shard_world_ != 0) continue;  // HYBRID_SHARD: the other nodes hold copies (of the experts too)
      // (An expert unit's shards are its expert group's: together with the other EP ranks', whose
      // experts are others, every expert once.)
      const int shard_rank = group_of(u).rank;
      const float* base = (grads ? shard_grads_ : shard_params_).f32() + u.shard_offset;
      if (api2()) {
        // Each parameter's dim-0 chunk is a contiguous run of its flattened values.
        for (size_t k = 0; k < u.params.size(); k++) {
          const Dim0Shard& d = u.dim0[k];
          const int64_t real = d.real_rows(shard_rank) * d.cols;
          if (real > 0) out.push_back({u.params[k], shard_rank * d.shard_numel(), real, base + u.shard_at[k]});
        }
        continue;
      }
      const int64_t begin = shard_rank * u.split.chunk;
      cut(u.params, u.offsets, begin, begin + u.split.real(shard_rank), (grads ? shard_grads_ : shard_params_).f32() + u.shard_offset);
    }
    return out;
  }
  if (zero1_by_group() && attached_) {
    // ZeRO-1 with --ep: the runs this rank steps, each group's parameters once over that group (the
    // other EP ranks' runs cover their own experts), so every parameter once over the world.
    std::vector<int> all;
    std::vector<int64_t> offsets;
    for (int p = 0; p < static_cast<int>(ps.size()); p++) all.push_back(p), offsets.push_back(ps[static_cast<size_t>(p)].offset);
    for (const OwnedRun& r : runs_) {
      const float* from = mixed() ? (grads ? shard_grads_ : shard_params_).f32() + r.at : (grads ? model_.grads() : model_.params()) + r.begin;
      cut(all, offsets, r.begin, r.begin + r.length, from);
    }
    return out;
  }
  const int64_t begin = rank_ * zero1_split_.chunk;
  // Mixed precision: the fp32 master (all of it under NO_SHARD, the slice under ZeRO-1).
  const float* from = mixed() ? (grads ? shard_grads_ : shard_params_).f32() + (begin - owned_begin_)
                              : (grads ? model_.grads() : model_.params()) + begin;
  if (groups_[1].comm && attached_) {
    // NO_SHARD with --ep: the rest as below, unit by unit, and each experts' unit split over its group
    // (the other EP ranks' slices cover their own experts), so every parameter once over the world.
    const float* flat = from - begin;  // the model's flat layout (NO_SHARD's master covers all of it)
    for (const Unit& u : units_) {
      std::vector<int64_t> at;
      for (int p : u.params) at.push_back(ps[static_cast<size_t>(p)].offset);
      if (u.group == 0) {
        cut(u.params, at, begin, begin + zero1_split_.real(rank_), from);
      } else {
        const int64_t b = at.front() + group_of(u).rank * u.split.chunk;
        cut(u.params, at, b, b + u.split.real(group_of(u).rank), flat + b);
      }
    }
    return out;
  }
  std::vector<int> all;
  std::vector<int64_t> offsets;
  for (int p = 0; p < static_cast<int>(ps.size()); p++) all.push_back(p), offsets.push_back(ps[static_cast<size_t>(p)].offset);
  cut(all, offsets, begin, begin + zero1_split_.real(rank_), from);
  return out;
}

std::vector<OwnedSlice> FullyShardedDataParallel::owned_slices() const { return owned(false); }

std::vector<OwnedSlice> FullyShardedDataParallel::owned_grad_slices() const { return owned(true); }

std::pair<float*, int64_t> FullyShardedDataParallel::step_grads() {
  // The fp32 shards (sharded, or mixed precision's master gradient); else the model's own gradient,
  // all of it (NO_SHARD steps it whole, ZeRO-1 its slice).
  if (sharded() || mixed()) return {shard_grads_.f32(), shard_grads_.numel()};
  return {model_.grads(), model_.num_params()};
}

void FullyShardedDataParallel::materialize() {
  model_.set_layer_hooks(nullptr);
  attached_ = false;
  if (!sharded()) return;
  // Mixed precision gathers what forward does: the shards cast to 16 bits, the model's own dtype.
  Tensor full({model_.num_params()}, MemCategory::Other, nullptr, gather_dtype_, dev());  // untracked staging
  const int64_t elem = dtype_size(gather_dtype_);
  int64_t base = 0;
  for (int ui = 0; ui < num_units(); ui++) {
    Unit& u = units_[static_cast<size_t>(ui)];
    wait_for_unshard(ui);
    if (api2()) {
      // Each parameter's rows, its all-gather output's padding dropped (the unsharded view).
      const auto& ps = model_.parameters();
      for (size_t k = 0; k < u.params.size(); k++) {
        const Parameter& p = ps[static_cast<size_t>(u.params[k])];
        dev().copy(static_cast<char*>(full.raw()) + p.offset * elem, static_cast<const char*>(u.gathered.raw()) + u.offsets[k] * elem,
                   p.numel * elem);
      }
    } else {
      dev().copy(static_cast<char*>(full.raw()) + base * elem, u.gathered.raw(), u.split.numel * elem);
    }
    base += u.split.numel;
    reshard(ui);
  }
  shard_params_ = Tensor();
  shard_grads_ = Tensor();
  model_.restore_storage(full.raw());
}

}  // namespace dtlab
