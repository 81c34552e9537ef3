// The replica strategies' hooks of the one per-rank loop (engine/train/rank_strategy.h): single,
// ddp and fsdp hold a whole model replica (or with --tp, its shard), run the same forward, loss and
// backward on their batch, and differ in what happens around it:
//   single  nothing: the one-rank reference
//   ddp     DistributedDataParallel: buckets prepared before forward, gradients marked ready in
//           backward (the bucket all-reduces overlap it), the buckets' averages written back after
//   fsdp    FullyShardedDataParallel: sharded zero_grad, the reduce-scatters finished after backward,
//           the optimizer on the owned shard, the full parameters gathered back at the end
// --tp joins the rank's TP group first (the model's f and g), and DDP/FSDP work over its DP group.
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/comm/group.h"
#include "engine/core/check.h"
#include "engine/io/checkpoint.h"
#include "engine/parallel/context_parallel.h"
#include "engine/parallel/expert_parallel.h"
#include "engine/train/grad_clip.h"
#include "engine/train/mesh_rank.h"
#include "engine/train/nonfinite.h"
#include "engine/train/rank_strategy.h"
#include "engine/train/train.h"

namespace dtlab {

namespace {

// The loss of `step`, summed over the ranks (`reduced`), is non-finite: every rank learns which
// rank's own loss (`local`) went non-finite and where its forward first holds a non-finite value
// (one all-reduce of a code per rank), and every rank returns the same sentence.
std::string nonfinite_sentence(int64_t step, double local, double reduced, int rank, int world, Communicator* comm,
                               const Model& model, bool input_bad) {
  const NonFiniteSite mine = input_bad            ? NonFiniteSite{NonFiniteSite::Input, -1}
                             : std::isfinite(local) ? NonFiniteSite{}
                                                    : find_nonfinite(model);
  std::vector<float> codes(static_cast<size_t>(world), 0.0f);
  codes[static_cast<size_t>(comm ? rank : 0)] = std::isfinite(local) ? 0.0f : std::max(mine.code(), 1.0f);
  if (comm) {
    Device& dev = model.device();
    Tensor t({world}, MemCategory::Other, nullptr, DType::F32, dev);
    dev.upload(t.raw(), codes.data(), t.nbytes());
    comm->all_reduce(t.f32(), world, ReduceOp::Sum)->wait();
    dev.download(codes.data(), t.raw(), t.nbytes());
  }
  for (int r = 0; r < world; r++)
    if (codes[static_cast<size_t>(r)] > 0)
      return nonfinite_stop_message(step, reduced, comm ? r : rank, NonFiniteSite::decode(codes[static_cast<size_t>(r)]), model);
  // No rank's own loss was non-finite: their sum overflowed.
  return nonfinite_stop_message(step, reduced, -1, NonFiniteSite{NonFiniteSite::Loss, -1}, model);
}

// One rank's step buffers on its device.
struct StepBuffers {
  Tensor probs, dlogits;  // (B, C) softmax and the loss gradient
  // (B, D) inputs, or a GPT's (B) tokens, and (B) targets: a device's batch is uploaded here (the CPU
  // reads the loader's rows where they are).
  Tensor x_dev, y_dev;
  // The step's loss x samples and correct count, accumulated on the device (two doubles; read
  // once per step), and the four figures every rank all-reduces, in memory the communicator moves.
  Tensor loss_stats, figures;
  // B rows of logits (a GPT's: samples x positions), D input features (a GPT reads B tokens instead).
  StepBuffers(int64_t B, int64_t D, int64_t C, MemoryTracker& mem, Device& dev, bool tokens)
      : probs({B, C}, MemCategory::Activations, &mem, DType::F32, dev),
        dlogits({B, C}, MemCategory::Activations, &mem, DType::F32, dev),
        loss_stats({kLossStatsDoubles}, MemCategory::Other, nullptr, DType::F64, dev),
        figures({4}, MemCategory::Other, nullptr, DType::F32, dev) {
    if (!dev.is_host()) {
      x_dev = tokens ? Tensor({B}, MemCategory::Activations, &mem, DType::I64, dev)
                     : Tensor({B, D}, MemCategory::Activations, &mem, DType::F32, dev);
      y_dev = Tensor({B}, MemCategory::Activations, &mem, DType::I64, dev);
    }
  }
  // The batch's rows where the device reads them: uploaded to a GPU, the loader's own on the CPU.
  std::pair<const float*, const int64_t*> place(const Batch& batch, int64_t D) {
    const int64_t B = batch.size;
    if (x_dev.raw() == nullptr) return {batch.x.data(), batch.y.data()};
    Device& dev = x_dev.device();
    dev.upload(x_dev.raw(), batch.x.data(), B * D * static_cast<int64_t>(sizeof(float)));
    dev.upload(y_dev.raw(), batch.y.data(), B * static_cast<int64_t>(sizeof(int64_t)));
    return {x_dev.f32(), y_dev.i64()};
  }
  // A GPT's batch: its tokens (rows) and the targets of its logits' rows (y, y_rows: the batch's, or
  // under --cp this rank's positions'), host memory uploaded to a GPU.
  std::pair<const int64_t*, const int64_t*> place_tokens(const Batch& batch, int64_t rows, const int64_t* y, int64_t y_rows) {
    if (x_dev.raw() == nullptr) return {batch.tok.data(), y};
    Device& dev = x_dev.device();
    dev.upload(x_dev.raw(), batch.tok.data(), rows * static_cast<int64_t>(sizeof(int64_t)));
    dev.upload(y_dev.raw(), y, y_rows * static_cast<int64_t>(sizeof(int64_t)));
    return {x_dev.i64(), y_dev.i64()};
  }
  // Cross-entropy of `logits` (B, C) against `y` into loss_stats, and its gradient into dlogits.
  // `loss_scale`: fp16's GradScaler multiplies the loss (so its gradient) by it; 1 otherwise.
  void loss(ComputeObserver* obs, const float* logits, const int64_t* y, int64_t B, int64_t C, int64_t accum,
            float loss_scale = 1.0f) {
    Device& dev = probs.device();
    {
      ComputeScope scope(obs, ComputeKind::Loss, -1, cross_entropy_forward_cost(B, C));
      dev.cross_entropy_forward(probs.f32(), loss_stats.f64(), logits, y, B, C);
    }
    // The mean over the micro-batch, divided by the number of micro-batches (loss / accum).
    ComputeScope scope(obs, ComputeKind::LossBackward, -1, cross_entropy_backward_cost(B, C));
    const float mean = 1.0f / static_cast<float>(B * accum);
    dev.cross_entropy_backward(dlogits.f32(), probs.f32(), y, B, C, loss_scale == 1.0f ? mean : mean * loss_scale);
  }
};

// m[0..3] summed over every rank, through `figures` (4 floats on the rank's device).
void sum_over_ranks(Communicator& comm, Tensor& figures, double m[4]) {
  Device& dev = figures.device();
  float f[4] = {static_cast<float>(m[0]), static_cast<float>(m[1]), static_cast<float>(m[2]), static_cast<float>(m[3])};
  dev.upload(figures.raw(), f, sizeof f);
  comm.all_reduce(figures.f32(), 4, ReduceOp::Sum)->wait();
  dev.download(f, figures.raw(), sizeof f);
  for (int i = 0; i < 4; i++) m[i] = f[i];
}

}  // namespace

// single: the replica's forward, loss and backward with no strategy around them; ddp and fsdp add
// their hooks by overriding.
class ReplicaRank : public RankStrategy {
 public:
  explicit ReplicaRank(const RankEnv& env)
      : t_(env.trainer), c_(t_.config_), env_(env), rank_(env.rank),
        model_(*t_.models_[t_.world_ ? static_cast<size_t>(env.rank) : 0]),
        model_obs_(model_.observer()),
        mesh_(c_.tp > 1 ? t_.join_mesh(env.rank, *env.comm, model_) : nullptr),
        dp_comm_(mesh_ ? Trainer::mesh_dp_group(*mesh_) : env.comm),
        opt_(c_.optimizer, model_.num_params(), &env.mem, env.dev),
        at_(mesh_coord(t_.mesh_, env.rank)),
        // A TP group's ranks read their replica's batches, and so do a CP group's (--cp: the mesh's dp
        // dimension is replicas x cp, cp fastest).
        data_(c_, t_.dataset(), t_.mesh_.dp / c_.cp, at_.dp / c_.cp) {
    model_.set_observer(env.obs);
    model_.set_layer_gate(env.ctx);  // a stepped run pauses before each layer
    if (c_.cp > 1) join_context_parallel();
  }
  // After the strategy's own parts exist (DDP's buckets, FSDP's shards): the fp32 master weights and
  // the step's buffers, in the order the rank's memory timeline shows them.
  void ready() {
    // fp16: torch's GradScaler, or for FSDP its ShardedGradScaler (engine/train/grad_scaler.h).
    if (c_.precision == Precision::FP16 || c_.amp == Precision::FP16) scaler_ = make_grad_scaler(sharded());
    // FSDP's fp32 shards are its own master weights.
    if (model_.mixed() && !sharded()) opt_.init_master(model_.params16(), model_.half_format());
    buf_ = std::make_unique<StepBuffers>(c_.batch * c_.model.rows_per_sample(), c_.model.in_features(), c_.model.out_features(),
                                         env_.mem, env_.dev, c_.model.is_gpt());
  }
  ~ReplicaRank() override {
    if (cp_comm_) model_.set_context_parallel_comm(nullptr);
    if (cp_exec_) cp_exec_->drain();
    if (ep_comm_) model_.set_expert_parallel_comm(nullptr);  // the model outlives the group it dispatched over
    if (ep_exec_) ep_exec_->drain();
    model_.set_observer(model_obs_);
    model_.set_layer_gate(nullptr);
    model_.set_skipped_layer(-1);
  }

