#include "engine/train/train.h"

#include "engine/core/gpt.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <filesystem>
#include <thread>

#include <unistd.h>

#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/core/gpt.h"
#include "engine/core/ops.h"
#include "engine/data/loader.h"
#include "engine/data/sampler.h"
#include "engine/io/atomic_file.h"
#include "engine/io/checkpoint.h"
#include "engine/io/sharded_checkpoint.h"
#include "engine/monitor/monitor.h"
#include "engine/parallel/expert_parallel.h"
#include "engine/train/compose.h"
#include "engine/train/config_json.h"
#include "engine/train/iteration_gate.h"
#include "engine/train/mesh_rank.h"
#include "engine/train/nonfinite.h"
#include "engine/train/rank_strategy.h"
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
  if (TestWorldFactory test = test_world()) return test(n, wo);
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
  const bool pipeline = c.strategy == Strategy::Pipeline;
  const MeshShape m = resolve_mesh(c.world_size, c.tp, pipeline ? c.pipeline.stages : 1);
  const int cp = std::max(c.cp, 1);  // (--cp: each replica's CP ranks are data-parallel indices too)
  if (pipeline && m.dp != c.pipeline.dp * cp && m.dp % cp == 0)
    throw Error("--world " + std::to_string(c.world_size) + " with --tp " + std::to_string(c.tp) + (cp > 1 ? ", --cp " + std::to_string(cp) : "") +
                " and --stages " + std::to_string(c.pipeline.stages) + " leaves " + std::to_string(m.dp / cp) +
                " data-parallel replicas, but --dp is " + std::to_string(c.pipeline.dp) + "; set --dp " + std::to_string(m.dp / cp) +
                " or drop --world");
  if (c.model.is_gpt()) check_gpt_tp(c.model.gpt, c.tp, c.sequence_parallel);  // whole heads per rank
  else if (!pipeline) check_tp_widths(c.model.dims, 0, static_cast<int>(c.model.dims.size()) - 1, c.tp);
}

void validate_lora(const TrainConfig& c) {
  if (c.lora.rank == 0) {
    if (c.merge_lora) throw Error("--merge-lora merges LoRA adapters; add --lora-rank R");
    return;
  }
  check_lora_spec(c.model, c.lora);
  if (c.merge_lora && c.save_path.empty()) throw Error("--merge-lora says what --save writes; add --save PATH.safetensors");
}

void validate_precision(const TrainConfig& c) {
  if (is_mixed(c.amp) && is_mixed(c.precision))
    throw Error("--amp with --precision: autocast keeps float32 parameters, --precision makes them 16-bit; choose one");
  if (is_mixed(c.amp)) {
    if (c.reduce_fp32) throw Error("--reduce-dtype fp32 applies to --precision's 16-bit gradients; under --amp they are float32 already");
    if (!c.inject_overflow_steps.empty() && c.amp != Precision::FP16)
      throw Error("--inject-overflow makes fp16 gradients overflow (bf16 has float32's range); use --amp fp16");
    for (int64_t step : c.inject_overflow_steps)
      if (step < 1) throw Error("--inject-overflow " + std::to_string(step) + " names no step: steps count from 1; pick steps 1 to N");
    return;
  }
  if (!is_mixed(c.precision)) {
    if (!c.inject_overflow_steps.empty())
      throw Error("--inject-overflow makes fp16 gradients overflow; add --precision fp16");
    if (c.reduce_fp32) throw Error("--reduce-dtype fp32 applies to 16-bit gradients; add --precision bf16 or fp16");
    return;
  }
  if (c.reduce_fp32 && c.ddp.gradient_as_bucket_view && c.strategy == Strategy::Ddp)
    throw Error("--gradient-as-bucket-view with --reduce-dtype fp32: each 16-bit gradient would be a view of a float32 bucket; "
                "drop one of them");
  if (!c.inject_overflow_steps.empty() && c.precision != Precision::FP16)
    throw Error("--inject-overflow makes fp16 gradients overflow (bf16 has float32's range); use --precision fp16");
  for (int64_t step : c.inject_overflow_steps)
    if (step < 1)
      throw Error("--inject-overflow " + std::to_string(step) + " names no step: steps count from 1, so it would never fire; "
                  "use 1 to the run's last step");
  if (c.inject_overflow_rank < 0 || c.inject_overflow_rank >= c.world_size)
    throw Error("--inject-overflow-rank " + std::to_string(c.inject_overflow_rank) + " is not a rank of this run; pick 0 to " +
                std::to_string(c.world_size - 1));
}

// --uneven-rank and --join: DDP's lesson (torch's Join here is DDP's join hook), on a world of
// several ranks, where the rank that runs out still trains at least one step.
void validate_uneven_inputs(const TrainConfig& c) {
  if (c.uneven_rank < 0) return;  // --join's own strategy and combinations are the composition table's
  if (c.strategy != Strategy::Ddp || c.world_size < 2)
    throw Error("--uneven-rank is DDP's uneven-inputs lesson (torch's Join with DDP's join hook); use --strategy ddp --world N");
  if (c.uneven_rank >= c.world_size)
    throw Error("--uneven-rank " + std::to_string(c.uneven_rank) + " is not a rank of this world; pick 0 to " + std::to_string(c.world_size - 1));
  if (c.steps == 1) throw Error("--uneven-rank needs at least 2 steps: its rank runs one step fewer than the others");
  // A TP or CP group reads its replica's batches, so the whole group runs out with the rank: with one
  // replica the whole world would (nothing left to be uneven against, nor for --join to shadow).
  const int tp = std::max(c.tp, 1), cp = std::max(c.cp, 1), group = tp * cp;
  if (group > 1 && c.world_size % group == 0 && c.world_size / group < 2) {
    const std::string dims = tp > 1 && cp > 1 ? "tp " + std::to_string(tp) + " x cp " + std::to_string(cp)
                             : tp > 1         ? "tp " + std::to_string(tp)
                                              : "cp " + std::to_string(cp);
    throw Error("--uneven-rank needs at least 2 data-parallel replicas, but --world " + std::to_string(c.world_size) + " is one replica of " +
                dims + "; raise --world to " + std::to_string(2 * group));
  }
}

