#include "engine/parallel/pipeline.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>

#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/core/gpt.h"
#include "engine/core/ops.h"
#include "engine/parallel/context_parallel.h"
#include "engine/parallel/expert_parallel.h"
#include "engine/parallel/tensor_parallel.h"

namespace dtlab {

namespace {

// Tags keep every message apart: one per (receiving stage, micro-batch, direction); a later
// iteration reuses them, and each (sender, receiver, tag) queue delivers in order.
constexpr int kActivationTag = 1 << 24;
constexpr int kGatherTag = 1 << 23;  // + stage: the parameters gathered to rank 0 after training
constexpr int kReplicaTag = 1 << 22;  // + 4 * pipeline rank: the data-parallel group of that rank
constexpr int kContextTag = 1 << 25;  // the CP groups (a rank is in one; its pairs share a pipeline rank)
constexpr int kExpertTag = 1 << 21;   // the EP groups, + 1: the expert-data-parallel groups

int64_t linear_params(const ModelSpec& spec, int l) { return spec.dims[l + 1] * spec.dims[l] + spec.dims[l + 1]; }

int num_linear(const ModelSpec& spec) { return static_cast<int>(spec.dims.size()) - 1; }

// The largest stage's parameters in the best contiguous cut of `params` into `k` stages.
int64_t best_max_stage(const std::vector<int64_t>& params, int k) {
  const int L = static_cast<int>(params.size());
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  // best[j][i]: the first i layers in j stages
  std::vector<std::vector<int64_t>> best(static_cast<size_t>(k + 1), std::vector<int64_t>(static_cast<size_t>(L + 1), kInf));
  best[0][0] = 0;
  for (int j = 1; j <= k; j++)
    for (int i = j; i <= L; i++) {
      int64_t tail = 0;
      for (int cut = i - 1; cut >= j - 1; cut--) {
        tail += params[static_cast<size_t>(cut)];
        if (best[j - 1][cut] == kInf) continue;
        best[j][i] = std::min(best[j][i], std::max(best[j - 1][cut], tail));
      }
    }
  return best[k][L];
}

}  // namespace

// ---- stages ----

std::vector<int> parse_split(std::string_view text) {
  const std::string how = "; write the Linear layers (a GPT: the blocks) of each stage in model order, e.g. --split 2,2,1";
  std::vector<int> counts;
  std::string_view rest = text;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view part = rest.substr(0, comma);
    int v = 0;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc() || ptr != part.data() + part.size() || v < 1)
      throw Error("--split '" + std::string(text) + "' has '" + std::string(part) +
                  "' where a count of at least 1 belongs" + how);
    counts.push_back(v);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return counts;
}

namespace {

// The GPT's stages (engine/core/gpt_spec.h, GptRange): its L blocks cut into contiguous runs, at least
// one each (as evenly as they go, the earlier stages taking one more, or `split`: blocks per stage),
// the embeddings on the first stage and ln_f with the head on the last, as Megatron places them.
std::vector<StageRange> partition_gpt(const ModelSpec& spec, int num_stages, const std::vector<int>& split) {
  const int L = static_cast<int>(spec.gpt.layers);
  if (num_stages > L)
    throw Error(spec.str() + " has " + std::to_string(L) + " blocks, fewer than the " + std::to_string(num_stages) +
                " stages (--stages x --chunks); use more layers= or fewer stages");
  std::vector<int> counts = split;
  if (counts.empty())
    for (int s = 0; s < num_stages; s++) counts.push_back(L / num_stages + (s < L % num_stages ? 1 : 0));
  if (static_cast<int>(counts.size()) != num_stages)
    throw Error("--split gives " + std::to_string(counts.size()) + " stages but the pipeline has " + std::to_string(num_stages) +
                " (--stages x --chunks); give one count of blocks per stage");
  int sum = 0;
  for (int n : counts) sum += n;
  if (sum != L)
    throw Error("--split covers " + std::to_string(sum) + " blocks but " + spec.str() + " has " + std::to_string(L) +
                "; the counts must add up to the model's blocks (layers=)");
  std::vector<StageRange> out;
  int block = 0;
  for (int s = 0; s < num_stages; s++) {
    const int first = s == 0 ? 0 : 1 + block;
    block += counts[static_cast<size_t>(s)];
    out.push_back({first, s + 1 == num_stages ? L + 2 : 1 + block});
  }
  return out;
}

}  // namespace

std::vector<StageRange> partition_stages(const ModelSpec& spec, int num_stages, const std::vector<int>& split) {
  if (spec.is_gpt()) return partition_gpt(spec, num_stages, split);
  const int L = num_linear(spec);
  if (num_stages > L)
    throw Error(spec.str() + " has " + std::to_string(L) + " Linear layers, fewer than the " + std::to_string(num_stages) +
                " stages (--stages x --chunks); use a deeper model or fewer stages");
  std::vector<StageRange> out;
  if (!split.empty()) {
    if (static_cast<int>(split.size()) != num_stages)
      throw Error("--split gives " + std::to_string(split.size()) + " stages but the pipeline has " +
                  std::to_string(num_stages) + " (--stages x --chunks); give one count per stage");
    int first = 0;
    for (int n : split) {
      out.push_back({first, first + n});
      first += n;
    }
    if (first != L)
      throw Error("--split covers " + std::to_string(first) + " Linear layers but " + spec.str() + " has " +
                  std::to_string(L) + "; the counts must add up to the model's Linear layers");
    return out;
  }
  std::vector<int64_t> params;
  for (int l = 0; l < L; l++) params.push_back(linear_params(spec, l));
  const int64_t cap = best_max_stage(params, num_stages);
  // Fill each stage up to the cap from the front, leaving one layer for every stage still to come.
  int first = 0;
  for (int s = 0; s < num_stages; s++) {
    int end = first + 1;
    int64_t sum = params[static_cast<size_t>(first)];
    const int last_allowed = L - (num_stages - s - 1);
    while (end < last_allowed && sum + params[static_cast<size_t>(end)] <= cap) sum += params[static_cast<size_t>(end++)];
    if (s == num_stages - 1) end = L;
    out.push_back({first, end});
    first = end;
  }
  return out;
}

int64_t stage_num_params(const ModelSpec& spec, StageRange s) {
  int64_t n = 0;
  if (spec.is_gpt()) {
    for (const Parameter& p : gpt_stage_parameters(spec.gpt, {s.first, s.end})) n += p.numel;
    return n;
  }
  for (int l = s.first; l < s.end; l++) n += linear_params(spec, l);
  return n;
}

int64_t stage_param_offset(const ModelSpec& spec, StageRange s) { return stage_num_params(spec, {0, s.first}); }

std::string describe_stage(const ModelSpec& spec, StageRange s) {
  if (spec.is_gpt()) {  // "transformer.h.0-1 (2 blocks) + wte, wpe, 12,345 parameters"
    const GptRange r{s.first, s.end};
    const int b0 = r.first_block(), b1 = r.end_block(spec.gpt);
    std::string out = "transformer.h." + std::to_string(b0) + (b1 - b0 > 1 ? "-" + std::to_string(b1 - 1) : "") + " (" +
                      std::to_string(b1 - b0) + (b1 - b0 == 1 ? " block)" : " blocks)");
    if (r.embeds()) out += " + wte, wpe";
    if (r.heads(spec.gpt)) out += r.embeds() ? " + ln_f, the tied head" : " + ln_f, lm_head (a copy of wte)";
    return out + ", " + with_commas(stage_num_params(spec, s)) + " parameters";
  }
  const int last_seq = s.end == num_linear(spec) ? 2 * s.end - 2 : 2 * s.end - 1;
  const int n = s.end - s.first;
  return "Sequential " + std::to_string(2 * s.first) + "-" + std::to_string(last_seq) + " (" + std::to_string(n) +
         " Linear), " + with_commas(stage_num_params(spec, s)) + " parameters";
}