  int64_t micro_batches() const override { return c_.accum; }

  void zero_grad(int64_t step) override {
    // The unused-parameters lesson's branch: on every skip_every-th step the chosen ranks bypass a layer.
    branch_ = c_.skip_layer >= 0 && step % c_.skip_every == 0 &&
              (c_.skip_ranks.empty() || std::count(c_.skip_ranks.begin(), c_.skip_ranks.end(), rank_) > 0);
    model_.set_skipped_layer(branch_ ? c_.skip_layer : -1);
    buf_->loss_stats.zero();
    ComputeScope scope(env_.obs, ComputeKind::ZeroGrad, -1, zero_grad_cost(model_.num_params()));
    zero_grad_hook();
  }

  void micro_batch(int64_t step, int64_t micro, bool sync, StepTally& t) override {
    (void)micro;
    const int64_t D = c_.model.in_features(), C = c_.model.out_features();
    const Batch& batch = data_.next();
    const int64_t B = t.last_batch = batch.size;
    if (model_.is_gpt()) {  // the loss over every position: B x T rows of logits
      const int64_t rows = B * c_.model.rows_per_sample();
      // Under --cp the logits are this rank's positions' (B x T/c rows): their targets, in its order,
      // picked on the host before the upload.
      const int64_t out_rows = cp_comm_ ? B * model_.gpt()->seq_rows() : rows;
      const auto placed = buf_->place_tokens(batch, rows, cp_comm_ ? local_targets(batch.y.data(), B) : batch.y.data(), out_rows);
      const int64_t* tok = placed.first;
      const int64_t* y = placed.second;
      before_forward(sync);
      const float loss_scale = scaler_ ? t_.loss_scale_for(*scaler_, step, rank_) : 1.0f;
      buf_->loss(env_.obs, model_.forward_tokens(tok, B), y, out_rows, C, c_.accum, loss_scale);
      model_.set_aux_grad_scale(loss_scale / static_cast<float>(c_.accum));  // MoE's loss weighs as the micro-batch's mean
      t.samples += out_rows;
      prepare_backward(sync);
      model_.backward(buf_->dlogits.f32(), gradient_ready());
      after_backward();
      return;
    }
    if (!c_.allow_nonfinite && !t.input_bad) t.input_bad = has_nonfinite(batch.x.data(), B * D);
    const auto [x, y] = buf_->place(batch, D);
    before_forward(sync);
    buf_->loss(env_.obs, model_.forward(x, B), y, B, C, c_.accum, scaler_ ? t_.loss_scale_for(*scaler_, step, rank_) : 1.0f);
    t.samples += B;
    prepare_backward(sync);
    model_.backward(buf_->dlogits.f32(), gradient_ready());
    after_backward();
  }