// A model this machine cannot train: a sentence before minutes of allocating (Linux overcommits, so
// the allocations succeed, and the machine then swaps, or the kernel kills the run). A lower bound of
// what the threads of this process hold: float32 parameters and gradients and the optimizer's state
// for every replica (a TP group's ranks hold one replica between them), one copy when sharded. The
// GPU's memory is its own, and a launched process holds one rank (its own check is its allocations).
void validate_host_memory(const TrainConfig& c) {
  if (c.device != "cpu" || c.backend != "threads") return;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;
  const double machine = static_cast<double>(pages) * static_cast<double>(page);
  const bool adamw = c.optimizer.kind == OptimizerKind::AdamW;
  const int state = adamw ? 8 : c.optimizer.momentum > 0 ? 4 : 0;
  const bool replicas = c.strategy == Strategy::Ddp || c.strategy == Strategy::Dp || c.strategy == Strategy::Single;
  const int copies = replicas ? std::max(1, c.world_size / std::max(c.tp, 1)) : 1;
  const double psi = static_cast<double>(c.model.num_params());
  const double need = psi * (8 + state) * copies;
  if (need <= machine) return;
  const std::string per = std::to_string(8 + state) + " bytes a parameter: float32 parameters and gradients" +
                          (adamw ? " and AdamW's two moments" : state ? " and SGD's momentum" : "");
  throw Error("--model " + c.model.str() + " has " + with_commas(c.model.num_params()) + " parameters; training " +
              (copies > 1 ? std::to_string(copies) + " replicas of it" : std::string("it")) + " holds at least " +
              human_bytes(static_cast<int64_t>(need)) + " (" + per + "), but this machine has " +
              human_bytes(static_cast<int64_t>(machine)) + "; use a smaller model" + (copies > 1 ? " or fewer replicas" : ""));
}

// fully_shard's options (FSDP2): what FSDP1 spells differently is named in its words.
void validate_fsdp_api(const TrainConfig& c) {
  const FsdpOptions& f = c.fsdp;
  if (f.api != 1 && f.api != 2) throw Error("--fsdp-api " + std::to_string(f.api) + " is not an FSDP API; use 1 or 2");
  if (f.api == 1) {
    if (f.prefetch != 1)
      throw Error("--prefetch is fully_shard's explicit prefetch (FSDP2); FSDP1 gathers one unit ahead: add --fsdp-api 2 or drop --prefetch");
    if (f.reshard_after_forward != kReshardTrue)
      throw Error("--reshard-after-forward is fully_shard's (FSDP2) option; add --fsdp-api 2, or with FSDP1 use --sharding full "
                  "(reshard) or grad-op (keep)");
    return;
  }
  if (c.strategy != Strategy::Fsdp) throw Error("--fsdp-api 2 selects FSDP's API; add --strategy fsdp --world N");
  if (f.sharding == Sharding::ShardGradOp)
    throw Error("--sharding grad-op is FSDP1's SHARD_GRAD_OP; fully_shard (--fsdp-api 2) spells it --reshard-after-forward false");
  if (f.sharding == Sharding::NoShard || f.sharding == Sharding::Zero1)
    throw Error(std::string("--sharding ") + sharding_flag(f.sharding) +
                " is FSDP1's; fully_shard (--fsdp-api 2) always shards (full, or hybrid for HSDP): use --fsdp-api 1, or --strategy ddp "
                "for replicas");
  if (f.backward_prefetch == BackwardPrefetch::Post)
    throw Error("--backward-prefetch post is FSDP1's BACKWARD_POST; fully_shard (--fsdp-api 2) prefetches in the pre-backward "
                "hook: use pre (its default, as set_modules_to_backward_prefetch with the next unit) or none");
}

void validate_fsdp2_reshard(const TrainConfig& c) {
  const int n = c.fsdp.reshard_after_forward;
  if (c.strategy != Strategy::Fsdp || c.fsdp.api != 2 || n <= 1) return;
  const int dp = c.tp > 1 ? c.world_size / c.tp : c.world_size;
  const int shard = c.fsdp.sharding == Sharding::Hybrid ? c.fsdp.node_size : dp;
  if (shard > 0 && (n > shard || shard % n != 0))
    throw Error("--reshard-after-forward " + std::to_string(n) + " must divide the " + std::to_string(shard) +
                " ranks each parameter is sharded over" + (c.fsdp.sharding == Sharding::Hybrid ? " (--node-size)" : "") +
                "; use a divisor, true or false");
}

// --ep against --moe and the world (one sentence each); what it runs with is compose.cpp's.
void validate_expert_parallel(const TrainConfig& c) {
  if (c.ep == 1) return;
  if (c.ep < 1) throw Error("--ep " + std::to_string(c.ep) + " is not a group size; use 1 (off) or more");
  if (c.world_size % c.ep != 0)
    throw Error("--ep " + std::to_string(c.ep) + " does not divide --world " + std::to_string(c.world_size) +
                "; expert-parallel groups are runs of --ep consecutive ranks, so pick an --ep that divides the world");
  // A pipeline's EP groups are runs of --ep of one stage's ranks (--world / --stages of them: dp x tp).
  const int stages = std::max(c.pipeline.stages, 1);
  if (c.strategy == Strategy::Pipeline && c.world_size % stages == 0 && c.world_size / stages < c.ep)  // no stage has a group
    throw Error("--ep " + std::to_string(c.ep) + " groups " + std::to_string(c.ep) + " ranks of one stage, but a stage has " +
                std::to_string(c.world_size / stages) + (c.tp > 1 ? " (--dp x --tp)" : " (--dp)") +
                "; raise --dp so that a stage's ranks are a multiple of --ep");
  if (c.strategy == Strategy::Pipeline && c.world_size % stages == 0 && (c.world_size / stages) % c.ep != 0)
    throw Error("--ep " + std::to_string(c.ep) + " does not divide the " + std::to_string(c.world_size / stages) +
                " ranks of a stage (--world / --stages); a stage's expert-parallel groups are runs of --ep of them, so pick "
                "an --ep that divides " + std::to_string(c.world_size / stages) + (c.tp > 1 ? " (--dp x --tp)" : " (--dp)"));
  if (c.moe.experts % c.ep != 0)
    throw Error("--ep " + std::to_string(c.ep) + " gives each rank experts/ep experts, but --moe has " + std::to_string(c.moe.experts) +
                " experts, which do not divide by " + std::to_string(c.ep) + "; use an --ep that divides the experts");
  // HSDP: the ranks holding the same experts shard them inside each node and replicate them across
  // nodes, so an EP group (--ep consecutive ranks) must lie inside a node.
  // A node of --node-size data-parallel ranks is node-size x tp consecutive ranks (tp fastest); an EP
  // group (ep consecutive ranks, the TP ranks first) must lie inside one.
  const int node_ranks = c.fsdp.node_size * std::max(c.tp, 1);
  if (c.strategy == Strategy::Fsdp && c.fsdp.sharding == Sharding::Hybrid && c.fsdp.node_size > 0 && node_ranks % c.ep != 0)
    throw Error("--ep " + std::to_string(c.ep) + " with --sharding hybrid: an expert-parallel group of " + std::to_string(c.ep) +
                " consecutive ranks must lie inside a node of " +
                (c.tp > 1 ? std::to_string(node_ranks) + " ranks (--node-size " + std::to_string(c.fsdp.node_size) + " x --tp " +
                                std::to_string(c.tp) + ")"
                          : "--node-size " + std::to_string(c.fsdp.node_size) + " ranks") +
                "; use a --node-size that makes it a multiple of --ep");
}