std::vector<int> PipelinePlan::stages_of_rank(int pipe_rank) const {
  std::vector<int> ids;
  for (int k = 0; k < options.chunks; k++) ids.push_back(pipe_rank + k * options.stages);
  return ids;
}

PipelinePlan plan_pipeline(const ModelSpec& spec, const PipelineOptions& opt, int64_t batch, int world_size) {
  if (opt.stages < 1) throw Error("--stages must be at least 1 (got " + std::to_string(opt.stages) + ")");
  if (opt.dp < 1) throw Error("--dp must be at least 1 (got " + std::to_string(opt.dp) + ")");
  if (opt.microbatches < 1) throw Error("--microbatches must be at least 1 (got " + std::to_string(opt.microbatches) + ")");
  if (opt.stages * opt.dp != world_size)
    throw Error("--world " + std::to_string(world_size) + " is not --stages " + std::to_string(opt.stages) + " x --dp " +
                std::to_string(opt.dp) + " = " + std::to_string(opt.stages * opt.dp) +
                "; a pipeline run has one rank per stage per replica (drop --world)");
  if (batch % opt.microbatches != 0)
    throw Error("--batch " + std::to_string(batch) + " does not split into " + std::to_string(opt.microbatches) +
                " equal micro-batches; use a multiple of --microbatches (--batch is one pipeline replica's batch)");
  if (opt.fixed_costs) {
    const ActionCosts& c = *opt.fixed_costs;
    if (!(c.forward > 0 && c.backward > 0 && c.backward_input > 0 && c.backward_weight > 0))
      throw Error("fixed pipeline action costs must be greater than 0");
  }
  PipelinePlan plan;
  plan.options = opt;
  plan.schedule = make_schedule(opt.schedule, opt.stages, opt.microbatches, opt.chunks);
  plan.stages = partition_stages(spec, opt.stages * opt.chunks, opt.split);
  return plan;
}

// ---- the runtime ----

// One (stage, micro-batch) in flight: what its backward will need.
struct PipelineRank::MicroBatch {
  int64_t rows = 0, offset = 0;  // its rows of the batch
  Tensor input;                  // stages > 0: the received activation (rows, in)
  std::vector<Tensor> outs;      // each layer's output (rows, out_i); empty where checkpointing drops it
  Tensor probs;                  // last stage: the softmax (rows, C), from F to B
  std::vector<Tensor> douts;     // after I: the gradient at each layer's output, until W
  std::unique_ptr<GptCore> gpt;  // a GPT stage: this micro-batch's saved activations (B*T rows)
  std::vector<Tensor> gathered;  // an MLP under sequence parallelism: the column Linears' gathered inputs
  void release() {
    if (gpt) gpt->release();
    gathered.clear();
    input = Tensor();
    outs.clear();
    probs = Tensor();
    douts.clear();
  }
};

PipelineRank::PipelineRank(const PipelinePlan& plan, const ModelSpec& spec, int rank, Communicator& comm,
                           RankContext* ctx, MemoryTracker* memory, uint64_t seed, const OptimizerConfig& optimizer,
                           Device& device, ComputeObserver* observer, int tp, const StageSetup& setup)
    : plan_(plan), spec_(spec), precision_(setup.precision),
      dtype_(setup.precision == Precision::BF16 ? DType::BF16 : setup.precision == Precision::FP16 ? DType::F16 : DType::F32),
      // (Autocast: an MLP's stages pass 16-bit outputs on; a GPT's pass its float32 residual stream.)
      act_dtype_(is_mixed(setup.amp) && !spec.is_gpt() ? (setup.amp == Precision::BF16 ? DType::BF16 : DType::F16) : dtype_),
      rank_(rank), tp_(tp), pipe_rank_(rank / tp % plan.ranks()),
      replica_(rank / tp / plan.ranks()), tp_rank_(rank % tp),
      comm_(comm), ctx_(ctx), memory_(memory), device_(device),
      observer_(plan.options.fixed_costs ? nullptr : observer ? observer : ctx),
      stats_({kLossStatsDoubles}, MemCategory::Other, nullptr, DType::F64, device) {
  fuse_p2p_ = plan.options.fuse_p2p || comm.send_recv_fused();
  stage_ids_ = plan.stages_of_rank(pipe_rank_);
  if (plan.options.dp > 1 || (tp > 1 && tp < comm.world_size())) executor_ = std::make_shared<GroupExecutor>();
  if (tp > 1) {
    Communicator* group = &comm;  // the whole world is one TP group (one pipeline rank)
    if (tp < comm.world_size()) {
      std::vector<int> ranks;
      for (int t = 0; t < tp; t++) ranks.push_back(rank - tp_rank_ + t);
      tp_group_ = new_group(comm, ranks, kReplicaTag + 4 * pipe_rank_ + 1, executor_, device_,
                            "tp" + std::to_string(rank / tp));
      group = tp_group_.get();
    }
    tp_comm_ = std::make_unique<GroupTensorParallelComm>(*group);
  }
  sequence_parallel_ = setup.sequence_parallel && tp > 1;
  ContextParallelSpec cp = setup.cp;
  if (cp.on()) {  // the CP group: `degree` neighbouring data-parallel indices of this pipeline rank and TP index
    DTLAB_CHECK(spec.is_gpt() && plan.options.dp % cp.degree == 0,
                "a pipeline's context parallelism splits a GPT's sequence over data-parallel indices");
    cp_ = static_cast<int>(cp.degree);
    cp.rank = replica_ % cp_;
    std::vector<int> ranks;
    for (int c = 0; c < cp_; c++) ranks.push_back(world_rank(replica_ - static_cast<int>(cp.rank) + c, pipe_rank_));
    cp_exec_ = std::make_shared<GroupExecutor>();
    cp_group_ = new_group(comm, ranks, kContextTag, cp_exec_, device_,
                          "cp" + std::to_string((replica_ / cp_ * plan.ranks() + pipe_rank_) * tp + tp_rank_));
    cp_comm_ = std::make_unique<GroupContextParallelComm>(*cp_group_);
    cp_positions_ = cp.positions(spec.gpt.ctx);
  }
  // --ep: the stages hold this rank's experts (the same seed as every rank: the ranks holding the same
  // experts start equal, and equal to the whole model's), and talk over the stage's EP group: runs of
  // `ep` of the stage's ranks in the order (replica, TP rank), TP ranks first (Megatron's MoE parallel
  // folding with expert TP 1: under --tp the TP ranks route their own positions, sequence parallel).
  ModelSpec stage_spec = spec;
  if (setup.ep > 1) {
    const int dp = plan.options.dp, D = dp * tp;  // the stage's ranks
    DTLAB_CHECK(spec.is_gpt() && spec.gpt.moe.on() && D % setup.ep == 0,
                "a pipeline's expert parallelism splits a GPT's experts over a stage's ranks, --ep dividing them");
    ep_ = setup.ep;
    const int i = expert_index();
    ep_rank_ = i % ep_;
    auto at = [&](int j) { return (j / tp * plan.ranks() + pipe_rank_) * tp + j % tp; };  // stage index j's world rank
    std::vector<int> ranks, same;
    for (int e = 0; e < ep_; e++) ranks.push_back(at(i - ep_rank_ + e));
    for (int j = ep_rank_; j < D; j += ep_) same.push_back(at(j));
    ep_exec_ = std::make_shared<GroupExecutor>();
    const int index = i / ep_ * plan.ranks() + pipe_rank_;
    ep_group_ = new_group(comm, ranks, kExpertTag, ep_exec_, device_, "ep" + std::to_string(index));
    if (D > ep_)
      edp_group_ = new_group(comm, same, kExpertTag + 1, ep_exec_, device_, "edp" + std::to_string(ep_rank_ * plan.ranks() + pipe_rank_));
    ep_comm_ = std::make_unique<GroupExpertParallelComm>(*ep_group_);
    stage_spec.gpt.moe.ep = ep_;
    stage_spec.gpt.moe.ep_rank = ep_rank_;
  }
  for (int s : stage_ids_) {
    const StageRange r = plan.stages[static_cast<size_t>(s)];
    models_.push_back(std::make_unique<Model>(stage_spec, memory, seed, r.first, r.end, device,
                                              TensorParallelSpec{tp, tp_rank_, setup.sequence_parallel}));
    if (ep_comm_) models_.back()->set_expert_parallel_comm(ep_comm_.get());
    models_.back()->set_observer(observer_);
    models_.back()->set_layer_gate(ctx_);  // a stepped run pauses before each layer's F and B
    models_.back()->set_tensor_parallel_comm(tp_comm_.get());
    if (setup.init) load_stage(*models_.back(), r, *setup.init);
    if (setup.lora.rank > 0) models_.back()->enable_lora(setup.lora, seed);
    models_.back()->set_activation_checkpointing(setup.activation_checkpointing);
    if (cp_comm_) {
      models_.back()->set_context_parallel(cp);
      models_.back()->set_context_parallel_comm(cp_comm_.get());
    }
    // model.to(dtype) after LoRA and --init, as Trainer does for one rank; the optimizer keeps the
    // fp32 master copy of the stage's (trainable) parameters.
    if (is_mixed(precision_)) models_.back()->set_precision(precision_);
    models_.back()->set_amp(setup.amp);  // (torch.autocast: the parameters stay float32)
    optimizers_.push_back(std::make_unique<Optimizer>(optimizer, models_.back()->num_params(), memory, device));
    if (is_mixed(precision_)) optimizers_.back()->init_master(models_.back()->params16(), models_.back()->half_format());
  }
  mbs_.resize(stage_ids_.size() * static_cast<size_t>(plan.options.microbatches));
  shown_.assign(stage_ids_.size(), nullptr);
  // Megatron's embedding group: the ranks of a replica holding the first and the last stage.
  const int p = plan.ranks();
  if (spec.is_gpt() && p > 1 && (pipe_rank_ == 0 || pipe_rank_ == p - 1)) {
    std::vector<int> ranks = {world_rank(replica_, 0), world_rank(replica_, p - 1)};
    if (comm.world_size() == 2) {
      emb_comm_ = &comm;
    } else {
      if (!executor_) executor_ = std::make_shared<GroupExecutor>();
      emb_group_ = new_group(comm, ranks, kReplicaTag + 4 * p + 2, executor_, device_, "emb" + std::to_string(replica_ * tp_ + tp_rank_));
      emb_comm_ = emb_group_.get();
    }
  }
  if (plan.options.dp > 1) {
    std::vector<int> ranks;
    for (int d = 0; d < plan.options.dp; d++) ranks.push_back(world_rank(d, pipe_rank_));
    dp_group_ = new_group(comm, ranks, kReplicaTag + 4 * pipe_rank_, executor_, device_,
                          "dp" + std::to_string(pipe_rank_ * tp + tp_rank_));
  }
}

