#include "engine/parallel/moe_plan.h"

#include <string>

#include "engine/core/check.h"
#include "engine/parallel/memory_plan.h"  // param_count_str

namespace dtlab {

void check_moe(const MoeConfig& m, double params, int layers, int64_t hidden, int pp) {
  if (m.experts == 0) {
    if (m.ep > 1) throw Error("--ep " + std::to_string(m.ep) + " splits the experts of a mixture of experts over ranks; add --experts E");
    return;
  }
  if (m.experts < 1) throw Error("--experts must be at least 1");
  if (m.ep < 1) throw Error("--ep must be at least 1");
  if (m.top_k < 1 || m.top_k > m.experts)
    throw Error("--top-k " + std::to_string(m.top_k) + " routes each token to more experts than the " + std::to_string(m.experts) +
                " there are; use 1 to " + std::to_string(m.experts));
  if (m.experts % m.ep != 0)
    throw Error("--experts " + std::to_string(m.experts) + " do not split evenly over --ep " + std::to_string(m.ep) +
                "; every expert-parallel rank holds E/e whole experts, so pick an --ep that divides " + std::to_string(m.experts));
  if (!(m.capacity_factor > 0))
    throw Error("--capacity-factor must be above 0; each expert takes F·k·T/E tokens, Switch Transformer's 1.0 to 2.0 are typical");
  if (m.moe_every < 1) throw Error("--moe-every must be at least 1");
  if ((layers / pp) % m.moe_every != 0)
    throw Error("--moe-every " + std::to_string(m.moe_every) + " does not divide the " + std::to_string(layers / pp) +
                " layers of each pipeline stage; every stage holds the same number of MoE layers, so pick a divisor of it");
  const MoeParams p = moe_params(m, params, layers, hidden);
  if (p.moe_layers * p.mlp > params)
    throw Error("--params " + param_count_str(params) + " is smaller than the " + std::to_string(p.moe_layers) + " MLPs of 8·h² = " +
                param_count_str(p.mlp) + " that become experts; give the dense model's count (one MLP per layer)");
}

MoeParams moe_params(const MoeConfig& m, double params, int layers, int64_t hidden) {
  MoeParams p;
  if (m.experts == 0) {
    p.non_expert = p.total = p.active = params;
    return p;
  }
  const double h = double(hidden);
  p.moe_layers = layers / m.moe_every;
  p.mlp = 8 * h * h;
  p.non_expert = params - p.moe_layers * p.mlp + p.moe_layers * h * m.experts;
  p.expert = double(p.moe_layers) * m.experts * p.mlp;
  p.total = p.non_expert + p.expert;
  p.active = p.non_expert + double(p.moe_layers) * m.top_k * p.mlp;
  return p;
}

double moe_layer_alltoall_bytes(const MoeConfig& m, double tokens, int64_t hidden, int element_bytes, bool recompute) {
  if (m.experts == 0 || m.ep < 2) return 0;
  const double share = double(m.ep - 1) / m.ep;
  const double one = m.capacity_factor * tokens * m.top_k * double(hidden) * element_bytes * share;
  return (recompute ? 6 : 4) * one;
}

}  // namespace dtlab