  bool step(int64_t step) override {
    scale_ = scaler_ ? scaler_->scale() : 0.0f;
    // fp16's scaler decides first, every rank the same way.
    const bool ok = !scaler_ || scaler_allows_step();
    clip_ = {};
    if (ok && c_.clip_grad_norm > 0) clip_ = clip_grad_norm(clip_input(), c_.clip_grad_norm, env_.dev, env_.ctx);
    if (ok) {
      ComputeScope scope(env_.obs, ComputeKind::OptimizerStep, -1, optimizer_step_cost(model_.num_params()));
      optimizer_step();
    } else {
      t_.rank_skipped_[static_cast<size_t>(rank_)].push_back(step);
    }
    skipped_ = !ok;
    return ok;
  }

  StepSums exchange(int64_t step, const StepTally& t) override {
    (void)step;
    double loss_sums[kLossStatsDoubles];
    env_.dev.download(loss_sums, buf_->loss_stats.f64(), sizeof loss_sums);  // the host's one wait for the device per step
    // Non-finite input stops the step even when the loss comes out finite (a ReLU can zero an
    // infinity whose gradient is still NaN): this rank's loss counts as NaN, so every rank sees it.
    if (t.input_bad) loss_sums[0] = std::numeric_limits<double>::quiet_NaN();
    // Every rank computes its own loss; the reported figures are the all-reduced sums (no
    // rank-0-only synchronisation). A TP group's ranks compute the same loss on the same batch:
    // its first rank speaks for it.
    double m[4] = {loss_sums[0], loss_sums[1], static_cast<double>(t.samples), overlap()};
    if (at_.tp != 0) m[0] = m[1] = m[2] = m[3] = 0;
    if (env_.comm) sum_over_ranks(*env_.comm, buf_->figures, m);
    overlap_sum_step_ = m[3];
    return {m[0], m[1], m[2], loss_sums[0]};
  }