PipelineRank::~PipelineRank() {
  // A failed iteration can leave sends queued on the comm worker: their buffers must outlive them.
  std::vector<WorkPtr> pending = fused_;
  if (prefetched_) pending.push_back(prefetched_->work);
  for (auto& [work, buf] : sends_) pending.push_back(work);
  for (WorkPtr& work : pending) {
    try {
      work->wait();
    } catch (const std::exception&) {
    }
  }
  if (cp_exec_) cp_exec_->drain();  // a ring step of a failed pass may still hold the stages' buffers
  if (ep_exec_) ep_exec_->drain();
}

int64_t PipelineRank::num_params() const {
  int64_t n = 0;
  for (const auto& m : models_) n += m->num_params();
  return n;
}

PipelineRank::MicroBatch& PipelineRank::state(int stage, int mb) {
  return mbs_[static_cast<size_t>((stage / plan_.ranks()) * plan_.options.microbatches + mb)];
}

int PipelineRank::peer_of(int stage) const { return world_rank(replica_, rank_of_stage(stage, plan_.ranks())); }

int PipelineRank::tag_of(int stage, int mb, Dir dir) const {
  return kActivationTag + 2 * (stage * plan_.options.microbatches + mb) + dir;
}

void PipelineRank::load_stage(Model& stage, StageRange r, const Model& full) {
  if (spec_.is_gpt()) {  // the head's copy takes wte's values (--init's model is the whole host model)
    // Under LoRA the full model's base sits frozen beside its adapters (a host model: read in place).
    const std::vector<Parameter>& plain = full.lora() ? full.base_parameters() : full.parameters();
    // A 16-bit `full` (--precision): its values widened, exactly.
    DTLAB_CHECK(!plain.empty() && plain.front().offset == 0 && (full.mixed() ? plain.front().data16 != nullptr : plain.front().data != nullptr) &&
                    (full.lora() || full.num_params() == spec_.num_params()),
                "--init's full model must hold every parameter");
    std::vector<float> values(static_cast<size_t>(spec_.num_params()));
    if (full.mixed()) half_to_floats(values.data(), plain.front().data16, spec_.num_params(), full.half_format());
    else std::copy(plain.front().data, plain.front().data + spec_.num_params(), values.begin());
    upload_gpt_whole_values(stage, values.data());
    return;
  }
  // Under LoRA the full model's base sits frozen beside its adapters, in the plain model's layout.
  const std::vector<Parameter>& plain = full.lora() ? full.base_parameters() : full.parameters();
  DTLAB_CHECK(!plain.empty() && plain.front().offset == 0 && stage.num_params() <= spec_.num_params(),
              "--init's full model must hold every parameter");
  std::vector<float> widened;  // a 16-bit `full` (--precision): its values widened, exactly
  if (full.mixed()) {
    widened.resize(static_cast<size_t>(stage.num_params()));
    half_to_floats(widened.data(), plain.front().data16 + stage_param_offset(spec_, r), stage.num_params(), full.half_format());
  }
  const float* values = full.mixed() ? widened.data() : plain.front().data + stage_param_offset(spec_, r);  // a host model
  if (tp_ == 1) {
    stage.upload_params(values);
    return;
  }
  std::vector<float> local(static_cast<size_t>(stage.num_params()));
  shard_full_params(stage, values, local.data());
  stage.upload_params(local.data());
}

void PipelineRank::zero_grad() {
  for (auto& m : models_) m->zero_grad();
}

void PipelineRank::step(float inv_scale) {
  for (size_t k = 0; k < models_.size(); k++) {
    Model& m = *models_[k];
    if (m.num_params() == 0) continue;  // LoRA left this stage's layers unadapted
    if (m.mixed()) optimizers_[k]->step_mixed(m.params16(), m.grads16(), inv_scale);
    else optimizers_[k]->step(m.params(), m.grads());
  }
}

