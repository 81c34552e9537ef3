// A training run: data -> sampler -> loader -> model -> loss -> backward -> optimizer. Strategies:
//   single  one rank, in the calling thread
//   ddp     N ranks, each with its own model replica, sampler shard and optimizer, gradients
//           averaged by DistributedDataParallel (engine/parallel/ddp.h)
//   fsdp    N ranks, parameters/gradients/optimizer state sharded by FullyShardedDataParallel
//           (engine/parallel/fsdp.h) or ZeRO-1
//   pipeline  p stages x D replicas, each rank running its row of a pipeline schedule over its
//           stages (engine/parallel/pipeline.h), in its own loop (train_pipeline.cpp)
//   dp      torch.nn.DataParallel: N devices driven as one process, rank 0 holding the module, its
//           optimizer and the one loader of batch x N samples, scattering each batch to the
//           replicas it broadcasts every forward (engine/parallel/data_parallel.h), in its own loop
//           (train_dp.cpp); in this process only, on the CPU
// One trainer for every device: each rank's tensors live on its Device (engine/core/device.h), the
// CPU or a GPU, and the strategies above are the same code on both. Where the ranks run:
//   device cpu   backend threads (ranks as threads of this process), or socket (this process is one
//                rank of a world started by `dtlab-cli launch`)
//   device cuda  backend cuda (ranks as threads sharing the GPU, the step-by-step ring on device
//                buffers) or nccl (one GPU per rank: threads here, or one process per rank under
//                `dtlab-cli launch`); engine/cuda/platform.h makes those worlds.
// Front ends (CLI, app) configure it with TrainConfig, call run() and receive a StepReport per step.
// Both strategies run the same per-rank loop, so `single` is exactly DDP's one-rank reference.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/core/memory.h"
#include "engine/core/mesh.h"
#include "engine/core/model.h"
#include "engine/core/optim.h"
#include "engine/comm/socket_backend.h"
#include "engine/comm/threads_backend.h"
#include "engine/comm/world.h"
#include "engine/data/dataset.h"
#include "engine/data/loader.h"
#include "engine/data/sampler.h"
#include "engine/parallel/data_parallel.h"
#include "engine/parallel/ddp.h"
#include "engine/parallel/fsdp.h"
#include "engine/parallel/pipeline_stats.h"
#include "engine/trace/context.h"
#include "engine/trace/roofline.h"
#include "engine/monitor/step_report.h"
#include "engine/train/grad_scaler.h"
#include "engine/train/strategy.h"

