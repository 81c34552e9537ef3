// Memory planner for data-parallel sharding: per-rank bytes of parameters, gradients and optimizer
// state under DDP, ZeRO-1/2/3 and FSDP's strategies, by the ZeRO paper's formulas (docs/course_sources.md §11).
// A pure function of a few numbers, so `dtlab-cli plan` and the GUI can put the toy model the engine
// really trains beside the same strategy at 7B. Activations and temporary buffers are not counted.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/core/model.h"  // ModelSpec
#include "engine/core/optim.h"  // OptimizerKind

namespace dtlab {

// Ordered by how much is sharded; the ZeRO stage each matches is zero_stage().
enum class Sharding : uint8_t { NoShard, Zero1, ShardGradOp, FullShard, Hybrid };
inline constexpr std::array<Sharding, 5> kAllShardings = {Sharding::NoShard, Sharding::Zero1,
                                                          Sharding::ShardGradOp, Sharding::FullShard,
                                                          Sharding::Hybrid};

Sharding parse_sharding(std::string_view name);  // "no-shard" | "zero1" | "grad-op" | "full" | "hybrid"
const char* sharding_flag(Sharding s);           // the name parse_sharding() takes: "grad-op"
const char* sharding_name(Sharding s);           // torch's name: "SHARD_GRAD_OP"
int zero_stage(Sharding s);                      // 0, 1, 2, 3, 3 (HYBRID_SHARD is stage 3 inside a group)

// The training precision (`plan --precision`). Fp32: dtlab's real engine, everything in float32.
// Fp16, Bf16: mixed precision as the ZeRO paper counts it (§3.1): 2-byte parameters and gradients,
// the optimizer holding an fp32 master copy beside its fp32 state. Mixed is the older `--dtype
// mixed`, the paper's fp16; both half types cost the same bytes (docs/course_sources.md §6d).
enum class PlanDType : uint8_t { Fp32, Fp16, Bf16, Mixed = Fp16 };
PlanDType parse_plan_dtype(std::string_view name);  // "fp32" | "bf16" | "fp16" | "mixed" (= fp16)
const char* plan_dtype_name(PlanDType d);           // "fp32" | "bf16" | "fp16"
inline bool is_half(PlanDType d) { return d != PlanDType::Fp32; }

// Bytes each parameter costs per copy. Mixed AdamW is the paper's 2 + 2 + K with K = 12 (fp32
// master, m, v); mixed SGD keeps the master copy (4) plus its momentum (4) if any. Fp32 matches
// Optimizer::state_bytes_per_param(): AdamW 8, SGD with momentum 4, plain SGD 0.
// half_state: the course's accounting ("model 14 GB + gradients 14 GB + optimizer 28 GB" at 7B):
// the optimizer's state kept in the 2-byte training dtype and no fp32 master copy, so AdamW costs
// 2 + 2 + 4 = 8 bytes, not the paper's 16. Only meaningful with a half precision.
struct BytesPerParam {
  int parameters = 0, gradients = 0, optimizer_state = 0;
  int master_weights = 0;  // the fp32 master copy's share of optimizer_state (4 in mixed precision)
};
BytesPerParam bytes_per_param(PlanDType dtype, OptimizerKind optimizer, bool sgd_momentum,
                              bool half_state = false);

struct MemoryPlanInput {
  double params = 0;  // Ψ, a whole number of parameters (a double so 70B needs no care)
  int world = 1;      // data-parallel ranks
  int node_size = 0;  // HYBRID_SHARD's shard group (ranks per node); 0 = world. Ignored by the others.
  Sharding sharding = Sharding::FullShard;
  PlanDType dtype = PlanDType::Fp32;
  OptimizerKind optimizer = OptimizerKind::AdamW;
  bool sgd_momentum = false;
  // FSDP unshards one unit (wrapped module) at a time: its full parameters, and in backward its
  // full gradient until the reduce-scatter. Parameters of the largest unit; 0 = leave this out.
  double largest_unit_params = 0;
  int units_in_flight = 1;  // 2 when the next unit's all-gather is prefetched (BACKWARD_PRE)
  bool half_optimizer_state = false;  // the course's accounting (see bytes_per_param)
  // LoRA: Ψ_L adapter parameters trained beside the frozen base Ψ (0 = full fine-tuning, all Ψ
  // trained). Parameters cost Ψ + Ψ_L; gradients, optimizer state and the gradient reduction
  // cover only Ψ_L, as torch gives frozen weights (requires_grad=False) no .grad and no state.
  double lora_params = 0;
};

// Bytes per rank. Sharded parts hold ceil(Ψ/N_d) elements per rank, as FSDP's flat parameter pads
// the last shards; with Ψ divisible by N_d these are the paper's Ψ/N_d exactly.
struct MemoryPlan {
  int shard_ranks = 1;  // N_d: ranks the sharded parts are split over (1 for NO_SHARD)
  double parameters = 0, gradients = 0, optimizer_state = 0;
  double gathered = 0;  // unsharded parameters/gradients of the units in flight (stages 2 and 3)
  double total = 0;     // the four above
  // Bytes each rank sends per step with ring collectives (it receives as many). Convention: a ring
  // all-reduce of Ψ elements sends 2(N-1)/N Ψ, an all-gather or reduce-scatter (N-1)/N Ψ. So
  // stage 0 (all-reduce) and stages 1-2 (reduce-scatter gradients, all-gather updated parameters)
  // move the paper's "2Ψ", stage 3 (all-gather in forward and again in backward, reduce-scatter)
  // "3Ψ". HYBRID_SHARD: 3Ψ inside its group plus an all-reduce of its Ψ/N_d shard across groups.
  double comm_bytes = 0;
  double comm_cross_group_bytes = 0;  // HYBRID_SHARD: the part of comm_bytes that crosses groups
  // The gradients one step reduces, whole (Ψ or Ψ_L times the gradient bytes): the course's "28 GB
  // of gradients per step" in fp32, 14 GB in fp16. A ring all-reduce sends about twice this.
  double grad_payload = 0;
  std::string formula;       // per-rank memory in the paper's notation: "2Ψ + (2+12)Ψ/N_d"
  std::string comm_formula;  // "2Ψ", "3Ψ", "3Ψ + 2Ψ/N_d"
};

// Throws dtlab::Error (one sentence) for inputs that describe no real run.
MemoryPlan plan_memory(const MemoryPlanInput& in);

// LoRA's trainable parameters on a transformer: `modules` h x h projections per layer (4: q, k,
// v, o; peft's default for Llama is 2: q and v), each with A (r x h) and B (h x r): L·n·r·2h.
double lora_param_count(int layers, int64_t hidden, int rank, int modules);

// Activation memory of a transformer's layers, Korthikanti et al. 2022 (§4, Table 2), 16-bit
// activations, no tensor or sequence parallelism: s·b·h·(34 + 5·a·s/h) bytes per layer kept for
// backward, or 2·s·b·h (the layer's input) with full recomputation (activation checkpointing).
struct ActivationPlan {
  double per_layer = 0, per_layer_checkpointed = 0;  // bytes
  double total = 0, total_checkpointed = 0;          // x layers
  double saved = 0;                                  // total - total_checkpointed
};
// Korthikanti et al. 2022, Table 2: the bytes one transformer layer keeps for backward for one
// micro-batch of `micro_batch` sequences (16-bit activations, 1-byte dropout masks): s·b·h·(34 +
// 5·a·s/h) unsplit, /t with tensor and sequence parallelism, s·b·h·(10 + 24/t + 5·a·s/(h·t)) with
// tensor parallelism alone; with full recomputation only the layer's 16-bit input, 2·s·b·h (/t
// sequence parallel). plan_activations and the sizing calculator (sizing.h) both count with it.
double layer_activation_bytes(int64_t seq, int64_t micro_batch, int64_t hidden, int heads, int tp = 1,
                              bool sequence_parallel = false, bool recompute = false);
// Throws dtlab::Error (one sentence) when a size is below 1.
ActivationPlan plan_activations(int layers, int64_t hidden, int64_t seq, int64_t micro_batch, int heads);

// "7.5e9", "7B", "70b", "125M", "350K", "1.3T", "4547" -> a whole number of parameters (>= 1).
double parse_param_count(std::string_view text);
// 7.5e9 -> "7.5B", 1.25e8 -> "125M", 4547 -> "4547": short, for headers and labels.
std::string param_count_str(double params);

}  // namespace dtlab