// In the stages' dtype: a 16-bit pipeline all-reduces its 16-bit gradients (DDP over a bf16 module).
void PipelineRank::reduce_gradients() {
  std::vector<WorkPtr> works;
  for (auto& m : models_) {
    if (m->num_params() == 0) continue;
    // --ep: the dense parameters over the stage's replicas, then the experts over the replicas
    // holding the same ones (each expert's gradient already sums its EP group's tokens).
    const bool split = ep_ > 1 && !expert_parameters(*m).empty();
    if (dp_group_ && !split)
      works.push_back(dp_group_->all_reduce(m->mixed() ? static_cast<void*>(m->grads16()) : m->grads(), m->num_params(), dtype_,
                                            ReduceOp::Sum));
    else if (dp_group_)
      reduce_runs(*m, *dp_group_, false, works);
  }
  for (auto& w : works) w->wait();
  // Only then the experts': the two groups share rank pairs (a replica and the next holding the same
  // experts), whose messages must not interleave in different orders on the two ranks.
  works.clear();
  for (auto& m : models_)
    if (ep_ > 1 && edp_group_ && m->num_params() > 0 && !expert_parameters(*m).empty()) reduce_runs(*m, *edp_group_, true, works);
  for (auto& w : works) w->wait();
  // (Under LoRA the tied weight is frozen: nothing to sum.)
  if (spec_.is_gpt() && plan_.stages.size() > 1 && !models_.front()->lora()) reduce_embedding_grads();
}

void PipelineRank::reduce_runs(Model& m, Communicator& group, bool experts, std::vector<WorkPtr>& works) {
  for (const auto& [begin, end] : parameter_runs(m, experts)) {
    void* g = m.mixed() ? static_cast<void*>(m.grads16() + begin) : static_cast<void*>(m.grads() + begin);
    works.push_back(group.all_reduce(g, end - begin, dtype_, ReduceOp::Sum));
  }
}

// After the data-parallel sum, as Megatron's finalize_model_grads runs _allreduce_embedding_grads
// (docs/course_sources.md §6c): wte's gradient holds the embedding's use, lm_head's copy the head's;
// their sum is the tied weight's gradient, which both copies then step with.
void PipelineRank::reduce_embedding_grads() {
  auto tied = [](Model& m) -> Parameter& {
    for (Parameter& q : m.parameters())
      if (q.name == "transformer.wte.weight" || q.name == "lm_head.weight") return q;
    throw Error("a GPT end stage without its tied weight");
  };
  // Under --precision the two 16-bit gradients are summed in 16 bits (the stages' dtype, as the
  // data-parallel sum above).
  const int64_t n = spec_.gpt.vocab * spec_.gpt.embd;
  if (plan_.ranks() == 1) {  // every stage here (--chunks): the two copies are summed in place
    Parameter& a = tied(*models_.front());
    Parameter& b = tied(*models_.back());
    if (mixed()) {  // widened, added, rounded once, on the rank's device
      device_.accumulate_half(b.grad16, a.grad16, n, false, models_.front()->half_format());
      device_.copy(a.grad16, b.grad16, n * static_cast<int64_t>(sizeof(uint16_t)));
      return;
    }
    device_.accumulate(b.grad, a.grad, n, false);  // on the rank's device (a GPU's memory is not the host's)
    device_.copy(a.grad, b.grad, n * static_cast<int64_t>(sizeof(float)));
    return;
  }
  if (!emb_comm_) return;  // a middle stage
  Parameter& q = tied(pipe_rank_ == 0 ? *models_.front() : *models_.back());
  emb_comm_->all_reduce(mixed() ? static_cast<void*>(q.grad16) : static_cast<void*>(q.grad), n, dtype_, ReduceOp::Sum)->wait();
}

// Where stage r's trainable parameters sit in `full`'s flat buffer: the weights and biases, or under
// LoRA the adapters (both in layer order, so a stage's are one contiguous slice; empty for a stage
// LoRA leaves unadapted).
namespace {

struct FlatSlice {
  int64_t offset = 0, numel = 0;
};
FlatSlice stage_slice(const Model& full, StageRange r) {
  FlatSlice out;
  if (full.is_gpt()) {  // under LoRA: the adapters of the stage's blocks, named transformer.h.L.attn.c_attn.*
    const GptRange g{r.first, r.end};
    constexpr std::string_view kBlock = "transformer.h.";
    for (const Parameter& q : full.parameters()) {
      DTLAB_CHECK(full.lora() && q.name.starts_with(kBlock), "a GPT's stage slice names its adapters (LoRA)");
      const int l = std::atoi(q.name.c_str() + kBlock.size());
      if (l < g.first_block() || l >= g.end_block(full.spec().gpt)) continue;
      if (out.numel == 0) out.offset = q.offset;
      out.numel += q.numel;
    }
    return out;
  }
  for (int i = 0; i < full.num_layers(); i++) {
    const Layer& L = full.layer(i);
    if (L.kind != LayerKind::Linear || L.seq_index / 2 < r.first || L.seq_index / 2 >= r.end) continue;
    for (int p : full.trainable_of(L)) {
      const Parameter& q = full.parameters()[static_cast<size_t>(p)];
      if (out.numel == 0) out.offset = q.offset;
      out.numel += q.numel;
    }
  }
  return out;
}

}  // namespace

