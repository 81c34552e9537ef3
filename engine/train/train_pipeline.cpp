// The pipeline strategy's rank: the same loop, data, loss and optimizer as the other strategies'
// (Trainer::run_rank), but its forward and backward are this rank's row of the pipeline schedule
// (engine/parallel/pipeline.h).
#include <chrono>
#include <cmath>
#include <limits>
#include <cstring>
#include <type_traits>

#include "engine/core/check.h"
#include "engine/core/gpt.h"
#include "engine/io/sharded_checkpoint.h"
#include "engine/train/grad_clip.h"
#include "engine/train/grad_scaler.h"
#include "engine/train/iteration_gate.h"
#include "engine/train/nonfinite.h"
#include "engine/train/rank_strategy.h"
#include "engine/train/train.h"

namespace dtlab {

namespace {

constexpr int64_t kRecordFloats = sizeof(PipelineRankIteration) / sizeof(float);
static_assert(sizeof(PipelineRankIteration) % sizeof(float) == 0 &&
              std::is_trivially_copyable_v<PipelineRankIteration>);

// Every tp-th record: each TP group's first rank, in pipeline-rank order.
std::vector<PipelineRankIteration> tp_leaders(const std::vector<PipelineRankIteration>& world, int tp) {
  if (tp == 1) return world;
  std::vector<PipelineRankIteration> leaders;
  for (size_t r = 0; r < world.size(); r += static_cast<size_t>(tp)) leaders.push_back(world[r]);
  return leaders;
}

}  // namespace

std::vector<const GptCore*> Trainer::pipeline_view_cores(int rank) const {
  std::lock_guard<std::mutex> lock(pipeline_views_mu_);
  const size_t r = static_cast<size_t>(rank);
  if (r < pipeline_live_.size() && pipeline_live_[r]) return pipeline_live_[r]->view_cores();
  std::vector<const GptCore*> out;
  if (r < pipeline_kept_.size())
    for (const auto& g : pipeline_kept_[r]) out.push_back(g.get());
  return out;
}

// The pipeline's hooks of the one per-rank loop (engine/train/rank_strategy.h). World rank =
// (replica * p + pipeline rank) * tp + tp rank (engine/core/mesh.h). Every rank of a replica reads
// the same batches (its replica's DistributedSampler shard); the first stage takes the inputs, the
// last the labels. One "micro-batch" of the loop is the whole schedule row: the pipeline's own
// micro-batches are the accumulation.
class PipelineTrainRank final : public RankStrategy {
 public:
  explicit PipelineTrainRank(const RankEnv& env)
      : t_(env.trainer), c_(t_.config_), env_(env), plan_(*t_.pipeline_), N_(c_.world_size),
        pipe_(plan_, c_.model, env.rank, *env.comm, env.ctx, &env.mem, c_.seed, c_.optimizer, env.dev,
              env.timer, c_.tp, stage_setup(t_)),
        meter_(plan_, c_.tp),
        // A replica's ranks share its shard, and so do a CP group's (--cp: the pipeline's dp dimension
        // is replicas x cp, cp fastest).
        data_(c_, t_.dataset(), plan_.options.dp / c_.cp, pipe_.replica() / c_.cp),
        gathered_({kRecordFloats * N_}, MemCategory::Other, nullptr, DType::F32, env.dev),
        mine_dev_({kRecordFloats}, MemCategory::Other, nullptr, DType::F32, env.dev),
        all_(static_cast<size_t>(kRecordFloats * N_)), records_(static_cast<size_t>(N_)) {
    // A device's batch is uploaded once per step; the stages read their micro-batches' rows there.
    if (!env.dev.is_host()) {
      // A GPT's: its tokens and targets, T per sample.
      const int64_t rows = c_.batch * c_.model.rows_per_sample();
      x_dev_ = c_.model.is_gpt() ? Tensor({rows}, MemCategory::Activations, &env.mem, DType::I64, env.dev)
                                 : Tensor({c_.batch, F()}, MemCategory::Activations, &env.mem, DType::F32, env.dev);
      y_dev_ = Tensor({rows}, MemCategory::Activations, &env.mem, DType::I64, env.dev);
    }
    // fp16: torch's GradScaler. The last stages scale the loss; every rank checks its stages'
    // gradients and the whole world agrees (Megatron all-reduces found_inf over the model-parallel
    // ranks; docs/course_sources.md §6e), so every stage of every replica skips the same steps.
    if (c_.precision == Precision::FP16 || c_.amp == Precision::FP16) scaler_ = make_grad_scaler(nullptr);
    std::lock_guard<std::mutex> lock(t_.pipeline_views_mu_);  // the lab's views of this rank's stages
    t_.pipeline_live_.resize(static_cast<size_t>(N_), nullptr);
    t_.pipeline_kept_.resize(static_cast<size_t>(N_));
    t_.pipeline_live_[static_cast<size_t>(env.rank)] = &pipe_;
    t_.pipeline_kept_[static_cast<size_t>(env.rank)].clear();
  }
  ~PipelineTrainRank() override {
    std::lock_guard<std::mutex> lock(t_.pipeline_views_mu_);
    t_.pipeline_kept_[static_cast<size_t>(env_.rank)] = pipe_.take_view_cores();
    t_.pipeline_live_[static_cast<size_t>(env_.rank)] = nullptr;
  }

