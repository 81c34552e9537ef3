#include "engine/parallel/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "engine/core/check.h"

namespace dtlab {

namespace {

// Beyond any model anyone trains, and small enough that every byte count stays exact in a double.
constexpr double kMaxParams = 1e15;

std::string num_str(double v) {  // 4547, 7500000000, 2.5: no exponent for whole counts
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}

bool is_whole(double v) { return std::isfinite(v) && std::floor(v) == v; }

// "2Ψ" for one contribution, "(2+2)Ψ" for several, "" for none; zero bytes are left out so plain
// SGD's empty optimizer state reads "(4+4)Ψ", not "(4+4)Ψ + 0Ψ/N_d".
std::string psi_term(const std::vector<int>& bytes, const char* suffix) {
  std::string inner;
  int n = 0;
  for (int b : bytes) {
    if (b == 0) continue;
    inner += (n++ ? "+" : "") + std::to_string(b);
  }
  if (n == 0) return "";
  return (n > 1 ? "(" + inner + ")" : inner) + suffix;
}

std::string joined_terms(const std::vector<std::string>& terms) {
  std::string s;
  for (const auto& t : terms)
    if (!t.empty()) s += (s.empty() ? "" : " + ") + t;
  return s.empty() ? "0" : s;
}

void validate(const MemoryPlanInput& in) {
  if (!is_whole(in.params) || in.params < 1 || in.params > kMaxParams)
    throw Error("the model size must be a whole number of parameters from 1 to 1e15, not " +
                num_str(in.params));
  if (in.world < 1)
    throw Error("the world size must be at least 1 rank, not " + std::to_string(in.world));
  if (in.node_size < 0 || in.node_size > in.world)
    throw Error("the node size must be from 1 to the world size (" + std::to_string(in.world) +
                "), or 0 for the whole world, not " + std::to_string(in.node_size));
  if (in.node_size > 0 && in.world % in.node_size != 0) {
    // Name the sizes that would work: HYBRID_SHARD needs equal groups, one replica per group.
    std::string ok;
    for (int d = 1; d <= in.world; d++)
      if (in.world % d == 0) ok += (ok.empty() ? "" : ", ") + std::to_string(d);
    throw Error("node size " + std::to_string(in.node_size) + " does not divide world size " +
                std::to_string(in.world) + "; HYBRID_SHARD needs equal groups, so use one of " + ok);
  }
  if (!is_whole(in.largest_unit_params) || in.largest_unit_params < 0)
    throw Error("the largest unit must be a whole number of parameters (0 to leave it out), not " +
                num_str(in.largest_unit_params));
  if (in.largest_unit_params > in.params)
    throw Error("the largest unit (" + num_str(in.largest_unit_params) +
                " parameters) cannot be larger than the whole model (" + num_str(in.params) + ")");
  if (in.units_in_flight != 1 && in.units_in_flight != 2)
    throw Error("units in flight must be 1 (no prefetch) or 2 (the next unit prefetched), not " +
                std::to_string(in.units_in_flight));
  if (in.sgd_momentum && in.optimizer != OptimizerKind::SGD)
    throw Error("momentum applies to SGD; AdamW always keeps its two moments m and v");
  if (in.half_optimizer_state && !is_half(in.dtype))
    throw Error("a half-precision optimizer state needs a half training precision; use bf16 or fp16, or keep the state in fp32");
  if (!is_whole(in.lora_params) || in.lora_params < 0 || in.lora_params >= in.params)
    throw Error("LoRA's trainable parameters must be a whole number below the model's " + num_str(in.params) +
                " (0 for full fine-tuning), not " + num_str(in.lora_params));
  if (in.lora_params > 0 && in.largest_unit_params > 0)
    throw Error("the gathered unit is not modelled with LoRA; leave out the largest unit's size");
}

}  // namespace

Sharding parse_sharding(std::string_view name) {
  for (Sharding s : kAllShardings)
    if (name == sharding_flag(s)) return s;
  throw Error("sharding strategy '" + std::string(name) +
              "' is not known; use no-shard, zero1, grad-op, full or hybrid");
}

const char* sharding_flag(Sharding s) {
  switch (s) {
    case Sharding::NoShard: return "no-shard";
    case Sharding::Zero1: return "zero1";
    case Sharding::ShardGradOp: return "grad-op";
    case Sharding::FullShard: return "full";
    case Sharding::Hybrid: return "hybrid";
  }
  return "?";
}

const char* sharding_name(Sharding s) {
  switch (s) {
    case Sharding::NoShard: return "NO_SHARD";
    // torch has no ShardingStrategy for ZeRO-1; ZeroRedundancyOptimizer is the nearest thing.
    case Sharding::Zero1: return "ZeRO-1 (optimizer state)";
    case Sharding::ShardGradOp: return "SHARD_GRAD_OP";
    case Sharding::FullShard: return "FULL_SHARD";
    case Sharding::Hybrid: return "HYBRID_SHARD";
  }
  return "?";
}

int zero_stage(Sharding s) {
  switch (s) {
    case Sharding::NoShard: return 0;
    case Sharding::Zero1: return 1;
    case Sharding::ShardGradOp: return 2;
    case Sharding::FullShard:
    case Sharding::Hybrid: return 3;
  }
  return 0;
}

PlanDType parse_plan_dtype(std::string_view name) {
  if (name == "fp32") return PlanDType::Fp32;
  if (name == "bf16") return PlanDType::Bf16;
  if (name == "fp16" || name == "mixed") return PlanDType::Fp16;
  throw Error("precision '" + std::string(name) +
              "' is not known; use fp32 (dtlab's engine), bf16 or fp16 (mixed precision with fp32 Adam; mixed = fp16)");
}

const char* plan_dtype_name(PlanDType d) {
  switch (d) {
    case PlanDType::Fp32: return "fp32";
    case PlanDType::Fp16: return "fp16";
    case PlanDType::Bf16: return "bf16";
  }
  return "?";
}

BytesPerParam bytes_per_param(PlanDType dtype, OptimizerKind optimizer, bool sgd_momentum, bool half_state) {
  // Optimizer state: AdamW's m and v, SGD's momentum buffer when it has one, each one element.
  const int elems = optimizer == OptimizerKind::AdamW ? 2 : (sgd_momentum ? 1 : 0);
  if (!is_half(dtype)) return {4, 4, 4 * elems, 0};
  if (half_state) return {2, 2, 2 * elems, 0};  // the course's: all in the training dtype, no master
  return {2, 2, 4 + 4 * elems, 4};              // the paper's: + the fp32 master copy of the weights
}

namespace {

// Memory formula in the paper's notation, one group per symbol: "2Ψ + (2+12)Ψ/N_d"; with LoRA
// "2(Ψ+Ψ_L) + (2+12)Ψ_L". Sharding is monotone (params only if grads, grads only if optimizer),
// so the whole groups come first.
std::string memory_formula(const BytesPerParam& b, bool lora, const std::array<bool, 3>& sharded) {
  const char* counts[3] = {lora ? "(Ψ+Ψ_L)" : "Ψ", lora ? "Ψ_L" : "Ψ", lora ? "Ψ_L" : "Ψ"};
  const int bytes[3] = {b.parameters, b.gradients, b.optimizer_state};
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < 3; i++) {
      if (sharded[static_cast<size_t>(i)] != (pass == 1)) continue;
      const std::string sym = std::string(counts[i]) + (pass == 1 ? "/N_d" : "");
      if (groups.empty() || groups.back().first != sym) groups.push_back({sym, {}});
      groups.back().second.push_back(bytes[i]);
    }
  std::vector<std::string> terms;
  for (const auto& [sym, b_list] : groups) terms.push_back(psi_term(b_list, sym.c_str()));
  return joined_terms(terms);
}

// Communication, ring volumes per rank (see the header): (n-1)/n of the payload per all-gather
// or reduce-scatter, twice that per all-reduce. Padding is left out: this is the paper's model.
// `held`: parameters all-gathered (Ψ, or Ψ + Ψ_L with LoRA); `trained`: gradients reduced.
void plan_comm(const MemoryPlanInput& in, const BytesPerParam& b, double held, double trained, MemoryPlan& p) {
  auto ring = [](int n) { return n > 1 ? double(n - 1) / n : 0.0; };
  const bool lora = in.lora_params > 0;
  const int w = in.world, nd = p.shard_ranks;
  const std::string three = lora ? "2(Ψ+Ψ_L) + Ψ_L" : "3Ψ";
  switch (in.sharding) {
    case Sharding::NoShard:  // all-reduce the gradients
      p.comm_bytes = 2 * ring(w) * trained * b.gradients;
      p.comm_formula = w > 1 ? (lora ? "2Ψ_L" : "2Ψ") : "0";
      break;
    case Sharding::Zero1:  // reduce-scatter the gradients, all-gather the updated parameters
    case Sharding::ShardGradOp:
      p.comm_bytes = ring(w) * trained * (b.gradients + b.parameters);
      p.comm_formula = w > 1 ? (lora ? "2Ψ_L" : "2Ψ") : "0";
      break;
    case Sharding::FullShard:  // all-gather in forward, again in backward, reduce-scatter
      p.comm_bytes = ring(w) * (2 * held * b.parameters + trained * b.gradients);
      p.comm_formula = w > 1 ? three : "0";
      break;
    case Sharding::Hybrid: {  // FULL_SHARD inside the group, then all-reduce the shard across groups
      const int groups = w / nd;
      p.comm_cross_group_bytes = 2 * ring(groups) * (trained / nd) * b.gradients;
      p.comm_bytes = ring(nd) * (2 * held * b.parameters + trained * b.gradients) + p.comm_cross_group_bytes;
      const std::string across = lora ? "2Ψ_L" : "2Ψ";
      p.comm_formula = joined_terms({nd > 1 ? three : "", groups > 1 ? (nd > 1 ? across + "/N_d" : across) : ""});
      break;
    }
  }
}

}  // namespace