void PipelineRank::gather_parameters(Model* full) {
  // The replicas hold the same parameters; under --ep the EP groups of replica 0's ranks put their
  // experts together.
  if (replica_ != 0 && !(ep_ > 1 && expert_index() / ep_ * ep_ < tp_)) return;
  DTLAB_CHECK(rank_ != 0 || full, "rank 0 gathers the stages into a full model; pass it");
  const int S = static_cast<int>(plan_.stages.size());
  // The communicator moves the device's memory (NCCL nothing else): host values go through it.
  const auto send_host = [&](const float* v, int64_t n, int tag) {
    if (device_.is_host()) return comm_.send(v, n, DType::F32, 0, tag)->wait();
    Tensor staged({n}, MemCategory::Other, nullptr, DType::F32, device_);
    device_.upload(staged.f32(), v, n * static_cast<int64_t>(sizeof(float)));
    comm_.send(staged.f32(), n, DType::F32, 0, tag)->wait();
  };
  const auto recv_host = [&](float* v, int64_t n, int from, int tag) {
    if (device_.is_host()) return comm_.recv(v, n, DType::F32, from, tag)->wait();
    Tensor staged({n}, MemCategory::Other, nullptr, DType::F32, device_);
    comm_.recv(staged.f32(), n, DType::F32, from, tag)->wait();
    device_.download(v, staged.f32(), n * static_cast<int64_t>(sizeof(float)));
  };
  // A 16-bit full model (Trainer's one-rank model under --precision) has no float32 parameters: the
  // stages land in a float32 copy of them, uploaded (rounded back, exactly) at the end.
  std::vector<float> widened;
  if (rank_ == 0 && full->mixed()) widened = full->host_params();
  float* const flat = rank_ != 0 ? nullptr : full->mixed() ? widened.data() : full->params();
  for (size_t k = 0; k < models_.size(); k++) {
    const int s = stage_ids_[k];
    const Model& m = *models_[k];
    if (m.num_params() == 0) continue;  // LoRA left this stage's layers unadapted
    if (spec_.is_gpt() && !m.lora()) {  // the stage whole (its TP group's shards put together), placed by name on rank 0
      Communicator& tp_group = tp_group_ ? *tp_group_ : comm_;
      std::vector<float> values;
      if (ep_ > 1 && !expert_parameters(m).empty()) {  // the stage's experts put together, then its TP shards
        values = gather_expert_parallel_params(m, *ep_group_, device_);
        if (replica_ != 0) continue;  // (an EP member of replica 0's groups: its experts went into the gather)
        if (tp_ > 1) values = gather_expert_tensor_parallel_params(m, values, tp_group);
      } else {
        if (replica_ != 0) continue;
        values = tp_ > 1 ? gather_tensor_parallel_params(m, tp_group) : m.host_params();
      }
      if (rank_ == 0) scatter_gpt_stage(plan_.stages[static_cast<size_t>(s)], values.data(), *full, flat);
      else if (tp_rank_ == 0) send_host(values.data(), static_cast<int64_t>(values.size()), kGatherTag + s);
      continue;
    }
    if (replica_ != 0) continue;
    float* dst = rank_ == 0 ? flat + stage_slice(*full, plan_.stages[static_cast<size_t>(s)]).offset : nullptr;
    if (tp_ > 1) {  // the TP group puts its shards together; its first rank sends the stage on
      const std::vector<float> stage = gather_tensor_parallel_params(m, tp_group_ ? *tp_group_ : comm_);
      if (rank_ == 0) std::copy(stage.begin(), stage.end(), dst);
      else if (tp_rank_ == 0) send_host(stage.data(), static_cast<int64_t>(stage.size()), kGatherTag + s);
    } else if (rank_ == 0) {
      m.download_params(dst);  // a host buffer
    } else if (m.mixed()) {  // its 16-bit values, widened (exact): rank 0 rounds them back
      const std::vector<float> values = m.host_params();
      send_host(values.data(), m.num_params(), kGatherTag + s);
    } else {
      comm_.send(m.params(), m.num_params(), DType::F32, 0, kGatherTag + s)->wait();
    }
  }
  if (rank_ != 0) return;
  for (int s = 0; s < S; s++) {
    if (spec_.is_gpt() && !full->lora()) {  // a stage's whole flat buffer, placed by name
      if (peer_of(s) == 0) continue;
      const StageRange r = plan_.stages[static_cast<size_t>(s)];
      std::vector<float> values(static_cast<size_t>(stage_num_params(spec_, r)));
      recv_host(values.data(), static_cast<int64_t>(values.size()), peer_of(s), kGatherTag + s);
      scatter_gpt_stage(r, values.data(), *full, flat);
      continue;
    }
    const FlatSlice slice = stage_slice(*full, plan_.stages[static_cast<size_t>(s)]);
    if (peer_of(s) == 0 || slice.numel == 0) continue;
    const int64_t n = slice.numel;
    recv_host(flat + slice.offset, n, peer_of(s), kGatherTag + s);
  }
  if (full->mixed()) full->upload_params(widened.data());
}

std::vector<const GptCore*> PipelineRank::view_cores() const {
  std::vector<const GptCore*> out;
  if (shown_last_ < shown_.size() && shown_[shown_last_]) out.push_back(shown_[shown_last_]);
  for (size_t k = 0; k < shown_.size(); k++)
    if (k != shown_last_ && shown_[k]) out.push_back(shown_[k]);
  return out;
}

std::vector<std::unique_ptr<GptCore>> PipelineRank::take_view_cores() {
  std::vector<std::unique_ptr<GptCore>> out;
  for (const GptCore* g : view_cores())
    for (MicroBatch& st : mbs_)
      if (g && st.gpt.get() == g) {
        st.gpt->release();  // (an aborted iteration's: its tensors go now)
        out.push_back(std::move(st.gpt));
      }
  std::fill(shown_.begin(), shown_.end(), nullptr);
  return out;
}

void PipelineRank::scatter_gpt_stage(StageRange r, const float* values, const Model& full, float* flat) const {
  DTLAB_CHECK(full.num_params() == spec_.num_params(), "the GPT's stages gather into the whole model");
  const std::vector<Parameter> ps = gpt_stage_parameters(spec_.gpt, {r.first, r.end});
  const std::vector<int64_t> to = gpt_stage_sources(spec_.gpt, {r.first, r.end});
  for (size_t k = 0; k < ps.size(); k++)
    if (ps[k].name != "lm_head.weight") std::copy_n(values + ps[k].offset, ps[k].numel, flat + to[k]);  // equal to the first stage's wte
}

int64_t PipelineRank::boundary_rows(const MicroBatch& st) const {
  // An MLP under sequence parallelism: this TP rank's rows of the micro-batch padded to a multiple of tp.
  if (!spec_.is_gpt()) return sequence_parallel_ ? (st.rows + tp_ - 1) / tp_ : st.rows;
  // This rank's positions: T / cp of each sample, and of those this TP rank's under sequence parallelism.
  return st.rows * (spec_.gpt.ctx / cp_) / (sequence_parallel_ ? tp_ : 1);
}
int64_t PipelineRank::in_width(const Model& m) const { return spec_.is_gpt() ? spec_.gpt.embd : m.layer(0).in_features; }
int64_t PipelineRank::out_width(const Model& m) const {
  return spec_.is_gpt() ? spec_.gpt.embd : m.layer(m.num_layers() - 1).out_features;
}

Tensor PipelineRank::receive(int stage, int mb, Dir dir, int64_t rows, int64_t width) {
  const int from = peer_of(dir == kForward ? stage - 1 : stage + 1);
  const int tag = tag_of(stage, mb, dir);
  if (prefetched_ && prefetched_->tag == tag) {  // posted with the previous action's send
    Prefetched p = std::move(*prefetched_);
    prefetched_.reset();
    p.work->wait();  // bounded by the watchdog
    return std::move(p.data);
  }
  if (from == rank_) {  // both stages live here (one rank per pipeline): a hand-off, no message
    auto it = local_.find(tag);
    DTLAB_CHECK(it != local_.end(), "a stage's input is missing; the schedule runs an action before its dependency");
    Tensor t = std::move(it->second);
    local_.erase(it);
    return t;
  }
  Tensor t = activation(rows, width);
  comm_.recv(t.raw(), rows * width, act_dtype_, from, tag)->wait();  // bounded by the watchdog
  return t;
}

// Sends `data` to `stage` (its owner must keep it until the Work completes). Null when `stage`
// lives on this rank: the data is copied into the hand-off instead. With fused point-to-point
// (NCCL, where a send waits for the peer's receive) the receive of this rank's next action `next`
// is posted with it as one operation, as torch's schedules batch_isend_irecv a step's messages: two
// neighbours each sending before receiving (1F1B's steady state) would otherwise wait on each other.
WorkPtr PipelineRank::send(int stage, int mb, Dir dir, const Tensor& data, const Action* next) {
  const int to = peer_of(stage);
  const int tag = tag_of(stage, mb, dir);
  if (to == rank_) {
    Tensor copy(data.shape(), MemCategory::Activations, memory_, data.dtype(), device_);
    device_.copy(copy.raw(), data.raw(), data.nbytes());
    local_[tag] = std::move(copy);
    return nullptr;
  }
  const int last = static_cast<int>(plan_.stages.size()) - 1;
  if (fuse_p2p_ && next && !prefetched_) {
    const bool fwd = next->type == ActionType::Forward && next->stage > 0;
    const bool bwd = (next->type == ActionType::Backward || next->type == ActionType::BackwardInput) && next->stage < last;
    const int from = fwd ? peer_of(next->stage - 1) : bwd ? peer_of(next->stage + 1) : rank_;
    if (from != rank_) {
      const Model& m = *models_[static_cast<size_t>(next->stage / plan_.ranks())];
      const int64_t rows = boundary_rows(state(next->stage, next->mb));
      const int64_t width = fwd ? in_width(m) : out_width(m);
      Prefetched p{tag_of(next->stage, next->mb, fwd ? kForward : kBackward), activation(rows, width), nullptr};
      p.work = comm_.send_recv(data.raw(), data.numel(), to, tag, p.data.raw(), rows * width, from, p.tag, act_dtype_);
      WorkPtr w = p.work;
      prefetched_ = std::move(p);
      return w;
    }
  }
  return comm_.send(data.raw(), data.numel(), act_dtype_, to, tag);
}