// --cp against the model and the world (one sentence each); what it runs with is compose.cpp's.
void validate_context_parallel(const TrainConfig& c) {
  if (c.cp == 1 && c.cp_layout != CpLayout::Ring)
    throw Error(std::string("--cp-layout ") + cp_layout_name(c.cp_layout) +
                " chooses how a context-parallel group splits attention; add --cp 2 or more");
  if (c.cp == 1) return;
  const std::string cp = "--cp " + std::to_string(c.cp);
  if (c.cp < 1) throw Error(cp + " is not a group size; use 1 (off) or more");
  const int tp = std::max(c.tp, 1);
  // A pipeline's data-parallel ranks are its replicas of every stage: --world / (--tp x --stages).
  const bool pipe = c.strategy == Strategy::Pipeline;
  const int per = tp * (pipe ? std::max(c.pipeline.stages, 1) : 1);
  if (c.world_size % per == 0 && c.world_size / per < c.cp) {  // too few ranks for one group: the world is what to raise
    const std::string dims = std::string(pipe ? " x --stages" : "") + (tp > 1 ? " x --tp" : "");
    throw Error(cp + " needs --cp" + dims + " = " + std::to_string(c.cp * per) + " ranks, but --world is " + std::to_string(c.world_size) +
                "; raise --world to " + std::to_string(c.cp * per) + " (or a multiple of it)");
  }
  if (c.world_size % per == 0 && (c.world_size / per) % c.cp != 0) {
    const std::string over = std::string(" (--world") + (tp > 1 ? " / --tp" : "") + (pipe ? " / --stages" : "") + ")";
    throw Error(cp + " does not divide the " + std::to_string(c.world_size / per) + " data-parallel ranks" + over +
                "; context-parallel groups are runs of --cp of them, so pick a --cp that divides " + std::to_string(c.world_size / per));
  }
  if (!c.model.is_gpt()) return;  // (compose.cpp's refusal names it)
  const GptSpec& g = c.model.gpt;
  const int64_t chunks = c.cp_layout == CpLayout::Zigzag ? 2 * c.cp : c.cp;
  if (g.ctx % chunks != 0 || (c.sequence_parallel && (g.ctx / c.cp) % tp != 0))
    throw Error(cp + (c.cp_layout == CpLayout::Zigzag ? " with --cp-layout zigzag cuts each sample's " : " cuts each sample's ") +
                std::to_string(g.ctx) + " positions into " + std::to_string(chunks) + " equal chunks" +
                (c.sequence_parallel ? " (and each rank's T/cp over --tp for sequence parallelism)" : "") +
                ", which do not divide it; use a ctx that divides, or another --cp");
  if (c.cp_layout == CpLayout::Ulysses && (g.heads / tp) % c.cp != 0)
    throw Error(cp + " --cp-layout ulysses gives each rank whole attention heads, but the " + std::to_string(g.heads / tp) + " heads" +
                (tp > 1 ? " of a TP rank" : "") + " do not divide by " + std::to_string(c.cp) + "; use --cp-layout ring or zigzag, or a --cp that divides them");
}

void validate(const TrainConfig& c) {
  // --ep without experts first: the table's sentence for --ep (its strategies) would be a step too early.
  if (c.ep > 1 && !c.moe.on())
    throw Error("--ep " + std::to_string(c.ep) + " splits the MoE blocks' experts over ranks; add --moe experts=E,top_k=K" +
                (c.model.is_gpt() ? "" : " and a GPT to hold them (--model gpt-tiny)"));
  // The GPT's refusals first: the MLP's checks below read its layer widths.
  if (c.model.is_gpt()) check_composition(c);
  validate_lora(c);
  validate_precision(c);
  check_fsdp_options(c);
  if (c.fsdp.node_size != 0 && (c.strategy != Strategy::Fsdp || c.fsdp.sharding != Sharding::Hybrid))
    throw Error("--node-size sets HYBRID_SHARD's shard group; use it with --strategy fsdp --sharding hybrid");
  // With --tp T, HYBRID_SHARD shards over each TP coordinate's world / T data-parallel ranks
  // (torch's 3-D mesh ("replicate", "shard", "tp")): --node-size counts those.
  const int dp_size = c.tp > 1 && c.world_size % c.tp == 0 ? c.world_size / c.tp : c.world_size;
  if (c.strategy == Strategy::Fsdp && c.fsdp.sharding == Sharding::Hybrid && c.fsdp.node_size != 0 &&
      (c.fsdp.node_size < 1 || dp_size % c.fsdp.node_size != 0))
    throw Error("--node-size " + std::to_string(c.fsdp.node_size) + " does not divide " +
                (c.tp > 1 ? "the " + std::to_string(dp_size) + " data-parallel ranks (--world / --tp)" : "--world " + std::to_string(c.world_size)) +
                "; HYBRID_SHARD needs equal node groups");
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
  // What each strategy runs with, and which features run together: strategy.h's and compose.cpp's tables.
  check_composition(c);
  const bool launched = c.backend == "socket" || c.launched;
  if (launched) {
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
  if (c.strategy == Strategy::Single && c.world_size != 1)
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
  if (!(c.clip_grad_norm >= 0 && std::isfinite(c.clip_grad_norm)))
    throw Error("--clip-grad-norm must be a finite number, 0 (off) or more");
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
  validate_uneven_inputs(c);
  validate_host_memory(c);
  if (c.strategy == Strategy::Ddp) {
    if (c.ddp.bucket_cap_bytes < 1) throw Error("--bucket-cap-mb is too small: a bucket must hold at least 1 byte");
    if (c.ddp.first_bucket_bytes < 1) throw Error("--first-bucket-mb is too small: a bucket must hold at least 1 byte");
  }
  validate_tensor_parallel(c);
  validate_expert_parallel(c);
  validate_context_parallel(c);
  if (!c.save_path.empty()) check_output_path("--save", c.save_path);
  if (!c.save_sharded_path.empty()) {
    check_sharded_output_dir("--save-sharded", c.save_sharded_path);
  }
  if (!c.trace_path.empty()) check_output_path("--trace", c.trace_path);
}

}  // namespace