MemoryPlan plan_memory(const MemoryPlanInput& in) {
  validate(in);
  const BytesPerParam b = bytes_per_param(in.dtype, in.optimizer, in.sgd_momentum, in.half_optimizer_state);
  const Sharding s = in.sharding;
  const int stage = zero_stage(s);
  const bool lora = in.lora_params > 0;
  // What each rank holds and what it trains: the whole Ψ, or the frozen base plus the adapters.
  const double held = in.params + in.lora_params, trained = lora ? in.lora_params : in.params;

  MemoryPlan p;
  p.shard_ranks = s == Sharding::NoShard ? 1
                  : s == Sharding::Hybrid && in.node_size > 0 ? in.node_size
                                                              : in.world;
  const int nd = p.shard_ranks;
  // ceil(x/N_d): FSDP pads its flat parameter so every rank's shard has the same length.
  auto shard = [nd](double x) { return std::ceil(x / nd); };

  // Each stage shards one more kind of state: 1 the optimizer's, 2 the gradients, 3 the parameters.
  const bool shard_params = stage >= 3, shard_grads = stage >= 2, shard_optim = stage >= 1;
  p.parameters = b.parameters * (shard_params ? shard(held) : held);
  p.gradients = b.gradients * (shard_grads ? shard(trained) : trained);
  p.optimizer_state = b.optimizer_state * (shard_optim ? shard(trained) : trained);
  p.grad_payload = b.gradients * trained;

  // What a sharded rank holds whole for a while: stage 3 all-gathers a unit's parameters and, in
  // backward, holds its full gradient until the reduce-scatter; stage 2 keeps the parameters whole
  // (already counted) so only the gradient. A unit's unsharded flat parameter is N_d padded shards.
  const double unit = std::ceil(in.largest_unit_params / nd) * nd;
  std::string gathered_term;
  if (nd > 1 && unit > 0 && stage >= 2) {
    const std::vector<int> bytes = stage >= 3 ? std::vector<int>{b.parameters, b.gradients}
                                              : std::vector<int>{b.gradients};
    int per_unit = 0;
    for (int x : bytes) per_unit += x;
    p.gathered = in.units_in_flight * unit * per_unit;
    gathered_term = (in.units_in_flight > 1 ? std::to_string(in.units_in_flight) + "×" : "") +
                    psi_term(bytes, "Ψ_u");
  }
  p.total = p.parameters + p.gradients + p.optimizer_state + p.gathered;
  p.formula = memory_formula(b, lora, {shard_params, shard_grads, shard_optim});
  if (!gathered_term.empty()) p.formula += " + " + gathered_term;
  plan_comm(in, b, held, trained, p);
  return p;
}