// Layer i's input in a micro-batch's forward: the previous layer's output, or the stage's input. Null
// where checkpointing dropped it: only a ReLU's, whose backward reads its output instead.
// A 16-bit first stage reads its micro-batch's rows rounded to 16 bits (x.to(dtype)), kept in `input`.
const void* PipelineRank::layer_input(const MicroBatch& st, int stage, int i) const {
  if (i == 0) return stage == 0 && !half_acts() && !sequence_parallel_ ? static_cast<const void*>(x_ + st.offset * spec_.in_features()) : st.input.raw();
  return st.outs[static_cast<size_t>(i - 1)].raw();
}

void* PipelineRank::recompute_buffer(int64_t n) {
  if (recompute_.numel() < n) recompute_ = Tensor({n}, MemCategory::Activations, memory_, act_dtype_, device_);
  return recompute_.raw();
}

Tensor PipelineRank::activation(int64_t rows, int64_t width) const {
  return Tensor({rows, width}, MemCategory::Activations, memory_, act_dtype_, device_);
}

void PipelineRank::layer_forward(Model& m, int i, void* out, const void* in, int64_t rows, bool recompute) {
  if (sequence_parallel_) m.sp_stage_forward(i, out, in, recompute);  // (an MLP's: the rows sp_stage_begin set)
  else if (m.half_acts()) m.layer_forward16(i, static_cast<uint16_t*>(out), static_cast<const uint16_t*>(in), rows, recompute);
  else if (recompute) m.layer_recompute(i, static_cast<float*>(out), static_cast<const float*>(in), rows);
  else m.layer_forward(i, static_cast<float*>(out), static_cast<const float*>(in), rows);
}

const Tensor* PipelineRank::gpt_forward(int stage, int mb) {
  MicroBatch& st = state(stage, mb);
  Model& model = *models_[static_cast<size_t>(stage / plan_.ranks())];
  if (!st.gpt) st.gpt = model.gpt_activations();
  shown_[shown_last_ = static_cast<size_t>(stage / plan_.ranks())] = st.gpt.get();
  // Tq: this rank's positions per sample (T / cp). The first stage reads every token of its samples,
  // the last stage's logits and targets are its positions'.
  const int64_t T = spec_.gpt.ctx, Tq = T / cp_, V = spec_.gpt.vocab, R = st.rows * Tq;
  // (Under --precision the stages pass 16-bit tensors; the logits come back in float32.)
  const void* out = model.gpt_forward(*st.gpt, stage == 0 ? tok_ + st.offset * T : nullptr,
                                      stage == 0 ? nullptr : st.input.raw(), st.rows);
  if (stage + 1 < static_cast<int>(plan_.stages.size())) {
    // The last block's output, sent on; it stays with the micro-batch's activations until its B.
    return &st.gpt->output();
  }
  st.probs = Tensor({R, V}, MemCategory::Activations, memory_, DType::F32, device_);
  ComputeScope scope(observer_, ComputeKind::Loss, -1, cross_entropy_forward_cost(R, V));
  device_.cross_entropy_forward(st.probs.f32(), stats_.f64(), static_cast<const float*>(out), y_ + st.offset * Tq, R, V);
  it_.samples += static_cast<double>(R);  // positions: the loss is their mean
  return nullptr;
}

Tensor PipelineRank::gpt_backward(int stage, int mb, Tensor dout, bool input_only) {
  MicroBatch& st = state(stage, mb);
  Model& model = *models_[static_cast<size_t>(stage / plan_.ranks())];
  const int64_t Tq = spec_.gpt.ctx / cp_, V = spec_.gpt.vocab, R = st.rows * Tq;
  shown_[shown_last_ = static_cast<size_t>(stage / plan_.ranks())] = st.gpt.get();
  if (stage + 1 == static_cast<int>(plan_.stages.size())) {
    dout = Tensor({R, V}, MemCategory::Activations, memory_, DType::F32, device_);
    ComputeScope scope(observer_, ComputeKind::LossBackward, -1, cross_entropy_backward_cost(R, V));
    device_.cross_entropy_backward(dout.f32(), st.probs.f32(), y_ + st.offset * Tq, R, V, loss_scale_);
  }
  st.probs = Tensor();
  // MoE's loss weighs as this micro-batch's mean cross-entropy over this rank's positions (under --cp
  // GptCore multiplies each rank's share of its CP group's aux gradient back by cp, as under DDP).
  model.set_aux_grad_scale(loss_scale_ * static_cast<float>(R));
  // ZB-H1's I leaves the Linear layers' weight gradients to W, which releases the activations.
  const void* dinp = input_only ? model.gpt_backward_input(*st.gpt, dout.raw()) : model.gpt_backward(*st.gpt, dout.raw());
  Tensor out;
  if (stage > 0) {
    out = activation(boundary_rows(st), spec_.gpt.embd);
    device_.copy(out.raw(), dinp, out.nbytes());
  }
  if (!input_only) st.release();
  return out;  // the input gradient (empty on stage 0)
}