  std::string diagnose_nonfinite(int64_t step, const StepSums& s, const StepTally& t) override {
    return nonfinite_sentence(step, s.mine, s.loss_sum, rank_, env_.comm ? c_.world_size : 1, env_.comm, model_, t.input_bad);
  }

  bool reports() const override { return rank_ == 0; }

  void annotate(StepReport& r, const StepSums&) override {
    r.branch_taken = branch_;
    r.loss_scale = scale_;
    r.step_skipped = skipped_;
    annotate_clip(r, clip_);
  }

  int64_t epoch() const override { return data_.epoch(); }
  int64_t epochs_started() const override { return data_.epochs_started(); }

  const Model& finish(TrainSummary& sum) override {
    if (cp_comm_) {  // the same parameters, now a model of the whole sequence (evaluation, --save, the views)
      model_.set_context_parallel_comm(nullptr);
      model_.set_context_parallel({});
    }
    if (scaler_ && rank_ == 0) t_.loss_scale_ = scaler_->scale();
    model_.set_skipped_layer(-1);
    finish_hook(sum);
    // Every replica holds the whole model (or its TP piece): --save-sharded writes each parameter once.
    if (!sharded()) t_.save_replicated_sharded(model_, env_.comm, at_.dp, t_.mesh_.dp);
    if (mesh_) gather_full_model();  // rank 0's full_model_ gets every shard
    if (ep_group_ && !mesh_) return gather_experts();
    return mesh_ && rank_ == 0 ? *t_.full_model_ : model_;
  }