double lora_param_count(int layers, int64_t hidden, int rank, int modules) {
  if (layers < 1 || hidden < 1 || rank < 1 || modules < 1)
    throw Error("LoRA's count needs layers, hidden size, rank and modules of at least 1");
  if (rank > hidden)
    throw Error("LoRA rank " + std::to_string(rank) + " is larger than the hidden size " + std::to_string(hidden) +
                "; a low-rank adapter needs r <= h");
  // Each adapted h x h projection gets A (r x h) and B (h x r), no biases (peft: bias="none").
  return double(layers) * modules * rank * 2.0 * double(hidden);
}

double layer_activation_bytes(int64_t seq, int64_t micro_batch, int64_t hidden, int heads, int tp, bool sequence_parallel,
                              bool recompute) {
  const double sbh = double(seq) * double(micro_batch) * double(hidden);
  // 34·sbh for the attention and MLP blocks' inputs, outputs and masks, plus 5·a·s²·b for the
  // attention scores, softmax and its dropout mask (eq. 1); Table 2 for the split forms.
  const double t = tp, attn = 5.0 * heads * double(seq) / double(hidden);
  const bool sp = sequence_parallel && tp > 1;
  if (recompute) return 2 * sbh / (sp ? t : 1);
  if (tp == 1) return sbh * (34 + attn);
  if (sp) return sbh * (34 + attn) / t;
  return sbh * (10 + 24 / t + attn / t);
}

