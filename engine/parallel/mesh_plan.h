// Planner for a 3-D parallel run (DP x PP x TP): per-rank memory (the model split over tp x pp,
// then ZeRO/FSDP sharding over dp by memory_plan.h) and per-step communication per mesh dimension
// in Megatron's counts, and, on a hardware profile, which link each dimension's groups cross.
// `dtlab-cli plan --tp/--stages` prints it. Sources: docs/course_sources.md §6c (Shoeybi et al.
// 2019 §3, Korthikanti et al. 2022 §4.2, Narayanan et al. 2021 §3).
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "engine/core/mesh.h"
#include "engine/parallel/memory_plan.h"
#include "engine/trace/cost_model.h"

namespace dtlab {

// The transformer's shape behind Megatron's activation counts: every TP collective and every
// pipeline send moves one micro-batch's activations, b x s x h elements.
struct TransformerShape {
  int layers = 0;           // L transformer layers, split evenly over the pipeline stages
  int64_t hidden = 0;       // h
  int64_t seq = 0;          // s tokens per sequence
  int64_t micro_batch = 0;  // b sequences per micro-batch
  int micro_batches = 1;    // m micro-batches per step (the pipeline's; gradient accumulation)
};

struct MeshPlanInput {
  // Ψ of the whole model, world = every rank (dp x pp x tp), dtype, optimizer, and the sharding
  // each dp group applies to its ranks' share (node_size: HYBRID_SHARD's group inside dp).
  MemoryPlanInput memory;
  int tp = 1, stages = 1;
  bool sequence_parallel = false;
  TransformerShape shape;
};

// What one rank sends per step along one mesh dimension (ring collectives; it receives as much).
struct DimTraffic {
  MeshDim dim = MeshDim::DP;
  int degree = 1;
  double bytes = 0;
  std::string what;     // "4 all-reduces per layer (2 forward, 2 backward)"
  std::string formula;  // "(L/p)·m·4·2(t-1)/t·b·s·h·2 B"
  // On a profile (plan_mesh with one): how many of this dimension's groups span nodes, the fabric
  // its slowest hop uses and the bandwidth term of that link for `bytes`.
  int groups = 0, groups_spanning_nodes = 0;
  std::string link;      // "NVSwitch", "InfiniBand"
  double link_seconds = 0;
};

struct MeshPlan {
  MeshShape mesh;
  double rank_params = 0;      // ceil(Ψ / (tp x pp)): the rank's share before dp sharding
  MemoryPlan memory;           // plan_memory of rank_params over the dp group
  int layers_per_stage = 0;    // L / pp
  int activation_bytes = 4;    // bytes per activation element: 4 fp32, 2 mixed (fp16)
  int64_t activation_elems = 0;  // b x s x h: one micro-batch's activations
  std::array<DimTraffic, kNumMeshDims> traffic;  // indexed by MeshDim: dp, pp, tp
  // On a profile: its node size, the nodes the mesh needs (may exceed the profile's own count: the
  // node is repeated), the slowest link any dimension uses and the bytes per rank per step on it.
  int node_size = 0, nodes = 0;
  std::string slowest_link;
  double slowest_link_bytes = 0;
  std::string slowest_link_dims;  // "dp + pp"
};

// dtlab::Error (one sentence naming the flag) for inputs that describe no run: the mesh does not
// divide the world, layers do not split over the stages, --sequence-parallel without TP, a
// missing transformer shape when TP or PP needs it. `profile`: place the mesh on its nodes.
MeshPlan plan_mesh(const MeshPlanInput& in, const HardwareProfile* profile = nullptr);

}  // namespace dtlab