const Tensor* PipelineRank::forward(int stage, int mb) {
  if (spec_.is_gpt()) return gpt_forward(stage, mb);
  MicroBatch& st = state(stage, mb);
  Model& model = *models_[static_cast<size_t>(stage / plan_.ranks())];
  const bool sp = sequence_parallel_;  // (Model::forward's sequence parallelism, layer by layer)
  if (sp) model.sp_stage_begin(st.rows, &st.gathered);
  if (stage == 0 && (half_acts() || sp)) {  // the batch as x.to(dtype), as the one-rank 16-bit model rounds it
    const int64_t D = spec_.in_features();
    Tensor whole = half_acts() ? activation(st.rows, D) : Tensor();
    if (half_acts()) device_.narrow_half(whole.u16(), x_ + st.offset * D, st.rows * D, model.half_format());
    if (sp) {  // this TP rank's rows of it (scatter_to_sequence_parallel_region)
      st.input = activation(boundary_rows(st), D);
      model.sp_stage_split(st.input.raw(), half_acts() ? whole.raw() : static_cast<const void*>(x_ + st.offset * D), D);
    } else {
      st.input = std::move(whole);
    }
  }
  const void* in = layer_input(st, stage, 0);
  for (int i = 0; i < model.num_layers(); i++) {
    const int64_t width = model.layer(i).out_features, rows = sp ? model.sp_stage_rows(i, true) : st.rows;
    // Checkpointing: a Linear inside a block writes to the shared buffer its ReLU reads at once.
    const bool keep = model.keeps_output(i);
    st.outs.push_back(keep ? activation(rows, width) : Tensor());
    void* out = keep ? st.outs.back().raw() : recompute_buffer(rows * width);
    model.gate_layer(i, false);
    if (st.rows > 0) layer_forward(model, i, out, in, st.rows);
    in = out;
  }
  // The output stays here until this stage's backward, long after the next stage received it.
  if (stage + 1 < static_cast<int>(plan_.stages.size())) return &st.outs.back();
  const int64_t C = spec_.out_features();
  st.probs = Tensor({st.rows, C}, MemCategory::Activations, memory_, DType::F32, device_);
  Tensor gathered;  // sequence parallel: every TP rank's rows of the logits (gather_from_sequence_parallel_region)
  if (sp && st.rows > 0) {
    gathered = activation(model.sp_stage_padded_rows(), C);
    model.sp_stage_gather(gathered.raw(), in, C, model.layer(model.num_layers() - 1).seq_index);
    in = gathered.raw();
  }
  const float* logits = static_cast<const float*>(in);
  Tensor widened;  // 16 bits: the logits widened, so the loss runs in float32 (Model::forward's way)
  if (half_acts()) {
    widened = Tensor({st.rows, C}, MemCategory::Activations, memory_, DType::F32, device_);
    device_.widen_half(widened.f32(), static_cast<const uint16_t*>(in), st.rows * C, model.half_format());
    logits = widened.f32();
  }
  ComputeScope scope(observer_, ComputeKind::Loss, -1, cross_entropy_forward_cost(st.rows, C));
  // The loss and correct count accumulate on the device; run_iteration reads them once at its end.
  device_.cross_entropy_forward(st.probs.f32(), stats_.f64(), logits, y_ + st.offset, st.rows, C);
  it_.samples += static_cast<double>(st.rows);
  return nullptr;
}

Tensor PipelineRank::backward(int stage, int mb, Tensor dout, bool input_only) {
  if (spec_.is_gpt()) return gpt_backward(stage, mb, std::move(dout), input_only);
  MicroBatch& st = state(stage, mb);
  Model& model = *models_[static_cast<size_t>(stage / plan_.ranks())];
  const bool sp = sequence_parallel_;
  if (sp) model.sp_stage_begin(st.rows, &st.gathered);
  if (stage + 1 == static_cast<int>(plan_.stages.size())) {
    const int64_t C = spec_.out_features();
    dout = Tensor({st.rows, C}, MemCategory::Activations, memory_, DType::F32, device_);
    ComputeScope scope(observer_, ComputeKind::LossBackward, -1, cross_entropy_backward_cost(st.rows, C));
    device_.cross_entropy_backward(dout.f32(), st.probs.f32(), y_ + st.offset, st.rows, C, loss_scale_);
    if (half_acts()) {  // the (scaled) loss gradient rounded to 16 bits, as Model::backward takes it
      Tensor d16 = activation(st.rows, C);
      device_.narrow_half(d16.u16(), dout.f32(), st.rows * C, model.half_format());
      dout = std::move(d16);
    }
    if (sp) {  // this TP rank's rows of it, as Model::backward splits them
      Tensor mine = activation(boundary_rows(st), C);
      model.sp_stage_split(mine.raw(), dout.raw(), C);
      dout = std::move(mine);
    }
  }
  st.probs = Tensor();
  const int n = model.num_layers();
  if (input_only) st.douts.resize(static_cast<size_t>(n));
  for (int i = n - 1; i >= 0; i--) {
    const Layer& L = model.layer(i);
    const bool input_grad = i > 0 || stage > 0;  // the model's first layer has no input gradient
    const int64_t rows_in = sp ? model.sp_stage_rows(i, false) : st.rows, rows_out = sp ? model.sp_stage_rows(i, true) : st.rows;
    Tensor dinp = input_grad ? activation(rows_in, L.in_features) : Tensor();
    const void* in = layer_input(st, stage, i);
    const void* out = st.outs[static_cast<size_t>(i)].raw();
    if (model.activation_checkpointing() && model.keeps_output(i)) {
      // torch.utils.checkpoint: backward reaching a block runs its forward again first (as
      // Model::backward does): the Linear from the block's kept input, the ReLU in place after it.
      const int first = L.kind == LayerKind::ReLU ? i - 1 : i;
      void* buf = recompute_buffer(rows_out * L.out_features);
      for (int j = first; j <= i && st.rows > 0; j++) layer_forward(model, j, buf, j == first ? layer_input(st, stage, j) : buf, st.rows, true);
      out = buf;
    }
    model.gate_layer(i, true);
    Tensor gout;  // ZB-H1 under sequence parallelism: a row-parallel Linear's gathered output gradient, for its W
    if (st.rows > 0 && sp) {
      if (!input_only) {
        model.sp_stage_backward(i, dinp.raw(), dout.raw(), in, out);
      } else {
        if (L.kind == LayerKind::Linear && L.tp == TpRole::Row) gout = activation(model.sp_stage_padded_rows(), L.out_features);
        if (input_grad || !gout.empty()) model.sp_stage_backward_input(i, dinp.raw(), dout.raw(), out, gout.raw());
      }
    } else if (st.rows > 0 && model.half_acts()) {
      using u16 = uint16_t;
      if (!input_only) model.layer_backward16(i, static_cast<u16*>(dinp.raw()), static_cast<const u16*>(dout.raw()), static_cast<const u16*>(in),
                                              static_cast<const u16*>(out), st.rows);
      else if (input_grad) model.layer_backward_input16(i, static_cast<u16*>(dinp.raw()), static_cast<const u16*>(dout.raw()),
                                                        static_cast<const u16*>(out), st.rows);
    } else if (st.rows > 0) {
      if (!input_only) model.layer_backward(i, dinp.f32(), dout.f32(), static_cast<const float*>(in), static_cast<const float*>(out), st.rows);
      else if (input_grad) model.layer_backward_input(i, dinp.f32(), dout.f32(), static_cast<const float*>(out), st.rows);
    }
    if (input_only) st.douts[static_cast<size_t>(i)] = gout.empty() ? std::move(dout) : std::move(gout);  // W needs it
    dout = std::move(dinp);
  }
  if (!input_only) st.release();
  return dout;  // the input gradient (empty on stage 0)
}

void PipelineRank::backward_weight(int stage, int mb) {
  MicroBatch& st = state(stage, mb);
  Model& model = *models_[static_cast<size_t>(stage / plan_.ranks())];
  if (spec_.is_gpt()) {
    DTLAB_CHECK(st.gpt != nullptr, "W ran before its I; the schedule is wrong");
    model.gpt_backward_weight(*st.gpt);
    st.release();
    return;
  }
  DTLAB_CHECK(st.douts.size() == static_cast<size_t>(model.num_layers()), "W ran before its I; the schedule is wrong");
  if (sequence_parallel_) model.sp_stage_begin(st.rows, &st.gathered);
  for (int i = 0; i < model.num_layers() && st.rows > 0; i++) {
    const void* dout = st.douts[static_cast<size_t>(i)].raw();
    if (sequence_parallel_)
      model.sp_stage_backward_weight(i, dout, layer_input(st, stage, i));
    else if (model.half_acts())
      model.layer_backward_weight16(i, static_cast<const uint16_t*>(dout), static_cast<const uint16_t*>(layer_input(st, stage, i)), st.rows);
    else
      model.layer_backward_weight(i, static_cast<const float*>(dout), static_cast<const float*>(layer_input(st, stage, i)), st.rows);
  }
  st.release();
}

