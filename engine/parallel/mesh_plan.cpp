#include "engine/parallel/mesh_plan.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/check.h"

namespace dtlab {

namespace {

void validate(const MeshPlanInput& in) {
  const TransformerShape& s = in.shape;
  if (in.sequence_parallel && in.tp < 2)
    throw Error("--sequence-parallel splits activations across a tensor-parallel group; use it with --tp 2 or more");
  const bool needs_shape = in.tp > 1 || in.stages > 1;
  if (needs_shape && (s.layers < 1 || s.hidden < 1 || s.seq < 1 || s.micro_batch < 1))
    throw Error("tensor and pipeline traffic is counted in activations; give the transformer's --layers, --hidden, --seq and --micro-batch");
  if (s.micro_batches < 1)
    throw Error("--micro-batches " + std::to_string(s.micro_batches) + " is out of range; use 1 or more micro-batches per step");
  if (s.layers > 0 && s.layers % in.stages != 0)
    throw Error("--layers " + std::to_string(s.layers) + " does not split evenly over --stages " + std::to_string(in.stages) +
                "; every stage holds the same number of layers, so use a multiple of " + std::to_string(in.stages));
}

// (n-1)/n: the share of a payload a rank sends in a ring all-gather or reduce-scatter.
double ring_share(int n) { return n > 1 ? double(n - 1) / n : 0.0; }

DimTraffic tp_traffic(const MeshPlanInput& in, const MeshPlan& p) {
  // Megatron (Shoeybi et al. §3): per transformer layer, g's all-reduce after attention and after
  // the MLP in forward, f's two in backward; each of one micro-batch's b·s·h activations. Sequence
  // parallelism (Korthikanti et al. §4.2.2) replaces each by a reduce-scatter and an all-gather,
  // (t-1)/t of b·s·h apiece: the same bytes. Recomputation's extra forward is not counted.
  DimTraffic d;
  d.dim = MeshDim::TP;
  d.degree = in.tp;
  const double per_micro_batch = 4.0 * p.layers_per_stage * 2 * ring_share(in.tp) * double(p.activation_elems) * p.activation_bytes;
  d.bytes = per_micro_batch * in.shape.micro_batches;
  if (in.tp < 2) return d;
  if (in.sequence_parallel) {
    d.what = "4 all-gathers + 4 reduce-scatters per layer (sequence parallel: each all-reduce split in two)";
    d.formula = "(L/p)·m · 8·(t-1)/t · b·s·h · e";
  } else {
    d.what = "4 all-reduces per layer (2 forward, 2 backward)";
    d.formula = "(L/p)·m · 4·2(t-1)/t · b·s·h · e";
  }
  return d;
}

DimTraffic pp_traffic(const MeshPlanInput& in, const MeshPlan& p) {
  // A stage sends its output activations forward and their gradients backward, once per micro-batch
  // at each boundary it has: a middle stage two boundaries, the first and the last one each.
  DimTraffic d;
  d.dim = MeshDim::PP;
  d.degree = in.stages;
  const int boundaries = in.stages > 2 ? 2 : in.stages - 1;
  d.bytes = double(boundaries) * in.shape.micro_batches * double(p.activation_elems) * p.activation_bytes;
  if (in.stages == 2) {
    d.what = "stage 0 sends activations forward, stage 1 their gradients backward";
    d.formula = "m · b·s·h · e";
  } else if (in.stages > 2) {
    d.what = "a middle stage: activations to the next stage, gradients to the previous one";
    d.formula = "2 · m · b·s·h · e";
  }
  return d;
}

DimTraffic dp_traffic(const MeshPlanInput& in, const MeshPlan& p) {
  DimTraffic d;
  d.dim = MeshDim::DP;
  d.degree = p.mesh.dp;
  d.bytes = p.memory.comm_bytes;
  if (p.mesh.dp < 2) return d;
  if (in.memory.sharding == Sharding::NoShard) {
    d.what = "all-reduce of the rank's gradients (DDP)";
    d.formula = in.memory.lora_params > 0 ? "2(d-1)/d · Ψ_L/(t·p) · g" : "2(d-1)/d · Ψ/(t·p) · g";
  } else {
    d.what = std::string(sharding_name(in.memory.sharding)) + " over the dp group";
    d.formula = p.memory.comm_formula + " (ring: ×(d-1)/d) with Ψ = Ψ/(t·p)" + (in.memory.lora_params > 0 ? ", Ψ_L = Ψ_L/(t·p)" : "");
  }
  return d;
}

// Which nodes a group's ranks live on decides its link: one node its fabric, several the network.
void place_on(const HardwareProfile& prof, MeshPlan& p) {
  const int G = std::max(1, prof.gpus_per_node);
  p.node_size = G;
  p.nodes = (p.mesh.world() + G - 1) / G;
  double slowest_beta = -1;
  for (DimTraffic& d : p.traffic) {
    for (const std::vector<int>& g : mesh_groups(p.mesh, d.dim)) {
      d.groups++;
      bool spans = false;
      for (int r : g) spans = spans || r / G != g.front() / G;
      d.groups_spanning_nodes += spans;
    }
    const bool inter = d.groups_spanning_nodes > 0;
    const Link link = inter ? prof.inter : prof.intra;
    d.link = fabric_name(inter ? prof.inter_fabric : prof.intra_fabric);
    d.link_seconds = d.bytes * link.beta;
    if (d.degree < 2 || d.bytes <= 0) continue;
    if (link.beta > slowest_beta) slowest_beta = link.beta, p.slowest_link.clear();
    if (link.beta == slowest_beta) p.slowest_link = d.link;
  }
  for (const DimTraffic& d : p.traffic) {
    if (d.degree < 2 || d.bytes <= 0 || d.link != p.slowest_link) continue;
    p.slowest_link_bytes += d.bytes;
    p.slowest_link_dims += (p.slowest_link_dims.empty() ? "" : " + ") + std::string(mesh_dim_name(d.dim));
  }
}

}  // namespace

MeshPlan plan_mesh(const MeshPlanInput& in, const HardwareProfile* profile) {
  MeshPlan p;
  p.mesh = resolve_mesh(in.memory.world, in.tp, in.stages);  // its sentence when the world does not divide
  validate(in);
  // Megatron splits every transformer layer's weights over tp and the layers over pp; the
  // replicated LayerNorms and biases are small and left out (Narayanan et al. §3).
  p.rank_params = std::ceil(in.memory.params / (double(in.tp) * in.stages));
  MemoryPlanInput dp = in.memory;
  dp.params = p.rank_params;
  dp.world = p.mesh.dp;
  dp.largest_unit_params = std::min(dp.largest_unit_params, p.rank_params);
  dp.lora_params = std::ceil(in.memory.lora_params / (double(in.tp) * in.stages));  // adapters split alike
  p.memory = plan_memory(dp);
  p.layers_per_stage = in.shape.layers / in.stages;
  p.activation_bytes = is_half(in.memory.dtype) ? 2 : 4;
  p.activation_elems = in.shape.micro_batch * in.shape.seq * in.shape.hidden;
  p.traffic[static_cast<int>(MeshDim::DP)] = dp_traffic(in, p);
  p.traffic[static_cast<int>(MeshDim::PP)] = pp_traffic(in, p);
  p.traffic[static_cast<int>(MeshDim::TP)] = tp_traffic(in, p);
  if (profile) place_on(*profile, p);
  return p;
}

}  // namespace dtlab