 protected:
  // The strategy's hooks around the replica's step.
  virtual void zero_grad_hook() { model_.zero_grad(); }
  virtual void before_forward(bool sync) { (void)sync; }
  virtual void prepare_backward(bool sync) { (void)sync; }
  virtual Model::GradReadyHook gradient_ready() { return {}; }
  virtual void after_backward() {}
  virtual void optimizer_step() {
    if (model_.mixed()) opt_.step_mixed(model_.params16(), model_.grads16(), unscale16());
    else opt_.step(model_.params(), model_.grads());
  }
  // What the optimizer multiplies 16-bit gradients by as it widens them: fp16's unscale and the clip
  // coefficient (a float32 gradient was clipped in place).
  float unscale16() const { return (scaler_ ? 1.0f / scale_ : 1.0f) * clip_.coef; }
  // This rank's gradients for --clip-grad-norm: the replica's own (whole after DDP's all-reduce), the
  // TP group's sum completing a split model's.
  virtual GradClipInput clip_input() {
    GradClipInput in;
    add_model_grads(in, model_);
    in.unscale = scaler_ ? 1.0f / scale_ : 1.0f;
    if (mesh_) in.sum_over.push_back(mesh_->tp);
    return in;
  }
  virtual double overlap() const { return -1; }
  virtual FullyShardedDataParallel* sharded() { return nullptr; }
  // --tp: the TP group's shards put together into rank 0's full model (collective over the TP group);
  // with --ep each rank's shard with every expert of its EP group (whose members may be other TP
  // ranks) first.
  void gather_full_model() {
    if (!ep_group_ || expert_parameters(model_).empty()) return t_.gather_full_model(rank_, *mesh_, model_);
    const std::vector<float> mine = gather_expert_parallel_params(model_, *ep_group_, env_.dev);
    const std::vector<float> full = gather_expert_tensor_parallel_params(model_, mine, *mesh_->tp);
    if (rank_ == 0) t_.full_model_->upload_params(full.data());
  }
  // --ep without --tp: rank 0 returns the whole model, every EP rank's experts put together (collective
  // over the EP group); the others their own.
  const Model& gather_experts() {
    if (model_.lora()) {  // the base (every expert) is frozen: the whole one-rank base with rank 0's adapters
      if (rank_ != 0) return model_;
      t_.full_model_ = std::make_unique<Model>(ModelSpec{{}, model_.spec().gpt.whole()}, nullptr, c_.seed);
      if (!c_.init_path.empty()) load_model_checkpoint(c_.init_path, *t_.full_model_);
      t_.full_model_->enable_lora(c_.lora, c_.seed);
      if (is_mixed(c_.precision)) t_.full_model_->set_precision(c_.precision);
      t_.full_model_->upload_params(model_.host_params().data());
      return *t_.full_model_;
    }
    const std::vector<float> whole = gather_expert_parallel_params(model_, *ep_group_, env_.dev);
    if (rank_ != 0) return model_;
    t_.full_model_ = std::make_unique<Model>(ModelSpec{{}, model_.spec().gpt.whole()}, nullptr, c_.seed);
    t_.full_model_->upload_params(whole.data());
    return *t_.full_model_;
  }
  // --ep: the EP group (ep consecutive ranks: the GPT's dispatch and combine) and the expert-data-
  // parallel group (the ranks holding the same experts), on one executor. `edp_of_one`: make the latter
  // even when it is this rank alone (FSDP shards the experts over it); DDP then scales them alone.
  void join_expert_parallel(bool edp_of_one) {
    // Tags apart from FSDP's groups (1 << 20 .. 1 << 22) and CP's (1 << 25).
    static constexpr int kExpertTag = 1 << 23;
    const int W = env_.comm->world_size();
    ep_exec_ = group_executor();
    ep_group_ = new_group(*env_.comm, ep_group_ranks(rank_, c_.ep), kExpertTag, ep_exec_, env_.dev, "ep" + std::to_string(rank_ / c_.ep));
    if (W > c_.ep || edp_of_one)
      expert_dp_ = new_group(*env_.comm, expert_dp_group_ranks(rank_, c_.ep, W), kExpertTag + 1, ep_exec_, env_.dev,
                             "edp" + std::to_string(rank_ % c_.ep));
    ep_comm_ = std::make_unique<GroupExpertParallelComm>(*ep_group_);
    model_.set_expert_parallel_comm(ep_comm_.get());
  }
  virtual void finish_hook(TrainSummary& sum) { (void)sum; }

  // The executor of every process group this rank makes (the mesh's, or one of its own): one rank's
  // group operations run in program order on one thread, since two would feed the world's comm worker
  // in different orders on different ranks and could wait on each other (engine/comm/group.h).
  std::shared_ptr<GroupExecutor> group_executor() {
    if (mesh_ && mesh_->executor) return mesh_->executor;
    if (!own_exec_) own_exec_ = std::make_shared<GroupExecutor>();
    return own_exec_;
  }
  // --cp: the rank's CP group (cp_group_ranks), and its model's sequence split.
  void join_context_parallel() {
    static constexpr int kContextTag = 1 << 25;
    const int cr = cp_rank_of(t_.mesh_, c_.cp, rank_);
    const std::vector<int> ranks = cp_group_ranks(t_.mesh_, c_.cp, rank_);
    cp_exec_ = group_executor();
    const int index = (at_.dp / c_.cp) * t_.mesh_.pp * t_.mesh_.tp + at_.pp * t_.mesh_.tp + at_.tp;
    cp_group_ = new_group(*env_.comm, ranks, kContextTag, cp_exec_, env_.dev, "cp" + std::to_string(index));
    cp_comm_ = std::make_unique<GroupContextParallelComm>(*cp_group_);
    ContextParallelSpec spec;
    spec.degree = c_.cp;
    spec.rank = cr;
    spec.layout = c_.cp_layout;
    model_.set_context_parallel(spec);
    model_.set_context_parallel_comm(cp_comm_.get());
    cp_positions_ = spec.positions(c_.model.gpt.ctx);
  }
  // The targets of this rank's positions of each of B samples, from the batch's (host memory).
  const int64_t* local_targets(const int64_t* y, int64_t B) {
    const int64_t T = c_.model.gpt.ctx, Tq = static_cast<int64_t>(cp_positions_.size());
    cp_targets_.resize(static_cast<size_t>(B * Tq));
    for (int64_t b = 0; b < B; b++)
      for (int64_t i = 0; i < Tq; i++) cp_targets_[static_cast<size_t>(b * Tq + i)] = y[b * T + cp_positions_[static_cast<size_t>(i)]];
    return cp_targets_.data();
  }

