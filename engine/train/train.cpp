#include "engine/train/train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <filesystem>

#include "engine/core/check.h"
#include "engine/core/ops.h"
#include "engine/data/loader.h"
#include "engine/data/sampler.h"
#include "engine/io/atomic_file.h"
#include "engine/io/checkpoint.h"
#include "engine/io/sharded_checkpoint.h"
#include "engine/monitor/monitor.h"
#include "engine/train/config_json.h"
#include "engine/train/iteration_gate.h"
#include "engine/train/mesh_rank.h"
#include "engine/train/nonfinite.h"
#include "engine/trace/cost_model.h"
#include "engine/trace/export.h"
#if DTLAB_HAVE_CUDA
#include "engine/cuda/platform.h"
#endif

namespace dtlab {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The in-process world of `backend`: threads on the CPU, or a GPU world from the CUDA build.
std::unique_ptr<RankWorld> make_world(const std::string& backend, int n, const WorldOptions& wo) {
  if (backend == "threads") return make_threads_world(n, wo);
#if DTLAB_HAVE_CUDA
  if (backend == "cuda") return cuda::make_cuda_world(n, wo);
  if (backend == "nccl") return cuda::make_nccl_world(n, wo);
#endif
  throw Error("--backend " + backend + " needs the CUDA build of dtlab (this one is CPU only); use --device cpu");
}

// One rank's GPU, for a rank that runs alone in this process.
std::unique_ptr<Device> make_gpu(int rank, int device) {
#if DTLAB_HAVE_CUDA
  return cuda::make_device(rank, device);
#else
  throw Error("--device cuda needs the CUDA build of dtlab (this one is CPU only); use --device cpu");
#endif
}

// --tp and --sequence-parallel against the rest of the configuration (one sentence each).
void validate_tensor_parallel(const TrainConfig& c) {
  if (c.sequence_parallel && c.tp < 2)
    throw Error("--sequence-parallel splits activations across the tensor-parallel group; add --tp 2 or more");
  if (c.tp == 1) return;  // (a pipeline's world is checked against its stages by plan_pipeline)
  const bool pipeline = c.strategy == "pipeline";
  if (c.strategy != "ddp" && c.strategy != "fsdp" && !pipeline)
    throw Error("--tp splits each layer across the ranks of one replica; use it with --strategy ddp, fsdp or pipeline "
                "(e.g. --strategy ddp --world " + std::to_string(c.tp) + " --tp " + std::to_string(c.tp) + ")");
  const MeshShape m = resolve_mesh(c.world_size, c.tp, pipeline ? c.pipeline.stages : 1);
  if (c.backend != "threads" || c.device != "cpu")
    throw Error("--tp runs its ranks as threads of this process on the CPU in this version; use --backend threads --device cpu");
  if (pipeline && c.sequence_parallel)
    throw Error("--sequence-parallel with --strategy pipeline is not available in this version; drop one of them");
  if (pipeline && m.dp != c.pipeline.dp)
    throw Error("--world " + std::to_string(c.world_size) + " with --tp " + std::to_string(c.tp) + " and --stages " +
                std::to_string(c.pipeline.stages) + " leaves " + std::to_string(m.dp) + " data-parallel replicas, but --dp is " +
                std::to_string(c.pipeline.dp) + "; set --dp " + std::to_string(m.dp) + " or drop --world");
  if (!pipeline) check_tp_widths(c.model.dims, 0, static_cast<int>(c.model.dims.size()) - 1, c.tp);
  if (c.strategy == "fsdp" && c.fsdp.sharding == Sharding::Hybrid)
    throw Error("--sharding hybrid with --tp is not available in this version; the tensor-parallel groups already split "
                "each node, so use --sharding full");
  if (c.skip_layer >= 0) throw Error("--skip-layer is DDP's unused-parameters lesson; drop it with --tp");
  if (!c.save_sharded_path.empty())
    throw Error("--save-sharded with --tp is not available in this version; use --save for one full checkpoint");
  if (!c.init_path.empty() && is_checkpoint_dir(c.init_path))
    throw Error("--init from a sharded checkpoint with --tp is not available in this version; give a full .safetensors file");
}

// LoRA composes with single, ddp and fsdp; the rest is refused in one sentence.
void validate_lora(const TrainConfig& c) {
  if (c.lora.rank == 0) {
    if (c.merge_lora) throw Error("--merge-lora merges LoRA adapters; add --lora-rank R");
    return;
  }
  check_lora_spec(c.model, c.lora);
  if (c.strategy == "pipeline" || c.strategy == "dp")
    throw Error("--lora-rank with --strategy " + c.strategy + " is not available in this version; use --strategy single, ddp or fsdp");
  if (c.tp > 1) throw Error("--lora-rank with --tp is not available in this version; drop --tp");
  if (!c.save_sharded_path.empty())
    throw Error("--save-sharded with --lora-rank is not available in this version; use --save for the adapters");
  if (c.merge_lora && c.save_path.empty()) throw Error("--merge-lora says what --save writes; add --save PATH.safetensors");
}

// Mixed precision runs single, ddp and fsdp (FULL_SHARD, SHARD_GRAD_OP) on the CPU engine's threads in this version.
void validate_precision(const TrainConfig& c) {
  if (!is_mixed(c.precision)) {
    if (!c.inject_overflow_steps.empty())
      throw Error("--inject-overflow makes fp16 gradients overflow; add --precision fp16");
    if (c.reduce_fp32) throw Error("--reduce-dtype fp32 applies to 16-bit gradients; add --precision bf16 or fp16");
    return;
  }
  const std::string flag = std::string("--precision ") + precision_name(c.precision);
  if (c.strategy != "single" && c.strategy != "ddp" && c.strategy != "fsdp")
    throw Error(flag + " with --strategy " + c.strategy + " is not available in this version; use --strategy single, ddp or fsdp");
  if (c.strategy == "fsdp" && c.fsdp.sharding != Sharding::FullShard && c.fsdp.sharding != Sharding::ShardGradOp)
    throw Error(flag + " with --sharding " + sharding_flag(c.fsdp.sharding) +
                " is not available in this version; use --sharding full or grad-op");
  if (c.device != "cpu" || c.backend != "threads" || c.launched)
    throw Error(flag + " runs on the CPU engine's threads in this version; use --device cpu --backend threads");
  if (c.tp > 1) throw Error(flag + " with --tp is not available in this version; drop --tp or use --precision fp32");
  if (c.lora.rank > 0) throw Error(flag + " with --lora-rank is not available in this version; drop one of them");
  if (c.activation_checkpointing)
    throw Error(flag + " with --activation-checkpointing is not available in this version; drop one of them");
  if (c.ddp.gradient_as_bucket_view)
    throw Error(flag + " with --gradient-as-bucket-view is not available in this version; drop one of them");
  if (!c.inject_overflow_steps.empty() && c.precision != Precision::FP16)
    throw Error("--inject-overflow makes fp16 gradients overflow (bf16 has float32's range); use --precision fp16");
  if (c.inject_overflow_rank < 0 || c.inject_overflow_rank >= c.world_size)
    throw Error("--inject-overflow-rank " + std::to_string(c.inject_overflow_rank) + " is not a rank of this run; pick 0 to " +
                std::to_string(c.world_size - 1));
}

void validate(const TrainConfig& c) {
  validate_lora(c);
  validate_precision(c);
  if (c.strategy != "single" && c.strategy != "ddp" && c.strategy != "dp" && c.strategy != "fsdp" && c.strategy != "pipeline")
    throw Error("strategy '" + c.strategy + "' is not available in this version; use --strategy single, ddp, dp, fsdp or pipeline");
  if (c.strategy == "dp") {
    if (c.backend == "socket" || c.launched)
      throw Error("--strategy dp drives every device from one process, as torch.nn.DataParallel does, so it cannot run "
                  "one process per rank under dtlab-cli launch; use --strategy ddp there");
    if (c.device != "cpu")
      throw Error("--strategy dp runs on the CPU engine in this version; use --device cpu, or --strategy ddp on GPUs");
    if (c.skip_layer >= 0) throw Error("--skip-layer is DDP's unused-parameters lesson; drop it with --strategy dp");
  }
  if (c.strategy == "pipeline") {
    if (c.backend == "socket")
      throw Error("--strategy pipeline runs in one process on the CPU (--backend threads), or launched on GPUs (--device cuda, nccl); "
                  "drop dtlab-cli launch or add --device cuda");
    if (c.accum > 1) throw Error("--accum with --strategy pipeline: the micro-batches are the accumulation; use --microbatches");
    if (c.skip_layer >= 0) throw Error("--skip-layer is DDP's unused-parameters lesson; drop it with --strategy pipeline");
  }
  if (c.strategy == "fsdp" && c.accum > 1)
    throw Error("--accum with --strategy fsdp is not available in this version; use --strategy ddp for gradient accumulation");
  if (c.fsdp.node_size != 0 && (c.strategy != "fsdp" || c.fsdp.sharding != Sharding::Hybrid))
    throw Error("--node-size sets HYBRID_SHARD's shard group; use it with --strategy fsdp --sharding hybrid");
  if (c.strategy == "fsdp" && c.fsdp.sharding == Sharding::Hybrid && c.fsdp.node_size != 0 &&
      (c.fsdp.node_size < 1 || c.world_size % c.fsdp.node_size != 0))
    throw Error("--node-size " + std::to_string(c.fsdp.node_size) + " does not divide --world " +
                std::to_string(c.world_size) + "; HYBRID_SHARD needs equal node groups");
  if (c.device != "cpu" && c.device != "cuda")
    throw Error("--device " + c.device + " is not a device; use cpu or cuda");
  const bool gpu_backend = c.backend == "cuda" || c.backend == "nccl";
  if (c.backend != "threads" && c.backend != "socket" && !gpu_backend)
    throw Error("--backend " + c.backend + " is not a backend; use threads (ranks as threads of this process), "
                "socket (one process per rank, started by dtlab-cli launch), cuda or nccl (with --device cuda)");
  if (c.device == "cpu" && gpu_backend)
    throw Error("--backend " + c.backend + " moves GPU memory; add --device cuda, or use --backend threads on the CPU");
  if (c.device == "cuda" && !gpu_backend)
    throw Error("--device cuda runs on --backend cuda (ranks share a GPU) or nccl (one GPU per rank), not " + c.backend);
  if (c.device == "cuda" && c.launched && c.backend != "nccl")
    throw Error("under dtlab-cli launch, --device cuda runs --backend nccl, one GPU per process");
  const bool launched = c.backend == "socket" || c.launched;
  if (launched) {
    if (c.strategy == "single")
      throw Error("dtlab-cli launch runs one rank per process for --strategy ddp, fsdp or pipeline; add --strategy ddp");
    if (c.socket.world_size != c.world_size)
      throw Error("--world " + std::to_string(c.world_size) + " disagrees with WORLD_SIZE=" +
                  std::to_string(c.socket.world_size) + " from the launcher; drop --world under dtlab-cli launch");
    if (c.monitor_port != 0 && c.monitor_port == c.socket.master_port)
      throw Error("--monitor " + std::to_string(c.monitor_port) + " is the launcher's rendezvous port (MASTER_PORT); "
                  "pick another port for the viewer");
  }
  if (c.monitor_port != 0 && !launched)
    throw Error("--monitor serves a launched world to a viewer; run it under 'dtlab-cli launch --nproc-per-node N -- train ... "
                "--monitor PORT' (the dtlab window steps in-process runs itself)");
  if (c.monitor_port < 0 || c.monitor_port > 65535)
    throw Error("--monitor " + std::to_string(c.monitor_port) + " is not a port; use 1-65535");
  if (!(c.monitor_wait_s > 0)) throw Error("--monitor-wait must be greater than 0 seconds");
  if (c.strategy == "single" && c.world_size != 1)
    throw Error("--strategy single runs one rank, but --world is " + std::to_string(c.world_size) +
                "; drop --world, set it to 1, or use --strategy ddp");
  if (c.world_size < 1 || c.world_size > 64)
    throw Error("--world " + std::to_string(c.world_size) + " is out of range; use 1 to 64 ranks");
  if (c.batch < 1) throw Error("--batch must be at least 1 (got " + std::to_string(c.batch) + ")");
  if (c.accum < 1) throw Error("--accum must be at least 1 (got " + std::to_string(c.accum) + ")");
  if ((c.steps > 0) == (c.epochs > 0))
    throw Error("give exactly one of --steps K or --epochs E, each at least 1");
  if (!(c.optimizer.lr > 0)) throw Error("--lr must be greater than 0");
  if (c.optimizer.weight_decay < 0) throw Error("--weight-decay must be 0 or more");
  if (c.optimizer.momentum < 0 || c.optimizer.momentum >= 1)
    throw Error("--momentum must be in [0, 1)");
  if (c.skip_layer >= 0 && c.skip_every < 1)
    throw Error("--skip-every must be at least 1 (got " + std::to_string(c.skip_every) + ")");
  if (!c.skip_ranks.empty() && c.skip_layer < 0)
    throw Error("--skip-ranks names the ranks that take the --skip-layer branch; give --skip-layer too, or drop --skip-ranks");
  for (int r : c.skip_ranks)
    if (r < 0 || r >= c.world_size)
      throw Error("--skip-ranks names rank " + std::to_string(r) + ", but the world has ranks 0 to " +
                  std::to_string(c.world_size - 1) + "; pick ranks in that range");
  if (!(c.timeout_s > 0)) throw Error("--timeout must be greater than 0 seconds");
  if (c.strategy == "ddp") {
    if (c.ddp.bucket_cap_bytes < 1) throw Error("--bucket-cap-mb is too small: a bucket must hold at least 1 byte");
    if (c.ddp.first_bucket_bytes < 1) throw Error("--first-bucket-mb is too small: a bucket must hold at least 1 byte");
  }
  validate_tensor_parallel(c);
  if (c.activation_checkpointing && c.strategy == "pipeline")
    throw Error("--activation-checkpointing is not available with --strategy pipeline in this version (its stages run "
                "layer by layer); drop one of them");
  if (c.activation_checkpointing && c.tp > 1)
    throw Error("--activation-checkpointing is not available with --tp in this version; drop one of them");
  if (!c.save_path.empty()) check_output_path("--save", c.save_path);
  if (!c.save_sharded_path.empty()) {
    if (c.strategy != "fsdp")
      throw Error("--save-sharded writes each rank's FSDP shard; use it with --strategy fsdp, or --save for one full checkpoint");
    check_sharded_output_dir("--save-sharded", c.save_sharded_path);
  }
  if (!c.trace_path.empty()) check_output_path("--trace", c.trace_path);
}

// The loss of `step`, summed over the ranks (`reduced`), is non-finite: every rank learns which
// rank's own loss (`local`) went non-finite and where its forward first holds a non-finite value
// (one all-reduce of a code per rank), and raises the same sentence.
[[noreturn]] void stop_on_nonfinite(int64_t step, double local, double reduced, int rank, int world,
                                    Communicator* comm, const Model& model, bool input_bad) {
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
      throw RunStopped(nonfinite_stop_message(step, reduced, comm ? r : rank, NonFiniteSite::decode(codes[static_cast<size_t>(r)]), model));
  // No rank's own loss was non-finite: their sum overflowed.
  throw RunStopped(nonfinite_stop_message(step, reduced, -1, NonFiniteSite{NonFiniteSite::Loss, -1}, model));
}

// One rank's step buffers on its device.
struct StepBuffers {
  Tensor probs, dlogits;  // (B, C) softmax and the loss gradient
  Tensor x_dev, y_dev;    // (B, D), (B): a device's batch is uploaded here; the CPU reads the loader's rows
  // The step's loss x samples and correct count, accumulated on the device (two doubles; read
  // once per step), and the four figures every rank all-reduces, in memory the communicator moves.
  Tensor loss_stats, figures;
  StepBuffers(int64_t B, int64_t D, int64_t C, MemoryTracker& mem, Device& dev)
      : probs({B, C}, MemCategory::Activations, &mem, DType::F32, dev),
        dlogits({B, C}, MemCategory::Activations, &mem, DType::F32, dev),
        loss_stats({kLossStatsDoubles}, MemCategory::Other, nullptr, DType::F64, dev),
        figures({4}, MemCategory::Other, nullptr, DType::F32, dev) {
    if (!dev.is_host()) {
      x_dev = Tensor({B, D}, MemCategory::Activations, &mem, DType::F32, dev);
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
  // Cross-entropy of `logits` (B, C) against `y` into loss_stats, and its gradient into dlogits.
  // `loss_scale`: fp16's GradScaler multiplies the loss (so its gradient) by it; 1 otherwise.
  void loss(ComputeObserver* obs, const float* logits, const int64_t* y, int64_t B, int64_t C, int64_t accum,
            float loss_scale = 1.0f) {
    Device& dev = probs.device();
    {
      ComputeScope scope(obs, ComputeKind::Loss, -1, 5.0 * B * C);
      dev.cross_entropy_forward(probs.f32(), loss_stats.f64(), logits, y, B, C);
    }
    // The mean over the micro-batch, divided by the number of micro-batches (loss / accum).
    ComputeScope scope(obs, ComputeKind::LossBackward, -1, 2.0 * B * C);
    const float mean = 1.0f / static_cast<float>(B * accum);
    dev.cross_entropy_backward(dlogits.f32(), probs.f32(), y, B, C, loss_scale == 1.0f ? mean : mean * loss_scale);
  }
};

// Gives a model its observer back when the rank's loop ends, and takes its layer gate away.
struct RestoreObserver {
  Model& m;
  ComputeObserver* o;
  ~RestoreObserver() {
    m.set_observer(o);
    m.set_layer_gate(nullptr);
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

void check_data_fits_model(const Dataset& ds, const ModelSpec& spec) {
  if (ds.d != spec.in_features())
    throw Error("data " + ds.name + " has " + std::to_string(ds.d) + " features but " + spec.str() +
                " takes " + std::to_string(spec.in_features()) + " inputs; make the first width " +
                std::to_string(ds.d));
  if (ds.num_classes > spec.out_features())
    throw Error("data " + ds.name + " has " + std::to_string(ds.num_classes) + " classes but " +
                spec.str() + " has " + std::to_string(spec.out_features()) +
                " outputs; make the last width at least " + std::to_string(ds.num_classes));
}

EvalResult evaluate(Model& model, const Dataset& ds, int64_t batch, float* logits_out) {
  const int64_t C = model.spec().out_features();
  DTLAB_CHECK(batch > 0, "evaluate() needs a positive batch");
  const int64_t rows = std::min(batch, std::max<int64_t>(ds.n, 1));
  Tensor probs({rows, C}, MemCategory::Activations, nullptr);
  // A device model reads its inputs from device memory and hands its logits back to the host.
  Device& dev = model.device();
  dev.bind_thread();
  Tensor x_dev, logits_host;
  if (!dev.is_host()) {
    x_dev = Tensor({rows, ds.d}, MemCategory::Activations, nullptr, DType::F32, dev);
    logits_host = Tensor({rows, C}, MemCategory::Activations, nullptr);
  }
  EvalResult r;
  double loss_sum = 0;
  for (int64_t i = 0; i < ds.n; i += batch) {
    int64_t B = std::min(batch, ds.n - i);
    const float* x = ds.x.data() + i * ds.d;
    if (!dev.is_host()) {
      dev.upload(x_dev.f32(), x, B * ds.d * static_cast<int64_t>(sizeof(float)));
      x = x_dev.f32();
    }
    const float* logits = model.forward(x, B);
    if (!dev.is_host()) {
      dev.download(logits_host.f32(), logits, B * C * static_cast<int64_t>(sizeof(float)));
      logits = logits_host.f32();
    }
    loss_sum += static_cast<double>(cross_entropy_forward(probs.f32(), logits, ds.y.data() + i, B, C)) * B;
    r.correct += count_correct(logits, ds.y.data() + i, B, C);
    if (logits_out) std::copy(logits, logits + B * C, logits_out + i * C);
  }
  r.samples = ds.n;
  r.loss = ds.n > 0 ? static_cast<float>(loss_sum / static_cast<double>(ds.n)) : 0.0f;
  r.accuracy = ds.n > 0 ? static_cast<double>(r.correct) / static_cast<double>(ds.n) : 0.0;
  return r;
}

Trainer::Trainer(const TrainConfig& config) : config_(config) {
  validate(config_);
  if (config_.strategy == "fsdp" && config_.fsdp.sharding == Sharding::Hybrid && config_.fsdp.node_size == 0) {
    // HYBRID_SHARD's shard group defaults to a node of the hardware profile.
    const int k = find_profile(config_.profile).gpus_per_node;
    if (k >= config_.world_size || config_.world_size % k != 0)
      throw Error("--sharding hybrid needs node groups, but profile " + config_.profile + " has " + std::to_string(k) +
                  " ranks per node and --world is " + std::to_string(config_.world_size) +
                  "; pass --node-size K (a divisor of the world) or a multi-node profile such as ib2x4");
    config_.fsdp.node_size = k;
  }
  const int N = config_.world_size;
  launched_ = config_.backend == "socket" || config_.launched;  // this process runs one rank
  const bool in_world = config_.strategy != "single" && !launched_;  // ranks as threads here
  const int me = launched_ ? config_.socket.rank : 0;
  const bool pipeline = config_.strategy == "pipeline";
  if (pipeline)  // a TP group runs each pipeline rank's part: the pipeline sees dp x stages ranks
    pipeline_ = std::make_unique<PipelinePlan>(plan_pipeline(config_.model, config_.pipeline, config_.batch, N / config_.tp));
  mesh_ = resolve_mesh(N, config_.tp, pipeline ? config_.pipeline.stages : 1);
  if (pipeline && config_.tp > 1)  // Megatron pairs the Linear layers of each stage
    for (const StageRange& s : pipeline_->stages) check_tp_widths(config_.model.dims, s.first, s.end, config_.tp);
  // Instrumentation is always on (it costs well under 3% of a step, see bench/bench_step.cpp); the
  // trace file is only written when asked for.
  if (in_world) {
    WorldOptions wo;
    wo.timeout_s = config_.timeout_s;
    wo.profile = config_.profile;
    wo.allreduce_algo = config_.algo;
    wo.protocol = config_.proto;
    wo.start_paused = config_.start_paused;
    wo.faults = config_.faults;
    world_ = make_world(config_.backend, N, wo);
    mem0_ = &world_->threads().memory(0);
    recorder0_ = &world_->threads().recorder();
    ctx0_ = &world_->threads().context(0);
  } else {
    if (config_.device == "cuda") own_device_ = make_gpu(me, launched_ ? config_.socket.local_rank : 0);
    memory_ = std::make_unique<MemoryTracker>(me);
    recorder_ = std::make_unique<TraceRecorder>(N);
    cost_ = std::make_unique<CostModel>(find_profile(config_.profile), N);
    // A monitored world starts paused: its viewer (rank 0's hub) gives the first command.
    stepper_ = std::make_unique<Stepper>(N, config_.start_paused || config_.monitor_port != 0);
    ctx_ = std::make_unique<RankContext>(me, recorder_.get(), cost_.get(), stepper_.get(), memory_.get());
    mem0_ = memory_.get();
    recorder0_ = recorder_.get();
    ctx0_ = ctx_.get();
  }
  set_compute_threads(config_.threads);
  const ModelSpec& spec = config_.model;
  dataset_ = std::make_unique<Dataset>(
      make_dataset(config_.data, spec.in_features(), spec.out_features()));
  const Dataset& ds = *dataset_;
  if (ds.n == 0) throw Error("data " + config_.data + " holds no samples");
  check_data_fits_model(ds, spec);
  // Same count a DataLoader over this rank's DistributedSampler gives.
  // DataParallel has one loader, rank 0's, whose batches hold every device's piece.
  const bool dp = config_.strategy == "dp";
  const int64_t loader_batch = dp ? config_.batch * N : config_.batch;
  SamplerConfig sc;
  sc.n = ds.n;
  sc.world_size = dp ? 1 : mesh_.dp;  // a pipeline's or a TP group's ranks share their replica's shard
  const int64_t per_rank = DistributedSampler(sc).num_samples();
  batches_per_epoch_ = config_.drop_last ? per_rank / loader_batch : (per_rank + loader_batch - 1) / loader_batch;
  if (batches_per_epoch_ == 0)
    throw Error("--batch " + std::to_string(config_.batch) + (dp ? " x --world " + std::to_string(N) : std::string()) +
                " is larger than the " + std::to_string(per_rank) + " samples " + (dp ? "rank 0's loader" : "each rank") +
                " gets from " + config_.data + ", so --drop-last leaves no batch; use a smaller --batch");
  if (dp) check_dp_pieces(ds.n, loader_batch, config_.drop_last, N);
  // --epochs E runs E epochs of micro-batches, `accum` of them per optimizer step.
  total_steps_ = config_.steps > 0 ? config_.steps : config_.epochs * batches_per_epoch_ / config_.accum;
  if (total_steps_ < 1)
    throw Error("--epochs " + std::to_string(config_.epochs) + " gives " +
                std::to_string(config_.epochs * batches_per_epoch_) + " micro-batches, fewer than --accum " +
                std::to_string(config_.accum) + "; use more epochs or a smaller --accum");

  if (!config_.init_path.empty()) check_checkpoint_size(config_.init_path, spec);  // before building the replicas
  if (config_.tp > 1 && !pipeline) {  // a pipeline builds its stages' shards in run()
    build_tp_models(me, N, in_world);
    return;
  }
  for (int r = me; r < (launched_ || pipeline ? me + 1 : N); r++) {
    // Each rank builds its replica as a separate process would (socket: this process is one). Rank
    // r > 0 seeds with seed + r, so the replicas really differ until DDP broadcasts rank 0's parameters.
    // A pipeline's ranks build their stages in run(); this full copy, on no rank's tracker, holds
    // the initial values (--init) and receives the trained stages for evaluation and --save.
    MemoryTracker* mem = pipeline ? nullptr : in_world ? &world_->threads().memory(r) : memory_.get();
    Device& dev = pipeline ? cpu_device() : device(r);  // the pipeline's full copy stays on the host
    dev.bind_thread();
    models_.push_back(std::make_unique<Model>(spec, mem, config_.seed + static_cast<uint64_t>(r), dev));
    models_.back()->set_activation_checkpointing(config_.activation_checkpointing && !pipeline);
    if (config_.skip_layer >= 0) {
      models_.back()->set_skipped_layer(config_.skip_layer);  // validates the layer
      models_.back()->set_skipped_layer(-1);
    }
    if (!config_.init_path.empty())
      start_step_ = (is_checkpoint_dir(config_.init_path) ? load_sharded_checkpoint(config_.init_path, *models_.back())
                                                          : load_checkpoint(config_.init_path, *models_.back())).step;
    if (config_.lora.rank > 0) {
      // The frozen base is the same pretrained model on every rank (torch's DDP broadcasts frozen
      // parameters too); the adapters start from seed + r like any replica's parameters.
      if (r > 0 && config_.init_path.empty()) init_like_torch(*models_.back(), config_.seed);
      models_.back()->enable_lora(config_.lora, config_.seed + static_cast<uint64_t>(r));
    }
    // torch's model.to(torch.bfloat16) after construction (and --init): the 16-bit copy replaces the float32 one.
    if (is_mixed(config_.precision)) models_.back()->set_precision(config_.precision);
    models_.back()->set_observer(in_world ? &world_->threads().context(r) : ctx_.get());
  }
}

Device& Trainer::device(int rank) {
  if (world_) return world_->device(rank);
  return own_device_ ? *own_device_ : cpu_device();
}

bool Trainer::device_memory(int rank, int64_t& used, int64_t& total) {
  return device(rank).memory_info(used, total);
}

std::string Trainer::describe_placement() const {
  const int n = config_.world_size;
  const std::string ranks = std::to_string(n) + (n == 1 ? " rank" : " ranks");
  if (config_.device == "cpu")
    return launched_ ? "cpu: rank " + std::to_string(config_.socket.rank) + " of " + ranks + " (one process each, socket backend)"
                     : "cpu: " + ranks + (n > 1 ? " as threads of this process" : "");
  std::string where = config_.strategy == "single" ? "one rank on device 0"
                      : launched_ ? "this process is rank " + std::to_string(config_.socket.rank) + " on device " +
                                        std::to_string(config_.socket.local_rank) + ", NCCL collectives"
                      : config_.backend == "cuda" ? ranks + " as threads sharing device 0, ring collectives on device memory"
                                                  : ranks + ", one GPU each, NCCL collectives";
#if DTLAB_HAVE_CUDA
  return cuda::runtime_summary() + "\n  " + where;
#else
  return where;
#endif
}

void Trainer::abort(const std::string& reason) {
  if (world_) world_->abort(reason);
  else stepper_->abort();
}

Trainer::~Trainer() {
  for (auto& m : models_) m->set_observer(nullptr);
}

std::vector<std::string> Trainer::planned_buckets() const {
  if (config_.strategy != "ddp") return {};
  const Model& m = *models_[0];
  return describe_bucket_assignment(m, construction_bucket_assignment(parameter_bytes(m), config_.ddp));
}

TrainSummary Trainer::run(const std::function<void(const StepReport&)>& on_step) {
  const Dataset& ds = *dataset_;
  TrainSummary sum;
  sum.start_step = start_step_;
  sum.effective_batch = effective_batch();
  rank_memory_.assign(static_cast<size_t>(config_.world_size), MemoryStats{});
  rank_skipped_.assign(static_cast<size_t>(config_.world_size), {});
  loss_scale_ = 0;
  total_samples_ = 0;
  auto t_start = Clock::now();
  if (world_) {
    world_->run([&](int rank, Communicator& comm, RankContext& ctx, Device&) {
      MemoryTracker& mem = world_->threads().memory(rank);
      if (pipeline_) run_pipeline_rank(rank, comm, ctx, mem, sum, on_step);
      else if (config_.strategy == "dp") run_dp_rank(rank, comm, ctx, mem, sum, on_step);
      else run_rank(rank, &comm, &ctx, mem, sum, on_step);
    });
  } else if (launched_) {
    run_launched_rank(sum, on_step);
  } else {
    run_rank(0, nullptr, ctx_.get(), *memory_, sum, on_step);
  }
  sum.seconds = seconds_since(t_start);
  sum.steps = total_steps_;
  sum.samples_per_sec = sum.seconds > 0 ? total_samples_ / sum.seconds : 0;
  sum.rank_memory = rank_memory_;
  sum.memory = rank_memory_[static_cast<size_t>(ctx0_->rank())];
  sum.rank_skipped_steps = rank_skipped_;
  sum.loss_scale = loss_scale_;

  Model& model = result_model();
  ComputeObserver* obs = model.observer();
  model.set_observer(nullptr);  // evaluation is not part of the training trace
  EvalResult ev = evaluate(model, ds, config_.batch);
  model.set_observer(obs);
  sum.eval_loss = ev.loss;
  sum.eval_accuracy = ev.accuracy;
  sum.eval_correct = ev.correct;
  sum.eval_samples = ev.samples;

  if (!config_.trace_path.empty() && ctx0_->rank() == 0) {  // socket: rank 0's own events
    TraceExportOptions opt;
    opt.clock = config_.trace_modeled ? TraceClock::Modeled : TraceClock::Wall;
    opt.title = "dtlab train --strategy " + config_.strategy + " " + config_.model.str() + " on " + ds.name;
    opt.labels = recorder0_->labels();
    export_chrome_trace(config_.trace_path, recorder0_->all_events(), opt);
  }
  return sum;
}

// One rank of a world of processes: join it (socket: every rank's SocketCommunicator connects to
// every other; nccl: ncclCommInitRank after the same TCP rendezvous), run the same per-rank loop as
// an in-process world, and on failure tell the peers why.
void Trainer::run_launched_rank(TrainSummary& sum, const std::function<void(const StepReport&)>& on_step) {
  SocketOptions so = config_.socket;
  so.timeout_s = config_.timeout_s;
  so.algorithms.allreduce = config_.algo;
  so.algorithms.protocol = config_.proto;
  so.faults = config_.faults;
  const int rank = so.rank;
  // With --monitor, rank 0 serves a viewer and the other ranks feed it; rank 0's stepper decides
  // every rank's gates. Made before the rendezvous, so the feeds connect while the world forms.
  std::mutex live_mu;  // guards `live`: the communicator while it exists
  SocketCommunicator* live = nullptr;
  auto status = [this, &live, &live_mu] {
    RankMonitorStatus s;
    s.compute_activity = ctx_->activity();
    s.memory = memory_->stats();
    std::lock_guard<std::mutex> lock(live_mu);
    if (SocketCommunicator* c = live) {
      const SocketCommStatus cs = c->status();
      s.comm_activity = cs.activity;
      s.current_seq = cs.current_seq;
      s.done_seq = cs.done_seq;
      s.desc = cs.desc;
      s.steps_done = cs.steps_done;
      s.steps = cs.steps;
    }
    return s;
  };
  std::unique_ptr<MonitorHub> hub;
  std::unique_ptr<MonitorFeed> feed;
  if (config_.monitor_port != 0) {
    MonitorOptions mo;
    mo.addr = so.master_addr;
    mo.port = config_.monitor_port;
    mo.rank = rank;
    mo.world_size = so.world_size;
    mo.timeout_s = config_.timeout_s;
    mo.wait_s = config_.monitor_wait_s;
    if (rank == 0) {
      hub = std::make_unique<MonitorHub>(mo, *recorder_, *stepper_, train_config_to_json(config_), total_steps_, status,
                                         [this, &live, &live_mu](const std::string& why) {
                                           stepper_->abort();
                                           std::lock_guard<std::mutex> lock(live_mu);
                                           if (live) live->abort(why);
                                         });
    } else {
      feed = std::make_unique<MonitorFeed>(mo, *recorder_, status);
      stepper_->set_relay(feed.get());
    }
  }
  struct Unrelay {
    Stepper& s;
    ~Unrelay() { s.set_relay(nullptr); }
  } unrelay{*stepper_};
  auto report = [&](const StepReport& r) {
    if (hub) hub->add_report(r);
    if (on_step) on_step(r);
  };
  ctx_->set_activity("joining the world at " + so.master_addr + ":" + std::to_string(so.master_port));
  try {
    // The socket communicator (CPU), or NCCL on this rank's GPU; `socket` is null for the latter,
    // whose watchdog aborts the NCCL communicator itself.
    std::unique_ptr<SocketCommunicator> socket;
#if DTLAB_HAVE_CUDA
    std::unique_ptr<cuda::LaunchedRank> nccl;
#endif
    Communicator* comm = nullptr;
    if (config_.backend == "socket") {
      socket = std::make_unique<SocketCommunicator>(so, ctx_.get());
      comm = socket.get();
    } else {
#if DTLAB_HAVE_CUDA
      nccl = cuda::join_nccl(so, *own_device_, ctx_.get());
      comm = &nccl->comm();
#endif
    }
    DTLAB_CHECK(comm, "a launched rank needs the socket or nccl backend");
    struct Live {  // `live` names the socket communicator exactly while it exists
      std::mutex& mu;
      SocketCommunicator*& p;
      Live(std::mutex& m, SocketCommunicator*& ptr, SocketCommunicator* c) : mu(m), p(ptr) { std::lock_guard<std::mutex> l(mu); p = c; }
      ~Live() { std::lock_guard<std::mutex> l(mu); p = nullptr; }
    } live_guard(live_mu, live, socket.get());
    try {
      if (pipeline_) run_pipeline_rank(rank, *comm, *ctx_, *memory_, sum, report);
      else run_rank(rank, comm, ctx_.get(), *memory_, sum, report);
      stepper_->rank_done(rank);  // rank 0's stepper stops waiting for its own rank (others: their Bye says it)
    } catch (const std::exception& e) {
      const std::string why = hub ? hub->failure() : std::string();
      if (!why.empty()) {
        if (socket) socket->abort(why);
        throw Error(why);
      }
      // A no-op when the communicator already failed with this diagnosis.
      if (socket)
        socket->abort(dynamic_cast<const CommError*>(&e) ? std::string(e.what()) : "rank " + std::to_string(rank) + " failed: " + e.what());
      throw;
    }
  } catch (const std::exception& e) {
    if (hub) hub->finish(e.what());
    throw;
  }
  ctx_->set_activity("finished");
  if (feed) feed->finish();
  if (hub) hub->finish("");
}

// fp16: the loss scale for this rank's step; --inject-overflow multiplies it by 2^24 on the chosen
// steps and rank (65536 x 2^24 x the mean's 1/B is far beyond fp16's 65504: the gradients overflow).
float Trainer::loss_scale_for(const GradScaler& scaler, int64_t step, int rank) const {
  const bool inject = rank == config_.inject_overflow_rank &&
                      std::count(config_.inject_overflow_steps.begin(), config_.inject_overflow_steps.end(), step) > 0;
  return inject ? scaler.scale() * 16777216.0f : scaler.scale();
}

// GradScaler.step + update: this rank's inf/NaN check, the ranks' agreement (an all-reduce), the
// scale's update, and the decision as a LossScale event. False: every rank skips this step.
bool Trainer::scaler_allows_step(GradScaler& scaler, Model& model, Communicator* comm, RankContext* ctx) {
  const bool found = scaler.unscale_grads(model);
  const bool any = GradScaler::agree(comm, found, model.device());
  const float before = scaler.scale();
  scaler.update(any);
  if (ctx && ctx->recorder()) {
    const int64_t now = ctx->recorder()->now_ns();
    const double t = ctx->compute_clock();
    Event e(EventKind::LossScale, Lane::Compute, now, now, t, t);
    e.scaler = LossScaleInfo{before, scaler.scale(), static_cast<uint8_t>(found), static_cast<uint8_t>(any), scaler.growth_tracker()};
    ctx->record(e);
  }
  return !any;
}

// The step's update: fp16's scaler decides first (every rank the same way), then the optimizer runs
// on whatever holds the gradients (FSDP's shards, DDP's buckets, the model; mixed precision's master
// weights, unscaled). False: the step was skipped.
bool Trainer::optimizer_step(const StepParts& p) {
  const float scale = p.scaler ? p.scaler->scale() : 0.0f;
  if (p.scaler && !scaler_allows_step(*p.scaler, p.model, p.dp_comm, p.ctx)) return false;
  ComputeScope scope(p.obs, ComputeKind::OptimizerStep, -1, 10.0 * p.model.num_params());
  if (p.fsdp) p.fsdp->step();
  else if (p.model.mixed()) p.opt.step_mixed(p.model.params16(), p.model.grads16(), p.scaler ? 1.0f / scale : 1.0f);
  else if (p.ddp) p.opt.step(p.ddp->optimizer_segments());
  else p.opt.step(p.model.params(), p.model.grads());
  return true;
}

void Trainer::run_rank(int rank, Communicator* comm, RankContext* ctx, MemoryTracker& mem, TrainSummary& sum,
                       const std::function<void(const StepReport&)>& on_step) {
  const Dataset& ds = *dataset_;
  Model& model = *models_[world_ ? static_cast<size_t>(rank) : 0];
  Device& dev = model.device();
  dev.bind_thread();  // run() may be called on any thread (the lab's worker)
  const int N = config_.world_size;
  const int64_t D = config_.model.in_features(), C = config_.model.out_features();
  const int64_t A = config_.accum;
  // On a GPU the ops are timed with events on the stream (the host only enqueues them); the CPU
  // reports to the context directly.
  std::unique_ptr<DeviceTimer> timer = dev.make_timer(ctx);
  const RankContext::TimerAttachment attached(ctx, timer.get());
  ComputeObserver* const obs = timer ? static_cast<ComputeObserver*>(timer.get()) : ctx;
  ComputeObserver* const model_obs = model.observer();
  model.set_observer(obs);
  const RestoreObserver restore{model, model_obs};
  model.set_layer_gate(ctx);  // a stepped run pauses before each layer (restore puts it back to none)

  // --tp: the rank's TP group runs the model's f and g; DDP or FSDP work over its DP group (none
  // when the mesh has one replica).
  std::unique_ptr<MeshRank> mesh = config_.tp > 1 ? join_mesh(rank, *comm, model) : nullptr;
  Communicator* const dp_comm = mesh ? mesh_dp_group(*mesh) : comm;
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<FullyShardedDataParallel> fsdp;
  if (dp_comm && config_.strategy == "fsdp") {
    fsdp = std::make_unique<FullyShardedDataParallel>(model, *dp_comm, ctx, config_.fsdp, config_.optimizer, config_.reduce_fp32);
  } else if (dp_comm) {
    ddp = std::make_unique<DistributedDataParallel>(model, *dp_comm, ctx, config_.ddp, config_.reduce_fp32);
  }
  Optimizer opt(config_.optimizer, model.num_params(), &mem, dev);
  if (model.mixed() && !fsdp) opt.init_master(model.params16(), model.half_format());  // FSDP's shards are its own masters
  std::unique_ptr<GradScaler> scaler = config_.precision == Precision::FP16 ? make_grad_scaler(fsdp.get()) : nullptr;

  const MeshCoord at = mesh_coord(mesh_, rank);
  RankBatches data(config_, ds, mesh_.dp, at.dp);  // a TP group's ranks read their replica's batches

  StepBuffers buf(config_.batch, D, C, mem, dev);

  double overlap_sum = 0;
  int64_t overlap_n = 0;
  int64_t last_batch = 0;  // the step's last micro-batch (the last of an epoch may be partial)
  for (int64_t step = 1; step <= total_steps_; step++) {
    const int32_t iter = static_cast<int32_t>(step - 1);
    enter_iteration(ctx, rank, iter);
    mem.reset_peaks();
    auto t0 = Clock::now();
    const bool branch = config_.skip_layer >= 0 && step % config_.skip_every == 0 &&
                        (config_.skip_ranks.empty() || std::count(config_.skip_ranks.begin(), config_.skip_ranks.end(), rank) > 0);
    model.set_skipped_layer(branch ? config_.skip_layer : -1);
    int64_t samples = 0;
    bool input_bad = false;  // a micro-batch of this step holds NaN or infinity (checked on the host)
    buf.loss_stats.zero();
    {
      ComputeScope scope(obs, ComputeKind::ZeroGrad, -1, 0.0);
      if (fsdp) fsdp->zero_grad();
      else model.zero_grad();
    }
    for (int64_t micro = 0; micro < A; micro++) {
      const Batch& batch = data.next();
      const int64_t B = last_batch = batch.size;
      if (!config_.allow_nonfinite && !input_bad) input_bad = has_nonfinite(batch.x.data(), B * D);
      const auto [x, y] = buf.place(batch, D);
      if (ddp) ddp->before_forward();
      buf.loss(obs, model.forward(x, B), y, B, C, A, scaler ? loss_scale_for(*scaler, step, rank) : 1.0f);
      samples += B;
      const bool sync = micro == A - 1;  // no_sync() for the first A - 1 micro-batches
      if (ddp) ddp->prepare_for_backward(sync);
      model.backward(buf.dlogits.f32(), ddp ? ddp->grad_ready_hook() : Model::GradReadyHook{});
      if (ddp) ddp->finalize_backward();
      if (fsdp) fsdp->finalize_backward();
    }
    const float scale = scaler ? scaler->scale() : 0.0f;
    const bool skipped = !optimizer_step({model, opt, ddp.get(), fsdp.get(), scaler.get(), dp_comm, ctx, obs});
    if (skipped) rank_skipped_[static_cast<size_t>(rank)].push_back(step);
    double loss_sums[kLossStatsDoubles];
    dev.download(loss_sums, buf.loss_stats.f64(), sizeof loss_sums);  // the host's one wait for the device per step
    // Non-finite input stops the step even when the loss comes out finite (a ReLU can zero an
    // infinity whose gradient is still NaN): this rank's loss counts as NaN, so every rank sees it.
    if (input_bad) loss_sums[0] = std::numeric_limits<double>::quiet_NaN();
    double overlap = ddp ? ddp->last_stats().overlap() : -1;
    // Every rank computes its own loss; the reported figures are the all-reduced means (no
    // rank-0-only synchronisation).
    // A TP group's ranks compute the same loss on the same batch: its first rank speaks for it.
    double m[4] = {loss_sums[0], loss_sums[1], static_cast<double>(samples), overlap};
    if (at.tp != 0) m[0] = m[1] = m[2] = m[3] = 0;
    if (comm) sum_over_ranks(*comm, buf.figures, m);
    if (!config_.allow_nonfinite && !std::isfinite(m[0]))
      stop_on_nonfinite(step, loss_sums[0], m[0], rank, comm ? N : 1, comm, model, input_bad);
    if (timer) timer->flush();
    if (ctx) ctx->end_iteration();
    const double dt = seconds_since(t0);
    rank_memory_[static_cast<size_t>(rank)] = mem.stats();
    if (rank != 0) continue;
    total_samples_ += m[2];
    if (ddp) {
      overlap_sum += m[3] / mesh_.dp;
      overlap_n++;
    }
    StepReport r = make_step_report(step, total_steps_, data.epoch(), last_batch, m[0], m[1], m[2], dt);
    r.overlap = ddp ? m[3] / mesh_.dp : -1;
    r.branch_taken = branch;
    r.loss_scale = scale;
    r.step_skipped = skipped;
    if (on_step) on_step(r);
  }
  if (scaler && rank == 0) loss_scale_ = scaler->scale();
  model.set_skipped_layer(-1);
  if (fsdp) finish_fsdp(*fsdp, model, *dp_comm);
  if (mesh) gather_full_model(rank, *mesh, model);  // rank 0's full_model_ gets every shard
  dev.synchronize();
  if (timer) timer->flush();
  if (rank == 0) {
    sum.epochs_started = data.epochs_started();
    sum.mean_overlap = overlap_n ? overlap_sum / static_cast<double>(overlap_n) : -1;
    if (ddp) {
      sum.buckets = ddp->describe_buckets();
      sum.buckets_rebuilt = ddp->rebuilt();
    }
  }
  save_at_end(rank, mesh && rank == 0 ? *full_model_ : model, comm);
}

void Trainer::finish_fsdp(FullyShardedDataParallel& fsdp, const Model& model, Communicator& comm) {
  // Each rank writes what it owns, before the shards are gathered back.
  if (!config_.save_sharded_path.empty())
    save_sharded_checkpoint(config_.save_sharded_path, model, fsdp.owned_slices(),
                            {comm.rank(), comm.world_size(), [&] { comm.barrier()->wait(); }},
                            start_step_ + total_steps_, sharding_name(config_.fsdp.sharding));
  fsdp.materialize();  // every rank gathers the full parameters back (evaluation, --save)
}

SamplerConfig rank_sampler_config(const TrainConfig& c, int64_t n, int world, int rank) {
  SamplerConfig sc;
  sc.n = n;
  sc.world_size = world;
  sc.rank = rank;
  sc.shuffle = c.shuffle;
  sc.seed = c.seed;
  sc.drop_last = false;  // torch's default: pad by wrapping around so every rank gets as many
  return sc;
}

RankBatches::RankBatches(const TrainConfig& c, const Dataset& data, int world, int rank)
    : sampler_(rank_sampler_config(c, data.n, world, rank)), loader_(data, sampler_, c.batch, c.drop_last) {
  loader_.start_epoch(0);
}

const Batch& RankBatches::next() {
  if (!loader_.next(batch_)) {  // epoch exhausted: the user's loop calls set_epoch(epoch + 1)
    loader_.start_epoch(++epoch_);
    DTLAB_CHECK(loader_.next(batch_), "a fresh epoch produced no batch");
  }
  return batch_;
}

StepReport make_step_report(int64_t step, int64_t total_steps, int64_t epoch, int64_t batch_size, double loss_sum,
                            double correct, double samples, double seconds) {
  StepReport r;
  r.step = step;
  r.total_steps = total_steps;
  r.epoch = epoch;
  r.batch_size = batch_size;
  r.samples = static_cast<int64_t>(samples);
  r.loss = samples > 0 ? static_cast<float>(loss_sum / samples) : 0.0f;
  r.accuracy = samples > 0 ? correct / samples : 0.0;
  r.step_seconds = seconds;
  r.samples_per_sec = seconds > 0 ? samples / seconds : 0;
  return r;
}

void Trainer::save_at_end(int rank, const Model& model, Communicator* comm) {
  // A finite loss does not prove finite parameters (the last update can overflow): a run that ends
  // with non-finite parameters stops, before anything is saved. Every rank holding the full model
  // checks (a pipeline's or DataParallel's rank 0; the other ranks then fail at the barrier, and the
  // world reports this).
  if (!config_.allow_nonfinite && (rank == 0 || (!pipeline_ && config_.strategy != "dp"))) {
    const std::vector<float> p = model.host_params();
    for (const Parameter& q : model.parameters())
      if (has_nonfinite(p.data() + q.offset, q.numel))
        throw RunStopped("training ended after step " + std::to_string(start_step_ + total_steps_) + " with non-finite values in " +
                         q.name + " (the last update overflowed); lower --lr, or pass --allow-nonfinite to keep them");
  }
  // Rank 0 writes the checkpoint; the barrier keeps every rank from reading it (or exiting) early.
  const std::map<std::string, std::string> meta = {{"optimizer", config_.optimizer.str()}, {"data", config_.data},
                                                   {"seed", std::to_string(config_.seed)}, {"strategy", config_.strategy},
                                                   {"world", std::to_string(config_.world_size)}};
  if (!config_.save_path.empty() && rank == 0) {
    if (model.lora()) save_lora_checkpoint(config_.save_path, model, start_step_ + total_steps_, meta, config_.merge_lora);
    else save_checkpoint(config_.save_path, model, start_step_ + total_steps_, meta);
  }
  if (comm && !config_.save_path.empty()) comm->barrier()->wait();
}

}  // namespace dtlab