namespace dtlab {

struct TrainConfig {
  Strategy strategy = Strategy::Single;
  int world_size = 1;
  ModelSpec model = ModelSpec::parse("mlp:2,64,64,3");
  std::string data = "spiral";
  int64_t batch = 64;       // per rank (dp: each device's piece; rank 0 loads batch x world)
  int64_t steps = 0;        // exactly one of steps / epochs is > 0
  int64_t epochs = 0;
  OptimizerConfig optimizer = default_optimizer_config(OptimizerKind::AdamW);
  uint64_t seed = 0;        // model init (torch.manual_seed) and the sampler's seed
  bool shuffle = true;
  bool drop_last = false;
  std::string init_path;    // safetensors to start from, or a sharded checkpoint's directory
  std::string save_path;    // safetensors written at the end (atomically)
  std::string save_sharded_path;  // fsdp: a directory with one file per rank plus index.json
  int threads = 0;          // BLAS threads; 0 = library default
  std::string trace_path;   // Chrome trace JSON written at the end (atomically)
  bool trace_modeled = false;  // trace timeline on the modeled clock instead of wall time
  std::string profile = "nvlink8";  // hardware profile of the modeled clock
  // The all-reduce's algorithm and every collective's protocol (NCCL_ALGO / NCCL_PROTO): Default
  // is "auto", the tuning model's pick per call (engine/trace/tuning.h). The algorithm stays ring
  // unless asked, so a run's pictures stay those of the lessons.
  Algorithm algo = collective_traits(CollectiveOp::AllReduce).default_algorithm;
  Protocol proto = Protocol::Default;
  // The final evaluation's samples: the training set's first eval_samples (0: every one).
  int64_t eval_samples = 0;
  // The all-to-alls' (expert parallelism's dispatch and combine, Ulysses'): pairwise (n-1 rounds, a
  // step each) or grouped (NCCL's one group of sends and receives: one step).
  Algorithm alltoall_algo = collective_traits(CollectiveOp::AllToAll).default_algorithm;
  int64_t accum = 1;        // gradient accumulation: micro-batches per optimizer step (no_sync)
  // The model's branch (unused-parameters lesson): on every `skip_every`-th step the forward
  // bypasses the square Linear at Sequential index `skip_layer` (and its ReLU). -1: no branch.
  int skip_layer = -1;
  int64_t skip_every = 2;
  std::vector<int> skip_ranks;  // the ranks whose forward takes the branch; empty: every rank
  // A non-finite loss (NaN or infinity) stops the run with a diagnosis (engine/train/nonfinite.h)
  // unless this is set: then training goes on, as a plain PyTorch loop would.
  bool allow_nonfinite = false;
  // Tensor parallelism (Megatron's MLP split, engine/core/mesh.h): ranks per TP group, composed with
  // every strategy; world = dp x stages x tp, laid out as torch's init_device_mesh (tp fastest).
  int tp = 1;
  // Mixture of experts in a GPT's blocks (--moe; engine/core/gpt_spec.h's MoeSpec): copied into
  // model.gpt.moe when the trainer builds the model, so --model and --moe may come in either order.
  MoeSpec moe;
  // Expert parallelism (--ep): each MoE block's experts split over groups of `ep` consecutive ranks
  // (engine/parallel/expert_parallel.h); DDP only.
  int ep = 1;
  // Context parallelism (--cp, --cp-layout): a GPT's sequence split over groups of `cp` ranks that
  // read the same batches (engine/parallel/context_parallel.h); ddp and fsdp, with --tp too.
  int cp = 1;
  CpLayout cp_layout = CpLayout::Ring;
  bool sequence_parallel = false;  // --sequence-parallel: g/f as reduce-scatter/all-gather
  // ddp
  DdpOptions ddp;
  // fsdp
  FsdpOptions fsdp;
  // pipeline: world_size must be pipeline.stages x pipeline.dp; `batch` is one replica's batch
  PipelineOptions pipeline;
  // threads backend (ddp)
  double timeout_s = 30;    // watchdog
  bool start_paused = false;  // stepper starts paused (the app)
  std::vector<Fault> faults;
  // Where the ranks run: "threads" (every rank a thread of this process) or "socket" (this process
  // is rank socket.rank of a world of processes, started by `dtlab-cli launch`; ddp and fsdp only).
  std::string backend = "threads";
  SocketOptions socket;     // socket: this rank, the world (= world_size) and rank 0's address
  std::string device = "cpu";  // where tensors live: "cpu" or "cuda"
  bool launched = false;       // one process per rank (dtlab-cli launch): backend socket, or nccl on cuda
  // socket: rank 0 serves a viewer (`dtlab --attach ADDR:PORT`) on this port and the other ranks
  // feed it their events (engine/monitor); 0: no viewer. The run starts paused and waits up to
  // monitor_wait_s for the viewer to attach.
  int monitor_port = 0;
  double monitor_wait_s = 300;
  // --activation-checkpointing: torch.utils.checkpoint per Linear+ReLU block (Model::
  // set_activation_checkpointing, which under --tp replays the blocks' TP collectives); not with the pipeline.
  bool activation_checkpointing = false;
  // LoRA (engine/core/model.h's LoraSpec; rank 0: off): the base weights are frozen and only the
  // adapters train, communicate and hold optimizer state. --save writes the adapters under peft's
  // names, or with merge_lora the merged plain model.
  LoraSpec lora;
  bool merge_lora = false;
  // --precision bf16/fp16: mixed precision (Model::set_precision, Optimizer::step_mixed; FSDP's fp32
  // master shards); single, ddp and fsdp (every sharding) on the CPU engine, threads or dtlab-cli launch.
  Precision precision = Precision::FP32;
  // --amp bf16/fp16: torch.autocast (Model::set_amp): float32 parameters, gradients and optimizer state,
  // 16-bit Linear operands and activations; fp16 adds torch's GradScaler on the float32 gradients.
  // Not with --precision (two layouts of 16-bit training).
  Precision amp = Precision::FP32;
  // --reduce-dtype fp32: 16-bit gradients are reduced in float32 (DDP's buckets, FSDP's reduce-scatter;
  // torch's MixedPrecision reduce_dtype); otherwise in the training dtype.
  bool reduce_fp32 = false;
  // fp16: torch's GradScaler (engine/train/grad_scaler.h). --inject-overflow: on these steps rank
  // inject_overflow_rank multiplies its loss gradient by a further 2^24, so its fp16 gradients really
  // overflow (the lesson's and the test's forced overflow).
  std::vector<int64_t> inject_overflow_steps;
  int inject_overflow_rank = 0;
  // --clip-grad-norm: torch.nn.utils.clip_grad_norm_(params, max_norm) before every optimizer step,
  // with the norm of the whole model's gradient however it is spread over the ranks
  // (engine/train/grad_clip.h); 0: off.
  double clip_grad_norm = 0;
  // Uneven inputs (the course's lesson 28): rank uneven_rank's data runs out one step before the
  // others' (-1: every rank has the same number of batches). Without --join the others wait in their
  // next all-reduce until the watchdog stops the run; with it the rank that ran out shadows their
  // collectives with zeros (torch.distributed.algorithms.Join with DDP's join hook, train_join.cpp).
  int uneven_rank = -1;
  bool join = false;
};

// The DistributedSampler a rank of this run draws from: `world` shards of `n` samples, the run's
// seed and shuffle, torch's padding (sampler drop_last false; the loader's --drop-last is separate).
SamplerConfig rank_sampler_config(const TrainConfig& c, int64_t n, int world, int rank);

// The peak FLOP/s of the hardware a run's ranks together use, which MFU divides a step's model FLOPs
// (every rank's samples) by: on GPUs `gpu_flops` each (the cuda backend's ranks share one; launched,
// a GPU a rank); on the CPU `flops_per_thread` times the BLAS threads the ranks of each machine can
// run at once (`cores` a machine; launched, LOCAL_WORLD_SIZE ranks a machine, world / local machines).
double world_peak_flops(const TrainConfig& c, bool launched, double gpu_flops, double flops_per_thread, int cores, int threads);

// One rank's batches as a training loop takes them: the sampler and DataLoader above, moving to the
// next epoch (the loop's sampler.set_epoch(epoch + 1)) when one runs out. Not movable: the loader
// holds the sampler.
class RankBatches {
 public:
  RankBatches(const TrainConfig& c, const Dataset& data, int world, int rank);
  RankBatches(const RankBatches&) = delete;
  RankBatches& operator=(const RankBatches&) = delete;
  const Batch& next();
  int64_t epoch() const { return epoch_; }
  int64_t epochs_started() const { return epoch_ + 1; }

