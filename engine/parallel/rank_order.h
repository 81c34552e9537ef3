// Megatron-core's rank order, tp-cp-ep-dp-pp: which ranks form each parallel group of a layout with
// tensor, context, expert, data and pipeline parallelism, and whether a group stays inside a node.
// The sizing calculator (sizing.h) places its traffic with it; the engine's own mesh (core/mesh.h)
// keeps torch's ("dp", "pp", "tp"). Source: docs/course_sources.md §6h (Megatron-core
// parallel_state.py, RankGenerator).
//
// Two generators share the order. The dense layers': rank = tp_i + t·(cp_i + c·(dp_i + d·pp_i)), so a
// CP group is c ranks t apart and the gradients of dense weights reduce over the dp x cp ranks. The
// expert layers' (expert tensor parallelism = tp, as Megatron defaults it): rank = tp_i + t·(ep_i +
// ep·(edp_i + edp·pp_i)) with edp = d·c/ep, so an EP group is ep ranks t apart, carved out of the dp x cp
// ranks, and an expert's gradients reduce over its edp replicas.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dtlab {

struct MegatronLayout {
  int tp = 1, cp = 1, ep = 1, dp = 1, pp = 1;
  int world() const { return tp * cp * dp * pp; }  // ep lives inside dp x cp
  int expert_dp() const { return dp * cp / ep; }   // Megatron's expert-data-parallel size
};

// DPCP: the dense gradients' reduction group (Megatron's data-parallel group with CP); EDP: an
// expert's replicas (its expert-data-parallel group). New values go at the end.
enum class ParallelGroup : uint8_t { TP, CP, DP, PP, DPCP, EP, EDP };
const char* parallel_group_name(ParallelGroup g);  // "tp", "cp", "dp", "pp", "dp x cp", "ep", "edp"

// dtlab::Error (one sentence) unless ep divides dp x cp.
void check_megatron_layout(const MegatronLayout& l);
// Every group of kind `g`, each ascending, the groups ordered by their lowest rank.
std::vector<std::vector<int>> megatron_groups(const MegatronLayout& l, ParallelGroup g);

// Where a kind of group lands on nodes of `gpus_per_node` GPUs (rank r on node r / gpus_per_node).
struct GroupPlacement {
  int size = 1;        // ranks per group
  int stride = 1;      // between a group's neighbouring ranks
  int groups = 0, spanning = 0;  // how many groups, and how many of them have ranks on two nodes or more
  bool crosses_nodes() const { return spanning > 0; }
};
GroupPlacement place_group(const MegatronLayout& l, ParallelGroup g, int gpus_per_node);

}  // namespace dtlab