namespace dtlab {

// Activation memory of the engine's Model for one batch (no tensor parallelism, no skipped layer):
// exactly the bytes Model::forward() allocates as MemCategory::Activations (tested against the
// tracker). Without checkpointing every layer's output (B, out) plus two activation-gradient buffers
// of B x the widest width; with it (docs/course_sources.md §6d) only each Linear+ReLU block's output
// (the ReLU's; the last Linear's) plus one recompute buffer of B x the widest output.
int64_t mlp_activation_bytes(const ModelSpec& spec, int64_t batch, bool checkpointing);

// One tensor a GPT block keeps for its backward, in bytes for a batch of B sequences, as Korthikanti
// et al. 2022 (§4.1, Table 2; docs/course_sources.md §6c) count it for Megatron's layer (16-bit
// activations, 1-byte dropout masks; s = T, b = B, h = C, a = heads) and as this engine keeps it
// (GptCore: float32, nanoGPT's layer without dropout, and each LayerNorm's mean and rstd).
struct GptActivationTerm {
  std::string tensor;   // "q, k, v (c_attn's output)"
  double korthikanti;   // bytes; their sum is layer_activation_bytes(T, B, C, heads): s·b·h·(34 + 5·a·s/h)
  int64_t engine;       // bytes; their sum is gpt_block_activation_bytes()
  std::string why;      // where the two differ, and why ("" where they count the same tensor)
};
// `tp`: a tensor-parallel shard's share (Korthikanti's Table 2 rows with t): the heads' and the MLP
// columns' tensors divide by t, the LayerNorm regions' (block input, LayerNorm outputs, the residual,
// their dropout masks) are whole, or divided by t too under sequence parallelism: s·b·h·(10 + 24/t +
// 5·a·s/(h·t)), and s·b·h/t·(34 + 5·a·s/h) with it.
// `esize`: bytes per activation (4; 2 under --precision bf16/fp16, where LayerNorm's statistics stay
// float32: GptCore::set_precision).
std::vector<GptActivationTerm> gpt_block_activation_terms(const GptSpec& spec, int64_t B, const TensorParallelSpec& tp = {},
                                                          int64_t esize = 4);
// 4·(16·sbh + 4·sb + a·s²·b) on one rank: what GptCore keeps per block (its input included) for B
// sequences; a TP shard's share of it.
int64_t gpt_block_activation_bytes(const GptSpec& spec, int64_t B, const TensorParallelSpec& tp = {}, int64_t esize = 4);
// Every Activations byte a whole GPT's forward allocates (GptCore::ensure, tested against the
// tracker): the blocks' saved tensors (with checkpointing: each block's output, one shared set of
// the inner ones), ln_f's, the logits (B·T x V), and the backward's scratch (under sequence
// parallelism also the gathered LayerNorm outputs and the collectives' staging).
int64_t gpt_activation_bytes(const GptSpec& spec, int64_t B, bool checkpointing, const TensorParallelSpec& tp = {},
                             int64_t esize = 4);

// What LoRA's adapters add to that in float32 (engine/core/lora.cpp's scratch, sized for the largest
// adapted Linear): t and dt (2 x B x r), the scaled output or its gradient (B x the widest adapted
// output) and the adapter's input gradient (B x the widest adapted input of a Linear after the first,
// whose input gradient backward computes). 0 without LoRA.
int64_t mlp_lora_activation_bytes(const ModelSpec& spec, const LoraSpec& lora, int64_t batch);
// A GPT's LoRA scratch (engine/core/gpt.h), beside gpt_activation_bytes: x A^T and its gradient
// (2 x B*T x r), c_attn's scaled adapter output (B*T x 3C/t) and the adapter's input gradient (B*T x C);
// 0 without LoRA.
int64_t gpt_lora_activation_bytes(const GptSpec& spec, const LoraSpec& lora, int64_t B, const TensorParallelSpec& tp = {},
                                  int64_t esize = 4);

}  // namespace dtlab