 private:
  DistributedSampler sampler_;
  DataLoader loader_;
  Batch batch_;
  int64_t epoch_ = 0;
};

// Rank 0's report of one step from the sums every rank all-reduced: loss x samples, correct
// predictions and samples, over `seconds` of wall time.
StepReport make_step_report(int64_t step, int64_t total_steps, int64_t epoch, int64_t batch_size, double loss_sum,
                            double correct, double samples, double seconds);

struct TrainSummary {
  int64_t steps = 0;
  int64_t epochs_started = 0;
  double seconds = 0;             // wall time of the training loop
  double samples_per_sec = 0;
  float eval_loss = 0;            // over the whole training set after the last step
  double eval_accuracy = 0;
  int64_t eval_correct = 0, eval_samples = 0;
  MemoryStats memory;             // rank 0
  std::vector<MemoryStats> rank_memory;  // per rank, at the end: current, and peaks of the last iteration
  int64_t start_step = 0;         // from --init's metadata
  int64_t effective_batch = 0;    // per-rank batch x world x accum
  double mean_overlap = -1;       // ddp: mean over synchronised steps (dp: over steps)
  std::vector<std::string> buckets;  // ddp: the final bucket assignment, one line per bucket
  bool buckets_rebuilt = false;
  PipelineStats pipeline;         // pipeline: bubbles and in-flight micro-batches per rank
  // fp16: the steps each rank skipped (the loss scaler found an inf or NaN) and the final scale.
  std::vector<std::vector<int64_t>> rank_skipped_steps;
  float loss_scale = 0;           // 0: no loss scaler
};

// dtlab::Error unless the data's features equal the model's input width and its classes fit the
// output width.
void check_data_fits_model(const Dataset& data, const ModelSpec& spec);

struct EvalResult {
  float loss = 0;       // mean cross-entropy over the data set
  double accuracy = 0;
  int64_t correct = 0, samples = 0;
};

// Forward over the whole data set (or its first `limit` samples, when above 0) in chunks of `batch`
// rows (activations sized once), on the model's device (the loss and accuracy are computed on the host
// from the logits). When `logits` is given it receives (n, classes) outputs.
EvalResult evaluate(Model& model, const Dataset& data, int64_t batch, float* logits = nullptr, int64_t limit = 0);

// --fsdp-api and --reshard-after-forward against the rest of `c` (FSDP1's options named in FSDP1's
// words); dtlab::Error, one sentence. The run's validation calls it, and so do both front ends' flags.
void check_fsdp_options(const TrainConfig& c);

// Checks the configuration and prepares everything (data, model, optimizer); throws dtlab::Error
// with one sentence for any bad input before a single step runs.
class Trainer {
 public:
  explicit Trainer(const TrainConfig& config);
  ~Trainer();