ActivationPlan plan_activations(int layers, int64_t hidden, int64_t seq, int64_t micro_batch, int heads) {
  if (layers < 1 || hidden < 1 || seq < 1 || micro_batch < 1 || heads < 1)
    throw Error("activation memory needs layers, hidden size, sequence length, micro-batch and heads of at least 1");
  ActivationPlan a;
  a.per_layer = layer_activation_bytes(seq, micro_batch, hidden, heads);
  a.per_layer_checkpointed = layer_activation_bytes(seq, micro_batch, hidden, heads, 1, false, true);  // the layer's input
  a.total = a.per_layer * layers;
  a.total_checkpointed = a.per_layer_checkpointed * layers;
  a.saved = a.total - a.total_checkpointed;
  return a;
}

double parse_param_count(std::string_view text) {
  const std::string s(text);
  const Error bad("'" + s + "' is not a parameter count; write a number such as 7.5e9 or 4547, or use a suffix: 350K, 125M, 7B, 1.3T");
  if (s.empty()) throw bad;
  double scale = 1;
  std::string body = s;
  switch (std::tolower(static_cast<unsigned char>(s.back()))) {
    case 'k': scale = 1e3; break;
    case 'm': scale = 1e6; break;
    case 'b': scale = 1e9; break;
    case 't': scale = 1e12; break;
    default: break;
  }
  if (scale != 1) body.pop_back();
  // strtod alone would take leading spaces, "inf" and "nan"; a count is none of those.
  if (body.empty() || !(std::isdigit(static_cast<unsigned char>(body[0])) || body[0] == '.')) throw bad;
  char* end = nullptr;
  const double v = std::strtod(body.c_str(), &end) * scale;
  if (end != body.c_str() + body.size() || !std::isfinite(v)) throw bad;
  if (v < 1) throw Error("'" + s + "' is less than one parameter; a model has at least 1");
  // Said here, on the text as given: a caller that prints the count (CLI11 stores it as text) would
  // otherwise cut 1e300 to its first digits and complain about 1e+30.
  if (v > kMaxParams) throw Error("'" + s + "' is more than 1e15 parameters, beyond any model this plans; give at most 1e15 (1000T)");
  // "1.3B" is 1.3 * 1e9 in binary floating point, a hair off 1300000000: round within a tolerance.
  const double r = std::round(v);
  if (std::fabs(v - r) > 1e-9 * v) throw Error("'" + s + "' is not a whole number of parameters");
  return r;
}