void PipelineRank::record_action(const Action& a, int step, int index, int64_t wall0, double model0, int64_t bytes) {
  if (!ctx_) return;
  const double model1 = ctx_->compute_clock();
  const int t = static_cast<int>(a.type);
  if (index == 0) it_.first_begin = model0;
  it_.last_end = model1;
  it_.busy += model1 - model0;
  it_.time[t] += model1 - model0;
  it_.count[t] += 1;
  TraceRecorder* rec = ctx_->recorder();
  if (!rec || !rec->enabled()) return;
  Event e(EventKind::PipelineAction, Lane::Compute, wall0, rec->now_ns(), model0, model1);
  e.pipe = PipelineActionInfo{static_cast<int16_t>(a.stage),
                              static_cast<int16_t>(a.mb),
                              a.type,
                              static_cast<int16_t>(step),
                              static_cast<int16_t>(index),
                              static_cast<int16_t>(plan_.stages.size()),
                              static_cast<int16_t>(plan_.options.microbatches),
                              static_cast<int16_t>(plan_.ranks()),
                              static_cast<int16_t>(replica_),
                              bytes};
  ctx_->record(e);
}

PipelineRankIteration PipelineRank::run_iteration(const float* x, const int64_t* y, int64_t B, float loss_scale,
                                                  const int64_t* tok, const int64_t* y_host) {
  DTLAB_CHECK(!spec_.is_gpt() || tok, "a GPT pipeline reads token ids");
  x_ = x;
  tok_ = tok;
  y_ = y;
  if (cp_ > 1) {  // the targets of this rank's positions of each sample, in its rows' order, picked on the host
    const int64_t T = spec_.gpt.ctx, Tq = static_cast<int64_t>(cp_positions_.size()), I64 = sizeof(int64_t);
    const int64_t* all = device_.is_host() ? y : y_host;
    if (!all) {
      cp_all_.resize(static_cast<size_t>(B * T));
      device_.download(cp_all_.data(), y, B * T * I64);
      all = cp_all_.data();
    }
    cp_targets_.resize(static_cast<size_t>(B * Tq));
    for (int64_t b = 0; b < B; b++)
      for (int64_t i = 0; i < Tq; i++) cp_targets_[static_cast<size_t>(b * Tq + i)] = all[b * T + cp_positions_[static_cast<size_t>(i)]];
    y_ = cp_targets_.data();
    if (!device_.is_host()) {
      if (cp_targets_dev_.numel() < B * Tq) cp_targets_dev_ = Tensor({B * Tq}, MemCategory::Other, nullptr, DType::I64, device_);
      device_.upload(cp_targets_dev_.raw(), cp_targets_.data(), B * Tq * I64);
      y_ = cp_targets_dev_.i64();
    }
  }
  loss_scale_ = loss_scale;
  it_ = {};
  stats_.zero();
  const int m = plan_.options.microbatches;
  const int last = static_cast<int>(plan_.stages.size()) - 1;
  for (int s : stage_ids_)
    for (int mb = 0; mb < m; mb++) {  // torch.tensor_split: the first B % m micro-batches get one row more
      MicroBatch& st = state(s, mb);
      st.rows = B / m + (mb < B % m ? 1 : 0);
      st.offset = mb * (B / m) + std::min<int64_t>(mb, B % m);
    }
  const auto& row = plan_.schedule.order[static_cast<size_t>(pipe_rank_)];
  int index = 0, inflight = 0, inflight_w = 0;
  for (size_t t = 0; t < row.size(); t++) {
    if (!row[t]) continue;  // a bubble in the grid; the runtime simply waits for its input
    const Action a = *row[t];
    MicroBatch& st = state(a.stage, a.mb);
    const Model& model = *models_[static_cast<size_t>(a.stage / plan_.ranks())];
    // The stepper's action gate (the app steps a pipeline one grid step at a time), then the input.
    if (ctx_ && !ctx_->gate_action(static_cast<int32_t>(t), action_str(a)))
      throw CommError("rank " + std::to_string(rank_) + " stopped before pipeline action " + action_str(a) + ": the run was aborted");
    // The action starts once its input is here: the wait before it is the bubble.
    Tensor dout;
    if (a.type == ActionType::Forward && a.stage > 0)
      st.input = receive(a.stage, a.mb, kForward, boundary_rows(st), in_width(model));
    if ((a.type == ActionType::Backward || a.type == ActionType::BackwardInput) && a.stage < last)
      dout = receive(a.stage, a.mb, kBackward, boundary_rows(st), out_width(model));
    if (ctx_) ctx_->set_activity("pipeline action " + action_str(a));
    const int64_t wall0 = ctx_ && ctx_->recorder() ? ctx_->recorder()->now_ns() : 0;
    const double model0 = ctx_ ? ctx_->compute_clock() : 0;
    // Compute, then (with fixed costs) charge the action's time, then send what it produced: the
    // message leaves at the end of the compute on the modeled clock.
    const auto& fixed = plan_.options.fixed_costs;
    const auto charge = [&] {
      if (ctx_ && fixed) ctx_->advance_compute_clock(model0 + cost_of(a.type, *fixed));
    };
    int64_t bytes = 0;
    const Action* next = nullptr;  // this rank's next action (its input may travel with this send)
    for (size_t u = t + 1; u < row.size() && !next; u++)
      if (row[u]) next = &*row[u];
    switch (a.type) {
      case ActionType::Forward: {
        const Tensor* out = forward(a.stage, a.mb);
        charge();
        if (out) {
          if (WorkPtr w = send(a.stage + 1, a.mb, kForward, *out, next); w && fuse_p2p_) fused_.push_back(std::move(w));
          bytes = out->nbytes();
        }
        inflight++, inflight_w++;
        break;
      }
      case ActionType::Backward:
      case ActionType::BackwardInput: {
        const bool input_only = a.type == ActionType::BackwardInput;
        Tensor dinp = backward(a.stage, a.mb, std::move(dout), input_only);
        charge();
        if (a.stage > 0) {
          bytes = dinp.nbytes();
          if (WorkPtr w = send(a.stage - 1, a.mb, kBackward, dinp, next)) sends_.emplace_back(std::move(w), std::move(dinp));
        }
        inflight--;
        if (!input_only) inflight_w--;
        break;
      }
      case ActionType::BackwardWeight:
        backward_weight(a.stage, a.mb);
        charge();
        inflight_w--;
        break;
      default:
        throw Error("the pipeline runtime runs F, B, I and W; " + action_str(a) + " is a communication action");
    }
    it_.peak_inflight = std::max<double>(it_.peak_inflight, inflight);
    it_.peak_inflight_w = std::max<double>(it_.peak_inflight_w, inflight_w);
    record_action(a, static_cast<int>(t), index++, wall0, model0, bytes);
    // Input gradients already sent free their buffers (without a wait: nothing blocks on a send).
    std::erase_if(sends_, [](const auto& s) { return s.first->is_completed(); });
  }
  for (auto& [work, buf] : sends_) work->wait();
  sends_.clear();
  for (WorkPtr& w : fused_) w->wait();  // forward sends that carried a receive
  fused_.clear();
  DTLAB_CHECK(!prefetched_, "a receive was posted for an action the schedule never ran");
  double stats[kLossStatsDoubles];
  device_.download(stats, stats_.raw(), sizeof stats);
  it_.loss_sum = stats[0];
  it_.correct = stats[1];
  return it_;
}

}  // namespace dtlab
