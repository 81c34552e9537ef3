// Pipeline parallelism's runtime. The model's Linear layers are cut into p*v contiguous stages
// (stage s on rank s % p, as pipeline_schedule.h places them); a rank holds only its stages: their
// parameters, gradients, optimizer state and the activations of its micro-batches in flight, all in
// its own MemoryTracker. It runs its row of the schedule action by action and talks to its
// neighbours with the communicator's send/recv only:
//   F     receive the previous stage's activation (stage 0: the micro-batch's rows), run the stage,
//         send the output on (the last stage computes the loss instead);
//   B     receive the output gradient (last stage: the loss gradient), run the stage's backward into
//         the gradients, send the input gradient back;
//   I, W  zero-bubble's halves of B: the input gradient (sent at once), the weight gradient later.
// Gradients accumulate over the micro-batches; engine/train steps the optimizers once per iteration,
// after all-reducing each stage's gradients among its data-parallel replicas.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/comm/group.h"
#include "engine/core/model.h"
#include "engine/core/optim.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/trace/context.h"

namespace dtlab {

struct PipelineOptions {
  int stages = 2;        // p: ranks per pipeline (--stages)
  int microbatches = 4;  // m: micro-batches per batch
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int chunks = 1;        // v: stages per rank (interleaved); the model is cut into p*v stages
  std::vector<int> split;  // Linear layers per stage in model order (p*v entries); empty: balanced
  int dp = 1;            // D: data-parallel replicas; world = p*D*tp, world rank = (replica*p + pipeline rank)*tp + tp rank
  // Equal stages on purpose (lessons, tests): every F, B, I and W costs these modeled seconds instead
  // of its FLOPs. With --profile ideal (free links) the measured bubble then equals formula_bubble().
  std::optional<ActionCosts> fixed_costs;
  // Post each send together with the receive of the rank's next action, as one operation. Always on
  // where the communicator needs it (NCCL: send_recv_fused()); tests turn it on elsewhere.
  bool fuse_p2p = false;
};

// Linear layers [first, end) of the model, i.e. Sequential indices 2*first .. 2*end-1 (the model's
// last Linear has no ReLU after it).
struct StageRange {
  int first = 0, end = 0;
  bool operator==(const StageRange&) const = default;
};

std::vector<int> parse_split(std::string_view text);  // "2,2,1"; dtlab::Error (one sentence) otherwise
// The stages' layer ranges: `split` as given, or (empty) the contiguous cut that minimises the
// largest stage's parameter count. dtlab::Error when the model has fewer Linear layers than stages
// or the split does not add up.
std::vector<StageRange> partition_stages(const ModelSpec& spec, int num_stages, const std::vector<int>& split = {});
int64_t stage_num_params(const ModelSpec& spec, StageRange s);
// The stage's first element in the full model's flat parameter buffer: a stage's flat buffer is the
// slice [offset, offset + stage_num_params) of the full model's.
int64_t stage_param_offset(const ModelSpec& spec, StageRange s);
std::string describe_stage(const ModelSpec& spec, StageRange s);  // "Sequential 0-3 (2 Linear), 4,352 parameters"

// What every rank agrees on before training.
struct PipelinePlan {
  PipelineOptions options;
  std::vector<StageRange> stages;  // p*v, model order
  PipelineSchedule schedule;       // make_schedule(kind, p, m, v)
  int ranks() const { return options.stages; }
  std::vector<int> stages_of_rank(int pipe_rank) const;  // pipe_rank, pipe_rank + p, ...
};
// Checks the options against the model, the batch (a multiple of m) and the world (p*D ranks), and
// generates the schedule; throws dtlab::Error with one sentence.
PipelinePlan plan_pipeline(const ModelSpec& spec, const PipelineOptions& opt, int64_t batch, int world_size);

// One rank's iteration, as plain doubles so that ranks can all-gather it bit for bit.
struct PipelineRankIteration {
  double loss_sum = 0, correct = 0, samples = 0;  // the last stage's samples; 0 on other ranks
  double first_begin = 0, last_end = 0;           // modeled seconds: its first action's start, last one's end
  double busy = 0;                                // its actions' modeled durations, summed
  double time[4] = {}, count[4] = {};             // per ActionType F, B, I, W: modeled time and actions
  double peak_inflight = 0;    // most (stage, mb) pairs between their F and their B or I
  double peak_inflight_w = 0;  // ... between their F and their B or W: activations held
};

// What every stage's model gets between its construction and its optimizer's, as the one-rank
// model gets it in Trainer: the starting values, LoRA, activation checkpointing.
struct StageSetup {
  // --init: a full host model (the one-rank layout, its frozen base under LoRA) whose values every
  // stage starts from; null: the seed's values.
  const Model* init = nullptr;
  LoraSpec lora;  // rank 0: none; else Model::enable_lora(lora, seed) on every stage
  // torch.utils.checkpoint per block inside each stage (Model::set_activation_checkpointing): a
  // micro-batch keeps only its blocks' outputs from F to B, and B (or I) runs each block again first.
  bool activation_checkpointing = false;
  // --precision bf16/fp16 (Model::set_precision on every stage, after LoRA): 16-bit parameters,
  // gradients and activations, 16-bit messages between the stages (half float32's bytes), and the
  // optimizer's fp32 master weights (Optimizer::step_mixed), as Megatron runs a bf16 pipeline.
  Precision precision = Precision::FP32;
  // --amp bf16/fp16 (an MLP's stages; Model::set_amp): torch.autocast inside each stage: float32
  // parameters, gradients and optimizer, 16-bit activations, so 16-bit messages between the stages.
  Precision amp = Precision::FP32;
  // --sequence-parallel (a GPT's stages, with --tp): each TP rank's stage keeps T/t positions of every
  // sample in its LayerNorm regions, and the stages send each other those positions only (Megatron's
  // pipeline under sequence parallelism sends the sequence-sharded tensor).
  bool sequence_parallel = false;
  // --cp (a GPT's stages; degree 1: off): each stage holds its CP rank's positions of every sample and
  // meets the others' keys through ring attention or Ulysses (GptCore), and the stages send each other
  // those positions only (Megatron's pipeline under context parallelism). A CP group is `degree`
  // neighbouring data-parallel indices of one pipeline rank and TP index: the pipeline's dp dimension
  // is replicas x cp, cp fastest, as the mesh's (engine/parallel/context_parallel.h). Its ranks read
  // the same batch; the rank is filled in by PipelineRank.
  ContextParallelSpec cp;
  // --ep (a GPT with --moe; 1: off): each MoE block's experts split over `ep` neighbouring
  // data-parallel indices of one pipeline rank (an EP group per stage, as Megatron's expert-parallel
  // ranks sit inside each pipeline stage); dispatch and combine are all-to-alls of that group. The
  // dense parameters' gradients are summed over the stage's replicas, the experts' over the replicas
  // holding the same experts (the expert-data-parallel group).
  int ep = 1;
};

class PipelineRank {
 public:
  // `rank` is the world rank; its stages' models are built from `seed` with the full model's values,
  // on `device` (every tensor of the rank lives there; `comm` moves that device's memory). Compute
  // ops report to `observer` (the device's timer), or to `ctx` when it is null.
  // `tp` > 1: each pipeline rank is a tensor-parallel group of `tp` neighbouring world ranks (torch's
  // init_device_mesh order, engine/core/mesh.h): world rank = (replica x p + pipeline rank) x tp + tp
  // index. Each holds its TP shard of its stages, and sends to and receives from the rank with its
  // tp index in the next and previous stage.
  PipelineRank(const PipelinePlan& plan, const ModelSpec& spec, int rank, Communicator& comm,
               RankContext* ctx, MemoryTracker* memory, uint64_t seed, const OptimizerConfig& optimizer,
               Device& device = cpu_device(), ComputeObserver* observer = nullptr, int tp = 1,
               const StageSetup& setup = {});
  ~PipelineRank();
  PipelineRank(const PipelineRank&) = delete;
  PipelineRank& operator=(const PipelineRank&) = delete;