  // The ranks agree over the DP group: all skip together.
  bool scaler_allows_step() { return dtlab::scaler_allows_step(*scaler_, model_, dp_comm_, env_.ctx); }

  Trainer& t_;
  const TrainConfig& c_;
  RankEnv env_;
  int rank_;
  Model& model_;
  ComputeObserver* model_obs_;
  std::unique_ptr<Trainer::MeshRank> mesh_;
  Communicator* dp_comm_;  // DDP's or FSDP's group: the world, the mesh's DP group, or none
  Optimizer opt_;
  std::unique_ptr<GradScaler> scaler_;
  MeshCoord at_;
  RankBatches data_;
  std::unique_ptr<StepBuffers> buf_;
  bool branch_ = false, skipped_ = false;
  float scale_ = 0;
  GradClipResult clip_;  // this step's clipping; total_norm -1: none
  double overlap_sum_step_ = 0;
  // Context parallelism (--cp): the CP group, its executor, the model's view of it, this rank's
  // positions and their targets.
  std::shared_ptr<GroupExecutor> own_exec_;  // group_executor() without a mesh executor
  std::shared_ptr<GroupExecutor> cp_exec_;
  std::unique_ptr<Communicator> cp_group_;
  std::unique_ptr<GroupContextParallelComm> cp_comm_;
  std::vector<int64_t> cp_positions_, cp_targets_;
  // Expert parallelism (--ep): the EP group, the expert-data-parallel group (DDP: null when it is one
  // rank), their executor, and the GPT's view of the EP group.
  std::shared_ptr<GroupExecutor> ep_exec_;
  std::unique_ptr<Communicator> ep_group_, expert_dp_;
  std::unique_ptr<GroupExpertParallelComm> ep_comm_;
};

class DdpRank final : public ReplicaRank {
 public:
  explicit DdpRank(const RankEnv& env) : ReplicaRank(env) {
    DdpOptions opt = c_.ddp;
    if (c_.ep > 1) {  // the EP group's all-to-alls, and the experts reduced apart from DDP's buckets
      join_expert_parallel(false);
      opt.ignored = expert_parameters(model_);
    }
    if (dp_comm_) ddp_ = std::make_unique<DistributedDataParallel>(model_, *dp_comm_, env.ctx, opt, c_.reduce_fp32);
  }
  void annotate(StepReport& r, const StepSums& s) override {
    ReplicaRank::annotate(r, s);
    if (!ddp_) return;
    r.overlap = overlap_sum_step_ / t_.mesh_.dp;
    overlap_total_ += r.overlap;
    overlap_n_++;
  }

 protected:
  // With --join, torch's DDP forward under a Join context also tells the joined ranks it has not
  // joined (Join.notify_join_context: an all-reduce of 1 that counts the ranks still training) and
  // whether this backward synchronises (_check_global_requires_backward_grad_sync), around the
  // bucket rebuild; shadow_step() makes the same three collectives with zeros.
  void before_forward(bool sync) override {
    if (!ddp_) return;
    if (c_.join) all_reduce_value(*dp_comm_, 1.0f, ReduceOp::Sum, env_.dev);
    ddp_->before_forward();
    if (c_.join) all_reduce_value(*dp_comm_, sync ? 1.0f : 0.0f, ReduceOp::Sum, env_.dev);
  }