  const TrainConfig& config() const { return config_; }
  const Dataset& dataset() const { return *dataset_; }
  Model& model() { return *models_[0]; }  // rank 0's replica (launched: this process's rank's), on its device
  // The model evaluated and saved at the end: rank 0's, or with --tp the full model gathered from the shards.
  Model& result_model() { return full_model_ ? *full_model_ : *models_[0]; }
  Model& rank_model(int rank) { return *models_.at(static_cast<size_t>(rank)); }
  // The GPT activations a pipeline rank's Context and Experts views read (a rank of this process): per
  // stage it holds, those of its micro-batch that ran F or B last; after the run, the last ones. Empty
  // for another strategy (rank_model(rank).gpt() is its) or before the rank starts. Read while the
  // world stands still.
  std::vector<const GptCore*> pipeline_view_cores(int rank) const;
  int64_t total_steps() const { return total_steps_; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }  // per rank (dp: rank 0's loader)
  int64_t effective_batch() const {
    return config_.batch * data_replicas() * config_.accum;  // a pipeline's, TP group's or CP group's ranks share one batch
  }
  // The replicas that read different batches: the mesh's dp dimension, whose CP groups (--cp, the
  // dimension's runs of cp) each read one.
  int data_replicas() const { return mesh_.dp / std::max(config_.cp, 1); }
  const PipelinePlan* pipeline_plan() const { return pipeline_.get(); }  // pipeline: stages and schedule; else null
  MemoryTracker& memory() { return *mem0_; }  // rank 0
  TraceRecorder& recorder() { return *recorder0_; }
  RankContext& context() { return *ctx0_; }   // rank 0
  // The in-process ranks (stepper, status, contexts); null for one rank here (single, launched).
  ThreadsWorld* world() { return world_ ? &world_->threads() : nullptr; }
  // Pauses and steps the run (a world's stepper; one rank: the trainer's own, with iteration gates
  // only, or a launched world's, which rank 0's viewer drives).
  Stepper& stepper() { return world_ ? world_->threads().stepper() : *stepper_; }
  Device& device(int rank);  // where `rank`'s tensors live
  // The device's own used and total bytes for `rank` (a GPU's cudaMemGetInfo); false on the CPU.
  bool device_memory(int rank, int64_t& used, int64_t& total);
  // One line (or two) saying where the ranks run: "cpu, 4 ranks as threads" or the CUDA runtime,
  // devices and backend.
  std::string describe_placement() const;
  // The roof one rank's kernels are held to (engine/trace/roofline.h): its GPU's datasheet row, or
  // this CPU's measured one-thread sgemm and memcpy times the rank's BLAS threads.
  Roof roof() const;
  // MFU's two figures: the model FLOPs of a step over `samples` (tokens for a GPT; PaLM's 6 N + 12 L C T
  // per token) and the peak FLOP/s of the hardware every rank together runs on (the GPUs they use, or
  // the cores their BLAS threads occupy). 0 when the GPU is not in the peak table.
  double model_flops(double samples) const;
  double peak_flops() const;
  // Ends a run in progress from another thread: every wait returns and run() throws CommError.
  void abort(const std::string& reason);
  // ddp: the initial bucket assignment, one line per bucket (known before run()).
  std::vector<std::string> planned_buckets() const;
  // The device mesh: dp x pp x tp (pp = the pipeline's stages, else 1; tp = --tp).
  const MeshShape& mesh() const { return mesh_; }
  // What `dtlab-cli train` prints at the start of a mesh run (--tp, or a pipeline with --dp): the
  // mesh, its groups per dimension, with --tp each Linear's split ("Linear 0 (2 -> 64):
  // column-parallel, 32 output features per rank"), then one line per rank (describe_mesh_rank).
  // Empty for other runs.
  std::vector<std::string> describe_mesh_lines() const;
  // "rank 5: dp 1, pp 0, tp 1 -- stage 0 (Linear 0, 2), TP shard 1 of 2, replica 1 of 2": the rank's
  // mesh coordinates and what it holds: its stages' Linear layers by Sequential index (or every
  // layer), its TP shard ("replicated in its TP group" where none of them is split), its replica.
  std::string describe_mesh_rank(int rank) const;