  void zero_grad(int64_t) override {
    ComputeScope scope(env_.obs, ComputeKind::ZeroGrad, -1, zero_grad_cost(pipe_.num_params()));
    pipe_.zero_grad();
  }

  void micro_batch(int64_t step, int64_t, bool, StepTally& t) override {
    step_ = step;
    const Batch& batch = data_.next();
    t.last_batch = batch.size;
    // Every replica's batch has batch.size samples (the sampler pads), so the step's mean loss
    // weighs each sample 1 / (D x batch.size) (a GPT's each position 1 / (D x batch.size x T); under
    // --cp D counts replicas, not their CP ranks, each of which holds T / cp of the positions).
    const float scale = 1.0f / static_cast<float>(batch.size * c_.model.rows_per_sample() * (plan_.options.dp / c_.cp)) *
                        (scaler_ ? t_.loss_scale_for(*scaler_, step_, env_.rank) : 1.0f);
    const float* x = batch.x.data();
    const int64_t* y = batch.y.data();
    const int64_t* tok = batch.tok.empty() ? nullptr : batch.tok.data();
    Device& dev = env_.dev;
    if (!dev.is_host()) {
      const int64_t rows = batch.size * c_.model.rows_per_sample(), I64 = sizeof(int64_t);
      if (tok) {
        dev.upload(x_dev_.raw(), tok, rows * I64);
        tok = x_dev_.i64();
        x = nullptr;
      } else {
        dev.upload(x_dev_.raw(), x, batch.size * F() * static_cast<int64_t>(sizeof(float)));
        x = x_dev_.f32();
      }
      dev.upload(y_dev_.raw(), y, rows * I64);
      y = y_dev_.i64();
    }
    mine_ = pipe_.run_iteration(x, y, batch.size, scale, tok, batch.y.data());
    // Non-finite input stops the step even if the loss comes out finite. A stage that computes no
    // loss reports NaN for it instead of 0, so every rank learns which replica's batch was bad.
    // (Token ids are always finite.)
    t.input_bad = !c_.allow_nonfinite && !c_.model.is_gpt() && has_nonfinite(batch.x.data(), batch.size * F());
    if (t.input_bad && mine_.samples == 0) mine_.loss_sum = std::numeric_limits<double>::quiet_NaN();
    t.samples = static_cast<int64_t>(mine_.samples);
    pipe_.reduce_gradients();
  }

  bool step(int64_t step) override {
    scale_ = scaler_ ? scaler_->scale() : 0.0f;
    // GradScaler.unscale_: 16-bit stages are checked (the optimizer unscales as it widens); --amp's
    // float32 gradients are multiplied by 1 / scale in place and checked.
    bool found = false;
    for (size_t k = 0; scaler_ && k < pipe_.stage_ids().size(); k++) found = scaler_->unscale_grads(pipe_.stage_model(static_cast<int>(k))) || found;
    if (scaler_ && !scaler_allows_step(*scaler_, found, env_.dev, env_.comm, env_.ctx)) {
      t_.rank_skipped_[static_cast<size_t>(env_.rank)].push_back(step);
      skipped_ = true;
      return false;
    }
    skipped_ = false;
    const float unscale = scaler_ && pipe_.mixed() ? 1.0f / scale_ : 1.0f;  // (--amp's are unscaled)
    clip_ = {};
    if (c_.clip_grad_norm > 0) clip_ = clip_grad_norm(clip_input(unscale), c_.clip_grad_norm, env_.dev, env_.ctx);
    ComputeScope scope(env_.obs, ComputeKind::OptimizerStep, -1, optimizer_step_cost(pipe_.num_params()));
    pipe_.step(unscale * clip_.coef);  // 16-bit stages: the coefficient rides with the unscale
    return true;
  }