  int pipe_rank() const { return pipe_rank_; }
  int replica() const { return replica_; }
  int tp_rank() const { return tp_rank_; }
  const std::vector<int>& stage_ids() const { return stage_ids_; }
  Model& stage_model(int k) { return *models_.at(static_cast<size_t>(k)); }  // k-th stage it holds
  int64_t num_params() const;  // of its stages

  void zero_grad();
  // Runs this rank's row of the schedule on one batch (on the device): x (B, D0) read by the first stage, y (B,) by
  // the last, cut into m micro-batches like torch.tensor_split (sizes differ by at most one). One
  // sample's loss weighs loss_scale (1 / the step's samples over every replica), so the gradients
  // accumulated over the micro-batches are those of the mean loss.
  // A GPT reads `tok` (B x T token ids) on its first stage instead of x, and y holds B x T targets.
  // `y_host`: the same targets in host memory where the device's are not (under --cp this rank picks
  // its positions' on the host; without it they are read back).
  PipelineRankIteration run_iteration(const float* x, const int64_t* y, int64_t B, float loss_scale,
                                      const int64_t* tok = nullptr, const int64_t* y_host = nullptr);
  // Data parallelism: sums each stage's gradients over the D replicas that hold it (a process group
  // of those ranks). With loss_scale over every replica's samples that sum is the average.
  // A GPT then sums the tied embedding's two gradients, the first stage's wte and the last stage's
  // lm_head copy, over Megatron's embedding group (those two ranks of the replica), so both copies
  // take the same step and stay equal.
  void reduce_gradients();
  // One optimizer step per stage; mixed precision: from the fp32 master weights, the gradients
  // multiplied by inv_scale first (fp16's GradScaler unscales them).
  void step(float inv_scale = 1.0f);
  bool mixed() const { return is_mixed(precision_); }
  int ep_rank() const { return ep_rank_; }  // --ep: this rank's place in its EP group (0 without)
  // This rank's index among its stage's dp x tp ranks, (replica, TP rank), TP fastest: --ep's groups
  // are runs of `ep` of them.
  int expert_index() const { return replica_ * tp_ + tp_rank_; }
  // Replica 0 sends its stages' parameters to rank 0, which writes them into `full`, a host model (null elsewhere);
  // with tp > 1 each TP group first gathers its stages' shards (a collective of replica 0's ranks).
  // Under LoRA the parameters are the adapters, and `full` is the one-rank LoRA model.
  void gather_parameters(Model* full);
  // The lab's views of a GPT's stages (the Context and Experts views): per stage this rank holds, the
  // activations of its micro-batch that ran F or B last, whose ring passes and routing they show
  // (their tensors freed after B; null before any). Read while the rank waits at a gate.
  std::vector<const GptCore*> view_cores() const;  // the stage that ran last first
  // Hands those over to outlive the run (the views keep showing its last micro-batches).
  std::vector<std::unique_ptr<GptCore>> take_view_cores();