 public:
  // The join hook's main hook, once per micro-batch of the others (Join.__exit__'s loop): count the
  // ranks not yet joined, rebuild the buckets when due, and if the others synchronise this backward,
  // all-reduce zeros for each bucket. Nothing is stepped; the report counts no samples from here.
  void shadow_step(int64_t step) override {
    (void)step;
    shadowed_ = true;
    branch_ = skipped_ = false;
    clip_ = {};
    buf_->loss_stats.zero();
    for (int64_t m = 0; m < c_.accum; m++) {
      const float training = all_reduce_value(*dp_comm_, 0.0f, ReduceOp::Sum, env_.dev);
      DTLAB_CHECK(training > 0, "a joined rank shadowed a step no rank is training");
      ddp_->before_forward();
      if (all_reduce_value(*dp_comm_, 0.0f, ReduceOp::Sum, env_.dev) > 0) ddp_->shadow_backward();
    }
    // fp16: the ranks still training agree on found_inf over the DP group (the lab's all-reduce MAX,
    // for --inject-overflow-rank); this rank found none.
    if (scaler_) GradScaler::agree(dp_comm_, false, env_.dev);
  }

 protected:
  // no_sync() for the first accum - 1 micro-batches.
  void prepare_backward(bool sync) override {
    synced_ = sync;
    if (ddp_) ddp_->prepare_for_backward(sync);
  }
  Model::GradReadyHook gradient_ready() override { return ddp_ ? ddp_->grad_ready_hook() : Model::GradReadyHook{}; }
  void after_backward() override {
    if (ddp_) ddp_->finalize_backward();
    // The experts: 1 / world, summed over the ranks holding the same experts (once per optimizer step,
    // as DDP's buckets: not inside no_sync's micro-batches).
    if (c_.ep > 1 && synced_) reduce_expert_gradients(model_, expert_dp_.get(), t_.mesh_.dp);
  }
  void optimizer_step() override {
    if (ddp_ && !model_.mixed()) opt_.step(ddp_->optimizer_segments());
    else if (ddp_ && !model_.grads16()) opt_.step_mixed(ddp_->optimizer_segments16(), unscale16());
    else ReplicaRank::optimizer_step();
  }
  double overlap() const override { return ddp_ ? ddp_->last_stats().overlap() : -1; }
  // Under --ep the replicas hold the same dense gradients (DDP's average) and each EP group every
  // expert once: the dense ones count on the first replica, the experts on the first EP group, and
  // the world's sum is the whole model's squared norm.
  GradClipInput clip_input() override {
    if (c_.ep == 1) return ReplicaRank::clip_input();
    GradClipInput in;
    add_expert_parallel_grads(in, model_, at_.dp == 0, rank_ < c_.ep);
    in.unscale = scaler_ ? 1.0f / scale_ : 1.0f;
    in.sum_over = {env_.comm};
    return in;
  }
  void finish_hook(TrainSummary& sum) override {
    // Join.__exit__: the last count (every rank has joined: 0), then DDP's post-hook gives every rank
    // the last joiners' model.
    if (c_.join && ddp_) {
      DTLAB_CHECK(all_reduce_value(*dp_comm_, 0.0f, ReduceOp::Sum, env_.dev) == 0.0f, "a rank left Join while another still trained");
      ddp_->sync_final_model(!shadowed_);
    }
    if (rank_ != 0) return;
    sum.mean_overlap = overlap_n_ ? overlap_total_ / static_cast<double>(overlap_n_) : -1;
    if (ddp_) {
      sum.buckets = ddp_->describe_buckets();
      sum.buckets_rebuilt = ddp_->rebuilt();
    }
  }