void check_fsdp_options(const TrainConfig& c) {
  validate_fsdp_api(c);
  validate_fsdp2_reshard(c);
}

void check_data_fits_model(const Dataset& ds, const ModelSpec& spec) {
  if (spec.is_gpt() != ds.is_tokens())
    throw Error(spec.is_gpt() ? "--model " + spec.str() + " reads tokens, but " + ds.name +
                                    " holds points; use --data text (the shipped text), text:PATH, or a .npz holding tokens"
                              : "data " + ds.name + " holds tokens, which a --model gpt reads; use --model gpt-tiny, or points for " + spec.str());
  if (spec.is_gpt()) {
    if (ds.num_classes > spec.gpt.vocab)
      throw Error("data " + ds.name + " has " + std::to_string(ds.num_classes) + " distinct tokens but " + spec.str() +
                  " has a vocabulary of " + std::to_string(spec.gpt.vocab) + "; drop vocab= (the data's is used) or make it at least " +
                  std::to_string(ds.num_classes));
    return;
  }
  if (ds.d != spec.in_features())
    throw Error("data " + ds.name + " has " + std::to_string(ds.d) + " features but " + spec.str() +
                " takes " + std::to_string(spec.in_features()) + " inputs; make the first width " +
                std::to_string(ds.d));
  if (ds.num_classes > spec.out_features())
    throw Error("data " + ds.name + " has " + std::to_string(ds.num_classes) + " classes but " +
                spec.str() + " has " + std::to_string(spec.out_features()) +
                " outputs; make the last width at least " + std::to_string(ds.num_classes));
}

namespace {

// The GPT over every window of the token data: the mean cross-entropy and next-token accuracy over
// all n x T positions.
EvalResult evaluate_tokens(Model& model, const Dataset& ds, int64_t batch, float* logits_out, int64_t n) {
  const int64_t T = ds.ctx, V = model.spec().out_features();
  const int64_t rows = std::min(batch, std::max<int64_t>(n, 1));
  Tensor probs({rows * T, V}, MemCategory::Activations, nullptr);
  std::vector<int64_t> tok(static_cast<size_t>(rows * T)), tgt(static_cast<size_t>(rows * T));
  // A device model reads its tokens from device memory and hands its logits back to the host.
  Device& dev = model.device();
  dev.bind_thread();
  Tensor tok_dev, logits_host;
  if (!dev.is_host()) {
    tok_dev = Tensor({rows * T}, MemCategory::Activations, nullptr, DType::I64, dev);
    logits_host = Tensor({rows * T, V}, MemCategory::Activations, nullptr);
  }
  EvalResult r;
  double loss_sum = 0;
  for (int64_t i = 0; i < n; i += batch) {
    const int64_t B = std::min(batch, n - i);
    for (int64_t k = 0; k < B * T; k++) {
      tok[static_cast<size_t>(k)] = ds.tokens[static_cast<size_t>(i * T + k)];
      tgt[static_cast<size_t>(k)] = ds.tokens[static_cast<size_t>(i * T + k + 1)];
    }
    const float* logits = nullptr;
    if (dev.is_host()) {
      logits = model.forward_tokens(tok.data(), B);
    } else {
      dev.upload(tok_dev.raw(), tok.data(), B * T * static_cast<int64_t>(sizeof(int64_t)));
      dev.download(logits_host.raw(), model.forward_tokens(tok_dev.i64(), B), B * T * V * static_cast<int64_t>(sizeof(float)));
      logits = logits_host.f32();
    }
    loss_sum += static_cast<double>(cross_entropy_forward(probs.f32(), logits, tgt.data(), B * T, V)) * static_cast<double>(B * T);
    r.correct += count_correct(logits, tgt.data(), B * T, V);
    if (logits_out) std::copy(logits, logits + B * T * V, logits_out + i * T * V);
  }
  const int64_t positions = n * T;
  r.samples = positions;
  r.loss = positions > 0 ? static_cast<float>(loss_sum / static_cast<double>(positions)) : 0.0f;
  r.accuracy = positions > 0 ? static_cast<double>(r.correct) / static_cast<double>(positions) : 0.0;
  return r;
}

}  // namespace