 private:
  struct MicroBatch;
  void load_stage(Model& stage, StageRange r, const Model& full);  // --init: the stage's slice of `full`
  enum Dir { kForward = 0, kBackward = 1 };
  MicroBatch& state(int stage, int mb);
  int peer_of(int stage) const;
  int world_rank(int replica, int pipe_rank) const { return (replica * plan_.ranks() + pipe_rank) * tp_ + tp_rank_; }
  int tag_of(int stage, int mb, Dir dir) const;
  Tensor receive(int stage, int mb, Dir dir, int64_t rows, int64_t width);
  WorkPtr send(int stage, int mb, Dir dir, const Tensor& data, const Action* next = nullptr);
  // forward returns the output to send (null on the last stage, which computes the loss);
  // backward returns the input gradient to send (empty on stage 0).
  const Tensor* forward(int stage, int mb);
  Tensor backward(int stage, int mb, Tensor dout, bool input_only);
  // The GPT's F and B: a stage runs its blocks whole (GptCore), one set of saved activations per
  // micro-batch in flight, freed after its B.
  const Tensor* gpt_forward(int stage, int mb);
  Tensor gpt_backward(int stage, int mb, Tensor dout, bool input_only);
  void reduce_embedding_grads();
  // --ep: all-reduces (sum) of a stage's gradient runs over `group`: its experts' (experts true) or
  // everything else's, each run of adjacent parameters one collective.
  void reduce_runs(Model& m, Communicator& group, bool experts, std::vector<WorkPtr>& works);
  // What crosses a stage boundary per micro-batch: rows x width (the GPT: its B*T positions x C).
  int64_t boundary_rows(const MicroBatch& st) const;
  int64_t in_width(const Model& m) const;
  int64_t out_width(const Model& m) const;
  // A GPT stage's flat values written into the whole model's flat buffer, by name (the head's copy
  // of wte left out: the first stage's is the same).
  void scatter_gpt_stage(StageRange r, const float* stage_values, const Model& full, float* flat) const;
  void backward_weight(int stage, int mb);
  const void* layer_input(const MicroBatch& st, int stage, int i) const;
  void* recompute_buffer(int64_t n);  // checkpointing: a block's inner activation, shared by all stages
  Tensor activation(int64_t rows, int64_t width) const;  // (rows, width) in the stages' dtype
  // One layer in the stages' dtype (Model's float32 or 16-bit layer calls).
  void layer_forward(Model& m, int i, void* out, const void* in, int64_t rows, bool recompute = false);
  void record_action(const Action& a, int step, int index, int64_t wall0, double model0, int64_t bytes);