std::string param_count_str(double params) {
  struct Unit {
    double scale;
    const char* suffix;
  };
  for (Unit u : {Unit{1e12, "T"}, Unit{1e9, "B"}, Unit{1e6, "M"}}) {
    if (params < u.scale) continue;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g%s", params / u.scale, u.suffix);
    return buf;
  }
  return num_str(params);
}

}  // namespace dtlab

namespace dtlab {

int64_t mlp_activation_bytes(const ModelSpec& spec, int64_t batch, bool checkpointing) {
  const auto& d = spec.dims;
  const size_t n = d.size() - 1;  // Linear layers
  int64_t kept = 0, inner = 0, widest_out = 0;
  for (size_t l = 0; l < n; l++) {
    kept += d[l + 1];                      // the block's output: its ReLU's, or the last Linear's
    if (l + 1 < n) inner += d[l + 1];      // the Linear's output inside the block
    widest_out = std::max(widest_out, d[l + 1]);
  }
  const int64_t widest = *std::max_element(d.begin(), d.end());
  const int64_t floats = kept + (checkpointing ? widest_out : inner) + 2 * widest;
  return floats * batch * static_cast<int64_t>(sizeof(float));
}

std::vector<GptActivationTerm> gpt_block_activation_terms(const GptSpec& g, int64_t B, const TensorParallelSpec& tp, int64_t E) {
  const int64_t t = tp.degree;
  const bool sp = t > 1 && tp.sequence_parallel;
  const double s = static_cast<double>(g.ctx), b = static_cast<double>(B), h = static_cast<double>(g.embd),
               a = static_cast<double>(g.heads), sbh = s * b * h, as2b = a * s * s * b / static_cast<double>(t);
  // Split: the heads' and the MLP columns' tensors; LN: the LayerNorm regions', split only under SP.
  const double split = sbh / static_cast<double>(t), ln = sp ? split : sbh;
  const int64_t BT = B * g.ctx, R = sp ? BT / t : BT, F = sizeof(float);  // E: an activation's bytes; F: a statistic's
  const int64_t C = g.embd, Ct = C / t;
  const std::string no_dropout = "no dropout in this model (nanoGPT's default dropout 0.0)";
  const std::string stats = "Korthikanti leaves LayerNorm's statistics out";
  return {
      {"ln_1 input (the block's input)", 2 * ln, E * R * C, ""},
      {"ln_1 mean and rstd", 0, F * 2 * R, stats},
      {"c_attn input (ln_1's output)", 2 * ln, E * R * C, ""},
      {"q and k (for q·k^T), v (for att·v)", 6 * split, E * 3 * BT * Ct, ""},
      {"softmax output", 2 * as2b, E * B * (g.heads / t) * g.ctx * g.ctx, ""},
      {"softmax dropout mask", as2b, 0, no_dropout},
      {"dropout output (att·v's input)", 2 * as2b, 0, no_dropout + ": att·v reads the softmax output"},
      {"attn.c_proj input (attention's output)", 2 * split, E * BT * Ct, ""},
      {"attention dropout mask", ln, 0, no_dropout},
      {"ln_2 input (the residual)", 2 * ln, E * R * C, ""},
      {"ln_2 mean and rstd", 0, F * 2 * R, stats},
      {"c_fc input (ln_2's output)", 2 * ln, E * R * C, ""},
      {"GELU input (c_fc's output, 4h)", 8 * split, E * 4 * BT * Ct, ""},
      {"mlp.c_proj input (GELU's output, 4h)", 8 * split, E * 4 * BT * Ct, ""},
      {"MLP dropout mask", ln, 0, no_dropout},
  };
}

int64_t gpt_block_activation_bytes(const GptSpec& g, int64_t B, const TensorParallelSpec& tp, int64_t E) {
  int64_t n = 0;
  for (const GptActivationTerm& t : gpt_block_activation_terms(g, B, tp, E)) n += t.engine;
  return n;
}

int64_t gpt_activation_bytes(const GptSpec& g, int64_t B, bool checkpointing, const TensorParallelSpec& tp, int64_t E) {
  const int64_t t = tp.degree;
  const bool sp = t > 1 && tp.sequence_parallel;
  const int64_t BT = B * g.ctx, BTC = BT * g.embd, R = sp ? BT / t : BT, RC = R * g.embd, L = g.layers, F = sizeof(float);
  const int64_t block = gpt_block_activation_bytes(g, B, tp, E);
  const int64_t input = E * RC;  // each block's input: the embeddings' sum, then the blocks' outputs
  // ln_f's output, mean and rstd; the logits (whole: ln_f's output is gathered first under SP, and this
  // rank's rows of dlogits are staged for the head's backward). In 16 bits also the logits' float32
  // copy for the loss and dlogits rounded to 16 bits.
  const int64_t head = E * (RC + BT * g.vocab) + F * 2 * R + (sp ? E * (BTC + R * g.vocab) : 0) + (E < F ? (F + E) * BT * g.vocab : 0);
  // dres, dbuf, dqkv, dfch, datt (float32: attention's backward scratch); under SP the gathered
  // LayerNorm output, the collectives' staging, the gathered output gradient and this rank's rows of a sum.
  const int64_t scratch = E * (RC + BTC + 3 * BTC / t + 4 * BTC / t) + F * g.ctx * g.ctx + (sp ? E * (3 * BTC + RC) : 0);
  // The last block's output is ln_f's input: L + 1 tensors of R x C between the blocks.
  const int64_t kept = checkpointing ? (L + 1) * input + (block - input) : L * block + input;
  return kept + head + scratch;
}

int64_t gpt_lora_activation_bytes(const GptSpec& g, const LoraSpec& lora, int64_t B, const TensorParallelSpec& tp, int64_t E) {
  if (lora.rank <= 0) return 0;
  const int64_t BT = B * g.ctx;
  return E * (2 * BT * lora.rank + BT * 3 * g.embd / tp.degree + BT * g.embd);
}

int64_t mlp_lora_activation_bytes(const ModelSpec& spec, const LoraSpec& lora, int64_t batch) {
  if (lora.rank <= 0) return 0;
  const auto& d = spec.dims;
  int64_t out = 0, in = 0;
  bool any = false;
  for (size_t l = 0; l + 1 < d.size(); l++) {
    if (!lora.adapts(static_cast<int>(2 * l))) continue;  // Sequential index of Linear l
    any = true;
    out = std::max(out, d[l + 1]);
    if (l > 0) in = std::max(in, d[l]);
  }
  if (!any) return 0;
  return (2 * lora.rank + out + in) * batch * static_cast<int64_t>(sizeof(float));
}

}  // namespace dtlab
