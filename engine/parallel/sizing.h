// Sizing a training run (the Ultra-Scale Playbook's calculator): from a model's shape, a global batch,
// a dp x tp x pp layout, precision, ZeRO stage, recomputation and a hardware profile, everything one
// would put on a whiteboard: memory per GPU by category, FLOPs per step, step time at an MFU, each
// dimension's traffic on its link and the communication-to-computation ratio. One function computes it
// all, and every figure carries its formula, so `dtlab-cli plan --global-batch`, the lab's Sizing view
// and the lessons' `sizing(...)` figures print the same numbers. Builds on plan_mesh (mesh_plan.h) for
// the per-rank states and traffic, context_plan.h and moe_plan.h for context and expert parallelism,
// and places every group in Megatron-core's rank order (rank_order.h). Sources: docs/course_sources.md
// §6f, §6h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/parallel/context_plan.h"
#include "engine/parallel/mesh_plan.h"
#include "engine/parallel/moe_plan.h"
#include "engine/parallel/rank_order.h"

namespace dtlab {

struct SizingInput {
  double params = 70e9;      // N (Ψ): parameters of the whole model
  int layers = 80;           // L
  int64_t hidden = 8192;     // h
  int heads = 64;            // a
  int64_t seq = 4096;        // s tokens per sequence
  int64_t global_batch = 512;  // B: sequences per optimizer step, over all replicas
  int64_t micro_batch = 1;   // b: sequences per micro-batch on one replica
  int dp = 64, tp = 8, pp = 1;
  PlanDType precision = PlanDType::Bf16;
  int zero = 1;              // 0 (DDP), 1 (optimizer states), 2 (+ gradients), 3 (+ parameters)
  bool recompute = false;    // full activation recomputation: keep each layer's input only
  bool sequence_parallel = true;  // with tp > 1: LayerNorm and dropout activations split over tp too
  std::string profile = "dgx-h100x2";
  double mfu = 0.4;          // model FLOPs utilization: model FLOPs / (GPUs x peak x time)
  double compute_seconds = 0;  // > 0: take forward + backward as this long (the course's premise), not FLOPs / MFU
  double gpu_memory = 80e9;  // bytes of one GPU's memory (H100 and A100 80 GB)
  int cp = 1;                // c: context parallelism, the sequence split over c ranks (world = dp·tp·cp·pp)
  CpLayout cp_layout = CpLayout::Ring;
  int kv_heads = 0;          // a_kv: K/V heads under grouped-query attention; 0: as many as heads
  MoeConfig moe;             // experts = 0: a dense model; ep carves its groups out of dp x cp
  int kv_heads_or_heads() const { return kv_heads > 0 ? kv_heads : heads; }
};

enum class SizingUnit : uint8_t { Bytes, Seconds, Flops, Share, Count };

// One figure: `key` names it (`sizing("dp.seconds", SPEC)`), `label` says what it is, `formula` how.
struct SizingLine {
  std::string section;  // "Memory per GPU", "Compute per step", ...: how the view and the CLI group lines
  std::string key, label;
  double value = 0;
  SizingUnit unit = SizingUnit::Count;
  std::string formula;
};

// One kind of group placed on the profile's nodes in Megatron-core's order (tp-cp-ep-dp-pp).
struct SizingGroup {
  ParallelGroup group = ParallelGroup::TP;
  GroupPlacement place;
  std::string link;         // "NVSwitch" inside a node, the network's fabric across nodes
  double beta = 0;          // that link's seconds per byte
};

struct SizingPlan {
  int world = 1;            // dp x tp x cp x pp GPUs
  int64_t micro_batches = 1;  // m = B / (dp·b): per replica per step (accumulation or the pipeline's)
  double tokens = 0;        // B·s per step
  // Bytes per GPU.
  double params = 0, grads = 0, optimizer = 0, activations = 0, total = 0;
  int in_flight = 1;        // micro-batches whose activations a stage holds (1F1B: min(m, p))
  // FLOPs per step, all GPUs together. model = dense + attention; hardware adds the recomputed forward.
  double dense_flops = 0, attention_flops = 0, model_flops = 0, recompute_flops = 0;
  double peak_flops = 0;    // one GPU's dense 16-bit peak on the profile
  double compute_seconds = 0, bubble = 0, bubble_seconds = 0;
  MeshPlan mesh;            // per-rank states and each dimension's traffic, placed on the profile
  double dp_bytes = 0, tp_bytes = 0, pp_bytes = 0;         // per GPU per step (tp with recompute's extra forward)
  double dp_seconds = 0, tp_seconds = 0, pp_seconds = 0;   // at each dimension's link bandwidth
  double comm_seconds = 0, step_seconds = 0;               // without overlap: compute + bubble + comm
  // Context parallelism: bytes per GPU per step on the CP group, the busiest rank's causal attention
  // work over the mean, and the time the others wait for it.
  double cp_bytes = 0, cp_seconds = 0, cp_imbalance = 1, cp_wait_seconds = 0;
  // Mixture of experts: the parameters (total, active per token), what one GPU holds before ZeRO, the
  // expert-data-parallel size d·c/e, the EP all-to-alls and the experts' gradient reduction over edp.
  MoeParams moe;
  double rank_params = 0;
  int expert_dp = 1;
  double ep_bytes = 0, ep_seconds = 0, edp_bytes = 0, edp_seconds = 0;
  std::vector<SizingGroup> placement;  // tp, cp, dp x cp, pp, then ep and edp with experts
  double ratio = 0;          // comm / compute
  double overhead = 0;       // comm / (compute + comm): the course's 36%
  double grad_bytes = 0;     // N·g: the whole model's gradients (the course's 140 GB at 70B in fp16)
  bool fits = true;          // total <= gpu_memory
  std::vector<SizingLine> lines;  // every figure above with its formula, in display order
};

// dtlab::Error (one sentence) for layouts that describe no run: a degree that does not divide the
// layers, heads or hidden size, a global batch that does not split into whole micro-batches, ...
SizingPlan plan_sizing(const SizingInput& in);

// The line called `key`; dtlab::Error listing the keys when there is none.
const SizingLine& sizing_line(const SizingPlan& p, const std::string& key);
// "140.00 GB", "5.56 s", "2.45 EFLOP", "35.7%", "128": decimal units, as the course writes them.
std::string format_sizing_value(double value, SizingUnit unit);

// "params=70B layers=80 hidden=8192 heads=64 seq=4096 global_batch=512 micro_batch=1 dp=64 tp=8 pp=1
// precision=bf16 zero=1 recompute=0 sp=1 profile=dgx-h100x2 mfu=0.4 compute_s=10 gpu_gb=80 cp=2
// cp_layout=zigzag kv_heads=8 ep=8 experts=64 top_k=2 capacity=1.25 moe_every=2": any
// subset, over SizingInput's defaults. dtlab::Error (one sentence) for an unknown key or a bad value.
SizingInput parse_sizing_spec(const std::string& spec);
// The spec that parse_sizing_spec reads back as `in` (every key).
std::string sizing_spec(const SizingInput& in);

// The same layout scaled down to the lab's built-in MLP on at most 8 ranks: each degree capped (tp
// and pp at 2, dp to what is left), the ZeRO stage as FSDP's sharding (0: DDP), the precision,
// recomputation as activation checkpointing, the profile, and the micro-batches as gradient
// accumulation or the pipeline's (at most 4). dtlab's flags, as `scenario` and the Run panel take them.
std::vector<std::string> sizing_mirror_flags(const SizingInput& in);

// One GPU's dense 16-bit peak FLOP/s on a profile: 989e12 on the dgx-h100 profiles (H100 SXM),
// 312e12 (A100) on the other built-in ones, the measured rate on "this".
double gpu_peak_flops(const HardwareProfile& profile);

}  // namespace dtlab