  const PipelinePlan& plan_;
  ModelSpec spec_;
  Precision precision_ = Precision::FP32;
  DType dtype_ = DType::F32;      // of the parameters and gradients: F32, BF16 or F16
  DType act_dtype_ = DType::F32;  // of the activations and messages: 16 bits under --precision and --amp
  bool half_acts() const { return act_dtype_ != DType::F32; }
  int rank_, tp_, pipe_rank_, replica_, tp_rank_;
  bool sequence_parallel_ = false;  // a GPT's stages send this TP rank's positions only
  int cp_ = 1;                      // --cp: the stages hold T / cp_ positions of every sample
  int ep_ = 1, ep_rank_ = 0;        // --ep: the EP group's size, and this rank's place (its experts)
  Communicator& comm_;
  RankContext* ctx_;
  MemoryTracker* memory_;
  Device& device_;
  ComputeObserver* observer_;  // the device's timer or ctx_, or null with fixed action costs
  Tensor stats_;               // the iteration's loss sums on the device (kLossStatsDoubles doubles)
  std::vector<int> stage_ids_;
  std::vector<std::unique_ptr<Model>> models_;
  std::vector<std::unique_ptr<Optimizer>> optimizers_;
  std::vector<MicroBatch> mbs_;              // [k * m + mb] for the k-th stage held
  std::vector<const GptCore*> shown_;        // view_cores(): per stage held, mbs_'s core that ran last
  size_t shown_last_ = 0;                    // the stage among them that ran last
  std::vector<std::pair<WorkPtr, Tensor>> sends_;  // input gradients in flight, kept until sent
  std::map<int, Tensor> local_;              // hand-offs between two stages of this rank (p = 1)
  Tensor recompute_;                         // checkpointing: (rows, widest Linear output), grown on demand
  // Fused point-to-point (the communicator's send_recv_fused(), or PipelineOptions::fuse_p2p): the
  // next action's input, posted with the previous send, and forward sends that carried one.
  bool fuse_p2p_ = false;
  struct Prefetched {
    int tag = 0;
    Tensor data;
    WorkPtr work;
  };
  std::optional<Prefetched> prefetched_;
  std::vector<WorkPtr> fused_;
  std::shared_ptr<GroupExecutor> executor_;
  std::unique_ptr<Communicator> dp_group_;   // the ranks holding the same stages, D > 1
  std::unique_ptr<Communicator> tp_group_;   // tp > 1 and a world of more than one TP group
  std::unique_ptr<TensorParallelComm> tp_comm_;  // the stages' f and g, over tp_group_ or the world
  std::unique_ptr<Communicator> emb_group_;  // a GPT's embedding group (first and last pipeline rank)
  // --cp: the CP group (ring attention's sends, Ulysses' all-to-alls), on its own executor: a ring
  // step inside a stage's forward must not queue behind the TP group's collectives.
  std::shared_ptr<GroupExecutor> cp_exec_;
  std::unique_ptr<Communicator> cp_group_;
  std::unique_ptr<ContextParallelComm> cp_comm_;
  std::vector<int64_t> cp_positions_;  // this rank's positions of T, in its rows' order
  std::vector<int64_t> cp_targets_;    // the batch's targets at those positions (B x T / cp_), on the host
  std::vector<int64_t> cp_all_;        // a GPU's: the batch's targets read back, B x T
  Tensor cp_targets_dev_;              // a GPU's: cp_targets_ uploaded
  // --ep: the EP group and the expert-data-parallel group (null when ep = dp), on their own executor.
  std::shared_ptr<GroupExecutor> ep_exec_;
  std::unique_ptr<Communicator> ep_group_, edp_group_;
  std::unique_ptr<ExpertParallelComm> ep_comm_;
  Communicator* emb_comm_ = nullptr;         // emb_group_, or the world when it is those two ranks
  // the current iteration
  const float* x_ = nullptr;
  const int64_t* tok_ = nullptr;
  const int64_t* y_ = nullptr;
  float loss_scale_ = 1;
  PipelineRankIteration it_;
};

}  // namespace dtlab