EvalResult evaluate(Model& model, const Dataset& ds, int64_t batch, float* logits_out, int64_t limit) {
  const int64_t n = limit > 0 ? std::min(limit, ds.n) : ds.n;
  if (model.is_gpt()) return evaluate_tokens(model, ds, batch, logits_out, n);
  const int64_t C = model.spec().out_features();
  DTLAB_CHECK(batch > 0, "evaluate() needs a positive batch");
  const int64_t rows = std::min(batch, std::max<int64_t>(n, 1));
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
  for (int64_t i = 0; i < n; i += batch) {
    int64_t B = std::min(batch, n - i);
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
  r.samples = n;
  r.loss = n > 0 ? static_cast<float>(loss_sum / static_cast<double>(n)) : 0.0f;
  r.accuracy = n > 0 ? static_cast<double>(r.correct) / static_cast<double>(n) : 0.0;
  return r;
}

Trainer::Trainer(const TrainConfig& config) : config_(config) {
  validate(config_);
  if (config_.strategy == Strategy::Fsdp && config_.fsdp.sharding == Sharding::Hybrid && config_.fsdp.node_size == 0) {
    // HYBRID_SHARD's shard group defaults to a node of the hardware profile.
    // Under --tp a node's GPUs hold tp-wide groups: gpus_per_node / tp data-parallel ranks.
    const int tp = std::max(1, config_.tp);
    const int per_node = find_profile(config_.profile).gpus_per_node;
    const int k = per_node / tp, dp = config_.world_size / tp;
    if (k < 1 || k >= dp || dp % k != 0)
      throw Error("--sharding hybrid needs node groups, but profile " + config_.profile + " has " + std::to_string(per_node) +
                  " ranks per node and --world is " + std::to_string(config_.world_size) +
                  (tp > 1 ? " (" + std::to_string(dp) + " data-parallel ranks of --tp " + std::to_string(tp) + ")" : std::string()) +
                  "; pass --node-size K (a divisor of the " + (tp > 1 ? "data-parallel ranks" : std::string("world")) +
                  ") or a multi-node profile such as ib2x4");
    config_.fsdp.node_size = k;
  }
  validate_fsdp2_reshard(config_);  // against the shard group, now that HYBRID_SHARD's is known
  const int N = config_.world_size;
  launched_ = config_.backend == "socket" || config_.launched;  // this process runs one rank
  const bool in_world = config_.strategy != Strategy::Single && !launched_;  // ranks as threads here
  const int me = launched_ ? config_.socket.rank : 0;
  const bool pipeline = config_.strategy == Strategy::Pipeline;
  if (pipeline) {  // a TP group runs each pipeline rank's part: the pipeline sees dp x stages ranks
    // --cp: each replica of every stage is a CP group of cp ranks, which the pipeline's runtime places
    // as cp neighbouring data-parallel indices (the mesh's dp dimension, replicas x cp, cp fastest).
    PipelineOptions o = config_.pipeline;
    if (config_.cp > 1) {
      const int want = o.stages * o.dp * config_.cp * config_.tp;
      if (N != want)
        throw Error("--world " + std::to_string(N) + " is not --stages " + std::to_string(o.stages) + " x --dp " + std::to_string(o.dp) +
                    " x --cp " + std::to_string(config_.cp) + (config_.tp > 1 ? " x --tp " + std::to_string(config_.tp) : std::string()) +
                    " = " + std::to_string(want) + "; a pipeline run has one rank per stage per CP rank per replica (drop --world)");
      o.dp *= config_.cp;
    }
    pipeline_ = std::make_unique<PipelinePlan>(plan_pipeline(config_.model, o, config_.batch, N / config_.tp));
  }
  mesh_ = resolve_mesh(N, config_.tp, pipeline ? config_.pipeline.stages : 1);
  if (pipeline && config_.tp > 1 && !config_.model.is_gpt())  // Megatron pairs the Linear layers of each stage
    for (const StageRange& s : pipeline_->stages) check_tp_widths(config_.model.dims, s.first, s.end, config_.tp);
  // Instrumentation is always on (it costs well under 3% of a step, see bench/bench_step.cpp); the
  // trace file is only written when asked for.
  if (in_world) {
    WorldOptions wo;
    wo.timeout_s = config_.timeout_s;
    wo.profile = config_.profile;
    wo.allreduce_algo = config_.algo;
    wo.protocol = config_.proto;
    wo.alltoall_algo = config_.alltoall_algo;
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
  // BLAS threads: --threads; else what OPENBLAS_NUM_THREADS or OMP_NUM_THREADS say; else one per
  // rank when several ranks share this machine's cores, as torchrun sets OMP_NUM_THREADS=1 for each
  // of several processes per node (docs/course_sources.md §8); else OpenBLAS's choice. A pool of
  // BLAS threads per GEMM on cores the other ranks need only spins: measured on 2 cores, it took a
  // third of the CPU of the test suite in sched_yield.
  int blas_threads = config_.threads;
  if (blas_threads == 0 && N > 1 && !std::getenv("OPENBLAS_NUM_THREADS") && !std::getenv("OMP_NUM_THREADS")) blas_threads = 1;
  set_compute_threads(blas_threads);
  const ModelSpec& spec = config_.model;
  dataset_ = std::make_unique<Dataset>(
      make_dataset(config_.data, spec.in_features(), spec.out_features()));
  const Dataset& ds = *dataset_;
  if (ds.n == 0) throw Error("data " + config_.data + " holds no samples");
  // vocab= left out: the data's vocabulary (a text's distinct characters).
  if (spec.is_gpt() && ds.is_tokens() && config_.model.gpt.vocab == 0) config_.model.gpt.vocab = std::max<int64_t>(ds.num_classes, 2);
  if (spec.is_gpt()) config_.model.gpt.moe = config_.moe;  // (check_composition refused --moe for an MLP)
  check_data_fits_model(ds, spec);
  // Same count a DataLoader over this rank's DistributedSampler gives.
  // DataParallel has one loader, rank 0's, whose batches hold every device's piece.
  const bool dp = config_.strategy == Strategy::Dp;
  const int64_t loader_batch = dp ? config_.batch * N : config_.batch;
  SamplerConfig sc;
  sc.n = ds.n;
  sc.world_size = dp ? 1 : data_replicas();  // a pipeline's, a TP group's or a CP group's ranks share their replica's shard
  // torch's DistributedSampler pads every rank's shard by repeating rows (its drop_last stays False;
  // --drop-last is the DataLoader's). With fewer rows than ranks a rank would train on nothing but a
  // row another rank has, which --drop-last asks not to do.
  if (config_.drop_last && !dp && ds.n < sc.world_size)
    throw Error("--drop-last with " + std::to_string(ds.n) + " sample" + (ds.n == 1 ? "" : "s") + " in " + config_.data + " for " +
                std::to_string(sc.world_size) + " data-parallel ranks: DistributedSampler would pad with repeated samples, so rank " +
                std::to_string(sc.world_size - 1) + " would train only on another rank's; give at least " +
                std::to_string(sc.world_size) + " samples or fewer ranks");
  const int64_t per_rank = DistributedSampler(sc).num_samples();
  batches_per_epoch_ = config_.drop_last ? per_rank / loader_batch : (per_rank + loader_batch - 1) / loader_batch;
  if (batches_per_epoch_ == 0)
    throw Error("--batch " + std::to_string(config_.batch) + (dp ? " x --world " + std::to_string(N) : std::string()) +
                " is larger than the " + std::to_string(per_rank) + " samples " + (dp ? "rank 0's loader" : "each rank") +
                " gets from " + config_.data + ", so --drop-last leaves no batch; use a smaller --batch");
  if (dp) check_dp_pieces(ds.n, loader_batch, config_.drop_last, N);
  // --epochs E runs E epochs of micro-batches, `accum` of them per optimizer step.
  total_steps_ = config_.steps > 0 ? config_.steps : config_.epochs * batches_per_epoch_ / config_.accum;
  for (int64_t step : config_.inject_overflow_steps)
    if (step > total_steps_)
      throw Error("--inject-overflow " + std::to_string(step) + " is after the run's last step (" + std::to_string(total_steps_) +
                  "), so it would never fire; pick steps 1 to " + std::to_string(total_steps_));
  if (total_steps_ < 1)
    throw Error("--epochs " + std::to_string(config_.epochs) + " gives " +
                std::to_string(config_.epochs * batches_per_epoch_) + " micro-batches, fewer than --accum " +
                std::to_string(config_.accum) + "; use more epochs or a smaller --accum");

  if (!config_.init_path.empty()) check_checkpoint_size(config_.init_path, spec);  // before building the replicas
  if (config_.tp > 1 && !pipeline) {  // a pipeline builds its stages' shards in run()
    build_tp_models(me, launched_ ? me + 1 : N, in_world);  // a launched process builds its own rank's shard
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
    // Expert parallelism: rank r holds its EP rank's experts, from the seed every rank uses, so the
    // ranks holding the same experts start equal (Megatron's expert-parallel RNG); DDP broadcasts the rest.
    ModelSpec mine = spec;
    if (config_.ep > 1 && !pipeline) {  // (a pipeline's full copy holds every expert; its stages split them)
      mine.gpt.moe.ep = config_.ep;
      mine.gpt.moe.ep_rank = r % config_.ep;
    }
    models_.push_back(std::make_unique<Model>(mine, mem, config_.seed + (config_.ep > 1 ? 0 : static_cast<uint64_t>(r)), dev));
    models_.back()->set_activation_checkpointing(config_.activation_checkpointing && !pipeline);
    if (config_.skip_layer >= 0) {
      models_.back()->set_skipped_layer(config_.skip_layer);  // validates the layer
      models_.back()->set_skipped_layer(-1);
    }
    if (!config_.init_path.empty() && config_.ep > 1) {  // the file holds every expert: this rank takes its own
      Model whole(spec, nullptr, config_.seed);
      start_step_ = load_model_checkpoint(config_.init_path, whole).step;
      upload_gpt_whole_values(*models_.back(), whole.host_params().data());
    } else if (!config_.init_path.empty()) {
      start_step_ = load_model_checkpoint(config_.init_path, *models_.back()).step;
    }
    if (config_.lora.rank > 0) {
      // The frozen base is the same pretrained model on every rank (torch's DDP broadcasts frozen
      // parameters too); the adapters start from seed + r like any replica's parameters.
      if (r > 0 && config_.init_path.empty()) init_like_torch(*models_.back(), config_.seed);
      models_.back()->enable_lora(config_.lora, config_.seed + static_cast<uint64_t>(r));
    }
    // torch's model.to(torch.bfloat16) after construction (and --init): the 16-bit copy replaces the float32 one.
    if (is_mixed(config_.precision)) models_.back()->set_precision(config_.precision);
    models_.back()->set_amp(config_.amp);  // torch.autocast around the forward (fp32 parameters)
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
  std::string where = config_.strategy == Strategy::Single ? "one rank on device 0"
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

Roof Trainer::roof() const {
  if (config_.device == "cpu") return cpu_roof(this_machine_profile(), compute_threads());
#if DTLAB_HAVE_CUDA
  return gpu_roof(cuda::device_name(launched_ ? config_.socket.local_rank : 0));
#else
  return gpu_roof("a GPU this build cannot name");
#endif
}

double Trainer::model_flops(double samples) const {
  // An MoE block runs top_k of its E experts per token: the model FLOPs count the active parameters
  // (the dense ones and top_k experts a block), as MoE papers report MFU; every expert would count
  // E / top_k times the work done.
  double params = static_cast<double>(config_.model.num_params());
  const GptSpec& g = config_.model.gpt;
  for (int64_t l = 0; l < g.layers && g.moe.on(); l++)
    if (g.moe.in_block(l)) params -= static_cast<double>((g.moe.experts - g.moe.top_k) * (8 * g.embd * g.embd + 5 * g.embd));
  return model_flops_per_step(params, samples, g);
}

double Trainer::peak_flops() const {
  const Roof r = roof();
  // The step's model FLOPs are every rank's (its samples are summed over the world, launched or
  // not), so the peak is the whole world's hardware.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return world_peak_flops(config_, launched_, r.flops_per_s, this_machine_profile().sgemm_flops_per_thread, cores, compute_threads());
}

double world_peak_flops(const TrainConfig& c, bool launched, double gpu_flops, double flops_per_thread, int cores, int threads) {
  if (c.device == "cpu") {
    // Ranks on one machine share its cores: this process's ranks, or under launch LOCAL_WORLD_SIZE
    // processes on each of world / local machines, each counted as this one.
    const int local = launched ? std::max(1, c.socket.local_world_size) : c.world_size;
    const int machines = launched ? std::max(1, c.world_size / local) : 1;
    return flops_per_thread * std::min(std::max(1, cores), local * std::max(1, threads)) * machines;
  }
  // The cuda backend's ranks share device 0; nccl gives every rank its GPU (one per process when launched).
  const int gpus = c.strategy == Strategy::Single || c.backend == "cuda" ? 1 : c.world_size;
  return gpu_flops * gpus;
}

void Trainer::abort(const std::string& reason) {
  if (world_) world_->abort(reason);
  else stepper_->abort();
}

Trainer::~Trainer() {
  for (auto& m : models_) m->set_observer(nullptr);
}

std::vector<std::string> Trainer::planned_buckets() const {
  if (config_.strategy != Strategy::Ddp) return {};
  const Model& m = *models_[0];
  // Under --ep DDP leaves the experts out of its buckets (DdpOptions::ignored): the walk skips them.
  std::vector<char> ignored(m.parameters().size(), 0);
  if (config_.ep > 1)
    for (int i : expert_parameters(m)) ignored[static_cast<size_t>(i)] = 1;
  const std::vector<int64_t> all = parameter_bytes(m);
  std::vector<int> kept;
  std::vector<int64_t> bytes;
  for (size_t i = 0; i < all.size(); i++)
    if (!ignored[i]) {
      kept.push_back(static_cast<int>(i));
      bytes.push_back(all[i]);
    }
  BucketAssignment a = construction_bucket_assignment(bytes, config_.ddp);
  for (auto& b : a.buckets)
    for (int& p : b) p = kept[static_cast<size_t>(p)];
  return describe_bucket_assignment(m, a);
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
  final_eval_.reset();
  auto t_start = Clock::now();
  if (world_) {
    world_->run([&](int rank, Communicator& comm, RankContext& ctx, Device&) {
      MemoryTracker& mem = world_->threads().memory(rank);
      run_rank(rank, &comm, &ctx, mem, sum, on_step);
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

  // A launched rank other than 0 reports nothing (its output is quiet) and may hold a part of the model
  // (its experts under --ep, whose all-to-alls ended with the run): only rank 0 evaluates the result.
  const bool reports = !launched_ || ctx0_->rank() == 0;
  const EvalResult ev = final_eval_ ? *final_eval_ : reports ? final_evaluation() : EvalResult{};
  if (reports) check_final_loss(ev);
  sum.eval_loss = ev.loss;
  sum.eval_accuracy = ev.accuracy;
  sum.eval_correct = ev.correct;
  sum.eval_samples = ev.samples;

  if (!config_.trace_path.empty() && ctx0_->rank() == 0) {  // socket: rank 0's own events
    TraceExportOptions opt;
    opt.clock = config_.trace_modeled ? TraceClock::Modeled : TraceClock::Wall;
    opt.title = std::string("dtlab train --strategy ") + strategy_name(config_.strategy) + " " + config_.model.str() + " on " + ds.name;
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
  so.algorithms.alltoall = config_.alltoall_algo;
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
      run_rank(rank, comm, ctx_.get(), *memory_, sum, report);
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

// The one per-rank training loop (engine/train/rank_strategy.h): every strategy's rank runs it,
// in-process or launched; what differs is the rank's RankStrategy.
void Trainer::run_rank(int rank, Communicator* comm, RankContext* ctx, MemoryTracker& mem, TrainSummary& sum,
                       const std::function<void(const StepReport&)>& on_step) {
  Device& dev = device(rank);
  dev.bind_thread();  // run() may be called on any thread (the lab's worker)
  // On a GPU the ops are timed with events on the stream (the host only enqueues them); the CPU
  // reports to the context directly.
  std::unique_ptr<DeviceTimer> timer = dev.make_timer(ctx);
  const RankContext::TimerAttachment attached(ctx, timer.get());
  ComputeObserver* const obs = timer ? static_cast<ComputeObserver*>(timer.get()) : ctx;
  const RankEnv env{*this, rank, comm, ctx, mem, dev, obs, timer.get()};
  std::unique_ptr<RankStrategy> s = config_.strategy == Strategy::Pipeline ? make_pipeline_rank(env)
                                    : config_.strategy == Strategy::Dp     ? make_data_parallel_rank(env)
                                                                           : make_replica_rank(env);
  // --uneven-rank: this rank's data runs out one step early (lesson 28). It leaves the loop, as a
  // plain torch loop would, and the others wait in their next all-reduce until the watchdog stops the
  // run; with --join it shadows the others' steps instead. Under --tp or --cp the rank's whole
  // replica runs out with it: its TP and CP group read the same batches.
  const auto replica = [&](int r) { return mesh_coord(mesh_, r).dp / std::max(config_.cp, 1); };
  const bool runs_out = config_.uneven_rank >= 0 && replica(rank) == replica(config_.uneven_rank);
  const int64_t own_steps = runs_out ? total_steps_ - 1 : total_steps_;
  for (int64_t step = 1; step <= total_steps_; step++) {
    if (step > own_steps && !config_.join) return;
    enter_iteration(ctx, rank, static_cast<int32_t>(step - 1));
    mem.reset_peaks();
    const auto t0 = Clock::now();
    StepTally tally;
    if (step > own_steps) {
      s->shadow_step(step);
    } else {
      s->zero_grad(step);
      const int64_t micro = s->micro_batches();
      for (int64_t m = 0; m < micro; m++) s->micro_batch(step, m, m == micro - 1, tally);
      s->step(step);
    }
    const StepSums sums = s->exchange(step, tally);
    // One policy for every strategy: a non-finite loss (or input) stops every rank that computes
    // one with the same sentence, unless --allow-nonfinite.
    if (!config_.allow_nonfinite && !std::isfinite(sums.loss_sum)) throw RunStopped(s->diagnose_nonfinite(step, sums, tally));
    if (timer) timer->flush();
    if (ctx) ctx->end_iteration();
    const double dt = seconds_since(t0);
    rank_memory_[static_cast<size_t>(rank)] = mem.stats();
    if (!s->reports()) continue;
    total_samples_ += sums.samples;
    StepReport r = make_step_report(step, total_steps_, s->epoch(), tally.last_batch, sums.loss_sum, sums.correct, sums.samples, dt);
    s->annotate(r, sums);
    if (on_step) on_step(r);
  }
  const Model& result = s->finish(sum);
  dev.synchronize();
  if (timer) timer->flush();
  if (s->reports()) sum.epochs_started = s->epochs_started();
  save_at_end(rank, result, comm);
}

void Trainer::finish_fsdp(FullyShardedDataParallel& fsdp, const Model& model, Communicator& world) {
  // Each rank writes what it owns, before the shards are gathered back. With --tp every rank of the
  // world writes (its TP piece's FSDP shard).
  if (!config_.save_sharded_path.empty())
    save_sharded_checkpoint(config_.save_sharded_path, model, fsdp.owned_slices(),
                            {world.rank(), world.world_size(), [&] { world.barrier()->wait(); }},
                            start_step_ + total_steps_,
                            config_.fsdp.api == 2 ? std::string("fully_shard ") + (config_.fsdp.sharding == Sharding::Hybrid ? "HSDP" : "Shard(0)")
                                                  : std::string(sharding_name(config_.fsdp.sharding)));
  fsdp.materialize();  // every rank gathers the full parameters back (evaluation, --save)
}

void Trainer::save_replicated_sharded(const Model& model, Communicator* world, int replica, int replicas) {
  if (config_.save_sharded_path.empty()) return;
  const std::vector<Parameter>& ps = model.parameters();
  std::vector<int64_t> bytes;
  for (const Parameter& p : ps) bytes.push_back(p.numel * static_cast<int64_t>(sizeof(float)));
  // --ep: an expert is on the world / ep ranks of its expert-data-parallel group (rank r is the
  // (r / ep)-th of them), the rest on every replica.
  std::vector<bool> expert(ps.size(), false);
  if (config_.ep > 1)
    for (int i : expert_parameters(model)) expert[static_cast<size_t>(i)] = true;
  const int W = world ? world->world_size() : 1, r = world ? world->rank() : 0;
  const std::vector<bool> writes = params_this_rank_writes(bytes, expert, replicas, replica, W / config_.ep, r / config_.ep);
  // A 16-bit model's values are written widened to float32, as --save writes them (a host model).
  const std::vector<float> widened = model.mixed() ? model.host_params() : std::vector<float>();
  std::vector<ParamSlice> owned;
  for (size_t k = 0; k < ps.size(); k++)
    if (writes[k])
      owned.push_back({static_cast<int>(k), 0, ps[k].numel, model.mixed() ? widened.data() + ps[k].offset : ps[k].data});
  save_sharded_checkpoint(config_.save_sharded_path, model, owned,
                          {world ? world->rank() : 0, world ? world->world_size() : 1,
                           [&] {
                             if (world) world->barrier()->wait();
                           }},
                          start_step_ + total_steps_, strategy_name(config_.strategy));
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

EvalResult Trainer::final_evaluation() {
  Model& model = result_model();
  ComputeObserver* obs = model.observer();
  model.set_observer(nullptr);  // evaluation is not part of the training trace
  EvalResult ev = evaluate(model, dataset(), config_.batch, nullptr, config_.eval_samples);
  model.set_observer(obs);
  return ev;
}

void Trainer::check_final_loss(const EvalResult& ev) const {
  if (config_.allow_nonfinite || std::isfinite(ev.loss)) return;
  throw RunStopped("training ended after step " + std::to_string(start_step_ + total_steps_) + " with " +
                   (std::isnan(ev.loss) ? "a NaN loss" : "an infinite loss") + " over the training set: the last update left parameters so large that the forward overflows; lower "
                   "--lr, or pass --allow-nonfinite to keep them");
}

void Trainer::save_at_end(int rank, const Model& model, Communicator* comm) {
  // A finite loss does not prove finite parameters (the last update can overflow): a run that ends
  // with non-finite parameters stops, before anything is saved. Every rank holding the full model
  // checks (a pipeline's or DataParallel's rank 0; the other ranks then fail at the barrier, and the
  // world reports this).
  if (!config_.allow_nonfinite && (rank == 0 || (!pipeline_ && config_.strategy != Strategy::Dp))) {
    const std::vector<float> p = model.host_params();
    for (const Parameter& q : model.parameters())
      if (has_nonfinite(p.data() + q.offset, q.numel))
        throw RunStopped("training ended after step " + std::to_string(start_step_ + total_steps_) + " with non-finite values in " +
                         q.name + " (the last update overflowed); lower --lr, or pass --allow-nonfinite to keep them");
  }
  // Finite parameters can still be too large for the forward: the loss over the training set is then
  // NaN or infinite, and neither the run nor its checkpoint counts as trained.
  if (rank == 0 && !config_.save_path.empty() && &model == &result_model()) {
    final_eval_ = std::make_unique<EvalResult>(final_evaluation());
    check_final_loss(*final_eval_);
  }
  // Rank 0 writes the checkpoint; the barrier keeps every rank from reading it (or exiting) early.
  std::map<std::string, std::string> meta = {{"optimizer", config_.optimizer.str()}, {"data", config_.data},
                                             {"seed", std::to_string(config_.seed)}, {"strategy", strategy_name(config_.strategy)},
                                             {"world", std::to_string(config_.world_size)}};
  // A text's vocabulary, token i = character i, so that `dtlab-cli generate` reads and writes text.
  if (!dataset_->chars.empty()) {
    std::vector<int32_t> ids(dataset_->chars.size());
    for (size_t i = 0; i < ids.size(); i++) ids[i] = static_cast<int32_t>(i);
    meta["vocab"] = decode_tokens(dataset_->chars, ids.data(), static_cast<int64_t>(ids.size()));
  }
  if (!config_.save_path.empty() && rank == 0) {
    if (model.lora()) save_lora_checkpoint(config_.save_path, model, start_step_ + total_steps_, meta, config_.merge_lora);
    else save_checkpoint(config_.save_path, model, start_step_ + total_steps_, meta);
  }
  if (comm && !config_.save_path.empty()) comm->barrier()->wait();
}

}  // namespace dtlab