  // Megatron's grad norm over the model-parallel ranks: every stage's squares (a TP shard's replicated
  // parameters on TP rank 0 only), summed over the world; after reduce_gradients() each of the D
  // replicas holds the same gradients, so the world's sum counts every element D times.
  GradClipInput clip_input(float unscale) {
    GradClipInput in;
    for (size_t k = 0; k < pipe_.stage_ids().size(); k++) {
      const Model& m = pipe_.stage_model(static_cast<int>(k));
      // --ep: an expert is on (dp x tp) / ep ranks, a dense parameter on dp: each counts on one rank.
      if (c_.ep > 1) add_expert_parallel_grads(in, m, pipe_.replica() == 0, pipe_.expert_index() < c_.ep);
      else add_model_grads(in, m);
    }
    in.unscale = unscale;
    in.sum_over = {env_.comm};
    in.copies = c_.ep > 1 ? 1 : plan_.options.dp;
    return in;
  }

  // Every rank learns every rank's figures (one all-gather, bit for bit, no rank-0-only sync).
  StepSums exchange(int64_t, const StepTally&) override {
    Device& dev = env_.dev;
    dev.upload(mine_dev_.raw(), &mine_, sizeof mine_);
    env_.comm->all_gather(gathered_.f32(), mine_dev_.f32(), kRecordFloats, DType::F32)->wait();
    dev.download(all_.data(), gathered_.raw(), gathered_.nbytes());
    std::memcpy(static_cast<void*>(records_.data()), all_.data(), all_.size() * sizeof(float));
    bubbles_ = meter_.add(records_);
    // --tp: the ranks of a TP group compute one loss. A non-finite loss on any rank makes the sum
    // non-finite, so every rank stops.
    StepSums s;
    for (const PipelineRankIteration& r : tp_leaders(records_, c_.tp))
      s.loss_sum += r.loss_sum, s.correct += r.correct, s.samples += r.samples;
    for (const PipelineRankIteration& r : records_)
      if (!std::isfinite(r.loss_sum)) s.loss_sum = r.loss_sum;
    s.mine = mine_.loss_sum;
    return s;
  }

  // The last stage of a replica computes its loss (where the values came from may be an earlier
  // stage); a rank without a loss of its own (samples 0) says its batch was bad.
  std::string diagnose_nonfinite(int64_t step, const StepSums&, const StepTally&) override {
    for (int r = 0; r < N_; r++) {
      const PipelineRankIteration& rec = records_[static_cast<size_t>(r)];
      if (std::isfinite(rec.loss_sum)) continue;
      const NonFiniteSite site{rec.samples == 0 ? NonFiniteSite::Input : NonFiniteSite::None, -1};
      return nonfinite_stop_message(step, rec.loss_sum, r, site, *t_.models_[0]);
    }
    return nonfinite_stop_message(step, std::numeric_limits<double>::quiet_NaN(), -1, NonFiniteSite{NonFiniteSite::Loss, -1},
                                  *t_.models_[0]);
  }

  bool reports() const override { return env_.rank == 0; }
  void annotate(StepReport& r, const StepSums&) override {
    r.bubble = bubbles_;
    r.loss_scale = scale_;
    r.step_skipped = skipped_;
    annotate_clip(r, clip_);
  }
  int64_t epoch() const override { return data_.epoch(); }
  int64_t epochs_started() const override { return data_.epochs_started(); }

  const Model& finish(TrainSummary& sum) override {
    if (scaler_ && env_.rank == 0) t_.loss_scale_ = scaler_->scale();
    pipe_.gather_parameters(env_.rank == 0 ? t_.models_[0].get() : nullptr);
    if (!c_.save_sharded_path.empty()) save_sharded();
    if (t_.launched_) gather_rank_memory();
    if (env_.rank == 0) sum.pipeline = meter_.stats();
    return *t_.models_[0];
  }

