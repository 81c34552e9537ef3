#include "engine/parallel/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
  if (name == "mixed") return PlanDType::Mixed;
  throw Error("dtype '" + std::string(name) +
              "' is not known; use fp32 (dtlab's engine) or mixed (the ZeRO paper's fp16 with fp32 Adam)");
}

const char* plan_dtype_name(PlanDType d) { return d == PlanDType::Mixed ? "mixed" : "fp32"; }

BytesPerParam bytes_per_param(PlanDType dtype, OptimizerKind optimizer, bool sgd_momentum) {
  // Optimizer state in fp32: AdamW's m and v, SGD's momentum buffer when it has one.
  const int state = optimizer == OptimizerKind::AdamW ? 8 : (sgd_momentum ? 4 : 0);
  if (dtype == PlanDType::Mixed) return {2, 2, 4 + state};  // + the fp32 master copy of the weights
  return {4, 4, state};
}

MemoryPlan plan_memory(const MemoryPlanInput& in) {
  validate(in);
  const BytesPerParam b = bytes_per_param(in.dtype, in.optimizer, in.sgd_momentum);
  const Sharding s = in.sharding;
  const int stage = zero_stage(s);
  const double psi = in.params;

  MemoryPlan p;
  p.shard_ranks = s == Sharding::NoShard ? 1
                  : s == Sharding::Hybrid && in.node_size > 0 ? in.node_size
                                                              : in.world;
  const int nd = p.shard_ranks;
  // ceil(Ψ/N_d): FSDP pads its flat parameter so every rank's shard has the same length.
  const double shard = std::ceil(psi / nd);

  // Each stage shards one more kind of state: 1 the optimizer's, 2 the gradients, 3 the parameters.
  const bool shard_params = stage >= 3, shard_grads = stage >= 2, shard_optim = stage >= 1;
  p.parameters = b.parameters * (shard_params ? shard : psi);
  p.gradients = b.gradients * (shard_grads ? shard : psi);
  p.optimizer_state = b.optimizer_state * (shard_optim ? shard : psi);

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

  std::vector<int> whole, sharded;
  (shard_params ? sharded : whole).push_back(b.parameters);
  (shard_grads ? sharded : whole).push_back(b.gradients);
  (shard_optim ? sharded : whole).push_back(b.optimizer_state);
  p.formula = joined_terms({psi_term(whole, "Ψ"), psi_term(sharded, "Ψ/N_d"), gathered_term});

  // Communication, ring volumes per rank (see the header): (n-1)/n of the payload per all-gather
  // or reduce-scatter, twice that per all-reduce. Padding is left out: this is the paper's model.
  auto ring = [](int n) { return n > 1 ? double(n - 1) / n : 0.0; };
  const int w = in.world;
  switch (s) {
    case Sharding::NoShard:  // all-reduce the gradients
      p.comm_bytes = 2 * ring(w) * psi * b.gradients;
      p.comm_formula = w > 1 ? "2Ψ" : "0";
      break;
    case Sharding::Zero1:  // reduce-scatter the gradients, all-gather the updated parameters
    case Sharding::ShardGradOp:
      p.comm_bytes = ring(w) * psi * (b.gradients + b.parameters);
      p.comm_formula = w > 1 ? "2Ψ" : "0";
      break;
    case Sharding::FullShard:  // all-gather in forward, again in backward, reduce-scatter
      p.comm_bytes = ring(w) * psi * (2 * b.parameters + b.gradients);
      p.comm_formula = w > 1 ? "3Ψ" : "0";
      break;
    case Sharding::Hybrid: {  // FULL_SHARD inside the group, then all-reduce the shard across groups
      const int groups = w / nd;
      p.comm_cross_group_bytes = 2 * ring(groups) * (psi / nd) * b.gradients;
      p.comm_bytes = ring(nd) * psi * (2 * b.parameters + b.gradients) + p.comm_cross_group_bytes;
      p.comm_formula = joined_terms({nd > 1 ? "3Ψ" : "", groups > 1 ? (nd > 1 ? "2Ψ/N_d" : "2Ψ") : ""});
      break;
    }
  }
  return p;
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

}  // namespace dtlab