 private:
  bool synced_ = true;  // this micro-batch's backward reduces (the last of --accum)
  std::unique_ptr<DistributedDataParallel> ddp_;  // null when the mesh has one replica
  bool shadowed_ = false;  // --join: this rank's data ran out and it shadowed the others (not a last joiner)
  double overlap_total_ = 0;
  int64_t overlap_n_ = 0;
};

class FsdpRank final : public ReplicaRank {
 public:
  explicit FsdpRank(const RankEnv& env) : ReplicaRank(env) {
    FsdpOptions opt = c_.fsdp;
    if (c_.ep > 1) {
      // torchtitan's FSDP with EP: each block's experts a unit of their own, sharded over the ranks that
      // hold the same experts and averaged over the data-parallel world, as DDP with --ep averages them.
      join_expert_parallel(true);
      opt.expert_group = expert_dp_.get();
      opt.expert_divide = t_.mesh_.dp;
      opt.executor = ep_exec_;
      if (c_.fsdp.sharding == Sharding::Hybrid) {
        // HSDP (torchtitan's (replicate, shard) mesh for the experts too): inside this rank's node the
        // ranks holding its experts shard them; across the nodes the ranks at its place hold copies. A
        // node is --node-size data-parallel ranks, each with its --tp ranks: K consecutive world ranks
        // (tp fastest), inside which an EP group lies.
        const int K = c_.fsdp.node_size * std::max(c_.tp, 1), W = env.comm->world_size(), node = rank_ / K;
        std::vector<int> shard, across;
        for (int j = rank_ % c_.ep; j < K; j += c_.ep) shard.push_back(node * K + j);
        for (int n = 0; n < W / K; n++) across.push_back(n * K + rank_ % K);
        static constexpr int kHsdpTag = (1 << 23) + 2;  // beside join_expert_parallel's two, one per group
        expert_shard_ = new_group(*env.comm, shard, kHsdpTag + 2 * (node * K + rank_ % c_.ep), ep_exec_, env.dev,
                                  "eshard" + std::to_string(node) + "." + std::to_string(rank_ % c_.ep));
        expert_replicate_ = new_group(*env.comm, across, kHsdpTag + 2 * (rank_ % K) + 1, ep_exec_, env.dev,
                                      "ereplicate" + std::to_string(rank_ % K));
        opt.expert_group = expert_shard_.get();
        opt.expert_replicate = expert_replicate_.get();
      }
    }
    if (dp_comm_) fsdp_ = std::make_unique<FullyShardedDataParallel>(model_, *dp_comm_, env.ctx, opt, c_.optimizer, c_.reduce_fp32);
  }

 protected:
  void zero_grad_hook() override {
    if (fsdp_) fsdp_->zero_grad();
    else model_.zero_grad();
  }
  void after_backward() override {
    if (fsdp_) fsdp_->finalize_backward();
  }
  void optimizer_step() override {
    if (fsdp_) fsdp_->step();
    else ReplicaRank::optimizer_step();
  }
  void finish_hook(TrainSummary&) override {
    if (fsdp_) t_.finish_fsdp(*fsdp_, model_, mesh_ ? *env_.comm : *dp_comm_);
  }
  FullyShardedDataParallel* sharded() override { return fsdp_.get(); }
  // FSDP1's clip_grad_norm_: each rank's owned slices of the flat shards, summed over the shard
  // group (and with --tp over the TP group); the fp32 shards are already unscaled (ShardedGradScaler).
  GradClipInput clip_input() override {
    if (!fsdp_) return ReplicaRank::clip_input();
    GradClipInput in;
    std::vector<bool> counted = tp_counted_params(model_);
    if (c_.ep > 1)  // an expert is whole on its rank, and under --tp the TP ranks hold different ones
      for (int i : expert_parameters(model_)) counted[static_cast<size_t>(i)] = true;
    for (const OwnedSlice& s : fsdp_->owned_grad_slices())
      if (counted[static_cast<size_t>(s.param)]) in.pieces.push_back({s.data, nullptr, s.length});
    const auto [grads, n] = fsdp_->step_grads();
    in.scaled.push_back({grads, n});
    in.sum_over = {dp_comm_, mesh_ ? mesh_->tp : nullptr};
    return in;
  }

 private:
  std::unique_ptr<Communicator> expert_shard_, expert_replicate_;  // HSDP with --ep: the experts' node and replica groups
  std::unique_ptr<FullyShardedDataParallel> fsdp_;
};

std::unique_ptr<RankStrategy> make_replica_rank(const RankEnv& env) {
  std::unique_ptr<ReplicaRank> r;
  switch (env.trainer.config().strategy) {
    case Strategy::Ddp: r = std::make_unique<DdpRank>(env); break;
    case Strategy::Fsdp: r = std::make_unique<FsdpRank>(env); break;
    case Strategy::Single: r = std::make_unique<ReplicaRank>(env); break;
    case Strategy::Dp:
    case Strategy::Pipeline:
      DTLAB_CHECK(false, std::string("make_replica_rank: ") + strategy_name(env.trainer.config().strategy) + " is not a replica strategy");
  }
  r->ready();
  return r;
}

}  // namespace dtlab