  // --save-sharded: every rank writes its stages' parameters (its TP shard of them, placed by their
  // boxes) into one sharded checkpoint, under the full model's names. The D replicas of a stage hold
  // the same parameters: each is written once, by the replica torch's dedup_save_plans picks
  // (dedup_replicated_params). A GPT's last stage leaves out its copy of the tied weight,
  // lm_head.weight: the first stage writes it as transformer.wte.weight (the two are equal after
  // every step), as --save's file holds it once.
  void save_sharded() {
    const int chunks = static_cast<int>(pipe_.stage_ids().size());
    std::vector<std::vector<float>> widened(static_cast<size_t>(chunks));  // 16-bit stages: their values in float32
    std::vector<int64_t> bytes;
    std::vector<bool> expert;  // --ep: an expert is on (dp x tp) / ep of the stage's ranks, the rest on dp
    std::vector<std::pair<int, int>> where;  // (stage model, parameter) of each entry of `bytes`
    for (int k = 0; k < chunks; k++) {
      const Model& m = pipe_.stage_model(k);
      if (m.mixed()) widened[static_cast<size_t>(k)] = m.host_params();
      const std::vector<Parameter>& ps = m.parameters();
      for (size_t j = 0; j < ps.size(); j++) {
        if (ps[j].name == "lm_head.weight") continue;
        bytes.push_back(ps[j].numel * static_cast<int64_t>(sizeof(float)));
        expert.push_back(c_.ep > 1 && ps[j].name.find(".mlp.experts.") != std::string::npos);
        where.emplace_back(k, static_cast<int>(j));
      }
    }
    const int D = plan_.options.dp;
    const std::vector<bool> writes =
        params_this_rank_writes(bytes, expert, D, pipe_.replica(), D * c_.tp / c_.ep, pipe_.expert_index() / c_.ep);
    std::vector<SavedPart> parts;
    for (int k = 0; k < chunks; k++) parts.push_back({&pipe_.stage_model(k), {}});
    for (size_t i = 0; i < where.size(); i++) {
      if (!writes[i]) continue;
      const auto [k, j] = where[i];
      const Model& m = pipe_.stage_model(k);
      const Parameter& p = m.parameters()[static_cast<size_t>(j)];
      const float* data = m.mixed() ? widened[static_cast<size_t>(k)].data() + p.offset : p.data;
      parts[static_cast<size_t>(k)].slices.push_back({j, 0, p.numel, data});
    }
    Communicator* world = env_.comm;
    save_sharded_checkpoint(c_.save_sharded_path, parts,
                            {env_.rank, N_,
                             [world] {
                               if (world) world->barrier()->wait();
                             }},
                            t_.start_step_ + t_.total_steps_, strategy_name(c_.strategy));
  }

  // Launched, each stage's memory is in its own process: rank 0's summary table has a row per
  // rank, so every rank's last-iteration figures travel to it in one all-gather (int64).
  void gather_rank_memory() {
    constexpr size_t K = kNumMemCategories, W = 2 * K + 2;
    const MemoryStats& m = t_.rank_memory_[static_cast<size_t>(env_.rank)];
    std::vector<int64_t> mine(W), all(W * static_cast<size_t>(N_));
    std::copy(m.current.begin(), m.current.end(), mine.begin());
    std::copy(m.peak.begin(), m.peak.end(), mine.begin() + K);
    mine[2 * K] = m.total_current;
    mine[2 * K + 1] = m.total_peak;
    // Through the rank's device memory: NCCL moves device buffers only.
    Tensor dm({static_cast<int64_t>(W)}, MemCategory::Other, nullptr, DType::I64, env_.dev);
    Tensor da({static_cast<int64_t>(all.size())}, MemCategory::Other, nullptr, DType::I64, env_.dev);
    env_.dev.upload(dm.raw(), mine.data(), static_cast<int64_t>(W * sizeof(int64_t)));
    env_.comm->all_gather(da.raw(), dm.raw(), static_cast<int64_t>(W), DType::I64)->wait();
    env_.dev.download(all.data(), da.raw(), static_cast<int64_t>(all.size() * sizeof(int64_t)));
    for (int r = 0; r < N_; r++) {
      MemoryStats& o = t_.rank_memory_[static_cast<size_t>(r)];
      const int64_t* v = all.data() + static_cast<size_t>(r) * W;
      std::copy(v, v + K, o.current.begin());
      std::copy(v + K, v + 2 * K, o.peak.begin());
      o.total_current = v[2 * K];
      o.total_peak = v[2 * K + 1];
    }
  }

 private:
  int64_t F() const { return c_.model.in_features(); }
  // The stages start as the one-rank model does (Trainer builds it as models_[0], on the host).
  static StageSetup stage_setup(const Trainer& t) {
    StageSetup s;
    if (!t.config_.init_path.empty()) s.init = t.models_[0].get();
    s.lora = t.config_.lora;
    s.activation_checkpointing = t.config_.activation_checkpointing;
    s.precision = t.config_.precision;
    s.amp = t.config_.amp;
    s.sequence_parallel = t.config_.sequence_parallel;
    s.cp.degree = t.config_.cp;
    s.ep = t.config_.ep;
    s.cp.layout = t.config_.cp_layout;
    return s;
  }
  Trainer& t_;
  const TrainConfig& c_;
  RankEnv env_;
  const PipelinePlan& plan_;
  const int N_;
  PipelineRank pipe_;
  PipelineMeter meter_;
  RankBatches data_;
  Tensor x_dev_, y_dev_, gathered_, mine_dev_;
  std::vector<float> all_;
  std::vector<PipelineRankIteration> records_;
  PipelineRankIteration mine_{};
  std::vector<double> bubbles_;
  std::unique_ptr<GradScaler> scaler_;  // fp16
  GradClipResult clip_;                 // --clip-grad-norm: this step's
  int64_t step_ = 0;
  float scale_ = 0;
  bool skipped_ = false;
};

std::unique_ptr<RankStrategy> make_pipeline_rank(const RankEnv& env) { return std::make_unique<PipelineTrainRank>(env); }

}  // namespace dtlab