  // Runs every step; on_step is called on rank 0's thread after each optimizer step.
  TrainSummary run(const std::function<void(const StepReport&)>& on_step = {});

 private:
  struct RankState;
  struct MeshRank;  // a rank's process groups in a --tp run (train_mesh.cpp)
  std::unique_ptr<MeshRank> join_mesh(int rank, Communicator& world, Model& model);
  static Communicator* mesh_dp_group(MeshRank& mr);  // null when the mesh has one replica
  // --tp: the full model gathered from the TP shards at the end (evaluation, --save), and its start
  // values (--init) cut into each rank's shard.
  void build_tp_models(int first_rank, int end_rank, bool in_world);
  void gather_full_model(int rank, MeshRank& mr, Model& shard);
  // The one per-rank training loop (engine/train/rank_strategy.h's hooks, one RankStrategy per rank).
  void run_rank(int rank, Communicator* comm, RankContext* ctx, MemoryTracker& mem, TrainSummary& sum,
                const std::function<void(const StepReport&)>& on_step);
  void run_launched_rank(TrainSummary& sum, const std::function<void(const StepReport&)>& on_step);
  // The strategies' ranks (train_replica.cpp, train_dp.cpp, train_pipeline.cpp) work with the
  // trainer's data, models and per-rank tallies.
  friend class ReplicaRank;
  friend class DdpRank;
  friend class FsdpRank;
  friend class DataParallelRank;
  friend class PipelineTrainRank;
  // FSDP's end of a run: --save-sharded from the shards over `world` (every rank of the run: the DP
  // group's without --tp), then every rank gathers the full parameters.
  void finish_fsdp(FullyShardedDataParallel& fsdp, const Model& model, Communicator& world);
  // --save-sharded from replicas that each hold the whole model (or its TP piece): each parameter
  // written once, by the replica dedup_replicated_params picks (`world` null: one rank).
  void save_replicated_sharded(const Model& model, Communicator* world, int replica, int replicas);
  // Rank 0 writes --save from `model`; then every rank meets at a barrier.
  void save_at_end(int rank, const Model& model, Communicator* comm);
  EvalResult final_evaluation();                      // the result model over the training set
  void check_final_loss(const EvalResult& ev) const;  // a non-finite loss stops the run (RunStopped)
  TrainConfig config_;
  bool launched_ = false;  // this process runs one rank of a launched world (socket, or nccl)
  // one rank here (single, launched)
  std::unique_ptr<MemoryTracker> memory_;
  std::unique_ptr<TraceRecorder> recorder_;
  std::unique_ptr<CostModel> cost_;
  std::unique_ptr<RankContext> ctx_;
  std::unique_ptr<Stepper> stepper_;
  std::unique_ptr<Device> own_device_;  // its GPU (cuda); null on the CPU
  // the in-process ranks (ddp, fsdp, pipeline); declared before the models, which free into it
  std::unique_ptr<RankWorld> world_;
  MemoryTracker* mem0_ = nullptr;
  TraceRecorder* recorder0_ = nullptr;
  RankContext* ctx0_ = nullptr;
  std::unique_ptr<Dataset> dataset_;
  std::unique_ptr<PipelinePlan> pipeline_;  // pipeline: models_[0] is the full model, untracked, gathered at the end
  // pipeline_view_cores(): each rank's PipelineRank while it runs, then the activations it handed over.
  mutable std::mutex pipeline_views_mu_;
  std::vector<const PipelineRank*> pipeline_live_;
  std::vector<std::vector<std::unique_ptr<GptCore>>> pipeline_kept_;
  std::vector<std::unique_ptr<Model>> models_;
  MeshShape mesh_;
  std::unique_ptr<Model> full_model_;  // --tp: the unsplit model on the host, on no rank's tracker
  std::vector<MemoryStats> rank_memory_;
  std::vector<std::vector<int64_t>> rank_skipped_;
  // The training set's loss after the last step, when save_at_end computed it before saving (rank 0,
  // holding the result model); run() then reports it instead of evaluating again.
  std::unique_ptr<EvalResult> final_eval_;
  float loss_scale_for(const GradScaler& scaler, int64_t step, int rank) const;
  float loss_scale_ = 0;
  double total_samples_ = 0;  // rank 0's count of every rank's samples
  int64_t total_steps_ = 0;
  int64_t batches_per_epoch_ = 0;
  int64_t start_step_ = 0;
};

}  // namespace dtlab
